"""Parameter sets: the query's family, drawn from pg_stats (pure).

A fix must serve the query family, not today's literals. `parameter_sets` reads
the literals the query filters with and draws other values for them from the
statistics of the compared columns; `apply_parameters` puts those values into any
query of the family (the original, a suite variant, a proposal's rewrite);
`baked_literals` tells whether a materialized view's SELECT bakes the query's
literals in (an answer cache, never a fix). `ParameterSet` (in `afs.models`, exported
here) is also what a batch task carries: its statement's $1 … $n filled from pg_stats
(`afs.params.fill`), each set beyond the first written as substitutions of the first's
values, so `apply_parameters` moves any query of the family to them the same way.

A *filter literal* is a literal operand of a comparison in a WHERE, HAVING or
JOIN … ON clause, at any nesting level (aggregate FILTER clauses excluded):
    col = lit, col <> lit, col < lit (<=, >, >=, either side), col BETWEEN lit AND lit,
    col IN (lit, …), col LIKE / ILIKE 'pattern' (not with ESCAPE)
A literal may carry casts (`'2024-01-01'::date`, `DATE '2024-01-01'`: the cast is
kept) and a minus sign. Literals anywhere else — LIMIT / OFFSET, the select list,
function arguments such as date_trunc('month', …)'s 'month' — are never touched.

What a literal is compared with decides where its new values come from:
    equality, <>   other most common values: a frequent one, then a rarer one (a
                   histogram bound, or the least common value), alternately
    IN (n items)   n other values, in the same order of preference
    range          a lower and an upper bound on one column in one clause, or
                   BETWEEN: shifted together, width kept, to the 25th, 75th, 50th …
                   percentile of the histogram (without statistics: one width
                   later, then earlier)
    single bound   another histogram bound, by the same percentiles
    LIKE           the pattern's first literal piece replaced by as many leading
                   characters of another value (wildcards kept)
    no column      a number compared with an expression (HAVING count(*) > 5):
                   scaled ×0.5, ×2, ×0.25, ×4 …; an equality: ±1, ±2 (integers
                   stay integers, decimals keep their digits)
A number compared with a column without statistics is scaled the same way.
Values keep the literal's format: a date stays a date, a timestamp keeps its
separator, precision and zone style, and is rounded to the original's granularity
(midnight stays midnight).

Table names resolve by the one resolver (`Query.table_of`: aliases in the comparison's
query block and its enclosing ones, the catalog for an unqualified column of a block
reading several tables); a column it leaves open (a CTE's, a derived table's) belongs to
the one table of `tables` that has statistics for that name, if there is exactly one.
The query is read once (`Query`): `parameter_sets` takes it, and `apply_parameters`
remembers what it wrote, so the agents and candidates of a task that ask for the same
query with the same set get it without another reading.

Substitution is by text: a literal is found again by how it is written and by the
(unqualified) name of the column it is compared with, so a rewrite that renames the
column, or writes the literal differently ('2024-01-01 00:00' for '2024-01-01'),
shows up as a place not found.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from afs.config import PARAMETER_QUANTILES
from afs.errors import InputError
from afs.models import ColumnStats, ParameterSet, Substitution, TableInfo
from afs.pg.names import quote_literal
from afs.pg.stats import common_values, quantile
from afs.query.query import Query, local
from afs.query.text import DIALECT, first_line, parse_query, select_text

__all__ = [
    "ParameterSet",
    "Substitution",
    "apply_parameters",
    "baked_literals",
    "parameter_sets",
]

# Histogram positions a range or a bound moves to, in order of preference.
QUANTILES = PARAMETER_QUANTILES.moves  # afs.config
SCALE_FACTORS = ("0.5", "2", "0.25", "4", "0.1", "10")  # thresholds not tied to a column
STEPS = (1, -1, 2, -2, 3, -3)  # integer equalities not tied to a column; range widths w/o stats


# -- public API -----------------------------------------------------------------------


def parameter_sets(query: Query, tables: Mapping[str, TableInfo], count: int) -> tuple[ParameterSet, ...]:
    """Up to `count` other parameter sets for `query`, each different from the original
    (`Measuring.parameter_sets`: the agents pass their settings' policy).

    `tables` maps table names as the query uses them to their TableInfo (with the
    pg_stats of the compared columns). Fewer sets only when the query has no filter
    literal (then ()) or the statistics give too few values. Deterministic. Raises
    InputError unless sqlglot can read `query` as a query.
    """
    if count < 1:
        return ()
    text, tree = _readable(query)
    slots = _slots(_operands(tree, text), query, tables)
    choices = [_alternatives(slot, count) for slot in slots]
    sets: list[ParameterSet] = []
    for index in range(count):
        chosen = [alts[index] for alts in choices if len(alts) > index]
        if not chosen:
            break
        sets.append(ParameterSet("; ".join(alt.label for alt in chosen),
                                 tuple(sub for alt in chosen for sub in alt.substitutions)))
    return tuple(sets)


def apply_parameters(sql: str, pset: ParameterSet) -> str | None:
    """`sql` with the parameter set's literals in, or None when one has no place in it.

    Any query of the family will do: a literal is replaced where it is written as
    `old` in a filter and compared with a column of the same unqualified name (for
    `column=None`: compared with anything), in every branch and block. None means
    some substitution found no such literal — as for a cache of today's answer
    (`SELECT * FROM mv`). The rest of the text is kept as written; the result is
    re-parsed by pglast as exactly one SELECT. Raises InputError when `sql` is not
    one SELECT sqlglot can read, or a `new` is not a literal. Remembered by (sql,
    substitutions): computed once per task, however many agents and candidates ask.
    """
    return _applied(sql, pset.substitutions)


@functools.lru_cache(maxsize=256)
def _applied(sql: str, substitutions: tuple[Substitution, ...]) -> str | None:
    text, tree = _readable(Query.read(sql))
    operands = _operands(tree, text)
    chosen: dict[int, tuple[_Operand, str]] = {}
    for sub in substitutions:
        _check_literal(sub.new)
        name = _unqualified(sub.column)
        places = [op for op in operands if op.text == sub.old and _compared_with(op, name)]
        if not places:
            return None
        for op in places:
            chosen.setdefault(id(op.value), (op, sub.new))
    return _substituted(text, tree, list(chosen.values()))


def baked_literals(definition: str, query: str) -> tuple[str, ...]:
    """The query's filter literals that the view's `definition` also filters with.

    `definition` is the SELECT of a materialized view (a whole CREATE MATERIALIZED
    VIEW … AS SELECT is read too). A literal counts when it is written the same way
    and compared with a column of the same name (a literal the query compares with
    no column: with no column in the view either). Non-empty means the view bakes
    today's literals in. Raises InputError when either text is not a query.
    """
    query_text, query_tree = _readable(Query.read(query))
    view_text, view_tree = _read_view(definition)
    view_operands = _operands(view_tree, view_text)
    found: list[str] = []
    for op in _operands(query_tree, query_text):
        if op.text in found:
            continue
        if op.column is None:
            hit = any(v.text == op.text and v.column is None for v in view_operands)
        else:
            hit = any(v.text == op.text and _compared_with(v, op.column.name) for v in view_operands)
        if hit:
            found.append(op.text)
    return tuple(found)


def stored_rows(rewritten: str, views: Sequence[str]) -> bool:
    """Whether the rewrite returns rows stored in the proposal's materialized `views` as they
    are: it reads nothing but those views and filters nothing (no WHERE, no HAVING). Such a
    result is today's answer, stored: stale on the next write and the same whatever the
    query's values. A view that groups by the filtered columns, read with the query's filter,
    is not this."""
    names = {v.lower() for v in views}
    if not names:
        return False
    try:
        tree = Query.read(rewritten).tree
    except InputError:
        return False
    if not isinstance(tree, exp.Select):
        return False
    tables = [t.name.lower() for t in tree.find_all(exp.Table)]
    return (bool(tables) and all(t in names for t in tables)
            and not any(s.args.get("where") or s.args.get("having") for s in tree.find_all(exp.Select)))


# -- reading the query ------------------------------------------------------------------

_BINARY: dict[type[exp.Expr], tuple[str, str]] = {  # operator, and as seen from the other side
    exp.EQ: ("=", "="), exp.NEQ: ("<>", "<>"),
    exp.NullSafeEQ: ("IS NOT DISTINCT FROM", "IS NOT DISTINCT FROM"),
    exp.NullSafeNEQ: ("IS DISTINCT FROM", "IS DISTINCT FROM"),
    exp.GT: (">", "<"), exp.GTE: (">=", "<="), exp.LT: ("<", ">"), exp.LTE: ("<=", ">="),
}
_EQUALITY = ("=", "<>", "IS NOT DISTINCT FROM", "IS DISTINCT FROM")
_LOWER = (">", ">=")
_UPPER = ("<", "<=")


def _readable(query: Query) -> tuple[str, exp.Expr]:
    """The query's text and its tree (shared: never edited in place), or InputError."""
    if query.tree is None:
        raise InputError(f"cannot read the query: {query.problem}")
    if not isinstance(query.tree, exp.Query):
        raise InputError(f"sqlglot reads it as {type(query.tree).__name__}, not a query")
    return query.text, query.tree


def _read_view(definition: str) -> tuple[str, exp.Expr]:
    """The SELECT of a view: `definition` itself, or the query of CREATE … VIEW … AS."""
    try:
        return _readable(Query.read(definition))
    except InputError as not_a_query:
        try:
            created = parse_query(definition.strip().rstrip(";"))
        except SqlglotError:
            raise not_a_query from None
        body = created.expression if isinstance(created, exp.Create) else None
        if not isinstance(body, exp.Query):
            raise not_a_query from None
        return _readable(Query.read(body.sql(dialect=DIALECT)))


@dataclass(frozen=True, eq=False)
class _Operand:
    """A filter literal and what it is compared with."""

    value: exp.Expr  # the Literal, or Neg(Literal), that a substitution replaces (casts kept)
    subject: exp.Expr  # the other side, casts stripped
    operator: str  # as if the subject were on the left: "=", "<", "BETWEEN", "IN", "LIKE", …
    comparison: exp.Expr
    root: exp.Expr  # the WHERE, HAVING or ON condition it is in
    text: str  # the literal as written
    span: tuple[int, int] | None  # where it is written: text[start:end]

    @property
    def column(self) -> exp.Column | None:
        subject = self.subject
        return subject if isinstance(subject, exp.Column) and not subject.is_star else None

    @property
    def position(self) -> int:
        return self.span[0] if self.span is not None else 1 << 30


def _filter_roots(tree: exp.Expr) -> Iterator[exp.Expr]:
    for node in tree.find_all(exp.Where, exp.Having, exp.Join):
        if isinstance(node, exp.Join):
            on = node.args.get("on")
            if isinstance(on, exp.Expr):
                yield on
        elif not isinstance(node.parent, exp.Filter):  # count(*) FILTER (WHERE …): select list
            yield node


def _operands(tree: exp.Expr, text: str) -> list[_Operand]:
    """The filter literals of `tree`, in the order they are written."""
    found: list[_Operand] = []
    seen: set[int] = set()
    for root in _filter_roots(tree):
        for node in local(root):
            if id(node) in seen:
                continue
            seen.add(id(node))
            for value, subject, operator in _compared(node):
                written, span = _written(value, text)
                found.append(_Operand(value, subject, operator, node, root, written, span))
    found.sort(key=lambda op: op.position)
    return found


def _compared(node: exp.Expr) -> Iterator[tuple[exp.Expr, exp.Expr, str]]:
    """(literal, subject, operator) of each literal operand of a comparison."""
    if type(node) in _BINARY:
        operator, flipped = _BINARY[type(node)]
        left, right = _value_node(node.this), _value_node(node.expression)
        if right is not None and left is None:
            yield right, _stripped(node.this), operator
        elif left is not None and right is None:
            yield left, _stripped(node.expression), flipped
    elif isinstance(node, exp.Between) and _value_node(node.this) is None:
        for key in ("low", "high"):
            value = _value_node(node.args.get(key))
            if value is not None:
                yield value, _stripped(node.this), "BETWEEN"
    elif isinstance(node, exp.In) and _value_node(node.this) is None:
        for item in node.expressions:
            value = _value_node(item)
            if value is not None:
                yield value, _stripped(node.this), "IN"
    elif isinstance(node, exp.Like | exp.ILike) and not isinstance(node.parent, exp.Escape):
        value = _value_node(node.expression)
        if isinstance(value, exp.Literal) and value.is_string:
            yield value, _stripped(node.this), "ILIKE" if isinstance(node, exp.ILike) else "LIKE"


def _stripped(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Cast | exp.Paren):
        node = node.this
    return node


def _value_node(node: object) -> exp.Expr | None:
    """The literal a substitution replaces, when `node` is one (casts aside)."""
    if not isinstance(node, exp.Expr):
        return None
    node = _stripped(node)
    if isinstance(node, exp.Literal):
        return node
    if isinstance(node, exp.Add | exp.Sub) and isinstance(_stripped(node.expression), exp.Interval):
        # '2024-06-01'::date + interval '1 day': a bound derived from the literal moves with it
        return _value_node(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return node
    return None


def _written(value: exp.Expr, text: str) -> tuple[str, tuple[int, int] | None]:
    """How a literal is written in `text`, and where (None when sqlglot kept no position)."""
    literal = value.this if isinstance(value, exp.Neg) else value
    start, end = literal.meta.get("start"), literal.meta.get("end")
    if isinstance(start, int) and isinstance(end, int):
        written = text[start:end + 1]
        plausible = (written[:1] == "'" == written[-1:] if literal.is_string
                     else written == str(literal.this))
        if isinstance(value, exp.Neg):
            minus = start - 1
            while minus >= 0 and text[minus].isspace():
                minus -= 1
            plausible = plausible and minus >= 0 and text[minus] == "-"
            start, written = minus, "-" + written
        if plausible:
            return written, (start, end + 1)
    return value.sql(dialect=DIALECT), None


def _unqualified(column: str | None) -> str | None:
    return column.rsplit(".", 1)[-1] if column is not None else None


def _compared_with(op: _Operand, name: str | None) -> bool:
    """Whether `op` is compared with column `name` (or, for None, with anything)."""
    if name is None:
        return True
    subject = op.subject
    columns = [subject] if isinstance(subject, exp.Column) else subject.find_all(exp.Column)
    return any(column.name == name for column in columns)


# -- tables ---------------------------------------------------------------------------------


def _stats_table(query: Query, column: exp.Column, tables: Mapping[str, TableInfo]) -> str | None:
    """The table of `tables` whose statistics the column's values come from: the one
    resolver's answer, else the one table with statistics for that name (module docstring)."""
    found = query.table_of(column, tables)
    if found is not None:
        return found if found in tables else None
    owners = [name for name, info in tables.items() if column.name in info.column_stats]
    return owners[0] if len(owners) == 1 else None


# -- slots: the literals that vary together ---------------------------------------------------

_SlotKind = Literal["equality", "in", "range", "bound", "like", "loose"]


@dataclass(frozen=True)
class _Slot:
    kind: _SlotKind
    column: str | None  # "orders.status", or the bare name when the table is unknown
    stats: ColumnStats | None
    operands: tuple[_Operand, ...]


def _slots(operands: Sequence[_Operand], query: Query,
           tables: Mapping[str, TableInfo]) -> list[_Slot]:
    by_comparison: dict[int, list[_Operand]] = {}
    for op in operands:
        by_comparison.setdefault(id(op.comparison), []).append(op)
    slots: list[_Slot] = []
    bounds: dict[tuple[int, str], list[_Operand]] = {}  # (clause, column) -> single bounds
    where: dict[str, tuple[str, ColumnStats | None]] = {}
    for ops in by_comparison.values():
        first = ops[0]
        column = first.column
        if column is None:
            slots += [_Slot("loose", None, None, (op,)) for op in ops]
            continue
        table = _stats_table(query, column, tables)
        label = f"{table}.{column.name}" if table else column.name
        stats = tables[table].column_stats.get(column.name) if table else None
        if first.operator == "BETWEEN" and len(ops) == 2:
            slots.append(_Slot("range", label, stats, (ops[0], ops[1])))
        elif first.operator == "IN":
            slots.append(_Slot("in", label, stats, tuple(ops)))
        elif first.operator in ("LIKE", "ILIKE"):
            slots.append(_Slot("like", label, stats, (first,)))
        elif first.operator in _EQUALITY:
            slots.append(_Slot("equality", label, stats, (first,)))
        else:
            key = f"{label}|{column.table}"
            bounds.setdefault((id(first.root), key), []).extend(ops)
            where[key] = (label, stats)
    for (_, key), ops in bounds.items():
        label, stats = where[key]
        lows = [op for op in ops if op.operator in _LOWER]
        highs = [op for op in ops if op.operator in _UPPER]
        if len(lows) == 1 and len(highs) == 1:
            slots.append(_Slot("range", label, stats, (lows[0], highs[0])))
        else:
            slots += [_Slot("bound", label, stats, (op,)) for op in ops]
    slots.sort(key=lambda slot: min(op.position for op in slot.operands))
    return _unambiguous(slots, operands)


def _unambiguous(slots: list[_Slot], operands: Sequence[_Operand]) -> list[_Slot]:
    """Drop slots whose literals a substitution could not tell from another slot's.

    apply_parameters finds a literal by its text and its column's name: a second
    slot with the same (name, text) would receive the first one's value anyway, and
    a literal compared with no column must not be written like any compared with one.
    """
    tied = {op.text for op in operands if op.column is not None}
    claimed: set[tuple[str | None, str]] = set()
    kept: list[_Slot] = []
    for slot in slots:
        keys = {(op.column.name if op.column is not None else None, op.text) for op in slot.operands}
        if keys & claimed or (slot.kind == "loose" and slot.operands[0].text in tied):
            continue
        claimed |= keys
        kept.append(slot)
    return kept


# -- literal formats ----------------------------------------------------------------------------

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})(?P<sep>[ T])(?P<time>\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)"
    r"\s*(?P<zone>Z|[+-]\d{2}(?::?\d{2})?)?")
_INTEGER = re.compile(r"-?\d+")
_Kind = Literal["date", "timestamp", "integer", "decimal", "text"]
_Value = date | datetime | Decimal | str


@dataclass(frozen=True)
class _Shape:
    """How a literal is written, so that new values are written alike."""

    kind: _Kind
    sep: str = " "
    timespec: str = "seconds"  # "minutes" | "seconds" | "microseconds"
    zone: str | None = None  # "Z", "short" (+02), "long" (+02:00); None: no zone written
    tz: tzinfo | None = None
    step: str = ""  # a timestamp's granularity: "day", "minute", "second" or ""
    digits: int = 0  # a decimal's digits after the point


def _shape(op: _Operand) -> tuple[_Shape, _Value] | None:
    """The format and the value of a literal operand (None: not a literal we can vary)."""
    literal = op.value.this if isinstance(op.value, exp.Neg) else op.value
    if not isinstance(literal, exp.Literal):
        return None
    if not literal.is_string:
        number = _decimal(op.text)
        if number is None:
            return None
        if _INTEGER.fullmatch(op.text.replace(" ", "")):
            return _Shape("integer"), number
        digits = max(0, -int(number.as_tuple().exponent))
        return _Shape("decimal", digits=digits), number
    raw = str(literal.this)
    if _DATE.fullmatch(raw):
        shape = _Shape("date")
    elif (match := _TIMESTAMP.fullmatch(raw)) is not None:
        clock = match["time"]
        timespec = "minutes" if len(clock) == 5 else "seconds" if len(clock) == 8 else "microseconds"
        zone = match["zone"]
        style = None if zone is None else "Z" if zone == "Z" else "short" if len(zone) == 3 else "long"
        try:
            parsed = datetime.fromisoformat(f"{match['date']}T{clock}{zone or ''}")
        except ValueError:
            return _Shape("text"), raw
        step = ("day" if parsed.time() == datetime.min.time()
                else "minute" if parsed.second == parsed.microsecond == 0
                else "second" if parsed.microsecond == 0 else "")
        shape = _Shape("timestamp", match["sep"], timespec, style, parsed.tzinfo, step)
    else:
        return _Shape("text"), raw
    value = _read(shape, raw)
    return (shape, value) if value is not None else (_Shape("text"), raw)


def _decimal(text: str) -> Decimal | None:
    try:
        number = Decimal(text.replace(" ", ""))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _read(shape: _Shape, raw: str) -> _Value | None:
    """A value as pg_stats prints it (or as a literal holds it), in the literal's shape."""
    raw = raw.strip()
    if shape.kind in ("integer", "decimal"):
        number = _decimal(raw)
        return None if number is None else _quantized(shape, number)
    if shape.kind == "text":
        return raw
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:  # infinity, BC dates, a non-ISO DateStyle
        return None
    if shape.kind == "date":
        return stamp.date()
    if shape.tz is not None:
        stamp = stamp.astimezone(shape.tz) if stamp.tzinfo is not None else stamp.replace(tzinfo=shape.tz)
    else:
        stamp = stamp.replace(tzinfo=None)
    if shape.step == "day":
        return stamp.replace(hour=0, minute=0, second=0, microsecond=0)
    if shape.step == "minute":
        return stamp.replace(second=0, microsecond=0)
    if shape.step == "second":
        return stamp.replace(microsecond=0)
    return stamp


def _quantized(shape: _Shape, number: Decimal) -> Decimal | None:
    try:
        return number.quantize(Decimal(1).scaleb(-shape.digits), rounding=ROUND_HALF_EVEN)
    except InvalidOperation:
        return None


def _render(shape: _Shape, value: _Value) -> str:
    """SQL text of a literal of `shape` holding `value`."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime):
        text = value.date().isoformat() + shape.sep + value.time().isoformat(shape.timespec)
        offset = value.utcoffset()
        if shape.zone is not None and offset is not None:
            text += _zone(shape.zone, offset)
        return quote_literal(text)
    if isinstance(value, date):
        return quote_literal(value.isoformat())
    return quote_literal(value)


def _zone(style: str, offset: timedelta) -> str:
    seconds = int(offset.total_seconds())
    if style == "Z" and seconds == 0:
        return "Z"
    sign = "-" if seconds < 0 else "+"
    hours, minutes = divmod(abs(seconds) // 60, 60)
    if style == "short" and minutes == 0:
        return f"{sign}{hours:02d}"
    return f"{sign}{hours:02d}:{minutes:02d}"


def _check_literal(text: str) -> None:
    """Raise InputError unless `text` is one literal (a substitution never inserts more)."""
    try:
        node = sqlglot.parse_one(text, dialect=DIALECT)
    except SqlglotError as exc:
        raise InputError(f"not a literal: {text!r} ({first_line(exc)})") from exc
    if _value_node(node) is not node:
        raise InputError(f"not a literal: {text!r}")


# -- alternatives -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Alt:
    label: str
    substitutions: tuple[Substitution, ...]


def _alternatives(slot: _Slot, count: int) -> list[_Alt]:
    """Up to `count` other values for the slot's literals, best first, each different."""
    if slot.kind == "range":
        return _range(slot, count)
    if slot.kind == "in":
        return _in_list(slot, count)
    if slot.kind == "like":
        return _like(slot, count)
    op = slot.operands[0]
    read = _shape(op)
    if read is None:
        return []
    shape, _ = read
    if slot.stats is not None:
        if slot.kind == "equality":
            found = _common(slot.stats, shape, exclude={op.text})
        else:
            found = _percentiles(_points(slot.stats, shape), shape, exclude={op.text})
        if found:
            subject = slot.column or "?"
            return [_Alt(f"{subject} {op.operator} {new} ({how})", (_sub(slot, op, new),))
                    for new, how in found[:count]]
    return _loose(slot, op, count)


def _sub(slot: _Slot, op: _Operand, new: str) -> Substitution:
    return Substitution(slot.column, op.text, new)


def _common(stats: ColumnStats, shape: _Shape, exclude: set[str]) -> list[tuple[str, str]]:
    """Other values for an equality: a frequent one, then a rarer one, alternately."""
    frequent: list[tuple[str, str]] = []
    for raw, share in common_values(stats):
        value = _read(shape, raw)
        if value is not None:
            how = f"a common value, {share:.0%} of rows" if share is not None else "a common value"
            frequent.append((_render(shape, value), how))
    frequent = _distinct(frequent, exclude)
    bounds = [_render(shape, v) for v in (_read(shape, raw) for raw in stats.histogram_bounds)
              if v is not None]
    rare = _distinct([(bounds[i], "a rarer value") for i in _spread(len(bounds))],
                     exclude | {new for new, _ in frequent})
    if not rare:
        rare = [(new, "a rare value") for new, _ in reversed(frequent)]
    mixed = [pair for pairs in zip(frequent, rare, strict=False) for pair in pairs]
    shorter = min(len(frequent), len(rare))
    mixed += frequent[shorter:] + rare[shorter:]
    return _distinct(mixed, exclude)


def _distinct(pairs: Iterable[tuple[str, str]], exclude: set[str]) -> list[tuple[str, str]]:
    seen = set(exclude)
    found: list[tuple[str, str]] = []
    for new, how in pairs:
        if new not in seen:
            seen.add(new)
            found.append((new, how))
    return found


def _spread(n: int) -> list[int]:
    """Indices 0 … n-1: the middle, the quartiles, … then the rest in order."""
    if n == 0:
        return []
    first = [round(q * (n - 1)) for q in (0.5, *QUANTILES)]
    return list(dict.fromkeys([*first, *range(n)]))


def _points(stats: ColumnStats, shape: _Shape) -> list[_Value]:
    """The column's distribution as ordered values: the histogram, else the sorted MCVs."""
    values = [v for v in (_read(shape, raw) for raw in stats.histogram_bounds) if v is not None]
    if len(values) >= 2:
        return values
    common = [v for v in (_read(shape, raw) for raw in stats.most_common_vals) if v is not None]
    try:
        return sorted(common)
    except TypeError:  # zoned and unzoned timestamps
        return []


def _percentiles(points: Sequence[_Value], shape: _Shape, exclude: set[str]) -> list[tuple[str, str]]:
    if not points:
        return []
    found = [(_render(shape, quantile(points, q)), f"the {round(q * 100)}th percentile")
             for q in QUANTILES]
    return _distinct(found, exclude)


def _in_list(slot: _Slot, count: int) -> list[_Alt]:
    reads = [_shape(op) for op in slot.operands]
    if slot.stats is None or any(r is None for r in reads) or not reads:
        return _loose_list(slot, count)
    shape = reads[0][0] if reads[0] is not None else _Shape("text")
    exclude = {op.text for op in slot.operands}
    values = [new for new, _ in _common(slot.stats, shape, exclude)]
    size = len(slot.operands)
    if len(values) < size:
        return _loose_list(slot, count)
    alts: list[_Alt] = []
    windows: list[list[str]] = []
    for index in range(count):
        start = min(index * size, len(values) - size)
        window = values[start:start + size]
        if window in windows:
            break
        windows.append(window)
        subs = tuple(_sub(slot, op, new) for op, new in zip(slot.operands, window, strict=True))
        alts.append(_Alt(f"{slot.column} IN ({', '.join(window)}): other common values", subs))
    return alts


def _loose_list(slot: _Slot, count: int) -> list[_Alt]:
    """An IN list of numbers without statistics: every item moved alike."""
    per_item = [_loose(slot, op, count) for op in slot.operands]
    alts: list[_Alt] = []
    for index in range(count):
        if not all(len(alts_of_item) > index for alts_of_item in per_item):
            break
        subs = tuple(item[index].substitutions[0] for item in per_item)
        alts.append(_Alt(f"{slot.column} IN ({', '.join(s.new for s in subs)})", subs))
    return alts


def _loose(slot: _Slot, op: _Operand, count: int) -> list[_Alt]:
    """A number without statistics: scaled (an equality not tied to a column: ±1, ±2 …)."""
    read = _shape(op)
    if read is None or read[0].kind not in ("integer", "decimal"):
        return []
    shape, value = read
    assert isinstance(value, Decimal)
    found: list[tuple[str, str]] = []
    if slot.column is None and op.operator in (*_EQUALITY, "IN") and shape.kind == "integer":
        found += [(_render(shape, value + step), f"{step:+d}") for step in STEPS]
    for factor in SCALE_FACTORS:
        scaled = _quantized(shape, value * Decimal(factor))
        if scaled is not None:
            found.append((_render(shape, scaled), f"×{factor}"))
    if shape.kind == "integer":
        found += [(_render(shape, value + step), f"{step:+d}") for step in STEPS]
    subject = slot.column or "threshold"
    why = " (no statistics)" if slot.column is not None else ""
    return [_Alt(f"{subject} {op.operator} {new} ({how}{why})", (_sub(slot, op, new),))
            for new, how in _distinct(found, {op.text})[:count]]


def _range(slot: _Slot, count: int) -> list[_Alt]:
    """Both bounds moved together, the width kept."""
    low, high = slot.operands
    read_low, read_high = _shape(low), _shape(high)
    if read_low is None or read_high is None or read_low[0].kind != read_high[0].kind:
        return _alternatives(_Slot("bound", slot.column, slot.stats, (low,)), count)
    shape, lo = read_low
    _, hi = read_high
    moved: list[tuple[_Value, _Value, str]] = []
    if shape.kind == "text":
        moved = _text_ranges(slot.stats, shape, str(lo), str(hi))
    else:
        width = _difference(lo, hi)
        points = _points(slot.stats, shape) if slot.stats is not None else []
        inside: list[tuple[_Value, _Value, str]] = []
        past: list[tuple[_Value, _Value, str]] = []
        for q in QUANTILES:
            start = points[round(q * (len(points) - 1))] if points else None
            end = _plus(start, width, 1) if start is not None else None
            if start is None or end is None:
                continue
            within = _not_after(end, points[-1])
            (inside if within else past).append((start, end, f"shifted to the {round(q * 100)}th percentile"))
        moved = inside + past
        if not moved:
            for step in STEPS:
                start, end = _plus(lo, width, step), _plus(hi, width, step)
                if start is not None and end is not None:
                    later = "later" if step > 0 else "earlier"
                    moved.append((start, end, f"moved {abs(step)} width{'s' * (abs(step) > 1)} {later}"))
    alts: list[_Alt] = []
    seen = {(low.text, high.text)}
    for start, end, how in moved:
        pair = (_render(shape, start), _render(shape, end))
        if pair in seen:
            continue
        seen.add(pair)
        label = f"{slot.column} range {how} ({pair[0]} … {pair[1]})"
        alts.append(_Alt(label, (_sub(slot, low, pair[0]), _sub(slot, high, pair[1]))))
        if len(alts) == count:
            break
    return alts


def _difference(lo: _Value, hi: _Value) -> timedelta | Decimal | None:
    if isinstance(lo, datetime) and isinstance(hi, datetime):
        try:
            return hi - lo
        except TypeError:  # zoned and unzoned
            return None
    if isinstance(lo, date) and isinstance(hi, date) and not isinstance(lo, datetime) \
            and not isinstance(hi, datetime):
        return hi - lo
    if isinstance(lo, Decimal) and isinstance(hi, Decimal):
        return hi - lo
    return None


def _plus(value: _Value | None, width: timedelta | Decimal | None, times: int) -> _Value | None:
    try:
        if isinstance(width, timedelta) and isinstance(value, date):
            return value + width * times
        if isinstance(width, Decimal) and isinstance(value, Decimal):
            return value + width * times
    except OverflowError:
        return None
    return None


def _not_after(value: _Value, last: _Value) -> bool:
    try:
        return bool(value <= last)  # type: ignore[operator]  # one shape: values of one type
    except TypeError:
        return False


def _text_ranges(stats: ColumnStats | None, shape: _Shape, lo: str,
                 hi: str) -> list[tuple[_Value, _Value, str]]:
    """Text bounds: as many histogram steps apart as the original bounds span (at least one)."""
    points = [v for v in (_read(shape, raw) for raw in (stats.histogram_bounds if stats else ()))
              if isinstance(v, str)]
    if len(points) < 2:
        return []
    steps = max(1, sum(1 for p in points if lo <= p < hi))
    moved: list[tuple[_Value, _Value, str]] = []
    for q in QUANTILES:
        start = min(round(q * (len(points) - 1)), len(points) - 1 - steps)
        if start >= 0:
            moved.append((points[start], points[min(start + steps, len(points) - 1)],
                          f"shifted to the {round(q * 100)}th percentile"))
    return moved


_WILDCARDS = "%_"


def _like(slot: _Slot, count: int) -> list[_Alt]:
    """The pattern's first literal piece replaced by the start of another value."""
    op = slot.operands[0]
    literal = op.value
    pattern = str(literal.this)
    if slot.stats is None or "\\" in pattern:
        return []
    lead = len(pattern) - len(pattern.lstrip(_WILDCARDS))
    end = next((i for i in range(lead, len(pattern)) if pattern[i] in _WILDCARDS), len(pattern))
    piece, rest = pattern[lead:end], pattern[end:]
    if not piece:
        return []
    whole = end == len(pattern) and lead == 0  # no wildcard: an equality in disguise

    def fold(text: str) -> str:
        return text.lower() if op.operator == "ILIKE" else text

    found: list[tuple[str, str]] = []
    for raw, _ in _common(slot.stats, _Shape("text"), exclude=set()):
        value = raw[1:-1].replace("''", "'")
        start = value if whole else value[:len(piece)]
        if len(start) < len(piece) or any(c in start for c in _WILDCARDS + "\\"):
            continue
        if fold(start) == fold(piece):
            continue
        new_pattern = pattern[:lead] + start + rest
        how = "another value" if whole else f"the start of another value ({quote_literal(value)})"
        found.append((quote_literal(new_pattern), how))
    return [_Alt(f"{slot.column} {op.operator} {new}: {how}", (_sub(slot, op, new),))
            for new, how in _distinct(found, {op.text})[:count]]


# -- writing --------------------------------------------------------------------------------------


def _substituted(text: str, tree: exp.Expr, places: Sequence[tuple[_Operand, str]]) -> str:
    """`text` with each place's literal replaced: spliced where positions are known."""
    if all(op.span is not None for op, _ in places):
        result = text
        for op, new in sorted(places, key=lambda place: place[0].position, reverse=True):
            assert op.span is not None
            start, end = op.span
            result = result[:start] + new + result[end:]
    else:  # sqlglot kept no position: render an edited copy (the query's tree is shared)
        edited = tree.copy()
        twins = {id(node): twin for node, twin in zip(tree.walk(), edited.walk(), strict=True)}
        for op, new in places:
            twins[id(op.value)].replace(sqlglot.parse_one(new, dialect=DIALECT))
        result = edited.sql(dialect=DIALECT)
    return select_text(result)
