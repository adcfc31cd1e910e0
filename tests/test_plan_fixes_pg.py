"""The offline strategists end to end at small scale: a plan fix and a view without literals,
measured in real forks (real server, MCP fork client, `optimize()`)."""

from __future__ import annotations

import os

import pytest

from afs.brains import Squad, StrategistBrain
from afs.config import Settings
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.models import AgentKey, CandidateResult, TaskResult
from afs.optimize import Crew, TaskRequest, optimize
from afs.report import to_json
from afs.router import load_rules
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")


async def run(settings: Settings, sandbox: SandboxServer, forks: ForkClient, query: str,
              agent: AgentKey) -> TaskResult:
    events = Emitter("p" + os.urandom(3).hex())
    brain = StrategistBrain()
    squad = Squad(brain_for=lambda _: brain, provider="heuristic", agents=(agent,))
    return await optimize(settings, TaskRequest(query=query, runs=3), source="afs_demo",
                          source_dsn=sandbox.dsn("afs_demo"),
                          crew=Crew(forks=forks, squad=squad, rules=load_rules(None)), events=events)


def measured(result: TaskResult, proposal_type: str) -> CandidateResult:
    (outcome,) = result.outcomes
    tried = [c for c in outcome.candidates if c.proposal.proposal_type == proposal_type]
    assert tried, [(c.proposal.proposal_type, c.status, c.note) for c in outcome.candidates]
    assert tried[0].status == "measured", tried[0].note
    return tried[0]


# ~137,000 line items sorted whole (OFFSET keeps the sort complete): more than the fork's
# default work_mem of 4MB holds, so the sort spills to disk
SPILLING_SORT = ("SELECT order_id, line_no, product_id, quantity, unit_price FROM order_items "
                 "ORDER BY unit_price DESC, order_id, line_no OFFSET 130000")


async def test_a_sort_that_spills_gets_a_measured_work_mem_candidate(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    result = await run(settings, sandbox, forks, SPILLING_SORT, "gemini25pro")
    (outcome,) = result.outcomes
    assert outcome.analysis is not None
    assert any("on disk" in line for line in outcome.analysis.insights), outcome.analysis.insights
    candidate = measured(result, "settings")
    assert candidate.proposal.sql_commands == ()
    (name, value), = candidate.proposal.settings
    assert name == "work_mem" and value.endswith("MB") and int(value[:-2]) > 4
    b = candidate.benchmark
    assert b is not None and b.equivalent
    baseline = next(m for m in b.measurements if m.name == "baseline")
    assert "proposed settings" in baseline.note
    doc = to_json(result)
    assert any(p["settings"] == {"work_mem": value} for p in doc["proposals"][0]["candidates"])


AGGREGATE = "SELECT count(*) AS n, sum(total_amount) AS total FROM orders WHERE status = 'pending'"


async def test_an_aggregate_with_a_literal_filter_gets_a_view_without_the_literal(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    result = await run(settings, sandbox, forks, AGGREGATE, "gemini20flash")
    candidate = measured(result, "materialized_view")
    view = candidate.proposal.sql_commands[0]
    assert "pending" not in view and "GROUP BY status" in view
    assert "WHERE status = 'pending'" in (candidate.proposal.rewritten_query or "")
    b = candidate.benchmark
    assert b is not None and b.answer_cache is None and b.equivalent
    assert b.parameter_checks and all(c.equivalent for c in b.parameter_checks)
    assert b.family_problem is None or "slower" in b.family_problem
