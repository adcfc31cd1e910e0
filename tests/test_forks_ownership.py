"""Who owns what in a fork: only the fork's own objects go to the fork's role (issue 9, items 2 and 3)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from afs.db import open_connection
from afs.errors import DatabaseError
from afs.forks.provider import LocalForkProvider, template_name
from afs.pg.names import quote_ident
from afs.sandbox.importer import import_database, import_owner
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")


async def leftovers(sandbox: SandboxServer, name: str) -> list[str]:
    """What is left of a fork anywhere: its database, its role, its catalog row."""
    async with open_connection(sandbox.dsn()) as conn:
        rows = await conn.fetchall(
            "SELECT 'database' FROM pg_database WHERE datname = %s"
            " UNION ALL SELECT 'role' FROM pg_roles WHERE rolname = %s"
            " UNION ALL SELECT 'catalog row' FROM afs.forks WHERE name = %s", (name, name, name))
    return [r[0] for r in rows]


async def database_owner(sandbox: SandboxServer, name: str) -> str:
    async with open_connection(sandbox.dsn()) as conn:
        return str(await conn.fetchval(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", (name,)))


async def test_a_fork_of_a_fork_and_its_destruction(provider: LocalForkProvider,
                                                    sandbox: SandboxServer) -> None:
    parent = await provider.fork("afs_demo", ttl_seconds=300)
    try:
        async with open_connection(parent.dsn) as conn:  # the parent role makes objects of its own
            await conn.execute("CREATE TABLE parent_made (x int)")
            await conn.execute("CREATE INDEX parent_made_idx ON parent_made (x)")
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        child = await provider.fork(parent.name, ttl_seconds=300)
        try:
            assert await database_owner(sandbox, parent.name) == parent.name
            async with open_connection(child.dsn) as conn:
                owners = await conn.fetchall(
                    "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
                    # an extension's own relations go with the extension
                    " AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass"
                    " AND d.objid = c.oid AND d.deptype = 'e')")
                assert owners == [(child.name,)]
                await conn.execute("DROP TABLE parent_made")  # the child's role owns it
                assert await conn.fetchval(
                    "SELECT pg_get_userbyid(extowner) FROM pg_extension WHERE extname = 'pg_trgm'"
                ) == child.name
        finally:
            await provider.delete(child.name)
        assert await leftovers(sandbox, child.name) == []
        # the parent is whole and still its own
        assert await database_owner(sandbox, parent.name) == parent.name
        async with open_connection(parent.dsn) as conn:
            assert await conn.fetchval("SELECT to_regclass('parent_made')") is not None
    finally:
        await provider.delete(parent.name)
    assert await leftovers(sandbox, parent.name) == []


@pytest.fixture
async def shop(provider: LocalForkProvider, sandbox: SandboxServer) -> AsyncIterator[str]:
    """A source database owned by an ordinary role, its tables made by that role."""
    name = "shop_" + secrets.token_hex(3)
    owner = name + "_owner"
    async with open_connection(sandbox.dsn()) as admin:
        await admin.execute(f"CREATE ROLE {quote_ident(owner)} NOLOGIN")
        await admin.execute(f"CREATE DATABASE {quote_ident(name)} OWNER {quote_ident(owner)}")
    try:
        async with open_connection(sandbox.dsn(name)) as conn:
            await conn.execute(f"SET ROLE {quote_ident(owner)}")
            await conn.execute("CREATE SCHEMA sales")
            await conn.execute("CREATE TABLE sales.items (id serial PRIMARY KEY, name text)")
            await conn.execute("INSERT INTO sales.items (name) SELECT 'item ' || g"
                               " FROM generate_series(1, 50) g")
            await conn.execute("CREATE FUNCTION sales.label(i int) RETURNS text LANGUAGE sql"
                               " IMMUTABLE AS $$ SELECT 'item ' || i $$")
            await conn.execute("RESET ROLE")
            # as after `pg_restore --no-owner`: the superuser owns it, and PUBLIC may call it
            await conn.execute("CREATE FUNCTION sales.whoami() RETURNS text LANGUAGE sql"
                               " SECURITY DEFINER AS $$ SELECT current_user::text $$")
            await conn.execute("CREATE PROCEDURE sales.touch() LANGUAGE sql"
                               " SECURITY DEFINER AS $$ SELECT 1 $$")
        await provider.register_source(name, origin="test:shop")
        yield name
    finally:
        await provider.drop_source(name)
        async with open_connection(sandbox.dsn()) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
            await admin.execute(f"DROP ROLE IF EXISTS {quote_ident(owner)}")


async def test_a_source_owned_by_an_ordinary_role(provider: LocalForkProvider,
                                                  sandbox: SandboxServer, shop: str) -> None:
    owner = shop + "_owner"
    fork = await provider.fork(shop, ttl_seconds=300)
    try:
        async with open_connection(fork.dsn) as conn:
            assert await conn.fetchval("SELECT count(*) FROM sales.items") == 50
            await conn.execute("CREATE INDEX items_name ON sales.items (name)")
            await conn.execute("INSERT INTO sales.items (name) VALUES ('new')")  # its sequence too
            await conn.execute("ALTER FUNCTION sales.label(int) RENAME TO label2")
        # nothing outside the fork changed hands
        assert await database_owner(sandbox, shop) == owner
        assert await database_owner(sandbox, template_name(shop)) != fork.name
    finally:
        await provider.delete(fork.name)
    assert await leftovers(sandbox, fork.name) == []
    async with open_connection(sandbox.dsn(shop)) as conn:
        assert await conn.fetchval("SELECT pg_get_userbyid(relowner) FROM pg_class"
                                   " WHERE oid = 'sales.items'::regclass") == owner
        with pytest.raises(DatabaseError):
            await conn.execute("SELECT 'sales.label2(int)'::regprocedure")


async def test_imported_security_definer_functions_run_with_the_fork_roles_rights(
        provider: LocalForkProvider, sandbox: SandboxServer, shop: str) -> None:
    fork = await provider.fork(shop, ttl_seconds=300)
    try:
        async with open_connection(fork.dsn) as conn:
            assert await conn.fetchval("SELECT sales.whoami()") == fork.name
            definers = await conn.fetchall(
                "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner"
                " WHERE p.prosecdef AND r.rolsuper")
            assert definers == []
    finally:
        await provider.delete(fork.name)
    async with open_connection(sandbox.dsn(shop)) as conn:  # the source keeps its owners
        assert await conn.fetchval("SELECT pg_get_userbyid(proowner) FROM pg_proc"
                                   " WHERE oid = 'sales.whoami()'::regprocedure") == "postgres"


async def test_an_imported_definer_routine_has_the_rights_of_the_copys_role(
        provider: LocalForkProvider, sandbox: SandboxServer, shop: str) -> None:
    copy = shop + "_copy"
    probe = shop + "_probe"
    await import_database(sandbox, sandbox.dsn(shop), name=copy)
    try:
        async with open_connection(sandbox.dsn(copy)) as conn:
            await conn.execute(f"CREATE ROLE {quote_ident(probe)} NOLOGIN")
            try:
                # restored by the copy's own role (issue 23): whoever calls it has that role's
                # rights, never a superuser's
                assert await conn.fetchval(
                    "SELECT r.rolname FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner"
                    " WHERE p.oid = 'sales.whoami()'::regprocedure AND NOT r.rolsuper"
                ) == import_owner(copy)
                # an ordinary function stays callable
                assert await conn.fetchval(
                    "SELECT has_function_privilege(%s, 'sales.label(int)', 'EXECUTE')", (probe,)) is True
            finally:
                await conn.execute(f"DROP ROLE {quote_ident(probe)}")
        fork = await provider.fork(copy, ttl_seconds=120)
        try:
            async with open_connection(fork.dsn) as conn:  # the fork's role owns it and calls it
                assert await conn.fetchval("SELECT sales.whoami()") == fork.name
        finally:
            await provider.delete(fork.name)
    finally:
        await provider.drop_source(copy)
