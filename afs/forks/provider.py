"""The local fork provider: forks are databases copied from a quiet template.

A source database `S` (registered in the catalog) has a template copy
`S_template` that nobody may connect to (`ALLOW_CONNECTIONS false`), so an open
psql session on `S` never breaks forking. A fork is

    CREATE DATABASE "<fork>" TEMPLATE "S_template" STRATEGY FILE_COPY OWNER "<fork>"

(copy-on-write with `file_copy_method = clone` on XFS/btrfs/ZFS), plus a login
role of the same name that may connect to that fork only and owns its schemas
and tables. Every fork has a row in the catalog (`afs.forks` in the admin
database): parent, role password, owner process, TTL. The row is written
before anything else is made and deleted last, so `gc()` can always find and
remove what a killed process left behind: expired forks, forks whose owner
process is gone, and fork databases or roles that have no row.

Spares. Where forks clone (copy-on-write), the provider keeps `spares` ready forks
of each source it has forked (`top_up_spares`, run by the fork server in the
background once no fork is being made or deleted): databases made from the
template, role, limits and hand-over done, state `spare`, no owner. A fork of that
source then claims one in a single transaction (the database and role renamed to
the fork's name, a new password, the limits set again) instead of copying: a
squad's forks are ready in milliseconds.
A spare is a fork of the template as it was when the spare was made: refreshing
the template removes the spares made before (and `gc()` removes any it finds), so
a claimed spare never holds older data than a fork made at that moment would.
Where forks copy, there are no spares (each would cost a full copy of the data).
"""

from __future__ import annotations

import json
import math
import secrets
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import psutil
import trio
from psycopg import conninfo

from afs.conditions import carry_settings
from afs.config import ADMIN_STATEMENT_TIMEOUT_MS, ForkLimits
from afs.db import OWN_SERVER_MARK, Connection, open_connection
from afs.errors import (
    DatabaseError,
    ForkBusyError,
    ForkError,
    InputError,
    UnknownServiceError,
)
from afs.forks.limits import apply_role_limits
from afs.forks.naming import FORK_PREFIX, InvalidForkName, random_fork_name, validate_fork_name
from afs.locks import advisory_lock
from afs.pg.names import quote_ident, quote_literal

TEMPLATE_SUFFIX = "_template"
TEMPLATE_LOCK = "afs.template:"  # advisory lock: refresh exclusive, forking shared
HAND_OVER_LOCK = "afs.hand_over"  # advisory lock around REASSIGN OWNED in a new fork
FORK_CONNECTION_LIMIT = 20
STUCK_CREATION_S = 600
SPARE_TTL_S = 3600  # an unclaimed spare is collected after an hour
SPARE_LABEL = "spare"
QUIET_S = 0.05  # spares are made once no fork was made or deleted here for this long
# the spares of a source (%s) made from its template as it is now (not before its last refresh)
_FRESH_SPARES = ("FROM afs.forks f JOIN afs.sources s ON s.name = f.parent"
                 " WHERE f.state = 'spare' AND f.parent = %s"
                 " AND f.created_at >= coalesce(s.refreshed_at, '-infinity')")
# A fork's password is 192 random bits: there is nothing to stretch, and PostgreSQL's default
# 4,096 SCRAM iterations cost ~5 ms when it is set and ~4 ms at every log-in to the fork.
SCRAM_ITERATIONS = 16
_FEWER_SCRAM_ITERATIONS = (f"SELECT set_config('scram_iterations', '{SCRAM_ITERATIONS}', false)"
                           " FROM pg_settings WHERE name = 'scram_iterations'")  # PostgreSQL 16+
_SQLSTATE_IN_USE = "55006"
_SQLSTATE_DUPLICATE_DB = "42P04"

CATALOG_SQL = """
CREATE SCHEMA IF NOT EXISTS afs;
REVOKE ALL ON SCHEMA afs FROM PUBLIC;
CREATE TABLE IF NOT EXISTS afs.sources (
    name         text PRIMARY KEY,
    origin       text NOT NULL,
    refreshed_at timestamptz
);
CREATE TABLE IF NOT EXISTS afs.forks (
    name          text PRIMARY KEY,
    parent        text NOT NULL,
    role_password text NOT NULL,
    state         text NOT NULL DEFAULT 'creating',
    owner_host    text,
    owner_pid     integer,
    owner_started double precision,
    created_at    timestamptz NOT NULL DEFAULT now(),
    ttl_seconds   integer NOT NULL CHECK (ttl_seconds > 0),
    expires_at    timestamptz NOT NULL
);
ALTER TABLE afs.forks ADD COLUMN IF NOT EXISTS base_bytes bigint;
-- an import's origin server: server_version and planner settings (afs.analysis.server_facts)
ALTER TABLE afs.sources ADD COLUMN IF NOT EXISTS origin_server jsonb;
-- an import's record of the user's conditions (afs.conditions.settle_copy): when it was
-- imported, the plan settings given to the copy, each table's size and all-visible pages
ALTER TABLE afs.sources ADD COLUMN IF NOT EXISTS copy_state jsonb;
-- states: creating -> ready (a fork), creating -> spare -> ready (claimed, renamed)
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'afs.forks'::regclass
                 AND conname = 'forks_state_check' AND pg_get_constraintdef(oid) LIKE '%spare%') THEN
    ALTER TABLE afs.forks DROP CONSTRAINT IF EXISTS forks_state_check;
    ALTER TABLE afs.forks ADD CONSTRAINT forks_state_check
      CHECK (state IN ('creating', 'ready', 'spare'));
  END IF;
END $$;
"""


def validate_name(name: str) -> str:
    try:
        return validate_fork_name(name)
    except InvalidForkName as exc:
        raise InputError(str(exc)) from None


def validate_ttl(ttl_seconds: int) -> int:
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
        raise InputError(f"ttl_seconds must be a positive number of seconds, got {ttl_seconds!r}")
    return ttl_seconds


def template_name(source: str) -> str:
    return source + TEMPLATE_SUFFIX


def dsn_with(base_dsn: str, *, dbname: str, user: str, password: str | None,
             address: str | None = None) -> str:
    """`base_dsn` (admin connection) with another database, user and password, as a URL;
    `address` ("host" or "host:port") replaces its host and port."""
    params = conninfo.conninfo_to_dict(base_dsn)
    host = str(params.get("host", ""))
    port = str(params.get("port", ""))
    if address:
        host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
    auth = quote(user, safe="")
    if password is not None:
        auth += ":" + quote(password, safe="")
    query = ""
    if host.startswith("/"):
        netloc = f"{auth}@"
        query = f"?host={quote(host, safe='/')}" + (f"&port={port}" if port else "")
    else:
        netloc = f"{auth}@{host}" + (f":{port}" if port else "")
    if params.get(OWN_SERVER_MARK[0]) == OWN_SERVER_MARK[1]:  # a fork of AFS's own server is too
        query += ("&" if query else "?") + "=".join(OWN_SERVER_MARK)
    return f"postgresql://{netloc}/{quote(dbname, safe='')}{query}"


@dataclass(frozen=True)
class ForkInfo:
    name: str
    dsn: str
    parent: str
    created_at: str
    ttl_seconds: int
    expires_at: str
    owner: str | None

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GcReport:
    """What a garbage collection did: forks removed, and forks it could not remove (why)."""

    removed: list[str]
    failed: dict[str, str]

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _NewFork:
    """A fork about to be made, passed whole: the service it copies (`parent`: a source or a
    fork) and that service's template database, its name and its role's password, its lifetime
    and its owner (host, pid, process start; all None: only the TTL applies)."""

    parent: str
    template: str
    name: str
    password: str
    ttl_seconds: int
    owner: tuple[str | None, int | None, float | None]


def _process_start(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def owner_alive(host: str | None, pid: int | None, started: float | None) -> bool:
    """Whether the process that owns a fork still runs (pids may be reused: compare start times)."""
    if pid is None or host != socket.gethostname():
        return True  # no owner, or another machine's: only the TTL applies
    actual = _process_start(pid)
    if actual is None:
        return False
    return started is None or abs(actual - started) < 1.0


class LocalForkProvider:
    """Fork databases on one PostgreSQL server, reached with a superuser DSN."""

    def __init__(self, admin_dsn: str, limits: ForkLimits | None = None,
                 public_address: str | None = None, spares: int = 0,
                 statement_timeout_ms: int = ADMIN_STATEMENT_TIMEOUT_MS) -> None:
        """`public_address` ("host[:port]"): where clients reach the server, when that is not
        the admin DSN's host (a server in a container, published on the host machine).
        `spares`: ready forks to keep per source this provider has forked, where forks
        clone (see the module's docstring): none unless asked, as for a provider made for one
        command; the fork server asks for `Settings.fork_spares`. `statement_timeout_ms`: of
        the provider's own connections (config's, unless a caller builds larger indexes)."""
        self.admin_dsn = admin_dsn
        self.public_address = public_address
        self.statement_timeout_ms = statement_timeout_ms
        self.limits = limits or ForkLimits()
        self.spares = spares
        self._catalog_ready = False
        self._spare_sources: set[str] = set()  # sources forked here: their spares are kept
        self._spares_wanted = trio.Event()
        self._asked = 0  # forks being made or deleted here now
        self._last_asked = -math.inf  # when the last of them was done (trio clock)

    # -- plumbing -----------------------------------------------------------
    def _admin(self) -> Any:
        return open_connection(self.admin_dsn, self.statement_timeout_ms)

    def _fork_dsn(self, name: str, password: str) -> str:
        return dsn_with(self.admin_dsn, dbname=name, user=name, password=password,
                        address=self.public_address)

    async def ensure_catalog(self, conn: Connection) -> None:
        if self._catalog_ready:
            return
        await conn.execute("SELECT pg_advisory_lock(hashtext('afs.catalog'))")
        try:
            await conn.execute(CATALOG_SQL)
            admin_db = await conn.fetchval("SELECT current_database()")
            # Fork roles must reach their own fork and nothing else.
            for db in {admin_db, "template1"}:
                await conn.execute(f"REVOKE CONNECT, TEMPORARY ON DATABASE {quote_ident(db)} FROM PUBLIC")
        finally:
            await conn.execute("SELECT pg_advisory_unlock(hashtext('afs.catalog'))")
        self._catalog_ready = True

    # -- sources ------------------------------------------------------------
    async def register_source(self, source: str, origin: str,
                              origin_server: Mapping[str, str] | None = None,
                              copy_state: Mapping[str, Any] | None = None) -> None:
        """Make `source` forkable: catalog row, no PUBLIC access, fresh template.

        `origin_server`: for an import, the version and planner settings of the server it
        came from (None: `source` is the user's database itself). `copy_state`: for an
        import, what afs.conditions.settle_copy recorded (the report compares it with the
        source at each optimize)."""
        async with self._admin() as conn:
            await self.ensure_catalog(conn)
            if not await self._database_exists(conn, source):
                raise UnknownServiceError(source)
            await conn.execute(f"REVOKE CONNECT, TEMPORARY ON DATABASE {quote_ident(source)} FROM PUBLIC")
            await conn.execute(
                "INSERT INTO afs.sources (name, origin, origin_server, copy_state)"
                " VALUES (%s, %s, %s::jsonb, %s::jsonb)"
                " ON CONFLICT (name) DO UPDATE SET origin = EXCLUDED.origin,"
                " origin_server = EXCLUDED.origin_server, copy_state = EXCLUDED.copy_state",
                (source, origin, None if origin_server is None else json.dumps(dict(origin_server)),
                 None if copy_state is None else json.dumps(dict(copy_state))),
            )
        await self.refresh_template(source)

    async def refresh_template(self, source: str) -> None:
        """Copy `source` into its template (`<source>_template`).

        The new copy is made under a scratch name and swapped in, so a failure
        leaves the old template in place. Raises ForkBusyError when `source`
        has other sessions (PostgreSQL waits 5 s for them, then gives up).
        """
        template = template_name(source)
        async with self._admin() as conn, advisory_lock(conn, TEMPLATE_LOCK + template):
            await self.ensure_catalog(conn)
            await self._refresh_template(conn, source, template)

    async def _refresh_template(self, conn: Connection, source: str, template: str) -> None:
        scratch = template + "_new"
        if not await conn.fetchval("SELECT 1 FROM afs.sources WHERE name = %s", (source,)):
            raise UnknownServiceError(source, [s["name"] for s in await self.list_sources(conn)])
        await self._drop_database(conn, scratch)
        await self._create_database(conn, scratch, source)
        await conn.execute(f"ALTER DATABASE {quote_ident(scratch)} ALLOW_CONNECTIONS false")
        await conn.execute(f"REVOKE ALL ON DATABASE {quote_ident(scratch)} FROM PUBLIC")
        if await self._database_exists(conn, template):
            await conn.execute(f"ALTER DATABASE {quote_ident(template)} IS_TEMPLATE false")
            await self._drop_database(conn, template)
        await conn.execute(f"ALTER DATABASE {quote_ident(scratch)} RENAME TO {quote_ident(template)}")
        await conn.execute(f"ALTER DATABASE {quote_ident(template)} IS_TEMPLATE true")
        await conn.execute(
            "UPDATE afs.sources SET refreshed_at = now() WHERE name = %s", (source,)
        )
        await self._remove_spares(conn, source)  # copies of the old template

    async def drop_source(self, source: str) -> None:
        """Drop a source database, its template and its catalog row (forks of it stay), and
        the role that owns an imported copy (afs.sandbox.importer.import_owner)."""
        template = template_name(source)
        async with self._admin() as conn, advisory_lock(conn, TEMPLATE_LOCK + template):
            await self.ensure_catalog(conn)
            owners = await conn.fetchall(
                "SELECT DISTINCT r.rolname FROM pg_shdepend s JOIN pg_roles r ON r.oid = s.refobjid"
                " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s AND s.deptype = 'o'"
                " AND r.rolname LIKE 'afs\\_import\\_%%' AND NOT r.rolsuper", (source,))
            if await self._database_exists(conn, template):
                await conn.execute(f"ALTER DATABASE {quote_ident(template)} IS_TEMPLATE false")
            await self._remove_spares(conn, source)
            for name in (template, source):
                await self._drop_database(conn, name)
            await conn.execute("DELETE FROM afs.sources WHERE name = %s", (source,))
            for (role,) in owners:
                try:
                    await conn.execute(f"DROP ROLE IF EXISTS {quote_ident(role)}")
                except DatabaseError as exc:  # a fork still being handed its objects: kept
                    if exc.sqlstate != "2BP01":  # (the next import of that name drops it)
                        raise

    async def list_sources(self, conn: Connection) -> list[dict[str, Any]]:
        rows = await conn.fetchall(
            "SELECT s.name, s.origin, s.refreshed_at, pg_database_size(d.oid), s.origin_server,"
            " s.copy_state FROM afs.sources s JOIN pg_database d ON d.datname = s.name ORDER BY s.name"
        )
        return [
            {
                "name": name,
                "kind": "source",
                "origin": origin,
                "template_refreshed_at": refreshed.isoformat() if refreshed else None,
                "size_mb": round(size / 1048576, 1),
                "origin_server": origin_server,
                "copy_state": copy_state,
            }
            for name, origin, refreshed, size, origin_server, copy_state in rows
        ]

    # -- the four tools -----------------------------------------------------
    async def list_services(self) -> dict[str, Any]:
        async with self._admin() as conn:
            await self.ensure_catalog(conn)
            sources = await self.list_sources(conn)
            forks = [f.public() for f in await self._forks(conn)]
        return {"sources": sources, "forks": forks}

    async def get_service(self, service_id: str) -> dict[str, Any]:
        async with self._admin() as conn:
            await self.ensure_catalog(conn)
            for fork in await self._forks(conn, service_id):
                size = await conn.fetchval("SELECT pg_database_size(%s)", (service_id,))
                return {"kind": "fork", **fork.public(), "size_mb": round((size or 0) / 1048576, 1)}
            for source in await self.list_sources(conn):
                if source["name"] == service_id:
                    return source
            raise UnknownServiceError(service_id, await self._known(conn))

    async def fork(
        self,
        service_id: str,
        name: str | None = None,
        ttl_seconds: int = 3600,
        owner_pid: int | None = None,
        owner_host: str | None = None,
    ) -> ForkInfo:
        """Create a fork of `service_id` (a source or a fork) and its login role.

        `owner_pid` on `owner_host` (default: this host) owns the fork: on this host,
        the fork is collected once that process is gone; a process on another host
        (a client of a fork server in a container or on another machine) cannot be
        seen from here, so only the TTL applies to its forks.
        """
        validate_ttl(ttl_seconds)
        name = validate_name(name or random_fork_name())
        here = socket.gethostname()
        owner_host = (owner_host or here) if owner_pid is not None else None
        owner_started = None
        if owner_pid is not None and owner_host == here:
            owner_started = _process_start(owner_pid)
            if owner_started is None:
                raise InputError(f"owner process {owner_pid} does not exist on {here}")
        owner = (owner_host, owner_pid, owner_started)
        password = secrets.token_urlsafe(24)
        with self._asked_for():
            async with self._admin() as conn:
                await self.ensure_catalog(conn)
                template = await self._template_of(conn, service_id)
                if await conn.fetchval("SELECT EXISTS (SELECT FROM afs.forks WHERE name = %s)"
                                       " OR EXISTS (SELECT FROM pg_database WHERE datname = %s)",
                                       (name, name)):
                    raise InputError(f"a fork named {name!r} exists already")
                spares = self.spares > 0 and template != service_id  # a source's fork: spares serve it
                new = _NewFork(service_id, template, name, password, ttl_seconds, owner)
                if not (spares and await self._claim_spare(conn, new)):
                    await self._create(conn, new, state="ready")
                fork = (await self._forks(conn, name))[0]
            if spares:  # after the claim: the top-up counts what is left
                self._spare_sources.add(service_id)
                self._spares_wanted.set()
            await self._verify(fork.name, password)
            return fork

    # -- spares -------------------------------------------------------------
    async def spares_wanted(self) -> None:
        """Return once a fork of a source was asked for since the last call (the fork
        server then tops up the spares)."""
        await self._spares_wanted.wait()
        self._spares_wanted = trio.Event()

    @contextmanager
    def _asked_for(self) -> Iterator[None]:
        """Mark a fork being made or deleted for a client: spares wait for it (`_quiet`)."""
        self._asked += 1
        try:
            yield
        finally:
            self._asked -= 1
            self._last_asked = trio.current_time()

    async def _quiet(self) -> None:
        """Return once no fork has been made or deleted here for QUIET_S: a spare is made
        in the background, and its CREATE DATABASE (two checkpoints, the clone, the hand-over)
        would slow down the forks a client waits for (a squad's three at once, say)."""
        while True:
            wait = QUIET_S if self._asked else QUIET_S - (trio.current_time() - self._last_asked)
            if wait <= 0:
                return
            await trio.sleep(wait)

    async def top_up_spares(self) -> list[str]:
        """Make spares, one at a time, each once the forks asked for here are done
        (`_quiet`), until each source forked here has `spares` fresh ones (none where
        forks copy); returns the names made."""
        made: list[str] = []
        for source in sorted(self._spare_sources):
            await self._quiet()
            async with self._admin() as conn:
                await self.ensure_catalog(conn)
                if not await _forks_clone(conn):
                    return made
                fresh = await conn.fetchval(f"SELECT count(*) {_FRESH_SPARES}", (source,))
                template = await self._template_of(conn, source)
                for _ in range(self.spares - int(fresh or 0)):
                    await self._quiet()
                    name = validate_name(random_fork_name(SPARE_LABEL))
                    password = secrets.token_urlsafe(24)
                    await self._create(conn, _NewFork(source, template, name, password, SPARE_TTL_S,
                                                      (None, None, None)), state="spare")
                    await self._verify(name, password)
                    made.append(name)
        return made

    async def _claim_spare(self, conn: Connection, new: _NewFork) -> bool:
        """Turn a fresh spare of `new.parent` (a source) into the fork `new.name`, in one
        transaction; False when there is none (or forks copy here)."""
        if not await _forks_clone(conn):
            return False
        source, template, name, password, ttl_seconds = (new.parent, new.template, new.name,
                                                          new.password, new.ttl_seconds)
        ident = quote_ident(name)
        owner_host, owner_pid, owner_started = new.owner
        async with advisory_lock(conn, TEMPLATE_LOCK + template, shared=True):  # not mid-refresh
            await conn.execute("BEGIN")
            try:
                spare = await conn.fetchval(
                    f"SELECT f.name {_FRESH_SPARES} AND f.expires_at > now() + interval '1 minute'"
                    " ORDER BY f.created_at LIMIT 1 FOR UPDATE OF f SKIP LOCKED", (source,))
                if spare is None:
                    await conn.execute("ROLLBACK")
                    return False
                await conn.execute(
                    "UPDATE afs.forks SET name = %s, role_password = %s, state = 'ready',"
                    " owner_host = %s, owner_pid = %s, owner_started = %s, created_at = now(),"
                    " ttl_seconds = %s, expires_at = now() + make_interval(secs => %s)"
                    " WHERE name = %s",
                    (name, password, owner_host, owner_pid, owner_started, ttl_seconds,
                     ttl_seconds, spare))
                await conn.execute(  # one round trip
                    f"ALTER DATABASE {quote_ident(spare)} RENAME TO {ident};"
                    f"ALTER ROLE {quote_ident(spare)} RENAME TO {ident};"
                    f"{_FEWER_SCRAM_ITERATIONS};"
                    f"ALTER ROLE {ident} PASSWORD {quote_literal(password)}")
                await apply_role_limits(conn, name, self.limits)  # today's limits
                await conn.execute("COMMIT")
            except BaseException:
                with trio.CancelScope(shield=True):
                    await conn.execute("ROLLBACK")
                raise
        return True

    async def _remove_spares(self, conn: Connection, source: str) -> None:
        rows = await conn.fetchall(
            "SELECT name FROM afs.forks WHERE state = 'spare' AND parent = %s", (source,))
        for (name,) in rows:
            await self._remove(conn, name)

    async def _create(self, conn: Connection, new: _NewFork, state: str) -> None:
        """Catalog row first, then role and database; everything removed again on failure."""
        parent, template, name, password, ttl_seconds = (new.parent, new.template, new.name,
                                                          new.password, new.ttl_seconds)
        owner_host, owner_pid, owner_started = new.owner
        inserted = await conn.fetchval(
            "INSERT INTO afs.forks (name, parent, role_password, owner_host, owner_pid,"
            " owner_started, ttl_seconds, expires_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, now() + make_interval(secs => %s))"
            " ON CONFLICT (name) DO NOTHING RETURNING 1",
            (name, parent, password, owner_host, owner_pid, owner_started, ttl_seconds,
             ttl_seconds),
        )
        if not inserted or await self._database_exists(conn, name):
            raise InputError(f"a fork named {name!r} exists already")
        try:
            await self._make_fork(conn, name, password, template, state, parent)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._remove(conn, name)
            raise

    async def delete(self, service_id: str) -> dict[str, Any]:
        """Destroy a fork: database, role and catalog row. Idempotent."""
        if service_id.endswith(TEMPLATE_SUFFIX) or not service_id.startswith(FORK_PREFIX):
            raise InputError(f"{service_id!r} is not a fork; only forks can be deleted")
        with self._asked_for():
            async with self._admin() as conn:
                await self.ensure_catalog(conn)
                existed = await self._remove(conn, service_id)
        return {"service_id": service_id, "deleted": existed}

    async def gc(self) -> GcReport:
        """Remove expired forks, forks of dead owners, spares older than their source's
        template and leftovers without a catalog row.

        Each fork is removed on its own: one that cannot be removed (its role still
        owns or holds something elsewhere, say) is reported in `failed` and kept in
        the catalog for the next round, and the others are removed all the same.
        """
        removed: list[str] = []
        failed: dict[str, str] = {}
        async with self._admin() as conn:
            await self.ensure_catalog(conn)
            rows = await conn.fetchall(
                "SELECT name, owner_host, owner_pid, owner_started,"
                " expires_at < now() AS expired,"
                " state = 'creating' AND created_at < now() - make_interval(secs => %s) AS stuck,"
                " state = 'spare' AND NOT EXISTS (SELECT 1 FROM afs.sources s WHERE s.name = parent"
                " AND created_at >= coalesce(s.refreshed_at, '-infinity')) AS stale"
                " FROM afs.forks ORDER BY name",
                (STUCK_CREATION_S,),
            )
            doomed = [name for name, host, pid, started, expired, stuck, stale in rows
                      if expired or stuck or stale or not owner_alive(host, pid, started)]
            like = FORK_PREFIX.replace("_", r"\_") + "%"
            stray = await conn.fetchall(
                "SELECT datname FROM pg_database WHERE datname LIKE %s"
                " AND datname NOT IN (SELECT name FROM afs.forks)"
                " UNION SELECT rolname FROM pg_roles WHERE rolname LIKE %s"
                " AND rolname NOT IN (SELECT name FROM afs.forks) ORDER BY 1",
                (like, like),
            )
            for name in [*doomed, *(r[0] for r in stray)]:
                try:
                    await self._remove(conn, name)
                except DatabaseError as exc:
                    failed[name] = " ".join(str(exc).split())
                    continue
                removed.append(name)
        return GcReport(removed=sorted(set(removed)), failed=failed)

    async def enforce_limits(self) -> list[str]:
        """Cancel the running statements of every fork grown past its cap; returns those forks.

        The backstop of `limits.check_growth`: it catches what the planner underestimated,
        and any client (psql) that never asked.
        """
        cap = self.limits.max_growth_mb * 1048576
        async with self._admin() as conn:
            await self.ensure_catalog(conn)
            rows = await conn.fetchall(
                "SELECT f.name, pg_database_size(d.oid) - f.base_bytes FROM afs.forks f"
                " JOIN pg_database d ON d.datname = f.name"
                " WHERE f.state = 'ready' AND f.base_bytes IS NOT NULL ORDER BY f.name")
            over = [name for name, growth in rows if growth is not None and growth > cap]
            for name in over:
                await conn.execute(
                    "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                    " AND state <> 'idle' AND pid <> pg_backend_pid()", (name,))
        return over

    async def traces(self) -> set[str]:
        """Every trace of a fork on the server, whatever its state: databases and roles
        named afs-fork-…, catalog rows. (Leak checks look here, not at ready forks only.)"""
        like = FORK_PREFIX.replace("_", r"\_") + "%"
        async with self._admin() as conn:
            await self.ensure_catalog(conn)
            rows = await conn.fetchall(
                "SELECT datname FROM pg_database WHERE datname LIKE %s"
                " UNION SELECT rolname FROM pg_roles WHERE rolname LIKE %s"
                " UNION SELECT name FROM afs.forks", (like, like))
        return {r[0] for r in rows}

    # -- internals ------------------------------------------------------------
    async def _make_fork(self, conn: Connection, name: str, password: str, template: str,
                         state: str, parent: str) -> None:
        ident = quote_ident(name)
        await conn.execute(_FEWER_SCRAM_ITERATIONS)
        await conn.execute(
            f"CREATE ROLE {ident} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION"
            f" CONNECTION LIMIT {FORK_CONNECTION_LIMIT} PASSWORD {quote_literal(password)}"
        )
        await apply_role_limits(conn, name, self.limits)
        async with advisory_lock(conn, TEMPLATE_LOCK + template, shared=True):  # not mid-refresh
            await self._create_database(conn, name, template, owner=name)
        await conn.execute(f"REVOKE ALL ON DATABASE {ident} FROM PUBLIC")
        await conn.execute(f"GRANT CONNECT, TEMPORARY ON DATABASE {ident} TO {ident}")
        await _copy_plan_settings(conn, parent, name)
        fork_admin_dsn = dsn_with(self.admin_dsn, dbname=name,
                                  user=str(conninfo.conninfo_to_dict(self.admin_dsn).get("user", "postgres")),
                                  password=_admin_password(self.admin_dsn))
        async with open_connection(fork_admin_dsn, self.statement_timeout_ms) as fork_conn:
            # REASSIGN OWNED touches pg_database rows: one at a time (see _reassign_owned_here)
            await _hand_over_objects(fork_conn, name, lambda: advisory_lock(conn, HAND_OVER_LOCK))
        await conn.execute("UPDATE afs.forks SET state = %s, base_bytes = pg_database_size(%s)"
                           " WHERE name = %s", (state, name, name))

    async def _verify(self, name: str, password: str) -> None:
        """The seed's "verify fork accessible": log in as the fork's role (at the admin DSN's
        address: the public one may not be reachable from here)."""
        try:
            async with open_connection(dsn_with(self.admin_dsn, dbname=name, user=name,
                                                password=password), 10_000) as conn:
                await conn.fetchval("SELECT 1")
        except DatabaseError as exc:
            await self.delete(name)
            raise ForkError(f"fork {name} was created but its role cannot log in: {exc}") from exc

    async def _template_of(self, conn: Connection, service_id: str) -> str:
        if not service_id or not isinstance(service_id, str):
            raise InputError("service_id must name a source database or a fork")
        template = template_name(service_id)
        row = await conn.fetchone(  # one round trip
            "SELECT EXISTS (SELECT FROM afs.forks WHERE name = %s AND state = 'ready'),"
            " EXISTS (SELECT FROM afs.sources WHERE name = %s),"
            " EXISTS (SELECT FROM pg_database WHERE datname = %s)", (service_id, service_id, template))
        is_fork, is_source, has_template = row or (False, False, False)
        if is_fork:
            return service_id
        if not is_source:
            raise UnknownServiceError(service_id, await self._known(conn))
        if not has_template:
            raise ForkError(
                f"source {service_id!r} has no template {template!r}; run `afs sandbox up`"
                " (or re-import it) to make one"
            )
        return template

    async def _create_database(self, conn: Connection, name: str, template: str,
                               owner: str | None = None) -> None:
        owner_sql = f" OWNER {quote_ident(owner)}" if owner else ""
        try:
            await conn.execute(
                f"CREATE DATABASE {quote_ident(name)} TEMPLATE {quote_ident(template)}"
                f" STRATEGY FILE_COPY{owner_sql}"
            )
        except DatabaseError as exc:
            if exc.sqlstate == _SQLSTATE_IN_USE:
                raise ForkBusyError(
                    f"{template!r} is being accessed by other sessions, so it cannot be copied"
                    " right now; close them or retry in a few seconds"
                ) from exc
            if exc.sqlstate == _SQLSTATE_DUPLICATE_DB:
                raise InputError(f"a database named {name!r} exists already") from exc
            raise

    async def _remove(self, conn: Connection, name: str) -> bool:
        """Drop database, role and catalog row of `name`, whichever exist."""
        ident = quote_ident(name)
        existed = await self._database_exists(conn, name)
        await self._drop_database(conn, name)
        if await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)):
            existed = True
            await conn.execute(f"DROP ROLE IF EXISTS {ident}")
        deleted = await conn.fetchval("DELETE FROM afs.forks WHERE name = %s RETURNING 1", (name,))
        return existed or bool(deleted)

    async def _drop_database(self, conn: Connection, name: str) -> None:
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")

    async def _database_exists(self, conn: Connection, name: str) -> bool:
        return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = %s", (name,)))

    async def _known(self, conn: Connection) -> list[str]:
        rows = await conn.fetchall("SELECT name FROM afs.sources"
                                   " UNION SELECT name FROM afs.forks WHERE state <> 'spare'")
        return [r[0] for r in rows]

    async def _forks(self, conn: Connection, name: str | None = None) -> list[ForkInfo]:
        rows = await conn.fetchall(
            "SELECT name, role_password, parent, created_at, ttl_seconds, expires_at,"
            " owner_host, owner_pid FROM afs.forks WHERE state = 'ready'"
            " AND (%s::text IS NULL OR name = %s) ORDER BY created_at, name",
            (name, name),
        )
        return [
            ForkInfo(
                name=fname,
                dsn=self._fork_dsn(fname, password),
                parent=parent,
                created_at=_iso(created),
                ttl_seconds=ttl,
                expires_at=_iso(expires),
                owner=f"pid {pid} on {host}" if pid else None,
            )
            for fname, password, parent, created, ttl, expires, host, pid in rows
        ]


async def _forks_clone(conn: Connection) -> bool:
    """Whether CREATE DATABASE on `conn` clones files (PostgreSQL 18, file_copy_method)."""
    return bool(await conn.fetchval(
        "SELECT current_setting('file_copy_method', true) IS NOT DISTINCT FROM 'clone'"))


async def _copy_plan_settings(conn: Connection, parent: str, fork: str) -> None:
    """The parent's database-level plan settings (an import's: the user's server's, given by
    afs.conditions.settle_copy) as the fork's: CREATE DATABASE copies files, not the settings
    of pg_db_role_setting. Names are checked against the server's pg_settings, values quoted."""
    rows = await conn.fetchall(
        "SELECT unnest(s.setconfig) FROM pg_db_role_setting s JOIN pg_database d"
        " ON d.oid = s.setdatabase WHERE s.setrole = 0 AND d.datname = %s", (parent,))
    values = {name: value for name, _, value in (str(r[0]).partition("=") for r in rows)}
    await carry_settings(conn, fork, values)


def _iso(value: datetime) -> str:
    return value.isoformat()


def _admin_password(dsn: str) -> str | None:
    value = conninfo.conninfo_to_dict(dsn).get("password")
    return None if value is None else str(value)


_USER_SCHEMA = ("n.nspname NOT IN ('pg_catalog', 'information_schema')"
                " AND n.nspname NOT LIKE 'pg\\_%%'")
_NOT_AN_EXTENSION_MEMBER = ("NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = {cls}::regclass"
                            " AND d.objid = {oid} AND d.deptype = 'e')")


async def _hand_over_objects(conn: Connection, role: str,
                             serialized: Callable[[], AbstractAsyncContextManager[None]]) -> None:
    """Make the fork's role own the objects of the copied database, and nothing else.

    Roles that own objects in the copy are of two kinds. A superuser's objects are
    handed over one by one (schemas, relations, functions: an imported SECURITY
    DEFINER function then runs with the fork role's rights, not a superuser's).
    Any other role (the parent fork's role, or the ordinary role that owns a source
    behind --admin-dsn) gets `REASSIGN OWNED`, which would also hand over the
    databases and tablespaces that role owns anywhere on the server (the parent
    fork itself): they are given back in the same transaction, one fork at a time
    (`serialized`: concurrent updates of one pg_database row fail).
    """
    # a superuser's session in a copy of someone's database: only the catalog's functions and
    # operators (a planted public.quote_ident(name) would be a closer match than the catalog's)
    await conn.execute("SET search_path = pg_catalog, pg_temp")
    owners = await conn.fetchall(
        "SELECT DISTINCT r.rolname, r.rolsuper FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_roles r ON r.oid = c.relowner"
        f" WHERE {_USER_SCHEMA}"
        " UNION SELECT r.rolname, r.rolsuper FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner"
        f" WHERE {_USER_SCHEMA}"
        " UNION SELECT r.rolname, r.rolsuper FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_roles r ON r.oid = p.proowner"
        f" WHERE {_USER_SCHEMA}"
        " UNION SELECT r.rolname, r.rolsuper FROM pg_shdepend s JOIN pg_roles r ON r.oid = s.refobjid"
        " WHERE s.deptype = 'o' AND s.dbid = (SELECT oid FROM pg_database"
        " WHERE datname = current_database())"
    )
    for owner, is_super in sorted(owners):
        if owner in (role, "pg_database_owner"):
            continue
        if is_super:
            await _hand_over_one_by_one(conn, owner, role)
        else:
            async with serialized():
                await _reassign_owned_here(conn, owner, role)


async def restrict_definer_routines(conn: Connection) -> list[str]:
    """Take EXECUTE from PUBLIC on every SECURITY DEFINER routine a superuser owns (not an
    extension's) in the database of `conn`; returns their signatures.

    For copies the sandbox makes (`pg_restore --no-owner` gives every routine to the
    superuser): otherwise any role that may call one, however low its rights, runs it as
    the superuser. Forks hand these routines to their own role, which keeps EXECUTE as owner.
    """
    rows = await conn.fetchall(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_roles r ON r.oid = p.proowner"
        f" WHERE p.prosecdef AND r.rolsuper AND {_USER_SCHEMA}"
        " AND " + _NOT_AN_EXTENSION_MEMBER.format(cls="'pg_proc'", oid="p.oid") + " ORDER BY 1")
    for (signature,) in rows:
        await conn.execute(f"REVOKE EXECUTE ON ROUTINE {signature} FROM PUBLIC")
    return [r[0] for r in rows]


async def _reassign_owned_here(conn: Connection, owner: str, role: str) -> None:
    """REASSIGN OWNED in this database only: shared objects go back to `owner` at once."""
    databases = await conn.fetchall(
        "SELECT datname FROM pg_database WHERE datdba = (SELECT oid FROM pg_roles WHERE rolname = %s)",
        (owner,))
    tablespaces = await conn.fetchall(
        "SELECT spcname FROM pg_tablespace"
        " WHERE spcowner = (SELECT oid FROM pg_roles WHERE rolname = %s)", (owner,))
    source = quote_ident(owner)
    await conn.execute("BEGIN")
    try:
        await conn.execute(f"REASSIGN OWNED BY {source} TO {quote_ident(role)}")
        for (database,) in databases:
            await conn.execute(f"ALTER DATABASE {quote_ident(database)} OWNER TO {source}")
        for (tablespace,) in tablespaces:
            await conn.execute(f"ALTER TABLESPACE {quote_ident(tablespace)} OWNER TO {source}")
        await conn.execute("COMMIT")
    except BaseException:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")
        raise


async def _hand_over_one_by_one(conn: Connection, owner: str, role: str) -> None:
    """A superuser's schemas, relations and routines (not an extension's) to `role`."""
    objects = await conn.fetchall(
        "SELECT 'SCHEMA', quote_ident(n.nspname) FROM pg_namespace n JOIN pg_roles r"
        f" ON r.oid = n.nspowner WHERE r.rolname = %s AND {_USER_SCHEMA}"
        " AND " + _NOT_AN_EXTENSION_MEMBER.format(cls="'pg_namespace'", oid="n.oid") +
        " UNION ALL SELECT CASE c.relkind WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'v' THEN 'VIEW'"
        " WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,"
        " quote_ident(n.nspname) || '.' || quote_ident(c.relname)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = %s"
        f" AND c.relkind IN ('r', 'p', 'm', 'v', 'S', 'f') AND {_USER_SCHEMA}"
        " AND " + _NOT_AN_EXTENSION_MEMBER.format(cls="'pg_class'", oid="c.oid") +
        " AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid"
        " AND d.deptype IN ('a', 'i')))"
        " UNION ALL SELECT 'ROUTINE', p.oid::regprocedure::text"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        f" JOIN pg_roles r ON r.oid = p.proowner WHERE r.rolname = %s AND {_USER_SCHEMA}"
        " AND " + _NOT_AN_EXTENSION_MEMBER.format(cls="'pg_proc'", oid="p.oid"),
        (owner, owner, owner),
    )
    target = quote_ident(role)
    for kind, qualified in objects:
        await conn.execute(f"ALTER {kind} {qualified} OWNER TO {target}")
