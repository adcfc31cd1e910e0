"""The analysis step: what an agent learns about the query in its fork.

EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of the query; for every table it
references: row count, size, columns, indexes, primary key, the DDL a person
would read, and pg_stats of the referenced columns and of the main table's
timestamp columns (the suite's date filter needs them), with their average
width, the tables whose foreign keys reference it, its own foreign keys and CHECK
constraints, and its partitioning; the server's version and planner settings. pg_stats travels with
the fork (it is a per-database catalog); activity counters do not, so
`writes_per_read` comes from the source and is passed in.

Views are seen through before the analysis: `view_definitions` reads them on the source and
`afs.query.features.see_through` puts their tables in the query's features, so the analysis, the
proposals and the storage measurement are about the tables PostgreSQL scans.

What runs on the source (a user's database) is catalog reads only: the query itself is
planned there through `afs.target.on_target` alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from afs.db import Connection
from afs.errors import InputError, StatementTimeout
from afs.models import (
    AnalysisContext,
    ColumnInfo,
    ColumnStats,
    IndexInfo,
    QueryFeatures,
    QueryVariant,
    TableInfo,
    TaskType,
)
from afs.pg.names import ident
from afs.pg.plan import explained, plan_of
from afs.query.features import extract_features

MB = 1048576.0

_TABLE_SQL = """
SELECT c.oid, greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
FROM pg_class c WHERE c.oid = to_regclass(%s) AND c.relkind IN ('r', 'p', 'm')
"""
# the collation by its locale: the builtin provider orders by code point, as "C" does
_COLUMNS_SQL = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
       CASE WHEN co.oid IS NULL THEN NULL
            WHEN co.collname = 'default' THEN
                (SELECT CASE d.datlocprovider WHEN 'b' THEN 'C' WHEN 'c' THEN d.datcollate
                        ELSE d.datlocale END
                 FROM pg_database d WHERE d.datname = current_database())
            WHEN co.collprovider = 'b' THEN 'C'
            WHEN co.collprovider = 'c' THEN co.collcollate
            ELSE co.colllocale END
FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_INDEXES_SQL = """
SELECT i.relname, pg_get_indexdef(x.indexrelid), x.indisunique, x.indisprimary,
       pg_relation_size(x.indexrelid),
       ARRAY(SELECT pg_get_indexdef(x.indexrelid, k, true)
             FROM generate_series(1, x.indnkeyatts) AS k)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = %s ORDER BY i.relname
"""
_STATS_SQL = """
SELECT s.attname, s.null_frac, s.n_distinct, s.correlation,
       s.most_common_vals::text::text[], s.most_common_freqs,
       s.histogram_bounds::text::text[], s.avg_width
FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname
WHERE c.oid = %s AND s.attname = ANY(%s)
"""
# Tables whose foreign keys point at this one (top-level constraints: a foreign key of a
# partitioned table is repeated on each partition with conparentid set).
_REFERENCED_BY_SQL = """
SELECT DISTINCT c.conrelid::regclass::text FROM pg_constraint c
WHERE c.contype = 'f' AND c.confrelid = %s AND c.conparentid = 0
ORDER BY 1
"""
# Its own foreign keys and CHECK constraints (top-level ones, as above).
_CONSTRAINTS_SQL = """
SELECT c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c
WHERE c.conrelid = %s AND c.contype IN ('f', 'c') AND c.conparentid = 0
ORDER BY c.contype DESC, c.conname
"""
# A partitioned table: its key and partition count; a partition: its parent.
_PARTITIONING_SQL = """
SELECT CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) || ', '
            || (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) || ' partitions'
            WHEN c.relispartition THEN 'partition of '
            || (SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid)
            ELSE '' END
FROM pg_class c WHERE c.oid = %s
"""
# The planner settings that shape plans, and the server's version, as SHOW prints them.
PLANNER_SETTINGS = ("work_mem", "random_page_cost", "effective_cache_size", "seq_page_cost",
                    "effective_io_concurrency", "max_parallel_workers_per_gather", "jit")
_SERVER_SQL = """
SELECT name, current_setting(name, true) FROM unnest(%s::text[]) AS name
"""
# Writes per read: rows written per scan since the statistics were last reset (seeding and
# importing reset them); 0 until MIN_SCANS scans make the ratio mean something.
MIN_SCANS = 100
_SOURCE_STATS_SQL = f"""
SELECT greatest(c.reltuples, 0)::bigint,
       CASE WHEN s.seq_scan + coalesce(s.idx_scan, 0) >= {MIN_SCANS}
            THEN (s.n_tup_ins + s.n_tup_upd + s.n_tup_del)::float8
                 / (s.seq_scan + coalesce(s.idx_scan, 0))
            ELSE 0 END
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = to_regclass(%s)
"""


_VIEW_SQL = """
SELECT pg_get_viewdef(c.oid, true) FROM pg_class c WHERE c.oid = to_regclass(%s) AND c.relkind = 'v'
"""
MAX_VIEWS = 100  # views followed for one query (views of views included)


async def view_definitions(conn: Connection, tables: tuple[str, ...]) -> dict[str, str]:
    """The SELECT of each view among `tables`, and of the views those read, to any depth
    (afs.query.features.see_through reads them)."""
    found: dict[str, str] = {}
    pending, looked = list(tables), set[str]()
    while pending and len(looked) < MAX_VIEWS:
        name = pending.pop(0)
        if name in looked:
            continue
        looked.add(name)
        definition = await conn.fetchval(_VIEW_SQL, (name,))
        if definition is None:
            continue
        found[name] = str(definition)
        with contextlib.suppress(InputError):  # a view AFS cannot read stays opaque
            pending.extend(extract_features(found[name]).tables)
    return found


async def explain_analyze(conn: Connection, sql: str) -> tuple[dict[str, Any], float]:
    """The plan (top node) and the execution time in ms, measured on the server."""
    raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
    return explained(raw)


@dataclass(frozen=True)
class SourceStats:
    """What the source says of one table that its forks cannot: activity counters do not
    travel with a fork (routing reads `rows`, the analysis `writes_per_read`)."""

    rows: int  # the planner's row estimate on the source
    writes_per_read: float  # rows written per row read, from the source's activity counters


NO_SOURCE_STATS = SourceStats(rows=0, writes_per_read=0.0)  # a table the source says nothing of


async def source_table_stats(conn: Connection, tables: tuple[str, ...]) -> dict[str, SourceStats]:
    """Row estimates and writes per read of `tables` on the source (read-only)."""
    stats: dict[str, SourceStats] = {}
    for name in tables:
        row = await conn.fetchone(_SOURCE_STATS_SQL, (name,))
        if row is not None and row[0] is not None:
            stats[name] = SourceStats(rows=int(row[0]), writes_per_read=float(row[1] or 0.0))
    return stats


async def table_info(conn: Connection, name: str, columns_of_interest: set[str],
                     writes_per_read: float = 0.0) -> TableInfo | None:
    row = await conn.fetchone(_TABLE_SQL, (name,))
    if row is None:
        return None
    oid, rows, size = row
    columns = tuple(ColumnInfo(n, t, bool(nullable), collation)
                    for n, t, nullable, collation in await conn.fetchall(_COLUMNS_SQL, (oid,)))
    indexes = tuple(
        IndexInfo(name=iname, definition=idef, columns=tuple(keys), unique=bool(uniq),
                  primary=bool(prim), size_mb=round(isize / MB, 2))
        for iname, idef, uniq, prim, isize, keys in await conn.fetchall(_INDEXES_SQL, (oid,))
    )
    primary = next((ix.columns for ix in indexes if ix.primary), ())
    wanted = set(columns_of_interest) | {c.name for c in columns if _is_temporal(c.data_type)}
    stats = {
        att: ColumnStats(
            null_frac=float(null_frac or 0.0),
            n_distinct=float(n_distinct or 0.0),
            correlation=None if corr is None else float(corr),
            most_common_vals=tuple(mcv or ()),
            most_common_freqs=tuple(float(f) for f in (mcf or ())),
            histogram_bounds=tuple(hist or ()),
            avg_width=None if width is None else int(width),
        )
        for att, null_frac, n_distinct, corr, mcv, mcf, hist, width
        in await conn.fetchall(_STATS_SQL, (oid, sorted(wanted)))
    }
    referenced_by = tuple(str(t) for (t,) in await conn.fetchall(_REFERENCED_BY_SQL, (oid,)))
    constraints = tuple(f"{name}: {definition}"
                        for name, definition in await conn.fetchall(_CONSTRAINTS_SQL, (oid,)))
    partitioning = str(await conn.fetchval(_PARTITIONING_SQL, (oid,)) or "")
    return TableInfo(
        name=name, rows=int(rows), size_mb=round(size / MB, 2), columns=columns, indexes=indexes,
        primary_key=primary, column_stats=stats, writes_per_read=writes_per_read,
        ddl=_ddl(name, columns, primary, indexes), referenced_by=referenced_by,
        constraints=constraints, partitioning=partitioning,
    )


async def server_facts(conn: Connection) -> dict[str, str]:
    """server_version and the planner settings (PLANNER_SETTINGS) of the server `conn` is on,
    as SHOW prints them; a setting an older server does not have is left out."""
    return {str(name): str(value) for name, value in
            await conn.fetchall(_SERVER_SQL, (["server_version", *PLANNER_SETTINGS],))
            if value is not None}


async def gather_context(
    conn: Connection,
    *,
    task_id: str,
    task_type: TaskType,
    query: str,
    features: QueryFeatures,
    source_stats: Mapping[str, SourceStats],
    suite: tuple[QueryVariant, ...] = (),
) -> AnalysisContext:
    """Run the analysis queries in the fork and build the agent's context.

    A query that runs past the statement timeout gets a plain EXPLAIN (estimates only)
    and the timeout as its execution time, a lower bound (`AnalysisContext.slow`).
    """
    slow = False
    try:
        plan, execution_ms = await explain_analyze(conn, query)
    except StatementTimeout:
        plan, slow = plan_of(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}")), True
        execution_ms = float(await conn.fetchval(
            "SELECT setting::float8 FROM pg_settings WHERE name = 'statement_timeout'") or 0)
    tables: dict[str, TableInfo] = {}
    for name in features.tables:
        cols = {u.column for u in features.columns if u.table == name}
        info = await table_info(conn, name, cols,
                                source_stats.get(name, NO_SOURCE_STATS).writes_per_read)
        if info is not None:
            tables[name] = info
    server = await server_facts(conn)
    return AnalysisContext(task_id=task_id, task_type=task_type, query=query, features=features,
                           plan=plan, execution_ms=execution_ms, tables=tables, suite=suite,
                           slow=slow, server=server)


def _is_temporal(data_type: str) -> bool:
    return data_type.startswith(("timestamp", "date"))


def _ddl(name: str, columns: tuple[ColumnInfo, ...], primary: tuple[str, ...],
         indexes: tuple[IndexInfo, ...]) -> str:
    lines = [f"  {ident(c.name)} {c.data_type}{'' if c.nullable else ' NOT NULL'}" for c in columns]
    if primary:
        lines.append(f"  PRIMARY KEY ({', '.join(ident(c) for c in primary)})")
    text = f"CREATE TABLE {name} (\n" + ",\n".join(lines) + "\n);"
    extra = [ix.definition + ";" for ix in indexes if not ix.primary]
    return "\n".join([text, *extra])
