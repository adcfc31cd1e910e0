"""`afs apply` and `afs rollback` end to end: the stored winner, the checks, the target, the audit.

    plan = await load_plan(store, task_id)            # refuses anything but a completed winner
    row = await apply_winner(store, plan, target_dsn, approver="me")
    row = await rollback_task(store, task_id, target_dsn, approver="me")

Approval is the caller's business (a terminal prompt, `--yes`, an API field): these functions
run only what was approved, and record every attempt in the audit log.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import trio

from afs.apply import audit, verdict
from afs.apply.plan import ApplyPlan, plan_winner
from afs.apply.resolve import same_database
from afs.apply.target import Progress, apply_plan, prepare, run_rollback
from afs.errors import AfsError, InputError, scrub
from afs.store import Store


def _quiet(_: str) -> None:
    pass


async def load_plan(store: Store, task_id: str) -> ApplyPlan:
    """The plan for the recorded winner of a completed task (InputError otherwise)."""
    task = await store.get(task_id)
    if task.status != "completed":
        raise InputError(f"task {task_id} is {task.status}: only the winner of a completed task "
                         "can be applied")
    result = await store.result(task_id)
    if result is None:
        raise InputError(f"task {task_id} has no stored result")
    return plan_winner(result)


async def not_applied(store: Store, task_id: str) -> None:
    """InputError when the task's winner is in place already (applied, not rolled back)."""
    previous = await audit.applied(store, task_id)
    if previous is not None:
        raise InputError(f"task {task_id} was applied already (audit #{previous['id']}, "
                         f"{previous['at'][:19]}, on {previous['target']}); `afs rollback {task_id}` first")


async def prepare_apply(store: Store, plan: ApplyPlan, target_dsn: str, approver: str = "-") -> ApplyPlan:
    """Before approval: the plan as it will run on this target (partitions expanded), checked
    against it (not applied already, same tables and columns). A refusal is audited."""
    try:
        await not_applied(store, plan.task_id)
        return await prepare(plan, target_dsn)
    except InputError as exc:
        await audit.record(store, audit.AuditEntry(
            task_id=plan.task_id, action="apply", approver=approver, target=target_dsn, tier=plan.tier,
            sql=tuple(s.sql for s in plan.steps), result="refused", detail=str(exc),
            rollback_sql=plan.rollback))
        raise


async def apply_winner(store: Store, plan: ApplyPlan, target_dsn: str, approver: str,
                       progress: Progress = _quiet) -> dict[str, Any]:
    """Apply an approved T2 plan; every outcome (applied, failed and rolled back, refused) is audited.

    Raises InputError, after recording it, when the plan cannot be applied here: not T2, applied
    already (and not rolled back), the target does not match, another apply is running.
    """
    if not approver.strip():
        raise InputError("an approver is needed (--approver NAME)")
    refused = audit.AuditEntry(task_id=plan.task_id, action="apply", approver=approver, target=target_dsn,
                               tier=plan.tier, sql=tuple(s.sql for s in plan.steps),
                               rollback_sql=plan.rollback, result="refused")
    try:
        if not plan.applicable:
            raise InputError(f"the winner of task {plan.task_id} is {plan.kind} ({plan.tier}): "
                             "nothing to apply")
        await not_applied(store, plan.task_id)
        pre = await verdict.snapshot(target_dsn, plan)  # pg_stat_statements before the build
        outcome = await apply_plan(plan, target_dsn, plan.verify_query, progress)
    except InputError as exc:
        await audit.record(store, replace(refused, detail=str(exc)))
        raise
    except AfsError as exc:  # the target failed (connection, a statement): nothing is left applied
        await audit.record(store, replace(refused, result="failed", detail=str(exc)))
        raise
    except trio.Cancelled:
        with trio.CancelScope(shield=True):
            await audit.record(store, replace(refused, result="failed", detail="interrupted: rolled back"))
        raise
    if outcome.result == "applied":  # what a later `afs audit --check` compares (afs.apply.verdict)
        outcome.verification["promise"] = await verdict.promise_at_apply(target_dsn, plan, pre)
    row_id = await audit.record(store, replace(  # the statements as run on this target
        refused, sql=tuple(outcome.planned), rollback_sql=tuple(outcome.rollback), result=outcome.result,
        detail=outcome.detail, duration_s=outcome.duration_s, verification=outcome.verification))
    return (await audit.entries(store, plan.task_id, limit=1))[0] | {"id": row_id}


async def rollback_task(store: Store, task_id: str, target_dsn: str, approver: str,
                        progress: Progress = _quiet) -> dict[str, Any]:
    """Undo the task's applied winner with the rollback recorded when it was applied."""
    await store.get(task_id)
    previous = await audit.applied(store, task_id)
    if previous is None:
        raise InputError(f"task {task_id} has nothing applied to roll back (see `afs audit`)")
    if not same_database(target_dsn, previous["target"]):
        raise InputError(f"task {task_id} was applied on {previous['target']}, not on "
                         f"{scrub(target_dsn)}: a rollback runs where the apply ran")
    statements = list(previous["rollback_sql"])
    outcome = await run_rollback(statements, target_dsn, progress)
    await audit.record(store, audit.AuditEntry(
        task_id=task_id, action="rollback", approver=approver, target=target_dsn, tier=previous["tier"],
        sql=tuple(outcome.executed or statements), result=outcome.result, detail=outcome.detail,
        duration_s=outcome.duration_s))
    return (await audit.entries(store, task_id, limit=1))[0]
