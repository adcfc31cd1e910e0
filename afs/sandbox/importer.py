"""Copy a user's database into the sandbox, so it can be forked locally.

    pg_dump --format=custom <DSN>  |  pg_restore --no-owner --no-privileges

with the embedded PostgreSQL 18 binaries (they dump older servers too). The
copy lands in a scratch database that is renamed only when the restore and
ANALYZE have finished; on failure the scratch is dropped. The source database
is only read.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import structlog
import trio
from psycopg import conninfo

from afs.db import open_connection
from afs.errors import InputError, SandboxError, scrub
from afs.forks.provider import LocalForkProvider
from afs.pg.names import quote_ident
from afs.sandbox.server import SandboxServer, pg_binary

log = structlog.get_logger(__name__)

_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
RESERVED = ("postgres", "template0", "template1")
IMPORT_TIMEOUT_S = 3600


@dataclass(frozen=True)
class ImportReport:
    database: str
    origin: str
    seconds: float
    schema_only: bool


def origin_of(dsn: str) -> str:
    """A password-free description of where a DSN points (used to find the import again)."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except Exception as exc:
        raise InputError(f"not a valid connection string: {scrub(str(exc))}") from None
    host = params.get("host") or os.environ.get("PGHOST") or "localhost"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    dbname = params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user") or "postgres"
    return f"{host}:{port}/{dbname}"


def default_import_name(dsn: str) -> str:
    dbname = origin_of(dsn).rsplit("/", 1)[1]
    return re.sub(r"[^a-z0-9_]", "_", dbname.lower())[:50] or "imported"


def _dump_and_restore(source_dsn: str, target_dsn: str, schema_only: bool) -> None:
    dump_cmd = [pg_binary("pg_dump"), "--format=custom", "--no-owner", "--no-privileges"]
    if schema_only:
        dump_cmd.append("--schema-only")
    dump_cmd.append(f"--dbname={source_dsn}")
    restore_cmd = [pg_binary("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error",
                   f"--dbname={target_dsn}"]
    with subprocess.Popen(dump_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as dump:
        assert dump.stdout is not None
        restore = subprocess.run(restore_cmd, stdin=dump.stdout, capture_output=True, text=True,
                                 timeout=IMPORT_TIMEOUT_S)
        dump.stdout.close()
        dump_err = dump.stderr.read().decode(errors="replace") if dump.stderr else ""
        dump.wait(timeout=60)
    if dump.returncode != 0:
        raise SandboxError(f"pg_dump failed: {scrub(dump_err.strip())[-500:]}")
    if restore.returncode != 0:
        raise SandboxError(f"pg_restore failed: {scrub(restore.stderr.strip())[-500:]}")


async def import_database(server: SandboxServer, source_dsn: str, name: str | None = None,
                          schema_only: bool = False) -> ImportReport:
    """Import `source_dsn` into the sandbox as database `name` and make it forkable."""
    name = name or default_import_name(source_dsn)
    if not _DB_NAME.match(name) or name in RESERVED or name.endswith(("_template", "_importing")):
        raise InputError(f"invalid database name {name!r} for the import")
    origin = origin_of(source_dsn)
    admin = server.dsn()
    scratch = name + "_importing"
    started = time.monotonic()
    async with open_connection(admin) as conn:
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = %s", (name,)):
            raise InputError(f"the sandbox has a database named {name!r} already; pick --as NAME")
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(scratch)} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {quote_ident(scratch)}")
    try:
        await trio.to_thread.run_sync(_dump_and_restore, source_dsn, server.dsn(scratch), schema_only)
        async with open_connection(server.dsn(scratch), 3_600_000) as conn:
            await conn.execute("ANALYZE")
            await conn.execute("SELECT pg_stat_reset()")  # the restore is not the workload
        async with open_connection(admin) as conn:
            await conn.execute(f"ALTER DATABASE {quote_ident(scratch)} RENAME TO {quote_ident(name)}")
    except BaseException:
        with trio.CancelScope(shield=True):
            async with open_connection(admin) as conn:
                await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(scratch)} WITH (FORCE)")
        raise
    await LocalForkProvider(admin).register_source(name, origin=origin)
    seconds = time.monotonic() - started
    log.info("database_imported", database=name, origin=origin, seconds=round(seconds, 1))
    return ImportReport(database=name, origin=origin, seconds=seconds, schema_only=schema_only)


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
