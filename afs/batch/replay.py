"""Replaying a table's workload in a fork, with and without an index.

    work = await table_workload(target, counters, ["public.orders"])   # filled, on the target
    replayed = await replay(fork_conn, work.statements, drop=("public.orders_status_idx",),
                            rule=StopRule.of(settings.measuring))

The statements are the database's own (pg_stat_statements, `afs.batch.statements.Counters`)
that name the table, each filled with values:

    reads    SELECTs filled as the batch fills them (`afs.batch.fill.fill_statement`: the
             target's checks, pg_stats, every plan through `afs.target.on_target`)
    writes   one INSERT, UPDATE or DELETE (no WITH): each `$n` takes a value from the pg_stats
             of the column it is assigned to or compared with (`fill_write`, pure); in the
             fork, an integer column of a unique index an INSERT or UPDATE writes takes a
             value past the column's largest, so that the write does not collide

In the fork (afs.replay, where an agent measures a proposal's new indexes the same way), a run
of a statement is one transaction that is always rolled back: the index dropped in it (the side
"without"), then the statement under EXPLAIN (ANALYZE, TIMING OFF) `repeats` times (a write
inside a savepoint rolled back each time, so an INSERT never meets its own earlier row), and
the run's figure is the mean execution time per call. A fast statement is repeated until a run
takes about `RUN_TARGET_MS`, so a write of 30 µs is not timed in the noise of one call. The two
sides alternate run by run (drift hits both alike), as long as `afs.bench.stop_reason` leaves
the verdict open; `afs.bench.significant` decides. A write's cost is an estimate rather than a
verdict: `WRITE_PAIRS` pairs of runs at least (the settings' run count when larger), each pair
back to back, and the figure is the median of the pairs' differences (drift between pairs
cancels out).

A read whose plan is the same with and without the index (its node types, relations and
indexes) is not timed: the planner's choice does not depend on an index it does not use.

Where this runs: a fork's own login role runs the statements (it owns the fork's tables and
nothing outside the fork), never the role AFS connected to the user's database with; the
user's database is only read (catalog, pg_stats, EXPLAIN through `on_target`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError

from afs.batch.fill import fill_statement, read_tables
from afs.batch.statements import Counters, relations, why_not
from afs.db import Connection
from afs.models import TableInfo
from afs.params.fill import CannotFill, Slot, substitute, typed_parameters, values_for
from afs.pg.names import relation_key
from afs.query.text import walk
from afs.replay import (  # the runs in the fork (below the batch: an agent measures with them too)
    DAY_S,
    Kind,
    Replayed,
    WorkStatement,
    _param,
    per_day,
    replay,
    replay_one,
    write_cost,
)

__all__ = ["DAY_S", "NotReplayed", "Replayed", "TableWorkload", "WorkStatement", "fill_write", "per_day",
           "replay", "replay_one", "table_oids", "table_workload", "window_seconds", "write_cost",
           "write_slots", "write_target"]  # the runs in the fork are afs.replay's
MAX_STATEMENTS = 20  # statements of a table replayed, at most (by total time)
_ROLES = {"=": "eq", "<>": "eq", "!=": "eq", ">": "lower", ">=": "lower", "<": "upper", "<=": "upper"}


@dataclass(frozen=True)
class NotReplayed:
    statement: str
    reason: str


@dataclass(frozen=True)
class TableWorkload:
    statements: tuple[WorkStatement, ...]
    not_replayed: tuple[NotReplayed, ...]
    window_s: float | None  # what the calls cover (pg_stat_statements' reset to now); None: unknown


# -- the workload of some tables (pure parts) ------------------------------------------------
def write_target(query: str) -> str | None:
    """The table one INSERT, UPDATE or DELETE writes (as the catalog keys it); None for anything
    else (a read, several statements, a data-modifying WITH, something that does not parse)."""
    try:
        tree = parse_sql(query)
    except ParseError:
        return None
    if len(tree) != 1:
        return None
    stmt = tree[0].stmt
    if not isinstance(stmt, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)) or stmt.withClause:
        return None
    rel = stmt.relation
    if rel is None:
        return None
    return relation_key(*(p for p in (rel.schemaname, rel.relname) if p))


def _column_name(node: object) -> str | None:
    while isinstance(node, ast.TypeCast):
        node = node.arg
    if isinstance(node, ast.ColumnRef) and node.fields and isinstance(node.fields[-1], ast.String):
        return str(node.fields[-1].sval)
    return None


def write_slots(query: str, table: str) -> list[Slot]:
    """Where each `$n` of a write is used: the column it is written to (INSERT's column list,
    UPDATE's SET) or compared with (its WHERE, over the one table written). Pure."""
    stmt = parse_sql(query)[0].stmt
    found: dict[int, Slot] = {}

    def add(number: int | None, role: str, column: str | None, what: str = "") -> None:
        if number is None or number in found:
            return
        found[number] = (Slot(number, role, table, column) if column else
                         Slot(number, role, problem=f"${number} is {what or 'not used with a column'}"))

    if isinstance(stmt, ast.InsertStmt):
        columns = [str(c.name) for c in stmt.cols or ()]
        select = stmt.selectStmt
        rows = getattr(select, "valuesLists", None) or ()
        for row in rows:
            for n, item in enumerate(row):
                add(_param(item), "eq", columns[n] if n < len(columns) else None,
                    "in an INSERT without a column list")
    if isinstance(stmt, ast.UpdateStmt):
        for target in stmt.targetList or ():
            add(_param(target.val), "eq", str(target.name))
    where = getattr(stmt, "whereClause", None)
    if where is not None and not getattr(stmt, "fromClause", None) and not getattr(stmt, "usingClause", None):
        for node in walk(where):
            if not isinstance(node, ast.A_Expr):
                continue
            if node.kind == enums.A_Expr_Kind.AEXPR_IN and isinstance(node.rexpr, (list, tuple)):
                for item in node.rexpr:
                    add(_param(item), "eq", _column_name(node.lexpr), "compared with an expression")
            elif node.kind == enums.A_Expr_Kind.AEXPR_OP and node.name:
                op = str(node.name[-1].sval)
                role = _ROLES.get(op)
                flipped = {"lower": "upper", "upper": "lower"}.get(role or "", role)
                if role is not None:
                    add(_param(node.rexpr), role, _column_name(node.lexpr), "compared with an expression")
                    add(_param(node.lexpr), flipped or role, _column_name(node.rexpr),
                        "compared with an expression")
    numbers = sorted({n for n in (_param(x) for x in _params(stmt)) if n is not None})
    for number in numbers:
        add(number, "eq", None, "used in an expression AFS cannot fill")
    return [found[n] for n in sorted(found)]


def _params(stmt: Any) -> list[Any]:
    return [n for n in walk(stmt) if isinstance(n, ast.ParamRef)]


def fill_write(query: str, table: str,
               tables: Mapping[str, TableInfo]) -> tuple[dict[int, str] | None, str | None]:
    """The values of a write's `$n` from pg_stats (pure): (values, None), or (None, why not)."""
    query = typed_parameters(query)
    try:
        slots = write_slots(query, table)
    except ParseError as exc:
        return None, f"does not parse: {exc}"
    values: dict[int, str] = {}
    try:
        for slot in slots:
            values[slot.number] = values_for(slot, tables, 1)[0]
    except CannotFill as exc:
        return None, str(exc)
    except KeyError:
        return None, f"no statistics of {table}"
    return values, None


# -- the workload of some tables (on the target: read-only) ---------------------------------------
async def table_oids(conn: Connection, names: Sequence[str]) -> dict[str, int | None]:
    """Each relation name's oid as the connection's search path resolves it (None: unknown)."""
    out: dict[str, int | None] = {}
    for name in dict.fromkeys(names):
        value = await conn.fetchval("SELECT to_regclass(%s)::oid", (name,))
        out[name] = None if value is None else int(value)
    return out


def window_seconds(counters: Counters) -> float | None:
    if counters.stats_reset is None:
        return None
    return max(1.0, (counters.at - counters.stats_reset).total_seconds())


async def table_workload(target: Connection, counters: Counters, tables: Sequence[str], *,
                         limit: int = MAX_STATEMENTS, reads: bool = True) -> dict[int, TableWorkload]:
    """The filled statements of pg_stat_statements that name each of `tables` (by oid).

    Reads are filled and planned through `on_target` (none without `reads`); writes filled
    from pg_stats (pure)."""
    wanted = {oid: name for name, oid in (await table_oids(target, tables)).items() if oid is not None}
    found: dict[int, list[WorkStatement]] = {oid: [] for oid in wanted}
    missed: dict[int, list[NotReplayed]] = {oid: [] for oid in wanted}
    known: dict[str, int | None] = {}
    for queryid, text, calls, total, _mean, _rows in counters.rows:  # by total time
        written = write_target(text)
        if written is None and not reads:
            continue
        try:
            if written is None and not _is_select(text):
                continue  # DDL, utility statements: not the workload's reads or writes
            names = [written] if written is not None else relations(text)
        except ParseError:
            continue
        unknown = [n for n in names if n not in known]
        known.update(await table_oids(target, unknown))
        oids = [known[n] for n in names if known.get(n) in wanted]
        for oid in dict.fromkeys(o for o in oids if o is not None):
            if len(found[oid]) >= limit:
                continue
            values: dict[int, str] = {}
            if written is not None:
                info = await read_tables(target, _as_select(written))
                given, reason = fill_write(text, written, info)
                values = given or {}
                query = None if given is None else substitute(typed_parameters(text), values)
                kind: Kind = "write"
            else:
                reason = why_not(text)
                query = None
                kind = "read"
                if reason is None:
                    filled = await fill_statement(target, text, 1)
                    query = filled.sets[0].query if filled.sets else None
                    reason = filled.reason if query is None else None
            if query is None:
                missed[oid].append(NotReplayed(text, reason or "cannot be filled"))
                continue
            found[oid].append(WorkStatement(queryid, text, query, kind, wanted[oid], int(calls), float(total),
                                            tuple(sorted(values.items()))))
    window = window_seconds(counters)
    return {oid: TableWorkload(tuple(found[oid]), tuple(missed[oid]), window) for oid in wanted}


def _is_select(text: str) -> bool:
    tree = parse_sql(text)
    return len(tree) == 1 and isinstance(tree[0].stmt, ast.SelectStmt)


def _as_select(table: str) -> str:
    return f"SELECT FROM {table}"
