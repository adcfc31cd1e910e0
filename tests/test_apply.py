"""Applying a winner: the plan (pure), then the real thing on a target database in the embedded
server (a database of its own, playing the user's), with the real task store.

The stored tasks carry hand-made results (the shapes `afs optimize` records); everything from the
store on (plan, approval, CONCURRENTLY build under a concurrent writer, verification, automatic
rollback, audit, `afs rollback`) is the real code on real PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import psycopg
import pytest
import trio

from afs.apply import apply_winner, audit, load_plan, plan_winner, render_plan, rollback_task
from afs.apply.target import APPLY_LOCK_KEY, prepare
from afs.cli import main
from afs.config import Settings
from afs.errors import InputError
from afs.models import (
    AgentOutcome,
    AnalysisResult,
    BenchmarkOutcome,
    ConsensusDecision,
    EstimatedImpact,
    Measurement,
    OptimizationProposal,
    ParameterCheck,
    RoutingDecision,
    TaskResult,
    Timing,
)
from afs.optimize import new_task_id
from afs.sandbox.server import SandboxServer, dsn_for
from afs.store import Store, TaskSubmission, open_store

QUERY = "SELECT id, total FROM orders WHERE user_id = 42 ORDER BY created_at DESC"
AGENT = "gemini25pro"
STATS = "SELECT count(*) FROM pg_statistic_ext WHERE stxname = 'st_orders'"


# -- stored tasks with a winner ------------------------------------------------------------
def result_with(task_id: str, sql: tuple[str, ...], ptype: str = "index", *, query: str = QUERY,
                rewritten: str | None = None, settings: tuple[tuple[str, str], ...] = (),
                checks: tuple[ParameterCheck, ...] = (), status: str = "completed") -> TaskResult:
    timing = Measurement("baseline", Timing(40.0, 1.0, 5, 900), Timing(0.5, 0.1, 5, 4), 20, True, True)
    proposal = OptimizationProposal(
        agent=AGENT, proposal_type=ptype, sql_commands=sql,  # type: ignore[arg-type]
        rollback_commands=(), rationale="test winner", estimated_impact=EstimatedImpact(90, 1, "low", "low"),
        rewritten_query=rewritten, settings=settings)
    outcome = AgentOutcome(
        agent=AGENT, status="ok", fork="afs-fork-x",
        analysis=AnalysisResult(insights=(), proposed_actions=(), confidence=0.8), proposal=proposal,
        benchmark=BenchmarkOutcome((timing,), storage_before_mb=10.0, storage_after_mb=12.5,
                                   parameter_checks=checks, apply_s=0.8))
    return TaskResult(
        task_id=task_id, status=status, query=query, source="afs_demo",  # type: ignore[arg-type]
        routing=RoutingDecision((AGENT,), ("test",)), outcomes=(outcome,),
        decision=ConsensusDecision(AGENT, {}, (AGENT,), ("the only one",), 0.9),
        provider="heuristic", provider_note="", duration_s=1.0)


async def stored(store: Store, sql: tuple[str, ...], ptype: str = "index", **kwargs: object) -> str:
    task_id = new_task_id()
    await store.submit(TaskSubmission(task_id=task_id, query=str(kwargs.get("query", QUERY)),
                                      source="afs_demo", dsn=None, task_type="query_optimization",
                                      priority="normal", provider="heuristic", weights=None, runs=2),
                       worker="t", lease_s=30)
    result = result_with(task_id, sql, ptype, **kwargs)  # type: ignore[arg-type]
    assert await store.finish(task_id, "t", status=result.status, result=result)
    return task_id


# -- fixtures: a target database, the store -------------------------------------------------
@pytest.fixture
def target(sandbox: SandboxServer, settings: Settings) -> Iterator[str]:
    """The user's database: its own database in the embedded server, orders with 200k rows."""
    name = "afs_apply_t_" + os.urandom(4).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, user_id int NOT NULL,"
                         " status text NOT NULL,"
                         " total numeric NOT NULL, created_at timestamptz NOT NULL)")
            conn.execute("INSERT INTO orders (user_id, status, total, created_at) SELECT g % 2000,"
                         " (ARRAY['pending','shipped','delivered'])[g % 3 + 1], g % 500,"
                         " now() - g * interval '1 minute' FROM generate_series(1, 200000) g")
            conn.execute("VACUUM ANALYZE orders")
        # a password in the DSN: the socket trusts the user, and the audit must never show it
        yield dsn_for(settings, name, password="s3cret-pw")
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def store(store_db: str) -> AsyncIterator[Store]:
    async with open_store(store_db) as opened:
        yield opened


def indexes(dsn: str) -> dict[str, bool]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT c.relname, i.indisvalid FROM pg_index i"
                            " JOIN pg_class c ON c.oid = i.indexrelid"
                            " WHERE i.indrelid = 'orders'::regclass").fetchall()
    return {r[0]: r[1] for r in rows}


# -- the plan (pure) -------------------------------------------------------------------------
def test_an_index_plan_is_concurrent_with_its_lock_tier_rollback_and_fork_figures() -> None:
    sql = "CREATE INDEX IF NOT EXISTS ix_u ON orders (user_id, created_at)"
    plan = plan_winner(result_with("t1", (sql,)))
    assert plan.tier == "T2" and plan.kind == "index" and plan.applicable
    assert [s.sql for s in plan.steps] == ["CREATE INDEX CONCURRENTLY ix_u ON orders (user_id, created_at)"]
    assert plan.rollback == ("DROP INDEX CONCURRENTLY IF EXISTS ix_u",)
    assert plan.steps[0].columns == ("user_id", "created_at") and plan.steps[0].table == "orders"
    assert (plan.build_s, plan.storage_mb, plan.fork_ms) == (0.8, 2.5, 0.5)
    text = render_plan(plan)
    assert "SHARE UPDATE EXCLUSIVE" in text and "T2 DDL" in text and "build 0.80 s, adds 2.5 MB" in text


def test_settings_rewrites_and_partitioning_are_advice_and_unsafe_sql_is_blocked() -> None:
    settings = plan_winner(result_with("t2", (), "settings", settings=(("work_mem", "64MB"),)))
    assert settings.tier == "T0" and not settings.applicable and not settings.steps
    assert "  SET LOCAL work_mem = '64MB';" in settings.advice
    assert any("ALTER ROLE <role> SET work_mem = '64MB'" in a for a in settings.advice)

    checks = (ParameterCheck("user_id = 7 (a rare value)", True, False, rows=3),
              ParameterCheck("user_id = 1 (most common value)", True, False, rows=100))
    rewrite = plan_winner(result_with("t3", (), "query_rewrite", rewritten="SELECT 1", checks=checks))
    assert rewrite.tier == "T0" and rewrite.kind == "rewrite" and "  SELECT 1" in rewrite.advice
    assert "  user_id = 7 (a rare value): same rows" in rewrite.advice
    assert any("on 2 of 2 other parameter sets" in a for a in rewrite.advice)

    part = plan_winner(result_with("t4", ("CREATE TABLE orders_p (LIKE orders)"
                                          " PARTITION BY RANGE (created_at)",),
                                   "partitioning"))
    assert part.tier == "T3" and not part.applicable and "CREATE TABLE orders_p" in "\n".join(part.advice)

    blocked = plan_winner(result_with("t5", ("DROP TABLE orders",), "index"))
    assert blocked.tier == "T3" and blocked.kind == "blocked" and blocked.refused

    view = plan_winner(result_with("t6", ("CREATE MATERIALIZED VIEW mv AS SELECT user_id, count(*)"
                                          " FROM orders"
                                          " GROUP BY user_id", "CREATE UNIQUE INDEX mv_u ON mv (user_id)"),
                                   "materialized_view", rewritten="SELECT * FROM mv"))
    assert view.kind == "materialized_view" and view.tier == "T2"
    assert view.rollback == ("DROP INDEX CONCURRENTLY IF EXISTS mv_u", "DROP MATERIALIZED VIEW IF EXISTS mv")
    assert view.refresh is not None and view.refresh.reads == ("orders",)
    assert view.refresh.commands() == ("REFRESH MATERIALIZED VIEW CONCURRENTLY mv",)  # it has a unique index

    with pytest.raises(InputError, match="only the winner of a completed task"):
        plan_winner(result_with("t7", ("CREATE INDEX ix ON orders (user_id)",), status="no_improvement"))


# -- on the target -------------------------------------------------------------------------------
async def test_applied_concurrently_while_writes_continue_verified_audited_then_rolled_back(
        store: Store, target: str) -> None:
    task_id = await stored(store, ("CREATE INDEX ix_orders_user ON orders (user_id, created_at)",))
    plan = await load_plan(store, task_id)
    writes: list[float] = []
    done = trio.Event()

    async def writer() -> None:  # a user's application, writing all through the build
        from afs.db import open_connection

        async with open_connection(target) as conn:
            while not done.is_set():
                await conn.execute("INSERT INTO orders (user_id, status, total, created_at)"
                                   " VALUES (42, 'pending', 1, now())")
                writes.append(trio.current_time())
                await trio.sleep(0.005)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.sleep(0.2)
        started = trio.current_time()
        row = await apply_winner(store, plan, target, approver="alice")
        finished = trio.current_time()
        done.set()
    assert row["result"] == "applied", row["detail"]
    assert any(started < t < finished for t in writes), "writes stopped during the build"
    assert indexes(target)["ix_orders_user"] is True
    assert row["verification"]["before_ms"] > 0 and row["verification"]["after_ms"] > 0
    assert row["sql_commands"] == ["CREATE INDEX CONCURRENTLY ix_orders_user ON orders (user_id, created_at)"]
    assert row["rollback_sql"] == ["DROP INDEX CONCURRENTLY IF EXISTS ix_orders_user"]
    assert row["approver"] == "alice" and row["tier"] == "T2" and row["duration_s"] > 0
    assert "s3cret-pw" not in row["target"] and "***" in row["target"]

    with pytest.raises(InputError, match="applied already"):  # double apply
        await apply_winner(store, plan, target, approver="alice")
    assert [r["result"] for r in await audit.entries(store, task_id)] == ["refused", "applied"]

    undone = await rollback_task(store, task_id, target, approver="bob")
    assert undone["result"] == "rolled_back" and undone["approver"] == "bob"
    assert "ix_orders_user" not in indexes(target)
    with pytest.raises(InputError, match="nothing applied"):
        await rollback_task(store, task_id, target, approver="bob")
    again = await apply_winner(store, plan, target, approver="alice")  # after a rollback: again
    assert again["result"] == "applied"


async def test_a_failed_verification_rolls_back_by_itself(store: Store, target: str) -> None:
    # an index the task's query cannot use on this target: built, then dropped again, with the reason
    task_id = await stored(store, ("CREATE INDEX ix_orders_total ON orders (total)",))
    row = await apply_winner(store, await load_plan(store, task_id), target, approver="alice")
    assert row["result"] == "failed"
    assert "does not use ix_orders_total" in row["detail"]
    assert "rolled back: DROP INDEX CONCURRENTLY IF EXISTS ix_orders_total" in row["detail"]
    assert "ix_orders_total" not in indexes(target)
    assert await audit.applied(store, task_id) is None


async def test_a_failed_build_drops_its_invalid_index(store: Store, target: str) -> None:
    # a unique index on a column with duplicates: CONCURRENTLY fails and leaves an invalid index behind
    task_id = await stored(store, ("CREATE UNIQUE INDEX ix_orders_user_u ON orders (user_id)",))
    row = await apply_winner(store, await load_plan(store, task_id), target, approver="alice")
    assert row["result"] == "failed"
    assert "left an invalid index ix_orders_user_u: dropped" in row["detail"]
    assert "ix_orders_user_u" not in indexes(target)


async def test_ctrl_c_during_the_build_leaves_no_index_and_is_audited(store: Store, target: str) -> None:
    task_id = await stored(store, ("CREATE INDEX ix_orders_cancel ON orders (user_id)",))
    plan = await load_plan(store, task_id)
    with psycopg.connect(target) as holder:  # an old snapshot: CONCURRENTLY waits for it to end
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM orders")

        async def end_the_old_transaction() -> None:  # the cleanup's DROP waits for it too
            await trio.sleep(4)
            await trio.to_thread.run_sync(holder.rollback)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(end_the_old_transaction)
            with trio.move_on_after(3) as scope:  # Ctrl-C while the build waits
                await apply_winner(store, plan, target, approver="alice")
        assert scope.cancelled_caught, "the build did not wait for the old snapshot"
    assert "ix_orders_cancel" not in indexes(target)
    rows = await audit.entries(store, task_id)
    assert [(r["result"], r["detail"]) for r in rows] == [("failed", "interrupted: rolled back")]


async def test_refused_when_the_schema_changed_or_another_apply_runs(store: Store, target: str) -> None:
    task_id = await stored(store, ("CREATE INDEX ix_orders_discount ON orders (discount)",))
    with pytest.raises(InputError, match="no column discount"):
        await apply_winner(store, await load_plan(store, task_id), target, approver="alice")
    assert "ix_orders_discount" not in indexes(target)

    other = await stored(store, ("CREATE INDEX ix_orders_user2 ON orders (user_id)",))
    with psycopg.connect(target, autocommit=True) as holder:  # another apply holds the database
        holder.execute("SELECT pg_advisory_lock(%s)", (APPLY_LOCK_KEY,))
        with pytest.raises(InputError, match="another afs apply"):
            await apply_winner(store, await load_plan(store, other), target, approver="alice")
    assert "ix_orders_user2" not in indexes(target)
    results = [(r["task_id"], r["result"]) for r in await audit.entries(store)]
    assert results == [(other, "refused"), (task_id, "refused")]


async def test_an_index_on_a_partitioned_table_is_built_per_partition_then_attached(
        store: Store, target: str) -> None:
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint, user_id int, at date) PARTITION BY RANGE (at)")
        for year in (2024, 2025, 2026):
            conn.execute(f"CREATE TABLE events_{year} PARTITION OF events"
                         f" FOR VALUES FROM ('{year}-01-01') TO ('{year + 1}-01-01')")
        conn.execute("INSERT INTO events SELECT g, g % 5000, date '2024-01-01' + (g % 1000)"
                     " FROM generate_series(1, 150000) g")
        conn.execute("ANALYZE events")
    task_id = await stored(store, ("CREATE INDEX ix_events_user ON events (user_id)",),
                           query="SELECT id FROM events WHERE user_id = 42")
    row = await apply_winner(store, await load_plan(store, task_id), target, approver="alice")
    assert row["result"] == "applied", row["detail"]
    first = "CREATE INDEX CONCURRENTLY ix_events_user_events_2024 ON events_2024 (user_id)"
    assert row["sql_commands"][0] == first
    assert "CREATE INDEX ix_events_user ON ONLY events (user_id)" in row["sql_commands"]
    assert row["sql_commands"][-1] == "ALTER INDEX ix_events_user ATTACH PARTITION ix_events_user_events_2026"
    with psycopg.connect(target) as conn:
        valid = conn.execute("SELECT c.relname, i.indisvalid FROM pg_index i"
                             " JOIN pg_class c ON c.oid = i.indexrelid"
                             " WHERE c.relname LIKE 'ix_events_user%' ORDER BY 1").fetchall()
    assert valid == [("ix_events_user", True), ("ix_events_user_events_2024", True),
                     ("ix_events_user_events_2025", True), ("ix_events_user_events_2026", True)]
    assert row["rollback_sql"][0] == "DROP INDEX IF EXISTS ix_events_user"
    undone = await rollback_task(store, task_id, target, approver="alice")
    assert undone["result"] == "rolled_back", undone["detail"]
    with psycopg.connect(target) as conn:
        left = conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'ix_events_user%'").fetchone()
    assert left == (0,)


async def test_statistics_are_created_and_analyzed(store: Store, target: str) -> None:
    task_id = await stored(store, ("CREATE STATISTICS st_orders (dependencies) ON user_id, status"
                                   " FROM orders",
                                   "ANALYZE orders"), "statistics")
    row = await apply_winner(store, await load_plan(store, task_id), target, approver="alice")
    assert row["result"] == "applied", row["detail"]
    with psycopg.connect(target) as conn:
        assert conn.execute(STATS).fetchone() == (1,)
    await rollback_task(store, task_id, target, approver="alice")
    with psycopg.connect(target) as conn:
        assert conn.execute(STATS).fetchone() == (0,)


TARGET_OF_STATUS = ("SELECT attstattarget FROM pg_attribute"
                    " WHERE attrelid = 'orders'::regclass AND attname = 'status'")


async def test_a_statistics_target_is_set_with_its_index_and_reset_by_the_rollback(
        store: Store, target: str) -> None:
    task_id = await stored(store, ("CREATE INDEX ix_orders_user_id ON orders (user_id)",
                                   "ALTER TABLE orders ALTER COLUMN status SET STATISTICS 1500",
                                   "ANALYZE orders (status)"), "index")
    plan = await load_plan(store, task_id)
    assert [s.kind for s in plan.steps] == ["index", "statistics_target", "analyze"]
    row = await apply_winner(store, plan, target, approver="alice")
    assert row["result"] == "applied", row["detail"]
    with psycopg.connect(target) as conn:
        assert conn.execute(TARGET_OF_STATUS).fetchone() == (1500,)
    await rollback_task(store, task_id, target, approver="alice")
    with psycopg.connect(target) as conn:
        assert conn.execute(TARGET_OF_STATUS).fetchone() in ((None,), (-1,))  # the default again
        assert conn.execute("SELECT to_regclass('ix_orders_user_id')").fetchone() == (None,)


async def test_a_materialized_view_is_created_with_its_index_and_read_by_the_rewrite(
        store: Store, target: str) -> None:
    view = ("CREATE MATERIALIZED VIEW mv_user_totals AS SELECT user_id, count(*) AS n, sum(total) AS total"
            " FROM orders GROUP BY user_id")
    task_id = await stored(store, (view, "CREATE UNIQUE INDEX mv_user_totals_u ON mv_user_totals (user_id)"),
                           "materialized_view", query="SELECT user_id, count(*), sum(total) FROM orders"
                           " WHERE user_id = 42 GROUP BY user_id",
                           rewritten="SELECT user_id, n, total FROM mv_user_totals WHERE user_id = 42")
    plan = await load_plan(store, task_id)
    done = trio.Event()

    async def writer() -> None:  # the application writes to the table the view reads
        from afs.db import open_connection

        async with open_connection(target) as conn:
            while not done.is_set():
                await conn.execute("INSERT INTO orders (user_id, status, total, created_at)"
                                   " VALUES (4242, 'pending', 1, now())")  # not the user the query reads
                await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        plan = await prepare(plan, target, sample_s=3)  # before approval: the write rate is sampled
        done.set()
    assert plan.refresh is not None and plan.refresh.rows is not None and plan.refresh.rows >= 200_000
    assert plan.refresh.writes_per_s is not None and plan.refresh.writes_per_s > 5
    text = render_plan(plan)
    assert "REFRESH MATERIALIZED VIEW CONCURRENTLY mv_user_totals;" in text
    assert "orders change" in text and "rows/s (sampled 3 s)" in text and "cron.schedule(" in text
    row = await apply_winner(store, plan, target, approver="alice")
    assert row["result"] == "applied", row["detail"]
    with psycopg.connect(target) as conn:
        assert conn.execute("SELECT n FROM mv_user_totals WHERE user_id = 42").fetchone() == (100,)
    assert row["rollback_sql"] == ["DROP INDEX CONCURRENTLY IF EXISTS mv_user_totals_u",
                                   "DROP MATERIALIZED VIEW IF EXISTS mv_user_totals"]
    await rollback_task(store, task_id, target, approver="alice")
    with psycopg.connect(target) as conn:
        assert conn.execute("SELECT to_regclass('mv_user_totals')").fetchone() == (None,)


# -- the HTTP API ----------------------------------------------------------------------------
async def test_post_apply_needs_an_approver_applies_and_refuses_a_second_time(
        nursery: trio.Nursery, settings: Settings, store: Store, store_db: str, target: str) -> None:
    import httpx

    from afs.serve import run_service

    task_id = new_task_id()  # a task on the target (its DSN stored without the password)
    await store.submit(TaskSubmission(task_id=task_id, query=QUERY, source="afs_demo", dsn=target,
                                      task_type="query_optimization", priority="normal", provider="heuristic",
                                      weights=None, runs=2), worker="t", lease_s=30)
    assert await store.finish(task_id, "t", status="completed", result=result_with(
        task_id, ("CREATE INDEX ix_api ON orders (user_id, created_at)",)))
    urls = await nursery.start(partial(run_service, settings.with_(store_url=store_db, service_token="tok"),
                                       bind="127.0.0.1:0", workers=0, lease_s=5))
    url = next(u for u in urls if u.startswith("http://127.0.0.1"))
    async with httpx.AsyncClient(base_url=url, timeout=60, headers={"Authorization": "Bearer tok"}) as http:
        missing = await http.post(f"/v1/tasks/{task_id}/apply", json={"dsn": target})
        assert missing.status_code == 422 and missing.json()["field"] == "approver"
        assert "ix_api" not in indexes(target)
        done = await http.post(f"/v1/tasks/{task_id}/apply", json={"approver": "carol", "dsn": target})
        assert done.status_code == 200, done.text
        body = done.json()
        assert body["applied"] is True and body["audit"]["approver"].endswith(" (carol)")
        assert "s3cret-pw" not in done.text
        assert indexes(target)["ix_api"] is True
        again = await http.post(f"/v1/tasks/{task_id}/apply", json={"approver": "carol", "dsn": target})
        assert again.status_code == 409 and "applied already" in again.json()["error"]
        assert [r["result"] for r in await audit.entries(store, task_id)] == ["refused", "applied"]
        unknown = await http.post("/v1/tasks/nosuch/apply", json={"approver": "carol", "dsn": target})
        assert unknown.status_code == 404


# -- the command line ----------------------------------------------------------------------
def test_cli_refuses_without_a_terminal_then_applies_with_yes_audits_and_rolls_back(
        store_db: str, target: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def setup() -> str:
        async with open_store(store_db) as s:
            return await stored(s, ("CREATE INDEX ix_cli ON orders (user_id, created_at)",))

    task_id = trio.run(setup)
    env = {**os.environ, "AFS_STORE_URL": store_db}
    proc = subprocess.run([sys.executable, "-m", "afs", "apply", task_id, "--dsn", target],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).parent.parent)
    assert proc.returncode == 2, proc.stderr
    assert "no terminal" in proc.stderr and "CREATE INDEX CONCURRENTLY ix_cli" in proc.stdout
    assert "ix_cli" not in indexes(target)

    monkeypatch.setenv("AFS_STORE_URL", store_db)  # the environment, read by load_settings
    assert main(["apply", task_id, "--dsn", target, "--yes", "--approver", "me", "--json"]) == 0
    assert indexes(target)["ix_cli"] is True
    capsys.readouterr()
    assert main(["audit", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert [(r["action"], r["result"], r["approver"]) for r in rows] == [("apply", "applied", "me")]
    assert main(["rollback", task_id, "--dsn", target, "--yes", "--approver", "me"]) == 0
    assert "ix_cli" not in indexes(target)
    assert main(["apply", "nosuchtask", "--dsn", target, "--yes"]) == 2


def test_cli_asks_at_a_terminal_and_a_no_applies_nothing(store_db: str, target: str) -> None:
    import pty

    async def setup() -> str:
        async with open_store(store_db) as s:
            return await stored(s, ("CREATE INDEX ix_tty ON orders (user_id)",))

    task_id = trio.run(setup)
    main_fd, terminal_fd = pty.openpty()  # a terminal, as a person has one
    try:
        proc = subprocess.Popen([sys.executable, "-m", "afs", "apply", task_id, "--dsn", target,
                                 "--approver", "dave"], stdin=terminal_fd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "AFS_STORE_URL": store_db},
                                cwd=Path(__file__).parent.parent)
        os.write(main_fd, b"n\n")
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(main_fd)
        os.close(terminal_fd)
    assert proc.returncode == 1, err
    assert "[y/N]" in out and "not applied: not approved" in out
    assert "ix_tty" not in indexes(target)

    async def rows() -> list[dict[str, object]]:
        async with open_store(store_db) as s:
            return await audit.entries(s, task_id)

    found = trio.run(rows)
    assert [(r["result"], r["approver"], r["detail"]) for r in found] == [
        ("refused", "dave", "not approved at the terminal")]


def test_cli_prints_advice_for_settings_and_partitioning_and_blocks_unsafe_sql(
        store_db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    async def setup() -> list[str]:
        async with open_store(store_db) as s:
            return [await stored(s, (), "settings", settings=(("work_mem", "128MB"),)),
                    await stored(s, ("CREATE TABLE orders_p (LIKE orders) PARTITION BY RANGE (created_at)",),
                                 "partitioning"),
                    await stored(s, ("DROP TABLE orders",), "index")]

    settings_task, partition_task, unsafe_task = trio.run(setup)
    monkeypatch.setenv("AFS_STORE_URL", store_db)
    assert main(["apply", settings_task, "--dsn", "postgresql://nowhere/x"]) == 0
    out = capsys.readouterr().out
    assert "SET LOCAL work_mem = '128MB';" in out and "nothing applied" in out
    assert main(["apply", partition_task, "--dsn", "postgresql://nowhere/x"]) == 0
    out = capsys.readouterr().out
    assert "never run by afs apply" in out and "CREATE TABLE orders_p" in out
    assert main(["apply", unsafe_task, "--dsn", "postgresql://nowhere/x"]) == 2
    assert "refused:" in capsys.readouterr().out


# -- the whole flow, as a person runs it --------------------------------------------------------
def test_import_optimize_apply_while_writing_audit_and_rollback_on_the_users_database(
        sandbox: SandboxServer, store_db: str, target: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`afs sandbox import`, `afs optimize --dsn`, `afs apply --yes` while the application writes,
    `afs audit`, `afs rollback` (its database resolved from the configuration: the store keeps
    no password), all through the command line on the user's database (`target`)."""
    import json
    import threading
    import time

    from afs.forks.provider import LocalForkProvider

    monkeypatch.setenv("AFS_STORE_URL", store_db)
    copy = "afs_apply_copy_" + os.urandom(3).hex()

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(argv))
        return code, capsys.readouterr().out

    try:
        assert run("sandbox", "import", "--from", target, "--as", copy)[0] == 0
        code, out = run("optimize", "--dsn", target, "--query", QUERY, "--provider", "heuristic",
                        "--runs", "2", "--json")
        assert code == 0, out
        report = json.loads(out)
        assert report["status"] == "completed" and report["source"] == copy
        task_id = report["task_id"]

        writes: list[float] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def application() -> None:  # the user's application, writing all through the build
            try:
                with psycopg.connect(target, autocommit=True) as conn:
                    while not stop.is_set():
                        conn.execute("INSERT INTO orders (user_id, status, total, created_at)"
                                     " VALUES (42, 'pending', 1, now())")
                        writes.append(time.monotonic())
                        time.sleep(0.005)
            except BaseException as exc:
                errors.append(exc)

        writer = threading.Thread(target=application)
        writer.start()
        try:
            time.sleep(0.2)
            started = time.monotonic()
            code, out = run("apply", task_id, "--dsn", target, "--yes", "--approver", "me", "--json")
            finished = time.monotonic()
        finally:
            stop.set()
            writer.join(30)
        assert code == 0, out
        applied = json.loads(out)
        assert applied["applied"] is True and not errors
        assert any(started < t < finished for t in writes), "writes stopped during the apply"
        [index] = [s["sql"] for s in applied["plan"]["steps"]]
        assert index.startswith("CREATE INDEX CONCURRENTLY ") and " ON orders " in index
        name = index.split()[3]
        assert indexes(target)[name] is True
        with psycopg.connect(target) as conn:  # the rows written during the build are in the index
            count = "SELECT count(*) FROM orders WHERE user_id = 42"
            conn.execute("SET enable_seqscan = off")
            assert name in str(conn.execute(f"EXPLAIN {count}").fetchall())
            by_index = conn.execute(count).fetchone()
            conn.execute("RESET enable_seqscan")
            conn.execute("SET enable_indexscan = off")
            conn.execute("SET enable_bitmapscan = off")
            assert name not in str(conn.execute(f"EXPLAIN {count}").fetchall())
            by_table = conn.execute(count).fetchone()
        assert by_index == by_table

        code, out = run("audit", "--json")
        [row] = json.loads(out)
        assert (row["task_id"], row["action"], row["result"], row["approver"]) == (task_id, "apply",
                                                                                  "applied", "me")
        assert "s3cret-pw" not in row["target"] and row["sql_commands"] == [index]

        # the store has no password for the target; a --dsn naming another database is refused
        # (without one, libpq would look for the password as psql does: test_a_recorded_target_…)
        assert run("rollback", task_id, "--yes", "--approver", "me", "--dsn", sandbox.dsn(copy))[0] == 2
        assert name in indexes(target)
        monkeypatch.setenv("AFS_DATABASE_URL", target)  # the configured DSN names that database
        code, out = run("rollback", task_id, "--yes", "--approver", "me")
        assert code == 0, out
        assert name not in indexes(target)
        code, out = run("audit", "--json", "--task", task_id)
        assert [(r["action"], r["result"]) for r in json.loads(out)] == [("rollback", "rolled_back"),
                                                                         ("apply", "applied")]
    finally:
        trio.run(LocalForkProvider(sandbox.dsn()).drop_source, copy)


def test_the_database_of_an_apply_or_rollback_is_resolved_without_a_stored_password(
        settings: Settings) -> None:
    from afs.apply.resolve import apply_target, rollback_target

    user = "postgresql://app:pw@db.example:5433/shop"
    recorded = "postgresql://app:***@db.example:5433/shop"  # what the store keeps
    configured = settings.with_(target_dsn=user)
    assert rollback_target(configured, recorded=recorded, dsn=None, source="shop_copy") == user
    assert apply_target(configured, dsn=None, task_dsn=recorded, source="shop_copy") == user
    in_sandbox = dsn_for(settings, "shop_copy")
    assert apply_target(settings, dsn=None, task_dsn=None, source="shop_copy") == in_sandbox
    # nothing configured names it: the recorded DSN without the scrubbed password (libpq finds one)
    bare = rollback_target(settings, recorded=recorded, dsn=None, source="shop_copy")
    assert psycopg.conninfo.conninfo_to_dict(bare) == {"host": "db.example", "port": "5433", "user": "app",
                                                       "dbname": "shop"}
    with pytest.raises(InputError, match="another database"):
        rollback_target(configured, recorded=recorded, dsn="postgresql://app:pw@db.example:5433/other",
                        source=None)
    assert rollback_target(settings, recorded=recorded, dsn="host=db.example port=5433 dbname=shop"
                           " user=app password=pw", source=None).endswith("password=pw")
    sandbox_db = dsn_for(settings, "afs_demo")  # no password: usable as recorded
    assert rollback_target(settings, recorded=sandbox_db, dsn=None, source=None) == sandbox_db
    remote = settings.with_(source_server_url="postgresql://afs:pw@pg.internal/postgres")
    found = rollback_target(remote, recorded="postgresql://afs:***@pg.internal/shop_copy", dsn=None,
                            source="shop_copy")
    assert psycopg.conninfo.conninfo_to_dict(found) == {"host": "pg.internal", "user": "afs",
                                                        "password": "pw", "dbname": "shop_copy"}


def test_a_sub_partitioned_tree_is_built_at_the_leaves_and_attached_bottom_up() -> None:
    from afs.apply.plan import partitioned_steps

    plan = plan_winner(result_with("t8", ("CREATE INDEX ix_e ON events (user_id)",)))
    tree = {"events": ["events_2024", "events_2025"], "events_2025": ["events_2025_h0", "events_2025_h1"]}
    steps = partitioned_steps(plan.steps[0], tree)
    assert [s.sql for s in steps] == [
        "CREATE INDEX CONCURRENTLY ix_e_events_2024 ON events_2024 (user_id)",
        "CREATE INDEX CONCURRENTLY ix_e_events_2025_h0 ON events_2025_h0 (user_id)",
        "CREATE INDEX CONCURRENTLY ix_e_events_2025_h1 ON events_2025_h1 (user_id)",
        "CREATE INDEX ix_e_events_2025 ON ONLY events_2025 (user_id)",
        "CREATE INDEX ix_e ON ONLY events (user_id)",
        "ALTER INDEX ix_e ATTACH PARTITION ix_e_events_2024",
        "ALTER INDEX ix_e_events_2025 ATTACH PARTITION ix_e_events_2025_h0",
        "ALTER INDEX ix_e_events_2025 ATTACH PARTITION ix_e_events_2025_h1",
        "ALTER INDEX ix_e ATTACH PARTITION ix_e_events_2025",
    ]
    rollback = [s.rollback for s in reversed(steps) if s.rollback]
    assert rollback[:2] == ["DROP INDEX IF EXISTS ix_e", "DROP INDEX IF EXISTS ix_e_events_2025"]


async def test_an_index_on_a_two_level_partition_tree_is_applied_verified_and_rolled_back(
        store: Store, target: str) -> None:
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("CREATE TABLE visits (id bigint, user_id int, at date) PARTITION BY RANGE (at)")
        conn.execute("CREATE TABLE visits_2024 PARTITION OF visits FOR VALUES FROM ('2024-01-01')"
                     " TO ('2025-01-01')")
        conn.execute("CREATE TABLE visits_2025 PARTITION OF visits FOR VALUES FROM ('2025-01-01')"
                     " TO ('2026-01-01') PARTITION BY HASH (user_id)")
        for r in (0, 1):
            conn.execute(f"CREATE TABLE visits_2025_h{r} PARTITION OF visits_2025"
                         f" FOR VALUES WITH (MODULUS 2, REMAINDER {r})")
        conn.execute("INSERT INTO visits SELECT g, g % 5000, date '2024-01-01' + (g % 700)"
                     " FROM generate_series(1, 150000) g")
        conn.execute("ANALYZE visits")
    task_id = await stored(store, ("CREATE INDEX ix_visits_user ON visits (user_id)",),
                           query="SELECT id FROM visits WHERE user_id = 42")
    row = await apply_winner(store, await load_plan(store, task_id), target, approver="alice")
    assert row["result"] == "applied", row["detail"]
    assert row["sql_commands"][:3] == [
        f"CREATE INDEX CONCURRENTLY ix_visits_user_{p} ON {p} (user_id)"
        for p in ("visits_2024", "visits_2025_h0", "visits_2025_h1")]
    assert row["sql_commands"][-1] == "ALTER INDEX ix_visits_user ATTACH PARTITION ix_visits_user_visits_2025"
    tree = ("SELECT c.relname, i.indisvalid, (SELECT p.relname FROM pg_inherits h JOIN pg_class p"
            " ON p.oid = h.inhparent WHERE h.inhrelid = c.oid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname LIKE 'ix_visits_user%' ORDER BY 1")
    with psycopg.connect(target) as conn:
        found = conn.execute(tree).fetchall()
    assert found == [("ix_visits_user", True, None),
                     ("ix_visits_user_visits_2024", True, "ix_visits_user"),
                     ("ix_visits_user_visits_2025", True, "ix_visits_user"),
                     ("ix_visits_user_visits_2025_h0", True, "ix_visits_user_visits_2025"),
                     ("ix_visits_user_visits_2025_h1", True, "ix_visits_user_visits_2025")]
    assert "indexes valid (indisvalid)" in row["detail"]
    undone = await rollback_task(store, task_id, target, approver="alice")
    assert undone["result"] == "rolled_back", undone["detail"]
    with psycopg.connect(target) as conn:
        assert conn.execute(tree).fetchall() == []


def test_a_refresh_schedule_follows_the_refresh_time_and_the_write_rate() -> None:
    from afs.apply.plan import RefreshPlan

    base = RefreshPlan((("mv", True),), ("orders",), refresh_s=0.5)
    assert base.interval_s == 300 and "measured when the plan meets the target" in "\n".join(base.lines())
    busy = replace(base, writes_per_s=10.0, rows=200_000, sampled_s=5)  # 1 % changes in 200 s
    assert busy.stale_s == 200 and busy.interval_s == 300  # the cost floor: 1 % of the time refreshing
    text = "\n".join(busy.lines())
    assert "every 5 minutes" in text and "'*/5 * * * *'" in text and "over 1% of the time" in text
    calm = replace(busy, writes_per_s=0.1)  # 1 % changes in 20,000 s
    assert calm.interval_s == 20_000 and "every 6 hours" in "\n".join(calm.lines())
    assert calm.public()["cron"] == "0 */6 * * *"
    idle = replace(busy, writes_per_s=0.0)
    assert idle.interval_s == 86_400 and "every day" in "\n".join(idle.lines())
    slow = replace(calm, refresh_s=600.0)  # a 10-minute refresh: at most every 1,000 minutes
    assert slow.interval_s == 60_000 and slow.public()["cron"] == "0 3 * * *"  # 17 hours: daily
    plain = RefreshPlan((("mv", False),), ("orders",), refresh_s=0.5)
    assert plain.commands() == ("REFRESH MATERIALIZED VIEW mv",)
    assert "blocks reads of the view" in "\n".join(plain.lines())


@pytest.mark.parametrize("lookup", ["PGPASSWORD", "PGPASSFILE"])
def test_a_recorded_target_finds_its_password_as_psql_would(sandbox: SandboxServer, tmp_path: Path,
                                                             lookup: str) -> None:
    from afs.apply.resolve import apply_target, rollback_target
    from afs.db import connect_sync, resolve_dsn

    role, password = "afs_t_pw_lookup", "s3cret pw"
    with connect_sync(sandbox.dsn()) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute(f"GRANT CONNECT ON DATABASE postgres TO {role}")
    try:
        host = str(sandbox.settings.socket_dir)
        recorded = f"postgresql://{role}:***@/postgres?host={host}"  # as the store keeps it
        if lookup == "PGPASSWORD":
            env = {"PGPASSWORD": password}
        else:
            passfile = tmp_path / "pgpass"
            passfile.write_text(f"*:*:postgres:{role}:{password}\n")
            passfile.chmod(0o600)
            env = {"PGPASSFILE": str(passfile)}
        unconfigured = sandbox.settings.with_(target_dsn=None)
        for target in (rollback_target(unconfigured, recorded=recorded, dsn=None, source=None),
                       apply_target(unconfigured, dsn=None, task_dsn=recorded, source=None)):
            with connect_sync(resolve_dsn(target, env)) as conn:
                assert conn.execute("SELECT current_user").fetchone() == (role,)
    finally:
        with connect_sync(sandbox.dsn()) as conn:
            conn.execute(f"REVOKE CONNECT ON DATABASE postgres FROM {role}")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_the_text_report_prints_what_a_person_runs_on_a_busy_database() -> None:
    from afs.report import live_sql, render_text, to_json

    index = "CREATE INDEX ix_u ON orders (user_id)"
    result = result_with("t9", (index,))
    text = render_text(result)
    assert "apply:    CREATE INDEX CONCURRENTLY ix_u ON orders (user_id);" in text
    assert "outside a transaction" in text and "`afs apply t9`" in text
    assert "\n  apply:    CREATE INDEX ix_u" not in text  # the fork's SQL would lock a busy table
    assert live_sql("DROP INDEX IF EXISTS ix_u") == "DROP INDEX CONCURRENTLY IF EXISTS ix_u"
    assert live_sql("CREATE INDEX IF NOT EXISTS ix_v ON t (a)") == "CREATE INDEX CONCURRENTLY ix_v ON t (a)"
    assert "the query as given: 40.00 ms → 0.50 ms (80.0× faster)" in text
    assert to_json(result)["winner"]["sql_commands"] == [index]  # scripts keep the fork's exact SQL
    view = result_with("t10", ("CREATE MATERIALIZED VIEW mv AS SELECT user_id, count(*) AS n FROM orders"
                               " GROUP BY user_id", "CREATE UNIQUE INDEX mv_u ON mv (user_id)"),
                       "materialized_view", rewritten="SELECT n FROM mv WHERE user_id = 42")
    shown = render_text(view)
    assert "REFRESH MATERIALIZED VIEW CONCURRENTLY mv;" in shown and "schedule: at most every" in shown


def test_an_other_values_line_that_is_no_faster_does_not_read_ok() -> None:
    from afs.report import render_text

    checks = (ParameterCheck("user_id = 7", True, False, Timing(10.0, 1.0, 3, 10), Timing(10.4, 1.0, 3, 10)),
              ParameterCheck("user_id = 8", True, False, Timing(10.0, 1.0, 3, 10), Timing(1.0, 0.1, 3, 10)))
    text = render_text(result_with("t11", ("CREATE INDEX ix_w ON orders (user_id)",), checks=checks))
    assert "user_id = 7: 10.00 → 10.40 ms (3/3 runs), no faster (within the noise)" in text
    assert "user_id = 8: 10.00 → 1.00 ms (3/3 runs), ok" in text
