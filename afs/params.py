"""Parameter sets: the query family, not today's literals (pure).

A fix must serve the query with other values too. `parameter_sets` finds the literals
of the query's filters (WHERE, JOIN … ON, HAVING, at any depth) and draws other values
for them from `pg_stats` (pganalyze's workbooks call these parameter sets):

    col = v, col IN (…)     other most common values (a frequent one, then a rarer one),
                            histogram bounds when there are no most common values
    col > a [AND col < b]   both bounds moved together to another place of the histogram,
    col BETWEEN a AND b     keeping the width
    col LIKE 'abc%'         the prefix of another value, as long
    HAVING count(*) > 5     a number compared with no column: doubled, then halved

New values keep the shape of the old one (a date stays a date, an integer an integer).
`apply_parameters` puts a set's values into any query of the family: the original, a
suite variant, or a proposal's rewritten query, wherever a literal equal to the old value
is compared with a column of the same name. When a value has no place to go, it returns
None: the rewrite has the literal baked into what it reads (an answer cache).
`baked_literals` lists the query's filter literals found inside a view's own filters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import pglast
from sqlglot import exp
from sqlglot.errors import SqlglotError

from afs.errors import InputError
from afs.features import DIALECT, parse_query, select_text
from afs.models import ColumnStats, TableInfo
from afs.pg.stats import parse_timestamp

__all__ = ["ParameterSet", "Substitution", "apply_parameters", "baked_literals", "parameter_sets"]

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_LOWER = (exp.GT, exp.GTE)  # col > v: v is a lower bound (flipped when the literal is on the left)
_PATTERNS = (exp.Like, exp.ILike)
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_INTEGER = re.compile(r"^-?\d+$")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")
_FILTER_KEYS = ("where", "having")
SCALES = (2.0, 0.5)  # numbers compared with no column


@dataclass(frozen=True)
class Substitution:
    column: str | None  # the compared column's name (unqualified); None for e.g. HAVING count(*) > 5
    old: str  # the literal's value as written (without quotes)
    new: str  # the replacement value, the same kind
    is_string: bool = True


@dataclass(frozen=True)
class ParameterSet:
    label: str  # for people: "status = 'completed'; created_at from 2024-03-01"
    substitutions: tuple[Substitution, ...]


@dataclass(frozen=True)
class _Slot:
    """One literal of a filter and what it is compared with."""

    node: exp.Literal
    column: exp.Column | None
    role: str  # "eq" | "lower" | "upper" | "pattern" | "other"


# -- finding the literals of filters ------------------------------------------------------------
def _in_filter(node: exp.Expr) -> bool:
    """Inside a WHERE, HAVING or JOIN … ON of its query block (not in a select list, LIMIT, …)."""
    child, parent = node, node.parent
    while parent is not None and not isinstance(parent, exp.Select | exp.SetOperation):
        if isinstance(parent, exp.Where | exp.Having):
            return True
        if isinstance(parent, exp.Join) and child.arg_key == "on":
            return True
        if isinstance(parent, exp.Limit | exp.Offset | exp.Order | exp.Group):
            return False
        child, parent = parent, parent.parent
    return False


def _bare(node: exp.Expr | None) -> exp.Expr | None:
    while isinstance(node, exp.Paren | exp.Cast):
        node = node.this
    return node


def _column_of(node: exp.Expr | None) -> exp.Column | None:
    """The column an operand is: `col`, `t.col`, `col::date`, `(col)`."""
    bare = _bare(node)
    return bare if isinstance(bare, exp.Column) and isinstance(bare.this, exp.Identifier) else None


def _slot(literal: exp.Literal) -> _Slot | None:
    """What a filter literal is compared with, or None when it is not a comparison operand."""
    operand: exp.Expr = literal
    while isinstance(operand.parent, exp.Cast | exp.Paren | exp.Neg):
        operand = operand.parent
    parent = operand.parent
    if isinstance(parent, _COMPARISONS):
        other = parent.expression if operand.arg_key == "this" else parent.this
        column = _column_of(other)
        if isinstance(parent, exp.EQ):
            role = "eq"
        elif isinstance(parent, exp.NEQ):
            role = "other"
        else:
            lower = isinstance(parent, _LOWER)
            role = "lower" if lower == (operand.arg_key == "expression") else "upper"
        return _Slot(literal, column, role if column is not None else "other")
    if isinstance(parent, exp.In) and operand.arg_key == "expressions":
        column = _column_of(parent.this)
        return _Slot(literal, column, "eq") if column is not None else None
    if isinstance(parent, exp.Between) and operand.arg_key in ("low", "high"):
        column = _column_of(parent.this)
        role = "lower" if operand.arg_key == "low" else "upper"
        return _Slot(literal, column, role) if column is not None else None
    if isinstance(parent, _PATTERNS) and operand.arg_key == "expression":
        column = _column_of(parent.this)
        return _Slot(literal, column, "pattern") if column is not None else None
    return None


def _slots(tree: exp.Expr) -> Iterator[_Slot]:
    for literal in tree.find_all(exp.Literal):
        if not _in_filter(literal):
            continue
        slot = _slot(literal)
        if slot is None:
            continue
        if slot.column is None and (literal.is_string or slot.role != "other"):
            continue  # only numbers compared with no column (HAVING count(*) > 5) are varied
        yield slot


def _tree(sql: str) -> exp.Expr | None:
    try:
        return parse_query(select_text(sql))
    except (InputError, SqlglotError):
        return None


# -- drawing other values -------------------------------------------------------------------------
def _stats_for(column: exp.Column, tree: exp.Expr,
               tables: Mapping[str, TableInfo]) -> ColumnStats | None:
    """pg_stats of the column: through its qualifier's alias, else the one table that has it."""
    name = column.name
    aliases: dict[str, str] = {}
    for table in tree.find_all(exp.Table):
        full = ".".join(p for p in (table.db, table.name) if p)
        aliases[table.alias_or_name] = full
        aliases.setdefault(table.name, full)
    if column.table:
        info = tables.get(aliases.get(column.table, column.table))
        return info.column_stats.get(name) if info else None
    owners = [info for info in tables.values() if name in info.column_stats]
    return owners[0].column_stats[name] if len(owners) == 1 else None


def _shape(old: str, value: str) -> str | None:
    """`value` (pg_stats text) written the way `old` is: a date, an integer, a number, text."""
    if _DATE_ONLY.match(old):
        moment = parse_timestamp(value)
        return moment.date().isoformat() if moment else None
    if _INTEGER.match(old):
        try:
            return str(int(float(value)))
        except ValueError:
            return None
    if _NUMBER.match(old):
        return value if _NUMBER.match(value) else None
    if parse_timestamp(old) is not None:
        moment = parse_timestamp(value)
        if moment is None:
            return None
        has_zone = bool(re.search(r"([+-]\d{2}(:?\d{2})?|Z)$", old.strip()))
        return moment.isoformat(sep=" ") if has_zone else moment.replace(tzinfo=None).isoformat(sep=" ")
    return value


def _ordinal(text: str) -> float | None:
    if _NUMBER.match(text.strip()):
        return float(text)
    moment = parse_timestamp(text)
    return moment.timestamp() if moment else None


def _from_ordinal(old: str, value: float) -> str:
    if _NUMBER.match(old.strip()):
        return str(round(value)) if _INTEGER.match(old.strip()) else f"{value:g}"
    moment = parse_timestamp(old)
    assert moment is not None
    shifted = moment + timedelta(seconds=value - moment.timestamp())
    if _DATE_ONLY.match(old):
        return shifted.date().isoformat()
    return _shape(old, shifted.isoformat()) or shifted.isoformat(sep=" ")


def _equal_values(stats: ColumnStats, old: Sequence[str], count: int) -> list[list[str]]:
    """`count` lists of len(old) other values: frequent most common values first, then rarer ones."""
    pool = [v for v in stats.most_common_vals if v not in old]
    if len(pool) < 2 * len(old):  # the histogram adds values that are not among the most common
        bounds = list(stats.histogram_bounds)
        picks = [bounds[int(q * (len(bounds) - 1))] for q in (0.5, 0.25, 0.75, 0.1, 0.9)] if bounds else []
        pool += [v for v in dict.fromkeys(picks) if v not in old and v not in pool]
    width = len(old)
    chosen: list[list[str]] = []
    starts = [0, max(width, len(pool) - width)]  # the most common, then the rarest kept
    for start in starts[:count]:
        values = pool[start:start + width]
        if len(values) == width and values not in chosen:
            chosen.append(values)
    return chosen


def _range_values(stats: ColumnStats, bounds: Sequence[str], count: int) -> list[list[str]]:
    """Other places for one or two bounds on the histogram, the width kept."""
    points = [p for p in (_ordinal(b) for b in stats.histogram_bounds) if p is not None]
    now = [_ordinal(b) for b in bounds]
    if len(points) < 3 or any(p is None for p in now):
        return []
    current = [p for p in now if p is not None]
    chosen: list[list[str]] = []
    for quantile in (0.25, 0.6, 0.1, 0.85):
        start = points[int(quantile * (len(points) - 1))]
        if math.isclose(start, min(current)):
            continue
        shift = start - min(current)
        values = [_from_ordinal(b, p + shift) for b, p in zip(bounds, current, strict=True)]
        if values != list(bounds) and values not in chosen:
            chosen.append(values)
        if len(chosen) == count:
            break
    return chosen


def _pattern_values(stats: ColumnStats, old: str, count: int) -> list[str]:
    if not old.endswith("%") or "%" in old[:-1] or "_" in old[:-1]:
        return []
    length = len(old) - 1
    values = [*stats.most_common_vals, *stats.histogram_bounds]
    prefixes = dict.fromkeys(v[:length] for v in values if len(v) >= length)
    return [p + "%" for p in prefixes if p + "%" != old and "%" not in p and "_" not in p][:count]


def parameter_sets(query: str, tables: Mapping[str, TableInfo], count: int = 2) -> tuple[ParameterSet, ...]:
    """Up to `count` other sets of values for the query's filter literals; () without any."""
    tree = _tree(query)
    if tree is None or count <= 0:
        return ()
    by_column: dict[str, list[_Slot]] = {}
    loose: list[_Slot] = []
    for slot in _slots(tree):
        if slot.column is None:
            loose.append(slot)
        else:
            key = f"{slot.column.table}.{slot.column.name}"
            by_column.setdefault(key, []).append(slot)

    options: list[list[tuple[Substitution, ...]]] = []  # per group: its alternatives
    for slots in by_column.values():
        column = slots[0].column
        assert column is not None
        stats = _stats_for(column, tree, tables)
        if stats is None:
            continue
        name = column.name
        equal = [s for s in slots if s.role == "eq"]
        ranged = [s for s in slots if s.role in ("lower", "upper")]
        pattern = [s for s in slots if s.role == "pattern"]
        if equal:
            old = [s.node.name for s in equal]
            shaped = [[_shape(o, v) for o, v in zip(old, alt, strict=True)]
                      for alt in _equal_values(stats, old, count)]
            options.append([tuple(Substitution(name, o, v, s.node.is_string)
                                  for s, o, v in zip(equal, old, vals, strict=True) if v is not None)
                            for vals in shaped if all(v is not None for v in vals)])
        if ranged:
            old = [s.node.name for s in ranged]
            options.append([tuple(Substitution(name, o, v, s.node.is_string)
                                  for s, o, v in zip(ranged, old, alt, strict=True))
                            for alt in _range_values(stats, old, count)])
        for slot in pattern:
            options.append([(Substitution(name, slot.node.name, v, True),)
                            for v in _pattern_values(stats, slot.node.name, count)])
    for slot in loose:
        number = slot.node.name
        if not _NUMBER.match(number):
            continue
        scaled: list[tuple[Substitution, ...]] = []
        for scale in SCALES:
            value = float(number) * scale
            new = str(max(1, round(value))) if _INTEGER.match(number) else f"{value:g}"
            if new != number:
                scaled.append((Substitution(None, number, new, False),))
        options.append(scaled[:count])

    options = [o for o in options if o]
    sets: list[ParameterSet] = []
    for i in range(count):
        subs = tuple(s for alts in options if i < len(alts) for s in alts[i])
        if subs:
            sets.append(ParameterSet(_label(subs), subs))
    return tuple(sets)


def _label(subs: Sequence[Substitution]) -> str:
    parts = []
    for s in subs:
        value = f"'{s.new}'" if s.is_string else s.new
        parts.append(f"{s.column or 'a threshold'}: {s.old} → {value}")
    return "; ".join(parts)


# -- putting values into a query of the family -------------------------------------------------
def _matches(slot: _Slot, sub: Substitution) -> bool:
    if slot.node.name != sub.old or slot.node.is_string != sub.is_string:
        return False
    if sub.column is None:
        return slot.column is None
    return slot.column is not None and slot.column.name == sub.column


def apply_parameters(sql: str, pset: ParameterSet) -> str | None:
    """`sql` with the set's values in place of the old ones; None when one has no place in it."""
    tree = _tree(sql)
    if tree is None:
        return None
    slots = list(_slots(tree))
    for sub in pset.substitutions:
        hits = [slot for slot in slots if _matches(slot, sub)]
        if not hits:
            return None
        for slot in hits:
            replacement = (exp.Literal.string(sub.new) if sub.is_string
                           else exp.Literal.number(sub.new))
            slot.node.replace(replacement)
        slots = [slot for slot in slots if slot not in hits]
    text = tree.sql(dialect=DIALECT)
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError:
        return None
    if len(statements) != 1 or type(statements[0].stmt).__name__ != "SelectStmt":
        return None
    return text


def baked_literals(definition: str, query: str) -> tuple[str, ...]:
    """The query's filter literals that the view `definition` filters on itself (a cache)."""
    view, asked = _tree(definition), _tree(query)
    if view is None or asked is None:
        return ()
    wanted = {(s.node.name, s.node.is_string) for s in _slots(asked) if s.column is not None}
    found = [s.node for s in _slots(view) if (s.node.name, s.node.is_string) in wanted]
    return tuple(dict.fromkeys(n.sql(dialect=DIALECT) for n in found))
