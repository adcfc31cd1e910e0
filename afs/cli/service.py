"""The task store and the service: `afs history|show|events|resume` read and re-run stored tasks,
`afs worker` takes queued ones, `afs serve` is the HTTP API with its workers (afs.serve).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

import trio

from afs.cli.commands import add_top
from afs.cli.output import EXIT_FAILED, EXIT_OK, emit
from afs.cli.shared import open_task_store, print_finished, sandbox_stop_reported
from afs.config import LEASING, Leasing, Settings
from afs.errors import InputError
from afs.sandbox.server import SandboxServer
from afs.store import store_url
from afs.store.store import STATUSES


def _history_text(tasks: list[Any], winners: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [f"{'task':<9} {'status':<15} {'created':<20} {'source':<12} {'winner':<20} {'gain':>7}  query"]
    for t in tasks:
        query = " ".join(t.query.split())
        won = winners.get(t.id) or {}
        gain = won.get("improvement_pct")
        lines.append(f"{t.id:<9} {t.status:<15} {t.created_at:%Y-%m-%d %H:%M:%S} "
                     f"{(t.source or '-'):<12} {won.get('proposal_type') or '-'!s:<20} "
                     f"{'-' if gain is None else f'{float(gain):.1f} %':>7}  "
                     f"{query[:60] + ('…' if len(query) > 60 else '')}")
    return "\n".join(lines) if tasks else "no tasks yet"


async def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    if args.limit < 1:
        raise InputError(f"--limit must be at least 1, got {args.limit}")
    unknown = [s for s in args.status if s not in STATUSES]
    if unknown:
        raise InputError(f"--status: unknown {', '.join(unknown)} (one of {', '.join(STATUSES)})")
    async with open_task_store(settings) as store:
        tasks = await store.tasks(limit=args.limit, statuses=args.status)
        winners = await store.winners([t.id for t in tasks])
    emit(args, [{**t.public(), "winner": winners.get(t.id)} for t in tasks], _history_text(tasks, winners))
    return EXIT_OK


async def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    async with open_task_store(settings) as store:
        task = await store.get(args.task)
        result = await store.result(args.task)
    if result is not None:
        return print_finished(args, task.id, result, task.error)
    emit(args, task.public(), f"AFS task {task.id}: {task.status}"
         + (f": {task.error}" if task.error else "") + f"\nquery: {task.query}")
    return EXIT_FAILED if task.status in ("failed", "cancelled", "interrupted") else EXIT_OK


def _event_text(e: Any) -> str:
    who = " ".join(x for x in (e.agent, e.fork) if x)
    data = " ".join(f"{k}={v}" for k, v in e.data.items())
    took = f" ({e.duration_s:.2f} s)" if e.duration_s is not None else ""
    return f"{e.at:%H:%M:%S.%f}"[:-3] + f" #{e.id} {e.kind}{took} {who} {data}".rstrip()


async def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    """Print a task's events; with --follow, go on until the task ends."""
    async with open_task_store(settings) as store:
        await store.get(args.task)
        last = args.after
        while True:
            events = await store.events(args.task, after=last)
            for e in events:
                print(json.dumps(e.public(), default=str) if args.json else _event_text(e), flush=True)
                last = e.id
            if not args.follow:
                return EXIT_OK
            if not events:
                if (await store.get(args.task)).finished and not await store.events(args.task, after=last):
                    return EXIT_OK
                await trio.sleep(0.2)


async def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Queue a failed, cancelled or interrupted task again, and run it here unless --queue-only."""
    from afs.sandbox.forks import in_process  # the workflow and the MCP SDK: not for history, show, events
    from afs.service.runner import run_task
    from afs.service.worker import open_runtime, worker_name

    async with open_task_store(settings) as store:
        task = await store.resume(args.task)
    if args.queue_only:
        emit(args, task.public(), f"task {task.id} is queued again: a worker will take it")
        return EXIT_OK
    worker = worker_name("resume")
    sandboxed = settings.store_url is None or in_process(settings)
    async with sandbox_stop_reported(settings, sandboxed), open_runtime(settings, store_url(settings)) as rt:
        claimed = await rt.store.claim(worker, rt.lease_s, task_id=task.id, in_process=True)
        if claimed is None:
            emit(args, task.public(), f"task {task.id} is queued again; a worker took it already")
            return EXIT_OK
        finished = await run_task(rt, claimed, worker, on_interrupt="cancel")
    return print_finished(args, finished.task_id, finished.result, finished.error, finished.bad_input)


async def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    """Take tasks from the store until interrupted (a running task goes back to the queue)."""
    from afs.service.runner import (
        relayed_cancellation,  # the workflow and the MCP SDK: not for history, show, events
    )
    from afs.service.worker import open_runtime, run_worker, worker_name

    if args.lease <= 0 or args.poll <= 0:
        raise InputError("--lease and --poll must be positive numbers of seconds")
    leasing = Leasing(lease_s=args.lease, poll_s=args.poll)
    name = args.name or worker_name()
    sandboxed = settings.store_url is None or not settings.source_server_url
    if sandboxed:
        await trio.to_thread.run_sync(SandboxServer(settings).start)
    print(f"afs worker {name}: taking tasks (Ctrl-C stops it)", file=sys.stderr, flush=True)
    ran = 0
    stopped = "the sandbox stopped under the worker; start it with `afs sandbox up` and the worker again"
    async with sandbox_stop_reported(settings, sandboxed, stopped), relayed_cancellation() as work, \
            open_runtime(settings, store_url(settings), leasing=leasing) as rt:
        with work:  # Ctrl-C: the task goes back to the queue, its forks destroyed
            ran = await run_worker(rt, name, poll_s=leasing.poll_s, max_tasks=args.max_tasks)
    emit(args, {"worker": name, "tasks": ran}, f"worker {name} ran {ran} task(s)")
    return EXIT_OK


async def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from afs.serve import serve  # the workflow and the MCP SDK: not for history, show, events

    await serve(settings, bind=args.bind, workers=args.workers, lease_s=args.lease)
    return EXIT_OK



def add_commands(commands: Any) -> None:
    """history, show, events, resume, worker, serve."""
    hist = add_top(commands, "history", cmd_history)
    hist.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    hist.add_argument("--status", action="append", default=[], metavar="STATUS",
                      help=f"only these statuses ({', '.join(STATUSES)}); repeatable")
    show = add_top(commands, "show", cmd_show)
    show.add_argument("task", help="the task id (see `afs history`)")
    events = add_top(commands, "events", cmd_events)
    events.add_argument("task")
    events.add_argument("--follow", "-f", action="store_true", help="wait for new events until the task ends")
    events.add_argument("--after", type=int, default=0, metavar="ID", help="only events after this id")
    resume = add_top(commands, "resume", cmd_resume)
    resume.add_argument("task")
    resume.add_argument("--queue-only", action="store_true",
                        help="only put it back in the queue, for a worker")
    worker = add_top(commands, "worker", cmd_worker)
    worker.add_argument("--name", help="worker name (default: host, pid and a random suffix)")
    worker.add_argument("--lease", type=float, default=LEASING.lease_s, metavar="S",
                        help=f"lease length; renewed every min(S/3, 0.5) s (default {LEASING.lease_s:g})")
    worker.add_argument("--poll", type=float, default=LEASING.poll_s, metavar="S", help="queue poll interval")
    worker.add_argument("--max-tasks", type=int, metavar="N", help="stop after N tasks")
    serve = add_top(commands, "serve", cmd_serve, json_flag=False)
    serve.add_argument("--bind", default="127.0.0.1:8470", metavar="HOST:PORT",
                       help="address to listen on (default 127.0.0.1:8470); any other than loopback "
                            "needs AFS_SERVICE_TOKEN")
    serve.add_argument("--workers", type=int, default=1, metavar="N",
                       help="in-process workers (default 1; 0 = the API, and recovery of the tasks of "
                            "dead workers elsewhere)")
    serve.add_argument("--lease", type=float, default=LEASING.lease_s, metavar="S", help="the workers' lease")


