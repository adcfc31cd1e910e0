"""Forks against the real embedded server, through the real MCP protocol."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
from mcp import Client

from afs.config import Settings
from afs.db import open_connection
from afs.errors import DatabaseError, ForkBusyError, InputError, UnknownServiceError
from afs.forks.client import ForkClient, open_fork, open_fork_client
from afs.forks.naming import fork_name
from afs.forks.provider import LocalForkProvider
from afs.forks.server import build_server
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")


async def fork_names(provider: LocalForkProvider) -> set[str]:
    return {f["name"] for f in (await provider.list_services())["forks"]}


async def database_exists(sandbox: SandboxServer, name: str) -> bool:
    async with open_connection(sandbox.dsn()) as conn:
        return bool(await conn.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = %s UNION ALL"
            " SELECT 1 FROM pg_roles WHERE rolname = %s", (name, name)))


# -- through stdio: the real server process ----------------------------------------
async def test_stdio_server_lists_the_four_tools(settings: Settings, sandbox: SandboxServer) -> None:
    async with open_fork_client(settings) as client:
        tools = await client._client.list_tools()
    assert {t.name for t in tools.tools} == {
        "service_list", "service_get", "service_fork", "service_delete"}


async def test_isolation_both_ways(settings: Settings, sandbox: SandboxServer) -> None:
    async with open_fork(settings, "afs_demo", ttl_seconds=300) as fork, \
            open_connection(fork.dsn) as fork_conn, \
            open_connection(sandbox.dsn("afs_demo")) as source:
        users = await source.fetchval("SELECT count(*) FROM users")
        assert await fork_conn.fetchval("SELECT count(*) FROM users") == users
        # the fork's role owns the tables: it can index, write, drop
        await fork_conn.execute("CREATE INDEX fork_only_idx ON orders (status)")
        await fork_conn.execute("DELETE FROM events")
        await fork_conn.execute("CREATE TABLE fork_only (x int)")
        assert await source.fetchval("SELECT to_regclass('fork_only_idx')") is None
        assert await source.fetchval("SELECT to_regclass('fork_only')") is None
        assert await source.fetchval("SELECT count(*) FROM events") > 0
        # and the other way: what the source does later never reaches the fork
        await source.execute("CREATE TABLE source_only (x int)")
        try:
            assert await fork_conn.fetchval("SELECT to_regclass('source_only')") is None
        finally:
            await source.execute("DROP TABLE source_only")


async def test_fork_cli_json_shapes(settings: Settings, sandbox: SandboxServer) -> None:
    env = dict(os.environ)
    created = await trio.run_process(
        [sys.executable, "-m", "afs", "fork", "create", "--ttl", "120", "--json"],
        capture_stdout=True, env=env)
    import json

    fork = json.loads(created.stdout)
    assert set(fork) == {"name", "dsn", "parent", "created_at", "ttl_seconds"}
    assert fork["parent"] == "afs_demo" and fork["ttl_seconds"] == 120
    listed = await trio.run_process([sys.executable, "-m", "afs", "fork", "list", "--json"],
                                    capture_stdout=True, env=env)
    assert fork["name"] in {f["name"] for f in json.loads(listed.stdout)}
    for _ in range(2):  # destroy twice: the second time is a no-op, not an error
        await trio.run_process([sys.executable, "-m", "afs", "fork", "destroy", fork["name"]],
                               capture_stdout=True, env=env)
    listed = await trio.run_process([sys.executable, "-m", "afs", "fork", "list", "--json"],
                                    capture_stdout=True, env=env)
    assert fork["name"] not in {f["name"] for f in json.loads(listed.stdout)}
    assert not await database_exists(sandbox, fork["name"])


# -- in-process MCP (real protocol, no subprocess): fast ------------------------------
@pytest.fixture
async def client(provider: LocalForkProvider):  # type: ignore[no-untyped-def]
    async with Client(build_server(provider)) as mcp_client:
        yield ForkClient(mcp_client)


async def test_destroy_is_idempotent(client: ForkClient, sandbox: SandboxServer) -> None:
    fork = await client.create("afs_demo", ttl_seconds=60)
    assert await database_exists(sandbox, fork.name)
    assert await client.destroy(fork.name) is True
    assert await client.destroy(fork.name) is False
    assert not await database_exists(sandbox, fork.name)


async def test_three_forks_concurrently(client: ForkClient, provider: LocalForkProvider) -> None:
    names: list[str] = []
    all_open = trio.Event()
    seen_together: list[set[str]] = []

    async def one(agent: str) -> None:
        async with client.open_fork("afs_demo", name=fork_name(agent, 7)) as fork, \
                open_connection(fork.dsn) as conn:
            assert await conn.fetchval("SELECT current_database()") == fork.name
            names.append(fork.name)
            if len(names) == 3:  # the last one in looks while all three are open
                seen_together.append(await fork_names(provider))
                all_open.set()
            await all_open.wait()

    async with trio.open_nursery() as nursery:
        for agent in ("gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.0-flash"):
            nursery.start_soon(one, agent)
    assert len(set(names)) == 3
    assert set(names) <= seen_together[0]
    assert not set(names) & await fork_names(provider)


async def test_cancelled_open_fork_leaves_no_fork(client: ForkClient, provider: LocalForkProvider,
                                                  sandbox: SandboxServer) -> None:
    # cancelled while in use (however long the creation took on a loaded machine)
    with trio.CancelScope() as scope:
        async with client.open_fork("afs_demo") as fork:
            scope.cancel()
            await trio.sleep(10)
    assert not await database_exists(sandbox, fork.name)
    # cancelled at many points during creation
    for delay in (0.005, 0.02, 0.05, 0.1):
        name = fork_name("cancel", int(delay * 1000))
        with trio.move_on_after(delay):
            async with client.open_fork("afs_demo", name=name):
                await trio.sleep(10)
        # a server-side creation in flight finishes its own cleanup: a cancel request, a drop,
        # which a loaded machine may take longer than a fixed 0.3 s for; then nothing comes back
        with trio.fail_after(30):
            while await database_exists(sandbox, name) or name in await fork_names(provider):  # noqa: ASYNC110
                await trio.sleep(0.1)
        await trio.sleep(0.3)
        assert not await database_exists(sandbox, name), name
        assert name not in await fork_names(provider)


async def test_fork_role_reaches_its_fork_only(client: ForkClient, sandbox: SandboxServer) -> None:
    async with client.open_fork("afs_demo") as one, client.open_fork("afs_demo") as two:
        # the catalog (with the fork passwords) lives in "postgres": unreachable too
        for other in ("afs_demo", two.name, "postgres", "template1", "afs_demo_template"):
            dsn = one.dsn.replace(f"/{one.name}?", f"/{other}?")
            with pytest.raises(DatabaseError):
                async with open_connection(dsn):
                    pass
        async with open_connection(one.dsn) as conn:
            assert await conn.fetchval("SELECT rolsuper OR rolcreatedb OR rolcreaterole"
                                       " FROM pg_roles WHERE rolname = current_user") is False


@pytest.mark.parametrize(
    ("arguments", "error", "fragment"),
    [
        ({"source": "no_such_db"}, UnknownServiceError, "unknown service 'no_such_db'"),
        ({"source": "afs_demo", "name": "Bad Name!"}, InputError, "invalid fork name"),
        ({"source": "afs_demo", "name": "x" * 80}, InputError, "at most 63"),
        ({"source": "afs_demo", "ttl_seconds": 0}, InputError, "ttl_seconds"),
        ({"source": "afs_demo", "ttl_seconds": -5}, InputError, "ttl_seconds"),
    ],
)
async def test_bad_input_is_refused_clearly(client: ForkClient, arguments: dict[str, object],
                                            error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment.replace("(", r"\(")):
        await client.create(**arguments)  # type: ignore[arg-type]


async def test_unknown_service_get_and_non_fork_delete(client: ForkClient) -> None:
    with pytest.raises(UnknownServiceError, match="nope"):
        await client.get("nope")
    with pytest.raises(InputError, match="not a fork"):
        await client.destroy("afs_demo")
    info = await client.get("afs_demo")
    assert info["kind"] == "source" and info["size_mb"] > 0


async def test_open_source_session_does_not_block_forking(client: ForkClient,
                                                          sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn("afs_demo")) as psql_like:
        await psql_like.execute("BEGIN")
        started = time.monotonic()
        async with client.open_fork("afs_demo") as fork:
            assert fork.parent == "afs_demo"
        # a session blocking the copy would make PostgreSQL refuse it after its 5 s wait
        # (ForkBusyError, no retry): succeeding is the check; the bound only catches a hang, and
        # leaves a loaded machine its time (a fork made and dropped took 3.5 s on one)
        assert time.monotonic() - started < 25
        await psql_like.execute("ROLLBACK")


async def test_busy_template_gives_a_retryable_error_within_seconds(client: ForkClient) -> None:
    async with client.open_fork("afs_demo") as parent, open_connection(parent.dsn):
        started = time.monotonic()
        with pytest.raises(ForkBusyError, match="retry") as caught:
            await client.create(parent.name)  # a fork of a fork someone is connected to
        assert caught.value.retryable
        # PostgreSQL's own 5 s wait for the other sessions, then the error: well within the
        # 30 s creation timeout a hang would reach (a loaded machine adds seconds to the call)
        assert time.monotonic() - started < 20


async def test_gc_collects_expired_forks(client: ForkClient, provider: LocalForkProvider,
                                         sandbox: SandboxServer) -> None:
    fork = await client.create("afs_demo", ttl_seconds=1)
    await trio.sleep(1.2)
    assert fork.name in (await provider.gc()).removed
    assert not await database_exists(sandbox, fork.name)


async def test_killed_owner_fork_is_collected(settings: Settings, provider: LocalForkProvider,
                                              sandbox: SandboxServer, tmp_path: Path) -> None:
    ready = tmp_path / "fork.txt"
    script = textwrap.dedent(f"""
        import trio
        from afs.config import load_settings
        from afs.forks.client import open_fork
        async def main():
            async with open_fork(load_settings(), "afs_demo", ttl_seconds=3600) as fork:
                open({str(ready)!r}, "w").write(fork.name)
                await trio.sleep(600)
        trio.run(main)
    """)
    owner = await trio.lowlevel.open_process([sys.executable, "-c", script])
    try:
        with trio.fail_after(30):
            # polling a file another process writes: no trio.Event can tell us
            while not ready.exists() or not ready.read_text():  # noqa: ASYNC110
                await trio.sleep(0.05)
        name = ready.read_text()
        assert await database_exists(sandbox, name)
        assert name not in (await provider.gc()).removed  # the owner is alive: keep it
    finally:
        owner.send_signal(signal.SIGKILL)
        await owner.wait()
    assert name in await fork_names(provider)  # killed: nothing cleaned up by itself...
    assert name in (await provider.gc()).removed        # ...until the collector runs
    assert not await database_exists(sandbox, name)


async def test_a_fork_role_can_create_a_trusted_extension_in_its_fork_only(
        client: ForkClient, sandbox: SandboxServer) -> None:
    """pg_trgm (trusted, shipped with the server) for trigram indexes: the fork's role owns its
    database, which is what CREATE EXTENSION of a trusted extension asks for."""
    async with client.open_fork("afs_demo") as fork, open_connection(fork.dsn) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")  # idempotent
        await conn.execute("CREATE INDEX fork_trgm ON users USING gin (email gin_trgm_ops)")
        assert await conn.fetchval("SELECT count(*) FROM users WHERE email LIKE '%@%'") > 0
        with pytest.raises(DatabaseError):  # not trusted: superusers only
            await conn.execute("CREATE EXTENSION IF NOT EXISTS dblink")
    async with open_connection(sandbox.dsn("afs_demo")) as source:
        assert await source.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'") is None
