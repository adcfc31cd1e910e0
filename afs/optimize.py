"""One optimization task, end to end.

    check the query (one read-only SELECT) ─► features ─► source statistics
    ─► route ─► one nursery, one task per agent (afs.agents.run_agent)
    ─► the reviewer's flags (shown, never scored) ─► partial-failure rules ─► consensus
    ─► TaskResult

Nothing is written to the source database: it is read for statistics and
EXPLAIN (without ANALYZE) only, the EXPLAIN after the catalog check, in a read-only
transaction as a role without write rights (afs.target.on_target); every change happens
in forks.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from afs.agents import AgentJob, TaskCommon, run_agent
from afs.analysis import SourceStats, server_facts, source_table_stats, view_definitions
from afs.bench import TaskMeasurements
from afs.brains import ReviewingBrain, Squad
from afs.conditions import task_conditions
from afs.config import Settings
from afs.consensus import decide
from afs.db import open_connection
from afs.errors import AfsError, DatabaseError, InputError
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.models import (
    AgentKey,
    AgentOutcome,
    ModelUsage,
    QueryFeatures,
    ReviewFlag,
    RoutingDecision,
    StatementParameters,
    TaskResult,
    TaskStatus,
    TaskType,
)
from afs.query.features import see_through
from afs.router import RuleSet, consensus_weights, route
from afs.target import on_target, plan_only
from afs.task import read_query


@dataclass(frozen=True)
class TaskRequest:
    query: str
    task_type: TaskType = "query_optimization"
    priority: str = "normal"
    runs: int | None = None  # measured runs per suite query and side, at most; None: Settings.runs
    weights: Mapping[str, float] | None = None  # overrides the rules file's consensus weights
    sequential: bool = False  # the agents one after another (what parallelism saves: benchmarks/parallel.py)
    parameters: StatementParameters | None = None  # explicit sets, the first being `query`'s values


class AgentPool:
    """Concurrent tasks per agent in this process (the router's capacity input).

    `acquire` routes with the current load and counts the chosen agents in one step;
    `afs.service.pool.StorePool` does the same across every worker on one store.
    """

    def __init__(self) -> None:
        self.load: dict[AgentKey, int] = {}
        self._changed = trio.Event()

    def snapshot(self) -> dict[AgentKey, int]:
        return dict(self.load)

    async def acquire(self, task_id: str,
                      choose: Callable[[Mapping[AgentKey, int]], RoutingDecision]) -> RoutingDecision:
        """Route with the current load; the agents count as busy unless the decision is to wait."""
        routing = choose(self.snapshot())
        if not routing.waiting:
            for agent in routing.agents:
                self.load[agent] = self.load.get(agent, 0) + 1
        return routing

    async def release(self, task_id: str, agents: Sequence[AgentKey]) -> None:
        for agent in agents:
            self.load[agent] -= 1
        self._changed.set()
        self._changed = trio.Event()

    @contextmanager
    def assigned(self, agents: Sequence[AgentKey]) -> Iterator[None]:
        for agent in agents:
            self.load[agent] = self.load.get(agent, 0) + 1
        try:
            yield
        finally:
            for agent in agents:
                self.load[agent] -= 1
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for_change(self) -> None:
        await self._changed.wait()


@dataclass(frozen=True)
class Crew:
    """What works on a task, passed whole: the fork client, the squad of brains, the routing
    rules, and the agent pool that counts the agents' load across concurrent tasks (None: a pool
    of this task's own)."""

    forks: ForkClient
    squad: Squad
    rules: RuleSet
    pool: AgentPool | None = None


async def _review(squad: Squad, query: str, outcomes: Sequence[AgentOutcome], limit_s: float,
                  events: Emitter) -> tuple[ReviewFlag, ...]:
    """The squad's reviewer, when routed, looks at the other agents' measured proposals before
    the consensus.

    Its flags are shown, never scored: the consensus reads the measurements alone. A review
    that fails or runs past the model time limit is left out (an event says why).
    """
    reviewer = squad.reviewer
    measured = [o for o in outcomes if o.agent != reviewer and o.benchmark is not None]
    if reviewer is None or not measured or all(o.agent != reviewer for o in outcomes):
        return ()  # the reviewer is one of the squad (its usage is reported with its outcome)
    brain = squad.brain_for(reviewer)
    if not isinstance(brain, ReviewingBrain):
        return ()
    flags: tuple[ReviewFlag, ...] = ()
    with trio.move_on_after(limit_s) as scope:
        try:
            flags = tuple(await brain.review(reviewer, query, measured))
        except AfsError as exc:
            events.emit("review_failed", agent=reviewer, error=str(exc))
    if scope.cancelled_caught:
        events.emit("review_failed", agent=reviewer, error=f"no review within {limit_s:g} s")
    for flag in flags:
        events.emit("proposal_flagged", agent=flag.agent, reviewer=flag.reviewer, concern=flag.concern)
    return flags


def _usage(squad: Squad, agent: AgentKey) -> ModelUsage | None:
    """The agent's model usage as its outcome records it (None for a brain without a model)."""
    return squad.usage_of(agent)


def new_task_id() -> str:
    return secrets.token_hex(4)


def read_input(sql: str) -> tuple[str, QueryFeatures]:
    """The query to optimize and its features, or InputError: afs.task.read_query, the one
    check of a task request (the command line and the API use it too). CPU-bound (up to a
    second or two for the largest query accepted): call it in a worker thread from trio code."""
    return read_query(sql)


async def prepare(request: TaskRequest,
                  source_dsn: str) -> tuple[str, QueryFeatures, dict[str, SourceStats]]:
    """Refuse bad input before any fork exists: size, SQL safety, parse, tables, what the
    source's catalog says the query calls, columns (UnsafeSqlError, InputError)."""
    query, features = await trio.to_thread.run_sync(read_input, request.query)
    async with open_connection(source_dsn) as conn:
        views = await view_definitions(conn, features.tables)
        if views:  # agents work on the tables behind the views
            features = await trio.to_thread.run_sync(see_through, features, views)
        stats = await source_table_stats(conn, features.tables)
        unknown = [t for t in features.tables if t not in stats]
        if unknown:  # named with the database it looked in: the wrong target is a common cause
            database = await conn.fetchval("SELECT current_database()")
            raise InputError(f"unknown table {', '.join(unknown)} in the query (looked in database"
                             f" {database!r})")
        try:  # the catalog judges it, then EXPLAIN catches unknown columns, types (afs.target)
            await on_target(conn, query, plan_only)
        except DatabaseError as exc:
            raise InputError(f"the query does not run on the source: {str(exc).splitlines()[0]}") from exc
    return query, features, stats


async def source_server(forks: ForkClient, source: str, source_dsn: str,
                        service: Mapping[str, Any] | None = None) -> tuple[dict[str, str], bool]:
    """The server the advice is for, and whether `source` is an import: the version and planner
    settings its import recorded (`afs sandbox import`), else those of `source_dsn`'s server.
    `service`: the fork server's record of `source`, when the caller has it already."""
    recorded = (service if service is not None else await forks.get(source)).get("origin_server")
    if recorded:
        return {str(k): str(v) for k, v in recorded.items()}, True
    async with open_connection(source_dsn) as conn:
        return await server_facts(conn), False


async def optimize(
    settings: Settings,
    request: TaskRequest,
    *,
    source: str,
    source_dsn: str,
    crew: Crew,
    events: Emitter,
) -> TaskResult:
    """Run one task on `source` (read at `source_dsn`, forked by `crew.forks`); returns its
    result (a failed task is a result, not an exception).

    Raises InputError (and subclasses) for bad input, before any fork is made.
    """
    forks, squad, rules = crew.forks, crew.squad, crew.rules
    started = trio.current_time()
    task_id = events.task_id
    query, features, stats = await prepare(request, source_dsn)
    service = await forks.get(source)  # asked once: the server's facts and the copy's state
    facts, imported = await source_server(forks, source, source_dsn, service)
    # the source's plan settings, plan and tables now: forks take them, the report compares
    conditions = await task_conditions(service, source_dsn, query, features.tables, settings.application_role)
    pool = crew.pool or AgentPool()
    max_rows = max((table.rows for table in stats.values()), default=0)

    def choose(load: Mapping[AgentKey, int]) -> RoutingDecision:
        if squad.agents is not None:
            return RoutingDecision(agents=squad.agents, rationale=("fixed squad",))
        return route(rules, task_type=request.task_type, priority=request.priority,
                     features=features, max_table_rows=max_rows, agent_load=load)

    while True:
        routing = await pool.acquire(task_id, choose)
        if not routing.waiting:
            break
        events.emit("waiting_for_agents", agents=list(routing.agents))
        await pool.wait_for_change()
    events.emit("agents_assigned", agents=list(routing.agents), rationale=list(routing.rationale),
                provider=squad.provider)

    measuring = settings.measuring
    if request.runs is not None:
        measuring = dataclasses.replace(measuring, runs=request.runs)
    job = AgentJob(task_id=task_id, task_type=request.task_type, query=query,
                   features=features, source=source, source_stats=stats,
                   source_server=facts, source_imported=imported, conditions=conditions,
                   timeouts=settings.timeouts, measuring=measuring,
                   given_sets=request.parameters.others if request.parameters else (),
                   workload=request.parameters.workload if request.parameters else None)
    outcomes: dict[AgentKey, AgentOutcome] = {}
    bench_limiter = trio.CapacityLimiter(1)  # benchmark phases never overlap on one server
    shared = TaskMeasurements()  # identical proposals are measured once

    async def one(agent: AgentKey) -> None:
        with structlog.contextvars.bound_contextvars(task_id=task_id, agent=agent):  # every log line
            outcome = await run_agent(agent, job, brain=squad.brain_for(agent),
                                      common=TaskCommon(forks, bench_limiter, events, shared,
                                                         squad=len(routing.agents)))
        outcomes[agent] = dataclasses.replace(outcome, usage=_usage(squad, agent))

    try:
        with trio.move_on_after(settings.timeouts.task) as task_scope:
            async with trio.open_nursery() as nursery:
                for agent in routing.agents:
                    if request.sequential:
                        await one(agent)
                    else:
                        nursery.start_soon(one, agent)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            await pool.release(task_id, routing.agents)
    for agent in routing.agents:
        if agent not in outcomes:  # cut off by the task time limit
            outcomes[agent] = AgentOutcome(
                agent=agent, status="failed",
                error=f"cut off by the task time limit ({settings.timeouts.task:g} s)",
                usage=_usage(squad, agent))
    ordered = tuple(outcomes[a] for a in routing.agents)
    review = await _review(squad, query, ordered, settings.timeouts.model, events)
    if squad.reviewer in routing.agents:  # the review's tokens count too
        ordered = tuple(dataclasses.replace(o, usage=_usage(squad, o.agent) or o.usage)
                        for o in ordered)

    failed = [o for o in ordered if o.status == "failed"]
    error = None
    decision = None
    if len(failed) == len(ordered) or (len(ordered) > 1 and len(failed) >= 2):
        status: TaskStatus = "failed"
        error = (f"{len(failed)} of {len(ordered)} agents failed"
                 + (" (task time limit reached)" if task_scope.cancelled_caught else "")
                 + ": " + "; ".join(f"{o.agent}: {o.error}" for o in failed))
    else:
        weights = dict(request.weights) if request.weights else consensus_weights(rules)
        decision = decide(ordered, weights)
        status = "completed" if decision.winner else "no_improvement"
    duration = trio.current_time() - started
    if decision is not None:
        events.emit("consensus_reached", winner=decision.winner, duration_s=duration,
                    rationale=list(decision.rationale[:2]))
    else:
        events.emit("task_failed", duration_s=duration, error=error)
    return TaskResult(task_id=task_id, status=status, query=query, source=source,
                      routing=routing, outcomes=ordered, decision=decision,
                      provider=squad.provider, provider_note=squad.note, duration_s=duration,
                      error=error, review=review, parameters=request.parameters,
                      conditions=conditions)
