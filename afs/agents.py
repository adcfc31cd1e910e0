"""One workflow, several brains.

The workflow is the same for every agent (the seed's agent contract):

    open fork (MCP service_fork) ─► analyse (EXPLAIN ANALYZE, schema, pg_stats)
    ─► propose (the brain) ─► validate (SQL allow-list) ─► benchmark (the suite,
    before vs after, same fork) ─► close fork (MCP service_delete), always

The brain is a `Brain`: an offline strategist (`StrategistBrain`) or a model.
Expected failures come back as data (`AgentOutcome(status="failed")`); only
bugs escape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import trio

from afs.analysis import gather_context
from afs.bench import benchmark
from afs.brains import Brain
from afs.config import Timeouts
from afs.consensus import ddl_signature
from afs.db import Connection, open_connection
from afs.errors import AfsError, UnsafeSqlError
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.forks.naming import fork_name
from afs.models import (
    AgentKey,
    AgentOutcome,
    AgentStatus,
    AnalysisResult,
    BenchmarkOutcome,
    OptimizationProposal,
    QueryFeatures,
    QueryVariant,
    TaskType,
    ValidationResult,
)
from afs.safety import check_query, validate_proposal
from afs.suite import build_suite


@dataclass
class _Measurement:
    owner: AgentKey
    done: trio.Event = field(default_factory=trio.Event)
    outcome: BenchmarkOutcome | None = None


class SharedMeasurements:
    """Identical proposals (same normalized DDL and rewrite) are measured once per task.

    The first agent to propose it measures it in its own fork; the others wait and
    take that measurement (their forks hold the same data). If the measuring agent
    fails, the next one measures it itself.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[frozenset[str], str | None], _Measurement] = {}

    @staticmethod
    def key(proposal: OptimizationProposal) -> tuple[frozenset[str], str | None]:
        rewrite = " ".join(proposal.rewritten_query.split()) if proposal.rewritten_query else None
        return ddl_signature(proposal), rewrite

    async def measure(self, agent: AgentKey, proposal: OptimizationProposal,
                      run: Callable[[], Awaitable[BenchmarkOutcome]],
                      waiting: Callable[[AgentKey], None]) -> tuple[BenchmarkOutcome, AgentKey | None]:
        """The measurement and, when it was taken over from another agent, that agent."""
        key = self.key(proposal)
        while True:
            entry = self._entries.get(key)
            if entry is None or (entry.done.is_set() and entry.outcome is None):
                entry = self._entries[key] = _Measurement(owner=agent)
                try:
                    entry.outcome = await run()
                    return entry.outcome, None
                finally:
                    entry.done.set()
            waiting(entry.owner)
            await entry.done.wait()
            if entry.outcome is not None:
                return entry.outcome, entry.owner


@dataclass(frozen=True)
class AgentJob:
    """What one agent needs to do its part of a task."""

    task_id: str
    task_type: TaskType
    query: str
    features: QueryFeatures
    source: str  # the service to fork
    source_stats: Mapping[str, tuple[int, float]]  # table -> (rows, writes per read)
    runs: int
    statement_timeout_ms: int
    timeouts: Timeouts


@dataclass
class _Progress:
    """What one agent has got so far (kept for the failure record)."""

    agent: AgentKey
    started: float
    phase: str = "fork"
    fork: str | None = None
    analysis: AnalysisResult | None = None
    proposal: OptimizationProposal | None = None
    validation: ValidationResult | None = None
    skipped: tuple[str, ...] = field(default=())
    waited_s: float = 0.0
    measured_by: AgentKey | None = None

    def outcome(self, status: AgentStatus, error: str | None = None,
                bench: BenchmarkOutcome | None = None) -> AgentOutcome:
        return AgentOutcome(
            agent=self.agent, status=status, error=error, fork=self.fork,
            analysis=self.analysis, proposal=self.proposal, validation=self.validation,
            benchmark=bench, duration_s=trio.current_time() - self.started, waited_s=self.waited_s,
            measured_by=self.measured_by)


async def run_agent(agent: AgentKey, job: AgentJob, *, forks: ForkClient, brain: Brain,
                    bench_limiter: trio.CapacityLimiter, events: Emitter,
                    shared: SharedMeasurements | None = None) -> AgentOutcome:
    """The whole workflow of one agent; expected failures are returned, not raised."""
    state = _Progress(agent=agent, started=trio.current_time())
    limits = job.timeouts

    def enter(phase: str) -> None:
        state.phase = phase
        events.emit("agent_phase", agent=agent, fork=state.fork, phase=phase,
                    elapsed_s=round(trio.current_time() - state.started, 2))

    try:
        with trio.fail_after(limits.agent):
            enter("fork")
            async with forks.open_fork(job.source, name=fork_name(agent, job.task_id),
                                       ttl_seconds=int(limits.task) + 300,
                                       create_timeout_s=limits.fork) as fork:
                state.fork = fork.name
                events.emit("fork_created", agent=agent, fork=fork.name,
                            duration_s=trio.current_time() - state.started)
                async with open_connection(fork.dsn, job.statement_timeout_ms) as conn:
                    outcome = await _work_in_fork(conn, job, state, brain, bench_limiter,
                                                  events, enter, shared or SharedMeasurements())
            enter("done")
            # the agent's time includes closing its fork
            return dataclasses.replace(outcome, duration_s=trio.current_time() - state.started)
    except trio.TooSlowError:
        limit = {"fork": limits.fork, "analysis": limits.model, "propose": limits.model,
                 "benchmark": limits.benchmark}.get(state.phase, limits.agent)
        reason = f"timed out in the {state.phase} phase (limit {limit:g} s)"
    except AfsError as exc:
        reason = str(exc)
    events.emit("agent_failed", agent=agent, fork=state.fork,
                duration_s=trio.current_time() - state.started, phase=state.phase, error=reason)
    return state.outcome("failed", reason)


async def _work_in_fork(conn: Connection, job: AgentJob, state: _Progress, brain: Brain,
                        bench_limiter: trio.CapacityLimiter, events: Emitter,
                        enter: Callable[[str], None], shared: SharedMeasurements) -> AgentOutcome:
    agent, limits = state.agent, job.timeouts
    enter("analysis")
    t0 = trio.current_time()
    ctx = await gather_context(conn, task_id=job.task_id, task_type=job.task_type,
                               query=job.query, features=job.features,
                               source_stats=job.source_stats)
    main = ctx.tables.get(job.features.main_table or "")
    suite, skipped = build_suite(job.query, main, _alias_of(job.features))
    ctx = dataclasses.replace(ctx, suite=suite)
    state.skipped = tuple(skipped)
    with trio.fail_after(limits.model):
        state.analysis = await brain.analyze(agent, ctx)
    events.emit("analysis_completed", agent=agent, fork=state.fork,
                duration_s=trio.current_time() - t0, insights=list(state.analysis.insights[:3]))

    enter("propose")
    t0 = trio.current_time()
    with trio.fail_after(limits.model):
        state.proposal = await brain.propose(agent, ctx, state.analysis)
    if state.proposal is None:
        events.emit("proposal_submitted", agent=agent, fork=state.fork,
                    duration_s=trio.current_time() - t0, proposal_type=None)
        return state.outcome("ok")
    proposal = state.proposal
    state.validation = validate_proposal(proposal.sql_commands, proposal.proposal_type)
    if not state.validation.is_valid:
        reasons = "; ".join(f"{r.reason}: {r.statement[:80]}" for r in state.validation.rejected)
        events.emit("proposal_rejected", agent=agent, fork=state.fork, reason=reasons)
        return state.outcome("rejected", f"unsafe SQL refused: {reasons}")
    if state.validation.rollback_commands:
        # the rollback derived from the parsed SQL, not what the brain wrote
        proposal = state.proposal = dataclasses.replace(
            proposal, rollback_commands=state.validation.rollback_commands)
    candidate_suite: tuple[QueryVariant, ...] | None = None
    if proposal.rewritten_query is not None:
        try:
            rewritten = check_query(proposal.rewritten_query)
        except UnsafeSqlError as exc:
            events.emit("proposal_rejected", agent=agent, fork=state.fork, reason=exc.reason)
            return state.outcome("rejected", f"unsafe rewrite refused: {exc}")
        candidate_suite, _ = build_suite(rewritten, None, None)
    events.emit("proposal_submitted", agent=agent, fork=state.fork,
                duration_s=trio.current_time() - t0, proposal_type=proposal.proposal_type,
                sql=list(proposal.sql_commands))

    async def measure() -> BenchmarkOutcome:
        enter("waiting for the benchmark slot")
        t0 = trio.current_time()
        async with bench_limiter:
            state.waited_s += trio.current_time() - t0
            enter("benchmark")
            with trio.fail_after(limits.benchmark):
                return await benchmark(conn, suite, proposal, candidate_suite=candidate_suite,
                                       tables=job.features.tables, runs=job.runs,
                                       skipped=state.skipped)

    def waiting(owner: AgentKey) -> None:
        events.emit("measurement_shared", agent=agent, fork=state.fork, measured_by=owner)
        enter("waiting for a shared measurement")

    t0 = trio.current_time()
    outcome, state.measured_by = await shared.measure(agent, proposal, measure, waiting)
    if state.measured_by is not None:
        state.waited_s += trio.current_time() - t0
    events.emit("benchmark_completed", agent=agent, fork=state.fork,
                duration_s=trio.current_time() - t0, measured_by=state.measured_by,
                average_improvement_pct=round(outcome.average_improvement_pct, 1),
                storage_delta_mb=outcome.storage_delta_mb, equivalent=outcome.equivalent)
    if not outcome.equivalent:
        differing = ", ".join(m.name for m in outcome.measurements if not m.equivalent)
        return state.outcome("rejected", f"the proposal changes query results ({differing})",
                             outcome)
    return state.outcome("ok", None, outcome)


def _alias_of(features: QueryFeatures) -> str | None:
    for alias, table in features.aliases.items():
        if table == features.main_table and alias != table:
            return alias
    return None
