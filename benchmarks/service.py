"""The service's throughput and event latency: tasks per minute with 1, 2 and 4 workers.

For each worker count, `afs serve`'s machinery runs in this process (`run_service`:
the HTTP API on a loopback port and N in-process workers, each with its own store
connection and its own MCP fork server), over a scratch task store in the sandbox
(dropped at the end). The offline strategists think; forks and benchmarks are real,
on the demo database. First one warm-up task per worker (fork servers started,
caches warm; not timed); then --tasks tasks are submitted over HTTP at once, and each
is watched through its Server-Sent Events stream until it ends.

    tasks/min    tasks / the wall time from the first submission to the last task's end
    speedup      tasks/min against one worker's                       goal: 2 workers ≥ 1.6×
    sse p50/p95  from an event's insert in the store (its `at`, the server's clock) to its
                 arrival at the SSE client (this machine's clock)     goal: p95 ≤ 200 ms

What limits the speedup: each task's agents already run in parallel and share the
machine's cores with PostgreSQL (every benchmark runs on the one sandbox server), so
more workers add concurrency only where a task waits (fork creation, planning, its
benchmark slot), and measurements of concurrent tasks disturb each other.

    AFS_HOME=... python benchmarks/service.py [--tasks N] [--workers 1,2,4] [--runs N]
                                              [--scale small|demo|large] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

import harness
import psycopg
import trio
from harness import with_sandbox

from afs.config import Settings
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer
from afs.serve import run_service
from afs.service.client import ServiceClient

QUERIES = (
    "SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending' AND o.user_id = 42"
    " ORDER BY o.created_at DESC",
    "SELECT o.id FROM orders o WHERE o.user_id = 77 ORDER BY o.created_at DESC",
    "SELECT count(*) FROM orders WHERE status = 'pending'",
    "SELECT u.email FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total_amount > 900",
)
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
GOAL_SPEEDUP_2 = 1.6
GOAL_P95_MS = 200.0


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Round:
    workers: int
    tasks: int
    wall_s: float
    statuses: dict[str, int]
    latencies_ms: list[float] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)  # summed over the timed tasks' agents

    @property
    def per_min(self) -> float:
        return 60.0 * self.tasks / self.wall_s if self.wall_s > 0 else 0.0


async def _watch(client: ServiceClient, task_id: str, latencies: list[float],
                 phases: dict[str, float]) -> str:
    status = "unknown"
    seen: list[dict[str, Any]] = []
    async for event in client.events(task_id):
        latencies.append(1000.0 * (time.time() - datetime.fromisoformat(event["at"]).timestamp()))
        seen.append(event)
        if event["kind"] == "task_finished":
            status = event["data"]["status"]
    for phase, seconds in _phases(seen).items():
        phases[phase] = phases.get(phase, 0.0) + seconds
    return status


def _phases(events: list[dict[str, Any]]) -> dict[str, float]:
    """Where one task's time went: queued (submitted → a worker took it), and each agent's
    phases (from its `agent_phase` events: a phase lasts until the agent's next one)."""
    at = {e["kind"]: datetime.fromisoformat(e["at"]).timestamp() for e in reversed(events)}  # first of each
    out: dict[str, float] = {}
    if "task_queued" in at and "task_started" in at:
        out["queued"] = at["task_started"] - at["task_queued"]
    if "task_started" in at and "agents_assigned" in at:
        out["routing"] = at["agents_assigned"] - at["task_started"]
    last: dict[str, tuple[str, float]] = {}
    for e in events:
        if e["kind"] != "agent_phase" or not e["agent"]:
            continue
        now = datetime.fromisoformat(e["at"]).timestamp()
        if e["agent"] in last:
            phase, since = last[e["agent"]]
            out[phase] = out.get(phase, 0.0) + now - since
        last[e["agent"]] = (e["data"]["phase"], now)
    return out


async def _submit_and_watch(client: ServiceClient, bodies: list[dict[str, Any]],
                            latencies: list[float], phases: dict[str, float] | None = None
                            ) -> dict[str, int]:
    statuses: dict[str, int] = {}
    phases = {} if phases is None else phases

    async def one(body: dict[str, Any]) -> None:
        task = await client.submit(body)
        status = await _watch(client, task["id"], latencies, phases)
        statuses[status] = statuses.get(status, 0) + 1

    async with trio.open_nursery() as nursery:
        for body in bodies:
            nursery.start_soon(one, body)
    return statuses


def _body(i: int, runs: int) -> dict[str, Any]:
    return {"query": QUERIES[i % len(QUERIES)], "provider": "heuristic", "runs": runs}


async def one_round(settings: Settings, workers: int, args: argparse.Namespace) -> Round:
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(run_service, settings, bind="127.0.0.1:0", workers=workers,
                                           lease_s=30))
        url = next(u for u in urls if u.startswith("http://127.0.0.1"))
        async with ServiceClient(url, settings.service_token) as client:
            progress(f"{workers} worker(s): {workers} warm-up task(s)")
            await _submit_and_watch(client, [_body(i, args.runs) for i in range(workers)], [])
            progress(f"{workers} worker(s): {args.tasks} tasks")
            latencies: list[float] = []
            phases: dict[str, float] = {}
            started = time.monotonic()
            statuses = await _submit_and_watch(client, [_body(i, args.runs) for i in range(args.tasks)],
                                               latencies, phases)
            wall = time.monotonic() - started
        nursery.cancel_scope.cancel()
    return Round(workers, args.tasks, wall, statuses, latencies, phases)


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def measure(settings: Settings, server: SandboxServer, args: argparse.Namespace) -> list[Round]:
    await ensure_demo(settings, server, args.scale or settings.scale, progress)
    scratch = "afs_bench_service_" + os.urandom(3).hex()
    admin = server.dsn()
    await trio.to_thread.run_sync(_sql, admin, f"CREATE DATABASE {scratch}")
    try:
        configured = settings.with_(store_url=server.dsn(scratch))
        return [await one_round(configured, n, args) for n in args.workers]
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_sql, admin, f"DROP DATABASE IF EXISTS {scratch} WITH (FORCE)")


def _sql(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode())


def report(rounds: list[Round]) -> dict[str, Any]:
    base = rounds[0].per_min if rounds else 0.0
    print(f"{'workers':>7} {'tasks':>5} {'wall s':>8} {'tasks/min':>9} {'speedup':>7} "
          f"{'sse p50 ms':>10} {'sse p95 ms':>10}  statuses")
    for r in rounds:
        print(f"{r.workers:>7} {r.tasks:>5} {r.wall_s:>8.1f} {r.per_min:>9.1f} "
              f"{(r.per_min / base if base else 0):>6.2f}x {statistics.median(r.latencies_ms or [0]):>10.1f} "
              f"{_percentile(r.latencies_ms, 0.95):>10.1f}  "
              + ", ".join(f"{k} {v}" for k, v in sorted(r.statuses.items())))
    names = sorted({p for r in rounds for p in r.phases_s},
                   key=lambda p: -max(r.phases_s.get(p, 0) for r in rounds))
    print("where a task's time goes (seconds per task, summed over its agents; phases overlap across tasks):")
    print(f"{'phase':<36}" + "".join(f"{str(r.workers) + ' worker(s)':>13}" for r in rounds))
    for name in names:
        print(f"{name:<36}" + "".join(f"{r.phases_s.get(name, 0.0) / r.tasks:>13.2f}" for r in rounds))
    latencies = [x for r in rounds for x in r.latencies_ms]
    by_workers = {str(r.workers): round(r.per_min, 2) for r in rounds}
    speedups = {str(r.workers): round(r.per_min / base, 2) if base else 0.0 for r in rounds}
    p95 = round(_percentile(latencies, 0.95), 1)
    print(f"goals: 2 workers ≥ {GOAL_SPEEDUP_2}× one worker; SSE p95 ≤ {GOAL_P95_MS:g} ms "
          f"(measured over {len(latencies)} events: p95 {p95} ms)")
    return {"tasks_per_min": by_workers, "speedup": speedups, "sse_p50_ms": round(
        statistics.median(latencies or [0]), 1), "sse_p95_ms": p95, "events": len(latencies),
        "phases_s_per_task": {str(r.workers): {p: round(v / r.tasks, 2)
                                               for p, v in sorted(r.phases_s.items())} for r in rounds}}


async def run(args: argparse.Namespace, settings: Settings) -> int:
    rounds = await with_sandbox(settings, lambda server: measure(settings, server, args), progress)
    if rounds is None:
        return EXIT_INTERRUPTED
    data = report(rounds)
    if args.json:
        print(json.dumps(data))
    failed = any(r.statuses.get("failed") for r in rounds)
    return EXIT_FAILED if failed else EXIT_OK


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The service: tasks per minute with 1, 2 and 4 in-process workers (offline "
                    "strategists, real forks and benchmarks), and SSE event latency.")
    parser.add_argument("--tasks", type=int, default=8, metavar="N", help="timed tasks per round (8)")
    parser.add_argument("--workers", default="1,2,4", metavar="LIST",
                        help="worker counts, comma-separated (default 1,2,4)")
    parser.add_argument("--runs", type=int, default=2, metavar="N",
                        help="measured runs per suite query and side (default 2)")
    parser.add_argument("--scale", choices=("small", "demo", "large"),
                        help="demo data size if it must be seeded (default: AFS_SCALE or demo)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object on the last line")
    args = parser.parse_args(argv)
    try:
        args.workers = [int(n) for n in args.workers.split(",")]
    except ValueError:
        parser.error("--workers: a comma-separated list of numbers, e.g. 1,2,4")
    if args.tasks < 1 or args.runs < 1 or any(n < 1 for n in args.workers):
        parser.error("--tasks, --runs and every worker count must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main("service", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
