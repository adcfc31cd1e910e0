"""The index review: indexes worth dropping, verified in a fork.

    review = await review_indexes(Verifying(target, forks, source, settings), min_window_s=7 * 86_400)
    review["advice"]     # [{"index", "table", "verdict": "drop" | "keep", "kind", "reason", …}]

What is a candidate (read from the catalog of the user's database: pg_index, pg_class,
pg_constraint, pg_stat_user_indexes, pg_stat_database; no user's query runs there):

    duplicate   the same definition as another index of the table, compared field by field
                in pg_index (access method, key and INCLUDE columns, operator classes,
                collations, options, expressions, predicate), never by text; of a group the
                one kept is the one behind a constraint, unique or replica identity, else the
                most scanned, else the oldest
    redundant   a btree whose key columns are a leading prefix of another btree's of the same
                table, with the same operator classes, collations and options, and whose INCLUDE
                columns the other has too; the longer one is not partial
    unused      no index scan since the statistics were reset (pg_stat_user_indexes.idx_scan),
                on the primary nor on any replica named (`replicas`: their scans are added,
                over the window they all cover), and the window (pg_stat_database.stats_reset
                to now) at least `min_window_s`; a shorter or unknown window makes the
                verdict "keep", saying so

Never a candidate: an index behind a constraint (pg_constraint.conindid: primary key, unique,
exclusion, and what a foreign key relies on), a unique index, the replica identity, an index
of a system schema, an invalid index, an index on a table the connected role may not read.

The verification, for each candidate, in one fork of the database's copy in the sandbox:
every statement of pg_stat_statements that names the table, filled (`afs.batch.replay`),
with the index and with it dropped (inside a transaction rolled back). A read slower without
it (the runs apart, `afs.bench.significant`) makes the verdict "keep" and is listed in
`reads_slower`; the writes' time saved per call and per day at the observed rate (the
statement's calls over pg_stat_statements' window) and the storage freed are reported. The
advice is `DROP INDEX CONCURRENTLY` and its rollback the index's definition (pg_get_indexdef).

What AFS cannot see is said next to the advice (`unseen`): reads on a replica (its own
statistics), statements that left pg_stat_statements (evicted, or before its reset), runs
outside the window, statements it could not fill.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from afs.batch.replay import (
    DAY_S,
    Replayed,
    TableWorkload,
    replay,
    table_oids,
    table_workload,
    write_cost,
)
from afs.batch.statements import Counters, read_counters
from afs.bench import StopRule
from afs.config import Settings
from afs.db import Connection, open_connection
from afs.errors import AfsError
from afs.pg.names import quote_ident, quote_qualified
from afs.replay import net_saving
from afs.safety import NewIndex, validate_commands, validate_proposal
from afs.sandbox.forks import open_forks
from afs.sandbox.importer import imported_copy, origin_of
from afs.sandbox.server import dsn_for

MB = 1048576.0
SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Verifying:
    """Where an index is judged and verified, passed whole: the target database (its catalog,
    statistics and pg_stat_statements are read, nothing runs there), the fork client and
    `source` (the target's copy in the sandbox) a fork is made of, the settings (measuring)
    and what is told each step."""

    target: Connection
    forks: Any
    source: str
    settings: Settings
    progress: Callable[[str], None] = _quiet


@dataclass(frozen=True)
class IndexFacts:
    """One index as pg_index and the statistics describe it."""

    oid: int
    schema: str
    name: str
    table: str  # regclass text
    table_oid: int
    method: str
    keys: tuple[int, ...]  # indkey: key columns then INCLUDE columns (0: an expression)
    key_count: int  # indnkeyatts
    opclasses: tuple[int, ...]
    collations: tuple[int, ...]
    options: tuple[int, ...]
    expressions: str | None  # indexprs as stored (node trees: compared, never shown)
    predicate: str | None  # indpred as stored
    unique: bool
    primary: bool
    exclusion: bool
    replica_identity: bool
    constraint: str | None  # the constraint it backs (pg_constraint.conindid)
    valid: bool
    readable: bool  # the connected role may read the table
    scans: int | None  # idx_scan since the statistics' reset
    size_bytes: int
    definition: str  # pg_get_indexdef

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @property
    def protected(self) -> str | None:
        """Why this index is never proposed for dropping (None: it may be)."""
        if self.schema in SYSTEM_SCHEMAS or self.schema.startswith("pg_"):
            return "an index of a system catalog"
        if self.constraint is not None:
            return f"behind constraint {self.constraint}"
        if self.primary or self.unique or self.exclusion:
            return "unique (it enforces a rule, not only speeds reads)"
        if self.replica_identity:
            return "the table's replica identity"
        if not self.valid:
            return "not valid (a failed CREATE INDEX CONCURRENTLY: rebuild or drop it by hand)"
        if not self.readable:
            return "on a table AFS's role may not read"
        return None

    def same_definition(self, other: IndexFacts) -> bool:
        return (self.table_oid == other.table_oid and self.method == other.method
                and self.keys == other.keys and self.key_count == other.key_count
                and self.opclasses == other.opclasses and self.collations == other.collations
                and self.options == other.options and self.expressions == other.expressions
                and self.predicate == other.predicate)

    def prefix_of(self, other: IndexFacts) -> bool:
        """Its key is a strict leading part of `other`'s with the same properties (btree)."""
        n = self.key_count
        return (self.table_oid == other.table_oid and self.method == other.method == "btree"
                and self.expressions is None and other.expressions is None
                and self.predicate is None and other.predicate is None
                and n < other.key_count and self.keys[:n] == other.keys[:n]
                and self.opclasses[:n] == other.opclasses[:n]
                and self.collations[:n] == other.collations[:n] and self.options[:n] == other.options[:n]
                and set(self.keys[n:]) <= set(other.keys))


_INDEXES_SQL = """
SELECT i.indexrelid::oid, n.nspname, c.relname, i.indrelid::regclass::text, i.indrelid::oid, am.amname,
       i.indkey::int2[]::int[], i.indnkeyatts, i.indclass::oid[]::bigint[], i.indcollation::oid[]::bigint[],
       i.indoption::int2[]::int[], i.indexprs::text, i.indpred::text, i.indisunique, i.indisprimary,
       i.indisexclusion, i.indisreplident,
       (SELECT string_agg(con.conname, ', ') FROM pg_constraint con WHERE con.conindid = i.indexrelid),
       i.indisvalid AND i.indisready, has_table_privilege(i.indrelid, 'SELECT'),
       s.idx_scan, pg_relation_size(i.indexrelid), pg_get_indexdef(i.indexrelid)
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_am am ON am.oid = c.relam
JOIN pg_class t ON t.oid = i.indrelid
LEFT JOIN pg_stat_user_indexes s ON s.indexrelid = i.indexrelid
WHERE t.relkind IN ('r', 'm', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
  AND n.nspname NOT LIKE 'pg\\_%%' AND n.nspname <> 'afs_store'
ORDER BY i.indrelid, i.indexrelid
"""


async def read_indexes(conn: Connection) -> list[IndexFacts]:
    """Every index of the user's tables, from the catalog (read-only)."""
    rows = await conn.fetchall(_INDEXES_SQL)
    return [IndexFacts(int(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), str(r[5]), tuple(r[6]),
                       int(r[7]), tuple(r[8]), tuple(r[9]), tuple(r[10]), r[11], r[12], bool(r[13]),
                       bool(r[14]), bool(r[15]), bool(r[16]), r[17], bool(r[18]), bool(r[19]),
                       None if r[20] is None else int(r[20]), int(r[21]), str(r[22])) for r in rows]


@dataclass(frozen=True)
class StatsWindow:
    """What pg_stat_user_indexes' counters cover: pg_stat_database.stats_reset to now."""

    reset: datetime | None
    now: datetime

    @property
    def seconds(self) -> float | None:
        return None if self.reset is None else max(0.0, (self.now - self.reset).total_seconds())

    def note(self) -> str:
        if self.seconds is None:
            return ("the index statistics were never reset: PostgreSQL does not say since when they "
                    "count (pg_stat_database.stats_reset is empty)")
        return (f"index scans counted since {self.reset:%Y-%m-%d %H:%M} UTC "
                f"({_span(self.seconds)}, pg_stat_database.stats_reset)")


def _span(seconds: float) -> str:
    if seconds >= 2 * DAY_S:
        return f"{seconds / DAY_S:.1f} days"
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.0f} minutes"


async def read_window(conn: Connection) -> StatsWindow:
    row = await conn.fetchone("SELECT stats_reset, now() FROM pg_stat_database"
                              " WHERE datname = current_database()")
    assert row is not None
    return StatsWindow(row[0], row[1])


@dataclass(frozen=True)
class Candidate:
    index: IndexFacts
    kind: str  # duplicate, redundant, unused
    reason: str
    blocked: str | None = None  # why the verdict is "keep" whatever the replay says (a short window)


def candidates(indexes: Sequence[IndexFacts], window: StatsWindow, min_window_s: float) -> list[Candidate]:
    """The indexes that may be dropped, and why (pure)."""
    found: dict[int, Candidate] = {}

    def keeper_rank(ix: IndexFacts) -> tuple[int, int, int]:
        return (0 if ix.protected else 1, -(ix.scans or 0), ix.oid)

    by_table: dict[int, list[IndexFacts]] = {}
    for ix in indexes:
        by_table.setdefault(ix.table_oid, []).append(ix)
    for group in by_table.values():
        for ix in group:  # duplicates: every one but the keeper of its group
            twins = [o for o in group if o.same_definition(ix)]
            if len(twins) < 2 or ix.protected:
                continue
            keeper = min(twins, key=keeper_rank)
            if keeper.oid != ix.oid:
                found[ix.oid] = Candidate(ix, "duplicate", f"the same definition as {keeper.qualified}"
                                          f" ({keeper.definition})")
        for ix in group:  # redundant: a prefix of a longer one
            if ix.oid in found or ix.protected:
                continue
            longer = [o for o in group if ix.prefix_of(o) and o.oid not in found]
            if longer:
                other = max(longer, key=lambda o: (o.key_count, -o.oid))
                found[ix.oid] = Candidate(ix, "redundant", f"its key columns lead {other.qualified}"
                                          f" ({other.definition}) with the same operator classes and "
                                          "collations")
        for ix in group:  # unused
            if ix.oid in found or ix.protected or ix.scans is None or ix.scans > 0:
                continue
            seconds = window.seconds
            blocked = None
            if seconds is None and min_window_s > 0:
                blocked = "the window is unknown: " + window.note()
            elif seconds is not None and seconds < min_window_s:
                blocked = (f"the statistics cover only {_span(seconds)}, less than the "
                           f"{_span(min_window_s)} asked (--min-window): too short to call it unused")
            found[ix.oid] = Candidate(ix, "unused", f"no index scan since the statistics' reset "
                                      f"({window.note()})", blocked)
    order = {"duplicate": 0, "redundant": 1, "unused": 2}  # verified in this order, after the drops before
    return sorted(found.values(), key=lambda c: (order[c.kind], c.index.table, c.index.name))


UNSEEN = (
    "reads on a replica not named with --replica (each standby keeps its own statistics, and its "
    "statements are not in the primary's pg_stat_statements: their plans are not replayed)",
    "statements no longer in pg_stat_statements (evicted past pg_stat_statements.max, or run before "
    "its last reset) and anything that runs less often than the window (a monthly report)",
)


def _statement_names(replayed: Sequence[Replayed]) -> list[str]:
    return [r.statement.statement for r in replayed if r.slower_without]


def advise(candidate: Candidate, replayed: Sequence[Replayed] | None, work: TableWorkload | None,
           window: StatsWindow, problem: str | None = None) -> dict[str, Any]:
    """One item of the advice (pure). `replayed` None: not verified (`problem` says why)."""
    ix = candidate.index
    slower = _statement_names(replayed or ())
    saved = write_cost(replayed or (), None if work is None else work.window_s)
    verdict, reason = "drop", candidate.reason
    if candidate.blocked:
        verdict, reason = "keep", f"{candidate.reason}; but {candidate.blocked}"
    elif replayed is None:
        verdict, reason = "keep", f"{candidate.reason}; but {problem or 'it was not verified in a fork'}"
    elif lost := [r for r in replayed if r.statement.kind == "read" and r.note.startswith("not replayed")]:
        verdict, reason = "keep", (f"{candidate.reason}; but {len(lost)} read(s) of {ix.table} failed in the "
                                   f"fork, so it could not be verified ({lost[0].note})")
    elif slower:
        verdict, reason = "keep", (f"{candidate.reason}; but {len(slower)} read(s) got slower without it "
                                   "in the fork")
    else:
        timed = sum(1 for r in replayed if r.with_index is not None)
        reason += (f"; verified in a fork: {len(replayed)} statement(s) of {ix.table} replayed "
                   f"({timed} timed, the others plan the same without it), no read slower")
    failed = [r for r in replayed or () if r.note.startswith("not replayed")]
    unseen = [*UNSEEN, f"the window: {window.note()}"]
    if work is not None and work.not_replayed:
        unseen.append(f"{len(work.not_replayed)} statement(s) of {ix.table} could not be filled and "
                      "were not replayed")
    if failed:
        unseen.append(f"{len(failed)} statement(s) failed in the fork and were not timed")
    return {
        "index": ix.qualified, "table": ix.table, "verdict": verdict, "kind": candidate.kind,
        "reason": reason, "reads_slower": slower,
        "write_ms_saved_per_call": saved["ms_per_write"],  # the index's cost: saved by dropping it
        "write_ms_saved_per_day": saved["ms_per_day"], "writes_per_day": saved["writes_per_day"],
        "write_significant": saved["significant"],  # some write's runs apart (else: within the noise)
        "storage_mb": round(ix.size_bytes / MB, 2), "scans": ix.scans,
        "sql": f"DROP INDEX CONCURRENTLY {ix.qualified};",
        "rollback": f"{_concurrently(ix.definition)};",
        "replayed": [r.public() for r in replayed or ()],
        "not_replayed": [{"statement": n.statement, "reason": n.reason}
                         for n in (work.not_replayed if work is not None else ())],
        "unseen": unseen,
    }


def _concurrently(definition: str) -> str:
    for head in ("CREATE INDEX ", "CREATE UNIQUE INDEX "):
        if definition.startswith(head):
            return head + "CONCURRENTLY " + definition[len(head):]
    return definition


Scans = Mapping[tuple[str, str], int]  # (schema, index) → index scans


async def read_replica(conn: Connection) -> tuple[Scans, StatsWindow]:
    """A standby's index scans and its statistics' window (read-only)."""
    rows = await conn.fetchall("SELECT schemaname, indexrelname, idx_scan FROM pg_stat_user_indexes")
    return {(str(r[0]), str(r[1])): int(r[2] or 0) for r in rows}, await read_window(conn)


def with_replicas(indexes: Sequence[IndexFacts], window: StatsWindow,
                  replicas: Sequence[tuple[Scans, StatsWindow]]) -> tuple[list[IndexFacts], StatsWindow]:
    """The scans of the primary and the replicas together, over the window they all cover (the
    latest reset; unknown when any is unknown). Pure."""
    out = []
    for ix in indexes:
        extra = sum(scans.get((ix.schema, ix.name), 0) for scans, _ in replicas)
        out.append(ix if ix.scans is None else dataclasses.replace(ix, scans=ix.scans + extra))
    resets = [window.reset, *(w.reset for _, w in replicas)]
    reset = None if any(r is None for r in resets) else max(r for r in resets if r is not None)
    return out, StatsWindow(reset, window.now)


async def review_indexes(at: Verifying, *, min_window_s: float,
                         counters: Counters | None = None, replicas: Sequence[Connection] = (),
                         only: int | None = None) -> dict[str, Any]:
    """The index review of the target: candidates from its catalog, each verified in one fork
    of `source` (its copy in the sandbox) with the table's statements replayed. `replicas`:
    standbys whose index scans count too (an index a replica's reads use is not unused).
    `only`: the one index (its oid) to judge and verify (`afs apply --drop-index`)."""
    target, forks, source, settings, progress = at.target, at.forks, at.source, at.settings, at.progress
    indexes = await read_indexes(target)
    window = await read_window(target)
    if replicas:
        indexes, window = with_replicas(indexes, window, [await read_replica(r) for r in replicas])
    found = [c for c in candidates(indexes, window, min_window_s) if only is None or c.index.oid == only]
    counters = counters if counters is not None else await read_counters(target)
    verify = [c for c in found if c.blocked is None]
    workloads = await table_workload(target, counters, sorted({c.index.table for c in verify}))
    rule = StopRule.of(settings.measuring)
    replays: dict[int, list[Replayed]] = {}
    problems: dict[int, str] = {}  # why a candidate could not be verified
    if verify:
        async with forks.open_fork(source) as fork, open_connection(
                fork.dsn, settings.measuring.statement_timeout_ms) as conn:
            accepted: list[str] = []  # judged together: each with the drops decided before it
            for c in verify:
                progress(f"verifying {c.kind} index {c.index.qualified} in fork {fork.name}")
                work = workloads.get(c.index.table_oid)
                name = f"{c.index.schema}.{c.index.name}"
                if not await conn.fetchval("SELECT to_regclass(%s) IS NOT NULL", (c.index.qualified,)):
                    problems[c.index.oid] = (f"the sandbox's copy has no index {c.index.qualified} (it is "
                                             "older than the database: `afs sandbox import --refresh`, or "
                                             "`afs sandbox refresh` for the demo): not verified")
                    continue
                replayed = await replay(conn, work.statements if work else (), (name,), rule,
                                        base=tuple(accepted))
                replays[c.index.oid] = replayed
                if not any(r.slower_without for r in replayed):
                    accepted.append(name)
    advice = [advise(c, replays.get(c.index.oid), workloads.get(c.index.table_oid), window,
                     problems.get(c.index.oid)) for c in found]
    return {"database": counters.database, "window": {"stats_reset": None if window.reset is None else
                                                      window.reset.isoformat(timespec="seconds"),
                                                      "seconds": window.seconds, "note": window.note()},
            "statements_window_s": None if not workloads else next(iter(workloads.values())).window_s,
            "min_window_s": min_window_s,
            "protected": [{"index": ix.qualified, "why": ix.protected} for ix in indexes if ix.protected],
            "replicas": len(replicas), "advice": advice, "unseen": list(UNSEEN)}


# -- the batch: write costs of the winners' new indexes, and the review -------------------------
def task_offers(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The write costs the batch's tasks measured that may stand for the batch's own replay
    (pure), by the index's SQL: a winner of this batch (not one reused from an earlier batch)
    whose only command is that one CREATE INDEX, whose task replayed every write it was given on
    the index's table (no note: none left out, none failed), and whose index is not a merged one
    (serving several statements, or standing in for others: the batch replays those)."""
    merged = {i["sql"] for i in doc.get("indexes", ())
              if len(i.get("statements") or ()) > 1 or i.get("replaces")}
    offers: dict[str, Mapping[str, Any]] = {}
    for e in doc.get("statements", ()):
        winner = e.get("winner") or {}
        in_task, commands = winner.get("write_cost_in_task"), winner.get("sql_commands") or []
        if (e.get("status") == "reused" or not in_task or len(commands) != 1 or commands[0] in merged
                or not in_task.get("statements") or in_task.get("note") or not in_task.get("writes")):
            continue
        offers[commands[0]] = in_task
    return offers


def task_figure(offer: Mapping[str, Any], writes: Sequence[str]) -> dict[str, Any] | None:
    """A task's measured write cost in the batch's form (`write_cost`, "source": "task") when it
    was measured on the writes the batch would replay for the index's table (`writes`, their
    statements): as many write statements replayed as the batch has, each one given to the task
    (then those are the ones it replayed: it replays only its index's table's). None otherwise."""
    given = set(offer.get("writes") or ())
    if not writes or len(set(writes)) != len(writes) or offer.get("statements") != len(writes) \
            or not set(writes) <= given:
        return None
    per_day, rate = offer.get("ms_per_day"), offer.get("writes_per_day")
    return {"ms_per_write": round(float(offer["ms_per_write"]), 4),
            "writes_per_day": None if rate is None else round(float(rate), 1),
            "ms_per_day": None if per_day is None else round(float(per_day), 1),
            "measured": [], "significant": bool(offer.get("significant")), "writes": len(writes),
            "source": "task"}


async def new_index_write_costs(at: Verifying, creates: Sequence[str], counters: Counters, *,
                                measured: Mapping[str, Mapping[str, Any]] | None = None,
                                ) -> dict[str, dict[str, Any]]:
    """For each CREATE INDEX (by its SQL, validated again), the table's write statements replayed
    in a fork with the index built and with it dropped (inside a rolled-back transaction):
    {"ms_per_write", "ms_per_day", "writes_per_day", "measured", "source": "batch", …} by the
    statement. `measured`: what the tasks measured (`task_offers`), taken instead of a replay
    where it covers the same writes (`task_figure`, "source": "task"); no fork when all are."""
    target, forks, source, settings, progress = at.target, at.forks, at.source, at.settings, at.progress
    new: dict[str, NewIndex] = {}
    for sql in dict.fromkeys(creates):
        if not validate_proposal((sql,), "index").is_valid:
            continue
        commands = validate_commands((sql,), "index").creates.commands
        if len(commands) == 1 and isinstance(commands[0], NewIndex):
            new[sql] = commands[0]
    if not new:
        return {}
    tables = sorted({n.table for n in new.values()})
    workloads = await table_workload(target, counters, tables)
    out: dict[str, dict[str, Any]] = {}
    if measured:
        oids = await table_oids(target, tables)
        for sql, index in new.items():
            work = workloads.get(oids.get(index.table) or 0)
            texts = [s.statement for s in (work.statements if work else ()) if s.kind == "write"]
            figure = task_figure(measured[sql], texts) if sql in measured else None
            if figure is not None:
                progress(f"write cost of {sql}: as its task measured it ({len(texts)} write statement(s), "
                         "the ones the batch would replay)")
                out[sql] = figure
    new = {sql: index for sql, index in new.items() if sql not in out}
    if not new:
        return out
    rule = StopRule.of(settings.measuring)
    async with forks.open_fork(source) as fork, open_connection(
            fork.dsn, settings.measuring.statement_timeout_ms) as conn:
        for sql, index in new.items():
            table_oid = await conn.fetchval("SELECT to_regclass(%s)::oid", (index.table,))
            work = None if table_oid is None else workloads.get(int(table_oid))
            writes = [s for s in (work.statements if work else ()) if s.kind == "write"]
            progress(f"write cost of {sql}: {len(writes)} write statement(s) replayed in fork {fork.name}")
            before = {r[0] for r in await conn.fetchall(_INDEXES_OF, (table_oid,))}
            await conn.execute(sql)
            made = [r for r in await conn.fetchall(_INDEXES_OF, (table_oid,)) if r[0] not in before]
            try:
                replayed = await replay(conn, writes, (str(made[0][1]),), rule) if made else []
            finally:
                for _, name in made:
                    await conn.execute(f"DROP INDEX IF EXISTS {quote_qualified(str(name))}")
            cost = write_cost(replayed, work.window_s if work else None)
            if not writes:
                cost["note"] = "no write statement of this table in pg_stat_statements: no write cost seen"
            out[sql] = {**cost, "source": "batch"}
    return out


_INDEXES_OF = ("SELECT i.indexrelid, n.nspname || '.' || c.relname FROM pg_index i JOIN pg_class c"
               " ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE i.indrelid = %s")


async def batch_workload_review(doc: dict[str, Any], settings: Settings, *, target_dsn: str, source: str,
                                counters: Counters, progress: Any = lambda message: None) -> None:
    """The batch's part of issue 28, added to its report `doc`: per winner that adds an index (and
    per merged index) its `write_cost` measured in a fork, and the index review's advice
    (`index_review`, unused judged over `Settings.unused_index_window_s`). Neither fails the batch: what could
    not be done is said in the report (`index_review.error`, a winner's `write_cost.error`)."""
    creates = [sql for e in doc.get("statements", ())
               for sql in (e.get("winner") or {}).get("sql_commands", ())
               if sql.lstrip().upper().startswith("CREATE")]
    try:
        async with open_forks(settings) as forks, open_connection(target_dsn) as target:
            known = {str(s["name"]) for s in (await forks.list_services())["sources"]}
            fork_source = await sandbox_copy(forks, settings, target_dsn) or (
                source if source in known else None)
            if fork_source is None:
                doc["index_review"] = {"error": f"no copy of {source} in the sandbox to verify in"}
                return
            at = Verifying(target, forks, fork_source, settings, progress)
            costs = (await new_index_write_costs(at, creates, counters, measured=task_offers(doc))
                     if creates else {})
            for e in doc.get("statements", ()):
                mine = [costs[s] for s in (e.get("winner") or {}).get("sql_commands", ()) if s in costs]
                if mine:
                    e["write_cost"] = combined_cost(mine)
                    e["net_ms_saved_per_day"] = net_saving(e.get("saved_ms_per_day"), e["write_cost"])
            for index in doc.get("indexes", ()):
                if index["sql"] in costs:
                    index["write_cost"] = combined_cost([costs[index["sql"]]])
                    index["net_ms_saved_per_day"] = net_saving(index.get("saved_ms_per_day"),
                                                               index["write_cost"])
            progress("the index review: unused, duplicate and redundant indexes, verified in a fork")
            doc["index_review"] = await review_indexes(at, min_window_s=settings.unused_index_window_s,
                                                       counters=counters)
    except AfsError as exc:
        doc["index_review"] = {"error": str(exc).splitlines()[0]}


async def sandbox_copy(forks: Any, settings: Settings, target_dsn: str | None) -> str | None:
    """The sandbox database forks of the target are made from: the demo database (no DSN), the
    target's import (`afs sandbox import`), or the target itself when it is a registered source
    of the sandbox's own server; None when there is none."""
    if target_dsn is None:
        return settings.demo_database
    copy = await imported_copy(forks, target_dsn)
    if copy is not None:
        return str(copy)
    origin = origin_of(target_dsn)
    name = origin.rsplit("/", 1)[-1]
    known = {str(s["name"]) for s in (await forks.list_services())["sources"]}
    if name in known and origin == origin_of(dsn_for(settings, name)):
        return name
    return None


def combined_cost(costs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A winner's indexes' write costs together: per write and per day summed (pure)."""
    per_day = [c["ms_per_day"] for c in costs]
    rates = [c["writes_per_day"] for c in costs if c["writes_per_day"] is not None]
    return {"ms_per_write": round(sum(c["ms_per_write"] for c in costs), 4),
            "ms_per_day": None if any(p is None for p in per_day) else round(sum(per_day), 1),
            "writes_per_day": max(rates) if rates else None,
            "significant": any(c["significant"] for c in costs),
            "measured": [m for c in costs for m in c["measured"]],
            # where each figure comes from: "batch" (its replay) or "task" (its task's, the same writes)
            "source": " + ".join(sorted({str(c.get("source", "batch")) for c in costs})),
            "note": "; ".join(c["note"] for c in costs if c.get("note")) or None}
