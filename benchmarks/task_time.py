"""AFS's task time on the quality corpus, two checkouts side by side in one run.

For every case of `quality_cases.py` (the same selection and scale options as quality.py):
build the case database once (with this checkout's quality.py), then run AFS's task on the
case's query under each checkout in turn, each in a process of its own venv:

    <venv>/bin/python benchmarks/task_time.py --child --db NAME --query SQL [...]

The child imports `afs` from its venv (an editable install of its checkout), opens the fork
server session as `afs optimize` does, and times `optimize()` with the offline strategists
and the routed squad: the wall time of the task, not of the interpreter's start nor of the
session. The order of the two alternates from case to case (drift hits both alike). A
slow-baseline case gives both its own statement timeout and cap (AFS_STATEMENT_TIMEOUT_MS,
AFS_SLOW_BASELINE_CAP_S), as quality.py does.

    AFS_HOME=... python benchmarks/task_time.py --old-python /tmp/afs-old/.venv/bin/python
                 [--new-python .venv/bin/python] [--case NAME ...] [--quick] [--scale F]
                 [--afs-runs N] [--json]

It uses the configured AFS_HOME and starts the sandbox if needed (stopping it only if it
started it); both checkouts use that one sandbox. `--json` prints {"cases", "median_old_s",
"median_new_s", "ratio_new_vs_old", "details"} as the last line; the goal of issue 25 is
ratio_new_vs_old ≤ 1.2.

One given query instead of the corpus, N paired runs (the order alternating from pair to
pair, a sync of the disks before each run), each side in its own AFS_HOME if given:

    AFS_HOME=... python benchmarks/task_time.py --old-python PY --query SQL [--db afs_demo]
                 [--repeat 5] [--old-home DIR] [--new-home DIR]

A side's home must hold the database (seed it with that checkout's `afs sandbox up`); its
sandbox, if not running, is started by the task and left running (`afs sandbox down`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
EXIT_OK, EXIT_FAILED = 0, 1
CHILD_TIMEOUT_S = 1800


def progress(message: str) -> None:
    print(f"[task_time] {message}", file=sys.stderr, flush=True)


# -- the child: one task, timed, under whichever afs its interpreter imports ----------------
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
    brain = StrategistBrain()
    squad = Squad(brain_for=lambda _agent: brain, provider="heuristic", note="task_time")
    emitter = Emitter(new_task_id(), sinks=())
    out: dict[str, Any] = {"afs": str(Path(afs.__file__).parent.parent)}
    async with open_forks(settings) as client:
        started = time.monotonic()
        try:
            request = TaskRequest(query=args.query, runs=args.afs_runs or settings.runs)
            rules = load_rules(settings.routing_rules)
            try:  # the agents' crew is one argument since 9b15a7b; an older checkout takes three
                from afs.optimize import Crew  # type: ignore[attr-defined, unused-ignore]
                crew: dict[str, Any] = {"crew": Crew(forks=client, squad=squad, rules=rules)}
            except ImportError:
                crew = {"forks": client, "squad": squad, "rules": rules}
            result = await optimize(settings, request, source=args.db, source_dsn=server.dsn(args.db),
                                    events=emitter, **crew)
        except AfsError as exc:
            out.update(seconds=time.monotonic() - started, status="failed", error=str(exc)[:300],
                       winner=None, sql=[])
            return out
        out["seconds"] = time.monotonic() - started
    winner = result.decision.winner if result.decision is not None else None
    proposal = next((o.proposal for o in result.outcomes if o.agent == winner), None)
    out.update(status=result.status, error=result.error, winner=winner,
               agents=[o.agent for o in result.outcomes],
               sql=list(proposal.sql_commands) if proposal else [],
               rewrite=proposal.rewritten_query if proposal else None)
    return out


# -- the parent ------------------------------------------------------------------------------
async def run_child(python: str, db: str, query: str, afs_runs: int | None,
                    statement_timeout_ms: int | None, home: str | None = None) -> dict[str, Any]:
    command = [python, str(HERE / "task_time.py"), "--child", "--db", db, "--query", query]
    if afs_runs:
        command += ["--afs-runs", str(afs_runs)]
    env = dict(os.environ)
    if home is not None:
        env["AFS_HOME"] = home
    if statement_timeout_ms is not None:
        env["AFS_STATEMENT_TIMEOUT_MS"] = str(statement_timeout_ms)
        env["AFS_SLOW_BASELINE_CAP_S"] = str(max(1, round(statement_timeout_ms / 1000)))
    with trio.move_on_after(CHILD_TIMEOUT_S) as scope:
        result = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False,
                                        env=env, cwd="/")
    if scope.cancelled_caught:
        return {"seconds": None, "status": "failed", "error": f"over {CHILD_TIMEOUT_S} s"}
    lines = result.stdout.decode().strip().splitlines()
    if result.returncode != 0 or not lines:
        return {"seconds": None, "status": "failed",
                "error": result.stderr.decode().strip().splitlines()[-1:] or ["no output"]}
    data: dict[str, Any] = json.loads(lines[-1])
    return data


async def measure(settings: Any, server: Any, cases: Sequence[Any], args: argparse.Namespace
                  ) -> list[dict[str, Any]]:
    import quality
    from quality_cases import render, scaled

    from afs.forks.provider import LocalForkProvider

    provider = LocalForkProvider(server.dsn(), statement_timeout_ms=quality.BUILD_TIMEOUT_MS)
    facts = await quality.server_facts(server.dsn())
    sides = {"old": args.old_python, "new": args.new_python}
    details = []
    for number, case in enumerate(cases, 1):
        values: dict[str, object] = {**scaled(case.sizes, args.scale), **facts.values}
        progress(f"case {number}/{len(cases)}: {case.name}: building")
        entry: dict[str, Any] = {"case": case.name}
        try:
            await quality.build_database(server, provider, case, values)
            order = ("old", "new") if number % 2 else ("new", "old")
            for side in order:
                run = await run_child(sides[side], quality.database_name(case), render(case.query, values),
                                      args.afs_runs, case.statement_timeout_ms)
                entry[side] = run
                progress(f"{case.name}: {side} ({run.get('afs', sides[side])}): {run.get('status')} in"
                         f" {_s(run.get('seconds'))} s, winner {run.get('winner')}"
                         + (f", error {run.get('error')}" if run.get("error") else ""))
        finally:
            await quality.drop_database(provider, case)
        details.append(entry)
    return details


async def measure_query(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`--repeat` paired runs of the one `--query` on `--db`, old and new in turn."""
    sides = {"old": args.old_python, "new": args.new_python}
    homes = {"old": args.old_home, "new": args.new_home}
    details = []
    for number in range(1, args.repeat + 1):
        entry: dict[str, Any] = {"case": f"run {number}"}
        for side in ("old", "new") if number % 2 else ("new", "old"):
            await trio.to_thread.run_sync(os.sync)  # the last run's fork copies are on disk, not in this one
            run = await run_child(sides[side], args.db, args.query, args.afs_runs, None, homes[side])
            entry[side] = run
            progress(f"run {number}: {side} ({run.get('afs', sides[side])}): {run.get('status')} in"
                     f" {_s(run.get('seconds'))} s, winner {run.get('winner')} {run.get('sql')}"
                     + (f", error {run.get('error')}" if run.get("error") else ""))
        details.append(entry)
    return details


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def summary(details: Sequence[dict[str, Any]]) -> dict[str, Any]:
    both = [d for d in details if d.get("old", {}).get("seconds") is not None
            and d.get("new", {}).get("seconds") is not None]
    old = statistics.median(d["old"]["seconds"] for d in both) if both else None
    new = statistics.median(d["new"]["seconds"] for d in both) if both else None
    return {"cases": len(both), "median_old_s": None if old is None else round(old, 2),
            "median_new_s": None if new is None else round(new, 2),
            "ratio_new_vs_old": round(new / old, 3) if old and new is not None else None,
            "details": list(details)}


def report(data: dict[str, Any], args: argparse.Namespace) -> None:
    what = (f"on {args.db}, {args.repeat} paired runs" if args.query
            else f"per quality case, scale {args.scale:g}")
    print(f"AFS's task time {what}: old = {args.old_python}, new = {args.new_python}")
    print(f"{'case':<28} {'old s':>8} {'new s':>8} {'new/old':>8}  winners (old | new)")
    for d in data["details"]:
        old, new = d.get("old", {}), d.get("new", {})
        ratio = (f"{new['seconds'] / old['seconds']:.2f}" if old.get("seconds") and new.get("seconds")
                 is not None else "-")
        print(f"{d['case']:<28} {_s(old.get('seconds')):>8} {_s(new.get('seconds')):>8} {ratio:>8}"
              f"  {old.get('winner') or old.get('status')} | {new.get('winner') or new.get('status')}")
    print(f"cases {data['cases']}, median task old {data['median_old_s']} s, new {data['median_new_s']} s,"
          f" new/old {data['ratio_new_vs_old']} (goal ≤ 1.2)")
    ratios = [d["new"]["seconds"] / d["old"]["seconds"] for d in data["details"]
              if d.get("old", {}).get("seconds") and d.get("new", {}).get("seconds") is not None]
    same = sum(1 for d in data["details"] if _same_winner(d.get("old", {}), d.get("new", {})))
    if ratios:
        print(f"median of the runs' new/old {statistics.median(ratios):.3f};"
              f" same winner and SQL in {same} of {len(data['details'])}")


def _same_winner(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return bool(old.get("winner")) and all(old.get(key) == new.get(key) for key in ("winner", "sql"))


async def parent(args: argparse.Namespace, settings: Any) -> int:
    import harness
    import quality

    cases = [] if args.query else quality.select_cases(args)
    expected = args.repeat if args.query else len(cases)
    details = await harness.with_sandbox(
        settings, lambda server: (measure_query(args) if args.query
                                   else measure(settings, server, cases, args)),
        progress)
    if details is None:
        return harness.EXIT_INTERRUPTED
    data = summary(details)
    report(data, args)
    if args.json:
        print(json.dumps(data, default=str))
    return EXIT_OK if data["cases"] == expected else EXIT_FAILED


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="AFS's task time on the quality corpus under two checkouts (two venvs), case by case.")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--query", metavar="SQL",
                        help="time this query instead of the quality corpus (--repeat paired runs)")
    parser.add_argument("--db", metavar="NAME", help="with --query: the sandbox database (default afs_demo)")
    parser.add_argument("--repeat", type=int, default=5, metavar="N",
                        help="with --query: paired runs, the order alternating (default 5)")
    parser.add_argument("--old-home", metavar="DIR", help="AFS_HOME of the old side (default: AFS_HOME)")
    parser.add_argument("--new-home", metavar="DIR", help="AFS_HOME of the new side (default: AFS_HOME)")
    parser.add_argument("--old-python", metavar="PATH", help="the interpreter of the old checkout's venv")
    parser.add_argument("--new-python", metavar="PATH", default=sys.executable,
                        help="the interpreter of the new checkout's venv (default: this one)")
    parser.add_argument("--case", action="append", metavar="NAME", help="this case only (repeatable)")
    parser.add_argument("--quick", action="store_true", help="quality.py's --quick subset and scale")
    parser.add_argument("--scale", type=float, metavar="F", help="row count factor (default 1)")
    parser.add_argument("--afs-runs", type=int, metavar="N", help="AFS's runs per suite query and side")
    parser.add_argument("--json", action="store_true", help="the summary as one JSON line at the end")
    args = parser.parse_args(argv)
    if args.child:
        if not args.db or not args.query:
            parser.error("--child needs --db and --query")
        return args
    if not args.old_python:
        parser.error("--old-python is required")
    for python in (args.old_python, args.new_python):
        if not os.access(python, os.X_OK):
            parser.error(f"not an executable interpreter: {python}")
    if args.scale is None:
        args.scale = 0.05 if args.quick else 1.0
    if args.scale <= 0 or args.repeat < 1 or (args.afs_runs is not None and args.afs_runs < 1):
        parser.error("--scale, --repeat and --afs-runs must be positive")
    if args.query is not None and (args.case or args.quick):
        parser.error("--query times one query: not with --case or --quick")
    if args.query is not None and not args.query.strip():
        parser.error("--query is empty")
    args.db = args.db or "afs_demo"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        from afs import log as afs_log
        from afs.config import load_settings

        afs_log.configure(load_settings().log_dir)
        print(json.dumps(trio.run(child, args), default=str))
        return EXIT_OK
    import harness

    return harness.main("task_time", args, parent)


if __name__ == "__main__":
    sys.exit(main())
