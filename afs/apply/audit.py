"""The audit log of applies and rollbacks, in the task store (`afs_store.audit`, migrations 200, 700).

Every row says who approved, when, the target (password scrubbed), the SQL, the tier, the
result, how long it took and the SQL that undoes it. Its `kind`: a task's winner ("winner",
with its task id), or a verified index drop ("drop_index": no task, `subject` the index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from afs.apply.resolve import same_database
from afs.errors import scrub
from afs.store import Store

_COLUMNS = ("id, task_id, action, approver, at, target, tier, sql_commands, result, detail, duration_s,"
            " rollback_sql, verification, kind, subject")


@dataclass(frozen=True)
class AuditEntry:
    """What one audit row records: an apply or a rollback (`action`) of a task's winner or of an
    index drop (`kind`, `subject`), who approved it, where (`target`, scrubbed when stored), the
    statements and their undo, and how it ended (`result`, `detail`, `duration_s`)."""

    action: str  # "apply" | "rollback"
    approver: str
    target: str
    tier: str
    sql: tuple[str, ...]
    result: str  # "applied" | "failed" | "refused" | "rolled_back"
    task_id: str | None  # None: an index drop (no task)
    detail: str = ""
    duration_s: float = 0.0
    rollback_sql: tuple[str, ...] = ()
    verification: Mapping[str, Any] | None = None
    kind: str = "winner"  # "winner" | "drop_index"
    subject: str | None = None  # the dropped index (kind "drop_index")


async def record(store: Store, entry: AuditEntry) -> int:
    """Add the entry to the audit log; its row id."""
    row_id: int = await store.conn.fetchval(
        "INSERT INTO afs_store.audit (task_id, action, approver, target, tier, sql_commands, result, detail,"
        " duration_s, rollback_sql, verification, kind, subject)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (entry.task_id, entry.action, entry.approver, scrub(entry.target), entry.tier, Jsonb(list(entry.sql)),
         entry.result, scrub(entry.detail), entry.duration_s, Jsonb(list(entry.rollback_sql)),
         Jsonb(dict(entry.verification or {})), entry.kind, entry.subject))
    return row_id


async def entry(store: Store, row_id: int) -> dict[str, Any] | None:
    """One audit row by its id (None: no such row)."""
    rows = await store.conn.fetchall(f"SELECT {_COLUMNS} FROM afs_store.audit WHERE id = %s", (row_id,))
    return _entry(rows[0]) if rows else None


async def drop_in_place(store: Store, row: dict[str, Any]) -> bool:
    """Whether an index drop's audit row (applied) is in place: no later row of the same index
    on the same target says it was rolled back or applied again."""
    if row.get("kind") != "drop_index" or row["action"] != "apply" or row["result"] != "applied":
        return False
    later = await store.conn.fetchall(
        "SELECT target FROM afs_store.audit WHERE kind = 'drop_index' AND subject = %s AND id > %s"
        " AND result IN ('applied', 'rolled_back')", (row["subject"], row["id"]))
    return not any(same_database(str(r[0]), row["target"]) for r in later)


def _entry(row: Sequence[Any]) -> dict[str, Any]:
    entry = dict(zip([c.strip() for c in _COLUMNS.split(",")], row, strict=True))
    entry["at"] = entry["at"].isoformat()
    return entry


async def entries(store: Store, task_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Audit rows, newest first (of one task, or of all)."""
    where = "WHERE task_id = %s" if task_id else ""
    params: tuple[Any, ...] = (task_id, limit) if task_id else (limit,)
    rows = await store.conn.fetchall(
        f"SELECT {_COLUMNS} FROM afs_store.audit {where} ORDER BY id DESC LIMIT %s", params)
    return [_entry(r) for r in rows]


async def applied(store: Store, task_id: str) -> dict[str, Any] | None:
    """The task's apply that is in place: its last 'applied' row not followed by a rollback."""
    rows = await store.conn.fetchall(
        f"SELECT {_COLUMNS} FROM afs_store.audit WHERE task_id = %s AND result IN ('applied', 'rolled_back')"
        " ORDER BY id DESC LIMIT 1", (task_id,))
    if not rows or rows[0][2] != "apply":
        return None
    return _entry(rows[0])


def render(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no applies or rollbacks recorded yet"
    out = []
    for r in rows:
        what = f"drop {r['subject']}" if r.get("kind") == "drop_index" else f"task {r['task_id']}"
        out.append(f"#{r['id']} {r['at'][:19]} {r['action']:<8} {what} {r['result']:<11} "
                   f"{r['tier']} by {r['approver']} on {r['target']} ({r['duration_s']:.2f} s)")
        out.extend(f"    sql:      {s};" for s in r["sql_commands"])
        out.extend(f"    rollback: {s};" for s in r["rollback_sql"])
        if r["detail"]:
            out.append(f"    {r['detail']}")
        check = (r.get("verification") or {}).get("check")
        if check:  # the last `afs audit --check` (afs.apply.verdict)
            out.append(f"    promise:  {check['verdict']} — {check['reason']}")
    return "\n".join(out)


async def in_place(store: Store, task_id: str | None = None) -> list[dict[str, Any]]:
    """The applies in place (each task's last 'applied' row not followed by a rollback), oldest first
    (a task's winner: an index drop has no task, and no promise to check)."""
    where = "AND task_id = %s" if task_id else ""
    rows = await store.conn.fetchall(
        f"SELECT DISTINCT ON (task_id) {_COLUMNS} FROM afs_store.audit WHERE result IN ('applied',"
        f" 'rolled_back') AND task_id IS NOT NULL {where} ORDER BY task_id, id DESC",
        (task_id,) if task_id else ())
    return sorted((_entry(r) for r in rows if r[2] == "apply"), key=lambda e: e["id"])


async def record_check(store: Store, row_id: int, checkpoint: dict[str, Any], check: dict[str, Any]) -> None:
    """Keep a check of an apply on its row (afs.apply.verdict): the verdict the monitor shows,
    and the counters the next check starts from."""
    await store.conn.execute(
        "UPDATE afs_store.audit SET verification = jsonb_set(verification, '{promise,checkpoint}', %s)"
        " || jsonb_build_object('check', %s::jsonb) WHERE id = %s",
        (Jsonb(checkpoint), Jsonb(check), row_id))
