"""Read-only store queries the monitor needs and the store does not have (no schema change)."""

from __future__ import annotations

from typing import Any

from afs.store import Store
from afs.store.migrations import SCHEMA


async def board(store: Store, limit: int) -> list[dict[str, Any]]:
    """The newest tasks with what the list shows: status, query, winner, measured gain, times."""
    rows = await store.conn.fetchall(
        "SELECT id, status, query, source, provider, priority, created_at, started_at, finished_at, error,"
        " report->'winner'->>'agent', report->'winner'->>'proposal_type',"
        " (report->'winner'->>'improvement_pct')::float8"
        f" FROM {SCHEMA}.tasks ORDER BY created_at DESC, id LIMIT %s", (limit,))
    return [{"id": r[0], "status": r[1], "query": r[2], "source": r[3], "provider": r[4], "priority": r[5],
             "created_at": _iso(r[6]), "started_at": _iso(r[7]), "finished_at": _iso(r[8]), "error": r[9],
             "winner": None if r[10] is None else {"agent": r[10], "proposal_type": r[11]},
             "gain_pct": r[12]} for r in rows]


def _iso(value: Any) -> str | None:
    return None if value is None else str(value.isoformat())


async def task_report(store: Store, task_id: str) -> dict[str, Any] | None:
    """A finished task's report document (afs.report.to_json), as stored; None before."""
    value = await store.conn.fetchval(f"SELECT report FROM {SCHEMA}.tasks WHERE id = %s", (task_id,))
    return None if value is None else dict(value)
