"""The squad searches, it does not repeat (issue 25 item 3): an agent whose chosen design another
agent measures already spends its measuring slot on its next distinct design, and still reports
the shared measurement — in the embedded PostgreSQL, with the offline strategists."""

from __future__ import annotations

import os

import pytest

from afs.bench import TaskMeasurements
from afs.brains import Brain, Squad, StrategistBrain
from afs.config import Settings
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.models import AgentKey, TaskResult
from afs.optimize import Crew, TaskRequest, optimize
from afs.report import to_json
from afs.router import load_rules
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")

# several designs fit: an index on the filter, composites with the sort key, covering ones
PENDING = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending' AND o.user_id = 42"
           " ORDER BY o.created_at DESC")


async def run(settings: Settings, sandbox: SandboxServer, forks: ForkClient,
              agents: tuple[AgentKey, ...], brain: Brain | None = None, measured: int = 1) -> TaskResult:
    """PENDING's task with `agents`, each asking `brain` (the offline strategists by default),
    `measured` slots each."""
    asked = brain or StrategistBrain()
    squad = Squad(brain_for=lambda _: asked, provider="heuristic", agents=agents)
    # one measuring slot each (by default) and no loop: what is measured is what the slots went to
    return await optimize(settings.with_(measured=measured, parameter_sets=1, loop_steps=0),
                          TaskRequest(query=PENDING, runs=3), source="afs_demo",
                          source_dsn=sandbox.dsn("afs_demo"),
                          crew=Crew(forks=forks, squad=squad, rules=load_rules(None)),
                          events=Emitter("q" + os.urandom(3).hex()))


def distinct_measured(result: TaskResult) -> set[object]:
    return {TaskMeasurements.key(c.proposal) for o in result.outcomes for c in o.candidates
            if c.status == "measured"}


async def test_three_agents_measure_more_distinct_designs_than_one(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    alone = await run(settings, sandbox, forks, ("gemini25pro",))
    squad = await run(settings, sandbox, forks, ("gemini25pro", "gemini25flash", "gemini20flash"))
    print(f"distinct measured designs: one agent {len(distinct_measured(alone))}, "
          f"three agents {len(distinct_measured(squad))}")
    assert len(distinct_measured(alone)) == 1, to_json(alone)
    assert len(distinct_measured(squad)) > len(distinct_measured(alone)), to_json(squad)
    measured_by: dict[object, set[AgentKey]] = {}
    for outcome in squad.outcomes:
        measured = [c for c in outcome.candidates if c.status == "measured"]
        own = [c for c in measured if not c.note.startswith("measured by")]
        taken = [c for c in measured if c.note.startswith("measured by")]
        # one slot each: what an agent measured itself is one design at most ...
        assert len(own) <= 1, [(c.rank, c.note) for c in outcome.candidates]
        # ... and a design another agent measured did not take its slot when it had another
        if taken and len(outcome.candidates) > len(taken):
            assert own, [(c.rank, c.status, c.note) for c in outcome.candidates]
        for c in own:
            measured_by.setdefault(TaskMeasurements.key(c.proposal), set()).add(outcome.agent)
    # no design was measured by two agents' slots
    assert all(len(agents) == 1 for agents in measured_by.values()), measured_by
