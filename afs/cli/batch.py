"""`afs batch` (the target's costliest statements in pg_stat_statements, one task each) and
`afs schedule add|list|remove` (batches on a cron schedule, run by `afs serve`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, get_args

from afs.batch.budget import parse_size
from afs.batch.emit import check_directory, emit_migration
from afs.batch.job import BatchOptions, batches, run_batch_here, run_batch_on_server, stored_batch
from afs.batch.report import render_markdown
from afs.batch.schedule import (
    Cron,
    add_schedule,
    check_cron,
    check_zone,
    describe,
    remove_schedule,
    schedules,
)
from afs.cli.commands import DSN_PASSWORDS, add_command, add_top
from afs.cli.optimize import usd
from afs.cli.output import EXIT_FAILED, EXIT_OK, emit, progress, progress_done, say
from afs.cli.shared import open_task_store, sandbox_stop_reported, start_sandbox
from afs.config import SCHEDULE_TIMEZONE, Settings
from afs.errors import ConfigError, InputError
from afs.models import Provider
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer, dsn_for
from afs.service.client import ServiceClient
from afs.store import store_url


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    """`afs batch [options]` runs a batch; `afs batch show ID` prints a stored one."""
    if args.words == ["list"]:
        return await _batch_list(args, settings)
    if args.words:
        if len(args.words) != 2 or args.words[0] != "show":
            raise InputError("usage: afs batch [--dsn DSN] [--top N] … | afs batch show ID | afs batch list")
        return await _batch_show(args, settings, args.words[1])

    options = _batch_options(args, settings)
    options.check()
    if args.emit:  # a directory that cannot take the migration: said before anything runs
        check_directory(Path(args.emit), force=args.force_emit)
    if args.dry_run:  # the spend bound, before anything starts (no sandbox, no target read)
        return _dry_run(args, settings, options)
    if options.max_spend_usd is not None and args.server:
        raise InputError("--max-spend caps the model calls of tasks run here; with --server, `afs serve`'s "
                         "workers run them with their own cap (gemini.max_spend_usd where it runs)")
    if args.dsn is None:  # the target as every command resolves it: AFS_DATABASE_URL, PG*, the file
        args.dsn = settings.target_dsn
    if args.server:
        doc = await _batch_remote(args, settings, options)
    else:
        server = SandboxServer(settings)
        await start_sandbox(server)
        if args.dsn is None:
            await ensure_demo(settings, server, settings.scale, progress)
        async with sandbox_stop_reported(settings):
            doc = await run_batch_here(settings, store_url(settings), dsn=args.dsn, options=options,
                                       progress=progress)
    progress_done()

    after = await _after_batch(args, settings, doc)
    emit(args, doc, render_markdown(doc) + after
         + f"\n(report: {settings.home / 'reports'}/batch-{doc['id']}.md)")
    return _spend_stopped(doc)


def _spend_stopped(doc: dict[str, Any]) -> int:
    """EXIT_FAILED, said on stderr with what was spent, when the batch's spending cap stopped
    model calls (the report shows what was measured before it); EXIT_OK otherwise."""
    spend = doc.get("model_spend") or {}
    if not spend.get("capped"):
        return EXIT_OK
    cost = spend.get("estimated_cost_usd")
    cap = spend.get("cap_usd")
    say(f"afs batch: the spending cap{'' if cap is None else f' of {cap:g} USD'} stopped the model calls of "
        f"{len(spend['capped'])} statement(s): "
        + ("cost unknown (a model without a known price)" if cost is None
           else f"{cost:.4f} USD spent (estimated at list prices)")
        + "; the report shows what was measured before it (raise --max-spend to go further)")
    return EXIT_FAILED


async def _after_batch(args: argparse.Namespace, settings: Settings, doc: dict[str, Any]) -> str:
    """Issue 28: the changes applied on the target checked (afs.apply.verdict: kept in the stored
    report as `applied_changes`), and the migration written with --emit. The text it adds."""
    from afs.apply.verdict import for_batch, render

    target = args.dsn if args.dsn is not None else dsn_for(settings, settings.demo_database)
    async with open_task_store(settings) as store:
        doc["applied_changes"] = await for_batch(store, doc["id"], target)
    text = ("\n## Changes applied earlier: did they keep their promise?\n\n" + render(doc["applied_changes"])
            + "\n") if doc["applied_changes"] else ""
    if args.emit:
        doc["emitted"] = emit_migration(doc, Path(args.emit), force=args.force_emit)
        text += f"\nmigration: {doc['emitted']['changes']} change(s) written to {args.emit}\n"
    return text


def _batch_options(args: argparse.Namespace, settings: Settings) -> Any:
    min_mean_ms = settings.batch_min_mean_ms if args.min_mean_ms is None else args.min_mean_ms
    return BatchOptions(top=args.top, min_calls=args.min_calls, min_mean_ms=min_mean_ms,
                        force=getattr(args, "force", False), provider=args.provider,
                        runs=settings.runs if args.runs is None else args.runs,
                        recent_days=args.recent_days, since=args.since,
                        max_storage_mb=None if getattr(args, "max_storage", None) is None
                        else parse_size(args.max_storage),
                        max_spend_usd=getattr(args, "max_spend", None))


def _dry_run(args: argparse.Namespace, settings: Settings, options: Any) -> int:
    """`afs batch --dry-run`: the most the batch's model calls can cost (afs.brains.gemini.brain.
    spend_bound: every agent of every task, every re-prompt, each answer at its model's output
    cap, at today's list prices), for at most --top statements; nothing runs."""
    from afs.brains.gemini.brain import spend_bound
    from afs.brains.gemini.client import NO_CREDENTIALS, gemini_credentials, today
    from afs.models import AGENTS

    credentials = None if options.provider == "heuristic" else gemini_credentials(settings.environment)
    if credentials is None and options.provider == "gemini":
        raise ConfigError(f"--provider gemini: {NO_CREDENTIALS}")
    day = today()
    models = {agent: settings.gemini.model_of(agent) for agent in AGENTS} if credentials else {}
    per_task = 0.0 if credentials is None else spend_bound(settings.gemini, tuple(AGENTS), day,
                                                           loop_steps=settings.loop_steps, revise=True)
    bound = None if per_task is None else round(per_task * options.top, 4)
    doc = {"dry_run": True, "statements_at_most": options.top, "provider": options.provider,
           "models": models, "priced_on": day, "task_bound_usd": per_task, "bound_usd": bound,
           "max_spend_usd": options.max_spend_usd}
    if credentials is None:
        text = (f"afs batch --dry-run: no model calls (the offline strategists would run: "
                f"{'as asked' if options.provider == 'heuristic' else 'no Gemini credentials'}): 0 USD")
    else:
        text = (f"afs batch --dry-run: at most {options.top} statement(s), each a task of up to "
                f"{len(models)} agents ({', '.join(f'{a} = {m}' for a, m in models.items())})\n"
                + ("spend bound: unknown (a model without a known price)" if bound is None else
                   f"spend bound: {bound:.4f} USD at the list prices of {day} ({per_task:.4f} USD a task;"
                   f" every call, re-prompt and answer at its output cap: a bound, not an estimate)"))
        if options.max_spend_usd is not None:
            text += f"\nspending cap: {options.max_spend_usd:g} USD for the whole batch (--max-spend)"
    emit(args, doc, text + "\nnothing was run")
    return EXIT_OK


async def _batch_remote(args: argparse.Namespace, settings: Settings, options: Any) -> dict[str, Any]:
    """The tasks to `afs serve` at --server; the target read, and the report written, here."""
    async with open_task_store(settings) as store, \
            ServiceClient(args.server, settings.service_token) as client:
        doc: dict[str, Any] = await run_batch_on_server(store, settings, client, dsn=args.dsn,
                                                        options=options, progress=progress)
    return doc


async def _batch_show(args: argparse.Namespace, settings: Settings, batch_id: str) -> int:
    async with open_task_store(settings) as store:
        doc, markdown = await stored_batch(store, batch_id)
    if doc is None:
        emit(args, {"id": batch_id, "status": "running"}, f"batch {batch_id} has not finished")
        return EXIT_FAILED
    text = markdown or ""
    if getattr(args, "emit", None):  # the stored batch's changes as a migration (afs.batch.emit)
        doc["emitted"] = emit_migration(doc, Path(args.emit), force=args.force_emit)
        text += f"\nmigration: {doc['emitted']['changes']} change(s) written to {args.emit}\n"
    emit(args, doc, text)
    return EXIT_OK


async def _batch_list(args: argparse.Namespace, settings: Settings) -> int:
    async with open_task_store(settings) as store:
        found = await batches(store)
    emit(args, found, "\n".join(f"{b['id']}  {b['created_at'][:19]}  {b['origin']}"
                                 + ("" if b["finished_at"] else "  (not finished)") for b in found)
         or "no batches yet")
    return EXIT_OK


def add_batch_command(commands: Any) -> None:
    batch = add_top(commands, "batch", cmd_batch)
    batch.epilog = ("The target needs pg_stat_statements (preloaded, and created in the database). "
                    "Statements' $n parameters are filled from pg_stats. Report: Markdown, or --json; "
                    "also in $AFS_HOME/reports/ and the store. Nothing is applied to the target.")
    batch.add_argument("words", nargs="*", metavar="show ID | list",
                       help="print stored batch ID; list the stored batches, newest first")
    batch.add_argument("--dsn", metavar="DSN",
                       help="the target database (read: pg_stat_statements, pg_stats, EXPLAIN); its copy "
                            "in the sandbox is where tasks run (`afs sandbox import`); default: the demo "
                            "database. " + DSN_PASSWORDS)
    batch.add_argument("--top", type=int, default=10, metavar="N", help="statements to optimize (default 10)")
    batch.add_argument("--min-calls", type=int, default=1, metavar="C",
                       help="only statements called at least C times")
    batch.add_argument("--min-ms", "--min-mean-ms", dest="min_mean_ms", type=float, metavar="M",
                       help="only statements taking at least M ms on average: faster ones (primary-key "
                            "lookups) get no fork, and the report counts them (default: the setting "
                            "batch_min_mean_ms, AFS_BATCH_MIN_MEAN_MS, 1 ms; 0: every statement)")
    batch.add_argument("--force", action="store_true",
                       help="optimize again statements optimized recently with no schema change since")
    batch.add_argument("--recent-days", type=float, default=7.0, metavar="D",
                       help="what 'recently' means for --force (default 7 days)")
    batch.add_argument("--provider", choices=get_args(Provider), default="auto",
                       help="who thinks (as for afs optimize)")
    batch.add_argument("--runs", type=int, help="measured runs per suite query and side (default: AFS_RUNS)")
    batch.add_argument("--since", metavar="WHEN", help=SINCE_HELP)
    batch.add_argument("--max-storage", metavar="SIZE",
                       help="choose one set of changes that fits SIZE (500MB, 2GB, …: what it adds minus "
                            "what its drops free): among the merged indexes and the verified drops, the "
                            "largest net saving a day (reads saved, minus measured write cost, plus the "
                            "drops' savings), by an exact method (every subset up to 20, else a knapsack "
                            "by dynamic programming); then measured together in one fork (chosen_set)")
    batch.add_argument("--emit", metavar="DIR",
                       help="write the changes (the chosen set with --max-storage, else every merged index "
                            "and verified drop) as a migration: numbered .up.sql/.down.sql files, one "
                            "CONCURRENTLY statement each, and SUMMARY.md for a pull request; also with "
                            "`afs batch show ID`. DIR must be empty or new")
    batch.add_argument("--force-emit", action="store_true",
                       help="with --emit: replace a non-empty DIR (--force is taken: it re-optimizes)")
    batch.add_argument("--max-spend", type=usd, metavar="USD",
                       help="one spending cap for the model calls of every task of the batch, estimated"
                            " at list prices: once reached no task calls a model (its agents are"
                            " reported as stopped) and the report says what was spent (default: each"
                            " task's gemini.max_spend_usd)")
    batch.add_argument("--dry-run", action="store_true",
                       help="print the most the batch's model calls can cost (every agent, re-prompt"
                            " and answer at its output cap, for --top statements) and stop: nothing runs")
    batch.add_argument("--server", metavar="URL",
                       help="submit the tasks to `afs serve` at URL (its workers run them, in parallel) "
                            "and wait for them; the target is read and the report written here, so the "
                            "server must use the same task store (AFS_STORE_URL; checked first)")


SINCE_HELP = ("rank by what ran since WHEN: a duration (24h, 7d, 90m, 2w) or an ISO timestamp "
              "(2026-11-22T03:00Z; UTC when no zone). pg_stat_statements keeps only running totals, "
              "so this is the counters now minus those stored by the newest earlier batch at or before "
              "WHEN (every batch stores them); with no such snapshot, or after a statistics reset, the "
              "window is since the reset, and the report says so. Default: since the reset")


# -- schedules: batches run by `afs serve` (afs.batch.schedule) ------------------------------
async def cmd_schedule_add(args: argparse.Namespace, settings: Settings) -> int:
    check_cron(args.cron)  # bad input first: before the store starts
    check_zone(args.tz)
    options = _batch_options(args, settings)
    options.check()
    async with open_task_store(settings) as store:
        added = await add_schedule(store, dsn=args.dsn, when=Cron(args.cron, args.tz), options=options,
                                   origin=f"sandbox/{settings.demo_database}")
        doc = next(d for d in await schedules(store) if d["id"] == added.id)
    emit(args, doc, f"schedule {added.id} added; `afs serve` runs it\n{describe(doc)}")
    return EXIT_OK


async def cmd_schedule_list(args: argparse.Namespace, settings: Settings) -> int:
    async with open_task_store(settings) as store:
        found = await schedules(store)
    emit(args, found, "\n".join(describe(d) for d in found) or "no schedules (`afs schedule add`)")
    return EXIT_OK


async def cmd_schedule_remove(args: argparse.Namespace, settings: Settings) -> int:
    async with open_task_store(settings) as store:
        await remove_schedule(store, args.id)
    emit(args, {"id": args.id, "removed": True}, f"schedule {args.id} removed (its batches stay)")
    return EXIT_OK


def add_schedule_commands(commands: Any) -> None:
    sub = add_command
    schedule = add_top(
        commands, "schedule",
        description="Batches (`afs batch`) run by `afs serve` on a cron schedule. A run still going is "
                    "not started again (also not by another `afs serve` on the same store); runs missed "
                    "while no server was up are run once when one starts.")
    actions = schedule.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub(actions, "add", "store a schedule (the next run is shown)", cmd_schedule_add)
    add.add_argument("--dsn", metavar="DSN",
                     help="the target database, as for `afs batch` (stored as given: prefer a DSN "
                          "without a password, with ~/.pgpass or PGPASSWORD where `afs serve` runs); "
                          "default: the sandbox's demo database. " + DSN_PASSWORDS)
    add.add_argument("--cron", required=True, metavar="EXPR",
                     help='five fields, minute hour day-of-month month day-of-week, e.g. "0 3 * * *" '
                          "(or @daily, @hourly, …)")
    add.add_argument("--tz", default=SCHEDULE_TIMEZONE, metavar="ZONE",
                     help="the IANA time zone the expression is read in, e.g. Europe/Paris (default "
                          f"{SCHEDULE_TIMEZONE}); across a daylight saving change a skipped time runs "
                          "when the clocks jump, a repeated one runs once")
    add.add_argument("--top", type=int, default=10, metavar="N", help="statements to optimize (default 10)")
    add.add_argument("--min-calls", type=int, default=1, metavar="C", help="as for `afs batch`")
    add.add_argument("--min-ms", "--min-mean-ms", dest="min_mean_ms", type=float, metavar="M",
                     help="as for `afs batch` (default: the setting batch_min_mean_ms when added)")
    add.add_argument("--recent-days", type=float, default=7.0, metavar="D",
                     help="a statement optimized within D days, with no schema change since, is not "
                          "run again (default 7)")
    add.add_argument("--provider", choices=get_args(Provider), default="auto",
                     help="who thinks (as for afs optimize)")
    add.add_argument("--runs", type=int, help="measured runs per suite query and side (default: AFS_RUNS)")
    add.add_argument("--max-spend", type=usd, metavar="USD",
                     help="one spending cap for the model calls of each run, as for `afs batch`")
    add.add_argument("--since", metavar="DURATION",
                     help="each run ranks by what ran in the last DURATION (e.g. 24h for a nightly run: "
                          "the counters minus those the previous run stored); default: since the reset")
    sub(actions, "list", "the schedules: next run, last run, its status and batch id", cmd_schedule_list)
    remove = sub(actions, "remove", "delete a schedule (its batches stay in the store)", cmd_schedule_remove)
    remove.add_argument("id", help="the schedule id (see `afs schedule list`)")


def add_commands(commands: Any) -> None:
    """batch; schedule add|list|remove."""
    add_batch_command(commands)
    add_schedule_commands(commands)
