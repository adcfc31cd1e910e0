"""The sandbox's fork server, inside the process that needs forks.

Unless another fork server is configured (AFS_FORK_SERVER_URL, or an
AFS_FORK_SERVER_COMMAND of one's own), a command that needs forks (`afs optimize`,
`afs fork …`, a worker) runs the sandbox's fork provider in its own process and talks
to it over MCP in memory: the same tools and the same protocol as `afs mcp serve`,
with its garbage collection, growth limits and spares running beside it for as long
as the session lasts, and no second Python process to start and stop (about 1.3 s
a task, mostly importing the MCP SDK).

    async with open_forks(settings) as forks:        # a ForkClient
        async with forks.open_fork("afs_demo") as fork:
            ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from afs.config import Settings, default_fork_server_command
from afs.forks.client import ForkClient, open_fork_client
from afs.forks.provider import LocalForkProvider
from afs.forks.server import build_server, running
from afs.sandbox.server import SandboxServer


def in_process(settings: Settings) -> bool:
    """Whether the sandbox's fork server runs in this process (no other one is configured):
    the one answer to "does the sandbox serve the forks?"."""
    return not settings.fork_server_url and settings.fork_server_command == default_fork_server_command()


def uses_the_sandbox(settings: Settings, dsn: str | None) -> bool:
    """Whether a task on `dsn` (None: the demo database) runs in the sandbox: always for the demo
    database; for a DSN, when the sandbox serves the forks (`in_process`), else the other fork
    server (AFS_FORK_SERVER_URL or AFS_FORK_SERVER_COMMAND) forks that database itself."""
    return dsn is None or in_process(settings)


@asynccontextmanager
async def open_forks(settings: Settings) -> AsyncIterator[ForkClient]:
    """An MCP session with the configured fork server, or with the sandbox's own fork server
    in this process (the sandbox started if it is not running, as `afs mcp serve` does)."""
    if not in_process(settings):
        async with open_fork_client(settings) as client:
            yield client
        return
    sandbox = SandboxServer(settings)
    await trio.to_thread.run_sync(sandbox.start)
    provider = LocalForkProvider(sandbox.dsn(), limits=settings.fork_limits, spares=settings.fork_spares)
    async with running(provider, settings), \
            open_fork_client(settings, build_server(provider, settings.fork_ttl_seconds)) as client:
        yield client
