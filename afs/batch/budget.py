"""One set of changes under a storage budget (`afs batch --max-storage SIZE`), chosen exactly,
then measured together in one fork.

    items = candidates(doc)                          # the batch's merged indexes, its verified drops
    chosen = choose(items, parse_size("2GB"))        # pure: the largest net saving that fits
    doc["chosen_set"] = await measure_set(Verifying(target, forks, source, settings), chosen, counters)

An item is a change with a storage size and a measured net saving per day:

    create  a merged index of the batch (afs.batch.report.merge_indexes): the read time its
            statements' winners saved per day (their tasks' measured gain over the query
            family × the statements' time per day), minus the write cost per day measured by
            replaying the table's writes with and without it (`write_cost`, when measured);
            its size is what the fork's build added
    drop    an index the review verified may go (afs.batch.indexes, verdict "drop"): no read
            slower without it in the fork; it saves the writes' time it cost, and frees its size

The set fits when what it adds minus what its drops free is at most the budget. The
selection is exact: for at most EXHAUSTIVE_MAX items every subset is searched (branch and
bound: a subset over the budget prunes its supersets, and one whose best completion cannot
beat the incumbent is cut; both keep it exact); above that a 0/1 knapsack by dynamic
programming over sizes rounded UP to a granularity (so the set chosen always fits; exact
for the rounded sizes), at least GRANULARITY_MB and fine enough for about MAX_CELLS cells. A
drop frees storage (a negative size): it is taken first and its "not taking it" becomes the
item searched (the usual exact transformation). Ties: the smaller set in storage, then fewer
items.

The set is then measured together (indexes interact: the planner may prefer one over
another): in one fork, every chosen index built, every chosen drop dropped on both sides,
each statement of the tables involved replayed (afs.batch.replay: filled, writes rolled
back) with the new indexes and without them; the total is Σ (time without − time with) ×
calls per day over the statements, plus the chosen drops' own measured write savings
(their indexes are gone on both sides of this measurement), set against the sum of the
parts, with what explains a difference.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from afs.batch.indexes import Verifying
from afs.batch.replay import Replayed, per_day, replay, table_workload
from afs.batch.statements import BatchTarget, Counters
from afs.bench import StopRule
from afs.config import Settings
from afs.db import open_connection
from afs.errors import AfsError, InputError
from afs.pg.names import quote_qualified

EXHAUSTIVE_MAX = 20  # items searched exhaustively (every subset); above: the dynamic programme
GRANULARITY_MB = 0.1  # the dynamic programme's size step, at least
MAX_CELLS = 200_000  # and at most this many steps up to the budget
Kind = Literal["create", "drop"]
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|m|mb|g|gb|t|tb)?\s*$", re.IGNORECASE)
_UNITS_MB = {"b": 1 / 1048576, "k": 1 / 1024, "kb": 1 / 1024, "m": 1.0, "mb": 1.0, "g": 1024.0, "gb": 1024.0,
             "t": 1048576.0, "tb": 1048576.0}


def parse_size(text: str) -> float:
    """`500MB`, `2GB`, `1.5 G`, `750kB`, `1TB` (1024-based, as PostgreSQL counts) in MB;
    a bare number is MB. InputError for anything else, or a negative size."""
    match = _SIZE.match(text)
    if match is None:
        raise InputError(f"--max-storage: expected a size like 500MB, 2GB or 1.5TB, got {text!r}")
    return float(match.group(1)) * _UNITS_MB[(match.group(2) or "mb").lower()]


@dataclass(frozen=True)
class Item:
    """A change the set may hold: its storage (MB; a drop's is negative) and savings per day (ms)."""

    key: str  # the statement: CREATE INDEX … (as the winner wrote it) or DROP INDEX CONCURRENTLY …
    kind: Kind
    table: str
    size_mb: float
    read_ms_per_day: float  # read time saved a day
    write_ms_per_day: float  # create: write time it costs a day; drop: write time saved a day
    statements: tuple[int, ...] = ()
    rollback: str = ""  # drop: the index's definition (CONCURRENTLY)
    write_measured: bool = False
    notes: tuple[str, ...] = ()
    rewrite: tuple[int, ...] = ()  # statements whose saving needs the query rewritten (the report's)

    @property
    def net_ms_per_day(self) -> float:
        if self.kind == "drop":
            return self.read_ms_per_day + self.write_ms_per_day
        return self.read_ms_per_day - self.write_ms_per_day

    def public(self) -> dict[str, Any]:
        return {"sql": self.key, "kind": self.kind, "table": self.table, "size_mb": round(self.size_mb, 2),
                "read_ms_saved_per_day": round(self.read_ms_per_day, 1),
                ("write_ms_cost_per_day" if self.kind == "create" else "write_ms_saved_per_day"):
                    round(self.write_ms_per_day, 1),
                "write_measured": self.write_measured, "net_ms_per_day": round(self.net_ms_per_day, 1),
                "statements": list(self.statements), "rollback": self.rollback or None,
                "notes": list(self.notes)}


def _write_cost_of(doc: Mapping[str, Any], index: Mapping[str, Any]) -> tuple[float, bool, str | None]:
    """A merged index's measured write cost per day (the batch's `write_cost` of it, or of a winner
    whose index it is); (0, False, why) when none was measured."""
    costs = [index.get("write_cost")]
    sqls = {index["sql"], *index.get("replaces", ())}
    for e in doc.get("statements", ()):
        if set((e.get("winner") or {}).get("sql_commands", ())) & sqls:
            costs.append(e.get("write_cost"))
    for cost in costs:
        if isinstance(cost, Mapping) and cost.get("ms_per_day") is not None:
            return max(0.0, float(cost["ms_per_day"])), True, None
    return 0.0, False, "write cost not measured: counted as 0 (no write statement replayed, or no window)"


def _drop_advice(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    review = doc.get("index_review") or {}
    advice = review.get("advice") if isinstance(review, Mapping) else None
    return [a for a in (advice or doc.get("drops") or ()) if a.get("verdict") == "drop"]


def candidates(doc: Mapping[str, Any]) -> list[Item]:
    """The batch's merged indexes and verified drops as items (pure)."""
    items: list[Item] = []
    for index in doc.get("indexes", ()):
        cost, measured, note = _write_cost_of(doc, index)
        notes = [note] if note else []
        rewrite = [int(q) for q in index.get("needs_rewrite") or ()]
        if rewrite:
            notes.append(f"needs an application change: for {', '.join(str(q) for q in rewrite)} the read "
                         "saving comes with the query's rewrite, not from this index alone")
        items.append(Item(index["sql"], "create", str(index["table"]), float(index.get("size_mb") or 0.0),
                          float(index.get("saved_ms_per_day") or 0.0), cost,
                          tuple(int(q) for q in index.get("statements", ())), write_measured=measured,
                          notes=tuple(notes), rewrite=tuple(rewrite)))
    for advice in _drop_advice(doc):
        saved = advice.get("write_ms_saved_per_day")
        items.append(Item(str(advice["sql"]).rstrip(";"), "drop", str(advice["table"]),
                          -float(advice.get("storage_mb") or 0.0), 0.0, max(0.0, float(saved or 0.0)),
                          rollback=str(advice.get("rollback") or "").rstrip(";"),
                          write_measured=saved is not None,
                          notes=(f"{advice.get('kind')}: {advice.get('reason')}",)))
    return items


@dataclass(frozen=True)
class Choice:
    budget_mb: float
    method: str  # in words: which exact method, and its granularity
    chosen: tuple[Item, ...]
    left_out: tuple[tuple[Item, str], ...]
    granularity_mb: float | None = None  # the dynamic programme's size step (None: exhaustive)

    @property
    def storage_mb(self) -> float:
        return sum(i.size_mb for i in self.chosen)

    @property
    def net_ms_per_day(self) -> float:
        return sum(i.net_ms_per_day for i in self.chosen)

    def public(self) -> dict[str, Any]:
        return {"budget_mb": round(self.budget_mb, 2), "method": self.method,
                "granularity_mb": self.granularity_mb,
                "items": [i.public() for i in self.chosen], "storage_mb": round(self.storage_mb, 2),
                "sum_of_parts_ms_per_day": round(self.net_ms_per_day, 1),
                "left_out": [{"sql": i.key, "kind": i.kind, "size_mb": round(i.size_mb, 2),
                              "net_ms_per_day": round(i.net_ms_per_day, 1), "why": why}
                             for i, why in self.left_out]}


@dataclass(frozen=True)
class _Option:
    """What the search picks or not: an item, or (a drop, taken first) not taking it."""

    item: Item
    weight: float
    value: float
    undo: bool = False


def _exhaustive(options: Sequence[_Option], capacity: float) -> tuple[float, float, list[int]]:
    """Every subset (branch and bound), the best by (value, −weight, −count)."""
    order = sorted(range(len(options)), key=lambda n: -options[n].value)
    suffix = [0.0] * (len(order) + 1)
    for n in range(len(order) - 1, -1, -1):
        suffix[n] = suffix[n + 1] + max(0.0, options[order[n]].value)
    best: list[Any] = [(0.0, 0.0, 0), []]
    eps = 1e-9

    def rank(value: float, weight: float, count: int) -> tuple[float, float, int]:
        return (round(value, 6), -round(weight, 6), -count)

    def go(n: int, value: float, weight: float, taken: list[int]) -> None:
        if rank(value, weight, len(taken)) > best[0]:
            best[0], best[1] = rank(value, weight, len(taken)), list(taken)
        if n == len(order) or value + suffix[n] + eps < best[0][0]:
            return
        option = options[order[n]]
        if weight + option.weight <= capacity + eps:
            taken.append(order[n])
            go(n + 1, value + option.value, weight + option.weight, taken)
            taken.pop()
        go(n + 1, value, weight, taken)

    go(0, 0.0, 0.0, [])
    chosen = sorted(best[1])
    return sum(options[n].value for n in chosen), sum(options[n].weight for n in chosen), chosen


def _dynamic(options: Sequence[_Option], capacity: float, step: float) -> list[int]:
    """0/1 knapsack over weights rounded up to `step`: the best value per used capacity."""
    cells = math.floor(capacity / step + 1e-9)
    weights = [math.ceil(o.weight / step - 1e-9) for o in options]
    best = [0.0] * (cells + 1)
    keep = [bytearray(cells + 1) for _ in options]
    for n, option in enumerate(options):
        w = weights[n]
        if w > cells or option.value <= 0:
            continue
        for c in range(cells, w - 1, -1):
            if best[c - w] + option.value > best[c] + 1e-9:
                best[c] = best[c - w] + option.value
                keep[n][c] = 1
    c = max(range(cells + 1), key=lambda k: (round(best[k], 6), -k))
    chosen = []
    for n in range(len(options) - 1, -1, -1):
        if keep[n][c]:
            chosen.append(n)
            c -= weights[n]
    return sorted(chosen)


def choose(items: Sequence[Item], budget_mb: float) -> Choice:
    """The set with the largest net saving a day whose storage fits `budget_mb` (exact)."""
    if budget_mb < 0:
        raise InputError(f"--max-storage must not be negative, got {budget_mb} MB")
    base: list[Item] = []
    capacity = budget_mb
    options: list[_Option] = []
    for item in items:
        if item.size_mb < 0:  # frees storage: taken first; not taking it is what is searched
            base.append(item)
            capacity -= item.size_mb
            options.append(_Option(item, -item.size_mb, -item.net_ms_per_day, undo=True))
        else:
            options.append(_Option(item, item.size_mb, item.net_ms_per_day))
    useful = [o for o in options if o.value > 0]
    if len(useful) <= EXHAUSTIVE_MAX:
        _, _, picked = _exhaustive(useful, capacity)
        method = (f"exhaustive search over all {2 ** len(useful)} subsets of the {len(useful)} item(s) "
                  "that could add to the saving (branch and bound; exact)")
        step = None
    else:
        step = max(GRANULARITY_MB, capacity / MAX_CELLS)
        picked = _dynamic(useful, capacity, step)
        method = (f"0/1 knapsack by dynamic programming over sizes rounded up to {step:.3g} MB "
                  f"({len(useful)} items; exact for the rounded sizes)")
    flips = {id(useful[n].item) for n in picked if useful[n].undo}
    chosen = [useful[n].item for n in picked if not useful[n].undo]
    chosen += [i for i in base if id(i) not in flips]
    left: list[tuple[Item, str]] = []
    used = sum(i.size_mb for i in chosen)
    for item in items:
        if item in chosen:
            continue
        if item.kind == "drop":
            why = (f"costs time (net {item.net_ms_per_day:.1f} ms a day): the storage it frees is not "
                   "needed")
        elif item.net_ms_per_day <= 0:
            why = (f"saves nothing a day: reads {item.read_ms_per_day:.1f} ms saved, writes "
                   f"{item.write_ms_per_day:.1f} ms cost")
        elif item.size_mb > capacity + 1e-9:
            why = (f"{item.size_mb:.1f} MB alone is more than the budget allows ({capacity:.1f} MB with "
                   "the drops)")
        else:
            why = (f"does not fit with the chosen set: {used:.1f} + {item.size_mb:.1f} MB > "
                   f"{budget_mb:.1f} MB, and the set without it saves more")
        left.append((item, why))
    order = {id(i): n for n, i in enumerate(items)}
    return Choice(budget_mb, method, tuple(sorted(chosen, key=lambda i: order[id(i)])), tuple(left), step)


# -- measured together, in one fork ---------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    total_ms_per_day: float | None  # None: nothing could be replayed (no window, no statement)
    replayed: tuple[Replayed, ...] = ()
    drops_ms_per_day: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)


def measured_total(replayed: Sequence[Replayed], window_s: float | None,
                   drops_ms_per_day: float) -> float | None:
    """Σ (without − with) × calls a day over the statements timed, plus the drops' savings (pure)."""
    timed = [r for r in replayed if r.with_index is not None and r.without_index is not None]
    if window_s is None and timed:
        return None
    total = sum(r.delta_ms * (per_day(r.statement.calls, window_s) or 0.0) for r in timed)
    return total + drops_ms_per_day


_INDEXES_OF = ("SELECT i.indexrelid, n.nspname || '.' || c.relname FROM pg_index i JOIN pg_class c"
               " ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
               " WHERE i.indrelid = to_regclass(%s)")


async def measure_set(at: Verifying, choice: Choice, counters: Counters) -> dict[str, Any]:
    """`choice` measured together in one fork of `at.source`; the chosen set's JSON with it."""
    target, forks, source, settings, progress = at.target, at.forks, at.source, at.settings, at.progress
    doc = choice.public()
    creates = [i for i in choice.chosen if i.kind == "create"]
    drops = [i for i in choice.chosen if i.kind == "drop"]
    drops_saved = sum(i.write_ms_per_day for i in drops)
    if not choice.chosen:
        doc["measured"] = {"total_ms_per_day": 0.0, "statements": [], "note": "nothing chosen"}
        return doc
    tables = sorted({i.table for i in choice.chosen})
    workloads = await table_workload(target, counters, tables)
    statements, seen = [], set()
    for work in workloads.values():
        for s in work.statements:
            if (s.queryid, s.query) not in seen:
                seen.add((s.queryid, s.query))
                statements.append(s)
    window = next((w.window_s for w in workloads.values()), None)
    not_replayed = [n for w in workloads.values() for n in w.not_replayed]
    rule = StopRule.of(settings.measuring)
    notes: list[str] = []
    async with forks.open_fork(source) as fork, open_connection(
            fork.dsn, settings.measuring.statement_timeout_ms) as conn:
        built: list[str] = []
        for item in creates:
            before = {r[0] for r in await conn.fetchall(_INDEXES_OF, (item.table,))}
            progress(f"the chosen set: building {item.key} in fork {fork.name}")
            await conn.execute(item.key)
            after = await conn.fetchall(_INDEXES_OF, (item.table,))
            built += [str(r[1]) for r in after if r[0] not in before]
        gone = []
        for item in drops:
            name = item.key.split()[-1]
            found = await conn.fetchval(  # schema.name unquoted, as afs.batch.replay takes it
                "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)", (name,))
            if found is None:
                notes.append(f"{name} is not in the fork's copy: not dropped there")
            else:
                gone.append(str(found))
        progress(f"the chosen set: {len(statements)} statement(s) replayed with and without "
                 f"{len(built)} new index(es) in fork {fork.name}")
        replayed = await replay(conn, statements, tuple(built), rule, base=tuple(gone)) if built else []
        for name in built:
            await conn.execute(f"DROP INDEX IF EXISTS {quote_qualified(name)}")
    total = measured_total(replayed, window, drops_saved)
    parts = choice.net_ms_per_day
    if total is None:
        verdict = "not measured: pg_stat_statements does not say when it was reset (no calls a day)"
    elif total + 1e-6 >= parts:
        verdict = f"measured together {total:.1f} ≥ the sum of the parts {parts:.1f} ms a day"
    else:
        why = ["the parts' read savings are each task's gain over its query family (several "
               "parameter sets); together each statement is replayed with one filled parameter set"]
        slower = [r for r in replayed if r.significant and r.statement.kind == "read" and r.delta_ms < 0]
        if slower:
            why.append(f"{len(slower)} read(s) slower with the set (the planner chose otherwise)")
        timed = {r.statement.queryid for r in replayed if r.with_index is not None}
        rewrite = {q for i in creates for q in i.rewrite} - timed
        if rewrite:
            counted = sum(i.read_ms_per_day for i in creates if set(i.rewrite) & rewrite)
            why.append(f"{len(rewrite)} statement(s) need the query rewritten for the saving a part counts "
                       f"({counted:.0f} ms a day): replayed as the application sends them, the index alone "
                       "does not change their plan")
        unserved = {q for i in creates for q in i.statements} - timed - rewrite
        if unserved:
            why.append(f"{len(unserved)} statement(s) a part counts were not timed together (not in the "
                       "table's replayed workload, or the same plan)")
        if not_replayed:
            why.append(f"{len(not_replayed)} statement(s) of these tables could not be filled")
        failed = [r for r in replayed if r.note.startswith("not replayed")]
        if failed:
            why.append(f"{len(failed)} statement(s) failed in the fork ({failed[0].note})")
        verdict = (f"measured together {total:.1f} < the sum of the parts {parts:.1f} ms a day: "
                   + "; ".join(why))
    doc["measured"] = {
        "total_ms_per_day": None if total is None else round(total, 1),
        "sum_of_parts_ms_per_day": round(parts, 1),
        "drops_ms_per_day": round(drops_saved, 1), "window_s": window, "verdict": verdict,
        "statements": [r.public() | {"ms_per_day": None if r.with_index is None else round(
            r.delta_ms * (per_day(r.statement.calls, window) or 0.0), 1)} for r in replayed],
        "not_replayed": [{"statement": n.statement, "reason": n.reason} for n in not_replayed],
        "notes": notes + ["the chosen drops are dropped on both sides; their saving is their own "
                          "measurement (afs.batch.indexes)"] * bool(drops),
    }
    return doc


def render(chosen: Mapping[str, Any]) -> list[str]:
    """The chosen set as Markdown lines, for the batch report."""
    out = [f"## The set under {chosen['budget_mb']:.1f} MB", "",
           f"Selection: {chosen['method']}.", "",
           "| change | size MB | read saved/day | write/day | net/day |", "|---|---|---|---|---|"]
    for i in chosen["items"]:
        write = i.get("write_ms_cost_per_day", i.get("write_ms_saved_per_day", 0.0))
        sign = "−" if i["kind"] == "create" else "+"
        out.append(f"| `{i['sql']}` | {i['size_mb']:.1f} | {i['read_ms_saved_per_day']:.0f} ms | "
                   f"{sign}{write:.0f} ms | {i['net_ms_per_day']:.0f} ms |")
    out += ["", f"In all: {chosen['storage_mb']:.1f} MB, {chosen['sum_of_parts_ms_per_day']:.0f} ms a day "
                "(the sum of the parts)."]
    measured = chosen.get("measured") or {}
    if measured.get("verdict"):
        out.append(f"Measured together in one fork: {measured['verdict']}.")
    elif measured.get("error"):
        out.append(f"Not measured together: {measured['error']}.")
    for left in chosen["left_out"]:
        out.append(f"- left out: `{left['sql']}` — {left['why']}")
    return [*out, ""]



async def chosen_set(doc: Mapping[str, Any], settings: Settings, *, on: BatchTarget, counters: Counters,
                     budget_mb: float, progress: Any = lambda message: None) -> dict[str, Any]:
    """The batch's `chosen_set`: the items of its report chosen under `budget_mb`, measured
    together in one fork of the target's copy in the sandbox (the fork source found as the
    index review finds it). The target is only read (catalog, pg_stats, EXPLAIN). A failure
    to measure does not fail the batch: the choice stands, `measured.error` says why."""
    from afs.sandbox.forks import open_forks  # the MCP SDK: only for a budgeted batch
    from afs.sandbox.importer import imported_copy

    target_dsn, source = on.dsn, on.source
    choice = choose(candidates(doc), budget_mb)
    try:
        async with open_forks(settings) as forks, open_connection(target_dsn) as target:
            known = {str(s["name"]) for s in (await forks.list_services())["sources"]}
            fork_source = await imported_copy(forks, target_dsn) or (source if source in known else None)
            if fork_source is None:
                return choice.public() | {"measured": {
                    "total_ms_per_day": None, "error": f"no copy of {source} in the sandbox to measure in"}}
            at = Verifying(target, forks, fork_source, settings, progress)
            return await measure_set(at, choice, counters)
    except AfsError as exc:
        return choice.public() | {"measured": {"total_ms_per_day": None, "error": str(exc).splitlines()[0]}}
