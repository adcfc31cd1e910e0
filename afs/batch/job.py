"""The batch job: the target's costliest statements, each a stored task, one report.

    doc = await run_batch(rt, target_dsn=dsn, source="afs_demo", task_dsn=None,
                          options=BatchOptions(top=5))

Statements come from the target (read-only: pg_stat_statements, pg_stats, EXPLAIN);
each is filled with values and becomes a task like `afs optimize` makes, run here
by this worker in turn, against the target's copy in the sandbox. A statement
whose last task (within `recent_days`) completed while the tables it reads had the
same schema (columns, indexes, extended statistics) is not run again: its earlier
result is reported (unless `force`). The report goes to the store and to
$AFS_HOME/reports/batch-ID.md and .json.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb

from afs.batch.fill import DEFAULT_SETS, fill_statement
from afs.batch.report import Entry, build_report, index_key, outcome, render_markdown
from afs.batch.statements import read_workload, relations
from afs.db import Connection, open_connection
from afs.errors import InputError
from afs.events import Sink
from afs.optimize import new_task_id
from afs.sandbox.importer import origin_of
from afs.service.runner import Runtime, run_task
from afs.store import Store
from afs.store.migrations import SCHEMA

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
    sets: int = DEFAULT_SETS


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


async def run_batch(rt: Runtime, *, target_dsn: str, source: str, task_dsn: str | None,
                    options: BatchOptions, worker: str, sinks: tuple[Sink, ...] = (),
                    progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    origin = origin_of(target_dsn)
    async with open_connection(target_dsn) as target:
        workload = await read_workload(target, top=options.top, min_calls=options.min_calls,
                                       min_mean_ms=options.min_mean_ms)
        planned = []
        for st in workload.statements:
            progress(f"filling the parameters of statement {st.queryid}")
            planned.append((st, await fill_statement(target, st.query, options.sets),
                            await schema_hash(target, st.query)))
    batch_id = new_task_id()
    created = datetime.now(UTC)
    await rt.store.conn.execute(
        f"INSERT INTO {SCHEMA}.batches (id, origin, created_at, options) VALUES (%s, %s, %s, %s)",
        (batch_id, origin, created, Jsonb(asdict(options))))
    entries: list[Entry] = []
    for n, (st, filled, schema) in enumerate(planned, 1):
        entry = Entry(st.queryid, st.query, st.calls, round(st.total_ms, 2), round(st.mean_ms, 3),
                      status="skipped", reason=filled.reason)
        result = None
        if filled.sets:
            entry.filled_query = filled.sets[0].query
            entry.parameter_sets = [s.label for s in filled.sets]
            earlier = None if options.force else await recent_task(
                rt.store, origin, st.queryid, schema, options.recent_days)
            if earlier is not None:
                entry.status, entry.task_id, entry.reused_from = "reused", earlier, earlier
                result = await rt.store.result(earlier)
            else:
                progress(f"statement {n}/{len(planned)} ({st.queryid}): optimizing")
                task = await rt.store.submit(
                    task_id=new_task_id(), query=entry.filled_query, source=source, dsn=task_dsn,
                    task_type="query_optimization", priority="normal", provider=options.provider,
                    weights=None, runs=options.runs, worker=worker, lease_s=rt.lease_s,
                    parameters=filled.parameters())
                entry.task_id = task.id
                finished = await run_task(rt, task, worker, sinks=sinks, on_interrupt="cancel")
                entry.status, entry.reason, result = finished.status, finished.error, finished.result
        entries.append(outcome(entry, result, workload.period_s))
        await rt.store.conn.execute(
            f"INSERT INTO {SCHEMA}.batch_statements (batch_id, queryid, origin, query, schema_hash, task_id,"
            " status) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (batch_id, st.queryid, origin, st.query, schema, entry.task_id, entry.status))
    header = {"id": batch_id, "created_at": created.isoformat(timespec="seconds"),
              "database": workload.database, "origin": origin, "source": source,
              "provider": options.provider, "period_s": round(workload.period_s, 1),
              "options": asdict(options), "below_thresholds": workload.below_thresholds}
    skipped = [{"queryid": s.queryid, "query": s.query, "reason": s.reason} for s in workload.skipped]
    tables = {t for e in entries for t in _index_tables(e)}
    async with open_connection(target_dsn) as target:
        writes = {t: int(n) for t in sorted(tables) if (n := await target.fetchval(
            "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relid = to_regclass(%s)",
            (t,))) is not None}
    doc = build_report(header, entries, skipped, writes)
    markdown = render_markdown(doc)
    reports = rt.settings.home / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / f"batch-{batch_id}.md").write_text(markdown)
    (reports / f"batch-{batch_id}.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    await rt.store.conn.execute(
        f"UPDATE {SCHEMA}.batches SET finished_at = now(), report = %s, markdown = %s WHERE id = %s",
        (Jsonb(doc), markdown, batch_id))
    return doc
