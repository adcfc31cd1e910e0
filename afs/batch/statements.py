"""Reading the workload: `pg_stat_statements` of one database, ranked by total time.

    workload = await read_workload(conn, top=10, min_calls=5, min_mean_ms=1.0)

Only the target database's statements count (`dbid`: a managed server is dominated
by other databases' monitoring queries otherwise), and only top-level ones. Of those
over the thresholds, the read-only SELECTs AFS can optimize are kept, by total time;
the others ranked above the last one kept are listed as skipped, with the reason.
`select_workload` is the pure part (rows in, decision out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pglast import ast, parse_sql
from pglast.parser import ParseError

from afs.db import Connection
from afs.errors import DatabaseError, InputError
from afs.safety import check_query

INSUFFICIENT = "<insufficient privilege>"
SYSTEM_PREFIXES = ("pg_", "information_schema.", "afs_store.")
MIN_VERSION = (1, 8)  # total_exec_time, mean_exec_time (PostgreSQL 13)


@dataclass(frozen=True)
class Statement:
    queryid: int
    query: str  # normalised: constants are $1 … $n
    calls: int
    total_ms: float
    mean_ms: float
    rows: int


@dataclass(frozen=True)
class Skipped:
    queryid: int | None
    query: str
    calls: int
    total_ms: float
    reason: str


@dataclass(frozen=True)
class Workload:
    database: str
    statements: tuple[Statement, ...]  # to optimize, by total time (highest first)
    skipped: tuple[Skipped, ...]  # ranked above the last statement kept, and why not
    below_thresholds: int  # statements under --min-calls / --min-mean-ms
    period_s: float = 0.0  # since pg_stat_statements was last reset (what the totals cover)


_READ_SQL = """
SELECT s.queryid, s.query, s.calls, s.total_exec_time, s.mean_exec_time, s.rows
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND s.toplevel
ORDER BY s.total_exec_time DESC, s.queryid
"""


def nodes(tree: object) -> Iterator[ast.Node]:
    """Every node of a pglast tree, depth first."""
    if isinstance(tree, (list, tuple)):
        for item in tree:
            yield from nodes(item)
    elif isinstance(tree, ast.Node):
        yield tree
        for slot in getattr(tree, "__slots__", ()):
            yield from nodes(getattr(tree, slot, None))


def relation_name(node: ast.RangeVar) -> str:
    return f"{node.schemaname}.{node.relname}" if node.schemaname else str(node.relname)


def relations(query: str) -> list[str]:
    """The relations a statement names (schema-qualified as written), CTE names excepted."""
    tree = parse_sql(query)
    ctes = {str(n.ctename) for n in nodes(tree) if isinstance(n, ast.CommonTableExpr)}
    names = [relation_name(n) for n in nodes(tree) if isinstance(n, ast.RangeVar)]
    return [n for n in dict.fromkeys(names) if n not in ctes]


def why_not(query: str) -> str | None:
    """Why AFS cannot optimize this statement; None when it can."""
    if query.strip() == INSUFFICIENT:
        return ("query text hidden (<insufficient privilege>): the role needs pg_read_all_stats "
                "to see other users' statements")
    try:
        check_query(query)
    except InputError as exc:
        return str(exc).splitlines()[0]
    try:
        tables = relations(query)
    except ParseError as exc:
        return f"does not parse: {exc}"
    if not tables:
        return "reads no table"
    system = [t for t in tables if t.lower().startswith(SYSTEM_PREFIXES)]
    if system:
        return f"reads system or AFS tables ({', '.join(system)})"
    return None


def select_workload(database: str, rows: Iterable[tuple[int | None, str, int, float, float, int]], *,
                    top: int, min_calls: int = 1, min_mean_ms: float = 0.0) -> Workload:
    """Rows of pg_stat_statements (queryid, query, calls, total ms, mean ms, rows), any order."""
    if top < 1:
        raise InputError(f"--top must be at least 1, got {top}")
    if min_calls < 0 or min_mean_ms < 0:
        raise InputError("--min-calls and --min-mean-ms must not be negative")
    ranked = sorted(rows, key=lambda r: (-r[3], r[0] or 0))
    kept: list[Statement] = []
    skipped: list[Skipped] = []
    below = 0
    for queryid, query, calls, total, mean, nrows in ranked:
        if calls < min_calls or mean < min_mean_ms:
            below += 1
            continue
        if len(kept) >= top:
            continue
        reason = why_not(query)
        if reason is None and queryid is None:
            reason = "no queryid (compute_query_id is off)"
        if reason is not None:
            skipped.append(Skipped(queryid, query, int(calls), float(total), reason))
        else:
            assert queryid is not None
            kept.append(Statement(int(queryid), query, int(calls), float(total), float(mean), int(nrows)))
    # listed: the others that cost more than the last statement kept
    skipped = [s for s in skipped if s.total_ms >= kept[-1].total_ms] if kept else skipped[:top]
    return Workload(database, tuple(kept), tuple(skipped), below)


async def check_extension(conn: Connection) -> None:
    """pg_stat_statements must be preloaded, created in this database, version ≥ 1.8."""
    database = await conn.fetchval("SELECT current_database()")
    not_loaded = ("pg_stat_statements is not loaded on the target server: add it to "
                  "shared_preload_libraries in postgresql.conf (and compute_query_id = on), "
                  f"restart the server, then CREATE EXTENSION pg_stat_statements in database {database}")
    version = await conn.fetchval(
        "SELECT extversion FROM pg_extension WHERE extname = 'pg_stat_statements'")
    if version is None:
        try:
            preload = str(await conn.fetchval("SELECT current_setting('shared_preload_libraries')") or "")
        except DatabaseError:  # the role may not read it (pg_read_all_settings)
            preload = "pg_stat_statements"
        if "pg_stat_statements" not in [p.strip() for p in preload.split(",")]:
            raise InputError(not_loaded)
        raise InputError(f"the pg_stat_statements extension is not created in database {database}: "
                         "run CREATE EXTENSION pg_stat_statements there (as a superuser or the owner)")
    parts = tuple(int(p) for p in str(version).split(".")[:2] if p.isdigit())
    if parts < MIN_VERSION:
        raise InputError(f"pg_stat_statements {version} in database {database} has no total_exec_time "
                         "(needs 1.8, PostgreSQL 13): run ALTER EXTENSION pg_stat_statements UPDATE")
    try:
        await conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
    except DatabaseError as exc:
        if "shared_preload_libraries" in str(exc):
            raise InputError(not_loaded) from exc
        raise InputError(f"cannot read pg_stat_statements: {str(exc).splitlines()[0]}") from exc


async def read_workload(conn: Connection, *, top: int, min_calls: int = 1,
                        min_mean_ms: float = 0.0) -> Workload:
    """The target database's statements to optimize (read-only: one SELECT of the view)."""
    select_workload("", (), top=top, min_calls=min_calls, min_mean_ms=min_mean_ms)  # bad options first
    await check_extension(conn)
    database = str(await conn.fetchval("SELECT current_database()"))
    try:
        rows = await conn.fetchall(_READ_SQL)
    except DatabaseError as exc:
        raise InputError(f"cannot read pg_stat_statements: {str(exc).splitlines()[0]}") from exc
    period = await conn.fetchval(
        "SELECT extract(epoch FROM now() - stats_reset) FROM pg_stat_statements_info")
    workload = select_workload(database, rows, top=top, min_calls=min_calls, min_mean_ms=min_mean_ms)
    return dataclasses.replace(workload, period_s=float(period or 0.0))
