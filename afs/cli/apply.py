"""`afs apply`, `afs rollback`, `afs audit`: a task's winner applied to the database after
approval (at the terminal, or --yes and --approver from a script), undone with its recorded
rollback, and the audit log of both (afs.apply). `afs apply --drop-index SCHEMA.NAME` drops an
index the index review verifies now (afs.apply.drop), with the same approval and audit;
`afs rollback --audit ID` recreates it.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from dataclasses import replace
from typing import Any

import trio

from afs.apply import apply_winner, load_plan, render_plan, rollback_task
from afs.apply import audit as apply_audit
from afs.apply.resolve import apply_target, rollback_target
from afs.apply.run import prepare_apply
from afs.cli.commands import DSN_PASSWORDS, add_top
from afs.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, emit, progress, progress_done
from afs.cli.shared import open_task_store
from afs.config import Settings
from afs.errors import InputError, scrub


async def _apply_target(args: argparse.Namespace, settings: Settings, store: Any, task_id: str) -> str:
    """--dsn, else the task's own database (its DSN resolved), else its database in the sandbox."""
    task = await store.get(task_id)
    return apply_target(settings, dsn=args.dsn, task_dsn=task.dsn, source=task.source)


async def _approve(args: argparse.Namespace, question: str) -> str | None:
    """The approver's name once approved; None when the person says no. No terminal, no --yes: exit 2."""
    approver = args.approver or getpass.getuser()
    if args.yes:
        return str(approver)
    if not sys.stdin.isatty():
        raise InputError("approval needed and there is no terminal to ask: pass --yes "
                         "(and --approver NAME) to approve from a script")
    print(f"{question} [y/N] ", end="", flush=True)
    answer = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return str(approver) if answer.strip().lower() in ("y", "yes") else None


def _one_of(args: argparse.Namespace, option: str, value: object) -> None:
    if bool(args.task) == bool(value):
        raise InputError(f"give a task id or {option}, one of the two")


async def cmd_apply(args: argparse.Namespace, settings: Settings) -> int:
    """Show the winner's plan, ask for approval, apply it on the target and verify it."""
    _one_of(args, "--drop-index SCHEMA.NAME", args.drop_index)
    if args.drop_index:
        return await _apply_drop(args, settings)
    async with open_task_store(settings) as store:
        plan = await load_plan(store, args.task)
        target = await _apply_target(args, settings, store, args.task)
        if plan.applicable:  # the exact statements on this target (partitions), checked against it
            plan = await prepare_apply(store, plan, target, args.approver or "-")
        if not args.json:
            print(render_plan(plan))
            print(f"target: {scrub(target)}")
        if plan.tier == "T3":
            emit(args, {"plan": plan.public(), "applied": False},
                 f"not applied: {plan.kind} is never applied by afs apply")
            return EXIT_OK if plan.kind == "partitioning" else EXIT_USAGE
        if not plan.applicable:
            emit(args, {"plan": plan.public(), "applied": False},
                 "nothing applied: nothing to change on the database")
            return EXIT_OK
        approver = await _approve(args, f"apply {len(plan.steps)} statement(s) to {scrub(target)}?")
        if approver is None:
            await apply_audit.record(store, apply_audit.AuditEntry(
                task_id=plan.task_id, action="apply", approver=args.approver or "-", target=target,
                tier=plan.tier, sql=tuple(s.sql for s in plan.steps), result="refused",
                detail="not approved at the terminal", rollback_sql=plan.rollback))
            emit(args, {"plan": plan.public(), "applied": False}, "not applied: not approved")
            return EXIT_FAILED
        row = await apply_winner(store, plan, target, approver, progress)
    progress_done()
    emit(args, {"plan": plan.public(), "applied": row["result"] == "applied", "audit": row},
         f"{row['result']}: {row['detail']} ({row['duration_s']:.2f} s; audit #{row['id']})")
    return EXIT_OK if row["result"] == "applied" else EXIT_FAILED


async def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    if args.limit < 1:
        raise InputError(f"--limit must be at least 1, got {args.limit}")
    if getattr(args, "check", False):
        return await _audit_check(args, settings)
    async with open_task_store(settings) as store:
        rows = await apply_audit.entries(store, args.task, args.limit)
    emit(args, rows, apply_audit.render(rows))
    return EXIT_OK


async def _audit_check(args: argparse.Namespace, settings: Settings) -> int:
    """`afs audit --check`: each change in place against its target's pg_stat_statements now
    (afs.apply.verdict); exit 1 when one is a regression."""
    from afs.apply.resolve import same_database
    from afs.apply.verdict import check_applied, render

    async with open_task_store(settings) as store:
        async def target_of(row: Any) -> str | None:
            if args.dsn and not same_database(args.dsn, row["target"]):
                return None  # --dsn: only the changes applied on that database
            task = await store.get(row["task_id"])
            return rollback_target(settings, recorded=row["target"], dsn=args.dsn, source=task.source)

        verdicts = await check_applied(store, target_of, args.task)
    emit(args, {"verdicts": verdicts}, render(verdicts))
    return EXIT_FAILED if any(v["verdict"] == "regression" for v in verdicts) else EXIT_OK


async def _apply_drop(args: argparse.Namespace, settings: Settings) -> int:
    """`afs apply --drop-index`: the index judged and verified on the target now, shown, approved,
    dropped CONCURRENTLY and audited (afs.apply.drop)."""
    from afs.apply.drop import apply_drop, plan_drop, render_drop
    from afs.batch.indexes import Verifying, sandbox_copy
    from afs.cli.shared import sandbox_stop_reported, start_sandbox
    from afs.db import open_connection
    from afs.sandbox.forks import open_forks
    from afs.sandbox.importer import sandbox_source
    from afs.sandbox.server import SandboxServer, dsn_for

    dsn = args.dsn if args.dsn is not None else settings.target_dsn
    target = dsn if dsn is not None else dsn_for(settings, settings.demo_database)
    refused = apply_audit.AuditEntry(task_id=None, kind="drop_index", subject=args.drop_index, action="apply",
                                     approver=args.approver or "-", target=target, tier="T2",
                                     sql=(f"DROP INDEX CONCURRENTLY {args.drop_index}",), result="refused")
    await start_sandbox(SandboxServer(settings))
    async with open_task_store(settings) as store:
        async with sandbox_stop_reported(settings), open_forks(settings) as forks:
            source = await sandbox_copy(forks, settings, dsn) or await sandbox_source(
                forks, settings.demo_database, dsn)  # none: the usual message (import it first)
            async with open_connection(target) as conn:
                try:  # here: an error that crosses the fork client's nursery comes out in a group
                    at = Verifying(conn, forks, source, settings, progress)
                    plan = await plan_drop(at, args.drop_index)
                except InputError as exc:  # refused: audited, nothing touched
                    await apply_audit.record(store, replace(refused, detail=str(exc)))
                    raise
        progress_done()
        if not args.json:
            print(render_drop(plan))
            print(f"target: {scrub(target)}")
        approver = await _approve(args, f"drop index {plan.index} on {scrub(target)}?")
        if approver is None:
            await apply_audit.record(store, replace(
                refused, detail="not approved at the terminal", subject=plan.index, sql=(plan.sql,),
                rollback_sql=(plan.rollback,)))
            emit(args, {"plan": plan.public(), "applied": False}, "not applied: not approved")
            return EXIT_FAILED
        row = await apply_drop(store, plan, target, approver, progress)
    progress_done()
    emit(args, {"plan": plan.public(), "applied": row["result"] == "applied", "audit": row},
         f"{row['result']}: {row['detail']} ({row['duration_s']:.2f} s; audit #{row['id']}; "
         f"undo: afs rollback --audit {row['id']})")
    return EXIT_OK if row["result"] == "applied" else EXIT_FAILED


async def _rollback_drop(args: argparse.Namespace, settings: Settings) -> int:
    """`afs rollback --audit ID`: recreate the index an audited drop removed."""
    from afs.apply.drop import applied_drop, rollback_drop

    async with open_task_store(settings) as store:
        row = await applied_drop(store, args.audit)
        target = rollback_target(settings, recorded=row["target"], dsn=args.dsn, source=None)
        statements = list(row["rollback_sql"])
        if not args.json:
            print("\n".join(f"rollback: {sql};" for sql in statements))
        approver = await _approve(args, f"recreate index {row['subject']} on {scrub(target)}?")
        if approver is None:
            emit(args, {"rolled_back": False}, "not rolled back: not approved")
            return EXIT_FAILED
        done = await rollback_drop(store, args.audit, target, approver,
                                   lambda message: progress("recreating the index"))
    progress_done()
    emit(args, done, f"{done['result']}: {done['detail']} ({done['duration_s']:.2f} s; audit #{done['id']})")
    return EXIT_OK if done["result"] == "rolled_back" else EXIT_FAILED


async def cmd_rollback(args: argparse.Namespace, settings: Settings) -> int:
    _one_of(args, "--audit ID", args.audit is not None)
    if args.audit is not None:
        return await _rollback_drop(args, settings)
    async with open_task_store(settings) as store:
        previous = await apply_audit.applied(store, args.task)
        if previous is None:
            await store.get(args.task)  # an unknown task says so
            raise InputError(f"task {args.task} has nothing applied to roll back (see `afs audit`)")
        task = await store.get(args.task)
        target = rollback_target(settings, recorded=previous["target"], dsn=args.dsn, source=task.source)
        statements = list(previous["rollback_sql"])
        if not args.json:  # said once, here: the progress and the result do not repeat them
            print("\n".join(f"rollback: {sql};" for sql in statements))
        approver = await _approve(args, f"roll back task {args.task} on {scrub(target)}?")
        if approver is None:
            emit(args, {"rolled_back": False}, "not rolled back: not approved")
            return EXIT_FAILED
        row = await rollback_task(store, args.task, target, approver,
                                  lambda message: progress(f"rolling back ({len(statements)} statement(s))"))
    progress_done()
    done = (f"{len(statements)} statement(s) above run" if row["result"] == "rolled_back"
            else row["detail"])  # a failure names the statement that failed, and why
    emit(args, row, f"{row['result']}: {done} ({row['duration_s']:.2f} s; audit #{row['id']})")
    return EXIT_OK if row["result"] == "rolled_back" else EXIT_FAILED


def add_commands(commands: Any) -> None:
    """apply, audit, rollback."""
    apply = add_top(commands, "apply", cmd_apply)
    apply.description = (
        "Show the winner's exact SQL, its tier, the lock it takes, the build time and storage measured in "
        "the fork; after approval build it (indexes CONCURRENTLY, one at a time, one apply per database), "
        "verify it (valid, used by the query's plan, measured read-only) and roll it back by itself if "
        "that fails. Rewrites, settings and partitioning are printed as advice, never applied.")
    apply.epilog = "example: afs apply 3f2a9c1d --yes --approver alice; afs apply --drop-index "\
                   "public.t_b_twin --dsn DSN   (exit codes: 0 applied, 1 failed "\
                   "and rolled back or not approved, 2 refused or no terminal without --yes)"
    rollback = add_top(commands, "rollback", cmd_rollback)
    for command, target in ((apply, "the target database (default: the task's database, its password from "
                                     "AFS_DATABASE_URL, else its sandbox database)"),
                            (rollback, "the database the winner was applied on, with its password (default: "
                                       "the audit row's database, resolved against AFS_DATABASE_URL and the "
                                       "sandbox; exit 2 when it cannot be)")):
        command.add_argument("task", nargs="?", help="the task id (see `afs history`)")
        command.add_argument("--dsn", metavar="DSN", help=f"{target}. {DSN_PASSWORDS}")
        command.add_argument("--yes", action="store_true", help="approve without asking (scripts)")
        command.add_argument("--approver", metavar="NAME", help="who approves (default: the OS user)")
    apply.add_argument("--drop-index", metavar="SCHEMA.NAME",
                       help="instead of a task's winner: drop this index, when the index review (`afs "
                            "indexes`) judges it unused, a duplicate or redundant on the target now and "
                            "verifies it in a fork of the target's copy (no read slower without it). "
                            "Never an index behind a constraint, unique, the replica identity or a system "
                            "catalog's. Runs DROP INDEX CONCURRENTLY after approval, audited; its rollback "
                            "is the index's definition (`afs rollback --audit ID`). --dsn: the target "
                            "(default: the configured target, else the demo database)")
    rollback.add_argument("--audit", metavar="ID", type=int,
                          help="instead of a task: undo the index drop of this audit row (`afs apply "
                               "--drop-index`): the index built again CONCURRENTLY from its definition")
    aud = add_top(commands, "audit", cmd_audit)
    aud.add_argument("--task", help="only this task")
    aud.add_argument("--limit", type=int, default=50, help="how many (default 50)")
    aud.add_argument("--check", action="store_true",
                     help="did each change in place keep its promise? Its statements in the target's "
                          "pg_stat_statements since the apply (or the last check) against before it: a "
                          "regression (slower beyond the noise, Welch test) is flagged with its rollback "
                          "(exit 1)")
    aud.add_argument("--dsn", metavar="DSN", help="with --check: only the changes applied on this database, "
                                                  f"read with this DSN. {DSN_PASSWORDS}")


