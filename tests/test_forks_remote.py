"""Another fork server runs agents (issue 9, item 11): owners that are not local processes,
servers whose service_fork takes no owner, and `afs optimize --dsn` without the sandbox."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.server.mcpserver import MCPServer

from afs.db import open_connection
from afs.errors import InputError
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider, dsn_with
from afs.pg.names import quote_ident
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")


async def test_an_owner_on_another_host_is_not_looked_up_here(provider: LocalForkProvider) -> None:
    fork = await provider.fork("afs_demo", ttl_seconds=300, owner_pid=999_999,
                               owner_host="a-container-" + secrets.token_hex(3))
    try:
        assert fork.owner is not None and "999999" in fork.owner
        assert fork.name not in (await provider.gc()).removed  # only its TTL applies
    finally:
        await provider.delete(fork.name)
    with pytest.raises(InputError, match="does not exist"):  # on this host it must exist
        await provider.fork("afs_demo", ttl_seconds=300, owner_pid=999_999)


def minimal_server(provider: LocalForkProvider) -> MCPServer:
    """Another MCP fork server: the same four tools, and a service_fork that knows no owner."""
    server = MCPServer("other-forks")

    @server.tool()
    async def service_list() -> dict[str, Any]:
        return await provider.list_services()

    @server.tool()
    async def service_get(service_id: str) -> dict[str, Any]:
        return await provider.get_service(service_id)

    @server.tool()
    async def service_fork(service_id: str, name: str | None = None,
                           ttl_seconds: int | None = None) -> dict[str, Any]:
        return (await provider.fork(service_id, name=name, ttl_seconds=ttl_seconds or 600)).public()

    @server.tool()
    async def service_delete(service_id: str) -> dict[str, Any]:
        return await provider.delete(service_id)

    return server


async def test_a_server_without_owners_serves_open_fork(provider: LocalForkProvider) -> None:
    async with Client(minimal_server(provider)) as mcp_client:
        client = ForkClient(mcp_client)
        assert "owner_pid" not in await client.fork_arguments()
        async with client.open_fork("afs_demo") as fork, open_connection(fork.dsn) as conn:
            assert await conn.fetchval("SELECT current_user") == fork.name
        assert fork.name not in await provider.traces()


async def test_fork_dsns_name_the_public_address(sandbox: SandboxServer) -> None:
    dsn = dsn_with("postgresql://postgres:pw@db:5432/postgres", dbname="f", user="f", password="x",
                   address="127.0.0.1:6543")
    assert dsn == "postgresql://f:x@127.0.0.1:6543/f"
    # a server in a container: clients reach it at the published address, the server itself
    # (which logs in to check the fork) at the admin DSN's
    published = LocalForkProvider(sandbox.dsn(), public_address="127.0.0.1:6543")
    fork = await published.fork("afs_demo", ttl_seconds=60)
    try:
        assert "@127.0.0.1:6543/" in fork.dsn
    finally:
        await published.delete(fork.name)


@pytest.fixture
async def shop(provider: LocalForkProvider, sandbox: SandboxServer) -> AsyncIterator[str]:
    """A database that is not the sandbox's demo: the user's own, on 'another' server."""
    name = "shop_remote_" + secrets.token_hex(3)
    async with open_connection(sandbox.dsn()) as admin:
        await admin.execute(f"CREATE DATABASE {quote_ident(name)}")
    try:
        async with open_connection(sandbox.dsn(name)) as conn:
            await conn.execute(
                "CREATE TABLE orders AS SELECT g AS id, g % 2000 AS user_id,"
                " (ARRAY['pending', 'paid', 'shipped'])[1 + g % 3] AS status,"
                " now() - g * interval '1 minute' AS created_at, (g % 500)::numeric AS total_amount"
                " FROM generate_series(1, 200000) g")
            await conn.execute("ALTER TABLE orders ADD PRIMARY KEY (id)")
            await conn.execute("VACUUM ANALYZE orders")
        yield name
    finally:
        await provider.drop_source(name)
        async with open_connection(sandbox.dsn()) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")


async def test_optimize_against_another_fork_server_needs_no_sandbox(
        sandbox: SandboxServer, shop: str, tmp_path: Path) -> None:
    """The fork server is a separate process with its own admin DSN; the client's AFS_HOME has
    no sandbox, and gets none."""
    client_home = tmp_path / "client"
    server = [sys.executable, "-m", "afs", "mcp", "serve", "--admin-dsn", sandbox.dsn(),
              "--register", shop]
    env = {**os.environ, "AFS_HOME": str(client_home),
           "AFS_FORK_SERVER_COMMAND": shlex.join(server),
           "AFS_STORE_URL": sandbox.dsn("postgres")}  # a team's store: the task is recorded there
    query = ("SELECT id, total_amount FROM orders WHERE user_id = 42 AND status = 'pending'"
             " ORDER BY created_at DESC")
    result = await trio.run_process(
        [sys.executable, "-m", "afs", "optimize", "--dsn", sandbox.dsn(shop), "--query", query,
         "--provider", "heuristic", "--runs", "3", "--json"],
        capture_stdout=True, capture_stderr=True, check=False, env=env)
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    assert report["source"] == shop
    assert report["status"] == "completed", report["error"]
    assert all(p["status"] != "failed" for p in report["proposals"]), report["proposals"]
    assert not (client_home / "sandbox").exists()
    # without a store to record the task in, it is refused before anything starts
    env.pop("AFS_STORE_URL")
    refused = await trio.run_process(
        [sys.executable, "-m", "afs", "optimize", "--dsn", sandbox.dsn(shop), "--query", query,
         "--provider", "heuristic"], capture_stdout=True, capture_stderr=True, check=False, env=env)
    assert refused.returncode == 2 and b"AFS_STORE_URL" in refused.stderr, refused.stderr.decode()
    assert not (client_home / "sandbox").exists()
