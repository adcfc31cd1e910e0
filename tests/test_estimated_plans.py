"""Plans that are read, not run (issue 25 item 2): a query slower than the statement timeout gets
the plan of EXPLAIN without ANALYZE (`AnalysisContext.slow`), and the strategists still propose
from the planner's estimates: a SubPlan's executions, the rows a filter removes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from afs.analysis import gather_context, source_table_stats
from afs.brains.strategists import analyze, propose
from afs.db import Connection, open_connection
from afs.models import AnalysisContext
from afs.pg.plan import plan_nodes, plan_of
from afs.query.features import extract_features

SCHEMA = """
CREATE TABLE readings (id bigint PRIMARY KEY, sensor_id int NOT NULL, value int NOT NULL,
                       note text NOT NULL);
INSERT INTO readings SELECT g, (g::bigint * 7919) % 4000, (g::bigint * 104729) % 1000, 'n' || g
    FROM generate_series(1, 200000) g;
CREATE TABLE calls (id bigint PRIMARY KEY, caller int NOT NULL, seconds int NOT NULL, note text NOT NULL);
INSERT INTO calls SELECT g, (g::bigint * 7919) % 50000, g % 600, repeat('x', 30)
    FROM generate_series(1, 300000) g;
VACUUM ANALYZE
"""
CORRELATED = ("SELECT r.id, r.value FROM readings r WHERE r.value > "
              "(SELECT avg(r2.value) FROM readings r2 WHERE r2.sensor_id = r.sensor_id)")
FILTERED = "SELECT id, seconds FROM calls WHERE caller = 4242"
RANGES = """
CREATE TABLE blocks (id integer PRIMARY KEY, low bigint NOT NULL, high bigint NOT NULL, region text NOT NULL);
CREATE TABLE hits (id bigint PRIMARY KEY, point bigint NOT NULL, at timestamp NOT NULL);
INSERT INTO blocks SELECT i, (i - 1) * 1000::bigint, i * 1000::bigint - 1, 'r' || (i % 40)
    FROM generate_series(1, 2000) i;
INSERT INTO hits SELECT i, (i::bigint * 7919) % 2000000, timestamp '2024-01-01' + i * interval '1 minute'
    FROM generate_series(1, 20000) i;
VACUUM ANALYZE
"""
RANGE_JOIN = ("SELECT b.region, count(*) FROM hits h JOIN blocks b ON h.point BETWEEN b.low AND b.high "
              "GROUP BY b.region")


@pytest.fixture
def db(scratch_database: Callable[[str, str], str]) -> str:
    return scratch_database("afs_estimated_", SCHEMA)


async def context(conn: Connection, query: str) -> AnalysisContext:
    features = extract_features(query)
    stats = await source_table_stats(conn, features.tables)
    return await gather_context(conn, task_id="t-estimated", task_type="query_optimization", query=query,
                                features=features, source_stats=stats)


def created(agent: str, ctx: AnalysisContext) -> list[str]:
    proposals = propose(agent, ctx, analyze(agent, ctx))
    return [c for p in proposals for c in p.sql_commands if c.startswith("CREATE INDEX")]


def key_of(command: str) -> str:
    """`CREATE INDEX … ON t (a, b) INCLUDE (c)` → `t (a, b)`."""
    return command.split(" ON ", 1)[1].split(" INCLUDE")[0].split(" WHERE")[0]


async def test_a_correlated_subquery_too_slow_to_run_gets_the_index_on_its_key(db: str) -> None:
    async with open_connection(db) as conn:
        await conn.execute("SET statement_timeout = '300ms'")  # the baseline runs for minutes
        ctx = await context(conn, CORRELATED)
    assert ctx.slow and "Actual Loops" not in ctx.plan
    nodes = plan_nodes(ctx.plan, reltuples={"readings": ctx.tables["readings"].rows},
                       execution_ms=ctx.execution_ms)
    inner = next(n for n in nodes if n.relation == "readings" and n.depth > 1)
    assert not inner.analyzed and inner.loops >= 100_000  # once per outer row, as planned
    insights = analyze("gemini25pro", ctx).insights
    assert any("estimated" in line for line in insights), insights
    keys = [key_of(c) for c in created("gemini25pro", ctx)]
    assert keys and keys[0] == "readings (sensor_id)", keys  # the correlation key first
    assert "INCLUDE (value)" in created("gemini25pro", ctx)[0]  # and the column it aggregates


async def test_a_selective_filter_read_from_the_estimated_plan_gets_its_index(db: str) -> None:
    async with open_connection(db) as conn:
        analysed = await context(conn, FILTERED)
        estimated = plan_of(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {FILTERED}"))
    assert not analysed.slow and "Actual Loops" in analysed.plan
    # what afs.analysis does for a query slower than the statement timeout: the plain EXPLAIN,
    # the timeout as a lower bound of the time
    slow = dataclasses.replace(analysed, plan=estimated, slow=True, execution_ms=200.0)
    scan = next(n for n in plan_nodes(slow.plan, reltuples={"calls": slow.tables["calls"].rows},
                                      execution_ms=slow.execution_ms) if n.relation == "calls")
    assert not scan.analyzed and scan.removed > 250_000 and scan.rows < 100
    assert scan.self_ms > 0  # in proportion to its share of the cost
    # a nested loop's inner side runs once per outer row; below a Materialize, once
    inner = {"Node Type": "Seq Scan", "Parent Relationship": "Inner", "Relation Name": "calls",
             "Plan Rows": 300_000, "Total Cost": 5_000.0}
    loop = {"Node Type": "Nested Loop", "Plan Rows": 20, "Total Cost": 50_000.0, "Plans": [
        {"Node Type": "Seq Scan", "Parent Relationship": "Outer", "Relation Name": "readings",
         "Filter": "(id < 10)", "Plan Rows": 10, "Total Cost": 4_000.0}, inner]}
    by_relation = {n.relation: n for n in plan_nodes(loop, reltuples={"readings": 200_000})}
    assert by_relation["calls"].loops == 10 and by_relation["calls"].rows == 3_000_000
    assert by_relation["readings"].removed == 200_000 - 10
    materialized = {**loop, "Plans": [loop["Plans"][0], {
        "Node Type": "Materialize", "Parent Relationship": "Inner", "Plan Rows": 300_000,
        "Total Cost": 6_000.0, "Plans": [{**inner, "Parent Relationship": "Outer"}]}]}
    by_type = {n.relation or n.node_type: n for n in plan_nodes(materialized)}
    assert by_type["Materialize"].loops == 10 and by_type["calls"].loops == 1
    for agent in ("gemini25pro", "gemini25flash", "gemini20flash"):
        today = created(agent, analysed)
        assert today and all(key_of(c) == "calls (caller)" for c in today), today
        assert created(agent, slow) == today  # the estimates lead to the same designs
    insights = analyze("gemini25pro", slow).insights
    assert any("estimated" in line and "calls" in line for line in insights), insights
    assert not any("estimated" in line for line in analyze("gemini25pro", analysed).insights)


async def test_a_join_by_a_range_too_slow_to_run_gets_the_index_on_the_point(db: str) -> None:
    async with open_connection(db) as conn:
        for statement in RANGES.split(";"):
            if statement.strip():
                await conn.execute(statement)
        await conn.execute("SET statement_timeout = '100ms'")  # every pair: seconds
        ctx = await context(conn, RANGE_JOIN)
    assert ctx.slow
    commands = created("gemini25pro", ctx)
    assert commands and key_of(commands[0]) == "hits (point)", commands
    insights = analyze("gemini25pro", ctx).insights
    assert any("row pairs (estimated" in line for line in insights), insights


async def test_a_not_in_subquery_too_big_to_hash_gets_work_mem_from_the_estimated_plan(db: str) -> None:
    query = "SELECT count(*) FROM calls WHERE caller NOT IN (SELECT sensor_id FROM readings)"
    async with open_connection(db) as conn:
        await conn.execute("SET work_mem = '1MB'")  # too small to hash 200,000 rows
        await conn.execute("SET statement_timeout = '200ms'")  # 300,000 rescans: minutes
        ctx = await context(conn, query)
    assert ctx.slow
    proposals = propose("gemini25flash", ctx, analyze("gemini25flash", ctx))
    fix = next((p for p in proposals if p.settings and p.settings[0][0] == "work_mem"), None)
    assert fix is not None, [p.rationale for p in proposals]
    assert "SubPlan" in fix.rationale and "estimated" in fix.rationale, fix.rationale
