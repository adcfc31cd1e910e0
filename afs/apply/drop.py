"""A verified index drop applied like a winner: `afs apply --drop-index SCHEMA.NAME`.

    plan = await plan_drop(Verifying(target, forks, source, settings), "public.orders_twin")  # verified now
    row = await apply_drop(store, plan, target_dsn, approver="me")                  # audited
    row = await rollback_drop(store, row["id"], target_dsn, approver="me")          # recreated

`plan_drop` judges that one index on the target right now: it must exist, be an index of a
user's table, never one behind a constraint, unique, the replica identity or a system
catalog's (`afs.batch.indexes.IndexFacts.protected`), and the index review
(`review_indexes`, restricted to it) must find it unused, duplicate or redundant and verify
it in a fork of the target's copy (no read slower without it): the advice "drop". Anything
else is an InputError that says why, before anything is touched.

The statement is the one this path builds, `DROP INDEX CONCURRENTLY "schema"."name"`, and
nothing else runs: agents' proposals never drop anything (afs.safety refuses DROP), and here
`check_drop` parses the statement (one DROP INDEX CONCURRENTLY of one index, no CASCADE) and
resolves its name in the target's catalog, under the apply lock, just before it runs: the
same index (oid) as judged, still unprotected, with the same definition. The rollback is
the index's definition (pg_get_indexdef) built CONCURRENTLY. Every attempt is audited
(`kind` "drop_index", no task, `subject` the index); `rollback_drop` runs the recorded
rollback of an applied drop and checks the index is back and valid.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import trio
from pglast import ast, parse_sql
from pglast.enums import DropBehavior, ObjectType

from afs.apply import audit
from afs.apply.resolve import same_database
from afs.apply.target import Progress, _try_lock, _unlock, run_rollback
from afs.batch.indexes import IndexFacts, Verifying, read_indexes, review_indexes
from afs.db import Connection, open_connection
from afs.errors import AfsError, InputError, UnsafeSqlError, scrub
from afs.pg.names import quote_ident
from afs.store import Store

KIND = "drop_index"
LOCK = ("SHARE UPDATE EXCLUSIVE on the table (CONCURRENTLY: reads and writes continue; it waits "
        "for the transactions that use the index)")


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class DropPlan:
    """One index to drop, as judged and verified on the target."""

    index: str  # "schema"."name", as the catalog names it
    table: str
    oid: int
    definition: str  # pg_get_indexdef
    kind: str  # duplicate, redundant, unused
    reason: str  # the review's, with its verification in the fork
    storage_mb: float
    write_ms_saved_per_day: float | None
    unseen: tuple[str, ...] = ()

    @property
    def sql(self) -> str:
        return f"DROP INDEX CONCURRENTLY {self.index}"

    @property
    def rollback(self) -> str:
        return concurrently(self.definition)

    def public(self) -> dict[str, Any]:
        return {"kind": KIND, "index": self.index, "table": self.table, "tier": "T2", "sql": self.sql,
                "lock": LOCK, "rollback": self.rollback, "why": self.kind, "reason": self.reason,
                "storage_mb": self.storage_mb, "write_ms_saved_per_day": self.write_ms_saved_per_day,
                "unseen": list(self.unseen)}


def concurrently(definition: str) -> str:
    """pg_get_indexdef's CREATE INDEX, built CONCURRENTLY."""
    for head in ("CREATE INDEX ", "CREATE UNIQUE INDEX "):
        if definition.startswith(head):
            return head + "CONCURRENTLY " + definition[len(head):]
    raise InputError(f"not an index definition: {definition}")


def render_drop(plan: DropPlan) -> str:
    per_day = plan.write_ms_saved_per_day
    lines = [f"drop index {plan.index} on {plan.table} ({plan.kind}; T2 DDL: needs a person's approval)",
             f"  why: {plan.reason}",
             f"  frees {plan.storage_mb:.1f} MB" + ("" if per_day is None else
                                                    f"; saves {per_day / 1000:.1f} s of writes a day"),
             f"  sql:      {plan.sql};", f"  lock:     {LOCK}", f"  rollback: {plan.rollback};"]
    lines += [f"  not seen: {u}" for u in plan.unseen]
    return "\n".join(lines)


async def _facts(conn: Connection, oid: int) -> IndexFacts | None:
    return next((ix for ix in await read_indexes(conn) if ix.oid == oid), None)


async def _index_oid(conn: Connection, name: str) -> int | None:
    try:
        oid = await conn.fetchval("SELECT c.oid FROM pg_class c WHERE c.oid = to_regclass(%s)"
                                  " AND c.relkind IN ('i', 'I')", (name,))
    except AfsError as exc:  # not a name (to_regclass refuses its syntax)
        raise InputError(f"--drop-index: {name!r} is not an index name ({str(exc).splitlines()[0]})") from exc
    return None if oid is None else int(oid)


async def eligible(conn: Connection, name: str) -> IndexFacts:
    """The index `name` on the target, when it may be dropped at all (InputError otherwise)."""
    oid = await _index_oid(conn, name)
    if oid is None:
        raise InputError(f"no index {name} in this database (as the connected role's search_path "
                         "resolves it; name it SCHEMA.NAME)")
    facts = await _facts(conn, oid)
    if facts is None:
        raise InputError(f"{name} is not an index of a user's table (a system catalog's, a TOAST "
                         "table's or AFS's store): never dropped")
    if facts.protected:
        raise InputError(f"{facts.qualified} is never dropped: {facts.protected}")
    return facts


async def plan_drop(at: Verifying, name: str, *, min_window_s: float | None = None) -> DropPlan:
    """The drop of `name`, judged on the target (`at.target`) and verified in a fork of
    `at.source`, its copy in the sandbox, now; InputError when the review does not advise
    dropping it."""
    facts = await eligible(at.target, name)
    doc = await review_indexes(at, only=facts.oid, min_window_s=at.settings.unused_index_window_s
                               if min_window_s is None else min_window_s)
    advice = next((a for a in doc["advice"] if a["index"] == facts.qualified), None)
    if advice is None:
        raise InputError(f"{facts.qualified} is not unused, a duplicate nor redundant: the index review "
                         "has no drop advice for it (see `afs indexes`)")
    if advice["verdict"] != "drop":
        raise InputError(f"the index review keeps {facts.qualified}: {advice['reason']}")
    return DropPlan(facts.qualified, facts.table, facts.oid, facts.definition, str(advice["kind"]),
                    str(advice["reason"]), float(advice["storage_mb"]), advice["write_ms_saved_per_day"],
                    tuple(advice["unseen"]))


def dropped_name(sql: str) -> str:
    """The one index `sql` drops, quoted, when it is exactly `DROP INDEX CONCURRENTLY <index>`
    (no CASCADE, one index); UnsafeSqlError otherwise. Pure."""
    try:
        statements = parse_sql(sql)
    except Exception as exc:  # pglast's ParseError
        raise UnsafeSqlError(sql, f"does not parse: {exc}") from exc
    stmt = statements[0].stmt if len(statements) == 1 else None
    if (not isinstance(stmt, ast.DropStmt) or stmt.removeType != ObjectType.OBJECT_INDEX
            or not stmt.concurrent or stmt.behavior == DropBehavior.DROP_CASCADE
            or stmt.objects is None or len(stmt.objects) != 1):
        raise UnsafeSqlError(sql, "only DROP INDEX CONCURRENTLY of one index (no CASCADE) is run "
                                  "by afs apply --drop-index")
    return ".".join(quote_ident(part.sval) for part in stmt.objects[0])


async def check_drop(conn: Connection, plan: DropPlan) -> None:
    """Just before the drop, on the target: the statement drops exactly the index judged (the
    same oid in the target's catalog), still unprotected, with the same definition."""
    name = dropped_name(plan.sql)
    if await _index_oid(conn, name) != plan.oid:
        raise InputError(f"{plan.index} is no longer the index that was verified (dropped or replaced "
                         "since): nothing dropped")
    facts = await eligible(conn, name)
    if facts.definition != plan.definition:
        raise InputError(f"{plan.index} changed since it was verified ({facts.definition}): nothing dropped")


@dataclass
class DropOutcome:
    result: str  # applied | failed
    detail: str
    duration_s: float = 0.0


async def run_drop(plan: DropPlan, target_dsn: str, progress: Progress = _quiet) -> DropOutcome:
    """Drop the index on the target under the apply lock, after `check_drop`; then check it is gone."""
    start = time.perf_counter()
    async with open_connection(target_dsn, statement_timeout_ms=0) as conn:
        await _try_lock(conn)
        try:
            await check_drop(conn, plan)
            progress(f"running: {plan.sql}")
            try:
                await conn.execute(plan.sql)
            except AfsError as exc:  # a failed DROP … CONCURRENTLY may leave the index invalid
                left = await conn.fetchval("SELECT indisvalid FROM pg_index WHERE indexrelid = %s",
                                           (plan.oid,))
                state = ("the index is still there and valid" if left else
                         "the index is gone" if left is None else
                         "the index is left invalid: run the statement again, or the rollback")
                return DropOutcome("failed", f"{plan.sql} failed: {exc}; {state}",
                                   round(time.perf_counter() - start, 3))
            gone = await conn.fetchval("SELECT to_regclass(%s) IS NULL", (plan.index,))
        finally:
            await _unlock(conn)
    detail = (f"dropped {plan.index} (verified: no longer in the catalog); frees about "
              f"{plan.storage_mb:.1f} MB" if gone
              else f"{plan.index} is still in the catalog after {plan.sql}")
    return DropOutcome("applied" if gone else "failed", detail, round(time.perf_counter() - start, 3))


async def apply_drop(store: Store, plan: DropPlan, target_dsn: str, approver: str,
                     progress: Progress = _quiet) -> dict[str, Any]:
    """Drop the approved index; every outcome (applied, failed, refused) is audited."""
    if not approver.strip():
        raise InputError("an approver is needed (--approver NAME)")
    refused = audit.AuditEntry(task_id=None, kind=KIND, subject=plan.index, action="apply", approver=approver,
                               target=target_dsn, tier="T2", sql=(plan.sql,), rollback_sql=(plan.rollback,),
                               result="refused")
    try:
        outcome = await run_drop(plan, target_dsn, progress)
    except InputError as exc:
        await audit.record(store, replace(refused, detail=str(exc)))
        raise
    except AfsError as exc:
        await audit.record(store, replace(refused, result="failed", detail=str(exc)))
        raise
    except trio.Cancelled:
        with trio.CancelScope(shield=True):
            await audit.record(store, replace(refused, result="failed", detail="interrupted"))
        raise
    row_id = await audit.record(store, replace(
        refused, result=outcome.result, detail=outcome.detail, duration_s=outcome.duration_s,
        verification={"definition": plan.definition, "why": plan.kind, "reason": plan.reason}))
    row = await audit.entry(store, row_id)
    assert row is not None
    return row


async def applied_drop(store: Store, row_id: int) -> dict[str, Any]:
    """The audit row of an index drop that is in place (InputError otherwise)."""
    row = await audit.entry(store, row_id)
    if row is None:
        raise InputError(f"no audit row #{row_id} (see `afs audit`)")
    if row["kind"] != KIND:
        raise InputError(f"audit row #{row_id} is a task's winner: `afs rollback {row['task_id']}`")
    if not await audit.drop_in_place(store, row):
        raise InputError(f"audit row #{row_id} is not an index drop in place ({row['action']} "
                         f"{row['result']}, or rolled back since): nothing to roll back")
    return row


async def rollback_drop(store: Store, row_id: int, target_dsn: str, approver: str,
                        progress: Progress = _quiet) -> dict[str, Any]:
    """Recreate the index an applied drop removed (its recorded rollback), then check it is valid."""
    row = await applied_drop(store, row_id)
    if not same_database(target_dsn, row["target"]):
        raise InputError(f"the index was dropped on {row['target']}, not on {scrub(target_dsn)}: a rollback "
                         "runs where the drop ran")
    statements = list(row["rollback_sql"])
    outcome = await run_rollback(statements, target_dsn, progress)
    if outcome.result == "rolled_back":
        async with open_connection(target_dsn) as conn:
            valid = await conn.fetchval("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                                        (row["subject"],))
        if not valid:
            outcome.result = "failed"
            outcome.detail += f"; but {row['subject']} is {'not valid' if valid is False else 'missing'}"
        else:
            outcome.detail += f"; {row['subject']} is back and valid"
    new_id = await audit.record(store, audit.AuditEntry(
        task_id=None, kind=KIND, subject=row["subject"], action="rollback", approver=approver,
        target=target_dsn, tier=row["tier"], sql=tuple(outcome.executed or statements), result=outcome.result,
        detail=outcome.detail, duration_s=outcome.duration_s))
    entry = await audit.entry(store, new_id)
    assert entry is not None
    return entry
