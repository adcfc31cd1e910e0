"""Create the demo database and keep the fork templates fresh.

The demo data is written into a scratch database (`afs_demo_seeding`) that is
renamed to `afs_demo` only when complete, so a process killed half-way leaves
nothing that looks finished; the next `up` drops the scratch and starts again.
Seeding holds an advisory lock in the admin database, so two processes (two `afs
sandbox up`, or `up` and `optimize`) never seed at once: the second waits, then
finds the demo database made.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog

from afs.config import Settings
from afs.db import open_connection
from afs.errors import ForkBusyError, InputError
from afs.forks.provider import LocalForkProvider, template_name
from afs.locks import advisory_lock
from afs.pg.names import quote_ident
from afs.sandbox import demo
from afs.sandbox.server import SandboxServer

log = structlog.get_logger(__name__)

SEEDING_SUFFIX = "_seeding"
SEED_LOCK = "afs.seed:"  # advisory lock in the admin database, per demo database
SEED_STATEMENT_TIMEOUT_MS = 30 * 60 * 1000

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SeedReport:
    database: str
    scale: str
    seconds: float
    size_mb: float


async def database_exists(admin_dsn: str, name: str) -> bool:
    async with open_connection(admin_dsn) as conn:
        return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = %s", (name,)))


@asynccontextmanager
async def _seeding_lock(admin_dsn: str, database: str) -> AsyncIterator[None]:
    # no statement timeout: waiting for another process's seeding may take minutes
    async with open_connection(admin_dsn, 0) as conn, advisory_lock(conn, SEED_LOCK + database):
        yield


async def seed_demo(settings: Settings, server: SandboxServer, scale: str,
                    progress: Progress = lambda _: None) -> SeedReport:
    """(Re)create the demo database at `scale` and register it as a fork source."""
    async with _seeding_lock(server.dsn(), settings.demo_database):
        return await _seed_demo(settings, server, scale, progress)


async def _seed_demo(settings: Settings, server: SandboxServer, scale: str,
                     progress: Progress) -> SeedReport:
    if scale not in demo.SCALES:
        raise InputError(f"unknown scale {scale!r}; choose one of {', '.join(demo.SCALES)}")
    admin = server.dsn()
    target = settings.demo_database
    scratch = target + SEEDING_SUFFIX
    statements = demo.seed_statements(scale, settings.seed)
    started = time.monotonic()
    async with open_connection(admin) as conn:
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(scratch)} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {quote_ident(scratch)}")
    async with open_connection(server.dsn(scratch), SEED_STATEMENT_TIMEOUT_MS) as conn:
        for number, sql in enumerate(statements, 1):
            progress(f"seeding {target} ({scale}): step {number}/{len(statements)}")
            await conn.execute(sql)
        await conn.execute("SELECT pg_stat_reset()")  # loading is not the workload
    async with open_connection(admin) as conn:
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(target)} WITH (FORCE)")
        await conn.execute(f"ALTER DATABASE {quote_ident(scratch)} RENAME TO {quote_ident(target)}")
    progress(f"making the fork template {template_name(target)}")
    await LocalForkProvider(admin).register_source(target, origin=f"demo:{scale}:seed{settings.seed}")
    seconds = time.monotonic() - started
    size = await _size_mb(admin, target)
    log.info("demo_seeded", database=target, scale=scale, seconds=round(seconds, 1), size_mb=size)
    return SeedReport(database=target, scale=scale, seconds=seconds, size_mb=size)


async def ensure_demo(settings: Settings, server: SandboxServer, scale: str,
                      progress: Progress = lambda _: None) -> SeedReport | None:
    """Seed the demo database if it is missing; refresh its template if it is missing.

    Returns the seeding report, or None when the demo database existed already.
    """
    admin = server.dsn()
    target = settings.demo_database
    if await database_exists(admin, target) and await database_exists(admin, template_name(target)):
        return None  # the common case: no lock needed
    async with _seeding_lock(admin, target):
        return await _ensure_demo(settings, server, scale, progress)


async def _ensure_demo(settings: Settings, server: SandboxServer, scale: str,
                       progress: Progress) -> SeedReport | None:
    admin = server.dsn()
    target = settings.demo_database
    if not await database_exists(admin, target):
        return await _seed_demo(settings, server, scale, progress)
    if not await database_exists(admin, template_name(target)):
        progress(f"making the fork template {template_name(target)}")
        try:
            await LocalForkProvider(admin).register_source(target, origin=f"demo:{scale}")
        except ForkBusyError as exc:
            log.warning("template_not_refreshed", database=target, reason=str(exc))
    return None


async def _size_mb(admin_dsn: str, database: str) -> float:
    async with open_connection(admin_dsn) as conn:
        size = await conn.fetchval("SELECT pg_database_size(%s)", (database,))
    return round((size or 0) / 1048576, 1)
