"""One `afs optimize` task, timed, under whichever afs its interpreter imports.

    <venv>/bin/python benchmarks/task_child.py --db NAME --query SQL [--runs N] [--sequential]

The side of `benchmarks/overhead.py --old-python` that runs in the venv of a checkout (an old
commit's or this one's), so two checkouts run the same task side by side on one sandbox. It
loads the settings from the environment (AFS_HOME), opens the fork server session as
`afs optimize` does, and runs `optimize()` with the offline strategists and the routed squad.
It prints one JSON object on its last line: "afs" (where afs was imported from), "task_s"
(session + task, as overhead.py's task_s), "optimize_s" (the task alone), "status", "error",
"winner" (the agent), "winner_sql" (its statements and rewrite), "baseline_ms" (the query as
given, median of its baseline runs), and "phases": per agent, the seconds from each of its
`agent_phase` events to the next (the last one to the agent's end; "loop step N" counted as
"loop step"), so a slow side can be read phase by phase.

Only what every checkout since 7a358b1 has is used (the crew as one argument where it exists).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import trio


def phase_seconds(stamped: list[tuple[float, Any]], ended: float) -> dict[str, dict[str, float]]:
    """Per agent, the seconds spent in each phase, from the time its phase events arrived."""
    by_agent: dict[str, list[tuple[float, str]]] = {}
    for at, event in stamped:
        if event.kind == "agent_phase" and event.agent:
            phase = str(event.data.get("phase", "?"))
            by_agent.setdefault(event.agent, []).append(
                (at, "loop step" if phase.startswith("loop step") else phase))
    out: dict[str, dict[str, float]] = {}
    for agent, phases in by_agent.items():
        own: dict[str, float] = {}
        for (at, phase), (after, _) in zip(phases, [*phases[1:], (ended, "")], strict=True):
            own[phase] = round(own.get(phase, 0.0) + after - at, 3)
        out[agent] = own
    return out


async def child(args: argparse.Namespace) -> dict[str, Any]:
    import afs
    from afs.brains import Squad, StrategistBrain
    from afs.config import load_settings
    from afs.errors import AfsError
    from afs.events import Emitter
    from afs.optimize import TaskRequest, new_task_id, optimize
    from afs.router import load_rules
    from afs.sandbox.forks import open_forks
    from afs.sandbox.server import SandboxServer

    settings = load_settings()
    server = SandboxServer(settings)
    squad = Squad(brain_for=lambda _agent: StrategistBrain(), provider="heuristic",
                  note="offline strategists")
    stamped: list[tuple[float, Any]] = []
    events = Emitter(new_task_id(), sinks=(lambda event: stamped.append((time.monotonic(), event)),))
    out: dict[str, Any] = {"afs": str(Path(afs.__file__).parent.parent)}
    started = time.monotonic()
    try:
        async with open_forks(settings) as client:
            opened = time.monotonic()
            rules = load_rules(settings.routing_rules)
            try:  # the agents' crew is one argument since 9b15a7b; an older checkout takes three
                from afs.optimize import Crew  # type: ignore[attr-defined, unused-ignore]
                crew: dict[str, Any] = {"crew": Crew(forks=client, squad=squad, rules=rules)}
            except ImportError:
                crew = {"forks": client, "squad": squad, "rules": rules}
            result = await optimize(settings, TaskRequest(query=args.query, runs=args.runs,
                                                          sequential=args.sequential),
                                    source=args.db, source_dsn=server.dsn(args.db), events=events, **crew)
            finished = time.monotonic()
    except AfsError as exc:
        out.update(task_s=time.monotonic() - started, optimize_s=None, status="failed",
                   error=str(exc)[:300], winner=None, winner_sql=None, baseline_ms=None, phases={})
        return out
    ended = time.monotonic()
    decision = result.decision
    winner = decision.winner if decision is not None else None
    proposal = next((o.proposal for o in result.outcomes if o.agent == winner), None)
    baseline = next((m.baseline.median_ms for o in result.outcomes if o.benchmark is not None
                     for m in o.benchmark.measurements if m.name == "baseline"), None)
    out.update(task_s=ended - started, optimize_s=finished - opened, status=result.status,
               error=result.error, winner=winner,
               winner_sql=[*proposal.sql_commands, proposal.rewritten_query or ""] if proposal else None,
               baseline_ms=baseline, phases=phase_seconds(stamped, finished))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="One afs optimize task (offline strategists), timed, under this interpreter's afs;"
                    " prints one JSON object (benchmarks/overhead.py --old-python runs it).")
    parser.add_argument("--db", required=True, help="the sandbox database to optimize in")
    parser.add_argument("--query", required=True, metavar="SQL", help="the query")
    parser.add_argument("--runs", type=int, metavar="N",
                        help="measured runs per suite query and side, at most")
    parser.add_argument("--sequential", action="store_true", help="the agents one after another")
    args = parser.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        parser.error("--runs must be at least 1")
    from afs import log as afs_log
    from afs.config import load_settings

    afs_log.configure(load_settings().log_dir)
    print(json.dumps(trio.run(child, args), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
