"""The batch job: the target's costliest statements, each a stored task, one report.

    doc = await run_batch(rt, BatchTarget(dsn, source="afs_demo"), options=BatchOptions(top=5),
                          worker="batch")                         # tasks run here, in turn
    doc = await run_batch_on_server(store, settings, client, dsn=dsn,
                                    options=BatchOptions(top=5))  # by `afs serve`'s workers

Statements come from the target (read-only: pg_stat_statements, pg_stats, EXPLAIN, every
plan through `afs.target.on_target`, so a statement with a function the target's catalog
refuses is skipped with the reason, never planned); each is filled with values and
becomes a task like `afs optimize` makes, run here
by this worker in turn (or submitted to `afs serve` and waited for), against the
target's copy in the sandbox. The counters read are stored as a snapshot, so that a
later batch `--since` then ranks by what ran since (afs.batch.statements). A statement
whose last task (within `recent_days`) completed while the tables it reads had the
same schema (columns, indexes, extended statistics) is not run again: its earlier
result is reported (unless `force`). The report goes to the store and to
$AFS_HOME/reports/batch-ID.md and .json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import trio
from psycopg.types.json import Jsonb

from afs.batch.fill import fill_statement
from afs.batch.replay import per_day, table_oids, table_workload, window_seconds
from afs.batch.report import Entry, build_report, index_key, outcome, render_markdown
from afs.batch.statements import (
    BatchTarget,
    Counters,
    Snapshot,
    Statement,
    parse_since,
    read_counters,
    relations,
    select_workload,
    workload_of,
)
from afs.config import BATCH_PARAMETER_SETS, Settings
from afs.consensus import read_ms_saved_per_day_of
from afs.db import Connection, open_connection
from afs.errors import AfsError, InputError, ServiceError
from afs.events import Sink
from afs.models import StatementParameters, TaskResult, WorkloadWrite, WriteWorkload
from afs.optimize import new_task_id
from afs.report import write_cost_record
from afs.sandbox.importer import origin_of
from afs.service.client import ServiceClient
from afs.service.runner import Runtime, run_task
from afs.store import Store, TaskSubmission
from afs.store.codec import decode, encode
from afs.store.migrations import SCHEMA
from afs.task import MAX_WORKLOAD_WRITES, check_workload

REUSABLE = ("completed", "no_improvement")


@dataclass(frozen=True)
class BatchOptions:
    top: int = 10
    min_calls: int = 1
    min_mean_ms: float = 0.0
    force: bool = False
    provider: str = "auto"
    runs: int = 5
    recent_days: float = 7.0
    sets: int = BATCH_PARAMETER_SETS
    since: str | None = None  # --since as given: a duration (24h, 7d) or an ISO timestamp
    max_storage_mb: float | None = None  # --max-storage: one set chosen under it (afs.batch.budget)
    max_spend_usd: float | None = None  # one spending cap for the batch's model calls (--max-spend)

    def check(self) -> None:
        """InputError for options no batch can run with (before anything is read)."""
        select_workload("", (), top=self.top, min_calls=self.min_calls, min_mean_ms=self.min_mean_ms)
        if self.recent_days < 0:
            raise InputError(f"--recent-days must not be negative, got {self.recent_days}")
        if self.runs < 1:
            raise InputError(f"--runs must be at least 1, got {self.runs}")
        if self.since is not None:
            parse_since(self.since, datetime.now(UTC))
        if self.max_storage_mb is not None and not self.max_storage_mb >= 0:
            raise InputError(f"--max-storage must be a size of 0 or more, got {self.max_storage_mb} MB")
        if self.max_spend_usd is not None and not self.max_spend_usd >= 0:
            raise InputError(f"--max-spend must be US dollars, 0 or more, got {self.max_spend_usd}")


@dataclass(frozen=True)
class NewTask:
    """A statement the batch optimizes: what its task is given."""

    query: str  # the statement filled with the first parameter set
    parameters: StatementParameters | None  # every parameter set (the first is `query`'s)
    label: str  # "statement 2/5 (queryid 123…)", for progress


@dataclass(frozen=True)
class Ran:
    """What became of a NewTask (task_id None: the server refused to take it)."""

    task_id: str | None
    status: str
    error: str | None
    result: TaskResult | None


RunTasks = Callable[[Sequence[NewTask]], Awaitable[list[Ran]]]
SNAPSHOT_KEEP_DAYS = 90.0  # how far back `--since` can reach: older snapshots are deleted


_SCHEMA_SQL = """
WITH rel AS (SELECT to_regclass(n) AS oid FROM unnest(%s::text[]) n)
SELECT md5(coalesce(string_agg(x, E'\\n' ORDER BY x), '')) FROM (
    SELECT a.attrelid::regclass::text || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) x
    FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM rel) AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM rel)
    UNION ALL
    SELECT 'statistics ' || s.stxname FROM pg_statistic_ext s WHERE s.stxrelid IN (SELECT oid FROM rel)
) parts
"""


async def schema_hash(conn: Connection, query: str) -> str:
    """A fingerprint of the schema of the tables a statement reads."""
    return str(await conn.fetchval(_SCHEMA_SQL, (relations(query),)))


async def recent_task(store: Store, origin: str, queryid: int, schema: str, days: float) -> str | None:
    """The task that optimized this statement within `days`, with this schema, if any."""
    value = await store.conn.fetchval(
        f"SELECT s.task_id FROM {SCHEMA}.batch_statements s JOIN {SCHEMA}.tasks t ON t.id = s.task_id"
        " WHERE s.origin = %s AND s.queryid = %s AND s.schema_hash = %s AND t.status = ANY(%s)"
        " AND s.created_at > now() - make_interval(secs => %s) ORDER BY s.created_at DESC LIMIT 1",
        (origin, queryid, schema, list(REUSABLE), days * 86_400))
    return None if value is None else str(value)


async def batches(store: Store, limit: int = 20) -> list[dict[str, Any]]:
    rows = await store.conn.fetchall(
        f"SELECT id, origin, created_at, finished_at FROM {SCHEMA}.batches ORDER BY created_at DESC LIMIT %s",
        (limit,))
    return [{"id": r[0], "origin": r[1], "created_at": r[2].isoformat(),
             "finished_at": r[3].isoformat() if r[3] else None} for r in rows]


async def stored_batch(store: Store, batch_id: str) -> tuple[dict[str, Any] | None, str | None]:
    """A batch's report and Markdown (None, None while it runs); InputError when unknown."""
    row = await store.conn.fetchone(f"SELECT report, markdown FROM {SCHEMA}.batches WHERE id = %s",
                                    (batch_id,))
    if row is None:
        raise InputError(f"no batch {batch_id} in the store (see the reports in $AFS_HOME/reports/)")
    return (None if row[0] is None else dict(row[0])), row[1]


def _index_tables(entry: Entry) -> list[str]:
    keys = [index_key(sql) for sql in (entry.winner or {}).get("sql_commands", [])]
    return [k.table for k in keys if k is not None]


async def task_workloads(target: Connection, counters: Counters, statements: Sequence[Statement],
                         period_s: float) -> dict[int, WriteWorkload]:
    """By queryid: the workload's writes of the tables each statement reads (filled as the batch
    fills them, afs.batch.replay; at most MAX_WORKLOAD_WRITES, by total time; each checked as
    the API checks a task's, afs.task.check_workload, a write refused left out) with their calls
    a day, and the statement's own calls a day. What its task measures a new index's write cost
    on, in the agent's fork (afs.replay); a statement with no such write gets none. Each table's
    writes are filled up to twice the bound (the costliest first: pg_stat_statements' order)."""
    read = {st.queryid: relations(st.query) for st in statements}
    window = window_seconds(counters)
    names = sorted({t for tables in read.values() for t in tables})
    if not names:
        return {}
    work = await table_workload(target, counters, names, reads=False, limit=2 * MAX_WORKLOAD_WRITES)
    oids = await table_oids(target, names)
    out: dict[int, WriteWorkload] = {}
    for st in statements:
        mine = dict.fromkeys(oid for t in read[st.queryid] if (oid := oids.get(t)) in work)
        writes = sorted((w for oid in mine if oid is not None for w in work[oid].statements
                         if w.kind == "write"), key=lambda w: -w.total_ms)
        given: list[WorkloadWrite] = []
        for w in writes:
            one = WorkloadWrite(w.statement, w.query, w.table, w.calls, per_day(w.calls, window), w.values)
            try:
                check_workload(WriteWorkload((one,)), read[st.queryid])
            except InputError:
                continue
            given.append(one)
        if given:
            out[st.queryid] = WriteWorkload(tuple(given[:MAX_WORKLOAD_WRITES]), per_day(st.calls, period_s))
    return out


def task_write_cost(result: TaskResult | None) -> dict[str, Any] | None:
    """The winner's write cost as its task measured it in the agent's fork (what the consensus
    weighed: afs.consensus.index_write_cost), for the batch's JSON; None when it measured none."""
    decision = None if result is None else result.decision
    if result is None or decision is None or not decision.winner:
        return None
    chosen = next((o for o in result.outcomes if o.agent == decision.winner), None)
    if chosen is None or chosen.benchmark is None or chosen.benchmark.write_cost is None:
        return None
    return write_cost_record(chosen.benchmark.write_cost, read_ms_saved_per_day_of(chosen.benchmark))


def task_write_statements(result: TaskResult | None) -> list[str]:
    """The write statements (pg_stat_statements' text) a task was given for its write cost: those
    on its new index's table are what it replayed (the batch reuses the figure when they are the
    ones it would replay: afs.batch.indexes.task_figure)."""
    workload = None if result is None or result.parameters is None else result.parameters.workload
    return [] if workload is None else [w.statement for w in workload.writes]


def with_workload(parameters: StatementParameters | None,
                  workload: WriteWorkload | None) -> StatementParameters | None:
    """A task's parameter sets carrying its statement's workload of writes (when both exist)."""
    if parameters is None or workload is None:
        return parameters
    return dataclasses.replace(parameters, workload=workload)


async def snapshot_before(store: Store, origin: str, at: datetime) -> Snapshot | None:
    """The newest stored snapshot of the target's counters taken at or before `at`."""
    row = await store.conn.fetchone(
        f"SELECT id, taken_at, stats_reset FROM {SCHEMA}.statement_snapshots WHERE origin = %s"
        " AND taken_at <= %s ORDER BY taken_at DESC LIMIT 1", (origin, at))
    if row is None:
        return None
    counters = await store.conn.fetchall(
        f"SELECT queryid, calls, total_ms, rows FROM {SCHEMA}.statement_counters WHERE snapshot_id = %s",
        (row[0],))
    return Snapshot(row[1], row[2], {int(q): (int(c), float(t), int(r)) for q, c, t, r in counters})


async def store_snapshot(store: Store, origin: str, counters: Counters, batch_id: str | None) -> None:
    """Keep the counters just read, for a later `--since` (and forget those past the keep time)."""
    rows = [(q, calls, total, nrows) for q, _, calls, total, _, nrows in counters.rows if q is not None]

    def write(conn: psycopg.Connection[Any]) -> None:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(f"INSERT INTO {SCHEMA}.statement_snapshots (origin, taken_at, stats_reset, batch_id)"
                        " VALUES (%s, %s, %s, %s) RETURNING id",
                        (origin, counters.at, counters.stats_reset, batch_id))
            row = cur.fetchone()
            assert row is not None
            cur.executemany(f"INSERT INTO {SCHEMA}.statement_counters (snapshot_id, queryid, calls,"
                            " total_ms, rows) VALUES (%s, %s, %s, %s, %s)",
                            [(row[0], *r) for r in rows])
            cur.execute(f"DELETE FROM {SCHEMA}.statement_snapshots WHERE origin = %s"
                        " AND taken_at < %s::timestamptz - make_interval(secs => %s)",
                        (origin, counters.at, SNAPSHOT_KEEP_DAYS * 86_400))
    await store.conn.run(write)


async def run_batch(rt: Runtime, target: BatchTarget, *, options: BatchOptions, worker: str,
                    sinks: tuple[Sink, ...] = (),
                    progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """A batch on `target` whose tasks this worker runs, one after another."""
    async def run_here(tasks: Sequence[NewTask]) -> list[Ran]:
        ran = []
        for new in tasks:
            progress(f"{new.label}: optimizing")
            task = await rt.store.submit(
                TaskSubmission(task_id=new_task_id(), query=new.query, source=target.source,
                               dsn=target.task_dsn, task_type="query_optimization", priority="normal",
                               provider=options.provider, weights=None, runs=options.runs,
                               parameters=new.parameters),
                worker=worker, lease_s=rt.lease_s)
            finished = await run_task(rt, task, worker, sinks=sinks, on_interrupt="cancel")
            ran.append(Ran(task.id, finished.status, finished.error, finished.result))
        return ran

    return await _batch(rt.store, rt.settings, on=target, options=options, run_tasks=run_here,
                        progress=progress)


async def run_batch_here(settings: Settings, store_url: str, *, dsn: str | None, options: BatchOptions,
                         progress: Callable[[str], None] = lambda message: None,
                         sinks: tuple[Sink, ...] = ()) -> dict[str, Any]:
    """A batch on `dsn` (default: the sandbox's demo database) run in this process, with a
    runtime of its own; the sandbox serves the forks (it must be running). Interrupted, the
    running task is recorded as cancelled and its forks destroyed before the cancel goes on."""
    from afs.sandbox.importer import sandbox_source
    from afs.sandbox.server import dsn_for
    from afs.service.runner import relayed_cancellation
    from afs.service.worker import open_runtime, worker_name

    options.check()
    target = dsn if dsn is not None else dsn_for(settings, settings.demo_database)
    doc: dict[str, Any] | None = None
    async with relayed_cancellation() as work, open_runtime(settings, store_url) as rt:
        with work:
            rt.meter = batch_meter(options)  # one spending cap for every task of the batch
            source = await sandbox_source(rt.forks, settings.demo_database, dsn)
            doc = await run_batch(rt, BatchTarget(target, source, dsn), options=options,
                                  worker=worker_name("batch"), sinks=sinks, progress=progress)
    if doc is None:  # cancelled: the cancellation goes on at this checkpoint
        await trio.lowlevel.checkpoint()
        raise AfsError("the batch was interrupted")
    return doc


def batch_meter(options: BatchOptions) -> Any:
    """The batch's one SpendMeter (afs.brains.gemini.client) when --max-spend caps it: every
    task's squad counts against it, so the batch stops calling models once it is reached; None
    without a cap (each task then has the settings' own, gemini.max_spend_usd)."""
    if options.max_spend_usd is None:
        return None
    from afs.brains.gemini.client import SpendMeter  # the model SDK: only for a capped batch

    return SpendMeter(options.max_spend_usd)


async def run_batch_on_server(store: Store, settings: Settings, client: ServiceClient, *,
                              dsn: str | None, options: BatchOptions,
                              progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """A batch on `dsn` (default: the sandbox's demo database) whose tasks `afs serve` runs (its
    workers, in parallel); this process reads the target, waits for every task (following its
    events) and writes the report. The server must share this process's task store (checked
    first: the report links its tasks)."""
    from afs.sandbox.server import dsn_for

    health = await client.health()
    ours = await store.identity()
    if health.get("store") != ours:
        raise InputError(f"the AFS service at {client.url} uses another task store than this one "
                         "(the batch records its tasks with their ids): set AFS_STORE_URL to the "
                         "server's store" if health.get("store") else
                         f"the AFS service at {client.url} does not say which task store it uses "
                         "(an older version): upgrade it, or run the batch without --server")
    body: dict[str, Any] = {"priority": "normal", "type": "query_optimization",
                            "provider": options.provider, "runs": options.runs}
    if dsn is not None:
        body["dsn"] = dsn
    target = BatchTarget(dsn if dsn is not None else dsn_for(settings, settings.demo_database),
                         origin_of(dsn) if dsn else settings.demo_database, dsn)

    async def run_there(tasks: Sequence[NewTask]) -> list[Ran]:
        return await run_on_server(client, tasks, body, progress)

    return await _batch(store, settings, on=target, options=options, run_tasks=run_there,
                        progress=progress)


async def run_on_server(client: ServiceClient, tasks: Sequence[NewTask], body: dict[str, Any],
                        progress: Callable[[str], None]) -> list[Ran]:
    """Submit every task, then wait for all of them (one follower per task, in one nursery).
    Interrupted, the tasks not finished are cancelled on the server (their forks destroyed)."""
    ids: list[str | None] = []
    labels: dict[str, str] = {}
    done: dict[str, Ran] = {}
    refused: dict[int, Ran] = {}
    try:
        for n, new in enumerate(tasks):
            try:
                task = await client.submit({**body, "query": new.query, "parameters": None
                                            if new.parameters is None else encode(new.parameters)})
            except ServiceError as exc:
                if exc.status is None or exc.status >= 500:
                    raise
                refused[n] = Ran(None, "failed", str(exc), None)  # this statement's own input
                ids.append(None)
                continue
            ids.append(str(task["id"]))
            labels[str(task["id"])] = new.label
            progress(f"{new.label}: task {task['id']} queued on {client.url}")
        live = [t for t in ids if t is not None]

        async def follow(task_id: str) -> None:
            last = 0
            for attempt in (1, 2, 3):
                try:
                    async for event in client.events(task_id, after=last):
                        last = int(event.get("id") or last)
                        progress(f"[{len(done)}/{len(live)} finished] task {task_id}, {labels[task_id]}: "
                                 + phase_of(event))
                    break
                except ServiceError:
                    if attempt == 3:
                        raise
                    await trio.sleep(1.0)  # the stream broke: resume after the last event seen
            doc = await client.get(task_id)
            result = None if doc.get("result") is None else decode(TaskResult, doc["result"])
            done[task_id] = Ran(task_id, str(doc["task"]["status"]), doc["task"].get("error"), result)
            progress(f"[{len(done)}/{len(live)} finished] task {task_id}, {labels[task_id]}: "
                     f"{doc['task']['status']}")

        async with trio.open_nursery() as nursery:
            for task_id in live:
                nursery.start_soon(follow, task_id)
    finally:
        unfinished = [t for t in ids if t is not None and t not in done]
        if unfinished:
            with trio.CancelScope(shield=True), trio.move_on_after(15):
                for task_id in unfinished:
                    with contextlib.suppress(ServiceError):
                        await client.cancel(task_id)
    return [refused[n] if t is None else done[t] for n, t in enumerate(ids)]


def phase_of(event: dict[str, Any]) -> str:
    """A task's event as a progress phase: the agent and what it is doing (its phase: fork,
    analyse, propose, benchmark…), else the event's kind in words."""
    data = event.get("data") or {}
    who = f"{event['agent']}: " if event.get("agent") else ""
    if event.get("kind") == "agent_phase" and data.get("phase"):
        return f"{who}{data['phase']}"
    return f"{who}{str(event.get('kind', '')).replace('_', ' ')}"


async def _batch(store: Store, settings: Settings, *, on: BatchTarget, options: BatchOptions,
                 run_tasks: RunTasks, progress: Callable[[str], None]) -> dict[str, Any]:
    """Read and fill the workload, reuse recent results, run the rest (`run_tasks`), report."""
    options.check()
    target_dsn, source = on.dsn, on.source
    origin = origin_of(target_dsn)
    async with open_connection(target_dsn) as target:
        counters = await read_counters(target)
        since = None if options.since is None else parse_since(options.since, counters.at)
        snapshot = None if since is None else await snapshot_before(store, origin, since)
        workload = workload_of(counters, since, snapshot, top=options.top, min_calls=options.min_calls,
                               min_mean_ms=options.min_mean_ms)
        planned = []
        for st in workload.statements:
            progress(f"filling the parameters of statement {st.queryid}")
            planned.append((st, await fill_statement(target, st.query, options.sets),
                            await schema_hash(target, st.query)))
        progress("filling the writes of the tables the statements read (for new indexes' write costs)")
        try:
            task_writes = await task_workloads(target, counters, workload.statements, workload.period_s)
        except AfsError as exc:  # the tasks weigh the source's writes per read instead
            progress(f"the writes could not be filled: {str(exc).splitlines()[0]}")
            task_writes = {}
    batch_id = new_task_id()
    created = datetime.now(UTC)
    await store.conn.execute(
        f"INSERT INTO {SCHEMA}.batches (id, origin, created_at, options) VALUES (%s, %s, %s, %s)",
        (batch_id, origin, created, Jsonb(asdict(options))))
    await store_snapshot(store, origin, counters, batch_id)
    entries: list[Entry] = []
    results: list[TaskResult | None] = []
    todo: list[tuple[int, NewTask]] = []
    for n, (st, filled, schema) in enumerate(planned, 1):
        entry = Entry(st.queryid, st.query, st.calls, round(st.total_ms, 2), round(st.mean_ms, 3),
                      status="skipped", reason=filled.reason)
        result = None
        if filled.sets:
            entry.filled_query = filled.sets[0].query
            entry.parameter_sets = [s.label for s in filled.sets]
            earlier = None if options.force else await recent_task(
                store, origin, st.queryid, schema, options.recent_days)
            if earlier is not None:
                entry.status, entry.task_id, entry.reused_from = "reused", earlier, earlier
                result = await store.result(earlier)
            else:
                given = with_workload(filled.parameters(), task_writes.get(st.queryid))
                todo.append((len(entries), NewTask(entry.filled_query, given,
                                                   f"statement {n}/{len(planned)} ({st.queryid})")))
        entries.append(entry)
        results.append(result)
    for (index, _), ran in zip(todo, await run_tasks([new for _, new in todo]), strict=True):
        entry = entries[index]
        entry.task_id, entry.status, entry.reason = ran.task_id, ran.status, ran.error
        results[index] = ran.result
    for n, ((st, _, schema), entry) in enumerate(zip(planned, entries, strict=True)):
        entries[n] = outcome(entry, results[n], workload.period_s)
        in_task, won = task_write_cost(results[n]), entries[n].winner
        if in_task is not None and won is not None:
            won["write_cost_in_task"] = in_task  # as the consensus weighed it (afs.replay in the fork)
            in_task["writes"] = task_write_statements(results[n])  # what it was given (afs.batch.indexes)
        await store.conn.execute(
            f"INSERT INTO {SCHEMA}.batch_statements (batch_id, queryid, origin, query, schema_hash, task_id,"
            " status) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (batch_id, st.queryid, origin, st.query, schema, entry.task_id, entry.status))
    header = {"id": batch_id, "created_at": created.isoformat(timespec="seconds"),
              "database": workload.database, "origin": origin, "source": source,
              "provider": options.provider, "period_s": round(workload.period_s, 1),
              "window": workload.window.public() if workload.window else None,
              "options": asdict(options), "below_thresholds": workload.below_thresholds,
              "below": {"min_mean_ms": options.min_mean_ms, "min_calls": options.min_calls,
                        "mean_ms": workload.below_mean_ms, "calls": workload.below_calls,
                        "total_ms": workload.below_total_ms}}
    skipped = [{"queryid": s.queryid, "query": s.query, "reason": s.reason} for s in workload.skipped]
    tables = {t for e in entries for t in _index_tables(e)}
    async with open_connection(target_dsn) as target:
        writes = {t: int(n) for t in sorted(tables) if (n := await target.fetchval(
            "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relid = to_regclass(%s)",
            (t,))) is not None}
    doc = build_report(header, entries, skipped, writes)
    from afs.batch.indexes import batch_workload_review  # issue 28: new indexes' write costs, index review

    await batch_workload_review(doc, settings, target_dsn=target_dsn, source=source, counters=counters,
                                progress=progress)
    if options.max_storage_mb is not None:  # one set under the budget, measured together (issue 28)
        from afs.batch.budget import chosen_set

        doc["chosen_set"] = await chosen_set(doc, settings, on=on, counters=counters,
                                             budget_mb=options.max_storage_mb, progress=progress)
    markdown = render_markdown(doc)
    reports = settings.home / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / f"batch-{batch_id}.md").write_text(markdown)
    (reports / f"batch-{batch_id}.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    await store.conn.execute(
        f"UPDATE {SCHEMA}.batches SET finished_at = now(), report = %s, markdown = %s WHERE id = %s",
        (Jsonb(doc), markdown, batch_id))
    return doc
