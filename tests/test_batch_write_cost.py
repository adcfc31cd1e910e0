"""The batch hands each task the workload's writes of the tables its statement reads, and the
agent measures a new index's cost to them in its fork: the consensus's write-cost adjustment
then names the measured figure, not the writes-per-read ratio (real server, real forks, real
MCP; the counters are given, so nothing is written to the demo database, not even rolled back)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from afs.batch.fill import fill_statement
from afs.batch.indexes import Verifying, new_index_write_costs
from afs.batch.job import task_workloads, task_write_cost, task_write_statements, with_workload
from afs.batch.report import in_task_words
from afs.batch.statements import Counters, Statement
from afs.config import Settings
from afs.db import open_connection
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.models import EstimatedImpact, OptimizationProposal
from afs.optimize import Crew, Squad, TaskRequest, optimize
from afs.report import render_text, to_json
from afs.router import load_rules
from afs.sandbox.server import SandboxServer
from afs.testing import ScriptedBrain

READ = "SELECT o.id, o.total_amount FROM orders o WHERE o.user_id = $1 ORDER BY o.id"
INSERT = ("INSERT INTO orders (id, user_id, status, total_amount, shipping_country, created_at, updated_at)"
          " VALUES ($1, $2, $3, $4, $5, $6, $7)")
UPDATE = "UPDATE orders SET status = $1 WHERE id = $2"
ELSEWHERE = "DELETE FROM users WHERE id = $1"  # a table the statement does not read


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_task_given_writes_is_judged_on_their_measured_cost(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    now = datetime.now(UTC)
    counters = Counters("afs_demo", now, now - timedelta(hours=1), (
        (11, READ, 500, 250.0, 0.5, 500), (12, INSERT, 240, 24.0, 0.1, 240),
        (13, UPDATE, 120, 6.0, 0.05, 120), (14, ELSEWHERE, 60, 3.0, 0.05, 60)))
    statement = Statement(11, READ, 500, 250.0, 0.5, 500)
    async with open_connection(sandbox.dsn("afs_demo")) as target:
        given = await task_workloads(target, counters, [statement], period_s=3600.0)
        filled = await fill_statement(target, READ, count=1)
    workload = given[11]
    assert workload.reads_per_day == 500 * 24
    assert sorted(w.statement for w in workload.writes) == [INSERT, UPDATE]  # not users' DELETE

    assert all(w.per_day == w.calls * 24 and w.table == "orders" for w in workload.writes)
    parameters = with_workload(filled.parameters(), workload)
    assert parameters is not None and parameters.workload == workload

    brain = ScriptedBrain(lambda agent: OptimizationProposal(
        agent=agent, proposal_type="index", sql_commands=("CREATE INDEX ON orders (user_id)",),
        rollback_commands=(), rationale="test", estimated_impact=EstimatedImpact(50, 1, "low", "low")))
    squad = Squad(brain_for=lambda _: brain, provider="scripted", agents=("gemini25pro",))
    request = TaskRequest(query=parameters.sets[0].query, runs=3, parameters=parameters)
    result = await optimize(settings, request, source="afs_demo", source_dsn=sandbox.dsn("afs_demo"),
                            crew=Crew(forks=forks, squad=squad, rules=load_rules(None)),
                            events=Emitter("w" + os.urandom(3).hex()))
    (outcome,) = result.outcomes
    assert outcome.benchmark is not None, outcome.error
    cost = outcome.benchmark.write_cost
    assert cost is not None and cost.statements == len(workload.writes) == 2 and not cost.note, cost
    assert cost.reads_per_day == 500 * 24 and cost.writes_per_day is not None and cost.ms_per_day is not None
    # the consensus names the measured figure (whatever its sign or size), not the ratio
    assert result.decision is not None
    lines = [line for line in result.decision.rationale if "write cost of a new index" in line]
    assert lines and all("measured in the fork" in line and "writes per read" not in line for line in lines)
    assert f"{cost.ms_per_write:.4f} ms more per write" in lines[0]
    print(lines[0])  # the figures (pytest -s): not asserted, they are timings
    # and the report shows it
    shown = to_json(result)["proposals"][0]["write_cost"]
    assert shown["ms_per_write"] == cost.ms_per_write and shown["statements"] == cost.statements
    assert "write cost (measured in the fork" in render_text(result)
    # and the batch keeps it with the winner, as its task measured it
    assert task_write_cost(result) == shown
    # the batch's report says the consensus weighed it, and the batch takes it for the same index
    # on the same writes instead of replaying them again (no fork: no_leaked_forks sees none left)
    in_task = {**shown, "writes": task_write_statements(result)}
    assert sorted(in_task["writes"]) == [INSERT, UPDATE]
    assert "the consensus weighed it" in in_task_words(in_task)
    print(in_task_words(in_task))  # the batch report's line (pytest -s)
    sql = "CREATE INDEX ON orders (user_id)"
    async with open_connection(sandbox.dsn("afs_demo")) as target:
        costs = await new_index_write_costs(Verifying(target, forks, "afs_demo", settings), [sql], counters,
                                            measured={sql: in_task})
    assert costs[sql]["source"] == "task" and costs[sql]["writes"] == 2
    assert costs[sql]["ms_per_write"] == round(cost.ms_per_write, 4)
