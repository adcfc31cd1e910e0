"""Copy a user's database into the sandbox, so it can be forked locally.

One function per step, with the embedded PostgreSQL 18 binaries (they dump older servers too):

    prepare  the copy's own role, `afs_import_<name>` (NOSUPERUSER, NOCREATEDB, NOCREATEROLE;
             LOGIN with a random password while the import runs), and a scratch database in
             which it may create schemas, and whose `public` schema it owns
    dump     pg_dump --format=custom into a file (the source database is only read)
    extend   the extensions of SUPERUSER_EXTENSIONS the dump has, made by the superuser in the
             still empty copy (only a superuser may create them)
    restore  pg_restore --no-owner --no-privileges logged in as that role, going on past
             errors; then each object that failed is restored again statement by statement in
             dump order, and the statements the server still refuses (a setting of another
             server version, an extension it lacks, one only a superuser may run) are skipped
             and listed; the data of every table must arrive (the import fails if any would be lost)
    settle   the source's plan settings given to the copy, and VACUUM (afs.conditions.settle_copy)
    analyze  ANALYZE as that role
    seal     the role loses LOGIN and its password; the catalogs analysed; activity counters
             from zero (the restore is not the workload)
    publish  rename the scratch database to its name; register it as a forkable source, with
             the source server's version and planner settings (the advice is for that server)

Who runs what (nobody's code runs with more rights than its owner). The source's code (index
expressions, CHECK constraints and domains evaluated as rows arrive, generated columns,
materialized views refreshed, what ANALYZE evaluates) runs only in sessions of the copy's role,
which owns every object of the copy and nothing else on the server: a planted function has
that role's rights, never the superuser's. The role logs in itself: a superuser's session
with `SET ROLE` (pg_restore --role) would not do, since a CHECK constraint's function may
`RESET ROLE` back to the session's superuser (only index builds, REFRESH and ANALYZE run
security-restricted, as the table's owner). The database itself belongs to the superuser,
so the role cannot `ALTER DATABASE … SET` defaults (a `search_path` that puts its own
functions before the catalog's) for AFS's later sessions. Extensions the server trusts are
created by the role (their objects then belong to the bootstrap superuser, as PostgreSQL
does it); of the others, those of SUPERUSER_EXTENSIONS are made before the restore (`extend`),
the rest are refused and listed. The superuser's sessions in the copy (`extend`, `seal`) pin
`search_path` to the catalog. No password is on a
child's command line (every local user sees those in `ps`): pg_dump and pg_restore get the
connection string without it, and the password as PGPASSWORD (`child_connection`).

Each failure names its step and carries that step's own stderr. The copy lands in a scratch
database that is renamed only when all steps have finished; on failure the scratch and the
role are dropped. While dump and restore run, `progress` hears how many MB have been dumped and
restored, out of about the source's size, every PROGRESS_EVERY_S seconds.

The copy lands in the sandbox's own data directory, so on copy-on-write storage
(`afs sandbox up --cow`) it is forked by cloning from then on.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pglast
import psycopg
import structlog
import trio
from psycopg import conninfo

from afs.analysis import server_facts
from afs.conditions import settle_copy
from afs.config import process_environment
from afs.db import Connection, connect_sync, open_connection, resolve_dsn
from afs.errors import AfsError, InputError, SandboxError, UnknownServiceError, scrub
from afs.forks.provider import LocalForkProvider, restrict_definer_routines
from afs.pg.names import quote_ident, quote_literal
from afs.sandbox.server import SandboxServer, dsn_for, pg_binary

log = structlog.get_logger(__name__)

_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
RESERVED = ("postgres", "template0", "template1")
IMPORT_TIMEOUT_S = 3600
MB = 1048576
PROGRESS_EVERY_S = 2.0
# TOC entries that carry rows: if one cannot be restored, data would be lost
_DATA_KINDS = ("TABLE DATA", "BLOBS", "BLOB", "BLOB DATA", "LARGE OBJECT")
_TOC_ENTRY = re.compile(r"^pg_restore: from TOC entry (\d+); ")
_TOC_LINE = re.compile(r"^(\d+); \d+ \d+ (.+)$")
_META = re.compile(r"^\\(un)?restrict .*$", re.MULTILINE)  # psql meta-commands pg_restore -f writes
# Extensions PostgreSQL does not trust (only a superuser may create them) that the sandbox makes
# for a copy whose dump has them: types, operators, index methods and statistics, whose scripts
# are the sandbox's own installation's, run while the copy is still empty (nothing of the
# source can stand in their way). Without them, a table with a `vector` column would be lost.
SUPERUSER_EXTENSIONS = frozenset({"bloom", "pg_stat_statements", "vector"})
IMPORT_OWNER_PREFIX = "afs_import_"  # the role that owns an imported copy (afs.forks.provider drops it)
# the superuser's sessions in a copy: the catalog's functions and operators, never one the
# copy's role wrote into a schema of the path as a closer match (quote_ident(name), say)
PIN_SEARCH_PATH = "SET search_path = pg_catalog, pg_temp"


@dataclass(frozen=True)
class Scratch:
    """Where an import lands until it is published: the scratch database, and its connections."""

    name: str  # the scratch database
    role: str  # the copy's role (import_owner)
    admin: str  # the superuser, in the admin database
    superuser: str  # the superuser, in the scratch database
    as_role: str  # the copy's role, in the scratch database (it may log in until `seal`)


@dataclass(frozen=True)
class ImportReport:
    database: str
    origin: str
    seconds: float
    schema_only: bool
    skipped: tuple[str, ...] = ()  # statements the sandbox's server refused, each with its error


def origin_of(dsn: str) -> str:
    """A password-free description of where a DSN points (used to find the import again)."""
    try:
        params = conninfo.conninfo_to_dict(resolve_dsn(dsn))  # the user's PG* variables written in
    except psycopg.ProgrammingError as exc:
        raise InputError(f"not a valid connection string: {scrub(str(exc))}") from None
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "postgres"
    return f"{host}:{port}/{dbname}"


def default_import_name(dsn: str) -> str:
    dbname = origin_of(dsn).rsplit("/", 1)[1]
    return re.sub(r"[^a-z0-9_]", "_", dbname.lower())[:50] or "imported"


def import_owner(name: str) -> str:
    """The role that owns the copy imported as `name` (a name of at most 63 bytes)."""
    role = IMPORT_OWNER_PREFIX + name
    if len(role) > 63:
        role = role[:54] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return role


def child_connection(dsn: str) -> tuple[str, dict[str, str]]:
    """What a libpq child (pg_dump, pg_restore) is given to connect to `dsn`: the connection
    string without its password, for its command line (every local user reads those in `ps`),
    and its environment, with the password as PGPASSWORD (only this user can read that).

    The environment is this process's without PG* variables: the connection string says it
    all (a user's DSN has them written in by afs.db.resolve_dsn; AFS's own DSNs ignore them).
    """
    try:
        params = {k: str(v) for k, v in conninfo.conninfo_to_dict(dsn).items()}
    except psycopg.ProgrammingError as exc:
        raise InputError(f"not a valid connection string: {scrub(str(exc))}") from None
    env = {k: v for k, v in process_environment().items() if not k.startswith("PG")}
    password = params.pop("password", None)
    if password is not None:
        env["PGPASSWORD"] = password
    return conninfo.make_conninfo("", **params), env


def dump_command(source_dsn: str, path: Path, schema_only: bool) -> tuple[list[str], dict[str, str]]:
    """pg_dump's command line and environment for the dump step."""
    dbname, env = child_connection(source_dsn)
    command = [pg_binary("pg_dump"), "--format=custom", "--no-owner", "--no-privileges",
               f"--file={path}", *(["--schema-only"] if schema_only else []), f"--dbname={dbname}"]
    return command, env


def restore_command(path: Path, target_dsn: str, *options: str) -> tuple[list[str], dict[str, str]]:
    """pg_restore's command line and environment, restoring `path` into `target_dsn` (the
    copy's role: its objects are that role's) with `options`."""
    dbname, env = child_connection(target_dsn)
    return [pg_binary("pg_restore"), "--no-owner", "--no-privileges", *options,
            f"--dbname={dbname}", str(path)], env


def _run(step: str, command: list[str],
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one step's command; SandboxError naming the step when it cannot run at all."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S,
                              env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{step} failed: {scrub(str(exc))}") from exc


def _tail(text: str) -> str:
    return scrub(text.strip())[-500:] or "(no message)"


# -- dump --------------------------------------------------------------------------------
def dump(source_dsn: str, path: Path, schema_only: bool = False) -> None:
    """pg_dump the source into `path` (custom format); SandboxError "pg_dump failed: …"."""
    source_dsn = resolve_dsn(source_dsn)  # pg_dump sees no PG* variable: AFS took them (afs.config)
    result = _run("pg_dump", *dump_command(source_dsn, path, schema_only))
    if result.returncode != 0:
        raise SandboxError(f"pg_dump failed: {_tail(result.stderr)}")


# -- extend ------------------------------------------------------------------------------
def extend(path: Path, scratch_dsn: str, role: str) -> Path | None:
    """Make the extensions of SUPERUSER_EXTENSIONS that the dump at `path` creates (and this
    server has) in the empty copy, as the superuser (`scratch_dsn`), each in the dump's schema
    (made for `role` when not `public`); returns the restore's list of entries, without those
    extensions, their comments and their schemas (None: all entries)."""
    wanted = [entry for entry, kind in _toc(path) if kind.startswith("EXTENSION - ")
              and kind.removeprefix("EXTENSION - ") in SUPERUSER_EXTENSIONS]
    if not wanted:
        return None
    script = _run("pg_restore", [pg_binary("pg_restore"), f"--use-list={_list_file(path, *wanted)}",
                                 "--file=-", str(path)])
    schemas = {str(stmt.extname): next((o.arg.sval for o in stmt.options or () if o.defname == "schema"),
                                  "public")
               for stmt in (raw.stmt for raw in pglast.parse_sql(_META.sub("", script.stdout)))
               if isinstance(stmt, pglast.ast.CreateExtensionStmt)}
    left_out = set()
    with connect_sync(scratch_dsn, statement_timeout_ms=IMPORT_TIMEOUT_S * 1000) as conn:
        conn.execute(PIN_SEARCH_PATH)
        available = {r[0] for r in conn.execute(
            "SELECT name FROM pg_available_extensions WHERE name = ANY(%s)", (list(schemas),))}
        for name, schema in sorted(schemas.items()):
            if name not in available:  # the restore refuses it to the role, and lists it
                continue
            if schema != "public":
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}"
                             f" AUTHORIZATION {quote_ident(role)}")
                left_out.add(f"SCHEMA - {schema}")
            conn.execute(f"CREATE EXTENSION IF NOT EXISTS {quote_ident(name)}"
                         f" WITH SCHEMA {quote_ident(schema)}")
            left_out |= {f"EXTENSION - {name}", f"COMMENT - EXTENSION {name}"}
    listed = path.with_name("restore.list")
    listed.write_text("".join(f"{';' if kind in left_out else ''}{entry};\n"
                              for entry, kind in _toc(path)))
    return listed


# -- restore -----------------------------------------------------------------------------
def restore(path: Path, target_dsn: str, entries: Path | None = None) -> tuple[str, ...]:
    """Restore the dump at `path` into `target_dsn` (the copy's role, logged in itself: see the
    module's notes), the entries listed in `entries` (None: all): what can be restored is, the
    statements the server refuses are skipped and returned (each with its error).
    SandboxError "pg_restore failed: …" when pg_restore cannot work at all or table data
    would be lost."""
    listed = () if entries is None else (f"--use-list={entries}",)
    result = _run("pg_restore", *restore_command(path, target_dsn, "--verbose", *listed))
    failed = _failed_entries(result.stderr)
    if result.returncode != 0 and not failed:
        raise SandboxError(f"pg_restore failed: {_tail(_errors_only(result.stderr))}")
    if not failed:
        return ()
    skipped: list[str] = []
    lost: list[str] = []
    for entry, kind in _toc(path):
        if entry not in failed:
            continue
        if kind.startswith(_DATA_KINDS):
            again = _run("pg_restore", *restore_command(
                path, target_dsn, f"--use-list={_list_file(path, entry)}"))
            if again.returncode != 0:
                lost.append(f"{kind}: {_first_error(again.stderr) or failed[entry]}")
        else:
            skipped += _restore_by_statement(path, entry, kind, target_dsn)
    if lost:
        raise SandboxError("pg_restore failed: the data of these could not be restored (nothing "
                           "was imported): " + "; ".join(lost)[:1500])
    return tuple(skipped)


def _errors_only(stderr: str) -> str:
    """pg_restore's stderr without its --verbose progress lines."""
    return "\n".join(line for line in stderr.splitlines()
                     if not re.match(r"pg_restore: (creating|processing|connecting|executing|"
                                     r"restoring|launching|finished|implied)", line))


def _failed_entries(stderr: str) -> dict[str, str]:
    """TOC entry id → the error pg_restore reported for it (from its --verbose stderr)."""
    failed: dict[str, str] = {}
    current: str | None = None
    for line in stderr.splitlines():
        found = _TOC_ENTRY.match(line)
        if found:
            current = found.group(1)
        elif current and line.startswith("pg_restore: error: "):
            failed.setdefault(current, line.removeprefix("pg_restore: error: ")
                              .removeprefix("could not execute query: "))
    return failed


def _first_error(stderr: str) -> str | None:
    for line in stderr.splitlines():
        if line.startswith("pg_restore: error: "):
            return scrub(line.removeprefix("pg_restore: error: ").removeprefix("could not execute query: "))
    return None


def _toc(path: Path) -> list[tuple[str, str]]:
    """(entry id, "KIND schema name") of the dump's table of contents, in restore order."""
    result = _run("pg_restore", [pg_binary("pg_restore"), "--list", str(path)])
    if result.returncode != 0:
        raise SandboxError(f"pg_restore failed: {_tail(result.stderr)}")
    entries = []
    for line in result.stdout.splitlines():
        found = _TOC_LINE.match(line)
        if found:
            described = found.group(2).rsplit(" ", 1)[0]  # without the owner
            entries.append((found.group(1), described))
    return entries


def _list_file(path: Path, *entries: str) -> Path:
    listed = path.with_name(f"entry-{entries[0]}.list")
    listed.write_text("".join(f"{entry};\n" for entry in entries))
    return listed


def _restore_by_statement(path: Path, entry: str, kind: str, target_dsn: str) -> list[str]:
    """Run the SQL of one TOC entry statement by statement; the refused ones are skipped."""
    script = _run("pg_restore", [pg_binary("pg_restore"), "--no-owner", "--no-privileges",
                                 f"--use-list={_list_file(path, entry)}", "--file=-", str(path)])
    if script.returncode != 0:
        return [f"{kind}: {_first_error(script.stderr) or _tail(script.stderr)}"]
    sql = _META.sub("", script.stdout)
    try:
        statements = list(pglast.split(sql))
    except pglast.parser.ParseError:  # newer syntax than pglast knows: the entry as one piece
        statements = [sql]
    skipped = []
    with connect_sync(target_dsn, statement_timeout_ms=IMPORT_TIMEOUT_S * 1000) as conn:
        for statement in statements:
            try:
                conn.execute(statement.encode())  # the dump's own SQL, as pg_restore would send it
            except psycopg.Error as exc:  # the server refused it: skip it, go on
                error = (scrub(str(exc)).strip().splitlines() or [type(exc).__name__])[0]
                shown = " ".join(statement.split())
                skipped.append(f"{kind}: {shown[:200]} ({error})")
    return skipped


async def import_database(server: SandboxServer, source_dsn: str, name: str | None = None,
                          schema_only: bool = False,
                          progress: Callable[[str], None] | None = None,
                          refresh: bool = False) -> ImportReport:
    """Import `source_dsn` into the sandbox as database `name` and make it forkable.

    `refresh`: `name` is an import of the same database already (a stale copy, see
    afs.conditions); the new copy is made beside it and replaces it once complete (its
    template and owner role too; forks of the old copy stay as they are)."""
    name = name or default_import_name(source_dsn)
    if not _DB_NAME.match(name) or name in RESERVED or name.endswith(("_template", "_importing")):
        raise InputError(f"invalid database name {name!r} for the import")
    origin = origin_of(source_dsn)
    admin = server.dsn()
    scratch = name + "_importing"
    role, password = import_owner(name + REFRESHING if refresh else name), secrets.token_urlsafe(24)
    landing = Scratch(name=scratch, role=role, admin=admin, superuser=server.dsn(scratch),
                      as_role=dsn_for(server.settings, scratch, user=role, password=password))
    started = time.monotonic()
    origin_server = await _source_server(source_dsn)
    async with open_connection(admin) as conn:
        if refresh:
            await _check_refresh(admin, name, origin)
        elif await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = %s", (name,)):
            raise InputError(f"the sandbox has a database named {name!r} already; pick --as NAME"
                             " (or --refresh NAME to replace an import of the same database)")
        await _drop_scratch(conn, scratch, role)
    try:
        await prepare(landing, password)
        server.settings.home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="import-", dir=server.settings.home) as work:
            path = Path(work) / "source.dump"
            skipped = await _dump_and_restore(source_dsn, path, schema_only, landing, progress)
        # the user's plan settings on the copy, and VACUUM: its visibility map (afs.conditions)
        copy_state = await settle_copy(source_dsn, server.dsn(scratch), scratch,
                                       server.settings.application_role)
        await analyze(landing.as_role)
        await seal(landing)
        if refresh:  # the new copy is complete: the old one, its template and role make way
            await LocalForkProvider(admin).drop_source(name)
        async with open_connection(admin) as conn:
            await conn.execute(f"ALTER DATABASE {quote_ident(scratch)} RENAME TO {quote_ident(name)}")
            if refresh:
                await _rename_owner(conn, role, import_owner(name))
    except BaseException:
        with trio.CancelScope(shield=True):
            async with open_connection(admin) as conn:
                await _drop_scratch(conn, scratch, role)
        raise
    await LocalForkProvider(admin).register_source(name, origin=origin, origin_server=origin_server,
                                                   copy_state=copy_state)
    seconds = time.monotonic() - started
    for statement in skipped:
        log.warning("import_statement_skipped", database=name, statement=statement)
    log.info("database_imported", database=name, origin=origin, seconds=round(seconds, 1),
             skipped=len(skipped))
    return ImportReport(database=name, origin=origin, seconds=seconds, schema_only=schema_only,
                        skipped=skipped)


async def prepare(scratch: Scratch, password: str) -> None:
    """The copy's role (LOGIN with `password` until `seal`) and the scratch database, the
    superuser's, in which the role may create schemas and temporary tables, and owns `public`."""
    role, database = quote_ident(scratch.role), quote_ident(scratch.name)
    async with open_connection(scratch.admin) as conn:
        await conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"
                           f" NOREPLICATION NOBYPASSRLS PASSWORD {quote_literal(password)}")
        await conn.execute(f"CREATE DATABASE {database}")
        await conn.execute(f"REVOKE ALL ON DATABASE {database} FROM PUBLIC")
        await conn.execute(f"GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {database} TO {role}")
    async with open_connection(scratch.superuser) as conn:
        await conn.execute(f"ALTER SCHEMA public OWNER TO {role}")


async def analyze(dsn: str) -> None:
    """Fresh statistics for the planner, as the copy's role (`dsn`): it owns every table, and
    what ANALYZE evaluates (index expressions) runs with its rights. (PostgreSQL runs those as
    the table's owner, security-restricted, whoever asks.) The catalogs are the superuser's:
    the role skips them (without a warning each), `seal` analyses them."""
    async with open_connection(dsn, 3_600_000) as conn:
        await conn.execute("SET client_min_messages = error")
        await conn.execute("ANALYZE")


async def seal(scratch: Scratch) -> None:
    """After the role's last step: it can no longer log in (its objects are handed to each
    fork's role in the fork); activity counters from zero (the restore is not the workload:
    writes per read count from here); the catalogs analysed (no code of the copy runs there);
    SECURITY DEFINER routines of a superuser, if any, lose EXECUTE for PUBLIC."""
    async with open_connection(scratch.admin) as conn:
        await conn.execute(f"ALTER ROLE {quote_ident(scratch.role)} NOLOGIN PASSWORD NULL")
    async with open_connection(scratch.superuser) as conn:
        await conn.execute(PIN_SEARCH_PATH)
        catalogs = await conn.fetchval("SELECT string_agg(oid::regclass::text, ', ') FROM pg_class"
                                       " WHERE relnamespace = 'pg_catalog'::regnamespace"
                                       " AND relkind = 'r'")
        await conn.execute(f"ANALYZE {catalogs}")
        await conn.execute("SELECT pg_catalog.pg_stat_reset()")
        await restrict_definer_routines(conn)


REFRESHING = "_refresh"  # the owner role of a copy being made to replace `name`: import_owner(name + this)


async def _check_refresh(admin: str, name: str, origin: str) -> None:
    """InputError unless `name` is a source imported from `origin` (what --refresh replaces)."""
    try:
        known = await LocalForkProvider(admin).get_service(name)
    except UnknownServiceError:
        known = {}
    if known.get("kind") != "source":
        raise InputError(f"{name!r} is not an import in the sandbox: import it without --refresh")
    if known.get("origin") != origin:
        raise InputError(f"{name!r} was imported from {known.get('origin')}, not from {origin}:"
                         " --refresh replaces a copy of the same database only")


async def _rename_owner(conn: Connection, role: str, wanted: str) -> None:
    """The refreshed copy's role under the copy's usual name, unless the old copy's role is
    still there (kept while a fork holds on to it: the copy keeps the name it has)."""
    if await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = %s", (wanted,)):
        return
    await conn.execute(f"ALTER ROLE {quote_ident(role)} RENAME TO {quote_ident(wanted)}")


async def _drop_scratch(conn: Connection, scratch: str, role: str) -> None:
    """The scratch database and the copy's role, if they exist (a role of that name is what a
    dropped or failed import of the same name left)."""
    await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(scratch)} WITH (FORCE)")
    await conn.execute(f"DROP ROLE IF EXISTS {quote_ident(role)}")


# -- progress ----------------------------------------------------------------------------
async def _dump_and_restore(source_dsn: str, path: Path, schema_only: bool, scratch: Scratch,
                            progress: Callable[[str], None] | None) -> tuple[str, ...]:
    """The dump, extend and restore steps, telling `progress` how far they got; the skipped
    statements."""
    async def steps() -> tuple[str, ...]:
        await trio.to_thread.run_sync(dump, source_dsn, path, schema_only)
        entries = await trio.to_thread.run_sync(extend, path, scratch.superuser, scratch.role)
        return await trio.to_thread.run_sync(restore, path, scratch.as_role, entries)

    if progress is None:
        return await steps()
    total = None if schema_only else await _source_size(source_dsn)
    skipped: tuple[str, ...] = ()
    failed: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_report_progress, scratch.admin, scratch.name, path, total, progress)
        try:
            skipped = await steps()
        except AfsError as exc:  # raised below, not wrapped in the nursery's exception group
            failed.append(exc)
        nursery.cancel_scope.cancel()
    if failed:
        raise failed[0]
    progress("importing: copied; analysing the tables")
    return skipped


async def _source_server(source_dsn: str) -> dict[str, str] | None:
    """The source server's version and planner settings (None when it cannot say: the dump
    then reports why)."""
    try:
        async with open_connection(source_dsn, 30_000) as conn:
            return await server_facts(conn)
    except AfsError:
        return None


async def _source_size(source_dsn: str) -> int | None:
    """The source database's size in bytes (None when it cannot say)."""
    try:
        async with open_connection(source_dsn, 30_000) as conn:
            size = await conn.fetchval("SELECT pg_database_size(current_database())")
    except AfsError:
        return None
    return None if size is None else int(size)


async def _report_progress(admin: str, scratch: str, path: Path, total: int | None,
                           progress: Callable[[str], None]) -> None:
    """Say how many MB have been dumped and restored, every PROGRESS_EVERY_S seconds, until
    cancelled."""
    of = "" if not total else f" of about {total / MB:.0f} MB"
    try:
        async with open_connection(admin) as conn:
            while True:
                dumped = await trio.to_thread.run_sync(_size_of, path)
                done = await conn.fetchval("SELECT pg_database_size(%s)", (scratch,))
                progress(f"importing: {dumped / MB:.0f} MB dumped, "
                         f"{int(done or 0) / MB:.0f} MB{of} restored")
                await trio.sleep(PROGRESS_EVERY_S)
    except AfsError as exc:  # progress is a courtesy: the import goes on without it
        log.warning("import_progress_unavailable", error=str(exc))


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def imported_copy(client: Any, dsn: str) -> str | None:
    """The sandbox database imported from `dsn` (matched by host, port and name), if any."""
    origin = origin_of(dsn)
    for source in (await client.list_services())["sources"]:
        if source["origin"] == origin:
            return str(source["name"])
    return None


async def sandbox_source(client: Any, demo_database: str, dsn: str | None) -> str:
    """The sandbox database a task reads: the demo database, or the imported copy of `dsn`."""
    if dsn is None:
        return demo_database
    source = await imported_copy(client, dsn)
    if source is None:
        raise InputError(f"{origin_of(dsn)} is not in the sandbox yet: copy it first with"
                         f" `afs sandbox import --from DSN` (forks are made from that copy)")
    return source
