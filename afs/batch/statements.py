"""Reading the workload: `pg_stat_statements` of one database, ranked by total time.

    workload = await read_workload(conn, top=10, min_calls=5, min_mean_ms=1.0)

    counters = await read_counters(conn)                 # the one read of the view
    since = parse_since("24h", counters.at)
    workload = workload_of(counters, since, snapshot, top=10)   # snapshot: from the store

Only the target database's statements count (`dbid`: a managed server is dominated
by other databases' monitoring queries otherwise), and only top-level ones, summed
over the roles that ran them (one row per `queryid`). Of those over the thresholds,
the read-only SELECTs AFS can optimize are kept, by total time; the others ranked
above the last one kept are listed as skipped, with the reason. `select_workload`
is the pure part (rows in, decision out).

The window. pg_stat_statements keeps running totals, with no time of each call: the
counters cover the time since they were last reset (`pg_stat_statements_info.stats_reset`).
`--since` is answered by subtraction: every batch stores the counters it read (a
snapshot, in the store); the window since T is the counters now minus those of the
newest snapshot taken at or before T, so it starts at that snapshot (at or a little
before T). With no such snapshot, or when the statistics were reset after it, the
window is the time since the reset, and the report says so (`Window.note`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pglast import ast, parse_sql
from pglast.parser import ParseError

from afs.db import Connection
from afs.errors import DatabaseError, InputError
from afs.pg.names import relation_key
from afs.query.text import walk
from afs.safety import check_query

INSUFFICIENT = "<insufficient privilege>"
SYSTEM_PREFIXES = ("pg_", "information_schema.", "afs_store.")
MIN_VERSION = (1, 8)  # total_exec_time, mean_exec_time (PostgreSQL 13)


@dataclass(frozen=True)
class BatchTarget:
    """Where a batch works, passed whole: the database whose statements it reads (`dsn`, only
    read), its copy in the sandbox that forks are made of (`source`), and the DSN each of its
    tasks records (`task_dsn`; None: the sandbox's demo database)."""

    dsn: str
    source: str
    task_dsn: str | None = None


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
    period_s: float = 0.0  # the time the totals cover (the window)
    window: Window | None = None
    below_mean_ms: int = 0  # of below_thresholds: faster on average than --min-mean-ms (--min-ms)
    below_calls: int = 0  # of below_thresholds: called fewer times than --min-calls
    below_total_ms: float = 0.0  # the time those statements took together


Row = tuple[int | None, str, int, float, float, int]  # queryid, query, calls, total ms, mean ms, rows


@dataclass(frozen=True)
class Counters:
    """One read of pg_stat_statements for one database (per queryid, summed over roles)."""

    database: str
    at: datetime  # the target server's clock
    stats_reset: datetime | None  # None before pg_stat_statements 1.9 (PostgreSQL 14)
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Snapshot:
    """Counters stored by an earlier batch: queryid → (calls, total ms, rows)."""

    taken_at: datetime
    stats_reset: datetime | None
    counters: Mapping[int, tuple[int, float, int]]


@dataclass(frozen=True)
class Window:
    """What the totals of a batch cover: from `start` to `end`."""

    start: datetime | None  # None: unknown (no stats_reset to read)
    end: datetime
    basis: str  # "reset": the counters as they are; "snapshot": minus an earlier snapshot
    requested: datetime | None  # --since, when given
    note: str  # the window in words, for the report

    @property
    def seconds(self) -> float:
        return 0.0 if self.start is None else max(0.0, (self.end - self.start).total_seconds())

    def public(self) -> dict[str, str | float | None]:
        return {"basis": self.basis, "start": _iso(self.start), "end": _iso(self.end),
                "requested": _iso(self.requested), "seconds": round(self.seconds, 1), "note": self.note}


# one row per queryid (summed over roles); a row whose queryid is hidden (another role's,
# without pg_read_all_stats) stays a row of its own
_READ_SQL = """
SELECT s.queryid, min(s.query), sum(s.calls)::bigint, sum(s.total_exec_time),
       coalesce(sum(s.total_exec_time) / nullif(sum(s.calls), 0), 0), sum(s.rows)::bigint
FROM (SELECT p.*, row_number() OVER () AS n FROM pg_stat_statements p
      WHERE p.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND p.toplevel) s
GROUP BY s.queryid, CASE WHEN s.queryid IS NULL THEN s.n END
ORDER BY 4 DESC, 1
"""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86_400, "w": 604_800}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


def parse_duration(text: str) -> timedelta | None:
    """`24h`, `7d`, `90m`, `2w`, `30s` as a timedelta; None when it is not a duration."""
    match = _DURATION.match(text)
    if match is None:
        return None
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_since(text: str, now: datetime) -> datetime:
    """--since as a moment: a duration before `now`, or an ISO timestamp (UTC when it names
    no zone). Raises InputError unless it is before `now`."""
    duration = parse_duration(text)
    if duration is not None:
        if duration <= timedelta(0):
            raise InputError(f"--since must be a positive duration, got {text!r}")
        return now - duration
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InputError(f"--since: expected a duration (24h, 7d, 90m, 2w) or an ISO timestamp "
                         f"(2026-11-22T03:00Z, 2026-11-22 03:00+01:00), got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if moment >= now:
        raise InputError(f"--since {text} is not in the past (now is {_iso(now)} on the target)")
    return moment


def choose_window(counters: Counters, since: datetime | None, snapshot: Snapshot | None) -> Window:
    """The window the report covers (pure). `snapshot`: the newest taken at or before `since`."""
    reset, end = counters.stats_reset, counters.at
    reset_text = f"the statistics were last reset ({_iso(reset)})" if reset else \
        "the statistics were last reset (pg_stat_statements < 1.9 does not say when)"
    if since is None:
        return Window(reset, end, "reset", None, f"since {reset_text}")
    if reset is not None and reset >= since:
        return Window(reset, end, "reset", since,
                      f"since {reset_text}: that is after the requested start ({_iso(since)}), "
                      "so the window is shorter than asked")
    if snapshot is not None and snapshot.stats_reset == reset and snapshot.taken_at <= since:
        return Window(snapshot.taken_at, end, "snapshot", since,
                      f"since {_iso(snapshot.taken_at)}: the counters minus those stored by the batch "
                      f"then (the newest snapshot at or before the requested start {_iso(since)})")
    return Window(reset, end, "reset", since,
                  f"since {reset_text}, NOT since {_iso(since)} as asked: no snapshot of this "
                  "database's counters from before then (each batch stores one), so the window "
                  "falls back to the statistics' reset")


def subtract(rows: Iterable[Row], snapshot: Snapshot) -> list[Row]:
    """The counters since the snapshot (pure). A statement not called since is left out; one
    whose counters went down (its entry was evicted and made again) counts from its new entry."""
    out: list[Row] = []
    for queryid, query, calls, total, mean, nrows in rows:
        before = snapshot.counters.get(queryid) if queryid is not None else None
        if before is None or calls < before[0] or total < before[1]:
            out.append((queryid, query, calls, total, mean, nrows))
            continue
        d_calls, d_total = calls - before[0], total - before[1]
        if d_calls <= 0:
            continue
        out.append((queryid, query, d_calls, d_total, d_total / d_calls, max(0, nrows - before[2])))
    return out


def relations(query: str) -> list[str]:
    """The relations a statement names (schema-qualified as written), CTE names excepted, as
    the catalog keys them (afs.pg.names.relation_key: `orders`, `"Orders"`)."""
    tree = parse_sql(query)
    ctes = {relation_key(str(n.ctename)) for n in walk(tree) if isinstance(n, ast.CommonTableExpr)}
    names = [relation_key(*(part for part in (n.schemaname, n.relname) if part))
             for n in walk(tree) if isinstance(n, ast.RangeVar)]
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
    below = below_mean = 0
    below_ms = 0.0
    for queryid, query, calls, total, mean, nrows in ranked:
        if calls < min_calls or mean < min_mean_ms:
            below += 1
            below_mean += mean < min_mean_ms
            below_ms += total
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
    return Workload(database, tuple(kept), tuple(skipped), below, below_mean_ms=below_mean,
                    below_calls=below - below_mean, below_total_ms=round(below_ms, 3))


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


async def read_counters(conn: Connection) -> Counters:
    """The target database's pg_stat_statements, as it is now (read-only)."""
    await check_extension(conn)
    database, at = await conn.fetchone("SELECT current_database(), now()") or ("", None)
    try:
        rows = await conn.fetchall(_READ_SQL)
    except DatabaseError as exc:
        raise InputError(f"cannot read pg_stat_statements: {str(exc).splitlines()[0]}") from exc
    has_info = await conn.fetchval("SELECT to_regclass('pg_stat_statements_info') IS NOT NULL")
    reset = await conn.fetchval("SELECT stats_reset FROM pg_stat_statements_info") if has_info else None
    return Counters(str(database), at, reset,
                    tuple((q, str(text), int(c), float(t), float(m), int(r or 0))
                          for q, text, c, t, m, r in rows))


def workload_of(counters: Counters, since: datetime | None, snapshot: Snapshot | None, *, top: int,
                min_calls: int = 1, min_mean_ms: float = 0.0) -> Workload:
    """The statements to optimize over the window since `since` (pure)."""
    window = choose_window(counters, since, snapshot)
    rows: Iterable[Row] = counters.rows
    if window.basis == "snapshot":
        assert snapshot is not None
        rows = subtract(counters.rows, snapshot)
    workload = select_workload(counters.database, rows, top=top, min_calls=min_calls,
                               min_mean_ms=min_mean_ms)
    return dataclasses.replace(workload, period_s=window.seconds, window=window)


async def read_workload(conn: Connection, *, top: int, min_calls: int = 1,
                        min_mean_ms: float = 0.0) -> Workload:
    """The target database's statements to optimize, since the statistics' reset."""
    select_workload("", (), top=top, min_calls=min_calls, min_mean_ms=min_mean_ms)  # bad options first
    return workload_of(await read_counters(conn), None, None, top=top, min_calls=min_calls,
                       min_mean_ms=min_mean_ms)
