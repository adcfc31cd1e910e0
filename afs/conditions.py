"""The user's conditions: forks that plan like the user's server, and the report says where
they cannot.

A fork's numbers are only as true as its likeness to the user's server. Four steps:

    settle_copy      at import: the source's plan settings given to the copy (so its ANALYZE
                     samples with the source's default_statistics_target, and every fork of it
                     starts with them: afs.forks.provider copies a parent's settings to a fork),
                     the WAL flushed and a VACUUM (a restored copy has no visibility map: every
                     index-only scan would visit the heap), and the state of each table, the
                     copy's and the source's (size, all-visible fraction), for the catalog
    read_conditions  at each optimize (settings change): the source's plan settings for the
                     application's role, the server facts no fork can take, the query's plan
                     shape (EXPLAIN without ANALYZE, through afs.target.on_target: checked,
                     read-only), and the query's tables against
                     what the copy recorded at import (size drift, all-visible fraction)
    carry_into_fork  in each agent's fork, before it is used: `ALTER DATABASE <fork> SET` of
                     every plan setting the sandbox knows as a session setting (names checked
                     against its pg_settings, values written by the literal writer); the rest
                     are gaps, with both values
    check_plan       before any candidate is measured: the query's plan in the fork against the
                     source's, in short form (afs.pg.plan.plan_shape)

Per database, not per session: the settings become the fork database's own defaults, so every
session of it starts with them: the agent's, the benchmark's, a person's psql, a proposal's
`SET LOCAL` falling back to them after its transaction. A per-session `SET` would have to be
repeated by every connection AFS or a person opens, and one forgotten connection measures in
the sandbox's conditions again. A fork's role owns its database, so it may set them itself, with
the values read at this optimize, on any fork server that hands out database owners.

Settings read on the source are those of a session as the DSN's role in the DSN's database,
which PostgreSQL has given the database- and role-level overrides (pg_db_role_setting) already.
With another application role (config `application_role`), that role's overrides are laid over
them in PostgreSQL's order (database, role, role in database); a setting only the DSN's own role
overrides keeps that role's value (the server's file value is not readable without privileges).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from afs.config import ALL_VISIBLE_GAP, SIZE_DRIFT
from afs.db import Connection, open_connection
from afs.errors import AfsError, DatabaseError
from afs.models import PlanCheck, SettingGap, TableState, UserConditions
from afs.pg.plan import plan_of, plan_shape, shape_differences
from afs.pg.settings import (
    NOT_CARRIED,
    NOT_DESCRIBED,
    PLAN_SETTINGS,
    SETTINGS_LIKE,
    alter_database_sql,
    carry,
    overlay,
    refused,
    server_gaps,
)
from afs.target import on_target, plan_json

MB = 1048576.0
WAL_FLUSH_WAIT_S = 5.0  # at most, before VACUUM (see _wait_for_wal_flush)
WAL_POLL_S = 0.05
VACUUM_TIMEOUT_MS = 3_600_000

_SETTINGS_SQL = """
SELECT name, current_setting(name) FROM pg_settings
WHERE name = ANY(%s) OR name LIKE ANY(%s) ORDER BY name
"""
_SERVER_SQL = "SELECT name, current_setting(name, true) FROM unnest(%s::text[]) AS name"
# the overrides of a role, in the order PostgreSQL applies them (later wins)
_ROLE_LAYERS_SQL = """
SELECT s.setconfig FROM pg_db_role_setting s
LEFT JOIN pg_database d ON d.oid = s.setdatabase LEFT JOIN pg_roles r ON r.oid = s.setrole
WHERE (s.setrole = 0 AND d.datname = current_database())
   OR (s.setdatabase = 0 AND r.rolname = %s)
   OR (d.datname = current_database() AND r.rolname = %s)
ORDER BY (s.setrole <> 0)::int + 2 * (s.setdatabase <> 0 AND s.setrole <> 0)::int
"""
# size of the heap, its pages now and the all-visible pages of the last VACUUM or ANALYZE, of
# ordinary tables, materialized views, and partitions (not of a partitioned table: it has no
# storage); the planner too divides relallvisible by the pages the table has now
_TABLES_SQL = """
SELECT format('%%I.%%I', n.nspname, c.relname), pg_relation_size(c.oid),
       pg_relation_size(c.oid) / current_setting('block_size')::int, c.relallvisible
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_%%' AND (%s::oid[] IS NULL OR c.oid = ANY(%s::oid[]))
ORDER BY 1
"""


# -- reading a server ---------------------------------------------------------------------
async def pin_search_path(conn: Connection) -> None:
    """Only the catalog's functions and operators for AFS's own reads in a user's database (or
    a copy of it): a planted public.pg_relation_size(oid) matches `pg_relation_size(c.oid)`
    better than the catalog's (regclass), and would run with the rights of AFS's role."""
    await conn.execute("SET search_path = pg_catalog, pg_temp")


async def read_source_settings(conn: Connection, application_role: str | None = None
                               ) -> dict[str, str]:
    """The plan settings of the application's sessions on `conn`'s server (SHOW's format)."""
    values = {str(n): str(v) for n, v in
              await conn.fetchall(_SETTINGS_SQL, (list(PLAN_SETTINGS), list(SETTINGS_LIKE)))}
    if application_role and application_role != await conn.fetchval("SELECT current_user"):
        layers = [list(row[0] or ()) for row in
                  await conn.fetchall(_ROLE_LAYERS_SQL, (application_role, application_role))]
        values = overlay(values, layers)
    return values


async def read_server(conn: Connection) -> dict[str, str]:
    """The server facts no fork can take (afs.pg.settings.NOT_CARRIED), as SHOW prints them."""
    return {str(n): str(v) for n, v in await conn.fetchall(_SERVER_SQL, (list(NOT_CARRIED),))
            if v is not None}


async def table_oids(conn: Connection, tables: Sequence[str]) -> list[int]:
    """The tables as the query names them, resolved with the session's search_path (the
    user's: call before `pin_search_path`) by the regclass cast, which no function can stand
    in for; a name that does not resolve is left out."""
    oids = []
    for name in tables:
        try:
            oids.append(int(await conn.fetchval("SELECT %s::text::regclass::oid", (name,))))
        except DatabaseError:
            continue
    return oids


async def table_states(conn: Connection, oids: Sequence[int] | None = None
                       ) -> dict[str, dict[str, int]]:
    """Heap bytes, pages and all-visible pages by "schema.table": of the tables `oids`, or of
    every user table."""
    wanted = None if oids is None else list(oids)
    rows = await conn.fetchall(_TABLES_SQL, (wanted, wanted))
    return {str(name): {"bytes": int(size), "pages": int(pages), "all_visible": int(visible)}
            for name, size, pages, visible in rows}


# -- carrying them over ----------------------------------------------------------------------
async def carry_settings(conn: Connection, database: str, values: Mapping[str, str]
                         ) -> tuple[dict[str, str], tuple[SettingGap, ...]]:
    """`ALTER DATABASE database SET` each plan setting of `values` that `conn`'s server knows
    as a session setting (the names are checked against its pg_settings first); returns what
    was carried and the gaps (unknown, not a session setting, or a value the server refused,
    with the server's own value)."""
    if not values:
        return {}, ()
    rows = await conn.fetchall("SELECT name, context, current_setting(name) FROM pg_settings"
                               " WHERE name = ANY(%s)", (sorted(values),))
    contexts = {str(name): str(context) for name, context, _ in rows}
    here = {str(name): str(value) for name, _, value in rows}
    wanted, gaps = carry(values, contexts)
    gaps = tuple(dataclasses.replace(g, sandbox=here.get(g.name)) for g in gaps)
    statements = [alter_database_sql(database, name, value) for name, value in wanted.items()]
    if not statements:
        return {}, gaps
    try:  # one round trip when the server takes them all (an implicit transaction)
        await conn.execute(";".join(statements))
        return wanted, gaps
    except DatabaseError:
        pass
    carried: dict[str, str] = {}
    refusals: list[SettingGap] = []
    for (name, value), statement in zip(wanted.items(), statements, strict=True):
        try:
            await conn.execute(statement)
        except DatabaseError as exc:
            refusals.append(refused(name, value, here.get(name), str(exc).splitlines()[0]))
            continue
        carried[name] = value
    return carried, gaps + tuple(refusals)


async def carry_into_fork(fork_dsn: str, fork: str, conditions: UserConditions | None,
                          statement_timeout_ms: int) -> tuple[dict[str, str], tuple[SettingGap, ...]]:
    """The source's plan settings as the fork database's defaults (as its owner, the fork's
    role), before the agent opens its connections; and the server facts the fork differs in."""
    if conditions is None or not conditions.carried:
        return {}, ()
    async with open_connection(fork_dsn, statement_timeout_ms) as conn:
        await pin_search_path(conn)
        carried, gaps = await carry_settings(conn, fork, conditions.carried)
        here = await read_server(conn)
    return carried, gaps + server_gaps(conditions.server, here)


async def check_plan(conn: Connection, query: str, conditions: UserConditions | None,
                     carried: Mapping[str, str], gaps: Sequence[SettingGap]) -> PlanCheck | None:
    """The query's plan in the fork (EXPLAIN without ANALYZE: nothing runs) against the source's
    (None without a source plan to compare with)."""
    if conditions is None or not conditions.source_plan:
        return None
    fork_shape = plan_shape(plan_of(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}")))
    differences = shape_differences(conditions.source_plan, fork_shape)
    return PlanCheck(matches=not differences, source_shape=conditions.source_plan,
                     fork_shape=fork_shape, differences=differences, carried=dict(carried),
                     gaps=tuple(gaps))


# -- at import ------------------------------------------------------------------------------
async def settle_copy(source_dsn: str, copy_dsn: str, database: str,
                      application_role: str | None = None) -> dict[str, Any]:
    """The import's step after the restore (before ANALYZE): the source's plan settings on the
    copy, VACUUM, and the record of both sides for the catalog (`copy_state`)."""
    async with open_connection(source_dsn, 30_000) as src:
        await pin_search_path(src)
        values = await read_source_settings(src, application_role)
        source_tables = await table_states(src)
    async with open_connection(copy_dsn, VACUUM_TIMEOUT_MS) as conn:
        await pin_search_path(conn)
        carried, gaps = await carry_settings(conn, database, values)
        await conn.execute("SET synchronous_commit = on")  # this session's commits: flushed
        await _wait_for_wal_flush(conn)
        await conn.execute("VACUUM")
        copy_tables = await table_states(conn)
    return {
        "imported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": carried,
        "gaps": [dataclasses.asdict(g) for g in gaps],
        "tables": {name: {**state, **{f"source_{k}": v for k, v in source_tables.get(name, {}).items()}}
                   for name, state in copy_tables.items()},
    }


async def _wait_for_wal_flush(conn: Connection) -> None:
    """Until the WAL written so far is on disk (at most WAL_FLUSH_WAIT_S).

    With `synchronous_commit = off` (the sandbox's), VACUUM cannot mark a page all-visible
    while the commit of the rows on it is not flushed yet (PostgreSQL sets no hint bit before
    that): right after a restore it would leave the visibility map empty. A transaction of
    this session that takes an xid and commits with `synchronous_commit = on` flushes the WAL
    up to its commit record, so everything before it: the poll then only confirms it (on a
    busy disk the WAL writer alone took longer than the wait, and VACUUM marked nothing)."""
    target = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
    await conn.fetchval("SELECT pg_current_xact_id()")  # autocommit: its commit flushes the WAL
    with trio.move_on_after(WAL_FLUSH_WAIT_S):
        for _ in range(int(WAL_FLUSH_WAIT_S / WAL_POLL_S)):  # polling the server: no event to wait for
            if await conn.fetchval("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (target,)):
                return
            await trio.sleep(WAL_POLL_S)


# -- at optimize ------------------------------------------------------------------------------
async def read_conditions(source_dsn: str, query: str, tables: Sequence[str],
                          recorded: Mapping[str, Any] | None,
                          application_role: str | None = None) -> UserConditions:
    """What the forks must take from the user's server for this query, read now (read-only),
    against what the copy recorded at import (`recorded`: the source's `copy_state`, None when
    the source is not an import). A plan that cannot be read leaves the shape empty (the fork's
    plan is then not compared), and a note says why."""
    notes: list[str] = [NOT_DESCRIBED]
    async with open_connection(source_dsn, 30_000) as conn:
        try:  # the query with the user's search_path, before it is pinned
            shape = plan_shape(await on_target(conn, query, plan_json))
        except AfsError as exc:
            shape = ()
            notes.append(f"the query's plan on the source could not be read: {str(exc).splitlines()[0]}")
        oids = await table_oids(conn, tables)
        await pin_search_path(conn)
        values = await read_source_settings(conn, application_role)
        server = await read_server(conn)
        now = await table_states(conn, oids) if recorded else {}
    copy = dict((recorded or {}).get("tables") or {})
    states = tuple(_table_state(name, now[name], copy.get(name)) for name in sorted(now))
    return UserConditions(
        carried=values, server=server, source_plan=shape,
        imported_at=(recorded or {}).get("imported_at"), tables=states,
        stale=tuple(s for s in (drift(t) for t in states) if s),
        unsettled=tuple(s for s in (visibility_gap(t) for t in states) if s),
        notes=tuple(notes))


def _fraction(pages: int, visible: int) -> float | None:
    return None if pages <= 0 else min(1.0, visible / pages)


def _table_state(name: str, now: Mapping[str, int], copy: Mapping[str, int] | None) -> TableState:
    return TableState(
        name=name, source_bytes=now["bytes"],
        copy_bytes=None if copy is None else int(copy["bytes"]),
        source_all_visible=_fraction(now["pages"], now["all_visible"]),
        copy_all_visible=None if copy is None else _fraction(int(copy["pages"]), int(copy["all_visible"])))


def drift(table: TableState) -> str | None:
    """Why `table`'s copy is stale (its size off the source's by more than SIZE_DRIFT), if it is."""
    if table.source_bytes is None or table.copy_bytes is None:
        return None
    base = max(table.source_bytes, 1)
    change = (table.copy_bytes - table.source_bytes) / base
    if abs(change) <= SIZE_DRIFT:
        return None
    return (f"{table.name}: {table.source_bytes / MB:,.1f} MB on the source, {table.copy_bytes / MB:,.1f} MB"
            f" in the copy ({change:+.0%}, more than {SIZE_DRIFT:.0%})")


def visibility_gap(table: TableState) -> str | None:
    """Why `table`'s copy scans otherwise (its all-visible fraction off by more than
    ALL_VISIBLE_GAP: index-only scans visit the heap more or less often), if it does."""
    mine, theirs = table.source_all_visible, table.copy_all_visible
    if mine is None or theirs is None or abs(mine - theirs) <= ALL_VISIBLE_GAP:
        return None
    return (f"{table.name}: {mine:.0%} of its pages all-visible on the source, {theirs:.0%} in the"
            " copy (index-only scans visit the heap "
            + ("more often in the forks)" if theirs < mine else "less often in the forks)"))


async def task_conditions(service: Mapping[str, Any], source_dsn: str, query: str,
                          tables: Sequence[str], application_role: str | None) -> UserConditions:
    """`read_conditions` for a task on a source read at `source_dsn`, `service` its record in
    the fork server's catalog (a fork client's `get`: the copy's state). What cannot be read is
    a note, not a failed task."""
    try:
        return await read_conditions(source_dsn, query, tables, service.get("copy_state"), application_role)
    except AfsError as exc:
        return UserConditions(notes=(f"the user's conditions could not be read: {exc}",))
