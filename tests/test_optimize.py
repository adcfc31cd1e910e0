"""`afs optimize` end to end at small scale: real server, real forks, real MCP."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest
import structlog
import trio
import trio.testing

from afs.brains import SlowBrain, Squad, StrategistBrain
from afs.config import Settings, Timeouts
from afs.db import open_connection
from afs.errors import InputError
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.models import (
    AgentKey,
    AnalysisContext,
    AnalysisResult,
    EstimatedImpact,
    OptimizationProposal,
    TaskResult,
)
from afs.optimize import AgentPool, Crew, TaskRequest, optimize
from afs.report import to_json
from afs.router import load_rules
from afs.sandbox.server import SandboxServer
from afs.testing import HangingBrain, ScriptedBrain, run_afs_async

pytestmark = pytest.mark.usefixtures("no_leaked_forks")

MISSING_INDEX = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending'"
                 " AND o.user_id = 42 ORDER BY o.created_at DESC")


def squad(agents: tuple[AgentKey, ...] | None = None, brains: dict[str, object] | None = None) -> Squad:
    default = StrategistBrain()
    chosen = brains or {}
    return Squad(brain_for=lambda agent: chosen.get(agent, default),  # type: ignore[arg-type, return-value]
                 provider="heuristic", agents=agents)


async def run(settings: Settings, sandbox: SandboxServer, forks: ForkClient, query: str,
              the_squad: Squad | None = None, **request: object) -> tuple[TaskResult, Emitter]:
    events = Emitter("t" + os.urandom(3).hex())
    result = await optimize(settings, TaskRequest(**{"query": query, "runs": 3, **request}),  # type: ignore[arg-type]
                            source="afs_demo", source_dsn=sandbox.dsn("afs_demo"),
                            crew=Crew(forks=forks, squad=the_squad or squad(), rules=load_rules(None)),
                            events=events)
    return result, events


async def test_missing_index_gets_a_measured_index_winner(settings: Settings, sandbox: SandboxServer,
                                                          forks: ForkClient) -> None:
    result, events = await run(settings, sandbox, forks, MISSING_INDEX,
                               squad(("gemini25pro", "gemini25flash")))
    doc = to_json(result)
    assert result.status == "completed", doc
    winner = doc["winner"]
    assert winner["proposal_type"] in ("index", "partial_index", "composite_index")
    assert winner["improvement_pct"] >= 50
    assert any("CREATE INDEX" in sql.upper() for sql in winner["sql_commands"])
    assert winner["rollback_commands"]
    proposal = next(p for p in doc["proposals"] if p["agent"] == winner["agent"])
    baseline = next(b for b in proposal["benchmarks"] if b["name"] == "baseline")
    assert baseline["optimized_ms"] < baseline["baseline_ms"]
    assert baseline["optimized_buffers"] < baseline["baseline_buffers"]
    assert proposal["storage_mb"] is not None and proposal["storage_mb"] >= 0
    kinds = [e.kind for e in events.history]
    for kind in ("agents_assigned", "fork_created", "analysis_completed", "proposal_submitted",
                 "benchmark_completed", "consensus_reached"):
        assert kind in kinds, kind
    # a fixed run count measures every figure afresh: nothing is measured ahead
    assert "baseline_measuring" not in kinds
    fork_events = [e for e in events.history if e.kind == "fork_created"]
    assert {e.agent for e in fork_events} == {"gemini25pro", "gemini25flash"}
    assert all(e.fork and e.duration_s is not None and e.task_id == events.task_id
               for e in fork_events)


async def test_an_already_fast_query_ends_without_improvement(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    result, _ = await run(settings, sandbox, forks, "SELECT id, email FROM users WHERE id = 42")
    assert result.status == "no_improvement", to_json(result)
    assert to_json(result)["winner"] is None


def wrong_rewrite(agent: AgentKey) -> OptimizationProposal:
    """A materialized view that drops rows: its results differ from the query's."""
    return OptimizationProposal(
        agent=agent, proposal_type="materialized_view",
        sql_commands=("CREATE MATERIALIZED VIEW afs_mv_wrong AS SELECT status, count(*) AS n"
                      " FROM orders WHERE status <> 'refunded' GROUP BY status",),
        rollback_commands=("DROP MATERIALIZED VIEW IF EXISTS afs_mv_wrong",),
        rationale="wrong on purpose",
        estimated_impact=EstimatedImpact(90, 0.1, "low", "low"),
        rewritten_query="SELECT status, n FROM afs_mv_wrong",
        needs_refresh=True)


async def test_a_result_changing_rewrite_is_rejected(settings: Settings, sandbox: SandboxServer,
                                                     forks: ForkClient) -> None:
    wrong = ScriptedBrain(wrong_rewrite)
    result, _ = await run(settings, sandbox, forks,
                          "SELECT status, count(*) AS n FROM orders GROUP BY status",
                          squad(("gemini20flash",), {"gemini20flash": wrong}))
    (outcome,) = result.outcomes
    assert outcome.status == "rejected"
    assert outcome.error and "changes query results" in outcome.error
    assert result.status != "completed"


# The virtual clock jumps to the next deadline once every task has waited this long in real
# time; a fork creation on a loaded machine can wait longer than 1 s, and a jump then would
# expire the fork phase's limit instead of the hanging brain's.
AUTOJUMP_S = 5.0

async def test_an_agent_that_times_out_lets_the_others_finish(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient,
        mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = AUTOJUMP_S
    settings = settings.with_(timeouts=Timeouts(model=120))
    started = trio.current_time()
    result, events = await run(settings, sandbox, forks, MISSING_INDEX,
                               squad(("gemini25pro", "gemini25flash", "gemini20flash"),
                                     {"gemini20flash": HangingBrain()}))
    by_agent = {o.agent: o for o in result.outcomes}
    assert by_agent["gemini20flash"].status == "failed"
    assert "timed out in the analysis phase (limit 120 s)" in (by_agent["gemini20flash"].error or "")
    assert by_agent["gemini25pro"].status == "ok" and by_agent["gemini25flash"].status == "ok"
    assert result.status == "completed"
    assert trio.current_time() - started >= 120  # the limit ran out on the virtual clock
    assert any(e.kind == "agent_failed" and e.agent == "gemini20flash" for e in events.history)


async def test_two_failures_of_three_fail_the_task(settings: Settings, sandbox: SandboxServer,
                                                   forks: ForkClient,
                                                   mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = AUTOJUMP_S
    result, _ = await run(settings, sandbox, forks, MISSING_INDEX,
                          squad(("gemini25pro", "gemini25flash", "gemini20flash"),
                                {"gemini25flash": HangingBrain(), "gemini20flash": HangingBrain()}))
    assert result.status == "failed"
    assert result.error and "2 of 3 agents failed" in result.error


async def test_cancellation_leaves_no_fork(settings: Settings, sandbox: SandboxServer,
                                           forks: ForkClient, provider: LocalForkProvider) -> None:
    with trio.move_on_after(2.0) as scope:
        await run(settings, sandbox, forks, MISSING_INDEX,
                  squad(("gemini25pro", "gemini25flash", "gemini20flash"),
                        {"gemini20flash": HangingBrain()}))
    assert scope.cancelled_caught
    assert (await provider.list_services())["forks"] == []


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ("DELETE FROM orders", "SELECT"),
        ("SELEC * FRM orders", "does not parse"),
        ("SELECT * FROM no_such_table", "unknown table"),
        ("", "empty"),
        ("SELECT 1; DROP TABLE orders", "several statements"),
        ("SELECT nope FROM orders", "does not run"),
    ],
)
async def test_bad_input_is_refused_before_any_fork(settings: Settings, sandbox: SandboxServer,
                                                    forks: ForkClient, provider: LocalForkProvider,
                                                    query: str, fragment: str) -> None:
    events = Emitter("bad")
    with pytest.raises(InputError, match=fragment):
        await optimize(settings, TaskRequest(query=query), source="afs_demo",
                       source_dsn=sandbox.dsn("afs_demo"),
                       crew=Crew(forks=forks, squad=squad(), rules=load_rules(None)), events=events)
    assert not [e for e in events.history if e.kind == "fork_created"]


async def afs_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await run_afs_async(*args)


async def test_cli_json_report(sandbox: SandboxServer) -> None:
    result = await afs_cli("optimize", "--query", MISSING_INDEX, "--provider", "heuristic",
                           "--runs", "3", "--json")
    assert result.returncode == 0, result.stderr.decode()
    doc = json.loads(result.stdout)
    assert set(doc) >= {"task_id", "status", "routing", "proposals", "winner"}
    assert doc["status"] == "completed"
    assert set(doc["routing"]) >= {"agents", "rationale"}
    for proposal in doc["proposals"]:
        assert set(proposal) >= {"agent", "status", "error", "proposal_type", "sql_commands",
                                 "rollback_commands", "benchmarks", "storage_mb", "scores"}
        for bench in proposal["benchmarks"]:
            assert set(bench) >= {"name", "baseline_ms", "optimized_ms", "improvement_pct", "rows",
                                  "baseline_buffers", "optimized_buffers"}
    assert set(doc["winner"]) >= {"agent", "proposal_type", "improvement_pct", "sql_commands",
                                  "rollback_commands"}


@pytest.mark.parametrize("query", ["UPDATE orders SET status = 'x'", "SELECT * FROM nowhere", ""])
async def test_cli_bad_input_exits_2(sandbox: SandboxServer, query: str) -> None:
    result = await afs_cli("optimize", "--query", query)
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("afs: error:")]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr


async def test_a_task_waits_for_agents_when_all_are_at_capacity(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    pool = AgentPool()
    events = Emitter("wait")
    busy = ("gemini25pro", "gemini25flash", "gemini20flash")
    results: list[TaskResult] = []

    async def task() -> None:
        results.append(await optimize(
            settings, TaskRequest(query="SELECT id FROM users WHERE id = 1", runs=1),
            source="afs_demo", source_dsn=sandbox.dsn("afs_demo"),
            crew=Crew(forks=forks, squad=squad(), rules=load_rules(None), pool=pool), events=events))

    async with trio.open_nursery() as nursery:
        with pool.assigned(busy * 3):  # three running tasks on every agent: the hard limit
            nursery.start_soon(task)
            with trio.fail_after(30):
                # polling the event history: the task under test gives no other signal
                while not any(e.kind == "waiting_for_agents" for e in events.history):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            await trio.sleep(0.5)
            assert not any(e.kind in ("agents_assigned", "fork_created") for e in events.history)
        # leaving `pool.assigned` frees the agents: the task goes on
    (result,) = results
    assert result.status in ("completed", "no_improvement")
    kinds = [e.kind for e in events.history]
    assert kinds.index("waiting_for_agents") < kinds.index("agents_assigned")


async def test_cli_optimizes_an_imported_database_by_its_dsn(sandbox: SandboxServer) -> None:
    source = sandbox.dsn("afs_demo")  # stands in for "your database"
    not_yet = await afs_cli("optimize", "--dsn", source, "--query", MISSING_INDEX)
    assert not_yet.returncode == 2 and b"afs sandbox import" in not_yet.stderr
    imported = await afs_cli("sandbox", "import", "--from", source, "--as", "shop_by_dsn")
    assert imported.returncode == 0, imported.stderr.decode()
    try:
        result = await afs_cli("optimize", "--dsn", source, "--query", MISSING_INDEX, "--runs", "3",
                               "--json")
        assert result.returncode == 0, result.stderr.decode()
        doc = json.loads(result.stdout)
        assert doc["source"] == "shop_by_dsn" and doc["status"] == "completed"
    finally:
        await LocalForkProvider(sandbox.dsn()).drop_source("shop_by_dsn")


def same_index(agent: AgentKey) -> OptimizationProposal:
    """Every agent proposes the same index (under its own name)."""
    return OptimizationProposal(
        agent=agent, proposal_type="index",
        sql_commands=(f"CREATE INDEX afs_{agent}_idx ON orders (user_id)",),
        rollback_commands=(f"DROP INDEX IF EXISTS afs_{agent}_idx",), rationale="same",
        estimated_impact=EstimatedImpact(90, 1.0, "low", "low"))


async def test_identical_proposals_are_measured_once(settings: Settings, sandbox: SandboxServer,
                                                     forks: ForkClient) -> None:
    same = ScriptedBrain(same_index)
    result, events = await run(settings, sandbox, forks, MISSING_INDEX,
                               squad(("gemini25pro", "gemini25flash"),
                                     {"gemini25pro": same, "gemini25flash": same}))
    measured = [o for o in result.outcomes if o.measured_by is None]
    borrowed = [o for o in result.outcomes if o.measured_by is not None]
    assert len(measured) == 1 and len(borrowed) == 1
    assert borrowed[0].measured_by == measured[0].agent
    assert borrowed[0].benchmark == measured[0].benchmark
    phases = [e for e in events.history if e.kind == "agent_phase" and e.data["phase"] == "benchmark"]
    assert [e.agent for e in phases] == [measured[0].agent]
    assert result.decision is not None and result.decision.confidence > 0
    assert to_json(result)["proposals"][1]["measured_by"] in (None, measured[0].agent)


async def test_an_unsafe_proposal_or_rewrite_is_rejected_before_it_runs(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    def unsafe(agent: AgentKey) -> OptimizationProposal:
        if agent == "gemini25pro":  # smuggles a second statement
            return dataclasses.replace(same_index(agent), sql_commands=(
                "CREATE INDEX afs_x ON orders (user_id); DROP TABLE order_items",))
        return dataclasses.replace(wrong_rewrite(agent), rewritten_query="DELETE FROM orders")

    result, events = await run(settings, sandbox, forks, MISSING_INDEX,
                               squad(("gemini25pro", "gemini20flash"),
                                     {"gemini25pro": ScriptedBrain(unsafe),
                                      "gemini20flash": ScriptedBrain(unsafe)}))
    by_agent = {o.agent: o for o in result.outcomes}
    assert by_agent["gemini25pro"].status == "rejected"
    assert "several statements" in (by_agent["gemini25pro"].error or "")
    assert by_agent["gemini20flash"].status == "rejected"
    assert "unsafe rewrite" in (by_agent["gemini20flash"].error or "")
    assert not any(e.kind == "agent_phase" and e.data["phase"] == "benchmark" for e in events.history)
    async with open_connection(sandbox.dsn("afs_demo")) as conn:  # nothing reached the source
        assert await conn.fetchval("SELECT count(*) FROM order_items") > 0


async def test_the_reported_rollback_is_derived_from_the_sql_not_taken_from_the_brain(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    def careless(agent: AgentKey) -> OptimizationProposal:
        return dataclasses.replace(same_index(agent), rollback_commands=("DROP TABLE orders",))

    result, _ = await run(settings, sandbox, forks, MISSING_INDEX,
                          squad(("gemini25pro",), {"gemini25pro": ScriptedBrain(careless)}))
    (outcome,) = result.outcomes
    assert outcome.proposal is not None
    assert outcome.proposal.rollback_commands == ("DROP INDEX IF EXISTS afs_gemini25pro_idx",)
    assert to_json(result)["winner"]["rollback_commands"] == ["DROP INDEX IF EXISTS afs_gemini25pro_idx"]


class ContextRecordingBrain(StrategistBrain):
    """The offline strategists, noting the log context they are called in."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, object]] = []

    async def propose(self, agent: AgentKey, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> tuple[OptimizationProposal, ...]:
        self.seen.append(dict(structlog.contextvars.get_contextvars()))
        return tuple(await super().propose(agent, ctx, analysis))


async def test_log_lines_inside_an_agent_carry_task_agent_and_fork(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    brain = ContextRecordingBrain()
    result, events = await run(settings, sandbox, forks, MISSING_INDEX,
                               squad(("gemini25pro",), {"gemini25pro": brain}))
    assert result.status in ("completed", "no_improvement")
    (created,) = [e for e in events.history if e.kind == "fork_created"]
    assert brain.seen == [{"task_id": events.task_id, "agent": "gemini25pro", "fork": created.fork}]
    assert structlog.contextvars.get_contextvars() == {}  # nothing left bound after the task


async def test_the_queries_before_any_change_are_measured_while_the_models_think(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    thinking = SlowBrain(StrategistBrain(), 0.5)
    result, events = await run(settings, sandbox, forks, MISSING_INDEX,
                               squad(("gemini25pro", "gemini25flash"),
                                     {"gemini25pro": thinking, "gemini25flash": thinking}), runs=5)
    assert result.status == "completed"
    order = [(e.kind, e.agent) for e in events.history]
    (ahead,) = [e for e in events.history if e.kind == "baseline_measured"]
    assert ahead.data["queries"] >= 1 and "error" not in ahead.data
    starts = [i for i, (kind, _) in enumerate(order) if kind == "baseline_measuring"]
    assert len(starts) == 1  # once per task
    # it starts before the measuring agent's model has proposed, and ends before any benchmark
    assert starts[0] < order.index(("proposal_submitted", ahead.agent))
    benchmarks = [i for i, e in enumerate(events.history)
                  if e.kind == "agent_phase" and e.data["phase"] == "benchmark"]
    assert benchmarks and order.index(("baseline_measured", ahead.agent)) < benchmarks[0]
    # every measurement, the task's first included, stands on those runs (each index candidate
    # here is hundreds of times faster than the query: a large effect, settled by the runs made
    # ahead, Measuring.runs_ahead, with no fresh baseline run)
    ahead_runs = settings.measuring.runs_ahead
    measured = {id(c.benchmark): c.benchmark for o in result.outcomes for c in o.candidates
                if c.benchmark is not None}
    assert measured and all(b.measurements[0].name == "baseline"
                            and b.measurements[0].baseline.reused >= ahead_runs
                            for b in measured.values())
