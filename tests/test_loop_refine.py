"""The strategists' next step (afs.brains.strategists.refine) on real plans of the embedded
PostgreSQL, and the loop's rule for keeping a step (afs.agents.beats and gains)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from afs.agents import after_plan, beats, gains
from afs.analysis import explain_analyze, gather_context, source_table_stats
from afs.brains.strategists.refine import refine_design
from afs.db import Connection, open_connection
from afs.models import AnalysisContext, EstimatedImpact, OptimizationProposal, Timing
from afs.pg.bottleneck import bottlenecks
from afs.query.features import extract_features

SCHEMA = """
CREATE TABLE customers (id bigint PRIMARY KEY, region int NOT NULL, name text NOT NULL);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, amount numeric(10, 2) NOT NULL,
                     status text NOT NULL, note text NOT NULL);
INSERT INTO customers SELECT g, g % 20, 'customer ' || g FROM generate_series(1, 3000) g;
INSERT INTO orders SELECT g, 1 + (g::bigint * 7919) % 3000, (g % 997) / 10.0,
                          CASE WHEN g % 10 = 0 THEN 'open' ELSE 'done' END, repeat('x', 40)
    FROM generate_series(1, 40000) g;
VACUUM ANALYZE
"""


@pytest.fixture
def db(scratch_database: Callable[[str, str], str]) -> str:
    return scratch_database("afs_refine_", SCHEMA)


async def context(conn: Connection, query: str) -> AnalysisContext:
    features = extract_features(query)
    stats = await source_table_stats(conn, features.tables)
    return await gather_context(conn, task_id="t-refine", task_type="query_optimization", query=query,
                                features=features, source_stats=stats)


def design(*commands: str) -> OptimizationProposal:
    return OptimizationProposal(agent="gemini25pro", proposal_type="index", sql_commands=commands,
                                rollback_commands=(), rationale="the first design.",
                                estimated_impact=EstimatedImpact(50.0, 0.0, "low", "low"))


def step(ctx: AnalysisContext, current: OptimizationProposal,
         plan: Mapping[str, Any]) -> OptimizationProposal | None:
    analysed = "Actual Total Time" in plan
    necks = bottlenecks(plan, analysed)
    return refine_design("gemini25pro", ctx, current, plan, necks[0] if necks else None, ())


CORRELATED = ("SELECT c.id FROM customers c WHERE c.region = 3 AND 50 < "
              "(SELECT max(o.amount) FROM orders o WHERE o.customer_id = c.id)")


async def test_a_subplan_per_row_gets_its_correlation_key_and_the_aggregated_column(db: str) -> None:
    async with open_connection(db) as conn:
        ctx = await context(conn, CORRELATED)
        extended = step(ctx, design(), ctx.plan)
        assert extended is not None
        (index,) = extended.sql_commands
        assert index.endswith("ON orders (customer_id) INCLUDE (amount)"), index
        assert "SubPlan" in extended.rationale
        # with it in place each run of the subquery reads a few index entries, not the table
        await conn.execute("BEGIN")
        try:
            await conn.execute(index)
            _, after_ms = await explain_analyze(conn, CORRELATED)
        finally:
            await conn.execute("ROLLBACK")
    assert after_ms * 5 < ctx.execution_ms


LATERAL = ("SELECT c.id, x.total FROM customers c CROSS JOIN LATERAL "
           "(SELECT sum(o.amount) AS total FROM orders o WHERE o.customer_id = c.id) x WHERE c.region = 3")


async def test_the_inner_side_of_a_nested_loop_gets_its_join_key(db: str) -> None:
    async with open_connection(db) as conn:
        ctx = await context(conn, LATERAL)
    extended = step(ctx, design(), ctx.plan)
    assert extended is not None
    assert extended.sql_commands[-1].endswith("ON orders (customer_id) INCLUDE (amount)") or \
        extended.sql_commands[-1].endswith("ON orders (customer_id)"), extended.sql_commands


HEAP = "SELECT sum(amount) FROM orders WHERE customer_id <= 400"  # 13 % of the rows


async def test_heap_fetches_get_a_covering_index_that_replaces_the_designs_own(db: str) -> None:
    first = "CREATE INDEX afs_orders_customer_id_idx ON orders (customer_id)"
    async with open_connection(db) as conn:
        ctx = await context(conn, HEAP)
        await conn.execute("BEGIN")
        try:
            await conn.execute(first)
            plan, _ = await explain_analyze(conn, HEAP)
        finally:
            await conn.execute("ROLLBACK")
    assert bottlenecks(plan, True)[0].kind == "heap_fetch"
    extended = step(ctx, design(first), plan)
    assert extended is not None
    (index,) = extended.sql_commands  # the plain index is replaced, not kept beside
    assert index.endswith("ON orders (customer_id) INCLUDE (amount)"), index


async def test_a_small_table_and_the_rows_returned_get_nothing(db: str) -> None:
    async with open_connection(db) as conn:
        small = await context(conn, "SELECT id FROM customers WHERE name = 'customer 7'")
        whole = await context(conn, "SELECT * FROM orders")
    assert step(small, design(), small.plan) is None  # 3,000 rows: scanning them is cheap
    assert bottlenecks(whole.plan, True)[0].kind == "rows_returned"
    assert step(whole, design(), whole.plan) is None


def timing(*runs: float, buffers: int = 100) -> Timing:
    ordered = sorted(runs)
    return Timing(median_ms=ordered[len(ordered) // 2], spread_ms=(ordered[-1] - ordered[0]) / 2,
                  runs=len(runs), buffers=buffers, min_ms=ordered[0], max_ms=ordered[-1])


def test_a_step_is_kept_only_when_it_beats_the_one_before_beyond_the_noise() -> None:
    before = timing(10.0, 10.4, 11.0)
    assert beats(before, timing(2.0, 2.1, 2.3))  # every run faster, by far
    assert not beats(before, timing(9.0, 9.5, 10.2))  # the runs overlap: noise
    assert not beats(before, timing(9.9, 9.92, 9.95))  # separated, but less than 5 % apart
    assert not beats(before, timing(12.0, 12.5, 13.0))  # slower
    assert not beats(before, before)
    # a busy server: the runs overlap, but the step is twice as fast and reads fewer buffers
    noisy = timing(6.0, 13.0, 30.0)
    assert beats(noisy, timing(5.0, 6.5, 14.0, buffers=40))
    assert not beats(noisy, timing(5.0, 6.5, 14.0, buffers=100))  # the same reads: noise
    assert not beats(noisy, timing(5.0, 11.0, 14.0, buffers=40))  # not 1.5x apart


def test_a_step_gains_only_beyond_what_the_ranking_calls_as_fast() -> None:
    before = timing(10.0, 10.4, 11.0)
    assert gains(before, timing(2.0, 2.1, 2.3))
    assert not gains(before, timing(9.9, 9.92, 9.95))  # does not beat it
    # beats it beyond the noise, but by under AS_FAST_RATIO (1.1x): ranked as fast
    assert beats(before, timing(9.5, 9.6, 9.7)) and not gains(before, timing(9.5, 9.6, 9.7))
    # sub-millisecond: every run faster and 4x, but 0.24 ms: within AS_FAST_MS (0.3 ms)
    quick = timing(0.31, 0.32, 0.33)
    assert beats(quick, timing(0.07, 0.08, 0.09)) and not gains(quick, timing(0.07, 0.08, 0.09))
    assert gains(timing(0.50, 0.52, 0.55), timing(0.07, 0.08, 0.09))  # 0.44 ms: a gain


async def test_the_plan_with_a_design_is_read_without_running_it_when_the_query_is_too_slow(db: str) -> None:
    async with open_connection(db, 50) as conn:  # a statement timeout the correlated query exceeds
        # for every customer, not one region's 150: 120 million rows read (seconds), far past the
        # 50 ms on any machine, where the count below takes a millisecond
        every = CORRELATED.replace("c.region = 3", "c.region < 20")
        plan, analysed = await after_plan(conn, every, design(), estimate_only=False)
        assert not analysed and "Actual Total Time" not in plan and plan["Total Cost"] > 0
        # the estimated plan still shows the subquery run per outer row
        neck = bottlenecks(plan, analysed)[0]
        assert neck.kind == "subplan_per_row" and neck.columns == ("customer_id",)
        count = "SELECT count(*) FROM customers"
        fast, analysed = await after_plan(conn, count, design(), estimate_only=False)
        assert analysed and "Actual Total Time" in fast
        estimated, analysed = await after_plan(conn, count, design(), estimate_only=True)
        assert not analysed and "Actual Total Time" not in estimated
        assert await conn.fetchval("SELECT 1") == 1  # the connection is usable after the timeout
