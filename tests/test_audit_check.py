"""Did an applied change keep its promise (issue 28 item 4): the windows and the Welch test
(pure), then on the embedded PostgreSQL an index applied through `afs apply`, checked (kept),
dropped behind AFS's back and checked again (a regression, with its rollback offered), by
`afs audit --check` itself; the monitor's audit JSON carries the verdict."""

from __future__ import annotations

import json
import math
import os
import random
import statistics
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from afs.apply import apply_winner, audit, load_plan
from afs.apply.verdict import Counter, Observed, Window, check_applied, judge, slower_p, t_sf, window
from afs.config import Settings
from afs.models import (
    AgentOutcome,
    AnalysisResult,
    BenchmarkOutcome,
    ConsensusDecision,
    EstimatedImpact,
    Measurement,
    OptimizationProposal,
    RoutingDecision,
    TaskResult,
    Timing,
)
from afs.optimize import new_task_id
from afs.sandbox.server import SandboxServer, dsn_for
from afs.store import Store, TaskSubmission, open_store
from afs.testing import run_afs_async

QUERY = "SELECT id, total FROM orders WHERE user_id = {u} ORDER BY created_at DESC"
INDEX = "CREATE INDEX ix_promise ON orders (user_id, created_at)"


# -- pure ------------------------------------------------------------------------------------
def _counter(times: list[float]) -> Counter:
    return Counter(len(times), sum(times), sum(t * t for t in times), len(times) * 3)


def test_a_window_between_two_readings_has_the_calls_mean_and_variance_of_those_calls() -> None:
    rng = random.Random(7)
    first = [rng.uniform(5, 15) for _ in range(40)]
    second = [rng.uniform(0.5, 1.5) for _ in range(25)]
    w = window(_counter(first + second), _counter(first), "a", "b")
    assert w is not None and w.calls == 25 and w.rows_per_call == 3
    assert w.mean_ms == pytest.approx(statistics.mean(second))
    assert w.var == pytest.approx(statistics.variance(second), rel=1e-6)
    # counters that went down (a reset): the later reading counts from its own start
    reset = window(_counter(second), _counter(first), "a", "b")
    assert reset is not None and reset.calls == 25
    assert window(_counter(first), _counter(first), "a", "b") is None  # no calls in between


def test_the_t_distribution_tail_matches_known_values() -> None:
    assert t_sf(2.0, 10) == pytest.approx(0.036694, abs=1e-5)
    assert t_sf(1.0, 1) == pytest.approx(0.25, abs=1e-9)  # Cauchy
    assert t_sf(-2.0, 10) == pytest.approx(1 - 0.036694, abs=1e-5)
    assert t_sf(3.0, 1e6) == pytest.approx(0.5 * math.erfc(3 / math.sqrt(2)), rel=1e-3)  # the normal


def test_a_slowdown_beyond_the_noise_is_a_regression_and_noise_is_not() -> None:
    def w(mean: float, sd: float, n: int) -> Window:
        return Window("s", "e", n, mean, sd * sd, 1.0)

    before, after_fix = w(10.0, 1.0, 200), w(0.5, 0.1, 200)
    slow_again = judge(Observed(1, "q", True, before, after_fix, w(10.0, 1.0, 50)), 0.01)
    assert slow_again.verdict == "regression" and "right after the apply" in slow_again.reason
    worse = judge(Observed(2, "insert", False, w(1.0, 0.2, 300), None, w(1.6, 0.3, 300)), 0.01)
    assert worse.verdict == "regression" and "before the apply" in worse.reason
    # 30 % slower, all noise
    noisy = judge(Observed(3, "q", True, w(10.0, 8.0, 10), None, w(13.0, 8.0, 10)), 0.01)
    assert noisy.verdict == "same" and slower_p(w(13.0, 8.0, 10), w(10.0, 8.0, 10)) > 0.2
    # 2 %: significant
    tiny = judge(Observed(4, "q", True, w(10.0, 0.01, 10**6), None, w(10.2, 0.01, 10**6)), 0.01)
    assert tiny.verdict == "same"  # but below the least slowdown that counts
    assert judge(Observed(5, "q", True, before, None, w(0.5, 0.1, 200)), 0.01).verdict == "faster"
    assert judge(Observed(6, "q", True, before, None, w(0.5, 0.1, 2)), 0.01).verdict == "too_few_calls"


# -- on the embedded PostgreSQL ---------------------------------------------------------------
def _result(task_id: str, query: str) -> TaskResult:
    timing = Measurement("baseline", Timing(40.0, 1.0, 5, 900), Timing(0.5, 0.1, 5, 4), 20, True, True)
    proposal = OptimizationProposal(
        agent="a", proposal_type="index", sql_commands=(INDEX,), rollback_commands=(), rationale="test",
        estimated_impact=EstimatedImpact(90, 1, "low", "low"))
    outcome = AgentOutcome(
        agent="a", status="ok", fork="afs-fork-x",
        analysis=AnalysisResult(insights=(), proposed_actions=(), confidence=0.8), proposal=proposal,
        benchmark=BenchmarkOutcome((timing,), storage_before_mb=10.0, storage_after_mb=12.0, apply_s=0.5))
    return TaskResult(task_id=task_id, status="completed", query=query, source="afs_demo",
                      routing=RoutingDecision(("a",), ("test",)), outcomes=(outcome,),
                      decision=ConsensusDecision("a", {}, ("a",), ("the only one",), 0.9),
                      provider="heuristic", provider_note="", duration_s=1.0)


@pytest.fixture
def target(sandbox: SandboxServer, settings: Settings) -> Iterator[str]:
    """The user's database, with pg_stat_statements and orders (150k rows, no index on user_id)."""
    name = "afs_check_t_" + os.urandom(4).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, user_id int NOT NULL,"
                         " total numeric NOT NULL, created_at timestamptz NOT NULL)")
            conn.execute("INSERT INTO orders (user_id, total, created_at) SELECT g % 2000, g % 500,"
                         " now() - g * interval '1 minute' FROM generate_series(1, 150000) g")
            conn.execute("VACUUM ANALYZE orders")
        yield dsn_for(settings, name, password="s3cret-pw")
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def store(store_db: str) -> AsyncIterator[Store]:
    async with open_store(store_db) as opened:
        yield opened


def _calls(dsn: str, n: int, first: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for u in range(first, first + n):
            conn.execute(QUERY.format(u=u % 2000).encode()).fetchall()


async def test_an_index_dropped_behind_afs_back_is_flagged_by_the_next_check(
        store: Store, target: str, store_db: str) -> None:
    _calls(target, 30, 1)  # the workload before the apply: a sequential scan each
    task_id = new_task_id()
    query = QUERY.format(u=42)
    await store.submit(TaskSubmission(task_id=task_id, query=query, source="afs_demo", dsn=None,
                               task_type="query_optimization", priority="normal", provider="heuristic",
                               weights=None, runs=2), worker="t", lease_s=30)
    assert await store.finish(task_id, "t", status="completed", result=_result(task_id, query))
    row = await apply_winner(store, await load_plan(store, task_id), target, approver="alice")
    assert row["result"] == "applied", row["detail"]
    promise = row["verification"]["promise"]
    own = promise["own"]
    assert own is not None and str(own) in promise["before"]["counters"]  # the task's statement, by queryid
    assert promise["before"]["counters"][str(own)][0] >= 30
    assert own in promise["served"]  # its generic plan ($1) uses the index built

    async def target_of(_: object) -> str:
        return target

    _calls(target, 30, 100)  # with the index: fast
    first = await check_applied(store, target_of)
    assert [v["verdict"] for v in first] == ["kept"], first
    mine = next(s for s in first[0]["statements"] if s["own"])
    assert mine["verdict"] == "faster" and mine["recent"]["calls"] >= 30 and mine["change_pct"] < -50
    assert first[0]["rollback"] is None and "before:" in first[0]["window"]

    with psycopg.connect(target, autocommit=True) as conn:  # behind AFS's back
        conn.execute("DROP INDEX ix_promise")
    _calls(target, 30, 300)
    done = await run_afs_async("audit", "--check", "--json", AFS_STORE_URL=store_db)
    assert done.returncode == 1, done.stderr.decode()  # a regression: exit 1
    [second] = json.loads(done.stdout)["verdicts"]
    assert second["verdict"] == "regression", second
    mine = next(s for s in second["statements"] if s["own"])
    assert mine["verdict"] == "regression" and "right after the apply" in mine["reason"]
    assert mine["recent"]["calls"] == 30 and mine["reference"]["calls"] >= 30
    assert second["rollback"] == {"command": f"afs rollback {task_id}",
                                  "sql": ["DROP INDEX CONCURRENTLY IF EXISTS ix_promise"]}
    assert "s3cret-pw" not in done.stdout.decode()

    text = await run_afs_async("audit", AFS_STORE_URL=store_db)  # the log shows the last verdict
    assert b"promise:  regression" in text.stdout
    # the monitor's audit JSON carries it (the page draws verification.check)
    [entry] = [e for e in await audit.entries(store, task_id)
               if e["action"] == "apply"]
    assert entry["verification"]["check"]["verdict"] == "regression"
