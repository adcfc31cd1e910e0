"""A batch task's own parameter sets: filled from pg_stats, stored with the task, and the values
every proposal is measured and result-checked on (real server, real forks, real MCP)."""

from __future__ import annotations

import os

import pytest

from afs.batch.fill import fill_statement
from afs.batch.report import Entry, outcome, render_markdown
from afs.brains import Squad
from afs.config import Settings
from afs.db import open_connection
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.models import AgentKey, ColumnInfo, ColumnStats, EstimatedImpact, OptimizationProposal, TableInfo
from afs.optimize import Crew, TaskRequest, new_task_id, optimize
from afs.params.family import apply_parameters
from afs.params.fill import fill
from afs.report import render_text, to_json
from afs.router import load_rules
from afs.sandbox.server import SandboxServer
from afs.store import TaskSubmission, open_store
from afs.testing import ScriptedBrain

STATEMENT = "SELECT o.id, o.total_amount FROM orders o WHERE o.user_id = $1 ORDER BY o.id"


def _table() -> TableInfo:
    return TableInfo(
        name="t", rows=1000, size_mb=1.0,
        columns=(ColumnInfo("id", "bigint"), ColumnInfo("kind", "text"), ColumnInfo("amount", "numeric")),
        indexes=(),
        column_stats={
            "kind": ColumnStats(most_common_vals=("often", "rare", "seldom"),
                                most_common_freqs=(0.6, 0.1, 0.05)),
            "amount": ColumnStats(histogram_bounds=tuple(str(i) for i in range(-50, 51, 10))),
        })


def test_each_filled_set_is_the_first_with_its_own_values_in_any_query_of_the_family() -> None:
    query = "SELECT x.id FROM t x WHERE x.kind = $1 AND x.amount > $2 LIMIT $3"
    filled = fill(query, {"t": _table()}, count=3)
    first, *others = filled.sets
    assert first.substitutions == () and first.values[1] == "'often'"
    assert len(others) == 2
    for pset in others:
        assert {s.column for s in pset.substitutions} <= {"t.kind", "t.amount"}  # LIMIT stays 100
        moved = apply_parameters(first.query, pset)  # one mechanism for both sources
        assert moved is not None and moved.replace("(", "").replace(")", "") == \
            pset.query.replace("(", "").replace(")", "")  # a negative number is filled as (-30)
    negative = next(s for s in first.values.values() if s.startswith("("))  # fill writes (-30)
    assert negative and all(not s.old.startswith("(") for p in others for s in p.substitutions)
    given = filled.parameters()
    assert given is not None and given.statement == query and given.sets == filled.sets
    assert given.measured_on == first.label and given.others == tuple(others)


async def test_a_tasks_stored_input_round_trips_its_sets(store_db: str, sandbox: SandboxServer,
                                                         settings: Settings) -> None:
    async with open_connection(sandbox.dsn(settings.demo_database)) as conn:
        filled = await fill_statement(conn, STATEMENT, count=3)
    given = filled.parameters()
    assert given is not None and len(given.sets) == 3
    async with open_store(store_db) as store:
        task = await store.submit(TaskSubmission(task_id=new_task_id(), query=given.sets[0].query,
                                                 source="afs_demo", dsn=None, task_type="query_optimization",
                                                 priority="normal", provider="heuristic", weights=None,
                                                 runs=1, parameters=given))
        assert task.parameters == given
        assert (await store.get(task.id)).parameters == given
        claimed = await store.claim("w", 30.0)
        assert claimed is not None and claimed.id == task.id and claimed.parameters == given
        assert task.public()["parameters"]["sets"][1]["values"] == {"1": given.sets[1].values[1]}
        plain = await store.submit(TaskSubmission(task_id=new_task_id(), query="SELECT 1 FROM users",
                                                  source="afs_demo", dsn=None, task_type="query_optimization",
                                                  priority="normal", provider="heuristic", weights=None,
                                                  runs=1))
        assert (await store.get(plain.id)).parameters is None


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_rewrite_that_returns_other_rows_for_one_of_the_tasks_sets_is_rejected(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    async with open_connection(sandbox.dsn(settings.demo_database)) as conn:
        filled = await fill_statement(conn, STATEMENT, count=3)
        given = filled.parameters()
        assert given is not None and len(given.others) == 2
        first, other = given.sets[0], given.sets[1]
        # right for the first set's customer, wrong for the second set's (whose rows it drops)
        base = first.query.removesuffix(" ORDER BY o.id")
        wrong = f"{base} AND o.user_id <> {other.values[1]} ORDER BY o.id"
        assert await conn.fetchall(wrong) == await conn.fetchall(first.query)
        assert await conn.fetchall(other.query)  # the second customer has orders

    def rewrite(agent: AgentKey) -> OptimizationProposal:
        return OptimizationProposal(agent=agent, proposal_type="query_rewrite", sql_commands=(),
                                    rollback_commands=(), rationale="right for today's customer only",
                                    estimated_impact=EstimatedImpact(10, 0.0, "low", "low"),
                                    rewritten_query=wrong)

    squad = Squad(brain_for=lambda agent: ScriptedBrain(rewrite), provider="heuristic",
                  agents=("gemini20flash",))
    result = await optimize(settings, TaskRequest(query=first.query, runs=2, parameters=given),
                            source=settings.demo_database, source_dsn=sandbox.dsn(settings.demo_database),
                            crew=Crew(forks=forks, squad=squad, rules=load_rules(None)),
                            events=Emitter("t" + os.urandom(3).hex()))
    (agent,) = result.outcomes
    assert agent.status == "rejected" and agent.error and "changes query results" in agent.error
    assert agent.benchmark is not None
    checks = {c.label: c for c in agent.benchmark.parameter_checks}
    assert set(checks) == {p.label for p in given.others}  # the task's sets, none drawn from pg_stats
    assert not checks[other.label].equivalent and other.label in agent.error
    assert all(m.equivalent for m in agent.benchmark.measurements)  # the suite (the first set) agrees
    assert result.status != "completed" and result.parameters == given

    assert f"the suite ran {first.label}" in render_text(result)
    assert [s["label"] for s in to_json(result)["parameter_sets"]] == [p.label for p in given.sets]


def test_the_batch_report_says_which_values_each_figure_was_measured_on() -> None:
    from afs.models import (
        AgentOutcome,
        BenchmarkOutcome,
        ConsensusDecision,
        Measurement,
        ParameterCheck,
        RoutingDecision,
        TaskResult,
        Timing,
    )

    filled = fill("SELECT x.id FROM t x WHERE x.kind = $1", {"t": _table()}, count=2)
    given = filled.parameters()
    assert given is not None
    timing = Timing(median_ms=10.0, spread_ms=0.1, runs=3, buffers=5)
    fast = Timing(median_ms=1.0, spread_ms=0.1, runs=3, buffers=1)
    bench = BenchmarkOutcome(
        measurements=(Measurement("baseline", timing, fast, 4, True, True),),
        storage_before_mb=1.0, storage_after_mb=1.5,
        parameter_checks=(ParameterCheck(given.sets[1].label, True, False, timing, fast, rows=2),))
    proposal = OptimizationProposal(agent="gemini25pro", proposal_type="index",
                                    sql_commands=("CREATE INDEX i ON t (kind)",),
                                    rollback_commands=("DROP INDEX i",), rationale="r",
                                    estimated_impact=EstimatedImpact(90, 1.0, "low", "low"))
    result = TaskResult(task_id="x", status="completed", query=given.sets[0].query, source="s",
                        routing=RoutingDecision(agents=("gemini25pro",), rationale=()),
                        outcomes=(AgentOutcome(agent="gemini25pro", status="ok", proposal=proposal,
                                               benchmark=bench),),
                        decision=ConsensusDecision(winner="gemini25pro", ranking=("gemini25pro",),
                                                   rationale=(), confidence=1.0, scores={}),
                        provider="heuristic", provider_note="", duration_s=1.0, parameters=given)
    entry = outcome(Entry(1, given.statement, 10, 100.0, 10.0, "completed", task_id="x"), result, 3600)
    assert [m["parameters"] for m in entry.measured] == [p.label for p in given.sets]
    doc = {"id": "b", "database": "d", "created_at": "now", "period_s": 3600.0, "provider": "heuristic",
           "statements": [entry.__dict__], "indexes": [], "total_index_mb": 0.0, "saved_ms_per_day": 0.0,
           "unsolved": []}
    text = render_markdown(doc)
    for pset in given.sets:
        assert f"measured on {pset.label}" in text
    assert "10.00 → 1.00 ms, same rows" in text


def test_a_submission_carries_its_sets_and_bad_ones_are_refused_naming_the_field() -> None:
    from afs.service.api import FieldError, parse_submission
    from afs.store.codec import encode

    query = "SELECT x.id FROM t x WHERE x.kind = $1 AND x.amount > $2 LIMIT $3"
    given = fill(query, {"t": _table()}, count=3).parameters()
    assert given is not None
    first = given.sets[0].query
    fields = parse_submission({"query": first, "parameters": encode(given)}, default_runs=5)
    assert fields["parameters"] == given
    assert parse_submission({"query": first}, default_runs=5)["parameters"] is None
    bad_literal = encode(given)
    bad_literal["sets"][1]["substitutions"][0]["new"] = "1; DROP TABLE t"
    shapes: list[tuple[object, str]] = [
        ({"statement": query, "sets": []}, "at least one"),
        ({"statement": query}, "expected"),
        ({**encode(given), "sets": [{**encode(given)["sets"][0], "query": "SELECT 1"}]}, "task's query"),
        (bad_literal, "set 2"),
    ]
    for data, message in shapes:
        with pytest.raises(FieldError, match=message) as raised:
            parse_submission({"query": first, "parameters": data}, default_runs=5)
        assert raised.value.field == "parameters"
