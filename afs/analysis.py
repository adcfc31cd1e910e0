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

The catalog's answer for the index kind (issue 25 item 7, `operator_support`): the operators the
query uses, resolved by PostgreSQL (a temporary view of the query), the operator classes that
serve them (pg_amop, pg_opclass, pg_am; those of installed extensions and of the trusted ones a
proposal may create), and the expressions of its WHERE clause that PostgreSQL accepts as index
keys; all in a fork, in one transaction rolled back. afs.query.opclasses chooses among them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from afs.db import Connection
from afs.errors import DatabaseError, InputError, StatementTimeout
from afs.models import (
    AnalysisContext,
    ColumnInfo,
    ColumnStats,
    IndexInfo,
    OperatorSupport,
    QueryFeatures,
    TableInfo,
    TaskType,
)
from afs.pg.names import ident, qualified
from afs.pg.plan import explained, plan_of
from afs.query.features import extract_features
from afs.query.opclasses import catalog_type, support_key, where_terms
from afs.query.text import select_text
from afs.safety.statements import ALLOWED_EXTENSIONS

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


# -- the operators of the query and the operator classes that serve them ---------------------
# The query as PostgreSQL resolved it: a temporary view of it (in a transaction rolled back)
# is stored as the parsed and analysed query tree, whose OpExpr / ScalarArrayOpExpr nodes name
# each operator by its OID (`:opno`) and whose sort clauses name the sort operators (`:sortop`).
# Built-in operators are pinned, so pg_depend does not list them: the tree is what tells.
PROBE_VIEW = "afs_operator_probe"
_PROBE_TREE_SQL = f"""
SELECT r.ev_action::text FROM pg_rewrite r WHERE r.ev_class = 'pg_temp.{PROBE_VIEW}'::regclass
"""
_OPERATOR_OID = re.compile(r":(?:opno|sortop) (\d+)")
# The extensions that could be created with an index (afs.safety allows them) and are not yet.
_CREATABLE_SQL = """
SELECT a.name FROM pg_available_extensions a
WHERE a.name = ANY(%s) AND a.installed_version IS NULL ORDER BY a.name
"""
# Every operator class that serves one of the operators (pg_amop: the class's family holds the
# operator for the class's input type), with its method, default-ness, extension and family
# size. `LIKE 'prefix%'` is served through the operators the planner derives from the prefix
# (like_support in PostgreSQL: `~>=~` / `~<~` in a pattern family, `>=` / `<` under the C
# collation): they are added for each `~~` the query uses. Each row also names the types
# the same class serves besides the operator's left type: those binary-coercible to it (varchar
# for text), the query's domains over it, and for a polymorphic left type the query's column
# types it stands for (int4range for anyrange, text[] for anyarray).
_SUPPORT_SQL = """
WITH asked AS (SELECT unnest(%s::oid[]) AS oid),
derived AS (
    SELECT o2.oid FROM asked JOIN pg_operator o1 ON o1.oid = asked.oid
    JOIN pg_operator o2 ON o2.oprleft = o1.oprleft AND o2.oprright = o1.oprleft
     AND o2.oprname IN ('~>=~', '~<~', '>=', '<')
    WHERE o1.oprname = '~~'),
ops AS (SELECT oid FROM asked UNION SELECT oid FROM derived)
SELECT o.oprname, format_type(o.oprleft, NULL), format_type(o.oprright, NULL), am.amname,
       oc.opcname, oc.opcdefault, ao.amoppurpose = 'o',
       (SELECT count(*) FROM pg_amop f WHERE f.amopfamily = ao.amopfamily)::int,
       e.extname,
       ARRAY(SELECT format_type(c.castsource, NULL) FROM pg_cast c
             WHERE c.casttarget = o.oprleft AND c.castmethod = 'b'
             UNION
             SELECT format_type(t.oid, NULL) FROM pg_type t
             WHERE t.oid IN (SELECT to_regtype(n) FROM unnest(%s::text[]) AS n)
               AND ((t.typtype = 'd' AND t.typbasetype = o.oprleft)
                 OR (o.oprleft = 'anyrange'::regtype AND t.typtype = 'r')
                 OR (o.oprleft = 'anymultirange'::regtype AND t.typtype = 'm')
                 OR (o.oprleft = 'anyenum'::regtype AND t.typtype = 'e')
                 OR (o.oprleft IN ('anyarray'::regtype, 'anycompatiblearray'::regtype)
                     AND t.typcategory = 'A'))
             ORDER BY 1)
FROM ops JOIN pg_operator o ON o.oid = ops.oid
JOIN pg_amop ao ON ao.amopopr = o.oid
JOIN pg_am am ON am.oid = ao.amopmethod AND am.amtype = 'i'
JOIN pg_opclass oc ON oc.opcfamily = ao.amopfamily AND oc.opcmethod = ao.amopmethod
 AND oc.opcintype = ao.amoplefttype
LEFT JOIN pg_depend d ON d.classid = 'pg_opclass'::regclass AND d.objid = oc.oid AND d.deptype = 'e'
LEFT JOIN pg_extension e ON e.oid = d.refobjid
ORDER BY 1, 2, 3, 4, 5
"""


_EXPRESSION_TYPE_SQL = """
SELECT format_type(a.atttypid, NULL), pg_get_indexdef(a.attrelid, 1, true) FROM pg_attribute a
WHERE a.attrelid = %s::regclass AND a.attnum = 1
"""


async def index_expressions(conn: Connection, query: str,
                            tables: Mapping[str, TableInfo],
                            aliases: Mapping[str, str]) -> dict[tuple[str, str], tuple[str, str]]:
    """The WHERE clause's expressions of one column (afs.query.opclasses.where_terms) that
    PostgreSQL accepts as an index key, with their types: each is indexed on an empty copy of its
    table (a temporary table, inside the caller's transaction), which PostgreSQL refuses for an
    expression that is not immutable (`created::date` of a timestamptz, `to_tsvector(body)`).
    Each with its type and the key as pg_get_indexdef prints it."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    copies: dict[str, str] = {}
    for n, term in enumerate(where_terms(query)):
        if term.expression is None:
            continue
        owners = ([aliases.get(term.qualifier, term.qualifier)] if term.qualifier
                  else [t for t, info in tables.items() if any(c.name == term.column for c in info.columns)])
        for m, table in enumerate(owners):
            if table not in tables or (table, term.expression) in found:
                continue
            copy = copies.get(table) or f"afs_probe_copy_{n}_{m}"
            index = f"afs_probe_index_{n}_{m}"
            await conn.execute("SAVEPOINT afs_expression")
            try:
                if table not in copies:
                    await conn.execute(f"CREATE TEMP TABLE {copy} (LIKE {qualified(table)})")
                await conn.execute(f"CREATE INDEX {index} ON pg_temp.{copy} (({term.expression}))")
                row = await conn.fetchone(_EXPRESSION_TYPE_SQL, (f"pg_temp.{index}",))
            except DatabaseError:
                await conn.execute("ROLLBACK TO SAVEPOINT afs_expression")
                continue
            await conn.execute("RELEASE SAVEPOINT afs_expression")
            copies[table] = copy
            if row is not None:
                found[(table, term.expression)] = (str(row[0]), str(row[1]))
    return found


@dataclass(frozen=True)
class CatalogAnswer:
    """What the fork's catalog says of the query's operators and expressions (AnalysisContext
    .operator_classes and .index_expressions)."""

    operator_classes: dict[str, tuple[OperatorSupport, ...]]
    index_expressions: dict[tuple[str, str], tuple[str, str]]


async def operator_support(conn: Connection, query: str, tables: Mapping[str, TableInfo] | None = None,
                           aliases: Mapping[str, str] | None = None) -> CatalogAnswer:
    """The operator classes that serve each operator the query uses (AnalysisContext.
    operator_classes), and the indexable expressions of its WHERE clause (`index_expressions`),
    read in one transaction that is rolled back: the trusted extensions afs.safety lets a
    proposal create are created first, so their classes are known (marked not installed); the
    query becomes a temporary view, whose tree names the operators. DatabaseError when PostgreSQL
    cannot make a view of the query (parameters, a data-modifying statement). Keys for the types
    an operator's classes also serve (binary-coercible to its left type, or standing for a
    polymorphic one) are added for the types of the columns of `tables` only."""
    tables = tables or {}
    coercible = {catalog_type(c.data_type) for info in tables.values() for c in info.columns}
    await conn.execute("BEGIN")
    try:
        created: list[str] = []
        for (name,) in await conn.fetchall(_CREATABLE_SQL, (sorted(ALLOWED_EXTENSIONS),)):
            await conn.execute("SAVEPOINT afs_extension")
            try:
                await conn.execute(f"CREATE EXTENSION IF NOT EXISTS {ident(str(name))}")
            except DatabaseError:
                await conn.execute("ROLLBACK TO SAVEPOINT afs_extension")
                continue
            created.append(str(name))
        # a subquery: duplicate output names (`a.id, b.id`) are fine there, not in a view's list
        # the one query without its `;` (pglast splits it); a line break: a comment that ends
        # the query must not swallow the parenthesis
        try:
            body = select_text(query)
        except InputError as exc:  # not a query PostgreSQL can make a view of
            raise DatabaseError(str(exc)) from exc
        await conn.execute(f"CREATE TEMP VIEW {PROBE_VIEW} AS SELECT 1 AS probe FROM ({body}\n) AS q")
        tree = str(await conn.fetchval(_PROBE_TREE_SQL) or "")
        oids = sorted({int(m) for m in _OPERATOR_OID.findall(tree)})
        rows = await conn.fetchall(_SUPPORT_SQL, (oids, sorted(coercible))) if oids else []
        expressions = await index_expressions(conn, query, tables, aliases or {})
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")
    found: dict[str, list[OperatorSupport]] = {}
    for op, left, right, method, opclass, default, ordering, family, extension, aliases in rows:
        support = OperatorSupport(
            operator=str(op), left_type=str(left), right_type=str(right), method=str(method),
            opclass=str(opclass), default=bool(default), purpose="order" if ordering else "search",
            family_operators=int(family), extension=None if extension is None else str(extension),
            installed=extension is None or str(extension) not in created)
        for type_name in dict.fromkeys([str(left), *(str(a) for a in aliases or () if str(a) in coercible)]):
            found.setdefault(support_key(str(op), type_name), []).append(support)
    return CatalogAnswer({key: tuple(dict.fromkeys(values)) for key, values in found.items()}, expressions)


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
) -> AnalysisContext:
    """Run the analysis queries in the fork and build the agent's context (its suite empty:
    the caller builds the suite from what this finds).

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
    try:
        catalog = await operator_support(conn, query, tables, features.aliases)
    except DatabaseError:  # the strategists then keep to PostgreSQL's built-in classes
        catalog = CatalogAnswer({}, {})
    return AnalysisContext(task_id=task_id, task_type=task_type, query=query, features=features,
                           plan=plan, execution_ms=execution_ms, tables=tables, suite=(),
                           slow=slow, server=server, operator_classes=catalog.operator_classes,
                           index_expressions=catalog.index_expressions)


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
