"""Running an `ApplyPlan` on the target database, verifying it, and undoing it (I/O).

One apply or rollback at a time per database: a session advisory lock (`APPLY_LOCK_KEY`),
taken with pg_try_advisory_lock so a second apply is refused at once instead of queueing.
Indexes are built CONCURRENTLY, one statement at a time, on an autocommit connection with
no statement timeout (a build takes what it takes; Ctrl-C cancels it on the server).

An index on a partitioned table (CONCURRENTLY is refused there) is first expanded for this
target (`expand`): CONCURRENTLY on every leaf partition, ON ONLY on each partitioned table,
attached bottom-up, at any depth. Before anything runs, the target is checked against the
plan: its statements are judged by the target's own catalog (`judge_statements`: the fork
judged them by the copy's), and (`preflight`) every table and column the plan names exists,
and nothing it would create exists already. After the build, `verify`: each index of the tree is valid
(`indisvalid`), the query's plan on the target uses it (EXPLAIN, no ANALYZE), and the query
is measured read-only before and after. The query is planned and measured only through
`afs.target.on_target` (the input limits, the structural and the catalog checks, then a READ
ONLY transaction as the low-privilege role): the task's query before anything is built, the
query that verifies (a rewrite may read what the plan builds) after. A failed build leaves an
invalid index behind: it is dropped (DROP INDEX CONCURRENTLY) and reported; a failed or
refused verification rolls back every step that ran.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from afs.apply.plan import ApplyPlan, Step, partitioned_steps
from afs.catalog import catalog_problems
from afs.db import Connection, open_connection
from afs.errors import AfsError, DatabaseError, InputError, UnsafeSqlError
from afs.models import EstimatedImpact, OptimizationProposal
from afs.safety import proposal_references
from afs.target import on_target, plan_json, timed_runs

APPLY_LOCK_KEY = 0x0AF5_A991  # pg_try_advisory_lock key: one apply or rollback per database
MEASURE_RUNS = 3
MEASURE_TIMEOUT_MS = 30_000
CLEANUP_TIMEOUT_S = 60.0  # after Ctrl-C: DROP INDEX CONCURRENTLY waits for older transactions
Progress = Callable[[str], None]


@dataclass
class Outcome:
    result: str  # applied | failed
    detail: str
    executed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    verification: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    rollback: list[str] = field(default_factory=list)  # what undoes the plan as it ran here
    planned: list[str] = field(default_factory=list)  # the plan's statements on this target


def _quiet(_: str) -> None:
    pass


def _plan_nodes(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child)


def _last(name: str) -> str:
    return name.rpartition(".")[2].strip('"')


async def measure(conn: Connection, query: str, runs: int = MEASURE_RUNS) -> float | None:
    """The query's median over `runs`, read-only on the target as the low-privilege role,
    after the target's checks (afs.target.on_target); None: it ran past 30 s."""
    try:
        times = await on_target(conn, query, timed_runs(runs, MEASURE_TIMEOUT_MS))
    except DatabaseError as exc:
        if exc.sqlstate == "57014":  # query_canceled: the statement timeout
            return None
        raise
    return round(statistics.median(times), 3)


async def _try_lock(conn: Connection) -> None:
    if not await conn.fetchval("SELECT pg_try_advisory_lock(%s)", (APPLY_LOCK_KEY,)):
        raise InputError("another afs apply or rollback is running on this database; try again when it ends")


async def _unlock(conn: Connection) -> None:
    with trio.CancelScope(shield=True), contextlib.suppress(AfsError):
        await conn.execute("SELECT pg_advisory_unlock(%s)", (APPLY_LOCK_KEY,))


def _ms(value: float | None) -> str:
    return "over 30 s" if value is None else f"{value} ms"


async def judge_statements(conn: Connection, plan: ApplyPlan) -> None:
    """Refuse (UnsafeSqlError) what the target's catalog refuses in the plan's statements: the
    fork judged them by the copy's catalog, and a name can resolve to something else here (a
    function planted after the import that matches its arguments better than the built-in
    one). An index build or a view's query runs what they call on the target's rows."""
    commands = tuple(s.sql for s in plan.steps)
    if plan.kind not in ("index", "statistics", "materialized_view") or not commands:
        return
    proposal = OptimizationProposal(
        agent=plan.agent, proposal_type=plan.kind, sql_commands=commands, rollback_commands=(),
        rationale="the plan as it runs on the target", estimated_impact=EstimatedImpact(0, 0, "low", "low"))
    problems = await catalog_problems(conn, proposal_references(proposal))
    if problems:
        raise UnsafeSqlError(problems[0].statement, f"on the target: {problems[0].reason}")


async def preflight(conn: Connection, plan: ApplyPlan) -> None:
    """Refuse (InputError) when the target does not match what the task measured."""
    created = {_last(s.name) for s in plan.steps if s.kind == "matview" and s.name}
    for step in plan.steps:
        if step.table and _last(step.table) not in created:
            row = await conn.fetchone("SELECT c.oid, c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)",
                                      (step.table,))
            if row is None:
                raise InputError(f"the target has no table {step.table}: its schema changed since the task "
                                 "(or it is another database)")
            if row[1] == "p" and step.kind == "index":
                raise InputError(f"{step.table} is partitioned on the target: CONCURRENTLY cannot build "
                                 "on it directly (`expand` builds it per partition)")
            names = {r[0] for r in await conn.fetchall(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
                (row[0],))}
            missing = [c for c in step.columns if c not in names]
            if missing:
                raise InputError(f"the target's {step.table} has no column {', '.join(missing)}: its schema "
                                 "changed since the task")
        if step.name and step.kind in ("index", "index_parent", "matview") and await conn.fetchval(
                "SELECT to_regclass(%s)", (step.name,)) is not None:
            raise InputError(f"{step.name} already exists on the target (applied already? see `afs audit`)")
        if step.name and step.kind == "statistics" and await conn.fetchval(
                "SELECT 1 FROM pg_statistic_ext WHERE stxname = %s", (_last(step.name),)):
            raise InputError(f"statistics {step.name} already exist on the target (applied already?)")


_PARTITION_TREE = """
WITH RECURSIVE tree AS (
    SELECT inhparent, inhrelid FROM pg_inherits WHERE inhparent = to_regclass(%s)
    UNION ALL
    SELECT i.inhparent, i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.inhrelid
)
SELECT tree.inhparent = to_regclass(%s), p.oid::regclass::text, c.oid::regclass::text, c.relkind
FROM tree JOIN pg_class p ON p.oid = tree.inhparent JOIN pg_class c ON c.oid = tree.inhrelid
ORDER BY 2, 3"""


async def partition_tree(conn: Connection, table: str) -> dict[str, list[str]]:
    """Each partitioned table under `table` (itself as written) → its partitions, at every depth."""
    tree: dict[str, list[str]] = {table: []}
    for is_root, parent, child, relkind in await conn.fetchall(_PARTITION_TREE, (table, table)):
        if relkind == "f":
            raise InputError(f"{child}, a partition of {table}, is a foreign table: it cannot be indexed "
                             "here (build the index by hand, leaving it out)")
        tree.setdefault(table if is_root else parent, []).append(child)
        if relkind == "p":
            tree.setdefault(child, [])
    return tree


async def expand(conn: Connection, plan: ApplyPlan) -> ApplyPlan:
    """The plan as it runs on this target: an index on a partitioned table becomes one index per
    leaf partition (CONCURRENTLY), ON ONLY on each partitioned table of the tree and the
    attachments, bottom-up (`partitioned_steps`), however deep the sub-partitioning goes."""
    steps: list[Step] = []
    for step in plan.steps:
        relkind = None
        if step.kind == "index" and step.table:
            relkind = await conn.fetchval("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)",
                                          (step.table,))
        if relkind != "p":
            steps.append(step)
            continue
        steps.extend(partitioned_steps(step, await partition_tree(conn, step.table or "")))
    return replace(plan, steps=tuple(steps))


_WRITES = """
WITH named AS (SELECT to_regclass(n) AS rel FROM unnest(%s::text[]) n),
rels AS (SELECT rel AS relid FROM named WHERE rel IS NOT NULL
         UNION SELECT t.relid FROM named, pg_partition_tree(named.rel) t WHERE named.rel IS NOT NULL)
SELECT coalesce(sum(s.n_tup_ins + s.n_tup_upd + s.n_tup_del), 0)::bigint,
       coalesce(sum(greatest(c.reltuples, s.n_live_tup, 0)), 0)::bigint
FROM rels JOIN pg_class c ON c.oid = rels.relid LEFT JOIN pg_stat_user_tables s ON s.relid = rels.relid"""
WRITE_SAMPLE_S = 5.0  # how long the write rate of a view's tables is sampled before approval


async def measure_writes(conn: Connection, tables: Sequence[str],
                         sample_s: float = WRITE_SAMPLE_S) -> tuple[float, int]:
    """Rows per second inserted, updated or deleted in `tables` (and their partitions) over
    `sample_s` on the target, from the statistics counters; and how many rows they hold.
    (The counters of other sessions reach the statistics within about a second.)"""
    before = await conn.fetchone(_WRITES, (list(tables),))
    started = trio.current_time()
    await trio.sleep(sample_s)
    after = await conn.fetchone(_WRITES, (list(tables),))
    assert before is not None and after is not None
    elapsed = trio.current_time() - started
    return max(0, after[0] - before[0]) / elapsed, int(after[1])


async def prepare(plan: ApplyPlan, target_dsn: str, sample_s: float = WRITE_SAMPLE_S) -> ApplyPlan:
    """The plan for this target, checked against it (`judge_statements`, `expand`, then
    `preflight`); a materialized
    view's refresh schedule gets the write rate of the tables it reads. Changes nothing."""
    async with open_connection(target_dsn) as conn:
        await judge_statements(conn, plan)
        expanded = await expand(conn, plan)
        await preflight(conn, expanded)
        if expanded.refresh is not None and expanded.refresh.reads:
            rate, rows = await measure_writes(conn, expanded.refresh.reads, sample_s)
            expanded = replace(expanded, refresh=replace(expanded.refresh, writes_per_s=rate, rows=rows,
                                                         sampled_s=sample_s))
    return expanded


async def _drop_invalid(conn: Connection, step: Step) -> str | None:
    """After a failed build: drop the invalid index CONCURRENTLY left behind, if there is one."""
    if step.kind != "index" or not step.name or step.rollback is None:
        return None
    valid = await conn.fetchval("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                                (step.name,))
    if valid is None or valid:
        return None
    await conn.execute(step.rollback)
    return f"the failed build left an invalid index {step.name}: dropped ({step.rollback})"


async def verify(conn: Connection, plan: ApplyPlan, query: str) -> tuple[list[str], list[str]]:
    """What is wrong after the build (empty: verified), and what was checked."""
    problems: list[str] = []
    checks: list[str] = []
    indexes = [s for s in plan.steps if s.kind == "index" and s.name]
    for step in [*indexes, *(s for s in plan.steps if s.kind == "index_parent")]:
        valid = await conn.fetchval("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                                    (step.name,))
        if not valid:
            problems.append(f"index {step.name} is not valid (indisvalid is false)")
    if indexes:
        checks.append("indexes valid (indisvalid)")
    nodes = list(_plan_nodes(await on_target(conn, query, plan_json)))
    used = {n.get("Index Name") for n in nodes} - {None}
    relations = {n.get("Relation Name") for n in nodes} - {None}
    table_indexes = [s for s in indexes if not any(_last(s.table or "") == _last(v.name or "")
                                                     for v in plan.steps if v.kind == "matview")]
    if table_indexes and not any(_last(s.name or "") in used for s in table_indexes):
        names = ", ".join(s.name or "" for s in table_indexes)
        problems.append(f"the query's plan on the target does not use {names} "
                        f"(it uses: {', '.join(sorted(str(u) for u in used)) or 'no index'})")
    if table_indexes:
        checks.append("the query's plan uses the index (EXPLAIN)")
    views = [s for s in plan.steps if s.kind == "matview" and s.name]
    if views and not any(_last(v.name or "") in relations for v in views):
        problems.append("the rewritten query's plan does not read the materialized view")
    if views:
        checks.append("the rewrite's plan reads the view (EXPLAIN)")
    for step in plan.steps:
        if step.kind == "statistics" and step.name:
            found = await conn.fetchval("SELECT 1 FROM pg_statistic_ext WHERE stxname = %s",
                                        (_last(step.name),))
            if not found:
                problems.append(f"statistics {step.name} are missing")
            else:
                checks.append(f"statistics {step.name} exist")
    return problems, checks


async def _run_rollback(conn: Connection, statements: list[str], progress: Progress) -> list[str]:
    done = []
    for sql in statements:
        progress(f"rollback: {sql}")
        await conn.execute(sql)
        done.append(sql)
    return done


async def apply_plan(plan: ApplyPlan, target_dsn: str, query: str,
                     progress: Progress = _quiet) -> Outcome:
    """Run the plan's steps on the target, verify, and roll back by itself when that fails.

    `query` is what the verification measures (the task's query, or the rewrite that reads a
    materialized view). Raises InputError before changing anything when the target does not
    match the plan (`preflight`), the target's catalog refuses its statements (UnsafeSqlError:
    `judge_statements`) or the task's query (afs.target.on_target), or another apply is running.
    """
    start = time.perf_counter()
    async with open_connection(target_dsn, statement_timeout_ms=0) as conn:
        await _try_lock(conn)
        try:
            await judge_statements(conn, plan)
            plan = await expand(conn, plan)
            await preflight(conn, plan)
            out = Outcome("applied", "", rollback=list(plan.rollback), planned=[s.sql for s in plan.steps])
            before = await measure(conn, plan.query)
            out.verification["before_ms"] = before
            executed: list[Step] = []
            failure: str | None = None
            for step in plan.steps:
                progress(f"running: {step.sql}")
                try:
                    await conn.execute(step.sql)
                except AfsError as exc:
                    failure = f"{step.sql} failed: {exc}"
                    dropped = await _drop_invalid(conn, step)
                    if dropped:
                        failure += f"; {dropped}"
                    break
                except trio.Cancelled:  # Ctrl-C: the build was cancelled on the server; leave nothing
                    undo = [s.rollback for s in reversed(executed) if s.rollback]
                    with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S) as cleanup:
                        await _drop_invalid(conn, step)
                        await _run_rollback(conn, undo, progress)
                    if cleanup.cancelled_caught:
                        progress(f"could not clean up within {CLEANUP_TIMEOUT_S:.0f} s (old transactions): "
                                 f"run {'; '.join(filter(None, [step.rollback, *undo]))}")
                    raise
                executed.append(step)
                out.executed.append(step.sql)
            if failure is None:
                try:
                    problems, checks = await verify(conn, plan, query)
                    if not problems:
                        out.verification["after_ms"] = await measure(conn, query)
                except AfsError as exc:  # refused or failed on the target: nothing stays applied
                    problems, checks = [str(exc)], []
                if problems:
                    failure = "verification failed: " + "; ".join(problems)
                else:
                    out.verification["verified"] = checks
            if failure is not None:
                undo = [s.rollback for s in reversed(executed) if s.rollback]
                out.rolled_back = await _run_rollback(conn, undo, progress)
                out.result = "failed"
                undone = f"; rolled back: {'; '.join(out.rolled_back)}" if out.rolled_back else ""
                out.detail = failure + undone
            else:
                after = out.verification.get("after_ms")
                out.detail = (f"verified: {', '.join(out.verification['verified'])}; the query took "
                              f"{_ms(before)} before, {_ms(after)} after (read-only on the target)")
        finally:
            await _unlock(conn)
    out.duration_s = round(time.perf_counter() - start, 3)
    return out


async def run_rollback(statements: list[str], target_dsn: str, progress: Progress = _quiet) -> Outcome:
    """Run recorded rollback statements on the target, under the same advisory lock."""
    start = time.perf_counter()
    out = Outcome("rolled_back", "")
    async with open_connection(target_dsn, statement_timeout_ms=0) as conn:
        await _try_lock(conn)
        try:
            for sql in statements:
                progress(f"rollback: {sql}")
                try:
                    await conn.execute(sql)
                except AfsError as exc:
                    out.result, out.detail = "failed", f"{sql} failed: {exc}"
                    break
                out.executed.append(sql)
        finally:
            await _unlock(conn)
    out.duration_s = round(time.perf_counter() - start, 3)
    if out.result == "rolled_back":
        out.detail = f"undone: {'; '.join(out.executed)}"
    return out
