"""Space the sandbox can give back: imported copies, the demo data (`afs sandbox reclaim`).

    found = await reclaimable(admin_dsn, settings.demo_database)   # what there is, and its size
    plan = choose(found, imports=True, names=(), demo=False)       # pure: what goes, what stays, why
    done = await reclaim(admin_dsn, plan.chosen)                   # drop each (checked again first)

A copy is a source database of the fork provider (afs.forks.provider: the database, its fork
template, its spares and, for an import, the role that owns it); reclaiming it is
`LocalForkProvider.drop_source`. Forks are never touched: a copy that a fork in use was made
from (state `ready` or `creating`, not expired) is left out with that reason, checked when the
list is read and again just before it is dropped, so a task running on it keeps its source.
The demo data comes back with `afs sandbox up` (or `reset`); an import with `afs sandbox import`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from afs.db import Connection, open_connection
from afs.errors import InputError
from afs.forks.provider import LocalForkProvider, template_name

MB = 1024 * 1024


@dataclass(frozen=True)
class Copy:
    """A source database in the sandbox and what removing it gives back."""

    name: str
    kind: str  # "import" or "demo"
    origin: str  # where it was copied from (an import: host/database; the demo: its scale)
    size_bytes: int  # the database and its template
    imported_at: str | None  # an import's time (afs.conditions' record), else None
    forks_in_use: tuple[str, ...]  # forks made from it that are not spares: it stays while they live

    def public(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "origin": self.origin,
                "size_mb": round(self.size_bytes / MB, 1), "imported_at": self.imported_at,
                "forks_in_use": list(self.forks_in_use)}


@dataclass(frozen=True)
class Plan:
    chosen: tuple[Copy, ...]  # to remove
    kept: tuple[tuple[Copy, str], ...]  # asked for, but kept: why

    @property
    def size_bytes(self) -> int:
        return sum(c.size_bytes for c in self.chosen)


_SOURCES_SQL = """
SELECT s.name, s.origin, pg_database_size(d.oid), s.copy_state ->> 'imported_at',
       coalesce((SELECT array_agg(f.name ORDER BY f.name) FROM afs.forks f WHERE f.parent = s.name
                 AND f.state <> 'spare' AND f.expires_at > now()), '{}')
FROM afs.sources s JOIN pg_database d ON d.datname = s.name ORDER BY s.name
"""


async def _copies(conn: Connection, demo_database: str) -> list[Copy]:
    found = []
    for name, origin, size, at, forks in await conn.fetchall(_SOURCES_SQL):
        template = await conn.fetchval("SELECT pg_database_size(oid) FROM pg_database WHERE datname = %s",
                                       (template_name(str(name)),))
        found.append(Copy(str(name), "demo" if name == demo_database else "import", str(origin),
                          int(size or 0) + int(template or 0), None if at is None else str(at),
                          tuple(str(f) for f in forks or ())))
    return found


async def reclaimable(admin_dsn: str, demo_database: str) -> list[Copy]:
    """Every copy in the sandbox (imports and the demo database), with its size and its forks."""
    provider = LocalForkProvider(admin_dsn)
    async with open_connection(admin_dsn) as conn:
        await provider.ensure_catalog(conn)
        return await _copies(conn, demo_database)


def choose(found: Sequence[Copy], *, imports: bool, names: Sequence[str], demo: bool) -> Plan:
    """What goes (pure): every import (`imports`), the copies named, the demo data (`demo`);
    a copy with forks in use stays, with the reason. InputError for a name that is no copy."""
    known = {c.name: c for c in found}
    unknown = [n for n in names if n not in known]
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        raise InputError(f"no copy named {', '.join(unknown)} in the sandbox (copies: {listed})")
    wanted = [c for c in found if (imports and c.kind == "import") or c.name in names
              or (demo and c.kind == "demo")]
    chosen = tuple(c for c in wanted if not c.forks_in_use)
    kept = tuple((c, f"{len(c.forks_in_use)} fork(s) made from it are in use ({', '.join(c.forks_in_use)}): "
                     "it stays while they live") for c in wanted if c.forks_in_use)
    return Plan(chosen, kept)


Kept = list[tuple[Copy, str]]


async def reclaim(admin_dsn: str, chosen: Sequence[Copy], demo_database: str) -> tuple[list[Copy], Kept]:
    """Drop each copy (its database, template, spares, import role), unless a fork was made
    from it since the plan was read (checked again, each just before it goes)."""
    provider = LocalForkProvider(admin_dsn)
    removed: list[Copy] = []
    kept: Kept = []
    for copy in chosen:
        async with open_connection(admin_dsn) as conn:
            now = {c.name: c for c in await _copies(conn, demo_database)}.get(copy.name)
        if now is None:
            continue  # gone meanwhile
        if now.forks_in_use:
            kept.append((now, f"a fork was made from it meanwhile ({', '.join(now.forks_in_use)})"))
            continue
        await provider.drop_source(copy.name)
        removed.append(copy)
    return removed, kept
