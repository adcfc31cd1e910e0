"""Locks that span processes.

    async with hold_file_lock(path):                 # flock(2): the kernel drops it when the
        ...                                          # holder exits, even by SIGKILL
    async with server_lock(conn, "benchmark"):       # one holder per database server on this
        ...                                          # machine, whatever process or AFS_HOME

Inside one process, trio primitives (a CapacityLimiter) order tasks; these order
processes. Waiting polls a non-blocking flock, so it is cancelled like any trio sleep.
Locks between machines that share one database server are PostgreSQL advisory
locks on the admin database (see `afs.forks.provider`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import trio

from afs.db import Connection

POLL_S = 0.05


def lock_dir() -> Path:
    """Per user, shared by every AFS_HOME: two homes may measure on one server."""
    return Path(tempfile.gettempdir()) / f"afs-locks-{os.getuid()}"


def server_lock_path(host: str, port: int | str, purpose: str) -> Path:
    key = hashlib.sha256(f"{host}:{port}".encode()).hexdigest()[:16]
    return lock_dir() / f"{purpose}-{key}.lock"


@asynccontextmanager
async def hold_file_lock(path: Path) -> AsyncIterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await trio.sleep(POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


def is_locked(path: Path) -> bool:
    """Whether another process holds the lock on `path` right now."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def connection_lock_path(conn: Connection, purpose: str) -> Path:
    info = conn.raw.info
    return server_lock_path(info.host, info.port, purpose)


def server_lock(conn: Connection, purpose: str) -> AbstractAsyncContextManager[None]:
    """A lock for `purpose` on the database server `conn` is connected to."""
    return hold_file_lock(connection_lock_path(conn, purpose))


@asynccontextmanager
async def advisory_lock(conn: Connection, key: str, *, shared: bool = False) -> AsyncIterator[None]:
    """A PostgreSQL session advisory lock on `conn` for the block (between machines too, when
    every party locks in the same database: the admin database)."""
    kind = "_shared" if shared else ""
    await conn.execute(f"SELECT pg_advisory_lock{kind}(hashtext(%s))", (key,))
    try:
        yield
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute(f"SELECT pg_advisory_unlock{kind}(hashtext(%s))", (key,))
