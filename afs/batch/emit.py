"""A batch's chosen changes as a migration a reviewer reads (`afs batch --emit DIR`).

    written = emit_migration(doc, Path("migrations/afs-2026-11-27"), force=False)

What is written, in DIR:

    0001_create_<index>.up.sql     one statement a file: every statement here runs CONCURRENTLY,
    0001_create_<index>.down.sql   so outside a transaction (a tool that wraps each file in
    0002_drop_<index>.up.sql       BEGIN … COMMIT must be told not to); numbered in apply order:
    …                              the new indexes first, then the drops (reads have the new
    SUMMARY.md                     index before an old one goes); down files run in reverse
                                   order

The changes: the batch's chosen set when it was run with --max-storage (`chosen_set`), else
every merged index of the batch and every drop its index review verified. A CREATE INDEX is
read by the safety validator again (refused: left out, said in the summary) and written
CONCURRENTLY under its name (a name is made for an unnamed one, so that its down file can
drop it); its down is DROP INDEX CONCURRENTLY IF EXISTS. A drop's down is the index's
definition, CONCURRENTLY. SUMMARY.md has the measured figures (Markdown for a pull request).

Never half a migration: everything is written in a temporary directory next to DIR, then
renamed into place. DIR must not exist or be empty, unless `force` (then it is replaced).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from afs.batch.budget import Item, candidates
from afs.errors import InputError
from afs.pg.names import quote_ident
from afs.safety import NewIndex, validate_commands, validate_proposal

SUMMARY = "SUMMARY.md"
OUTSIDE = ("-- runs outside a transaction (CONCURRENTLY): one statement, no BEGIN/COMMIT around it\n")


@dataclass(frozen=True)
class Step:
    slug: str
    up: str
    down: str
    item: Item


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:48] or "change"


def _made_name(index: NewIndex) -> str:
    table = index.table.rpartition(".")[2]
    columns = "_".join(_slug(c) for c in index.columns) or "expr"
    return f"{table}_{columns}_afs_idx"[:63]


def step_of(item: Item) -> Step | str:
    """The up and down statements of one change; a reason (str) when it cannot be emitted."""
    if item.kind == "drop":
        name = item.key.split()[-1]
        if not item.rollback:
            return f"{item.key}: no definition recorded to undo it"
        return Step(f"drop_{_slug(name.rpartition('.')[2])}", item.key, item.rollback, item)
    if not validate_proposal((item.key,), "index").is_valid:
        return f"{item.key}: refused by the safety validator"
    commands = validate_commands((item.key,), "index").creates.commands
    if len(commands) != 1 or not isinstance(commands[0], NewIndex):
        return f"{item.key}: not one CREATE INDEX"
    index = commands[0]
    name = (index.name or _made_name(index)).rpartition(".")[2]
    schema = index.table.rpartition(".")[0]
    up = index.on(index.table, name, concurrent=True)
    qualified = f"{quote_ident(schema)}.{quote_ident(name)}" if schema else quote_ident(name)
    return Step(f"create_{_slug(name)}", up, f"DROP INDEX CONCURRENTLY IF EXISTS {qualified}", item)


def changes(doc: Mapping[str, Any]) -> tuple[list[Item], str]:
    """The changes to emit, and where they come from (in words)."""
    chosen = doc.get("chosen_set")
    if chosen:
        by_key = {i.key: i for i in candidates(doc)}
        items = [by_key[i["sql"]] for i in chosen.get("items", ()) if i["sql"] in by_key]
        return items, f"the set chosen under {chosen['budget_mb']:.0f} MB ({chosen['method']})"
    return candidates(doc), "every index the batch's winners need (merged) and every verified drop"


def _ms_day(ms: float) -> str:
    seconds = ms / 1000.0
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


def summary(doc: Mapping[str, Any], steps: Sequence[Step], skipped: Sequence[str], source: str) -> str:
    """The pull request's text (Markdown): what changes, the figures measured, how to apply and undo."""
    period = float(doc.get("period_s") or 0)
    span = f"{period / 3600:.1f} h" if period >= 3600 else f"{period / 60:.0f} min: the figures a day are " \
        "extrapolated from it, let the workload run longer for steadier ones"
    out = [f"# AFS batch {doc.get('id', '?')}: {doc.get('database', '?')}", "",
           f"Measured by AFS in forks of the database's copy ({doc.get('created_at', '?')}; statistics "
           f"window {span}). Changes: {source}.", ""]
    if steps:
        out += ["| # | change | size | reads saved/day | writes/day | net/day |", "|---|---|---|---|---|---|"]
        for n, s in enumerate(steps, 1):
            i = s.item
            writes = ("−" if i.kind == "create" else "+") + _ms_day(i.write_ms_per_day)
            if not i.write_measured:
                writes += " (not measured)"
            out.append(f"| {n} | `{s.up}` | {i.size_mb:+.1f} MB | {_ms_day(i.read_ms_per_day)} | {writes} | "
                       f"{_ms_day(i.net_ms_per_day)} |")
        total = sum(s.item.net_ms_per_day for s in steps)
        out += ["", f"In all: {sum(s.item.size_mb for s in steps):+.1f} MB of storage, "
                    f"{_ms_day(total)} a day saved (the sum of the changes' measurements)."]
    else:
        out.append("No change to apply.")
    measured = (doc.get("chosen_set") or {}).get("measured") or {}
    if measured.get("verdict"):
        out += ["", f"Measured together in one fork: {measured['verdict']}."]
    for s in steps:
        for note in s.item.notes:
            out.append(f"- `{s.item.key}`: {note}")
    if skipped:
        out += ["", "Not emitted:"] + [f"- {why}" for why in skipped]
    left = (doc.get("chosen_set") or {}).get("left_out") or []
    if left:
        out += ["", "Left out by the storage budget:"] + [f"- `{x['sql']}` — {x['why']}" for x in left]
    out += ["", "## Apply", "",
            "Each file holds one statement that runs outside a transaction (CONCURRENTLY: reads and "
            "writes go on). Run the `.up.sql` files in ascending order, e.g. "
            "`for f in $(ls *.up.sql | sort); do psql -v ON_ERROR_STOP=1 -f \"$f\" || break; done`; "
            "undo with the `.down.sql` files in descending order. A failed CREATE INDEX CONCURRENTLY "
            "leaves an invalid index: its down file drops it.", ""]
    return "\n".join(out) + "\n"


def emit_migration(doc: Mapping[str, Any], directory: Path, *, force: bool = False) -> dict[str, Any]:
    """Write the migration into `directory` (whole or not at all); what was written."""
    check_directory(directory, force=force)
    items, source = changes(doc)
    steps: list[Step] = []
    skipped: list[str] = []
    for item in sorted(items, key=lambda i: 0 if i.kind == "create" else 1):
        step = step_of(item)
        (skipped.append(step) if isinstance(step, str) else steps.append(step))
    parent = directory.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=parent))
    files: list[str] = []
    try:
        for n, s in enumerate(steps, 1):
            for side, sql in (("up", s.up), ("down", s.down)):
                name = f"{n:04d}_{s.slug}.{side}.sql"
                (tmp / name).write_text(OUTSIDE + sql.rstrip().rstrip(";") + ";\n")
                files.append(name)
        (tmp / SUMMARY).write_text(summary(doc, steps, skipped, source))
        files.append(SUMMARY)
        _into_place(tmp, directory.resolve())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"directory": str(directory), "files": files, "changes": len(steps), "source": source,
            "not_emitted": skipped}


def check_directory(directory: Path, *, force: bool) -> None:
    """InputError for a DIR that cannot take the migration (before anything is run or written)."""
    if directory.exists() and not directory.is_dir():
        raise InputError(f"--emit {directory}: exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise InputError(f"--emit {directory}: the directory is not empty (--force-emit replaces it)")


def _into_place(tmp: Path, directory: Path) -> None:
    """Rename the finished migration to `directory` (an old one moved aside first, then removed)."""
    old = None
    if directory.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=directory.parent))
        os.rename(directory, old / "previous")
    try:
        os.rename(tmp, directory)
    except BaseException:
        if old is not None:
            os.rename(old / "previous", directory)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
