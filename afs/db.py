"""Database access under trio.

psycopg's async API needs asyncio, so AFS uses the sync `psycopg.Connection`
in worker threads (`trio.to_thread.run_sync`), one operation at a time per
connection, with a `CapacityLimiter`. Trio cannot interrupt a thread, so when
the caller is cancelled the running statement is cancelled on the server
(`cancel_safe`) until the worker returns; the connection stays usable. Every
connection also carries a server-side `statement_timeout`: the last line of
defence (its caller's, or `afs.config.Connecting`'s when it names none).

    async with open_connection(dsn, statement_timeout_ms=30_000) as conn:
        rows = await conn.fetchall("SELECT ...", params)

The defaults are `afs.config.CONNECTING`'s; `DATABASE_THREADS` is process state: the one
limiter every database thread of the process shares (`Connecting.threads` of them at once).
"""

from __future__ import annotations

import configparser
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import trio
from psycopg import conninfo, pq
from psycopg.pq import TransactionStatus

from afs.config import CONNECTING, user_libpq_environment
from afs.errors import DatabaseError, InputError, StatementTimeout, scrub

T = TypeVar("T")

# Process state, not a setting: the threads that may talk to PostgreSQL at once, shared by
# every connection of the process (how many: afs.config.Connecting.threads).
DATABASE_THREADS = trio.CapacityLimiter(CONNECTING.threads)
_CANCEL_POLL_S = 0.05


def translate(exc: psycopg.Error, sql: str | None = None) -> DatabaseError:
    """Turn a psycopg error into an AfsError (done once, here)."""
    sqlstate = getattr(exc, "sqlstate", None)
    text = str(exc).strip() or type(exc).__name__
    if sql:
        text = f"{text} [in: {' '.join(sql.split())[:200]}]"
    cls = StatementTimeout if isinstance(exc, psycopg.errors.QueryCanceled) else DatabaseError
    return cls(text, sqlstate=sqlstate)


# -- whose connection string: the user's, or AFS's own ----------------------------------------
# A DSN AFS writes for a server of its own (the sandbox, a fork) carries this keyword; the
# user's libpq variables (afs.config.take_libpq_environment) never reach those connections.
OWN_SERVER_MARK = ("fallback_application_name", "afs-own-server")
# libpq's variables that are no connection keyword: it sends them as settings at start-up
_SESSION_VARIABLES = {"PGDATESTYLE": "DateStyle", "PGTZ": "TimeZone", "PGGEQO": "geqo"}


def is_own_server(dsn: str) -> bool:
    """Whether AFS wrote `dsn` for a server of its own (OWN_SERVER_MARK)."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return False
    return params.get(OWN_SERVER_MARK[0]) == OWN_SERVER_MARK[1]


def _service_entries(name: str, env: Mapping[str, str]) -> dict[str, str] | None:
    """The keywords of service `name` in the first service file that defines it (libpq's order:
    PGSERVICEFILE or ~/.pg_service.conf, then PGSYSCONFDIR/pg_service.conf), None if none does."""
    files = [Path(env["PGSERVICEFILE"]) if env.get("PGSERVICEFILE")
             else Path.home() / ".pg_service.conf"]
    if env.get("PGSYSCONFDIR"):
        files.append(Path(env["PGSYSCONFDIR"]) / "pg_service.conf")
    for path in files:
        parser = configparser.ConfigParser(interpolation=None, strict=False,
                                           delimiters=("=",), comment_prefixes=("#",))
        parser.optionxform = str  # type: ignore[assignment, method-assign]  # keywords as written
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        if parser.has_section(name):
            return {k.strip(): v.strip() for k, v in parser.items(name)}
    return None


def resolve_dsn(dsn: str, env: Mapping[str, str] | None = None) -> str:
    """`dsn` with the user's libpq variables written in, as libpq would read them: what the DSN
    says first, then its service's entries (the DSN's `service` or PGSERVICE), then the
    variables (PGHOST, PGPORT, PGPASSWORD, PGSSLMODE, …; PGTZ, PGDATESTYLE, PGGEQO as settings).
    `env` defaults to the variables AFS took from its environment at start-up. A DSN of AFS's
    own server (OWN_SERVER_MARK) is returned as it is. Raises InputError for a DSN that does not
    parse or a service that no service file defines."""
    if env is None:
        env = user_libpq_environment()
    try:
        params = {k: str(v) for k, v in conninfo.conninfo_to_dict(dsn).items()}
    except psycopg.ProgrammingError as exc:
        raise InputError(f"the connection string does not parse: {scrub(str(exc))}") from exc
    if params.get(OWN_SERVER_MARK[0]) == OWN_SERVER_MARK[1]:
        return dsn
    service = params.pop("service", None) or env.get("PGSERVICE")
    if service:
        entries = _service_entries(service, env)
        if entries is None:
            raise InputError(f"the connection service {service!r} is not defined in any service file"
                             " (PGSERVICEFILE, ~/.pg_service.conf, PGSYSCONFDIR/pg_service.conf)")
        for key, value in entries.items():
            params.setdefault(key, value)
    for option in pq.Conninfo.get_defaults():
        keyword, variable = option.keyword.decode(), option.envvar
        if variable and keyword != "service" and variable.decode() in env:
            params.setdefault(keyword, env[variable.decode()])
    settings = " ".join(f"-c {setting}=" + env[name].replace("\\", "\\\\").replace(" ", "\\ ")
                        for name, setting in _SESSION_VARIABLES.items() if env.get(name))
    if settings:
        params["options"] = " ".join(filter(None, (params.get("options", ""), settings)))
    return conninfo.make_conninfo("", **params)


def connect_sync(dsn: str, statement_timeout_ms: int = CONNECTING.statement_timeout_ms,
                 autocommit: bool = True) -> psycopg.Connection[Any]:
    """Open a blocking connection with a server-side statement_timeout. A user's DSN is first
    completed from the user's libpq variables (`resolve_dsn`)."""
    resolved = resolve_dsn(dsn)
    own = conninfo.conninfo_to_dict(resolved).get("options", "")
    try:
        return psycopg.connect(
            resolved,
            autocommit=autocommit,
            connect_timeout=CONNECTING.connect_timeout_s,
            # the DSN's own options first; then AFS's, which win:
            # standard_conforming_strings: the server reads strings as pglast checked them
            options=" ".join(filter(None, (str(own), f"-c statement_timeout={int(statement_timeout_ms)}",
                                           "-c standard_conforming_strings=on"))),
            application_name="afs",
        )
    except psycopg.Error as exc:
        raise translate(exc) from exc


async def run_in_thread(
    conn: psycopg.Connection[Any],
    fn: Callable[[psycopg.Connection[Any]], T],
    limiter: trio.CapacityLimiter = DATABASE_THREADS,
) -> T:
    """Run `fn(conn)` in a worker thread; if trio cancels us, cancel it on the server.

    The statement may or may not have begun when trio delivers Cancelled:
    a state guarded by a lock tells the two cases apart, so a worker that
    starts late never runs, and one that runs is cancelled until it returns.
    """
    lock = threading.Lock()
    done = threading.Event()
    state = ["pending"]

    def work() -> T:
        with lock:
            if state[0] == "abandoned":
                raise _Abandoned  # nobody waits for this result any more
            state[0] = "running"
        try:
            return fn(conn)
        finally:
            done.set()

    try:
        return await trio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=limiter)
    except trio.Cancelled:
        with lock:
            began = state[0] == "running"
            state[0] = "abandoned" if not began else state[0]
        if began:
            with trio.CancelScope(shield=True):
                await _cancel_until_returned(conn, done)
        raise


async def _cancel_until_returned(conn: psycopg.Connection[Any], done: threading.Event) -> None:
    while not done.is_set():
        await trio.to_thread.run_sync(_cancel_quietly, conn)
        await trio.to_thread.run_sync(done.wait, 0.5)
    if conn.closed:
        return
    if conn.info.transaction_status == TransactionStatus.INERROR:
        await trio.to_thread.run_sync(_rollback_quietly, conn)


def _cancel_quietly(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        conn.cancel_safe(timeout=5)


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.rollback()


class _Abandoned(Exception):
    """The caller was cancelled before the worker thread began."""


class Connection:
    """A psycopg connection driven from trio: one statement at a time."""

    def __init__(self, raw: psycopg.Connection[Any], limiter: trio.CapacityLimiter) -> None:
        self.raw = raw
        self._limiter = limiter
        self._busy = trio.Lock()

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run a blocking function of the raw connection in a worker thread."""
        async with self._busy:
            return await run_in_thread(self.raw, fn, self._limiter)

    async def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        await self.run(lambda c: _execute(c, sql, params, fetch=False))

    async def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return await self.run(lambda c: _execute(c, sql, params, fetch=True))

    async def fetchone(self, sql: str, params: Sequence[Any] | None = None) -> tuple[Any, ...] | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        row = await self.fetchone(sql, params)
        return None if row is None else row[0]

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.raw.close)


def _execute(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] | None,
             fetch: bool) -> list[tuple[Any, ...]]:
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            if fetch and cur.description is not None:
                return cur.fetchall()
            return []
    except psycopg.Error as exc:
        raise translate(exc, sql) from exc


@asynccontextmanager
async def open_connection(
    dsn: str,
    statement_timeout_ms: int = CONNECTING.statement_timeout_ms,
    limiter: trio.CapacityLimiter = DATABASE_THREADS,
) -> AsyncIterator[Connection]:
    """Open a connection for trio code; closed on exit, even when cancelled."""
    raw = await trio.to_thread.run_sync(connect_sync, dsn, statement_timeout_ms, limiter=limiter)
    conn = Connection(raw, limiter)
    try:
        yield conn
    finally:
        await conn.aclose()
