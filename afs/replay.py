"""A workload's statements in a fork, with and without some indexes: every run rolled back.

    replayed = await replay(fork_conn, statements, drop=("public.orders_status_idx",),
                            rule=StopRule.of(settings.measuring))
    cost = await fork_write_cost(fork_conn, proposal, workload, policy)   # the proposal applied

A run of a statement is one transaction that is always rolled back: the indexes dropped in it
(the side "without"), then the statement under EXPLAIN (ANALYZE, TIMING OFF) `repeats` times (a
write inside a savepoint rolled back each time, so an INSERT never meets its own earlier row),
and the run's figure is the mean execution time per call. A fast statement is repeated until a
run takes about `RUN_TARGET_MS`, so a write of 30 µs is not timed in the noise of one call. The
two sides alternate run by run (drift hits both alike), as long as `afs.bench.stop_reason`
leaves the verdict open; `afs.bench.significant` decides. A write's cost is an estimate rather
than a verdict: `WRITE_PAIRS` pairs of runs at least (the settings' run count when larger), each
pair back to back, and the figure is the median of the pairs' differences (drift between pairs
cancels out). A write whose values would collide in a unique key it writes whole gets the key's
last integer column past the column's largest value.

A read whose plan is the same with and without the index (its node types, relations and
indexes) is not timed: the planner's choice does not depend on an index it does not use.

Two callers: the batch (afs.batch.replay fills the statements on the target and replays them
in a fork of its own: the index review, the new indexes' write costs, the budgeted set), and an
agent (afs.agents), which measures a proposal's new indexes against the writes its task was
given (`StatementParameters.workload`, checked again here by afs.task.check_workload) in its
own fork, right after the proposal's benchmark, the proposal still applied: `fork_write_cost`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import psycopg
import trio
from pglast import ast, parse_sql

from afs.bench import Sample, StopRule, significant, stop_reason, timing
from afs.config import Measuring
from afs.db import Connection, translate
from afs.errors import AfsError, DatabaseError
from afs.models import BenchmarkOutcome, OptimizationProposal, Timing, WriteCost, WriteWorkload
from afs.params.fill import substitute, typed_parameters
from afs.pg.names import quote_ident, quote_qualified
from afs.pg.plan import explained, plan_of
from afs.safety import NewIndex, creates, validate_commands
from afs.task import check_workload

Kind = Literal["read", "write"]
RUN_TARGET_MS = 20.0  # a run of a fast statement repeats it until it takes about this long
WRITE_RUN_TARGET_MS = 50.0  # a write's run: its cost is a few µs in a call of tens
WRITE_PAIRS = 7  # pairs of runs of a write, at least (the estimate is the median of their differences)
MAX_REPEATS = 1000  # calls of a statement in one run, at most
TIME_LEFT_SHARE = 0.5  # of the time its caller has left, what an agent's replay of writes may start in
DAY_S = 86_400.0
_INTEGERS = {"smallint", "integer", "bigint", "int2", "int4", "int8"}


@dataclass(frozen=True)
class WorkStatement:
    """One statement of the workload, filled: what the replay runs."""

    queryid: int | None
    statement: str  # as pg_stat_statements keeps it ($1 … $n)
    query: str  # filled with values
    kind: Kind
    table: str  # the table written (a write), or the first of the tables it names that was asked for
    calls: int
    total_ms: float
    values: tuple[tuple[int, str], ...] = ()  # a write's $n → SQL literal (the fill)


@dataclass(frozen=True)
class Replayed:
    """A statement with and without the index."""

    statement: WorkStatement
    with_index: Timing | None  # None: not timed (the same plan either way)
    without_index: Timing | None
    plan_changed: bool
    significant: bool  # the two sides' runs apart (afs.bench.significant)
    repeats: int  # calls per run
    note: str = ""
    paired_ms: float | None = None  # a write's: the median of the runs' differences (without − with)

    @property
    def delta_ms(self) -> float:
        """Per call, without the index minus with it (a read slower without: > 0; a write
        faster without: < 0, from the pairs of runs, each pair measured back to back)."""
        if self.paired_ms is not None:
            return self.paired_ms
        if self.with_index is None or self.without_index is None:
            return 0.0
        return self.without_index.median_ms - self.with_index.median_ms

    @property
    def slower_without(self) -> bool:
        return self.statement.kind == "read" and self.significant and self.delta_ms > 0

    def public(self) -> dict[str, Any]:
        return {"statement": self.statement.statement, "measured_as": self.statement.query,
                "kind": self.statement.kind, "calls": self.statement.calls,
                "with_ms": None if self.with_index is None else self.with_index.median_ms,
                "without_ms": None if self.without_index is None else self.without_index.median_ms,
                "runs": 0 if self.with_index is None else self.with_index.runs,
                "repeats": self.repeats, "plan_changed": self.plan_changed,
                "delta_ms": round(self.delta_ms, 5),  # without − with, per call
                "significant": self.significant, "note": self.note}


def _param(node: object) -> int | None:
    while isinstance(node, ast.TypeCast):
        node = node.arg
    return node.number if isinstance(node, ast.ParamRef) else None



# -- in the fork ---------------------------------------------------------------------------------
def _shape(node: Mapping[str, Any]) -> tuple[Any, ...]:
    return (node.get("Node Type"), node.get("Relation Name"), node.get("Index Name"),
            tuple(_shape(child) for child in node.get("Plans", ())))


def _drops(cur: psycopg.Cursor[Any], drop: Sequence[str]) -> None:
    for name in drop:
        cur.execute(f"DROP INDEX {quote_qualified(name)}")


def _plan_sync(raw: psycopg.Connection[Any], sql: str, drop: Sequence[str]) -> tuple[Any, ...]:
    with raw.cursor() as cur:
        cur.execute("BEGIN")
        try:
            _drops(cur, drop)
            cur.execute(f"EXPLAIN (FORMAT JSON) {sql}")
            row = cur.fetchone()
            assert row is not None
            return _shape(plan_of(row[0]))
        finally:
            raw.execute("ROLLBACK")


def _unique_keys(raw: psycopg.Connection[Any], table: str) -> list[list[tuple[str, bool]]]:
    """The key columns of each unique index of `table`, in order: (name, is an integer)."""
    rows = raw.execute(
        "SELECT i.indexrelid, a.attname, format_type(a.atttypid, NULL) = ANY(%s)"
        " FROM pg_index i"
        " CROSS JOIN LATERAL unnest(i.indkey[0:i.indnkeyatts - 1]) WITH ORDINALITY k(attnum, n)"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        " WHERE i.indrelid = to_regclass(%s) AND i.indisunique ORDER BY i.indexrelid, k.n",
        (sorted(_INTEGERS), table)).fetchall()
    keys: dict[int, list[tuple[str, bool]]] = {}
    for oid, name, integer in rows:
        keys.setdefault(int(oid), []).append((str(name), bool(integer)))
    return list(keys.values())


def _fresh_keys(raw: psycopg.Connection[Any], work: WorkStatement) -> str:
    """A write whose values would collide with a row in a unique key it writes whole: the key's
    last integer column written past the column's largest value (the others, a foreign key
    among them, keep the values filled from the statistics)."""
    if work.kind != "write":
        return work.query
    stmt = parse_sql(typed_parameters(work.statement))[0].stmt
    written: dict[int, str] = {}
    if isinstance(stmt, ast.InsertStmt):
        names = [str(c.name) for c in stmt.cols or ()]
        for row in getattr(stmt.selectStmt, "valuesLists", None) or ():
            for n, item in enumerate(row):
                number = _param(item)
                if number is not None and n < len(names):
                    written.setdefault(number, names[n])
    elif isinstance(stmt, ast.UpdateStmt):
        for target in stmt.targetList or ():
            number = _param(target.val)
            if number is not None:
                written.setdefault(number, str(target.name))
    by_column = {c: n for n, c in written.items()}
    fresh: dict[int, str] = {}
    for key in _unique_keys(raw, work.table):
        if all(name in by_column for name, _ in key):
            last = [name for name, integer in key if integer]
            if last:
                fresh[by_column[last[-1]]] = last[-1]
    if not fresh:
        return work.query
    values = dict(work.values)
    for number, column in fresh.items():
        top = raw.execute(f"SELECT max({quote_ident(column)}) FROM {quote_qualified(work.table)}").fetchone()
        values[number] = str(int(top[0] or 0) + 1 + number) if top is not None else "1"
    return substitute(typed_parameters(work.statement), values)


def _run_sync(raw: psycopg.Connection[Any], sql: str, drop: Sequence[str], repeats: int,
              write: bool) -> float:
    """One run: BEGIN; the drops; `repeats` calls (a write in a savepoint each); ROLLBACK.
    The mean execution time per call (ms)."""
    with raw.cursor() as cur:
        cur.execute("BEGIN")
        try:
            _drops(cur, drop)
            total = 0.0
            for _ in range(repeats):
                if write:
                    cur.execute("SAVEPOINT afs_replay")
                cur.execute(f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {sql}")
                row = cur.fetchone()
                assert row is not None
                total += explained(row[0])[1]
                if write:
                    cur.execute("ROLLBACK TO SAVEPOINT afs_replay")
            return total / repeats
        finally:
            raw.execute("ROLLBACK")


async def _call(conn: Connection, fn: Any, *args: Any) -> Any:
    def work(raw: psycopg.Connection[Any]) -> Any:
        try:
            return fn(raw, *args)
        except psycopg.Error as exc:
            raise translate(exc) from exc
    return await conn.run(work)


async def replay_one(conn: Connection, work: WorkStatement, drop: Sequence[str], rule: StopRule,
                     *, base: Sequence[str] = (), with_plan_check: bool = True) -> Replayed:
    """`work` in the fork with the indexes in `drop` there and dropped, alternating; `base`:
    indexes dropped on both sides (drops already decided: the candidates judged together)."""
    drop = (*base, *drop)
    try:
        query = await _call(conn, _fresh_keys, work)
        changed = True
        if work.kind == "read" and with_plan_check:
            changed = await _call(conn, _plan_sync, query, base) != await _call(conn, _plan_sync, query, drop)
            if not changed:
                return Replayed(work, None, None, False, False, 0,
                                "the same plan without the index: not timed")
        write = work.kind == "write"
        first = await _call(conn, _run_sync, query, base, 1, write)
        target_ms = WRITE_RUN_TARGET_MS if write else RUN_TARGET_MS
        repeats = max(1, min(MAX_REPEATS, math.ceil(target_ms / max(first, 0.001))))
        with_index: list[Sample] = []
        without: list[Sample] = []
        while True:
            with_index.append(Sample(await _call(conn, _run_sync, query, base, repeats, write), 0))
            without.append(Sample(await _call(conn, _run_sync, query, drop, repeats, write), 0))
            if write:  # an estimate, not only a verdict: a fixed number of pairs (never "overlap")
                if len(with_index) >= max(rule.max_runs, WRITE_PAIRS):
                    break
            elif stop_reason([s.ms for s in with_index], [s.ms for s in without], rule) is not None:
                break
    except DatabaseError as exc:
        return Replayed(work, None, None, False, False, 0,
                        f"not replayed in the fork: {str(exc).splitlines()[0]}")
    paired = (statistics.median(b.ms - a.ms for a, b in zip(with_index, without, strict=True))
              if write else None)
    return Replayed(work, timing(with_index), timing(without), changed,
                    significant(with_index, without), repeats, paired_ms=paired)


async def replay(conn: Connection, statements: Sequence[WorkStatement], drop: Sequence[str],
                 rule: StopRule, base: Sequence[str] = ()) -> list[Replayed]:
    """Every statement with and without the indexes in `drop` (`base` dropped on both sides),
    one after another (one fork connection: the runs of one statement must not overlap)."""
    return [await replay_one(conn, work, drop, rule, base=base) for work in statements]


def per_day(calls: int, window_s: float | None) -> float | None:
    """Calls a day at the observed rate; None when the window is unknown."""
    return None if window_s is None or window_s <= 0 else calls * DAY_S / window_s


def write_cost(replayed: Sequence[Replayed], window_s: float | None) -> dict[str, Any]:
    """What an index costs the writes (the writes' extra time with it, per call and per day)."""
    writes = [r for r in replayed if r.statement.kind == "write" and r.with_index is not None]
    calls = sum(r.statement.calls for r in writes)
    extra = [(-r.delta_ms, r.statement.calls) for r in writes]  # with minus without: the index's cost
    ms_per_write = sum(e * c for e, c in extra) / calls if calls else 0.0
    days = per_day(calls, window_s)
    return {"ms_per_write": round(ms_per_write, 4),
            "writes_per_day": None if days is None else round(days, 1),
            "ms_per_day": None if days is None else round(ms_per_write * days, 1),
            "measured": [r.public() for r in writes],
            "significant": any(r.significant for r in writes),
            "writes": len(writes)}


# -- a proposal's new indexes against the writes a task was given (an agent's fork) -------------
def net_saving(saved_ms_per_day: float | None, write_cost: Mapping[str, Any] | None) -> float | None:
    """Read time saved a day minus the measured write cost a day of the new indexes (issue 28: the
    whole workload, not the one statement); None without both figures. A write cost within the
    noise counts as measured (its estimate, possibly ~0), not as nothing."""
    if saved_ms_per_day is None or not write_cost or write_cost.get("ms_per_day") is None:
        return None
    return round(saved_ms_per_day - float(write_cost["ms_per_day"]), 1)


def new_index_names(proposal: OptimizationProposal) -> dict[str, str]:
    """The proposal's new indexes that it names, by name (as its CREATE INDEX writes it, the
    table's schema before it when given): the table each is on. An index the statement leaves
    unnamed is not here (PostgreSQL picks its name: `new_indexes_in_fork` finds it)."""
    return {index.name: index.table for index in creates(proposal).indexes if index.name}


_INDEXES_ON = ("SELECT n.nspname || '.' || c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
               " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
               " WHERE i.indrelid = to_regclass(%s) ORDER BY i.indexrelid DESC")


def _made_alike(index: NewIndex) -> tuple[Any, ...]:
    """What an index's definition as the catalog prints it shares with the statement that made
    it (its WHERE is printed with casts: only whether there is one)."""
    return index.keys, index.method, bool(index.where), index.include, index.unique


async def new_indexes_in_fork(conn: Connection, proposal: OptimizationProposal) -> dict[str, str]:
    """The proposal's new indexes in the fork, applied: name → table. A named one as its
    statement names it (`new_index_names`); one left unnamed (PostgreSQL picks the name) found in
    the fork's catalog: the newest index on its table made alike (keys, method, INCLUDE,
    uniqueness, partial or not); none found, it is left out."""
    found = new_index_names(proposal)
    for index in creates(proposal).indexes:
        if index.name:
            continue
        for name, definition in await conn.fetchall(_INDEXES_ON, (index.table,)):
            made = validate_commands((str(definition),), "index").creates.commands
            if (str(name) not in found and len(made) == 1 and isinstance(made[0], NewIndex)
                    and _made_alike(made[0]) == _made_alike(index)):
                found[str(name)] = index.table
                break
    return found


def measured_cost(replayed: Sequence[tuple[Replayed, float | None]], reads_per_day: float | None,
                  note: str = "") -> WriteCost:
    """The writes' extra time with the indexes (pure), from each replayed write and its observed
    calls a day: per write (calls-weighted), and per day as the sum of each write's extra time ×
    its calls a day (None when a rate is unknown). A write not timed (an error) does not count."""
    timed = [(r, d) for r, d in replayed if r.statement.kind == "write" and r.with_index is not None]
    calls = sum(r.statement.calls for r, _ in timed)
    ms_per_write = sum(-r.delta_ms * r.statement.calls for r, _ in timed) / calls if calls else 0.0
    known = bool(timed) and all(d is not None for _, d in timed)
    return WriteCost(
        ms_per_write=round(ms_per_write, 5),
        writes_per_day=round(sum(d or 0.0 for _, d in timed), 1) if known else None,
        ms_per_day=round(sum(-r.delta_ms * (d or 0.0) for r, d in timed), 2) if known else None,
        reads_per_day=reads_per_day, significant=any(r.significant for r, _ in timed),
        statements=len(timed), note=note)


async def fork_write_cost(conn: Connection, proposal: OptimizationProposal,
                          workload: WriteWorkload | None, policy: Measuring) -> WriteCost | None:
    """With `proposal` applied in the fork `conn`: each of the workload's writes of a table it
    indexes replayed with its new indexes and with them dropped (rolled back each run), within
    the policy's measuring budget. None when the proposal makes no index found in the fork or
    the task has no write of its tables (the consensus then weighs the source's writes per read)."""
    if workload is None or not workload.writes or not creates(proposal).indexes:
        return None
    names = await new_indexes_in_fork(conn, proposal)
    if not names:
        return None
    check_workload(workload, {w.table for w in workload.writes})  # again, the statements: what runs here
    # which relation a name means is the fork's to say (its search_path), not the text's last part
    oids = {t: await conn.fetchval("SELECT to_regclass(%s)::oid", (t,))
            for t in {*names.values(), *(w.table for w in workload.writes)}}
    indexed = {oids[t] for t in names.values()} - {None}
    writes = [w for w in workload.writes if oids[w.table] in indexed]
    if not writes:
        return None
    rule = StopRule.of(policy)
    now = trio.current_time()  # new statements start within the budget and half the time left
    deadline = now + min(policy.budget_s, TIME_LEFT_SHARE * (trio.current_effective_deadline() - now))
    replayed: list[tuple[Replayed, float | None]] = []
    left: list[str] = []
    for write in writes:
        if trio.current_time() > deadline:
            left.append(write.statement)
            continue
        work = WorkStatement(None, write.statement, write.query, "write", write.table, write.calls, 0.0,
                             write.values)
        mine = tuple(name for name, table in names.items() if oids[table] == oids[write.table])
        replayed.append((await replay_one(conn, work, mine, rule), write.per_day))
    failed = [r.note for r, _ in replayed if r.with_index is None and r.note]
    notes = ([f"{len(left)} write(s) not replayed: the measuring budget ran out"]
             if left else []) + failed[:1]
    return measured_cost(replayed, workload.reads_per_day, "; ".join(notes))


async def with_write_cost(conn: Connection, outcome: BenchmarkOutcome, proposal: OptimizationProposal,
                          workload: WriteWorkload | None, policy: Measuring) -> BenchmarkOutcome:
    """`outcome` (a BenchmarkOutcome) with the write cost of the proposal's new indexes, when
    the task was given writes of their tables (`fork_write_cost`); as it was when nothing could
    be replayed (an error is no reason to lose the benchmark: the consensus falls back)."""
    try:
        cost = await fork_write_cost(conn, proposal, workload, policy)
    except AfsError:
        return outcome
    return outcome if cost is None else replace(outcome, write_cost=cost)
