"""Shared fixtures: one real embedded PostgreSQL for the whole session.

The server lives in a temporary AFS_HOME, is seeded at the `small` scale once,
and is stopped with pg_ctl when the session ends, even after failures.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import trio
from mcp import Client

from afs.config import Settings, load_settings
from afs.db import Connection, open_connection
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.forks.server import build_server
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer


@pytest.fixture(scope="session")
def afs_home() -> Iterator[Path]:
    # short path: the server's unix socket lives under it
    home = Path(tempfile.mkdtemp(prefix="afs-t-"))
    # a developer's real Gemini key must never reach the tests
    cleared = ("AFS_DATABASE_URL", "GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI",
               "GOOGLE_GENAI_USE_ENTERPRISE", "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION",
               "AFS_GEMINI_BASE_URL")
    saved = {k: os.environ.get(k) for k in ("AFS_HOME", "AFS_SCALE", *cleared)}
    os.environ["AFS_HOME"] = str(home)
    os.environ["AFS_SCALE"] = "small"
    for key in cleared:
        os.environ.pop(key, None)
    for key in [k for k in os.environ if k.startswith("PG")]:  # a developer's own server: not a target
        saved[key] = os.environ.pop(key)
    try:
        yield home
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(afs_home: Path) -> Settings:
    return load_settings()


@pytest.fixture(scope="session")
def sandbox(settings: Settings) -> Iterator[SandboxServer]:
    server = SandboxServer(settings)
    try:
        server.start()
        trio.run(ensure_demo, settings, server, "small")
        yield server
    finally:
        server.stop()


@pytest.fixture
def provider(sandbox: SandboxServer) -> LocalForkProvider:
    return LocalForkProvider(sandbox.dsn())


@pytest.fixture
async def forks(provider: LocalForkProvider) -> AsyncIterator[ForkClient]:
    """The fork tools over the real MCP protocol (an in-memory MCP session to our server)."""
    async with Client(build_server(provider)) as client:
        yield ForkClient(client)


@pytest.fixture
def no_leaked_forks(provider: LocalForkProvider) -> Iterator[None]:
    """Fails the test if it leaves any trace of a fork behind (database, role or catalog row,
    in any state); removes leftovers either way.

    A sync fixture on purpose: pytest-trio runs an async fixture only when the test names it
    as an argument, never from `usefixtures`, so an async leak check there never ran.
    """
    before = trio.run(provider.traces)
    yield
    leaked = trio.run(provider.traces) - before
    for name in leaked:
        trio.run(provider.delete, name)
    assert not leaked, f"forks left behind: {sorted(leaked)}"


@pytest.fixture
def store_db(sandbox: SandboxServer) -> Iterator[str]:
    """A fresh, empty task store database in the sandbox (dropped after the test)."""
    import psycopg

    name = "afs_store_t_" + os.urandom(4).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield sandbox.dsn(name)
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def own_home() -> Iterator[Path]:
    """An AFS_HOME for a sandbox of its own: its server stopped, any copy-on-write image
    unmounted, and the directory deleted, whatever happens."""
    home = Path(tempfile.mkdtemp(prefix="afs-o-"))
    try:
        yield home
    finally:
        try:
            SandboxServer(load_settings({"AFS_HOME": str(home)})).destroy()
        finally:
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
async def fork_conn(provider: LocalForkProvider) -> AsyncIterator[Connection]:
    """A connection to a fork of the demo database, the fork deleted afterwards (test_safety
    has its own, a synchronous one to a hostile fork)."""
    fork = await provider.fork("afs_demo", ttl_seconds=600)
    try:
        async with open_connection(fork.dsn) as conn:
            yield conn
    finally:
        await provider.delete(fork.name)


@pytest.fixture
def scratch_database(sandbox: SandboxServer) -> Iterator[Callable[[str, str], str]]:
    """make(prefix, schema) → the DSN of a new database in the sandbox with `schema` run in it
    (statements split on ';'); every database made is dropped after the test, whatever happens."""
    import psycopg

    made: list[str] = []

    def make(prefix: str, schema: str) -> str:
        name = prefix + os.urandom(3).hex()
        with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        made.append(name)
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            for statement in schema.split(";"):
                if statement.strip():
                    conn.execute(statement)
        return sandbox.dsn(name)

    try:
        yield make
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
            for name in made:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
