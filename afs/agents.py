"""One workflow, several brains.

The workflow is the same for every agent (the seed's agent contract):

    open fork (MCP service_fork) ─► the user's plan settings given to it, its plan of the
    query compared with the source's (afs.conditions) ─► analyse (EXPLAIN ANALYZE, schema, pg_stats)
    ─► propose (the brain) ─► validate (SQL allow-list) ─► benchmark (the suite,
    before vs after, same fork) ─► the loop: the plan of the query with the best design in
    place, its bottleneck (afs.pg.bottleneck), the brain's extended design (a RefiningBrain),
    validated and measured the same way, kept while it gains on the step before (`gains`:
    beyond the noise, and by more than the ranking's "as fast") ─► the two best designs head
    to head in this fork when only the score would tell them
    apart (`tie_to_settle`, `_settle`) ─► close fork (MCP service_delete), always

The squad searches rather than repeats: a design another agent of the task measures already
does not take a measuring slot (its measurement is taken afterwards, `TaskMeasurements.taken`);
the slot goes to the agent's next design, and once its own are spent, to a design of the squad
nobody measures: another agent's candidate (every agent offers its candidates to the task's
pool, `TaskMeasurements.offered`), else a variant of the squad's designs its brain makes (a
`VaryingBrain`: covering or plain, another column order, partial or full). Those are admitted,
screened with the planner and measured like the agent's own, and only where the planner expects
a gain (`expects_gain`); the agent's measuring budget stays Measuring.measured.

The brain is a `Brain`: an offline strategist (`StrategistBrain`) or a model.
Expected failures come back as data (`AgentOutcome(status="failed")`); only
bugs escape.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from afs.analysis import SourceStats, explain_analyze, gather_context
from afs.bench import (
    MIN_EFFECT,
    NOT_FURTHER,
    Contest,
    Earlier,
    Reuse,
    Runners,
    Suites,
    TaskMeasurements,
    benchmark,
    capped,
    contest,
    family_cap_ms,
    hideable_indexes,
    hiding,
    measure_before,
    past_timeout_check,
    planner_cost,
    result_of,
    run_design,
    timing,
    undo,
)
from afs.bench import apply as apply_proposal
from afs.brains import Brain, RefiningBrain, RevisingBrain, StepSeen, VaryingBrain
from afs.brains.strategists.rewrites import keyset_probe, keyset_rewrite
from afs.catalog import catalog_problems, lost_rows, table_fingerprints
from afs.conditions import carry_into_fork, check_plan
from afs.config import Measuring, Timeouts
from afs.consensus import DRIFT_RATIO, Candidate, family_speedups, score, serves_family_clearly_better
from afs.db import Connection, open_connection
from afs.errors import (
    AfsError,
    DatabaseError,
    InputError,
    ProposalFailedError,
    StatementTimeout,
    single_leaf,
)
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.forks.naming import fork_name
from afs.locks import server_lock
from afs.models import (
    AgentKey,
    AgentOutcome,
    AgentStatus,
    AnalysisContext,
    AnalysisResult,
    BenchmarkOutcome,
    CandidateResult,
    EstimatedImpact,
    FamilyQuery,
    LoopStep,
    OptimizationProposal,
    ParameterCheck,
    PlanCheck,
    QueryFeatures,
    QueryVariant,
    ScoreBreakdown,
    TableInfo,
    TaskType,
    Timing,
    UserConditions,
    ValidationResult,
    WriteWorkload,
)
from afs.params.family import ParameterSet, apply_parameters, baked_literals, parameter_sets, stored_rows
from afs.pg.bottleneck import Bottleneck, bottlenecks
from afs.pg.names import quote_literal
from afs.pg.plan import fmt_ms, plan_of
from afs.query.query import Query
from afs.query.text import check_input
from afs.replay import with_write_cost
from afs.safety import check_query, creates, proposal_references, validate_candidate
from afs.suite import build_suite

AS_FAST_RATIO = 1.1  # a candidate leaving at most 1.1x the fastest one's share of the time is as fast
AS_FAST_MS = 0.3  # … or one within 0.3 ms of its time (below that, timings are mostly noise)
LOOP_SHARE_OF_TIME_LEFT = 0.5  # the loop takes at most this share of the agent's time left
LOOP_STARTS = 3  # measured designs the loop tries to extend, the best first
LOOP_CLEAR_RATIO = 1.5  # a step this many times faster that reads fewer buffers gains (`beats`)
PLAN_AHEAD_MS = 1000.0  # a design this fast on the query as given has its after-plan read while in place
LOOP_ALTERNATIVES = 2  # other bottlenecks a loop step asks about when another agent measures its design
DOMINATED_RATIO = 4.0  # a design this many times slower than one measured already is measured no further
SERVED_RATIO = 1.5  # … one that serves each other value timed at least this many times faster
PROMISING_COST = 0.9  # a design of the squad costing at most this share of the query's is expected to gain


@dataclass(frozen=True)
class AgentJob:
    """What one agent needs to do its part of a task."""

    task_id: str
    task_type: TaskType
    query: str
    features: QueryFeatures
    source: str  # the service to fork
    source_stats: Mapping[str, SourceStats]  # by table: what its forks cannot tell
    timeouts: Timeouts
    measuring: Measuring  # runs, stop rule, budget, candidates, parameter sets, timeouts of SQL
    given_sets: tuple[ParameterSet, ...] = ()  # the task's own other values (then none drawn)
    source_server: Mapping[str, str] = field(default_factory=dict)  # AnalysisContext.source_server
    source_imported: bool = False
    conditions: UserConditions | None = None  # the user's server: settings forks take, its plan
    workload: WriteWorkload | None = None  # the writes of its tables (the batch's): new indexes' cost


@dataclass(frozen=True)
class _InFork:
    """One agent at work in its fork: the fork's connection, the task, the agent's progress, the
    task's benchmark slot and its events (what travels together into `_work_in_fork`)."""

    conn: Connection
    job: AgentJob
    state: _Progress
    bench_limiter: trio.CapacityLimiter
    events: Emitter
    squad: int = 1  # the task's agents (TaskCommon.squad)


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
    candidates: tuple[CandidateResult, ...] = ()
    writes_per_read: dict[str, float] = field(default_factory=dict)
    shared_by: dict[int, AgentKey] = field(default_factory=dict)  # rank -> agent that measured it
    revisions: int = 0  # rewrites sent back to the brain after failing the result check
    plan_check: PlanCheck | None = None  # the query's plan in the fork against the source's
    superseded: set[int] = field(default_factory=set)  # ranks of the loop's steps before its last kept one

    def outcome(self, status: AgentStatus, error: str | None = None,
                bench: BenchmarkOutcome | None = None) -> AgentOutcome:
        return AgentOutcome(
            agent=self.agent, status=status, error=error, fork=self.fork,
            analysis=self.analysis, proposal=self.proposal, validation=self.validation,
            benchmark=bench, duration_s=trio.current_time() - self.started, waited_s=self.waited_s,
            measured_by=self.measured_by, candidates=self.candidates,
            writes_per_read=dict(self.writes_per_read), plan_check=self.plan_check)


@dataclass(frozen=True)
class TaskCommon:
    """What a task's agents have in common, passed whole to each `run_agent`: the fork client,
    the task's benchmark slot (its phases never overlap on one server), its events, and what its
    measurements share (identical proposals are measured once)."""

    forks: ForkClient
    bench_limiter: trio.CapacityLimiter
    events: Emitter
    measurements: TaskMeasurements = field(default_factory=TaskMeasurements)
    squad: int = 1  # the task's agents (a lone agent's slots stay its own designs')


async def run_agent(agent: AgentKey, job: AgentJob, *, brain: Brain, common: TaskCommon) -> AgentOutcome:
    """The whole workflow of one agent; expected failures are returned, not raised."""
    forks, bench_limiter, events = common.forks, common.bench_limiter, common.events
    state = _Progress(agent=agent, started=trio.current_time())
    limits = job.timeouts

    def enter(phase: str, **data: Any) -> None:
        state.phase = phase
        events.emit("agent_phase", agent=agent, fork=state.fork, phase=phase,
                    elapsed_s=round(trio.current_time() - state.started, 2), **data)

    try:
        with trio.fail_after(limits.agent):
            enter("fork")
            async with forks.open_fork(job.source, name=fork_name(agent, job.task_id),
                                       ttl_seconds=int(limits.task) + 300,
                                       create_timeout_s=limits.fork) as fork:
                state.fork = fork.name
                events.emit("fork_created", agent=agent, fork=fork.name,
                            duration_s=trio.current_time() - state.started)
                # every log line inside the fork names it (task id and agent are bound by the task)
                with structlog.contextvars.bound_contextvars(fork=fork.name):
                    # the user's plan settings as the fork's own, before its sessions start
                    timeout_ms = job.measuring.statement_timeout_ms
                    carried, gaps = await carry_into_fork(fork.dsn, fork.name, job.conditions, timeout_ms)
                    async with open_connection(fork.dsn, timeout_ms) as conn:
                        # the same plan as on the source, or a warning: before any measurement
                        state.plan_check = await check_plan(conn, job.query, job.conditions,
                                                            carried, gaps)
                        if state.plan_check is not None:
                            events.emit("plan_compared", agent=agent, fork=fork.name,
                                        matches=state.plan_check.matches,
                                        differences=list(state.plan_check.differences))
                        in_fork = _InFork(conn, job, state, bench_limiter, events, common.squad)
                        outcome = await _work_in_fork(in_fork, brain, enter, common.measurements)
                closing = trio.current_time()
            # how long closing the fork took (its delete through the fork server)
            enter("done", fork_closed_s=round(trio.current_time() - closing, 3))
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


async def _work_in_fork(fork: _InFork, brain: Brain, enter: Callable[[str], None],
                        shared: TaskMeasurements) -> AgentOutcome:
    conn, job, state, bench_limiter, events = fork.conn, fork.job, fork.state, fork.bench_limiter, fork.events
    agent, limits = state.agent, job.timeouts
    enter("analysis")
    t0 = trio.current_time()
    ctx, skipped = await shared.analysis(functools.partial(_analyse, conn, job))
    state.writes_per_read = {name: info.writes_per_read for name, info in ctx.tables.items()}
    state.skipped, suite = skipped, ctx.suite
    family = await trio.to_thread.run_sync(_family, job, ctx)
    reuse = shared.reuse.for_fork()  # what this fork has run already is its own
    try:
        async with trio.open_nursery() as thinking:
            # the first agent of the task measures the queries before any change meanwhile
            if job.measuring.adaptive and not ctx.slow and shared.claim_before():
                thinking.start_soon(functools.partial(
                    _measure_before, fork, ctx, family, reuse))
            with trio.fail_after(limits.model):
                state.analysis = await brain.analyze(agent, ctx)
            events.emit("analysis_completed", agent=agent, fork=state.fork,
                        duration_s=trio.current_time() - t0, insights=list(state.analysis.insights[:3]))

            enter("propose")
            t0 = trio.current_time()
            with trio.fail_after(limits.model):
                everything = tuple(await brain.propose(agent, ctx, state.analysis))
            offer(shared.offered, everything)  # the squad's pool: for slots shared measurements free
            # the designs beyond the screening budget: measured only in a slot whose design
            # another agent measures, when no screened design is left (the squad searches)
            screened = job.measuring.candidates
            proposals, beyond = everything[:screened], list(everything[screened:])
            if not proposals:
                thinking.cancel_scope.cancel()  # nothing to measure against it
                events.emit("proposal_submitted", agent=agent, fork=state.fork,
                            duration_s=trio.current_time() - t0, proposal_type=None)
                if not _loops(job, brain):
                    return state.outcome("ok")
            else:
                events.emit("proposal_submitted", agent=agent, fork=state.fork,
                            duration_s=trio.current_time() - t0, proposal_type=proposals[0].proposal_type,
                            sql=list(proposals[0].sql_commands), candidates=len(proposals))
            if thinking.child_tasks:
                enter("waiting for the baseline")
    except BaseExceptionGroup as group:  # the nursery wraps what the model calls raise
        leaf = single_leaf(group)
        if leaf is group:
            raise
        raise leaf from None

    tried: dict[int, CandidateResult] = {}
    checked: list[tuple[int, OptimizationProposal, ValidationResult, tuple[QueryVariant, ...] | None]] = []
    for rank, proposal in enumerate(proposals, 1):
        validation, candidate_suite, refused = await _admit(conn, proposal)
        if refused is not None:
            events.emit("proposal_rejected", agent=agent, fork=state.fork, reason=refused, rank=rank)
            tried[rank] = CandidateResult(proposal, "rejected", rank, validation, note=refused)
            continue
        if validation.rollback_commands:
            # the rollback derived from the parsed SQL, not what the brain wrote
            proposal = dataclasses.replace(proposal, rollback_commands=validation.rollback_commands)
        checked.append((rank, proposal, validation, candidate_suite))
    if not checked and proposals:
        state.candidates = tuple(tried[r] for r in sorted(tried))
        first = state.candidates[0]
        state.proposal, state.validation = first.proposal, first.validation
        return state.outcome("rejected", first.note)

    enter("screen")
    costs: dict[int, float | None] = {}
    baseline_cost: float | None = None
    # the planner chooses only when some candidate cannot be measured; else every candidate's
    # cost is read in the fork where it is measured (it is built there anyway)
    choosing = len(checked) > job.measuring.measured
    if len(checked) > 1:
        baseline_cost = await planner_cost(conn, job.query)
    if choosing:
        for rank, proposal, validation, _ in checked:
            if proposal.proposal_type == "partitioning":
                costs[rank] = None  # moving the data is too slow to try in a transaction
                continue
            try:
                costs[rank] = await shared.screen(proposal, functools.partial(
                    planner_cost, conn, proposal.rewritten_query or job.query, proposal))
            except ProposalFailedError as exc:
                tried[rank] = CandidateResult(proposal, "failed", rank, validation,
                                              baseline_cost=baseline_cost, note=str(exc))
    if choosing:
        events.emit("candidates_screened", agent=agent, fork=state.fork, baseline_cost=baseline_cost,
                    costs={str(r): c for r, c in costs.items()})
    unmeasured = [(rank, costs.get(rank), proposal.proposal_type == "partitioning")
                  for rank, proposal, _, _ in checked if rank not in tried]
    chosen = choose_for_measurement(unmeasured, baseline_cost, job.measuring.measured)
    # the designs beyond the budget, in the same order: a slot whose design another agent
    # measures already goes to the next of them (the squad searches, it does not repeat)
    spares = [r for r in choose_for_measurement(unmeasured, baseline_cost, len(unmeasured))
              if r not in chosen]

    by_rank = {rank: (proposal, validation, cs) for rank, proposal, validation, cs in checked}
    in_place = _InPlace(conn)
    # the loop's after-plans, read while each design measured here was in place (by its key):
    # the loop need not build a design again only to read its plan
    plans: dict[Any, tuple[dict[str, Any], bool]] = {}

    async def members_for(proposal: OptimizationProposal) -> tuple[FamilyQuery, ...]:
        members = await trio.to_thread.run_sync(_family_for, job.query, family, proposal)
        if proposal.needs_application_change and ctx.keyset_last_key is not None:
            members = await _keyset_family(conn, members, ctx.tables)
        return members

    async def measure_design(rank: int, proposal: OptimizationProposal, validation: ValidationResult,
                             candidate_suite: tuple[QueryVariant, ...] | None,
                             step: _StepBefore = _StepBefore(),
                             members: tuple[FamilyQuery, ...] | None = None) -> CandidateResult | None:
        """One design measured (or its measurement taken from the agent that measures it):
        its result, also in `tried`; None when the fork's state is unknown after it.
        `step`: what the measurements before it leave it (`_StepBefore`)."""
        must_beat, held, held_s, dominated = step.must_beat, step.held, step.held_s, step.dominated
        measured_here = False
        short: str | None = None  # why the measurement stopped after the query as given

        def enough(new: Timing) -> bool:
            nonlocal short
            if must_beat is not None and not gains(must_beat, new):
                short = "no gain on the step before"
            elif dominated is not None and far_slower(new, dominated[1]):
                short = (f"{fmt_ms(new.median_ms)} there, {new.median_ms / dominated[1].median_ms:,.0f}x"
                         f" the time of #{dominated[0]} ({fmt_ms(dominated[1].median_ms)})")
            return short is None
        if members is None:
            members = await members_for(proposal)

        # the agent's time (run_agent's limit, not a loop's own) less what closing its fork takes:
        # a measurement made here, or the wait for another agent's, ends by then, so what the
        # agent has measured is still reported
        until = state.started + limits.agent - limits.closing
        # the waits: for the benchmark slot, for another agent's measurement (`waiting`)
        waited = trio.CancelScope()

        async def measure() -> BenchmarkOutcome:
            nonlocal measured_here
            waited.deadline = until
            enter("waiting for the benchmark slot")
            t0 = trio.current_time()
            # in this process, then among processes measuring on the same server
            async with bench_limiter, server_lock(conn, "benchmark"):
                waited.deadline = math.inf  # measured here: its own limit below
                state.waited_s += trio.current_time() - t0
                enter("benchmark")
                measured_here = True
                timed, known = split_slow_family(members, shared.slow_family)
                with trio.fail_at(min(trio.current_time() + limits.benchmark + job.measuring.slow_cap_s,
                                      until)):
                    rows_kept = await _rows_kept(conn, proposal)
                    outcome = await benchmark(
                        conn, Suites(suite, job.features.tables, candidate_suite=candidate_suite,
                                     skipped=state.skipped, family=timed),
                        proposal, policy=job.measuring,
                        earlier=Earlier(known_slow=ctx.slow, reuse=reuse, enough=enough, held=held,
                                        held_s=held_s))
                    in_place.proposal = proposal  # the benchmark leaves it applied
                    await rows_kept()
                    if short is not None:  # not the whole measurement: not for another agent to take
                        raise _Short(outcome, short)
                    now = query_timing(outcome)
                    if (_loops(job, brain) and not ctx.slow and now is not None
                            and now.median_ms <= PLAN_AHEAD_MS):
                        plans[TaskMeasurements.key(proposal)] = await after_plan(
                            conn, proposal.rewritten_query or job.query, proposal, False)
                    if baseline_cost is not None and proposal.proposal_type != "partitioning":
                        # the planner's cost with the proposal in place, for the record (and
                        # for an agent that screens the same design later)
                        with contextlib.suppress(ProposalFailedError):
                            await shared.screen(proposal, functools.partial(
                                planner_cost, conn, proposal.rewritten_query or job.query, proposal,
                                applied=True))
                    shared.slow_family.update(slow_originals(timed, outcome))
                    # issue 28: a new index's cost to the task's writes, replayed with it in place
                    outcome = await with_write_cost(conn, outcome, proposal, job.workload, job.measuring)
                    # still with the proposal in place: check its rows for the members skipped
                    exact = all(v.exact for v in (*suite[:1], *(candidate_suite or ())[:1]))
                    return with_known_slow(outcome, await _result_checks(
                        conn, known, reuse, exact, job.measuring.statement_timeout_ms,
                        family_cap_ms(job.measuring, len(suite) + len(members))))

        def waiting(owner: AgentKey) -> None:
            events.emit("measurement_shared", agent=agent, fork=state.fork, measured_by=owner)
            enter("waiting for a shared measurement")
            waited.deadline = until

        if not held and not await in_place.clear():  # the fork as analysed before the next design
            events.emit("agent_phase", agent=agent, fork=state.fork, phase="undo failed",
                        error=in_place.error)
            return None
        t0 = trio.current_time()
        try:
            # (no checkpoint since the caller asked `shared.taken`: the claim is this call's)
            with waited:
                outcome, measured_by = await shared.measure(agent, proposal, measure, waiting)
            if waited.cancelled_caught:
                raise ProposalFailedError("not measured: this agent's time ran out waiting for the benchmark"
                                          " slot or for another agent's measurement of the same design")
        except _Short as stopped:
            tried[rank] = CandidateResult(
                proposal, "measured", rank, validation, baseline_cost=baseline_cost,
                planner_cost=costs.get(rank, shared.screened(proposal)), benchmark=stopped.outcome,
                note=f"measured on the query as given only: {stopped.why}")
            return tried[rank]
        except (ProposalFailedError, DatabaseError, trio.TooSlowError) as exc:
            # a measurement past its limit or the agent's time fails this design, not the agent
            note = str(exc) if not isinstance(exc, trio.TooSlowError) else (
                "measuring it did not finish within the benchmark limit or the agent's time")
            tried[rank] = CandidateResult(proposal, "failed", rank, validation,
                                          planner_cost=costs.get(rank), baseline_cost=baseline_cost,
                                          note=note)
            if measured_here:
                in_place.proposal = None
                if not await _undone(conn, proposal):
                    in_place.unknown = True  # measure nothing more in this fork
                    return None
            return tried[rank]
        if measured_by is not None:
            state.waited_s += trio.current_time() - t0
            state.shared_by[rank] = measured_by
        events.emit("benchmark_completed", agent=agent, fork=state.fork,
                    duration_s=trio.current_time() - t0, measured_by=measured_by, rank=rank,
                    average_improvement_pct=round(outcome.average_improvement_pct, 1),
                    storage_delta_mb=outcome.storage_delta_mb, equivalent=outcome.equivalent)
        note = f"measured by {measured_by} (the same proposal)" if measured_by else ""
        tried[rank] = CandidateResult(proposal, "measured", rank, validation,
                                      planner_cost=costs.get(rank, shared.screened(proposal)),
                                      baseline_cost=baseline_cost, benchmark=outcome, note=note)
        return tried[rank]

    async def admit_beyond() -> list[int]:
        """The next design beyond the screening budget that nobody measures, admitted (its rank)."""
        while beyond:
            extra = beyond.pop(0)
            if shared.taken(agent, extra) is not None:
                continue
            new_rank = max([*tried, *by_rank], default=0) + 1
            extra_validation, extra_suite, refused = await _admit(conn, extra)
            if refused is not None:
                tried[new_rank] = CandidateResult(extra, "rejected", new_rank, extra_validation, note=refused)
                continue
            if extra_validation.rollback_commands:
                extra = dataclasses.replace(extra, rollback_commands=extra_validation.rollback_commands)
            by_rank[new_rank] = (extra, extra_validation, extra_suite)
            return [new_rank]
        return []

    passed: set[Any] = set()  # designs of the squad refused here, or the planner expects nothing of
    variants_of: dict[Any, tuple[OptimizationProposal, ...]] = {}  # by the key of the design varied

    async def admit_from_squad() -> list[int]:
        """When the agent's own designs are spent, a design of the squad nobody measures: another
        agent's candidate (`pooled`), else a variant its brain makes of the squad's designs (a
        VaryingBrain). At most Measuring.candidates of them are admitted here and screened with
        the planner, and the one it expects most of is measured; never one it expects no gain
        from (`expects_gain`). Its rank ([] when there is none). The fork holds no design now."""
        nonlocal baseline_cost
        key, limit = TaskMeasurements.key, max(1, job.measuring.candidates)
        mine = {key(c.proposal) for c in tried.values()} | {key(p) for p, _, _ in by_rank.values()}

        def free(design: OptimizationProposal) -> bool:
            k = key(design)
            return k not in mine and k not in passed and shared.taken(agent, design) is None

        pool = pooled(shared.offered)
        for source in ("pool", "variants"):
            if source == "pool":
                options = squad_options(pool, free, limit)
            else:
                if not isinstance(brain, VaryingBrain):
                    return []
                found: list[OptimizationProposal] = []
                for design in pool:
                    if key(design) not in variants_of:
                        variants_of[key(design)] = tuple(await brain.variants(agent, ctx, design))
                    found.extend(variants_of[key(design)])
                    if len(squad_options(found, free, limit)) >= limit:
                        break
                options = squad_options(found, free, limit)
            if not options:
                continue
            if baseline_cost is None:
                baseline_cost = await planner_cost(conn, job.query)
            screened: list[tuple[float, OptimizationProposal, ValidationResult,
                                 tuple[QueryVariant, ...] | None]] = []
            for option in options:
                if option.proposal_type == "partitioning":  # too slow to try for a spare slot
                    passed.add(key(option))
                    continue
                if option.agent != agent:
                    option = dataclasses.replace(option, agent=agent, rationale=(
                        f"A design of {option.agent}, measured here in a slot a shared measurement "
                        f"freed. {option.rationale}"))
                validation, candidate_suite, refused = await _admit(conn, option)
                if refused is not None:
                    passed.add(key(option))
                    continue
                if validation.rollback_commands:
                    option = dataclasses.replace(option, rollback_commands=validation.rollback_commands)
                try:
                    cost = await shared.screen(option, functools.partial(
                        _bounded_cost, conn, option.rewritten_query or job.query, option, job.measuring))
                except ProposalFailedError:
                    passed.add(key(option))
                    continue
                if not expects_gain(cost, baseline_cost):
                    passed.add(key(option))
                    continue
                screened.append((cost, option, validation, candidate_suite))
            if screened:
                cost, option, validation, candidate_suite = min(screened, key=lambda s: s[0])
                new_rank = max([*tried, *by_rank], default=0) + 1
                by_rank[new_rank], costs[new_rank] = (option, validation, candidate_suite), cost
                events.emit("squad_design", agent=agent, fork=state.fork, rank=new_rank, source=source,
                            planner_cost=cost, baseline_cost=baseline_cost)
                return [new_rank]
        return []

    queue = list(chosen)
    deferred: list[int] = []  # designs another agent measures: their measurement is taken last

    def fastest_known() -> tuple[int, Timing] | None:
        """`fastest_measured` of the agent's designs measured so far, here or by another agent
        (a shared measurement that is done, though taken last)."""
        done = [CandidateResult(by_rank[r][0], "measured", r, by_rank[r][1], benchmark=outcome)
                for r in deferred if (outcome := shared.finished(by_rank[r][0])) is not None]
        return fastest_measured([*tried.values(), *done])
    used = 0  # the measuring slots this agent has spent (a design taken over spends none)
    while not in_place.unknown:
        if not queue and fork.squad > 1 and used < job.measuring.measured:
            # a slot its own designs leave unused goes to a design of the squad nobody measures
            # (a lone agent has no squad to search with: its slots stay its own designs')
            if not await in_place.clear():
                events.emit("agent_phase", agent=agent, fork=state.fork, phase="undo failed",
                            error=in_place.error)
                break
            queue.extend(await admit_from_squad())
        if not queue:
            break
        rank = queue.pop(0)
        proposal, validation, candidate_suite = by_rank[rank]
        members = await members_for(proposal)
        if not await in_place.clear():
            events.emit("agent_phase", agent=agent, fork=state.fork, phase="undo failed",
                        error=in_place.error)
            break
        # asked with no checkpoint before measure_design claims it: two agents cannot both see
        # a design free and both measure it
        owner = shared.taken(agent, proposal)
        if owner is not None:
            deferred.append(rank)
            if not spares:
                spares.extend(await admit_beyond())
            if not spares:  # the agent's own designs are spent: one of the squad's nobody measures
                spares.extend(await admit_from_squad())
            if spares:
                queue.append(spares.pop(0))
                events.emit("measurement_pooled", agent=agent, fork=state.fork, rank=rank,
                            measured_by=owner, instead=queue[-1])
            continue
        used += 1
        result = await measure_design(rank, proposal, validation, candidate_suite,
                                      _StepBefore(dominated=fastest_known()), members=members)
        if result is None:
            break
        if (result.status != "measured" or result.benchmark is None
                or NOT_FURTHER in result.benchmark.skipped):
            continue
        revised = await _revise_rewrite(brain, ctx, state, result, limits.model, events)
        if revised is not None:  # measured next, as one more candidate (at most once per agent)
            new_rank = max([*tried, *by_rank]) + 1
            revised_validation, revised_suite, refused = await _admit(conn, revised)
            if refused is not None:
                tried[new_rank] = CandidateResult(revised, "rejected", new_rank, revised_validation,
                                                  note=refused)
            else:
                if revised_validation.rollback_commands:
                    revised = dataclasses.replace(revised,
                                                  rollback_commands=revised_validation.rollback_commands)
                by_rank[new_rank] = (revised, revised_validation, revised_suite)
                queue.append(new_rank)
    for rank in deferred:  # the shared measurements (measured here after all if their agent failed)
        if in_place.unknown:
            break
        proposal, validation, candidate_suite = by_rank[rank]
        # measured here when its agent's measurement failed or stopped short (not shared)
        if await measure_design(rank, proposal, validation, candidate_suite,
                                _StepBefore(dominated=fastest_known())) is None:
            break
    for rank, proposal, validation, _ in checked:
        if rank not in tried:
            tried[rank] = CandidateResult(
                proposal, "screened_out", rank, validation, planner_cost=costs.get(rank),
                baseline_cost=baseline_cost,
                note="beyond the measuring budget: the planner expects less of it than of those measured")

    if _loops(job, brain) and not in_place.unknown:
        assert isinstance(brain, RefiningBrain)
        loop = _Loop(job, ctx, state, brain, in_place, events, enter, measure_design, tried, by_rank,
                     taken=functools.partial(shared.taken, agent), plans=plans,
                     head_to_head=functools.partial(step_contest, fork, shared, in_place))
        # within its budget, and within half the time the agent has left: what it measured
        # so far must still be reported
        left = trio.current_effective_deadline() - trio.current_time()
        with trio.move_on_after(min(job.measuring.loop_budget_s, LOOP_SHARE_OF_TIME_LEFT * left)):
            try:
                await loop.run()
            except AfsError as exc:  # a model's or the fork's error ends the loop, not the agent
                loop.stopped = f"stopped by an error: {exc}"
        loop.record()

    state.candidates = tuple(tried[r] for r in sorted(tried))
    if not state.candidates:  # nothing proposed, and the loop found nothing either
        return state.outcome("ok")
    slower = frozenset[int]() if in_place.unknown else await _settle(fork, shared, in_place)
    return _best(state, slower)


CONTEST_SHARE_OF_TIME_LEFT = 0.5  # a head-to-head takes at most this share of the agent's time left


async def _settle(fork: _InFork, shared: TaskMeasurements, in_place: _InPlace) -> frozenset[int]:
    """The agent's two best designs head to head when their measurements do not tell them
    apart and complexity points would (`tie_to_settle`): both in place in this fork, each run
    with the other's objects hidden, pair by pair (afs.bench.contest), once per task
    (`TaskMeasurements.settle`). Returns the ranks of the design measured slower (none when
    neither is faster beyond the noise: the score decides, as before); both candidates' notes
    say what was found."""
    conn, job, state = fork.conn, fork.job, fork.state
    measured = [c for c in state.candidates if c.status == "measured" and c.benchmark is not None
                and c.rank not in state.superseded and not c.benchmark.answer_cache]
    pair = tie_to_settle(state.agent, measured, state.writes_per_read)
    if pair is None:
        return frozenset()
    first, second = pair
    key = TaskMeasurements.key

    async def run(a: OptimizationProposal, b: OptimizationProposal) -> Contest:
        hide_a, hide_b = hiding(a), hiding(b)
        assert hide_a is not None and hide_b is not None
        async with fork.bench_limiter, server_lock(conn, "benchmark"):
            if not await in_place.put(a):
                raise ProposalFailedError(f"applying a design for the head-to-head failed: {in_place.error}")
            in_place.unknown = True  # both in place, only one recorded: nothing more is measured here
            await apply_proposal(conn, b)
            return await contest(Runners(
                functools.partial(run_design, conn, a, hide_b, a.rewritten_query or job.query),
                functools.partial(run_design, conn, b, hide_a, b.rewritten_query or job.query)),
                job.measuring)

    left = trio.current_effective_deadline() - trio.current_time()
    with trio.move_on_after(CONTEST_SHARE_OF_TIME_LEFT * left):
        try:
            found = await shared.settle(first.proposal, second.proposal, run)
        except (ProposalFailedError, DatabaseError) as exc:
            fork.events.emit("candidates_contested", agent=state.agent, fork=state.fork,
                             ranks=[first.rank, second.rank], error=str(exc))
            return frozenset()
        a, b = timing(found.first), timing(found.second)
        fork.events.emit("candidates_contested", agent=state.agent, fork=state.fork,
                         ranks=[first.rank, second.rank], ms=[a.median_ms, b.median_ms],
                         pairs=len(found.first), faster=found.faster)
        notes = {first.rank: contest_note(found, True, second.rank),
                 second.rank: contest_note(found, False, first.rank)}
        state.candidates = tuple(
            dataclasses.replace(c, note="; ".join(n for n in (c.note, notes[c.rank]) if n))
            if c.rank in notes else c for c in state.candidates)
        if found.faster is None:
            return frozenset()
        loser = second if found.faster == "first" else first
        return frozenset(c.rank for c in measured if key(c.proposal) == key(loser.proposal))
    return frozenset()


# -- the loop: the best design, the plan with it in place, the next design ------------------------
async def step_contest(fork: _InFork, shared: TaskMeasurements, in_place: _InPlace,
                       before: OptimizationProposal, step: OptimizationProposal) -> Contest:
    """A loop step that adds indexes to its step before, and that step, head to head in the fork
    (afs.bench.contest, once per task: TaskMeasurements.settle), in the benchmark slot: the step
    in place, the step before run with the step's new indexes hidden. In the caller's order:
    first `before`, second `step`."""
    conn, policy, query = in_place.conn, fork.job.measuring, fork.job.query
    hide_new = hiding(dataclasses.replace(step, sql_commands=step.sql_commands[len(before.sql_commands):]))
    if not hide_new or step.sql_commands[:len(before.sql_commands)] != before.sql_commands:
        raise ProposalFailedError("a step settled head to head only adds indexes to its step before")

    async def run(a: OptimizationProposal, b: OptimizationProposal) -> Contest:
        async with fork.bench_limiter, server_lock(conn, "benchmark"):
            if not await in_place.put(step):
                raise ProposalFailedError(f"putting the step in place failed: {in_place.error}")
            return await contest(Runners(*(
                functools.partial(run_design, conn, d, hide_new if d is before else (), query)
                for d in (a, b))), policy)
    return await shared.settle(before, step, run)


@dataclass(frozen=True)
class _StepBefore:
    """What a design's measurement takes from the ones before it. A loop step's, from its step
    before: `must_beat`, the step before's timing: not measured faster than it (`gains`) on the
    query as given, the step is measured no further (that measurement is not shared); `held`,
    the step's leading index builds, in place in the fork already, and `held_s` the time they
    took (`afs.bench.benchmark`). Any design's: `dominated`, the rank and time of the agent's
    fastest design measured already (`fastest_measured`): measured `far_slower` on the query as
    given, the design is measured no further."""

    must_beat: Timing | None = None
    held: tuple[str, ...] = ()
    held_s: float = 0.0
    dominated: tuple[int, Timing] | None = None


MeasureDesign = Callable[[int, OptimizationProposal, ValidationResult, tuple[QueryVariant, ...] | None,
                          _StepBefore], Awaitable[CandidateResult | None]]


class _Short(Exception):
    """A measurement that stopped after the query as given (afs.bench `enough`): a loop step
    that cannot gain, or a design far slower there than one measured already; `why`."""

    def __init__(self, outcome: BenchmarkOutcome, why: str) -> None:
        super().__init__("measured on the query as given only")
        self.outcome, self.why = outcome, why


@dataclass
class _InPlace:
    """What is applied in the fork now: None is the fork as analysed; `unknown` after an undo
    that failed (nothing more is measured in it)."""

    conn: Connection
    proposal: OptimizationProposal | None = None
    unknown: bool = False
    error: str = ""

    async def clear(self) -> bool:
        """The fork as analysed again (the design in place undone by its validated rollback)."""
        if self.unknown:
            return False
        if self.proposal is None:
            return True
        proposal, self.proposal = self.proposal, None
        try:
            await undo(self.conn, proposal.rollback_commands)
        except ProposalFailedError as exc:
            self.unknown, self.error = True, str(exc)
            return False
        return True

    async def put(self, proposal: OptimizationProposal) -> bool:
        """`proposal` alone in place (applied again when another design is there)."""
        key = TaskMeasurements.key
        if self.proposal is not None and key(self.proposal) == key(proposal):
            return True
        if not await self.clear():
            return False
        try:
            await apply_proposal(self.conn, proposal)
        except ProposalFailedError as exc:
            self.error = str(exc)
            if not await _undone(self.conn, proposal):
                self.unknown = True
            return False
        self.proposal = proposal
        return True


def _loops(job: AgentJob, brain: Brain) -> bool:
    """Whether the agent runs the loop: its brain can extend a design, and the budget allows it."""
    return job.measuring.loop_steps > 0 and isinstance(brain, RefiningBrain)


def nothing_yet(agent: AgentKey) -> OptimizationProposal:
    """The design the loop extends when the brain proposed none: the query as it is (its plan
    is the analysis's)."""
    return OptimizationProposal(agent=agent, proposal_type="index", sql_commands=(), rollback_commands=(),
                                rationale="", estimated_impact=EstimatedImpact(0.0, 0.0, "low", "low"))


def query_timing(bench: BenchmarkOutcome | None) -> Timing | None:
    """The measured time of the query as given with the design (the suite's "baseline" query)."""
    if bench is None or not bench.measurements:
        return None
    return next((m for m in bench.measurements if m.name == "baseline"), bench.measurements[0]).optimized


def baseline_timing(bench: BenchmarkOutcome | None) -> Timing | None:
    """The measured time of the query as given, before the design."""
    if bench is None or not bench.measurements:
        return None
    return next((m for m in bench.measurements if m.name == "baseline"), bench.measurements[0]).baseline


def beats(previous: Timing, new: Timing) -> bool:
    """Whether `new` is faster than `previous` beyond the noise: every run of it faster than
    every run of the other (afs.bench.significant's separation, over the runs' range) and the
    medians at least MIN_EFFECT apart; or, where the runs of two measurements overlap (a busy
    server), a median LOOP_CLEAR_RATIO times lower that reads fewer shared buffers (a count
    the noise does not change: the plan does less)."""
    slowest_new = new.max_ms if new.max_ms is not None else new.median_ms + new.spread_ms
    fastest_previous = (previous.min_ms if previous.min_ms is not None
                        else previous.median_ms - previous.spread_ms)
    separated = (slowest_new < fastest_previous
                 and previous.median_ms - new.median_ms >= MIN_EFFECT * previous.median_ms)
    does_less = (new.median_ms * LOOP_CLEAR_RATIO <= previous.median_ms
                 and 0 < new.buffers < previous.buffers)
    return separated or does_less


def far_slower(new: Timing, fastest: Timing) -> bool:
    """Whether a design measured `new` on the query as given is far slower than one measured
    `fastest` already (pure): `fastest` gains on it (`gains`) and its median is at least
    DOMINATED_RATIO times lower, beyond a busy server's drift between two measurements (up to
    2x, afs.bench). The agent's ranking prefers the faster one whatever the design's other
    figures show, so they are not measured."""
    return new.median_ms >= DOMINATED_RATIO * fastest.median_ms and gains(new, fastest)


def fastest_measured(measured: Iterable[CandidateResult]) -> tuple[int, Timing] | None:
    """The rank and time on the query as given of the fastest of `measured` that qualifies so
    far (pure): measured in full (not stopped after the query as given), the same rows, no
    answer cache, no problem with other values, and each of those timed and served (at least
    SERVED_RATIO times faster). A design that holds for today's literals only (a partial index
    on the query's constant, which the other values do not use) must not stop the measurement
    of one that serves them: consensus.serves_family_clearly_better ranks that one first,
    however fast the other is on the query as given. None when there is none."""
    def serves_family(b: BenchmarkOutcome) -> bool:
        speedups = family_speedups(b)
        return (len(speedups) == len(b.parameter_checks)
                and all(s >= SERVED_RATIO for s in speedups.values()))

    timed = [(t, c.rank) for c in measured
             if c.status == "measured" and (b := c.benchmark) is not None and b.equivalent
             and not b.answer_cache and not b.family_problem and NOT_FURTHER not in b.skipped
             and serves_family(b) and (t := query_timing(b)) is not None]
    if not timed:
        return None
    timing, rank = min(timed, key=lambda x: x[0].median_ms)
    return rank, timing


def gains(previous: Timing, new: Timing) -> bool:
    """Whether a loop step gains on the step before: faster beyond the noise (`beats`), and by
    more than the agent's ranking calls as fast (`as_fast`): its median more than
    AS_FAST_RATIO times lower and more than AS_FAST_MS below. A step within that would be
    ranked as fast as the step before, and it adds to what is built and written."""
    return (beats(previous, new) and previous.median_ms > new.median_ms * AS_FAST_RATIO
            and previous.median_ms - new.median_ms > AS_FAST_MS)


async def after_plan(conn: Connection, sql: str, proposal: OptimizationProposal,
                     estimate_only: bool) -> tuple[dict[str, Any], bool]:
    """The plan of `sql` with `proposal` in place (its settings set for this transaction only):
    EXPLAIN (ANALYZE, BUFFERS), or the estimated plan when `estimate_only` or when running it
    exceeds the statement timeout; and whether it was run."""
    for analyse in (False,) if estimate_only else (True, False):
        await conn.execute("BEGIN")
        try:
            for name, value in proposal.settings:
                await conn.execute(f"SET LOCAL {name} = {quote_literal(value)}")
            if analyse:
                plan, _ = await explain_analyze(conn, sql)
            else:
                plan = plan_of(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}"))
            return plan, analyse
        except StatementTimeout:
            continue
        finally:
            with trio.CancelScope(shield=True):
                await conn.execute("ROLLBACK")
    raise AssertionError("unreachable: the estimated plan does not run the query")


def held_commands(design: OptimizationProposal, in_place: OptimizationProposal | None,
                  extended: OptimizationProposal) -> tuple[str, ...]:
    """The commands of `design`, in place in the fork, that `extended` starts with, when it only
    adds indexes to it (both index builds only, no rewrite or setting, none of its indexes
    replaced): they stay in place and are not built again (afs.bench.benchmark's `held`); else
    () (pure). The loop does not hold them for a query past the statement timeout either."""
    key = TaskMeasurements.key
    n = len(design.sql_commands)
    if (in_place is None or key(in_place) != key(design) or not n
            or extended.rewritten_query is not None or extended.settings or design.settings
            or extended.sql_commands[:n] != design.sql_commands or len(extended.sql_commands) <= n
            or hideable_indexes(extended) is None or hideable_indexes(design) is None):
        return ()
    return tuple(design.sql_commands)


def _loopable(c: CandidateResult) -> bool:
    return (c.status == "measured" and c.benchmark is not None and c.benchmark.equivalent
            and not c.benchmark.answer_cache and query_timing(c.benchmark) is not None)


@dataclass
class _Loop:
    """An agent's loop (issue 25): its best measured design; the plan of the query with it in
    place; the bottleneck there (afs.pg.bottleneck); the brain's extended design, validated and
    measured like any other; kept when it gains on the step before (`gains`).
    It stops when a step does not gain, when the time goes to returning the rows, when the brain
    has nothing more, or when its budget (Measuring.loop_steps, loop_budget_s) is spent."""

    job: AgentJob
    ctx: AnalysisContext
    state: _Progress
    brain: RefiningBrain
    in_place: _InPlace
    events: Emitter
    enter: Callable[[str], None]
    measure: MeasureDesign
    tried: dict[int, CandidateResult]
    by_rank: dict[int, tuple[OptimizationProposal, ValidationResult, tuple[QueryVariant, ...] | None]]
    # the other agent that measures a design already (TaskMeasurements.taken), if any
    taken: Callable[[OptimizationProposal], AgentKey | None] = lambda _: None
    # after-plans read while a design was in place for its measurement (by TaskMeasurements.key)
    plans: Mapping[Any, tuple[dict[str, Any], bool]] = field(default_factory=dict)
    # a step that adds indexes and its step before, head to head in the fork (None: not settled)
    head_to_head: Callable[[OptimizationProposal, OptimizationProposal], Awaitable[Contest]] | None = None
    steps: list[LoopStep] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # of the steps measured
    final: int | None = None  # the rank of the last kept step
    stopped: str = ""

    def _stop(self, why: str) -> None:
        self.stopped = why

    def _start(self, design: CandidateResult) -> None:
        """The loop's step 1: a measured design."""
        first = query_timing(design.benchmark)
        self.steps = [LoopStep(1, design.proposal, None, first.median_ms if first else None, True)]
        self.final = design.rank
        self.ranks = [design.rank]

    async def run(self) -> None:
        agent, conn = self.state.agent, self.in_place.conn
        start = [c for c in self.tried.values() if _loopable(c)]
        if self.state.analysis is None or (not start and self.tried):
            return
        # the best measured design; when the brain proposed none, the query as it is
        current: CandidateResult | None = None
        # where the brain cannot extend the best design (a rewrite, for the strategists), the
        # next fastest measured ones, at most LOOP_STARTS in all, before the loop gives up
        others: list[CandidateResult] = []
        if start:
            current = best_candidate(agent, start, self.state.writes_per_read)
            others = sorted((c for c in start if c.rank != current.rank and c.proposal.proposal_type
                             != "partitioning"), key=lambda c: remaining_time(c.benchmark)[1]
                            if c.benchmark else math.inf)[:LOOP_STARTS - 1]
            if (current.proposal.proposal_type == "partitioning"
                    and self.in_place.proposal != current.proposal):
                if not others:
                    return  # moving the data again to read a plan is not worth it
                current = others.pop(0)
            self._start(current)
        budget = self.job.measuring
        started, step_s = trio.current_time(), 0.0
        while len(self.steps) <= budget.loop_steps:
            n = len(self.steps) + 1
            if trio.current_time() - started + step_s > budget.loop_budget_s:
                return self._stop(f"the loop's time budget is spent ({budget.loop_budget_s:g} s)")
            t0 = trio.current_time()
            self.enter(f"loop step {n}")
            previous: Timing | None = None
            if current is None:  # the query as it is: the analysis read its plan
                design = nothing_yet(agent)
                plan, analysed = self.ctx.plan, not self.ctx.slow and "Actual Total Time" in self.ctx.plan
            else:
                design = current.proposal
                previous = query_timing(current.benchmark)
                assert previous is not None
                read = self.plans.get(TaskMeasurements.key(design))
                if read is not None:  # read while it was in place for its measurement
                    plan, analysed = read
                else:
                    if not await self.in_place.put(design):
                        return self._stop(f"step {n - 1} could not be put in place again: "
                                          f"{self.in_place.error}")
                    estimate_only = self.ctx.slow and (previous.lower_bound or previous.median_ms * 2
                                                       > budget.statement_timeout_ms)
                    plan, analysed = await after_plan(conn, design.rewritten_query or self.job.query, design,
                                                      estimate_only)
            necks = await trio.to_thread.run_sync(bottlenecks, plan, analysed)
            top = necks[0] if necks else None
            if top is not None and top.kind == "rows_returned":
                return self._stop(f"the time goes to returning the rows: {top.detail}")
            extended = None
            with trio.move_on_after(self.job.timeouts.model) as thinking:
                extended = await self.brain.refine(agent, self.ctx, self.state.analysis,
                                                   StepSeen(design, plan, top, tuple(self.steps)))
            if thinking.cancelled_caught:
                return self._stop(f"the brain did not answer within {self.job.timeouts.model:g} s")
            if extended is None and len(self.steps) == 1 and others:
                current = others.pop(0)  # nothing to add to this one: try the next start
                self._start(current)
                continue
            if extended is None:
                return self._stop("the brain has no next design" + (f" for {top.detail}" if top else ""))
            if any(TaskMeasurements.key(s.proposal) == TaskMeasurements.key(extended) for s in self.steps):
                return self._stop("the brain's next design was tried already")
            if self.taken(extended) is not None:  # the squad searches: another bottleneck, if any
                extended = await self._elsewhere(design, plan, necks, top, extended)
            # the plan node it answers: the bottleneck its rationale names, else the costliest
            motive = next((b.detail for b in necks if b.detail in extended.rationale),
                          top.detail if top else None)
            held = self._held(current, extended)
            if held:  # only its new indexes are built: admitted with the ones it extends in place
                validation, candidate_suite, refused = await _admit_extension(conn, extended, len(held))
            else:
                if not await self.in_place.clear():  # the extended design holds the current one
                    return self._stop(f"undoing step {n - 1} failed: {self.in_place.error}")
                validation, candidate_suite, refused = await _admit(conn, extended)
            if refused is not None:
                self.steps.append(LoopStep(n, extended, motive, None, False, refused))
                return self._stop(f"step {n} was refused")
            if validation.rollback_commands:
                extended = dataclasses.replace(extended, rollback_commands=validation.rollback_commands)
            rank = max([*self.tried, *self.by_rank], default=0) + 1
            self.by_rank[rank] = (extended, validation, candidate_suite)
            held_s = current.benchmark.apply_s if held and current is not None and current.benchmark else 0.0
            result = await self.measure(rank, extended, validation, candidate_suite,
                                        _StepBefore(previous, held, held_s))
            self.ranks.append(rank)
            new = query_timing(result.benchmark) if result is not None else None
            if previous is None and result is not None:  # the first design: against the query as given
                previous = baseline_timing(result.benchmark)
            if result is None or result.benchmark is None or new is None or previous is None:
                why = result.note if result is not None else "the fork's state is unknown after it"
                self.steps.append(LoopStep(n, extended, motive, None, False, f"not measured: {why}"))
                return self._stop(f"step {n} could not be measured")
            # a step may not add a problem with other values (slower for one) the step before had not
            family = result.benchmark.family_problem if not result.benchmark.answer_cache else None
            if current is not None and current.benchmark is not None and current.benchmark.family_problem:
                family = None
            kept = (result.benchmark.equivalent and not result.benchmark.answer_cache and not family
                    and gains(previous, new))
            settled = None
            if kept and held and current is not None and new.median_ms * DRIFT_RATIO > previous.median_ms:
                settled = await self._contest(current.proposal, extended)
                kept = settled is None or settled.faster == "second"
            if not kept:
                cache = result.benchmark.answer_cache
                than = f"step {n - 1}" if current is not None else "the query as given"
                unproven = next((f"{c.note} ({c.label})" for c in result.benchmark.parameter_checks
                                 if c.note.startswith("not proven")), None)
                why = (unproven if unproven
                       else f"step {n - 1} {contest_note(settled, True, rank)}" if settled is not None
                       else "it changes the query's results" if not result.benchmark.equivalent
                       else f"an answer cache: {cache}" if cache
                       else f"for other values: {family}" if family
                       else f"no gain on {than} beyond the noise ({fmt_ms(previous.median_ms)} → "
                            f"{fmt_ms(new.median_ms)})")
                self.steps.append(LoopStep(n, extended, motive, new.median_ms, False, why))
                self.tried[rank] = dataclasses.replace(
                    result, note="; ".join(filter(None, (result.note, f"loop step {n}, not kept: {why}"))))
                if self.final is None:
                    self.final = rank  # the only design the loop measured: its record holds the chain
                return self._stop(f"step {n} did not gain")
            self.steps.append(LoopStep(n, extended, motive, new.median_ms, True))
            current = self.tried[rank] = dataclasses.replace(result, chain=tuple(self.steps))
            self.final, step_s = rank, trio.current_time() - t0
            self.events.emit("loop_step", agent=agent, fork=self.state.fork, step=n, rank=rank,
                             motivated_by=motive, median_ms=new.median_ms)
        self._stop(f"{budget.loop_steps} loop steps taken (loop_steps)")

    async def _contest(self, before: OptimizationProposal, step: OptimizationProposal) -> Contest | None:
        """A step that gains less than DRIFT_RATIO on its step before, head to head with it in
        the fork: the two were measured minutes apart, and the drift between two measurements
        (up to about 2x on a busy server, a sub-millisecond query's plan state) is larger than
        their noise. The contest (None where it could not run: the step's gain stands as
        measured) keeps the step only when it is faster there."""
        if self.head_to_head is None:
            return None
        try:
            found = await self.head_to_head(before, step)
        except (ProposalFailedError, DatabaseError) as exc:
            self.events.emit("candidates_contested", agent=self.state.agent, fork=self.state.fork,
                             error=str(exc), loop=True)
            return None
        a, b = timing(found.first), timing(found.second)
        self.events.emit("candidates_contested", agent=self.state.agent, fork=self.state.fork,
                         ms=[a.median_ms, b.median_ms], pairs=len(found.first), faster=found.faster,
                         loop=True)
        return found

    def _held(self, current: CandidateResult | None, extended: OptimizationProposal) -> tuple[str, ...]:
        if current is None or current.benchmark is None or self.ctx.slow:
            return ()
        return held_commands(current.proposal, self.in_place.proposal, extended)

    async def _elsewhere(self, design: OptimizationProposal, plan: Mapping[str, Any],
                         necks: Sequence[Bottleneck], top: Bottleneck | None,
                         extended: OptimizationProposal) -> OptimizationProposal:
        """Another agent measures `extended` already (the same best design, the same
        bottleneck): the extension for the next bottleneck of the plan that nobody measures
        (at most LOOP_ALTERNATIVES more questions to the brain), else `extended` itself (its
        measurement is then shared). The agent that measures it follows the costliest line."""
        assert self.state.analysis is not None
        seen = {TaskMeasurements.key(extended), *(TaskMeasurements.key(s.proposal) for s in self.steps)}
        others = [b for b in necks if b != top and b.kind != "rows_returned"][:LOOP_ALTERNATIVES]
        for neck in others:
            other = None
            with trio.move_on_after(self.job.timeouts.model):
                other = await self.brain.refine(self.state.agent, self.ctx, self.state.analysis,
                                                StepSeen(design, plan, neck, tuple(self.steps)))
            if other is None or TaskMeasurements.key(other) in seen:
                continue
            seen.add(TaskMeasurements.key(other))
            if self.taken(other) is None:
                self.events.emit("loop_steered", agent=self.state.agent, fork=self.state.fork,
                                 measured_by=self.taken(extended), bottleneck=neck.detail)
                return other
        return extended

    def record(self) -> None:
        """The chain on the last kept step's result (with the step after it that was not kept)."""
        stopped = self.stopped or f"the loop's time budget is spent ({self.job.measuring.loop_budget_s:g} s)"
        self.events.emit("loop_stopped", agent=self.state.agent, fork=self.state.fork,
                         steps=len(self.steps), kept=sum(s.kept for s in self.steps), reason=stopped)
        if self.final is None or not self.steps:
            return
        if len(self.steps) < 2 and self.steps[0].motivated_by is None:
            return  # the first design alone: no step of the loop
        self.tried[self.final] = dataclasses.replace(self.tried[self.final], chain=tuple(self.steps))
        # the last kept step is the loop's design: the steps before it and the one that did not
        # gain stay in the record, but cannot be the agent's proposal
        self.state.superseded |= {r for r in self.ranks if r != self.final}


async def _measure_before(fork: _InFork, ctx: AnalysisContext, family: Sequence[ParameterSet],
                          reuse: Reuse) -> None:
    """The suite and the query with other values as they run before any change, measured in
    the benchmark slot while the model writes the proposals (`afs.bench.measure_before`).
    Its own failure costs nothing but the head start: the benchmarks measure what it missed."""
    conn, job, state, bench_limiter, events = fork.conn, fork.job, fork.state, fork.bench_limiter, fork.events
    others = [sql for pset in family if (sql := apply_parameters(job.query, pset)) is not None]
    async with bench_limiter, server_lock(conn, "benchmark"):
        t0 = trio.current_time()
        events.emit("baseline_measuring", agent=state.agent, fork=state.fork)
        try:
            with trio.fail_after(job.timeouts.benchmark):
                measured = await measure_before(
                    conn, ctx.suite, others, reuse, job.measuring.runs_ahead,
                    family_cap=family_cap_ms(job.measuring, len(ctx.suite) + len(others)))
        except (DatabaseError, trio.TooSlowError) as exc:
            events.emit("baseline_measured", agent=state.agent, fork=state.fork,
                        duration_s=trio.current_time() - t0, queries=0, error=str(exc) or "timed out")
            return
        events.emit("baseline_measured", agent=state.agent, fork=state.fork,
                    duration_s=trio.current_time() - t0, queries=measured)


async def _analyse(conn: Connection, job: AgentJob) -> tuple[AnalysisContext, tuple[str, ...]]:
    """The query before any change, in a fork: its plan and time, the tables' statistics, the
    keyset probe, and the suite (with the variants left out and why)."""
    ctx = await gather_context(conn, task_id=job.task_id, task_type=job.task_type,
                               query=job.query, features=job.features,
                               source_stats=job.source_stats)
    ctx = dataclasses.replace(ctx, keyset_last_key=await _last_key(conn, job.query, ctx.tables),
                              source_server=job.source_server, source_imported=job.source_imported)
    main = ctx.tables.get(job.features.main_table or "")
    # reading the query is CPU work (up to seconds for a large one): off the event loop
    suite, skipped = await trio.to_thread.run_sync(
        lambda: build_suite(Query.read(job.query), main, _alias_of(job.features)))
    return dataclasses.replace(ctx, suite=suite), tuple(skipped)


async def _undone(conn: Connection, proposal: OptimizationProposal) -> bool:
    """Whether a proposal that failed while measured is taken out of the fork again by its
    validated rollback (every statement IF EXISTS), so the next candidate starts from the
    fork as it was; never for partitioning (data moved half-way is not undone blindly)."""
    if proposal.proposal_type == "partitioning" or not proposal.rollback_commands:
        return False
    try:
        await undo(conn, proposal.rollback_commands)
    except ProposalFailedError:
        return False
    return True


async def _admit_extension(conn: Connection, extended: OptimizationProposal, held: int
                           ) -> tuple[ValidationResult, tuple[QueryVariant, ...] | None, str | None]:
    """`_admit` for a design whose first `held` commands are in place in the fork already:
    the whole design's structure, and the fork's catalog for its new statements only (the
    objects in place were admitted with the design they belong to)."""
    validation = validate_candidate(extended)
    if not validation.is_valid:
        return await _admit(conn, extended)  # refused the same way, with its reasons
    added = dataclasses.replace(extended, sql_commands=extended.sql_commands[held:], rollback_commands=())
    _, _, refused = await _admit(conn, added)
    return validation, None, refused


async def _admit(conn: Connection, proposal: OptimizationProposal
                 ) -> tuple[ValidationResult, tuple[QueryVariant, ...] | None, str | None]:
    """A candidate's safety verdict (structure, then the fork's catalog), the rewrite's own
    suite, and why it is refused (or None)."""
    validation = validate_candidate(proposal)
    if validation.is_valid:
        validation = await _refused_by_catalog(conn, proposal, validation) or validation
    if not validation.is_valid:
        reasons = "; ".join(f"{r.reason}: {r.statement[:80]}" for r in validation.rejected)
        return validation, None, f"unsafe SQL refused: {reasons}"
    if proposal.rewritten_query is None:
        return validation, None, None
    try:
        check_input(proposal.rewritten_query)  # too large or too deep to read: refused
        rewritten = check_query(proposal.rewritten_query)
    except InputError as exc:
        return validation, None, f"unsafe rewrite refused: {exc}"
    candidate_suite, _ = await trio.to_thread.run_sync(lambda: build_suite(Query.read(rewritten), None, None))
    if proposal.needs_application_change:
        # a keyset page starts from the key of the unfiltered query: no filter variant
        candidate_suite = tuple(v for v in candidate_suite if v.name != "filter")
    return validation, candidate_suite, None


# -- a rewrite that failed the result check goes back to a brain that can revise it -------------
MAX_REWRITE_REVISIONS = 1  # per agent


def result_check_failure(outcome: BenchmarkOutcome) -> str | None:
    """Why a measured rewrite does not return the original's rows, or None when it does."""
    differing: list[str] = [m.name for m in outcome.measurements if not m.equivalent]
    differing += [f"other values ({c.label})" for c in outcome.parameter_checks if not c.equivalent]
    if not differing:
        return None
    counts = ", ".join(f"{m.name}: {m.rows} rows" for m in outcome.measurements if not m.equivalent)
    return (f"it returned other rows than the original query for {', '.join(differing)}"
            + (f" ({counts} from the rewrite)" if counts else ""))


async def _revise_rewrite(brain: Brain, ctx: AnalysisContext, state: _Progress, result: CandidateResult,
                          limit_s: float, events: Emitter) -> OptimizationProposal | None:
    """The brain's correction of a measured rewrite (`result`) that returned other rows (a
    `RevisingBrain` only, once per agent, within the model time limit); None otherwise. A failed
    model call costs only the revision: the agent goes on with what it has measured."""
    agent, proposal = state.agent, result.proposal
    reason = None if result.benchmark is None else result_check_failure(result.benchmark)
    if (reason is None or proposal.rewritten_query is None or not isinstance(brain, RevisingBrain)
            or state.analysis is None or state.revisions >= MAX_REWRITE_REVISIONS):
        return None
    state.revisions += 1
    events.emit("rewrite_revision_asked", agent=agent, fork=state.fork, reason=reason)
    revised = None
    with trio.move_on_after(limit_s):
        try:
            revised = await brain.revise_rewrite(agent, ctx, state.analysis, proposal, reason)
        except AfsError as exc:
            events.emit("rewrite_revision_failed", agent=agent, fork=state.fork, error=str(exc))
    return revised


def offer(offered: dict[Any, tuple[int, OptimizationProposal]],
          proposals: Sequence[OptimizationProposal]) -> None:
    """An agent's candidates into the squad's pool (`TaskMeasurements.offered`): each design
    once, under the rank it has in the first agent's list that proposes it."""
    for rank, proposal in enumerate(proposals, 1):
        offered.setdefault(TaskMeasurements.key(proposal), (rank, proposal))


def pooled(offered: Mapping[Any, tuple[int, OptimizationProposal]]) -> list[OptimizationProposal]:
    """The squad's designs, every agent's first choice before any agent's second (then in the
    order they were offered)."""
    order = sorted(enumerate(offered.values()), key=lambda entry: (entry[1][0], entry[0]))
    return [proposal for _, (_, proposal) in order]


def squad_options(designs: Sequence[OptimizationProposal], free: Callable[[OptimizationProposal], bool],
                  limit: int) -> list[OptimizationProposal]:
    """The first `limit` of `designs` that are `free` (nobody measures them, the agent has not
    tried them), each design once (`TaskMeasurements.key`)."""
    seen: set[Any] = set()
    options: list[OptimizationProposal] = []
    for design in designs:
        k = TaskMeasurements.key(design)
        if k in seen or not free(design):
            continue
        seen.add(k)
        options.append(design)
        if len(options) >= limit:
            break
    return options


async def _bounded_cost(conn: Connection, sql: str, proposal: OptimizationProposal,
                        measuring: Measuring) -> float:
    """`planner_cost` of a squad design a spare slot screens, its rolled-back build bounded by
    `Measuring.spare_build_s` (a statement past it fails the screening: the design is passed
    over, not waited for)."""
    bound_ms = min(int(measuring.spare_build_s * 1000), measuring.statement_timeout_ms or 2 ** 31 - 1)
    await conn.execute(f"SET statement_timeout = {bound_ms}")
    try:
        return await planner_cost(conn, sql, proposal)
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute(f"SET statement_timeout = {int(measuring.statement_timeout_ms)}")


def expects_gain(cost: float | None, baseline_cost: float | None) -> bool:
    """Whether the planner expects a design of the squad to gain: its cost with the design in
    place at most 90 % of the query's as it is (as `choose_for_measurement` calls promising).
    A spare slot never goes to a design the planner expects nothing of, or cannot judge."""
    return cost is not None and baseline_cost is not None and cost < PROMISING_COST * baseline_cost


def choose_for_measurement(candidates: Sequence[tuple[int, float | None, bool]],
                           baseline_cost: float | None, limit: int) -> list[int]:
    """Which candidates (rank, planner cost, moves data) to measure, in measuring order.

    The brain's first choice is always measured (the planner can be wrong: a corrected
    estimate may cost more and run faster); the others by planner cost, cheapest first: those
    that promise at least 10 % less than the query as it is before those that do not (the
    planner misjudges exactly the queries worth fixing, such as correlated subqueries, so the
    measuring budget is filled). Designs that move data (partitioning) are measured last:
    their undo is the slowest and least certain.
    """
    if not candidates:
        return []
    first, *rest = sorted(candidates)

    def promising(c: tuple[int, float | None, bool]) -> bool:
        return c[1] is None or baseline_cost is None or c[1] < 0.9 * baseline_cost

    rest.sort(key=lambda c: (not promising(c), c[1] is None, c[1] or 0.0, c[0]))
    picked = [first, *rest][:max(1, limit)]
    picked.sort(key=lambda c: c[2])  # stable: the order above within each group
    return [rank for rank, _, _ in picked]


def remaining_time(bench: BenchmarkOutcome) -> tuple[float, float]:
    """What a measured candidate leaves of the query's time: the geometric mean of optimized /
    baseline over the suite and the timed parameter sets, and the optimized time in ms of the
    query as given (the suite's "baseline" query; else the first measured)."""
    pairs = [(m.baseline.median_ms, m.optimized.median_ms) for m in bench.measurements]
    pairs += [(c.baseline.median_ms, c.optimized.median_ms) for c in bench.parameter_checks
              if c.baseline is not None and c.optimized is not None]
    pairs = [(b, o) for b, o in pairs if b > 0]
    if not pairs:
        return 1.0, math.inf
    ratio = math.exp(sum(math.log(max(o, 1e-3) / b) for b, o in pairs) / len(pairs))
    query = next((m for m in bench.measurements if m.name == "baseline"), bench.measurements[0]
                 if bench.measurements else None)
    return ratio, query.optimized.median_ms if query is not None else math.inf


def as_fast(candidate: tuple[float, float], fastest: tuple[float, float]) -> bool:
    """Whether a candidate's remaining time (ratio, ms) is as good as the fastest one's: within
    AS_FAST_RATIO of its ratio, or the query as given within AS_FAST_MS of its time
    (sub-millisecond noise)."""
    return (candidate[0] <= fastest[0] * AS_FAST_RATIO
            or candidate[1] <= fastest[1] + AS_FAST_MS)


def best_candidate(agent: AgentKey, measured: Sequence[CandidateResult],
                   writes_per_read: Mapping[str, float], slower: Collection[int] = ()) -> CandidateResult:
    """The best of an agent's measured candidates (at least one).

    A design another one serves the query's other parameter values clearly better than
    (`consensus.serves_family_clearly_better`: it holds for today's literals only) comes after
    those, however fast. Then speed, then the score consensus gives: the consensus performance score is in
    tiers that stop at 90 % (10×), so it cannot tell 10× from 500×; within one agent every
    candidate was measured the same way in the same fork, so among those that qualify (same
    rows, not disqualified) the ones as fast as the fastest (`as_fast`) are preferred, and
    among them the best score (storage, complexity, risk) wins, then the brain's order.
    `slower`: the ranks of candidates measured slower head to head (`tie_to_settle`) than
    another as fast: they are not as fast as the fastest.
    """
    return _ranked(agent, measured, writes_per_read, slower)[0][0]


def tie_to_settle(agent: AgentKey, measured: Sequence[CandidateResult],
                  writes_per_read: Mapping[str, float]) -> tuple[CandidateResult, CandidateResult] | None:
    """The two best of an agent's candidates when their measurements do not tell them apart
    and the score would (pure): both qualify and are as fast as the fastest (`as_fast`), they
    are two designs, the one the score prefers was not measured faster beyond the noise on the
    query as given (every run faster, medians MIN_EFFECT apart), neither runs within AS_FAST_MS
    (sub-millisecond noise), and both can be in place in one fork, each hidden from the other's
    runs (`afs.bench.hiding`). Each was measured against its own baseline runs, possibly
    minutes and another fork apart: a busy server's drift between them can reach 2x
    (afs.bench), so complexity points would decide a real difference by chance. None when there
    is nothing to settle."""
    contenders = _ranked(agent, measured, writes_per_read, ())[1]
    if not contenders:
        return None
    first, key = contenders[0], TaskMeasurements.key
    second = next((c for c in contenders[1:] if key(c.proposal) != key(first.proposal)), None)
    if second is None:
        return None
    a, b = query_timing(first.benchmark), query_timing(second.benchmark)
    if a is None or b is None or max(a.median_ms, b.median_ms) <= AS_FAST_MS:
        return None
    fastest_b = b.min_ms if b.min_ms is not None else b.median_ms - b.spread_ms
    slowest_a = a.max_ms if a.max_ms is not None else a.median_ms + a.spread_ms
    if slowest_a < fastest_b and b.median_ms - a.median_ms >= MIN_EFFECT * b.median_ms:
        return None  # the score's choice is measured faster already
    if hiding(first.proposal) is None or hiding(second.proposal) is None:
        return None
    return first, second


def _ranked(agent: AgentKey, measured: Sequence[CandidateResult], writes_per_read: Mapping[str, float],
            slower: Collection[int]) -> tuple[list[CandidateResult], list[CandidateResult]]:
    """The candidates best first (`best_candidate`), and those of them that qualify and are as
    fast as the fastest (the ones the score decides between)."""
    breakdowns: dict[int, ScoreBreakdown] = {}
    times: dict[int, tuple[float, float]] = {}
    judged: dict[int, Candidate] = {}
    for c in measured:
        assert c.benchmark is not None
        trial = AgentOutcome(agent=agent, status="ok", proposal=c.proposal, validation=c.validation,
                             benchmark=c.benchmark, writes_per_read=dict(writes_per_read))
        breakdown = score(trial)
        assert breakdown is not None and c.validation is not None  # scored: validated
        breakdowns[c.rank], times[c.rank] = breakdown, remaining_time(c.benchmark)
        judged[c.rank] = Candidate(trial, c.proposal, c.validation, c.benchmark)
    qualified = [c.rank for c in measured if c.benchmark is not None and c.benchmark.equivalent
                 and not breakdowns[c.rank].disqualified]
    # a design another one serves the query's other values clearly better than holds only for
    # today's literals (consensus.serves_family_clearly_better): however fast, it comes after
    narrow = {r for r in qualified
              if any(serves_family_clearly_better(judged[o], judged[r]) for o in qualified if o != r)}
    fastest = min((times[r] for r in qualified if r not in narrow), default=None)

    def key(c: CandidateResult) -> tuple[bool, bool, bool, bool, float, int]:
        assert c.benchmark is not None
        breakdown = breakdowns[c.rank]
        slow = c.rank in slower or (fastest is not None and not as_fast(times[c.rank], fastest))
        return (not c.benchmark.equivalent, bool(breakdown.disqualified), c.rank in narrow, slow,
                -breakdown.total, c.rank)

    order = sorted(measured, key=key)
    return order, [c for c in order if not any(key(c)[:4])]


def contest_note(found: Contest, first: bool, other: int) -> str:
    """What a head-to-head found, said of one of its two designs (pure)."""
    mine, theirs = (found.first, found.second) if first else (found.second, found.first)
    if found.faster is None:
        verdict = f"not apart from #{other} head to head"
    else:
        won = (found.faster == "first") == first
        verdict = f"{'faster' if won else 'slower'} than #{other} head to head"
    return (f"{verdict} in one fork: {fmt_ms(timing(mine).median_ms)} against"
            f" {fmt_ms(timing(theirs).median_ms)} ({len(found.first)} pairs of runs)")


def _best(state: _Progress, slower: frozenset[int] = frozenset()) -> AgentOutcome:
    """The agent's outcome: its best measured candidate (`best_candidate`; `slower`: the ranks
    measured slower head to head, `_settle`)."""
    measured = [c for c in state.candidates if c.status == "measured" and c.benchmark is not None]
    measured = [c for c in measured if c.rank not in state.superseded] or measured
    if not measured:
        first = state.candidates[0]
        state.proposal, state.validation = first.proposal, first.validation
        status: AgentStatus = "rejected" if first.status == "rejected" else "failed"
        return state.outcome(status, first.note or "no candidate could be measured")
    # an answer cache cannot win: the best of the others does, if there is one
    real = [c for c in measured if not (c.benchmark and c.benchmark.answer_cache)] or measured
    best = best_candidate(state.agent, real, state.writes_per_read, slower)
    assert best.benchmark is not None
    state.proposal, state.validation = best.proposal, best.validation
    state.measured_by = state.shared_by.get(best.rank)
    # other rows for the query as given: the plainest reason, whatever else is wrong with it
    suite_differs = [m.name for m in best.benchmark.measurements
                     if not m.equivalent and not m.note.startswith("not proven")]
    if suite_differs:
        return state.outcome("rejected", f"the proposal changes query results ({', '.join(suite_differs)})",
                             best.benchmark)
    if best.benchmark.answer_cache:
        return state.outcome("rejected", f"not an optimization: {best.benchmark.answer_cache}",
                             best.benchmark)
    unproven = [m.note for m in best.benchmark.measurements if m.note.startswith("not proven")] + [
        f"{c.note} ({c.label})" for c in best.benchmark.parameter_checks if c.note.startswith("not proven")]
    if unproven:
        return state.outcome("rejected", f"the rewrite is {unproven[0]}", best.benchmark)
    if not best.benchmark.equivalent:
        differing = [m.name for m in best.benchmark.measurements if not m.equivalent] + [
            c.label for c in best.benchmark.parameter_checks if not c.equivalent]
        return state.outcome("rejected", f"the proposal changes query results ({', '.join(differing)})",
                             best.benchmark)
    return state.outcome("ok", None, best.benchmark)


async def _last_key(conn: Connection, query: str,
                    tables: Mapping[str, TableInfo]) -> tuple[Any, ...] | None:
    """For an OFFSET page: the ORDER BY key of the row before it (keyset pagination needs it)."""
    probe = await trio.to_thread.run_sync(lambda: keyset_probe(Query.read(query), tables))
    if probe is None:
        return None
    try:
        row = await conn.fetchone(probe.sql)
    except DatabaseError:
        return None
    return tuple(row) if row is not None else None


async def _keyset_family(conn: Connection, members: Sequence[FamilyQuery],
                         tables: Mapping[str, TableInfo]) -> tuple[FamilyQuery, ...]:
    """A keyset page for other values starts from their own last key, as the application's would."""
    adjusted: list[FamilyQuery] = []
    for member in members:
        member_query = Query.read(member.baseline_sql)
        probe = keyset_probe(member_query, tables)
        last = await _last_key(conn, member.baseline_sql, tables)
        page = keyset_rewrite(member_query, probe, last) if probe and last else None
        adjusted.append(dataclasses.replace(member, candidate_sql=page.sql if page else None))
    return tuple(adjusted)


SLOW_ORIGINAL = "the original exceeds the statement timeout"  # how bench notes such a family member


def split_slow_family(members: Sequence[FamilyQuery], slow: Mapping[str, bool]
                      ) -> tuple[tuple[FamilyQuery, ...], tuple[FamilyQuery, ...]]:
    """(members to measure, members whose original is known to exceed the statement timeout).
    A member without a candidate query (an answer cache) is always measured: that is its verdict."""
    known = tuple(m for m in members if m.candidate_sql is not None and m.baseline_sql in slow)
    return tuple(m for m in members if m not in known), known


def slow_originals(members: Sequence[FamilyQuery], outcome: BenchmarkOutcome) -> dict[str, bool]:
    """The originals of the family the measurement found past the statement timeout, and for
    each whether its rows could still be read (only timing it timed out)."""
    readable = {c.label: not c.note.startswith("not checked") for c in outcome.parameter_checks
                if SLOW_ORIGINAL in c.note}
    return {m.baseline_sql: readable[m.label] for m in members if m.label in readable}


def with_known_slow(outcome: BenchmarkOutcome, checks: Sequence[ParameterCheck]) -> BenchmarkOutcome:
    """The outcome with the checks of the members that were only result-checked."""
    if not checks:
        return outcome
    return dataclasses.replace(outcome, parameter_checks=(*outcome.parameter_checks, *checks))


async def _result_checks(conn: Connection, known: Sequence[FamilyQuery], reuse: Reuse,
                         exact: bool, timeout_ms: int, cap_ms: int | None) -> tuple[ParameterCheck, ...]:
    """Rows of the original and of the proposal's query (in place) for members whose original
    is known to run past the statement timeout or its share of the budget (`reuse.slow_family`,
    `cap_ms`: afs.bench.family_cap_ms): compared, not timed (timing the original would only
    wait for the timeout again). The original's rows are the task's (`reuse`) when they were
    read; the proposal's are read under `cap_ms`, in whatever plan is fastest now."""
    checks: list[ParameterCheck] = []
    found = " (found with an earlier proposal of this task)"
    unchecked = f"not checked: {SLOW_ORIGINAL} for these values{found}"
    for member in known:
        assert member.candidate_sql is not None
        if not reuse.slow_family.get(member.baseline_sql, True):
            checks.append(ParameterCheck(label=member.label, equivalent=True, slower=False, note=unchecked))
            continue
        before = reuse.result_before(member.baseline_sql, False)
        try:
            async with capped(conn, cap_ms):
                if before is None:
                    before = await result_of(conn, QueryVariant("baseline", member.baseline_sql, False,
                                                                exact), False)
        except StatementTimeout:
            checks.append(ParameterCheck(label=member.label, equivalent=True, slower=False, note=unchecked))
            continue
        try:
            async with capped(conn, cap_ms):
                after = await result_of(conn, QueryVariant("baseline", member.candidate_sql, False, exact),
                                        False)
        except StatementTimeout:  # costs this value (not proven faster), a rewrite stays unproven
            checks.append(past_timeout_check(
                member, statement_timeout_ms=timeout_ms, original_finished=False, rows=before.rows))
            continue
        equivalent = before.rows == after.rows and (not exact or before.checksum == after.checksum)
        differ = "" if equivalent else f"; results differ: {before.rows} rows before, {after.rows} after"
        checks.append(ParameterCheck(label=member.label, equivalent=equivalent, slower=False,
                                     rows=before.rows,
                                     note=f"not timed: {SLOW_ORIGINAL} for these values{found}{differ}"))
    return tuple(checks)


def _family(job: AgentJob, ctx: AnalysisContext) -> tuple[ParameterSet, ...]:
    """Other values for the query's literals: the task's own (a batch task's filled sets),
    else drawn from pg_stats (none without literals)."""
    if job.given_sets:
        return job.given_sets
    if job.measuring.parameter_sets <= 0:
        return ()
    return parameter_sets(Query.read(job.query), ctx.tables, job.measuring.parameter_sets)


def _family_for(query: str, sets: Sequence[ParameterSet],
                proposal: OptimizationProposal) -> tuple[FamilyQuery, ...]:
    """The query family for one proposal: the original and the proposal's query, same values.

    A proposal whose materialized view bakes a literal of the query in gets a member
    without a candidate query: an answer cache, whatever else it reads. So does one whose
    rewrite reads the rows stored in its views as they are (`stored_rows`): today's answer,
    stale on the next write, whatever the query's values.
    """
    views = _views(proposal)
    baked = [literal for _, definition in views for literal in baked_literals(definition, query)]
    stored = proposal.rewritten_query is not None and stored_rows(proposal.rewritten_query,
                                                                 [name for name, _ in views])
    members: list[FamilyQuery] = []
    for pset in sets:
        baseline_sql = apply_parameters(query, pset)
        if baseline_sql is None:
            continue
        candidate_sql = (apply_parameters(proposal.rewritten_query, pset)
                         if proposal.rewritten_query is not None else baseline_sql)
        if baked or stored:
            candidate_sql = None
        members.append(FamilyQuery(pset.label, baseline_sql, candidate_sql))
    if baked and not members:
        members.append(FamilyQuery(f"other values than {', '.join(baked)}", query, None))
    elif stored and not members:  # no literals to vary: the same query after the next write
        members.append(FamilyQuery("the rows after the next write (the view returns its stored rows"
                                   " as they are)", query, None))
    return tuple(members)


def _views(proposal: OptimizationProposal) -> list[tuple[str, str]]:
    """The name and SELECT of every materialized view the proposal creates."""
    return [(view.name.rpartition(".")[2], view.query) for view in creates(proposal).views]


def _alias_of(features: QueryFeatures) -> str | None:
    for alias, table in features.aliases.items():
        if table == features.main_table and alias != table:
            return alias
    return None


# -- what only the fork's catalog and data can tell -----------------------------------------------
async def _refused_by_catalog(conn: Connection, proposal: OptimizationProposal,
                              validation: ValidationResult) -> ValidationResult | None:
    """The validation of a proposal the fork's catalog refuses (`safety.judge_references`:
    functions, operators and casts that are not built in, system relations, objects that
    already exist, partial copies; then `safety.judge_resolved`: what PostgreSQL resolves its
    statements to, in a transaction rolled back), or None when it passes."""
    refused = await catalog_problems(conn, proposal_references(proposal))
    if not refused:
        return None
    return ValidationResult(False, "high", 0.0, validation.warnings, validation.rollback_commands, refused)


async def _rows_kept(conn: Connection, proposal: OptimizationProposal) -> Callable[[], Awaitable[None]]:
    """Fingerprint the existing tables a partitioning recipe moves; the returned check, run
    after the recipe, raises `ProposalFailedError` unless each holds the same rows and columns under its
    name (row count and checksum of every column it had)."""
    tables = proposal_references(proposal).preserved if proposal.proposal_type == "partitioning" else ()
    before = await table_fingerprints(conn, tables)

    async def check() -> None:
        if not tables:
            return
        columns = {table: found.columns for table, found in before.items() if found is not None}
        lost = lost_rows(before, await table_fingerprints(conn, tables, columns))
        if lost:
            raise ProposalFailedError("the migration does not keep every row and column of the original: "
                             + "; ".join(lost))
    return check
