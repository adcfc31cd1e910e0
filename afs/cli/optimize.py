"""`afs optimize`: one task, stored and run here (or by `afs serve` with --server), its report
printed. The task is checked as the API checks it (afs.task) before anything starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Any, get_args

import trio

from afs.brains.choose import check_provider
from afs.cli.commands import DSN_PASSWORDS, add_top
from afs.cli.output import EXIT_FAILED, progress, progress_done, say
from afs.cli.shared import (
    SANDBOX_STOPPED,
    add_libpq_flags,
    print_finished,
    sandbox_answers,
    sandbox_stop_reported,
    start_sandbox,
    target_from_flags,
)
from afs.config import Settings
from afs.display import LiveDisplay
from afs.errors import ConfigError, InputError, SandboxError
from afs.models import Priority, Provider, TaskResult, TaskType
from afs.query.text import MAX_QUERY_BYTES
from afs.sandbox.server import SandboxServer
from afs.service.client import ServiceClient
from afs.store import TaskSubmission, store_url
from afs.store.codec import decode
from afs.task import check_runs, read_query, read_weights


async def _served_source(client: Any, dsn: str) -> str:
    """The source another fork server makes from `dsn`: its import, else the database of that
    name registered there (`afs mcp serve --admin-dsn … --register DB`)."""
    from afs.sandbox.importer import origin_of

    origin = origin_of(dsn)
    sources = (await client.list_services())["sources"]
    for source in sources:
        if source.get("origin") == origin:
            return str(source["name"])
    dbname = origin.rpartition("/")[2]
    for source in sources:
        if source["name"] == dbname:
            return dbname
    raise InputError(f"the fork server has no source for {origin}: register the database there"
                     f" (`afs mcp serve --admin-dsn DSN --register {dbname}`)")



def query_text(query: str | None, file: str | None) -> str:
    """The query as given: `--query SQL`, `--query -` (standard input) or `--file FILE`, read as
    UTF-8 and at most one byte past the size limit (afs.features.check_input refuses it)."""
    if query is not None and query != "-":
        return query
    try:
        if query == "-":
            raw = sys.stdin.buffer.read(MAX_QUERY_BYTES + 1)
            where = "standard input"
        else:
            assert file is not None
            with open(file, "rb") as handle:
                raw = handle.read(MAX_QUERY_BYTES + 1)
            where = file
    except OSError as exc:
        raise InputError(f"cannot read the query: {exc.strerror or exc}: {file}") from None
    if len(raw) > MAX_QUERY_BYTES:
        raise InputError(f"the query in {where} is larger than {MAX_QUERY_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"the query in {where} is not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise InputError(f"the query in {where} is empty")
    return text


async def cmd_optimize(args: argparse.Namespace, settings: Settings) -> int:
    """A task like any other: stored, run here (or by `--server`), its report printed."""
    runs = check_runs(settings.runs if args.runs is None else args.runs, "--runs")
    # the target as every command resolves it: --dsn and psql's flags, AFS_DATABASE_URL, PG*, the file
    args.dsn = target_from_flags(args, settings)
    args.query = query_text(args.query, args.file)
    await trio.to_thread.run_sync(read_query, args.query)  # bad input: refused before anything starts
    weights = read_weights(args.weights, "--weights")
    if args.max_spend is not None:
        if args.server:
            raise InputError("--max-spend caps the model calls of a task run here; `afs serve` runs "
                             "with its own cap (gemini.max_spend_usd or AFS_GEMINI_MAX_SPEND_USD where "
                             "it runs)")
        settings = settings.with_(gemini=dataclasses.replace(settings.gemini, max_spend_usd=args.max_spend))
    if args.server:
        return await _optimize_remote(args, settings, runs, weights)

    await check_provider(args.provider, settings, settings.environment)  # models that exist, before a sandbox
    from afs.optimize import new_task_id  # the workflow and the MCP SDK: not for --server
    from afs.sandbox.forks import uses_the_sandbox
    from afs.sandbox.importer import sandbox_source
    from afs.sandbox.seeding import ensure_demo
    from afs.service.runner import relayed_cancellation, run_task
    from afs.service.worker import open_runtime, worker_name


    sandboxed = uses_the_sandbox(settings, args.dsn)
    if not sandboxed and not settings.store_url:
        raise ConfigError("with another fork server (AFS_FORK_SERVER_URL or AFS_FORK_SERVER_COMMAND) and "
                          "--dsn, set "
                          "AFS_STORE_URL to the task store's database (the sandbox holds it otherwise)")
    if sandboxed:
        server = SandboxServer(settings)
        await start_sandbox(server)
        if args.dsn is None:
            await ensure_demo(settings, server, settings.scale, progress)
    progress_done()
    display = LiveDisplay(live=None if not args.json else False)
    worker = worker_name("optimize")
    finished = None
    async with sandbox_stop_reported(settings, sandboxed), relayed_cancellation() as work, \
            open_runtime(settings, store_url(settings)) as rt:
        with work:  # Ctrl-C: the task is recorded as cancelled, its forks destroyed
            direct_dsn = None
            if sandboxed:
                source = await sandbox_source(rt.forks, settings.demo_database, args.dsn)
            else:  # another fork server: the database itself is read, and forked there
                source, direct_dsn = await _served_source(rt.forks, args.dsn), args.dsn
            task = await rt.store.submit(
                TaskSubmission(task_id=new_task_id(), query=args.query, source=source, dsn=args.dsn,
                               task_type=args.type, priority=args.priority, provider=args.provider,
                               weights=weights, runs=runs), worker=worker, lease_s=rt.lease_s)
            async with display.running():
                finished = await run_task(rt, task, worker, sinks=(display.sink,), on_interrupt="cancel",
                                          direct_dsn=direct_dsn)
    if finished is None:
        raise KeyboardInterrupt
    if finished.status == "failed" and sandboxed and not await sandbox_answers(settings):
        raise SandboxError(f"{SANDBOX_STOPPED} (task {finished.task_id}: `afs resume {finished.task_id}`)")
    code = print_finished(args, finished.task_id, finished.result, finished.error,
                          finished.bad_input)
    return max(code, _spend_stopped(finished.result, settings.gemini.max_spend_usd))


def _spend_stopped(result: TaskResult | None, cap: float | None) -> int:
    """EXIT_FAILED, said on stderr with what was spent, when the spending cap stopped a model
    call of the task (the report above shows what was measured before it); 0 otherwise."""
    from afs.report import model_spend

    spend = model_spend(result) if result is not None else None
    stopped = {agent: why for agent, why in (spend or {}).get("stopped", {}).items()
               if why.startswith("the spending cap")}
    if not stopped or spend is None:
        return 0
    spent = spend["estimated_cost_usd"]
    say(f"afs optimize: the spending cap{'' if cap is None else f' of {cap:g} USD'} stopped the model "
        f"calls of {', '.join(sorted(stopped))}: "
        + ("cost unknown (a model without a known price)" if spent is None
           else f"{spent:.4f} USD spent (estimated at list prices)")
        + "; the report shows what was measured before it (raise --max-spend to let the agents finish)")
    return EXIT_FAILED


def usd(text: str) -> float:
    """A --max-spend value: US dollars, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected US dollars (0 or more, e.g. 0.50), got {text!r}")
    return value



async def _optimize_remote(args: argparse.Namespace, settings: Settings, runs: int,
                           weights: dict[str, float] | None) -> int:
    """Submit to `afs serve`, follow its events, print the same report."""
    body: dict[str, Any] = {"query": args.query, "priority": args.priority, "type": args.type,
                            "provider": args.provider, "runs": runs, "weights": weights}
    if args.dsn:
        body["dsn"] = args.dsn
    async with ServiceClient(args.server, settings.service_token) as client:
        task = await client.submit(body)
        progress(f"task {task['id']} queued on {args.server}")
        async for event in client.events(task["id"]):
            who = f" {event['agent']}" if event.get("agent") else ""
            progress(f"task {task['id']}: {event['kind']}{who}")
        doc = await client.get(task["id"])
    progress_done()
    result = None if doc.get("result") is None else decode(TaskResult, doc["result"])
    return print_finished(args, task["id"], result, doc["task"].get("error"))




def add_commands(commands: Any) -> None:
    """optimize."""
    opt = add_top(commands, "optimize", cmd_optimize)
    opt.description = ("Route the query to a squad of agents; each forks the database, analyses "
                       "the plan, proposes a change, checks it is safe and measures it with a "
                       "four-query suite. A consensus ranks the measured proposals. Nothing is "
                       "applied to your database.")
    opt.epilog = ("example: afs optimize --query \"SELECT o.id FROM orders o WHERE o.user_id = 4242 "
                  "ORDER BY o.created_at DESC\"   (exit codes: 0 completed or no improvement, "
                  "1 failed, 2 bad input)")
    given = opt.add_mutually_exclusive_group(required=True)
    given.add_argument("--query", metavar="SQL", help="one read-only SELECT; - reads it from standard input")
    given.add_argument("--file", "-f", metavar="FILE",
                       help="read the query from FILE (UTF-8), as psql -f does")
    opt.add_argument("--dsn", metavar="DSN",
                     help="the database (its copy in the sandbox, see `afs sandbox import`; "
                          "with another fork server (AFS_FORK_SERVER_COMMAND), the database "
                          "registered there, and no sandbox); default: AFS_DATABASE_URL or the PG* "
                          "variables, else the sandbox's demo database. "
                          + DSN_PASSWORDS)
    add_libpq_flags(opt)
    opt.add_argument("--priority", choices=get_args(Priority), default="normal",
                     help="high assigns all three agents")
    opt.add_argument("--type", choices=get_args(TaskType), default="query_optimization")
    opt.add_argument("--provider", choices=get_args(Provider), default="auto",
                     help="who thinks: Gemini models, offline strategists, or auto "
                          "(Gemini when credentials are set)")
    opt.add_argument("--weights", metavar="W",
                     help="consensus weights for this task, e.g. performance=0.6,storage=0.2,"
                          "complexity=0.1,risk=0.1 (must sum to 1; default: routing_rules.yaml)")
    opt.add_argument("--runs", type=int,
                     help="measured runs per suite query and side, at most: measuring stops earlier"
                          " once the verdict is certain (default: AFS_RUNS or 5)")

    opt.add_argument("--max-spend", type=usd, metavar="USD",
                     help="the spending cap of this task's model calls, estimated at list prices: no "
                          "call is made once it is reached; the agents it stops are reported, the "
                          "task goes on with what was measured, and the exit code is 1 (default: "
                          "gemini.max_spend_usd or AFS_GEMINI_MAX_SPEND_USD; none)")

    opt.add_argument("--server", metavar="URL",
                     help="submit to `afs serve` at URL (e.g. http://127.0.0.1:8470) instead of "
                          "running here")
