"""`afs batch` end to end on the embedded PostgreSQL and the real store: the demo database's
workload read from pg_stat_statements, filled, one task per statement, deduplicated by
queryid, the report in the store and $AFS_HOME/reports/; and the report's index merging."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from afs.batch.job import BatchOptions, run_batch, stored_batch
from afs.batch.report import Entry, build_report, merge_indexes, render_markdown
from afs.batch.statements import BatchTarget
from afs.config import Settings
from afs.sandbox.server import SandboxServer
from afs.service.worker import open_runtime, worker_name
from afs.store import open_store
from afs.testing import run_afs_async

SLOW = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending' AND o.user_id = {u}"
        " ORDER BY o.created_at DESC")
COUNT = "SELECT count(*) FROM orders WHERE user_id = {u}"


def _workload(sandbox: SandboxServer, settings: Settings) -> None:
    with psycopg.connect(sandbox.dsn(settings.demo_database), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                     " WHERE datname = current_database()), 0)")
        for u in range(1, 41):
            conn.execute(SLOW.format(u=u).encode())
        for u in range(1, 6):
            conn.execute(COUNT.format(u=u).encode())


async def afs(*args: str, store_db: str) -> subprocess.CompletedProcess[bytes]:
    return await run_afs_async(*args, AFS_STORE_URL=store_db)


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_batch_optimizes_the_costliest_statements_once(settings: Settings, store_db: str,
                                                               sandbox: SandboxServer) -> None:
    try:
        await _batch_on_the_demo(settings, store_db, sandbox)
    finally:  # the demo database is shared by the whole session: leave it as it was
        with psycopg.connect(sandbox.dsn(settings.demo_database), autocommit=True) as conn:
            conn.execute("DROP EXTENSION IF EXISTS pg_stat_statements")


async def _batch_on_the_demo(settings: Settings, store_db: str, sandbox: SandboxServer) -> None:
    _workload(sandbox, settings)
    options = BatchOptions(top=2, min_calls=5, provider="heuristic", runs=1)
    target = sandbox.dsn(settings.demo_database)
    async with open_runtime(settings, store_db) as rt:
        doc = await run_batch(rt, BatchTarget(target, settings.demo_database, None),
                              options=options, worker=worker_name("batch"))
        statements = doc["statements"]
        assert [s["calls"] for s in statements] == [40, 5]  # ranked by total time, this database only
        slow = statements[0]
        assert "$1" in slow["query"] and "$" not in slow["filled_query"]
        assert slow["status"] == "completed" and slow["winner"] is not None
        assert slow["gain_pct"] > 0 and slow["saved_ms_per_day"] > 0
        task_ids = [s["task_id"] for s in statements]
        for s in statements:
            task = await rt.store.get(s["task_id"])  # each a stored task, run to its end
            assert task.finished and task.query == s["filled_query"]
        assert doc["indexes"] and all(set(i["statements"]) <= {s["queryid"] for s in statements}
                                      for i in doc["indexes"])
        assert all(isinstance(i["table_writes"], int) for i in doc["indexes"])  # read on the target
        assert doc["total_index_mb"] == pytest.approx(sum(i["size_mb"] for i in doc["indexes"]))
        report = settings.home / "reports" / f"batch-{doc['id']}.md"
        assert report.read_text() == render_markdown(doc)
        assert json.loads((report.with_suffix(".json")).read_text()) == json.loads(json.dumps(doc))
        stored, markdown = await stored_batch(rt.store, doc["id"])
        assert stored == json.loads(json.dumps(doc)) and markdown == report.read_text()

        again = await run_batch(rt, BatchTarget(target, settings.demo_database, None),
                                options=options, worker=worker_name("batch"))
        reused = [s for s in again["statements"] if s["status"] == "reused"]
        assert {s["task_id"] for s in reused} == {s["task_id"] for s in statements
                                                  if s["status"] in ("completed", "no_improvement")}
        assert reused and reused[0]["winner"] == next(
            s for s in statements if s["task_id"] == reused[0]["task_id"])["winner"]
        count = len(await rt.store.tasks(limit=100))
        forced = await run_batch(rt, BatchTarget(target, settings.demo_database, None),
                                 options=BatchOptions(top=1, min_calls=5, provider="heuristic", runs=1,
                                                      force=True), worker=worker_name("batch"))
        assert forced["statements"][0]["task_id"] not in task_ids
        assert len(await rt.store.tasks(limit=100)) == count + 1

    shown = await afs("batch", "show", doc["id"], "--json", store_db=store_db)
    assert shown.returncode == 0, shown.stderr.decode()
    assert json.loads(shown.stdout) == json.loads(json.dumps(doc))
    listed = await afs("batch", "list", "--json", store_db=store_db)
    assert listed.returncode == 0 and [b["id"] for b in json.loads(listed.stdout)][-1] == doc["id"]
    assert len(json.loads(listed.stdout)) == 3 and all(b["finished_at"] for b in json.loads(listed.stdout))
    missing = await afs("batch", "show", "nope", store_db=store_db)
    assert missing.returncode == 2 and b"no batch nope" in missing.stderr
    bad = await afs("batch", "--top", "0", store_db=store_db)
    assert bad.returncode == 2 and b"--top" in bad.stderr
    async with open_store(store_db) as store:
        assert len(await store.tasks(limit=100)) == count + 1  # bad input ran nothing


def test_indexes_serving_several_statements_are_merged_and_counted_once() -> None:
    def entry(queryid: int, sql: list[str], saved: float, size: float) -> Entry:
        e = Entry(queryid, f"SELECT {queryid}", 10, 1000.0, 100.0, "completed", task_id=str(queryid))
        e.winner = {"agent": "a", "proposal_type": "index", "sql_commands": sql, "rewritten_query": None,
                    "settings": []}
        e.saved_ms_per_day, e.storage_mb, e.gain_pct = saved, size, 50.0
        return e

    entries = [
        entry(1, ["CREATE INDEX a ON orders (user_id)"], 100.0, 2.0),
        entry(2, ["CREATE INDEX b ON public.orders USING btree (user_id, created_at DESC)"], 300.0, 3.0),
        entry(3, ["CREATE INDEX c ON orders (user_id)"], 50.0, 2.0),
        entry(4, ["CREATE INDEX d ON orders (status) WHERE status = 'pending'"], 10.0, 0.5),
        entry(5, ["CREATE INDEX e ON users (country)"], 20.0, 1.0),
    ]
    merged = merge_indexes(entries)
    assert [(m["statements"], m["saved_ms_per_day"]) for m in merged] == [
        ([2, 1, 3], 450.0), ([4], 10.0), ([5], 20.0)]
    assert merged[0]["replaces"] == ["CREATE INDEX a ON orders (user_id)",
                                     "CREATE INDEX c ON orders (user_id)"]
    unsolved = Entry(6, "SELECT 6", 1, 1.0, 1.0, "no_improvement", task_id="6")
    doc = build_report({"id": "x", "created_at": "now", "database": "db", "period_s": 3600.0,
                        "provider": "heuristic"}, [*entries, unsolved],
                       [{"queryid": 7, "query": "UPDATE t SET a = $1", "reason": "refused"}],
                       {"orders": 1234})
    assert doc["total_index_mb"] == 3.0 + 0.5 + 1.0  # the merged index once, the largest size
    assert [i["table_writes"] for i in doc["indexes"]] == [1234, 1234, None]
    assert doc["saved_ms_per_day"] == 480.0
    assert [(u["queryid"], u["status"]) for u in doc["unsolved"]] == [(6, "no_improvement"), (7, "skipped")]
    text = render_markdown(doc)
    assert text.count("1234 row writes to orders") == 2
    assert "serves 3 statement(s)" in text and "instead of `CREATE INDEX a" in text
