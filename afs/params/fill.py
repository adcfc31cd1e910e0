"""The `$n` filling (pure): a normalised statement's $1 … $n filled with representative
values from the pg_stats of the columns they are compared with (afs.batch.fill reads the
statistics and plans the result on the target).

    filled = fill(statement, tables, count=3)
    filled.sets[0].query   # the statement with values, as `afs optimize` takes it
    filled.parameters()    # what its task carries: every set, measured on each proposal

Each parameter takes its values from the pg_stats of the column it is compared with, found
by the one resolver (afs.query.query.Query, block by block; the statement is read with each
$n masked as a number of the same length, since sqlglot cannot read $n):
    col = $n, col <> $n, col IN ($n, …)   a typical value (a histogram bound, from the middle
                                          out) and a most common one (most frequent first),
                                          alternately: the first set is the usual case
    col > $n, col >= $n, BETWEEN $n …     lower bound: a histogram percentile (25th, 10th, 50th)
    col < $n, col <= $n, … AND $n         upper bound: a later one (75th, 50th, 90th)
    col LIKE / ILIKE $n                   the first characters of a common value, then %
    LIMIT $n / OFFSET $n                  100 / 0 (a page, not a statistic)
A parameter compared with anything else (an expression, a column without statistics)
cannot be filled: the statement is skipped with that reason. The statistics are read as
the query family reads them (afs.pg.stats: most common values by frequency, quantiles of
the histogram), and a value becomes SQL as afs.pg.names.sql_literal writes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError, scan
from sqlglot import exp

from afs.config import PARAMETER_QUANTILES
from afs.errors import InputError
from afs.models import ColumnStats, ParameterSet, StatementParameters, Substitution, TableInfo
from afs.pg.names import sql_literal
from afs.pg.stats import common_values, quantile
from afs.query.query import Query
from afs.query.text import walk

LOWER, UPPER = PARAMETER_QUANTILES.lower, PARAMETER_QUANTILES.upper  # afs.config
LIMIT_VALUE, OFFSET_VALUE = "100", "0"
_ROLES = {"=": "eq", "<>": "eq", "!=": "eq", ">": "lower", ">=": "lower", "<": "upper", "<=": "upper"}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "<>": "<>", "!=": "!="}


@dataclass(frozen=True)
class Slot:
    """Where parameter $number is used: compared with `column` of `table` as `role`."""

    number: int
    role: str  # eq, lower, upper, like, limit, offset
    table: str | None = None
    column: str | None = None
    problem: str | None = None  # why it cannot be filled


@dataclass(frozen=True)
class Filled:
    """The parameter sets of one statement: `afs.params.ParameterSet`s with their `values`
    ($n → SQL literal) and `query`; the others also with their substitutions from the
    first (the query a task times), so a proposal's rewrite can take their values too."""

    sets: tuple[ParameterSet, ...]  # empty when `reason` says why it cannot be filled
    reason: str | None = None
    statement: str = ""  # with $1 … $n

    def parameters(self) -> StatementParameters | None:
        """What a task carries (None when there is nothing to fill)."""
        return StatementParameters(self.statement, self.sets) if self.sets else None


class CannotFill(Exception):
    pass


# -- where each parameter is used (pure) ---------------------------------------------------
def _param(node: object) -> int | None:
    while isinstance(node, ast.TypeCast):
        node = node.arg
    return node.number if isinstance(node, ast.ParamRef) else None


def _column(node: object) -> ast.ColumnRef | None:
    while isinstance(node, ast.TypeCast):
        node = node.arg
    if not isinstance(node, ast.ColumnRef):
        return None
    fields = tuple(node.fields or ())
    names = [str(f.sval) for f in fields if isinstance(f, ast.String)]
    return node if names and len(names) == len(fields) else None


def _columns(query: str) -> tuple[Query | None, dict[int, exp.Column]]:
    """The statement as the one Query reads it, with each $n written as a number of the same
    length (sqlglot cannot read $n; positions stay where pglast sees them), and its column
    nodes by the byte where each starts. (None, {}) when sqlglot cannot read it."""
    masked = query
    for token in scan(query):
        if token.name == "PARAM":
            masked = masked[:token.start] + "0" * (token.end + 1 - token.start) + masked[token.end + 1:]
    try:
        reading = Query.read(masked)
    except InputError:
        return None, {}
    found: dict[int, exp.Column] = {}
    for column in reading.tree.find_all(exp.Column) if reading.tree is not None else ():
        starts = [ident.meta["start"] for ident in column.find_all(exp.Identifier) if "start" in ident.meta]
        if starts:
            found.setdefault(len(masked[:min(starts)].encode()), column)
    return reading, found


def slots(query: str, tables: Mapping[str, TableInfo]) -> list[Slot]:
    """Every use of every parameter of `query`, with the column it is compared with."""
    tree = parse_sql(query)
    reading, columns = _columns(query)
    found: list[Slot] = []
    seen: set[int] = set()

    def add(number: int, role: str, ref: ast.ColumnRef | None, what: str = "") -> None:
        seen.add(number)
        if ref is None:
            found.append(Slot(number, role, problem=f"${number} is compared with {what or 'an expression'},"
                                                    " not a column"))
            return
        column = str(tuple(ref.fields or ())[-1].sval)
        node = columns.get(ref.location) if ref.location is not None else None
        table = reading.table_of(node, tables) if reading is not None and node is not None else None
        if table is None or table not in tables:
            found.append(Slot(number, role, column=column,
                              problem=f"${number}: cannot tell which table's column {column} it is"))
            return
        found.append(Slot(number, role, table, column))

    for node in walk(tree):
        if isinstance(node, ast.SelectStmt):
            for attr, role in (("limitCount", "limit"), ("limitOffset", "offset")):
                number = _param(getattr(node, attr, None))
                if number is not None:
                    seen.add(number)
                    found.append(Slot(number, role))
        if not isinstance(node, ast.A_Expr):
            continue
        op = str(node.name[-1].sval) if node.name else ""
        kind = node.kind
        if kind == enums.A_Expr_Kind.AEXPR_IN and isinstance(node.rexpr, (list, tuple)):
            for item in node.rexpr:
                number = _param(item)
                if number is not None:
                    add(number, "eq", _column(node.lexpr))
        elif kind in (enums.A_Expr_Kind.AEXPR_BETWEEN, enums.A_Expr_Kind.AEXPR_NOT_BETWEEN) \
                and isinstance(node.rexpr, (list, tuple)):
            for item, role in zip(node.rexpr, ("lower", "upper"), strict=False):
                number = _param(item)
                if number is not None:
                    add(number, role, _column(node.lexpr))
        elif kind in (enums.A_Expr_Kind.AEXPR_LIKE, enums.A_Expr_Kind.AEXPR_ILIKE):
            number = _param(node.rexpr)
            if number is not None:
                add(number, "like", _column(node.lexpr))
        elif kind == enums.A_Expr_Kind.AEXPR_OP:
            sides = ((node.rexpr, node.lexpr, op), (node.lexpr, node.rexpr, _FLIP.get(op, op)))
            for this, other, oper in sides:
                number = _param(this)
                if number is None:
                    continue
                use = _ROLES.get(oper)
                if use is None:
                    seen.add(number)
                    found.append(Slot(number, "eq", problem=f"${number} is an operand of {op},"
                                                            " not compared with a column"))
                else:
                    add(number, use, _column(other))
    numbers = {int(query[t.start + 1:t.end + 1]) for t in scan(query) if t.name == "PARAM"}
    for number in sorted(numbers - seen):
        found.append(Slot(number, "eq", problem=f"${number} is not compared with a column"))
    return found


# -- values (pure) ---------------------------------------------------------------------------
def _equal_values(stats: ColumnStats) -> list[str]:
    """A typical value (the histogram's middle) first, then the most common one, alternately:
    the query a task times is the usual case, and the heavy hitters are among its other sets."""
    common = [value for value, _ in common_values(stats)]
    bounds = list(stats.histogram_bounds)
    middle = len(bounds) // 2
    typical = []
    for step in range(len(bounds)):
        index = middle + (step + 1) // 2 * (1 if step % 2 else -1)
        if 0 <= index < len(bounds):
            typical.append(bounds[index])
    values = [v for pair in zip(typical, common, strict=False) for v in pair]
    values += typical[len(common):] + common[len(typical):]
    return list(dict.fromkeys(values))


def values_for(slot: Slot, tables: Mapping[str, TableInfo], count: int) -> list[str]:
    """Up to `count` SQL literals for the slot (raises CannotFill with the reason)."""
    if slot.problem:
        raise CannotFill(slot.problem)
    if slot.role == "limit":
        return [LIMIT_VALUE] * count
    if slot.role == "offset":
        return [OFFSET_VALUE] * count
    assert slot.table is not None and slot.column is not None
    info = tables[slot.table]
    data_type = next((c.data_type for c in info.columns if c.name == slot.column), None)
    stats = info.column_stats.get(slot.column)
    if stats is None or not (stats.most_common_vals or stats.histogram_bounds):
        raise CannotFill(f"${slot.number}: {slot.table}.{slot.column} has no statistics"
                         " (ANALYZE the table)")
    if slot.role == "eq":
        raw = _equal_values(stats)
    elif slot.role in ("lower", "upper"):
        points = list(stats.histogram_bounds) or sorted(stats.most_common_vals)
        raw = [quantile(points, q) for q in (LOWER if slot.role == "lower" else UPPER)]
    else:  # like
        raw = [v[:3] + "%" for v in _equal_values(stats) if v]
    raw = raw[:count] or []
    if not raw:
        raise CannotFill(f"${slot.number}: no value for {slot.table}.{slot.column}")
    while len(raw) < count:
        raw.append(raw[len(raw) % max(1, len(raw))])
    return [sql_literal(v, "text" if slot.role == "like" else data_type) for v in raw]


def substitute(query: str, values: Mapping[int, str]) -> str:
    """`query` with each $n token (not inside a string or a comment) replaced by values[n]."""
    out: list[str] = []
    last = 0
    for token in scan(query):
        if token.name != "PARAM":
            continue
        number = int(query[token.start + 1:token.end + 1])
        out.append(query[last:token.start])
        out.append(values[number])
        last = token.end + 1
    out.append(query[last:])
    return "".join(out)


def fill(query: str, tables: Mapping[str, TableInfo], count: int) -> Filled:
    """Up to `count` parameter sets for `query` (pure): the statement's own values, then others
    (a batch's: afs.config.BATCH_PARAMETER_SETS); a Filled with a reason when it cannot."""
    try:
        found = slots(query, tables)
        if not found:
            return Filled((ParameterSet("no parameters", query=query),), statement=query)
        by_number: dict[int, list[str]] = {}
        labels: dict[int, str] = {}
        columns: dict[int, str] = {}
        for slot in found:
            if slot.number in by_number:
                continue  # the first use decides ($1 used twice gets one value)
            by_number[slot.number] = values_for(slot, tables, count)
            labels[slot.number] = (f"{slot.table}.{slot.column}" if slot.table
                                   else slot.role.upper())
            if slot.table and slot.role not in ("limit", "offset"):
                columns[slot.number] = f"{slot.table}.{slot.column}"
    except CannotFill as exc:
        return Filled((), str(exc), query)
    except ParseError as exc:
        return Filled((), f"does not parse: {exc}", query)
    sets: dict[str, ParameterSet] = {}
    first: Mapping[int, str] | None = None
    for index in range(count):
        values = {n: vals[index] for n, vals in by_number.items()}
        first = first or values
        label = "; ".join(f"${n} {labels[n]} = {values[n]}" for n in sorted(values))
        filled = substitute(query, values)
        sets.setdefault(filled, ParameterSet(label, _substitutions(first, values, columns), values, filled))
    return Filled(tuple(sets.values()), statement=query)


def _bare(literal: str) -> str:
    """A literal as a query reads it: fill writes a negative number in parentheses."""
    return literal[1:-1] if literal.startswith("(") and literal.endswith(")") else literal


def _substitutions(first: Mapping[int, str], values: Mapping[int, str],
                   columns: Mapping[int, str]) -> tuple[Substitution, ...]:
    """From the first set's values to these, for each parameter compared with a column."""
    return tuple(Substitution(columns[n], _bare(first[n]), _bare(values[n]))
                 for n in sorted(values) if n in columns and values[n] != first[n])


# pg_stat_statements writes a typed literal (interval '1 day') as `interval $2`, which is not SQL
_TYPED = re.compile(r"\b(interval|date|timestamptz|timestamp|time)\s+\$(\d+)", re.IGNORECASE)


def typed_parameters(query: str) -> str:
    """`interval $2` (a normalised typed literal) as `$2::interval`."""
    return _TYPED.sub(lambda m: f"${m.group(2)}::{m.group(1)}", query)
