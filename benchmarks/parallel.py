"""Do the agents of a squad really work in parallel? The same task run both ways, for real.

One `afs optimize` task on the sandbox's demo database, with the fixed squad of
the three agents (gemini25pro, gemini25flash, gemini20flash), run twice in this
script: first with the agents in parallel (as AFS runs them), then with the same
agents one after another (`TaskRequest(sequential=True)`: the same task, the same
brains, forks and measurements, only the agents' nursery replaced by a loop).
Each agent's brain is the offline strategist behind a fixed simulated model
latency per call (`SlowBrain`, --latency, default 2 s; two calls per agent:
analyse, propose), injected through the agents' model interface. Forks are real
(the MCP fork server, opened before the clock starts: its start-up is not part of
the task), and so are the benchmarks (the four-query suite, at most --runs runs
per side).

    wall_s         the parallel task's duration: `optimize()` from start to consensus
    sequential_s   the sequential task's duration, measured the same way
    ratio          wall_s / sequential_s                        goal ≤ 0.5
    sum_agent_s    Σ over the parallel agents of (duration_s − waited_s), for reference

The sequential run goes second, so it finds the caches the parallel run warmed: if
anything, that favours the sequential side. An agent's `duration_s` includes the
time it spent waiting for the benchmark slot (`waited_s`; a limiter lets only one
agent benchmark at a time on one server); agents one after the other never wait.

A second table splits each agent's time into phases (fork creation and connection,
analysis, proposal, waiting for the benchmark slot, benchmark, closing the fork),
from the task's events stamped with the trio clock as they are emitted, and the
wall time into the stretch before the agents, the agents before the first
benchmark (and, of it, the slot measuring the queries before any change while the
models think), the benchmark slot's busy and idle time, and what follows the last
benchmark. Per-agent progress goes to stderr.

    AFS_HOME=... python benchmarks/parallel.py [--latency SECONDS] [--runs N] [--query SQL]
                                               [--scale small|demo|large] [--json]

It uses the configured AFS_HOME, starts the sandbox and seeds the demo database
when missing (like `afs sandbox up`), and stops the sandbox at the end only if
it started it. `--json` prints {"wall_s", "sequential_s", "sum_agent_s",
"ratio_parallel_vs_sequential"} as the last line of stdout. The agents destroy their forks (also on Ctrl-C);
any fork of the task still listed afterwards is destroyed and reported.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import harness
import trio
from harness import with_sandbox

from afs.brains import SlowBrain, Squad, StrategistBrain
from afs.config import DEFAULT_RUNS, Settings
from afs.errors import AfsError
from afs.events import Emitter, Event, log_sink
from afs.forks.client import ForkClient
from afs.models import AgentKey, AgentOutcome, TaskResult
from afs.optimize import Crew, TaskRequest, new_task_id, optimize
from afs.router import load_rules
from afs.sandbox.forks import open_forks
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer

AGENTS: tuple[AgentKey, ...] = ("gemini25pro", "gemini25flash", "gemini20flash")
DEFAULT_LATENCY_S = 2.0
DEFAULT_QUERY = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending'"
                 " AND o.user_id = 4242 ORDER BY o.created_at DESC")
GOAL = 0.5
CLEANUP_TIMEOUT_S = 60
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# Per agent, the event that starts each stretch of its time, and the stretch's column.
# A stretch ends where the agent's next marked event starts; "done" (or agent_failed) ends it all.
PHASE_OF_MARK: dict[str, str] = {
    "phase:fork": "fork",  # MCP service_fork, then the connection to the fork
    "phase:analysis": "analysis",  # EXPLAIN ANALYZE, schema, pg_stats, then the model call
    "analysis_completed": "propose",
    "phase:propose": "propose",  # the model call, then the SQL allow-list
    "proposal_submitted": "close",  # no proposal: the agent closes its fork next
    "proposal_rejected": "close",
    "phase:waiting for the benchmark slot": "wait",
    "phase:benchmark": "benchmark",
    "phase:waiting for a shared measurement": "wait",  # another agent measures the same proposal
    "phase:waiting for the baseline": "wait",  # the model was quicker than measuring the baseline
    "benchmark_completed": "close",  # MCP service_delete and the connection's end
}
END_MARKS = ("phase:done", "agent_failed")
PHASES = ("fork", "analysis", "propose", "wait", "benchmark", "close")


def progress(message: str) -> None:
    print(f"[parallel] {message}", file=sys.stderr, flush=True)


@dataclass
class Timeline:
    """Every event of the task, with the trio clock reading when it was emitted."""

    started: float = 0.0
    events: list[tuple[float, Event]] = field(default_factory=list)

    def sink(self, event: Event) -> None:
        now = trio.current_time()
        self.events.append((now, event))
        if event.kind == "agent_phase":
            progress(f"+{now - self.started:6.2f} s  {event.agent}: {event.data.get('phase')}")
        elif event.kind == "agent_failed":
            progress(f"+{now - self.started:6.2f} s  {event.agent}: failed: {event.data.get('error')}")

    def marks(self, agent: AgentKey) -> list[tuple[float, str]]:
        found = []
        for at, event in self.events:
            if event.agent != agent:
                continue
            mark = f"phase:{event.data.get('phase')}" if event.kind == "agent_phase" else event.kind
            if mark in PHASE_OF_MARK or mark in END_MARKS:
                found.append((at, mark))
        return found

    def phases(self, agent: AgentKey) -> dict[str, float]:
        """Seconds per phase of one agent, from its first event to its last."""
        spent = dict.fromkeys(PHASES, 0.0)
        marks = self.marks(agent)
        for (at, mark), (next_at, _) in pairwise(marks):
            if mark in PHASE_OF_MARK:
                spent[PHASE_OF_MARK[mark]] += next_at - at
        return spent

    def first(self, kind: str, phase: str | None = None) -> float | None:
        for at, event in self.events:
            if event.kind == kind and (phase is None or event.data.get("phase") == phase):
                return at
        return None

    def benchmark_spans(self) -> list[tuple[float, float]]:
        """(start, end) of every benchmark, in order of start."""
        spans = []
        for agent in {e.agent for _, e in self.events if e.agent is not None}:
            start = None
            for at, mark in self.marks(agent):
                if mark == "phase:benchmark":
                    start = at
                elif start is not None and mark in ("benchmark_completed", *END_MARKS):
                    spans.append((start, at))
                    start = None
        return sorted(spans)


@dataclass(frozen=True)
class Measured:
    result: TaskResult
    wall_s: float
    timeline: Timeline
    latency_s: float
    sequential: TaskResult
    sequential_s: float


# -- the run ------------------------------------------------------------------------------
async def measure(settings: Settings, server: SandboxServer, args: argparse.Namespace) -> Measured:
    scale = args.scale or settings.scale
    await ensure_demo(settings, server, scale, progress)
    rules = load_rules(settings.routing_rules)
    latency: float = args.latency
    squad = Squad(
        agents=AGENTS,
        brain_for=lambda _agent: SlowBrain(StrategistBrain(), latency),
        provider="simulated",
        note=f"offline strategists behind a simulated model latency of {latency:g} s per call",
    )
    source = settings.demo_database
    timelines = (Timeline(), Timeline())
    results: list[tuple[TaskResult, float]] = []
    progress("opening the MCP session with the fork server (not timed)")
    async with open_forks(settings) as client:
        for sequential, timeline in zip((False, True), timelines, strict=True):
            request = TaskRequest(query=args.query, runs=args.runs, sequential=sequential)
            emitter = Emitter(new_task_id(), sinks=(log_sink, timeline.sink))
            way = "one after another" if sequential else "in parallel"
            progress(f"task {emitter.task_id}: {len(AGENTS)} agents {way}, {latency:g} s per model"
                     f" call, at most {args.runs} runs per suite query and side")
            try:
                timeline.started = trio.current_time()
                result = await optimize(settings, request, source=source,
                                        source_dsn=server.dsn(source),
                                        crew=Crew(forks=client, squad=squad, rules=rules), events=emitter)
                results.append((result, trio.current_time() - timeline.started))
            finally:
                await remove_leftover_forks(client, emitter.task_id)
    (result, wall), (sequential_result, sequential_s) = results
    return Measured(result=result, wall_s=wall, timeline=timelines[0], latency_s=latency,
                    sequential=sequential_result, sequential_s=sequential_s)


async def remove_leftover_forks(client: ForkClient, task_id: str) -> None:
    """The agents destroy their forks; destroy (and report) any of this task still there."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
        try:
            forks = (await client.list_services())["forks"]
            for fork in forks:
                if f"-task{task_id}-" in fork["name"]:
                    progress(f"fork {fork['name']} was left behind; destroying it")
                    await client.destroy(fork["name"])
        except AfsError as exc:
            progress(f"could not check for leftover forks: {exc}")


# -- the report ---------------------------------------------------------------------------
def own_s(outcome: AgentOutcome) -> float:
    return outcome.duration_s - outcome.waited_s


def report(measured: Measured) -> dict[str, float]:
    result, timeline = measured.result, measured.timeline
    outcomes = result.outcomes
    winner = result.decision.winner if result.decision is not None else None
    print(f"task {result.task_id}: {result.status}, winner: {winner or 'none'}"
          f"  ({len(outcomes)} agents, simulated model latency {measured.latency_s:g} s per call)")
    if result.error:
        print(f"task error: {result.error}")
    print()
    header = (f"{'agent':<15} {'status':<9} {'proposal_type':<18} {'duration s':>10}"
              f" {'waited for benchmark s':>22} {'own s':>8}")
    print(header)
    print("-" * len(header))
    for o in outcomes:
        kind = o.proposal.proposal_type if o.proposal is not None else "-"
        print(f"{o.agent:<15} {o.status:<9} {kind:<18} {o.duration_s:>10.2f}"
              f" {o.waited_s:>22.2f} {own_s(o):>8.2f}")
    sum_duration = sum(o.duration_s for o in outcomes)
    sum_waited = sum(o.waited_s for o in outcomes)
    sum_own = sum(own_s(o) for o in outcomes)
    print("-" * len(header))
    print(f"{'Σ':<15} {'':<9} {'':<18} {sum_duration:>10.2f} {sum_waited:>22.2f} {sum_own:>8.2f}")
    for o in outcomes:
        if o.error:
            print(f"  {o.agent}: {o.error}")
    print()
    print_phases(timeline, [o.agent for o in outcomes])
    print()
    print_wall_split(timeline, measured.wall_s)
    print()
    sequential = measured.sequential
    seq_winner = sequential.decision.winner if sequential.decision is not None else None
    print(f"the same task, agents one after another: {sequential.status}, winner: {seq_winner or 'none'},"
          f" {measured.sequential_s:.2f} s")
    for o in sequential.outcomes:
        print(f"  {o.agent:<15} {o.status:<9} {o.duration_s:>8.2f} s (waited {o.waited_s:.2f} s)")
    print()
    ratio = measured.wall_s / measured.sequential_s if measured.sequential_s > 0 else float("inf")
    data = {
        "wall_s": round(measured.wall_s, 3),
        "sequential_s": round(measured.sequential_s, 3),
        "sum_agent_s": round(sum_own, 3),
        "ratio_parallel_vs_sequential": round(ratio, 4),
    }
    print(f"wall_s = {measured.wall_s:.2f}  (the parallel task, optimize() start to consensus)")
    print(f"sequential_s = {measured.sequential_s:.2f}  (the same task, agents one after another)")
    print(f"Σ duration_s = {sum_duration:.2f}  (parallel agents; includes {sum_waited:.2f} s of waiting"
          " for the benchmark slot)")
    print(f"sum_agent_s = Σ (duration_s − waited_s) = {sum_own:.2f}  (for reference)")
    verdict = "met" if ratio <= GOAL else "NOT met"
    print(f"ratio_parallel_vs_sequential = wall_s / sequential_s = {ratio:.4f}"
          f"  (goal ≤ {GOAL}: {verdict})")
    return data


def print_phases(timeline: Timeline, agents: Sequence[AgentKey]) -> None:
    print("seconds per phase (from the task's events; fork = create + connect,"
          " analysis = EXPLAIN ANALYZE + model, close = destroy the fork)")
    header = f"{'agent':<15}" + "".join(f" {p:>10}" for p in PHASES) + f" {'total':>10}"
    print(header)
    totals = dict.fromkeys(PHASES, 0.0)
    for agent in agents:
        spent = timeline.phases(agent)
        for phase in PHASES:
            totals[phase] += spent[phase]
        print(f"{agent:<15}" + "".join(f" {spent[p]:>10.2f}" for p in PHASES)
              + f" {sum(spent.values()):>10.2f}")
    print(f"{'Σ':<15}" + "".join(f" {totals[p]:>10.2f}" for p in PHASES)
          + f" {sum(totals.values()):>10.2f}")


def print_wall_split(timeline: Timeline, wall_s: float) -> None:
    """Where the wall time went: before the agents, before the first benchmark, the slot, after."""
    start, end = timeline.started, timeline.started + wall_s
    assigned = timeline.first("agents_assigned") or start
    spans = timeline.benchmark_spans()
    print("the wall time, in order")
    rows: list[tuple[str, float]] = [("before the agents (query checks, statistics, routing)",
                                      assigned - start)]
    if spans:
        busy = sum(b - a for a, b in spans)
        rows += [
            ("agents at work before the first benchmark starts", spans[0][0] - assigned),
            (f"benchmark slot busy ({len(spans)} benchmarks, one at a time)", busy),
            ("benchmark slot idle between the first and the last benchmark",
             spans[-1][1] - spans[0][0] - busy),
            ("after the last benchmark (closing forks, consensus)", end - spans[-1][1]),
        ]
    else:
        rows.append(("agents at work, consensus (no benchmark ran)", end - assigned))
    measuring, measured = timeline.first("baseline_measuring"), timeline.first("baseline_measured")
    if measuring is not None and measured is not None:  # in the slot, while the models think
        rows.insert(2, ("  of which the slot measures the queries before any change", measured - measuring))
    for label, seconds in rows:
        print(f"  {label:<64} {seconds:>8.2f} s")
    print(f"  {'total':<64} {wall_s:>8.2f} s")


# -- the script ---------------------------------------------------------------------------
async def run(args: argparse.Namespace, settings: Settings) -> int:
    measured = await with_sandbox(settings, lambda server: measure(settings, server, args), progress)
    if measured is None:
        return EXIT_INTERRUPTED
    data = report(measured)
    if args.json:
        print(json.dumps(data))
    failed = "failed" in (measured.result.status, measured.sequential.status)
    return EXIT_FAILED if failed else EXIT_OK


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Parallel agents: one optimize task with three agents (simulated model"
                    " latency, real forks and benchmarks); wall time against the agents' own time.")
    parser.add_argument("--latency", type=float, default=DEFAULT_LATENCY_S, metavar="SECONDS",
                        help=f"simulated model latency per call (default {DEFAULT_LATENCY_S:g})")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, metavar="N",
                        help=f"measured runs per suite query and side, at most (default {DEFAULT_RUNS})")
    parser.add_argument("--query", default=DEFAULT_QUERY, metavar="SQL",
                        help="the query to optimize (default: the pending orders of user 4242)")
    parser.add_argument("--scale", choices=("small", "demo", "large"),
                        help="demo data size if it must be seeded (default: AFS_SCALE or demo)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object on the last line")
    args = parser.parse_args(argv)
    if args.latency < 0:
        parser.error("--latency must not be negative")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main("parallel", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
