"""gemini-2.5-pro: index design (pure).

A ranked set of index designs for the most expensive accesses in the plan: B-trees on
columns or expressions, composite keys (equality → range → sort), partial indexes for rare
constants, INCLUDE for index-only scans (and the plain key beside it), join-key indexes,
`LIKE 'prefix%'` through a pattern operator class (unless the column sorts by the C
collation), expression indexes for `lower(col) = …`, `payload ->> 'key' = …` and any other
expression PostgreSQL accepts as a key, GIN for jsonb containment and key tests, trigram
classes for `LIKE '%…%'` and ILIKE, GIN / GiST / SP-GiST for the other operators an index
serves (full text, ranges, geometry), BRIN for a large range on a column in physical order,
and the composite that springs the ORDER BY … LIMIT trap.

The kind of each index (method and operator class) is the catalog's answer: the classes the
fork's catalog lists for the operators the query uses (AnalysisContext.operator_classes, read
by afs.analysis), chosen by afs.query.opclasses (`Evidence.catalog_kind`); an extension's class is
proposed with CREATE EXTENSION only when the extension is not installed and afs.safety lets a
proposal create it. A context without the catalog (built by hand) keeps PostgreSQL's built-in
classes: the pattern classes, jsonb_path_ops for `@>` alone, pg_trgm's gin_trgm_ops.

Per table, each rule of `DESIGN_RULES` offers its designs; each rule of `SET_RULES` offers
indexes that pay only together, as one proposal: every foreign key a join walks from its
filtered tables (plus their filter keys), one index per arm of an OR across columns. The
single design sparing the most row visits is the first choice unless a set is clearly
better; the others follow, each with different DDL (`Decision.alternatives`).
`fallback_index` is the one low-risk index the other specialisations propose when their own
specialty finds nothing (its candidates: `FALLBACK_RULES`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from sqlglot import exp

from afs.brains.strategists.evidence import (
    FAST_MS,
    SMALL_TABLE_ROWS,
    WRITE_HEAVY,
    Decision,
    Evidence,
    OperatorTerm,
    covering_index,
    index_keys,
    index_method,
    insights_of,
    norm_column,
    nothing,
    predicted_improvement,
    range_estimate,
    range_text,
    time_share,
    write_risk,
)
from afs.brains.strategists.plan_fixes import MISESTIMATE_FACTOR
from afs.models import (
    AgentKey,
    AnalysisContext,
    ColumnUse,
    EstimatedImpact,
    IndexInfo,
    OptimizationProposal,
    ProposalType,
    RiskLevel,
    TableInfo,
)
from afs.pg.bottleneck import bottlenecks
from afs.pg.names import ident, index_name, qualified, quote_literal, relation_name, schema_and_relation
from afs.pg.plan import fmt_count, fmt_ms, fmt_pct, shorten
from afs.pg.stats import (
    DEFAULT_CONTAIN_SEL,
    DEFAULT_EQ_SEL,
    DEFAULT_MATCH_SEL,
    DEFAULT_RANGE_SEL,
    JSON_VALUE_WIDTH,
    btree_mb,
    column_type,
    column_width,
    distinct_values,
    equality_selectivity,
    gin_mb,
    like_prefix,
    orders_like_c,
    pattern_opclass,
    pattern_runs,
    prefix_fraction,
    value_matches,
)
from afs.query.opclasses import IndexKind, brin_fits, catalog_type, support_key
from afs.query.shape import Disjunction, IndexablePredicate

MIN_BENEFIT_ROWS: Final = 1_000  # an index must spare at least this many row visits
INDEX_MAX_FRACTION: Final = 0.2  # an index lookup beats a scan below ~20 % of the rows
JOIN_MAX_FRACTION: Final = 0.1  # a nested loop over an index beats a hash join below this
PARTIAL_MAX_FREQ: Final = 0.2  # a constant this rare is worth a partial index …
PARTIAL_MAX_DISTINCT: Final = 50  # … on a low-cardinality (enum-like) column
INCLUDE_MAX_COLUMNS: Final = 3
MAX_SUBPLAN_KEY: Final = 4  # key columns of the index on a SubPlan's correlation columns
INCLUDE_MAX_TEXT_WIDTH: Final = 16  # avg bytes (pg_stats avg_width) of a text narrow enough to INCLUDE
MIN_IMPROVEMENT: Final = 10.0  # percent: the consensus gate; less is not worth proposing
MAX_CANDIDATES: Final = 8  # the first choice and alternatives; an agent screens Measuring.candidates of
# them, the rest go to measuring slots whose design another agent of the squad measures (afs.agents)
TRAP_REMOVED_RATIO: Final = 10.0  # an index walk in sort order that filters this many rows per row kept
SET_EXTRA_SHARE: Final = 0.2  # a set of indexes leads when the tables it adds take this share of the time
SET_EXTRA_ROWS: Final = 0.25  # … or visit this share of the rows the best single design's table does
SET_CLEARLY_BETTER: Final = 1.5  # … or when it spares this many times the row visits of the best single
TRIGRAM_MIN_CHARS: Final = 3  # a pattern needs a run of this many characters for pg_trgm to narrow it
TRIGRAM_OPCLASS: Final = "gin_trgm_ops"
TRIGRAM_EXTENSION: Final = "pg_trgm"
_PATTERN_OPERATOR = re.compile(r"~~\*?")  # LIKE, ILIKE as EXPLAIN prints them
PATTERN_BOUNDS_MATCHED: Final = 3  # histogram bounds a pattern should match to be estimated
MIN_PATTERN_TARGET: Final = 500
MAX_STATISTICS_TARGET: Final = 10_000  # PostgreSQL's upper bound (afs.safety refuses more)
EQUALITY_OPS: Final = frozenset({"=", "==", "IN", "IS NULL", "IS"})
# types too wide (or unsortable) to carry in an index as INCLUDE columns
WIDE_TYPES: Final = ("json", "jsonb", "bytea", "xml", "tsvector", "[]")


@dataclass(frozen=True)
class KeyColumn:
    name: str  # the column; for an expression, the column it reads
    desc: bool = False
    nulls_first: bool | None = None  # None: the default for the direction
    expression: str | None = None  # an expression key, e.g. "lower(email)"
    opclass: str | None = None  # a non-default operator class, e.g. "text_pattern_ops"
    label: str | None = None  # what the index name calls the key, when not `name`

    @property
    def target(self) -> str:
        """What an existing index's key must be to serve the same lookups."""
        return self.expression or self.name

    def sql(self) -> str:
        text = f"({self.expression})" if self.expression else ident(self.name)
        if self.opclass:
            text += f" {self.opclass}"
        text += " DESC" if self.desc else ""
        if self.nulls_first is not None and self.nulls_first != self.desc:
            text += " NULLS FIRST" if self.nulls_first else " NULLS LAST"
        return text


@dataclass(frozen=True)
class IndexDesign:
    table: str
    key: tuple[KeyColumn, ...]
    kind: Literal["filter", "join", "sort"]
    fraction: float  # of the table's rows the index leads to
    benefit: float  # row visits it spares
    include: tuple[str, ...] = ()
    where: str | None = None
    where_fraction: float = 1.0  # the share of rows a partial index keeps
    reasons: tuple[str, ...] = ()
    sort_served: bool = False
    method: str = "btree"  # pg_am.amname: btree, gin, gist, spgist, brin, hash
    analyze: bool = False  # an expression key: ANALYZE gives the planner statistics on it
    extension: str | None = None  # the (trusted) extension its operator class comes from
    statistics_target: int = 0  # > 0: the key column's statistics target, raised with the index

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.key)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(k.label or k.name for k in self.key)

    def clauses(self, include: Sequence[str]) -> str:
        """What follows the table name: method, key, INCLUDE (names as given), WHERE."""
        using = f" USING {self.method}" if self.method != "btree" else ""
        text = f"{using} ({', '.join(k.sql() for k in self.key)})"
        if include:
            text += f" INCLUDE ({', '.join(include)})"
        if self.where:
            text += f" WHERE {self.where}"
        return text

    def describe(self) -> str:
        return f"{self.table}{self.clauses(self.include)}"


# One rule: the index designs one kind of access to a table calls for; it adds what it
# noticed (numbers and reasons) to the list it is given.
DesignRule: TypeAlias = Callable[[Evidence, str, list[str]], list[IndexDesign]]


def _scan_reason(ev: Evidence, table: str, rows: float) -> str:
    """What reading `table` costs now: its scans in the plan, else its size."""
    scans = ev.scans(table)
    if not scans:
        return f"{table} has {fmt_count(rows)} rows"
    return (f"{scans[0].label} visits {fmt_count(ev.scanned_rows(table))} rows to return "
            f"{fmt_count(sum(n.rows for n in scans))}")


def _planner_verdict(ev: Evidence, table: str) -> str:
    """How the plan treats `table`, said of an index that already fits."""
    return "yet the planner still chose a Seq Scan" if ev.seq_scanned(table) else "and the plan uses it"


def _selectivity_note(ev: Evidence, table: str, use: ColumnUse) -> tuple[float, str]:
    """The fraction of rows an equality predicate keeps, and where the number comes from."""
    info = ev.table(table)
    rows = float(info.rows) if info else 0.0
    stats = ev.stats(table, use.column)
    op = (use.operator or "=").upper()
    shown = f"{use.column} {op} {use.value!r}" if use.value is not None else f"{use.column} {op} ?"
    if op in ("IS NULL", "IS"):
        if stats is not None:
            return stats.null_frac, (f"{use.column} IS NULL matches {fmt_pct(stats.null_frac)} of rows "
                                     "(pg_stats null_frac)")
        return DEFAULT_EQ_SEL, f"{use.column} IS NULL: no statistics"
    if isinstance(use.value, str):
        shown = f"{use.column} = '{use.value}'"
    sel = equality_selectivity(stats, rows, use.value)
    if sel is not None and stats is not None:
        value = use.value
        in_mcv = value is not None and any(
            value_matches(v, t) for v in (value if isinstance(value, list | tuple) else [value])
            for t in stats.most_common_vals)
        source = "pg_stats MCV" if in_mcv else "pg_stats n_distinct"
        return sel, f"{shown} matches {fmt_pct(sel)} of rows ({source})"
    if info and (tuple(info.primary_key) == (use.column,) or any(
            ix.unique and tuple(norm_column(c) for c in ix.columns) == (use.column.lower(),)
            for ix in info.indexes)):
        return 1.0 / max(rows, 1.0), f"{shown} matches at most one row (unique)"
    return DEFAULT_EQ_SEL, f"{shown}: no statistics, assuming {fmt_pct(DEFAULT_EQ_SEL)}"


@dataclass(frozen=True)
class RangeChoice:
    column: str
    fraction: float
    note: str
    opclass: str | None = None  # a LIKE prefix: the pattern operator class that serves it


def _range_choice(ev: Evidence, table: str, exclude: set[str]) -> RangeChoice | None:
    """The most selective range-filtered column: a range of values, or a `LIKE 'prefix%'`
    on a text column (served by the type's pattern operator class, whatever the collation)."""
    info = ev.table(table)
    rows = float(info.rows) if info else 0.0
    by_column = {c: uses for c, uses in ev.ranges(table).items() if c not in exclude}
    patterns = _like_patterns(ev, table, exclude)
    alone = not exclude and len(by_column) + len(patterns) == 1
    best: RangeChoice | None = None
    for column, uses in by_column.items():
        frac, source = range_estimate(ev, table, column, uses, only_filter=alone)
        note = (f"{column} {range_text(uses)} keeps ~{fmt_pct(frac)} of rows "
                f"(~{fmt_count(frac * rows)}, {source})")
        if best is None or frac < best.fraction:
            best = RangeChoice(column, frac, note)
    for choice in _pattern_choices(ev, table, patterns, alone):
        if best is None or choice.fraction < best.fraction:
            best = choice
    return best


def _like_patterns(ev: Evidence, table: str, exclude: Iterable[str] = ()) -> dict[str, list[str]]:
    """column → its `LIKE 'prefix%'` patterns, for text columns a pattern operator class serves;
    only patterns the WHERE clause requires (top-level terms, not negated, not inside OR)."""
    info = ev.table(table)
    patterns: dict[str, list[str]] = {}
    for u in ev.uses(table, "range"):
        if ((u.operator or "").upper() == "LIKE" and isinstance(u.value, str) and like_prefix(u.value)
                and (table, u.column, u.value) in ev.shape.like_terms
                and u.column not in exclude and info is not None
                and _prefix_kind(ev, info, u.column) is not None):
            patterns.setdefault(u.column, []).append(u.value)
    return patterns


def column_collation(info: TableInfo, column: str) -> str | None:
    return next((c.collation for c in info.columns if c.name == column), None)


def prefix_needs(data_type: str, collation: str | None) -> list[tuple[str, str | None]]:
    """The operators through which the planner serves `LIKE 'prefix%'` (PostgreSQL's
    like_support turns the prefix into a range): `>=` / `<` when the column sorts by the C
    collation (byte order), else the pattern operators `~>=~` / `~<~`, which compare byte by
    byte whatever the collation."""
    left = catalog_type(data_type)
    return [(">=", left), ("<", left)] if orders_like_c(collation) else [("~>=~", left), ("~<~", left)]


def _prefix_kind(ev: Evidence, info: TableInfo, column: str) -> IndexKind | None:
    """The B-tree that serves `LIKE 'prefix%'` on a text column (its `opclass` None: the default
    class): the one the catalog has for the operators of `prefix_needs`; None when none has them.
    A context without the catalog keeps PostgreSQL's built-in pattern classes."""
    data_type = column_type(info, column)
    if data_type is None:
        return None
    collation = column_collation(info, column)
    if ev.catalog_read:
        return ev.catalog_kind(prefix_needs(data_type, collation), methods=("btree",))
    opclass = pattern_opclass(data_type)
    if opclass is None:
        return None
    return IndexKind("btree", None if orders_like_c(collation) else opclass)


def _prefix_opclass(ev: Evidence, info: TableInfo, column: str) -> str | None:
    kind = _prefix_kind(ev, info, column)
    return kind.opclass if kind else None


def _pattern_choices(ev: Evidence, table: str, patterns: Mapping[str, list[str]],
                     alone: bool) -> list[RangeChoice]:
    """One RangeChoice per LIKE-prefixed column: the longest prefix, its estimated fraction."""
    info = ev.table(table)
    if info is None:
        return []
    rows = float(info.rows)
    out: list[RangeChoice] = []
    for column, values in patterns.items():
        pattern = max(values, key=lambda v: len(like_prefix(v)))
        estimate = prefix_fraction(ev.stats(table, column), like_prefix(pattern), rows)
        observed = ev.observed_fraction(table) if alone else None
        if estimate is not None:
            frac, source = estimate, "pg_stats histogram"
        elif observed is not None:
            frac, source = observed, "observed in the plan"
        else:
            frac, source = DEFAULT_MATCH_SEL, f"no statistics, assuming {fmt_pct(DEFAULT_MATCH_SEL)}"
        opclass = _prefix_opclass(ev, info, column)
        how = (f"a B-tree serves the prefix with {opclass}, whatever the collation" if opclass
               else f"a plain B-tree serves the prefix: {column} sorts by the C collation")
        note = (f"{column} LIKE {quote_literal(pattern)} keeps ~{fmt_pct(frac)} of rows "
                f"(~{fmt_count(frac * rows)}, {source}); {how}")
        out.append(RangeChoice(column, frac, note, opclass))
    return out


def _sort_columns(ev: Evidence, table: str) -> tuple[KeyColumn, ...]:
    """ORDER BY as index key columns, when an index on `table` can deliver that order: by the
    catalog, a B-tree class orders each column by the sort operator PostgreSQL resolved for it
    (`<` ascending, `>` descending)."""
    sort = ev.shape.sort
    if not sort or ev.shape.grouped or ev.ctx.features.join_count > 0:
        return ()
    if not all(s.table == table and s.column for s in sort):
        return ()
    info = ev.table(table)
    if ev.catalog_read and info is not None:
        for item in sort:
            data_type = column_type(info, item.column or "")
            needs = [(">" if item.desc else "<", catalog_type(data_type) if data_type else None)]
            if ev.catalog_kind(needs, ordered=True) is None:
                return ()
    return tuple(KeyColumn(s.column or "", s.desc, s.nulls_first) for s in sort)


def _group_columns(ev: Evidence, table: str) -> tuple[KeyColumn, ...]:
    """GROUP BY as index key columns, for a query over `table` alone grouped by plain columns of
    it: after the equality columns, an index in that order feeds the groups in order (a
    GroupAggregate without a Sort or a hash table), and an ORDER BY of the same keys is free."""
    tree = ev.shape.tree
    if not isinstance(tree, exp.Select) or ev.ctx.features.join_count > 0:
        return ()
    group = tree.args.get("group")
    items = list(group.expressions) if group is not None else []
    uses = list(dict.fromkeys(u.column for u in ev.uses(table, "group")))
    if not items or len(uses) != len(items) or not all(isinstance(i, exp.Column) for i in items):
        return ()
    if [i.name.lower() for i in items] != [u.lower() for u in uses]:
        return ()  # an ordinal, an output name or a window's PARTITION BY: not plain keys
    return tuple(KeyColumn(c) for c in uses)


def _include_columns(ev: Evidence, table: str, taken: set[str]) -> tuple[str, ...]:
    if table in ev.shape.star_tables:
        return ()
    info = ev.table(table)
    others = [c for c in ev.referenced_columns(table) if c not in taken]
    if not others or len(others) > INCLUDE_MAX_COLUMNS or info is None:
        return ()
    for c in others:
        data_type = column_type(info, c)
        if data_type is None or any(w in data_type for w in WIDE_TYPES):
            return ()
        if pattern_opclass(data_type) and not _narrow_text(info, c, data_type):
            return ()
    return tuple(others)


def _narrow_text(info: TableInfo, column: str, data_type: str) -> bool:
    """A text column narrow enough to carry in INCLUDE: by pg_stats avg_width, else by its
    declared length (`varchar(8)`); plain text without statistics is not."""
    stats = info.column_stats.get(column)
    if stats is not None and stats.avg_width is not None:
        return stats.avg_width <= INCLUDE_MAX_TEXT_WIDTH
    declared = re.search(r"\((\d+)\)", data_type)
    return declared is not None and int(declared.group(1)) + 1 <= INCLUDE_MAX_TEXT_WIDTH


def _filter_design(ev: Evidence, table: str, notes: list[str]) -> IndexDesign | None:
    info = ev.table(table)
    if info is None:
        return None
    rows = float(max(info.rows, 1))
    scans = ev.scans(table)
    scanned = ev.visited_rows(table)
    first_note = len(notes)
    eq: dict[str, tuple[float, ColumnUse]] = {}
    for use in ev.uses(table, "equality"):
        if (use.operator or "=").upper() in EQUALITY_OPS and use.column not in eq:
            sel, note = _selectivity_note(ev, table, use)
            eq[use.column] = (sel, use)
            notes.append(note)
    ordered_eq = sorted(eq.items(), key=lambda kv: kv[1][0])  # most selective first
    rng = _range_choice(ev, table, set(eq))
    if rng:
        notes.append(rng.note)
    sort = tuple(s for s in _sort_columns(ev, table) if s.name not in eq)
    group = tuple(g for g in _group_columns(ev, table) if g.name not in eq)
    # a rare constant on an enum-like column becomes the partial index's WHERE
    partial: tuple[str, str, float] | None = None
    for column, (sel, use) in ordered_eq:
        predicate = ev.shape.constant_predicates.get((table, column))
        stats = ev.stats(table, column)
        nd = distinct_values(stats, rows) if stats else None
        enum_like = (use.operator or "=").upper() in ("IS NULL", "IS") or (
            nd is not None and nd <= PARTIAL_MAX_DISTINCT)
        others = len(eq) - 1 + (1 if rng else 0) + len(sort)
        if predicate and enum_like and sel <= PARTIAL_MAX_FREQ and others > 0:
            partial = (column, predicate, sel)
            notes.append(f"{column} is enum-like ({fmt_count(nd or 0)} distinct values) and the constant "
                         f"is rare: WHERE {predicate} makes the index {fmt_pct(sel)} of a full one")
            break
    key_eq = [c for c, _ in ordered_eq if partial is None or c != partial[0]]
    key = [KeyColumn(c) for c in key_eq]
    sort_served = False
    if rng and sort and sort[0].name == rng.column and rng.opclass is None:
        key.extend(sort)
        sort_served = True
    elif rng:
        key.append(KeyColumn(rng.column, opclass=rng.opclass,
                             label=f"{rng.column}_pattern" if rng.opclass else None))
        if sort and rng.opclass:
            order = ", ".join(s.sql() for s in sort)
            notes.append(f"{rng.opclass} orders {rng.column} byte by byte, not by the collation: "
                         f"the index narrows the rows and the sort by {order} stays")
        elif sort:
            notes.append(f"ORDER BY {', '.join(s.sql() for s in sort)} differs from the range "
                         f"column {rng.column}: the index narrows the rows and the sort stays")
    elif sort:
        key.extend(sort)
        sort_served = True
    if group and (eq or rng):
        # the groups in index order after the equality columns (and a range on the first group key)
        if not rng:
            key.extend(group)
        elif rng.opclass is None and group[0].name == rng.column and len(key) == len(key_eq) + 1:
            key.extend(group[1:])
        if len(key) > len(key_eq) + (1 if rng else 0):
            notes.append(f"GROUP BY {', '.join(g.name for g in group)} follows the filter in the index "
                         "key: the index feeds the groups in order (no Sort, no hash table)")
    if not key:
        return None
    fraction = math.prod(sel for sel, _ in eq.values()) * (rng.fraction if rng else 1.0)
    limit = ev.shape.limit
    if not eq and not rng:  # ORDER BY only
        if limit is None:
            notes.append(f"ORDER BY on {table} without LIMIT reads every row: an index would not help")
            return None
        fraction = min(1.0, limit / rows)
    if fraction > INDEX_MAX_FRACTION and not (sort_served and limit is not None):
        brin = _brin_design(ev, table, rng, fraction) if rng and not eq else None
        if brin is not None:
            return brin
        notes.append(f"the filters on {table} keep ~{fmt_pct(fraction)} of its {fmt_count(rows)} rows: "
                     "a B-tree would not beat a sequential scan")
        return None
    where = partial[1] if partial else None
    eq_names = [*key_eq, *([partial[0]] if partial else [])]
    rest = [k.name for k in key[len(key_eq):]]
    classes = {k.name: k.opclass for k in key if k.opclass}
    existing = (covering_index(info, eq_names, rest, opclasses=classes)
                or covering_index(info, key_eq, rest, where, opclasses=classes))
    if existing is not None:
        notes.append(f"{existing.name} already covers ({', '.join(existing.columns)}) on {table}, "
                     f"{_planner_verdict(ev, table)}")
        return None
    benefit = scanned - fraction * rows
    indexed = [n for n in scans if n.index_name]
    if indexed and benefit < MIN_BENEFIT_ROWS:
        narrowed = sum(n.rows for n in indexed)
        notes.append(f"{indexed[0].label} already narrows {table} to {fmt_count(narrowed)} rows; "
                     "a better index would save little")
        return None
    include = _include_columns(ev, table, {*eq_names, *rest})
    if include:
        notes.append(f"INCLUDE ({', '.join(include)}) carries the other columns the query reads from "
                     f"{table}, for an Index Only Scan")
    return IndexDesign(table=table, key=tuple(key), kind="filter" if eq or rng else "sort",
                       fraction=fraction, benefit=benefit, include=include, where=where,
                       where_fraction=partial[2] if partial else 1.0,
                       reasons=(_scan_reason(ev, table, rows), *notes[first_note:]),
                       sort_served=sort_served)


COMPARISONS: Final = ("<", "<=", ">", ">=", "=")  # what a range or BETWEEN resolves to


def _brin_design(ev: Evidence, table: str, rng: RangeChoice, fraction: float) -> IndexDesign | None:
    """A range too large for a B-tree, on a column in physical order: BRIN, when the catalog
    has a BRIN class for the comparisons the query makes on it (afs.query.opclasses.brin_fits)."""
    info = ev.table(table)
    data_type = column_type(info, rng.column) if info else None
    if info is None or data_type is None or rng.opclass is not None or not ev.catalog_read:
        return None
    left = catalog_type(data_type)
    needs = [(op, left) for op in COMPARISONS if support_key(op, left) in ev.ctx.operator_classes]
    stats = ev.stats(table, rng.column)
    kind = brin_fits(ev.ctx.operator_classes, needs, stats.correlation if stats else None, fraction)
    if kind is None or not needs or covering_index(info, [], [rng.column], method="brin") is not None:
        return None
    rows = float(max(info.rows, 1))
    corr = stats.correlation if stats and stats.correlation is not None else 0.0
    note = (f"{rng.note}: too many for a B-tree, but {rng.column} follows the physical row order "
            f"(correlation {corr:.2f}): a BRIN index ({kind.opclass or 'its default class'}) lets a "
            f"Bitmap Heap Scan skip the block ranges outside the range, at a fraction of a B-tree's size")
    return IndexDesign(table=table, key=(KeyColumn(rng.column, opclass=kind.opclass),), kind="filter",
                       fraction=fraction, benefit=ev.visited_rows(table) - fraction * rows,
                       reasons=(_scan_reason(ev, table, rows), note), method="brin",
                       extension=kind.extension)


def _partner_rows(ev: Evidence, partner: str) -> float:
    rows = ev.returned_rows(partner)
    if rows is not None:
        return rows
    info = ev.table(partner)
    if info is None:
        return 0.0
    sel = 1.0
    for use in ev.uses(partner, "equality"):
        sel *= _selectivity_note(ev, partner, use)[0]
    return info.rows * sel


def _join_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    info = ev.table(table)
    if info is None:
        return []
    out: list[IndexDesign] = []
    rows = float(max(info.rows, 1))
    seen: set[str] = set()
    for a, b in ev.shape.join_pairs:
        for (t, column), (partner, partner_col) in ((a, b), (b, a)):
            if t != table or column in seen:
                continue
            seen.add(column)
            if covering_index(info, [column]) is not None:
                continue
            if rows < SMALL_TABLE_ROWS:
                continue
            outer = _partner_rows(ev, partner)
            stats = ev.stats(table, column)
            nd = distinct_values(stats, rows) if stats else None
            partner_info = ev.table(partner)
            if nd is None:
                nd = float(partner_info.rows) if partner_info and partner_info.rows else rows
            expected = outer * rows / max(nd, 1.0)
            if expected > JOIN_MAX_FRACTION * rows:
                notes.append(f"join {table}.{column} = {partner}.{partner_col}: ~{fmt_count(outer)} "
                             f"{partner} rows match ~{fmt_count(expected)} of {fmt_count(rows)} {table} "
                             "rows, a hash join is right")
                continue
            scanned = ev.visited_rows(table)
            note = (f"join {table}.{column} = {partner}.{partner_col}: only ~{fmt_count(outer)} {partner} "
                    f"rows reach it, matching ~{fmt_count(expected)} of {fmt_count(rows)} {table} rows, "
                    f"but {table}.{column} has no index")
            notes.append(note)
            out.append(IndexDesign(
                table=table, key=(KeyColumn(column),), kind="join", fraction=expected / rows,
                benefit=scanned - expected,
                reasons=(f"{_scan_reason(ev, table, rows)}, to join {fmt_count(outer)} {partner} rows",
                         note + "; with one, the join becomes a nested loop of index lookups")))
    return out


def _indexable_fraction(ev: Evidence, table: str, pred: IndexablePredicate) -> tuple[float, str]:
    """The fraction of rows an expression or containment term keeps, and where the number comes
    from. pg_stats describes columns, not expressions: what the plan's Seq Scan kept comes first
    when the term is the table's only filter; then the column's statistics; then PostgreSQL's
    own defaults."""
    info = ev.table(table)
    rows = float(info.rows) if info else 0.0
    observed = ev.observed_fraction(table) if ev.only_filter(table) else None
    if observed is not None:
        return observed, "observed in the plan"
    stats = ev.stats(table, pred.column)
    if pred.kind == "equality" and not pred.from_json:
        sel = equality_selectivity(stats, rows)
        if sel is not None:
            return min(1.0, sel * pred.values), f"pg_stats n_distinct of {pred.column}"
        return min(1.0, DEFAULT_EQ_SEL * pred.values), f"no statistics, assuming {fmt_pct(DEFAULT_EQ_SEL)}"
    if pred.kind == "equality":
        return (min(1.0, DEFAULT_EQ_SEL * pred.values),
                f"no statistics on it, assuming {fmt_pct(DEFAULT_EQ_SEL)}")
    if pred.kind == "prefix":
        estimate = (prefix_fraction(stats, pred.prefix or "", rows) if not pred.from_json
                    and pred.expression and pred.expression.startswith("lower") else None)
        if estimate is not None:
            return estimate, f"pg_stats histogram of {pred.column}"
        return DEFAULT_MATCH_SEL, f"no statistics on it, assuming {fmt_pct(DEFAULT_MATCH_SEL)}"
    return DEFAULT_CONTAIN_SEL, f"no statistics on it, assuming {fmt_pct(DEFAULT_CONTAIN_SEL)}"


def _indexable_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """Expression indexes (`lower(email)`, `payload ->> 'kind'`, with text_pattern_ops for a
    LIKE prefix) and GIN indexes on jsonb or arrays (`@>`, `?`), one per term the WHERE clause
    tests alone. Terms are not combined into composite keys: each design serves one term."""
    info = ev.table(table)
    if info is None:
        return []
    rows = float(max(info.rows, 1))
    scans = ev.scans(table)
    scanned = ev.visited_rows(table)
    out: list[IndexDesign] = []
    seen: set[tuple[str, str | None, str | None]] = set()
    for pred in ev.indexable(table):
        kind, why_not = _predicate_kind(ev, info, pred)
        if kind is None:
            notes.append(f"{pred.shown}: {why_not}")
            continue
        key = KeyColumn(pred.column, expression=pred.expression, opclass=kind.opclass, label=pred.label)
        if (key.target, key.opclass, kind.method) in seen:
            continue
        seen.add((key.target, key.opclass, kind.method))
        fraction, source = _indexable_fraction(ev, table, pred)
        note = f"{pred.shown} keeps ~{fmt_pct(fraction)} of rows (~{fmt_count(fraction * rows)}, {source})"
        notes.append(note)
        if fraction > INDEX_MAX_FRACTION:
            notes.append(f"{pred.shown} keeps too many rows of {table} for an index to beat a "
                         "sequential scan")
            continue
        if kind.method != "btree":
            existing = covering_index(info, [], [pred.column], method=kind.method)
            if existing is not None and not _index_serves(ev, existing, kind.method, info, pred):
                existing = None  # e.g. jsonb_path_ops, which has no operator for `?`
        else:
            existing = covering_index(info, [], [key.target],
                                      opclasses={key.target: kind.opclass} if kind.opclass else None)
        if existing is not None:
            notes.append(f"{existing.name} already serves {pred.shown} on {table}, "
                         f"{_planner_verdict(ev, table)}")
            continue
        benefit = scanned - fraction * rows
        indexed = [n for n in scans if n.index_name]
        if indexed and benefit < MIN_BENEFIT_ROWS:
            notes.append(f"{indexed[0].label} already narrows {table}; an index for {pred.shown} "
                         "would save little")
            continue
        if kind.method != "btree":
            how = (f"a {kind.method.upper()} index on {pred.column}"
                   + (f" with {kind.opclass} (the most specialised class that serves "
                      f"{', '.join(kind.serves)}: smaller and faster than the default)"
                      if kind.opclass else "")
                   + " answers it with a Bitmap Index Scan")
        else:
            what = f"the expression {pred.expression}" + (f" with {kind.opclass}" if kind.opclass else "")
            how = (f"an index on {what} serves it (a plain index on {pred.column} cannot); ANALYZE then "
                   "gives the planner statistics on the expression")
        out.append(IndexDesign(
            table=table, key=(key,), kind="filter", fraction=fraction, benefit=benefit,
            reasons=(_scan_reason(ev, table, rows), note, f"{pred.shown}: {how}"), method=kind.method,
            analyze=pred.expression is not None, extension=kind.extension))
    return out


def _gin_needs(ev: Evidence, info: TableInfo, pred: IndexablePredicate) -> list[tuple[str, str | None]]:
    """The operators the query applies to a jsonb or array column `pred` tests, each as the
    WHERE term writes it (`@>`, `?`, `?|`, …): one index on the column must serve them all. A
    containment written the other way round (`'{…}' <@ col`) is `@>` to the planner."""
    left = catalog_type(column_type(info, pred.column) or "")
    ops = [t.operator for t in ev.operator_terms
           if t.table == pred.table and t.column == pred.column and t.expression is None]
    if any(p.kind == "containment" for p in ev.indexable(pred.table) if p.column == pred.column):
        ops.append("@>")
    return [(op, left) for op in dict.fromkeys(ops)]


def _predicate_kind(ev: Evidence, info: TableInfo,
                    pred: IndexablePredicate) -> tuple[IndexKind | None, str]:
    """The index kind for one IndexablePredicate, from the catalog: for jsonb / array tests the
    class serving every operator the query applies to the column; for a LIKE prefix of an
    expression the B-tree of `prefix_needs`; an equality on an expression, the default B-tree.
    A context without the catalog keeps what the query's shape assumed (the built-in classes)."""
    if not ev.catalog_read:
        return IndexKind(pred.method, pred.opclass), ""
    if pred.method == "gin":
        needs = _gin_needs(ev, info, pred)
        kind = ev.catalog_kind(needs)
        if kind is None:
            return None, ("no operator class in the catalog serves "
                          f"{', '.join(op for op, _ in needs)} on {pred.column}")
        return kind, ""
    if pred.kind == "prefix":
        kind = ev.catalog_kind(prefix_needs("text", column_collation(info, pred.column)),
                               methods=("btree",))
        if kind is None:
            return None, "no B-tree class in the catalog serves a LIKE prefix of it"
        return kind, ""
    return IndexKind("btree", None), ""


def _index_serves(ev: Evidence, index: IndexInfo, method: str, info: TableInfo,
                  pred: IndexablePredicate) -> bool:
    """An existing index (its first key and its class, as pg_get_indexdef prints it) serves every
    operator the query applies to the column (`_gin_needs`), by the catalog. Without the
    catalog: PostgreSQL's built-in jsonb_path_ops has no key tests."""
    if not ev.catalog_read:
        return not (pred.kind == "key_exists" and "jsonb_path_ops" in index.definition)
    return _class_serves(ev, index, method, _gin_needs(ev, info, pred))


def _class_serves(ev: Evidence, index: IndexInfo, method: str,
                  needs: Sequence[tuple[str, str | None]]) -> bool:
    """The class of an existing index's first key serves every operator of `needs`."""
    found = index_keys(index)
    first = found[0][0].split() if found and found[0] else []
    opclass = first[1] if len(first) > 1 and first[1].upper() not in ("ASC", "DESC", "NULLS") else None
    return all(ev.catalog_serves(op, left, method, opclass) for op, left in needs)


def _key_width(info: TableInfo | None, key: KeyColumn) -> int:
    if key.expression is not None and info is not None and column_type(info, key.name) in ("json", "jsonb"):
        return JSON_VALUE_WIDTH
    return column_width(info, key.name)


def drop_index(table: str, name: str) -> str:
    """The rollback of an index named `name` on `table` (an index lives in its table's schema)."""
    schema, _ = schema_and_relation(table)
    return f"DROP INDEX IF EXISTS {ident(schema) + '.' if schema else ''}{ident(name)}"


@dataclass(frozen=True)
class _Built:
    """One index of a proposal: its statements, size and what to check."""

    name: str
    commands: tuple[str, ...]
    rollback: str
    storage: float
    entries: float
    risk: RiskLevel
    warnings: tuple[str, ...]
    steps: tuple[str, ...]
    summary: str  # "Proposed: CREATE INDEX on … (type), about N entries, ~X MB; expected …"


def _design_type(design: IndexDesign) -> ProposalType:
    return ("partial_index" if design.where
            else "composite_index" if len(design.key) + len(design.include) > 1
            else "index")


def _build(ev: Evidence, design: IndexDesign, taken: Sequence[str]) -> _Built:
    info = ev.table(design.table)
    gin = design.method == "gin"
    name = index_name(design.table, design.labels,
                      suffix="idx" if design.method == "btree" else design.method,
                      taken=[*(ix.name for ix in (info.indexes if info else ())), *taken])
    sql = (f"CREATE INDEX {ident(name)} ON {qualified(design.table)}"
           f"{design.clauses([ident(c) for c in design.include])}")
    ptype = _design_type(design)
    rows = float(info.rows) if info else 0.0
    entries = rows * design.where_fraction
    widths = [_key_width(info, k) for k in design.key] + [column_width(info, c) for c in design.include]
    if gin:
        storage = gin_mb(entries, column_width(info, design.key[0].name), design.key[0].opclass)
    elif design.method == "brin":
        storage = round(max(0.02, (info.size_mb if info else 0.0) / 8 / 128 * 32 / 1024), 2)
    else:
        storage = btree_mb(entries, widths)
    risk, warnings = write_risk(ev, design.table)
    if gin:
        risk = "medium"
        warnings.append("A GIN index costs more on writes than a B-tree: each row adds several entries, "
                        "batched in a pending list that reads must also scan until it is merged.")
    elif design.method in ("gist", "spgist"):
        risk = "medium"
        warnings.append(f"A {design.method.upper()} index costs more on writes than a B-tree, and its "
                        "lookups recheck the rows they find.")
    scan = ("Bitmap Index Scan" if design.method not in ("btree", "hash")
            else "Index Only Scan" if design.include else "Index Scan (or Bitmap Index Scan)")
    steps = [f"EXPLAIN shows {scan} using {name} on {relation_name(design.table)}"]
    commands = [sql]
    if design.analyze:
        commands.append(f"ANALYZE {qualified(design.table)}")
        steps.insert(0, f"ANALYZE {relation_name(design.table)} collects statistics on the indexed "
                     "expression")
    if design.statistics_target:
        column = ident(design.key[0].name)
        commands += [f"ALTER TABLE {qualified(design.table)} ALTER COLUMN {column} "
                     f"SET STATISTICS {design.statistics_target}",
                     f"ANALYZE {qualified(design.table)} ({column})"]
        steps.append("EXPLAIN ANALYZE: the row estimate for the pattern is within "
                     f"{MISESTIMATE_FACTOR:g}× of the rows it matches")
    if design.sort_served:
        steps.append("EXPLAIN shows no Sort node above that scan")
    summary = (f"Proposed: CREATE INDEX on {design.describe()} ({ptype}), about {fmt_count(entries)} "
               f"entries, ~{storage:.1f} MB; expected to read ~{fmt_pct(design.fraction)} of "
               f"{fmt_count(rows)} rows.")
    return _Built(name, tuple(commands), drop_index(design.table, name), storage, entries, risk,
                  tuple(warnings), tuple(steps), summary)


def _extension_note(extension: str) -> str:
    return (f"The target database needs the {extension} extension (trusted, shipped with PostgreSQL): "
            f"the proposal starts with CREATE EXTENSION IF NOT EXISTS {extension}, and its rollback "
            "leaves the extension installed (other objects may use it).")


def _index_proposal(agent: AgentKey, ev: Evidence, design: IndexDesign,
                    improvement: float) -> OptimizationProposal:
    return _set_proposal(agent, ev, (design,), improvement)


def _set_proposal(agent: AgentKey, ev: Evidence, designs: Sequence[IndexDesign], improvement: float,
                  reasons: Sequence[str] = ()) -> OptimizationProposal:
    """One proposal of one or more indexes, created together (and dropped together)."""
    built: list[_Built] = []
    for design in designs:
        built.append(_build(ev, design, [b.name for b in built]))
    extensions = list(dict.fromkeys(d.extension for d in designs if d.extension))
    commands = [*(f"CREATE EXTENSION IF NOT EXISTS {e}" for e in extensions),
                *(c for b in built for c in b.commands)]
    types = {_design_type(d) for d in designs}
    ptype: ProposalType = ("partial_index" if "partial_index" in types
                           else "composite_index" if "composite_index" in types else "index")
    risk: RiskLevel = "medium" if any(b.risk == "medium" for b in built) else "low"
    warnings = list(dict.fromkeys(w for b in built for w in b.warnings))
    steps = [*(st for b in built for st in b.steps),
             "the query returns the same rows as before (count and checksum)"]
    if len(designs) == 1:
        said = [*designs[0].reasons]
    else:
        said = [*reasons, *dict.fromkeys(r for d in designs for r in d.reasons)]
    rationale = " ".join([
        *(w.rstrip(".") + "." for w in said),
        *(b.summary for b in built),
        *(_extension_note(e) for e in extensions),
        *warnings,
    ])
    resets = [c for d in designs if d.statistics_target for c in (
        f"ALTER TABLE IF EXISTS {qualified(d.table)} ALTER COLUMN {ident(d.key[0].name)} SET STATISTICS -1",
        f"ANALYZE {qualified(d.table)} ({ident(d.key[0].name)})")]
    return OptimizationProposal(
        agent=agent, proposal_type=ptype, sql_commands=tuple(commands),
        rollback_commands=(*resets, *(b.rollback for b in reversed(built))),
        rationale=rationale,
        estimated_impact=EstimatedImpact(query_time_improvement=improvement,
                                         storage_overhead_mb=round(sum(b.storage for b in built), 2),
                                         complexity="low" if len(built) == 1 else "medium", risk=risk),
        validation_steps=tuple(steps))


def _filter_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """The WHERE / ORDER BY key; when it carries INCLUDE columns, the plain key as well (smaller,
    cheaper to write; the covering one is listed first and wins a tie)."""
    found = _filter_design(ev, table, notes)
    if found is None:
        return []
    designs = [found]
    if found.include:
        designs.append(dataclasses.replace(found, include=(), reasons=tuple(
            r for r in found.reasons if not r.startswith("INCLUDE ("))))
    full = _full_form(ev, found)
    if full is not None:
        designs.append(full)
    return designs


def _full_form(ev: Evidence, design: IndexDesign) -> IndexDesign | None:
    """A partial index's full form: its WHERE column as the first key column instead, so every
    value of it is served, not only the query's constant (the measured family decides between
    them: afs.agents keeps the partial one only where the full one serves the other values no
    better). None for a design without WHERE."""
    if design.where is None:
        return None
    column = next((c for (t, c), predicate in ev.shape.constant_predicates.items()
                   if t == design.table and predicate == design.where), None)
    if column is None or column in design.columns:
        return None
    return dataclasses.replace(
        design, key=(KeyColumn(column), *design.key), where=None, where_fraction=1.0,
        reasons=(*design.reasons, f"the full form: {column} as the first key column instead of WHERE"
                                  f" {design.where}, for every value of it"))


def _trigram_index(info: TableInfo, column: str) -> IndexInfo | None:
    return next((ix for ix in info.indexes if index_method(ix) == "gin"
                 and TRIGRAM_OPCLASS in ix.definition.lower()
                 and [norm_column(c) for c in ix.columns][:1] == [column.lower()]), None)


def _pattern_kind(ev: Evidence, info: TableInfo, column: str,
                  ilike: bool) -> tuple[IndexKind | None, IndexInfo | None]:
    """The index kind that serves `LIKE` / `ILIKE` (`~~` / `~~*`) on the column itself, by the
    catalog (pg_trgm's gin_trgm_ops where it is installed, or available and trusted: then it is
    created with the index), and an existing index of that method whose class serves it.
    Without the catalog: PostgreSQL's contrib pg_trgm, created with the index."""
    if not ev.catalog_read:
        builtin = IndexKind("gin", TRIGRAM_OPCLASS, TRIGRAM_EXTENSION, TRIGRAM_EXTENSION)
        return builtin, _trigram_index(info, column)
    needs = [("~~*" if ilike else "~~", catalog_type(column_type(info, column) or ""))]
    kind = ev.catalog_kind(needs, methods=("gin", "gist", "spgist"))
    if kind is None:
        return None, None
    existing = next((ix for ix in info.indexes if index_method(ix) == kind.method
                     and [norm_column(c) for c in ix.columns][:1] == [column.lower()]
                     and _class_serves(ev, ix, kind.method, needs)), None)
    return kind, existing


def _trigram_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """`col LIKE '%abc%'` or `col ILIKE '…'` on a text column: no B-tree serves a pattern
    without a fixed prefix (or any case-insensitive one); the class the catalog has for `~~` /
    `~~*` does (pg_trgm's gin_trgm_ops), when the pattern holds a run of at least three
    characters."""
    info = ev.table(table)
    if info is None:
        return []
    rows = float(max(info.rows, 1))
    terms = [(c, p, False) for t, c, p in sorted(ev.shape.like_terms) if t == table]
    terms += [(c, p, True) for t, c, p in sorted(ev.shape.ilike_terms) if t == table]
    out: list[IndexDesign] = []
    seen: set[str] = set()
    for column, pattern, ilike in terms:
        op = "ILIKE" if ilike else "LIKE"
        shown = f"{column} {op} {quote_literal(pattern)}"
        if column in seen or (not ev.catalog_read and pattern_opclass(column_type(info, column)) is None):
            continue
        if not ilike and like_prefix(pattern):
            continue  # a B-tree serves the prefix (the filter rule)
        if max((len(r) for r in pattern_runs(pattern)), default=0) < TRIGRAM_MIN_CHARS:
            notes.append(f"{shown} has no run of {TRIGRAM_MIN_CHARS} characters: a trigram index "
                         "cannot narrow it")
            continue
        seen.add(column)
        kind, existing = _pattern_kind(ev, info, column, ilike)
        if kind is None:
            notes.append(f"{shown}: no operator class in the catalog serves {op} on {column} "
                         "(pg_trgm is neither installed nor available)")
            continue
        if existing is not None:
            notes.append(f"{existing.name} already serves {shown}, {_planner_verdict(ev, table)}")
            continue
        observed = ev.observed_fraction(table) if ev.only_filter(table) else None
        fraction, source = ((observed, "observed in the plan") if observed is not None
                            else (DEFAULT_MATCH_SEL, f"no statistics, assuming {fmt_pct(DEFAULT_MATCH_SEL)}"))
        if fraction > INDEX_MAX_FRACTION:
            notes.append(f"{shown} keeps ~{fmt_pct(fraction)} of {table}: an index would not beat a "
                         "sequential scan")
            continue
        how = "matched without case" if ilike else "without a fixed prefix"
        owner = f" ({kind.owner})" if kind.owner else ""
        note = (f"{shown} keeps ~{fmt_pct(fraction)} of rows (~{fmt_count(fraction * rows)}, {source}); "
                f"no B-tree serves a pattern {how}, "
                f"a {kind.method.upper()} index with {kind.opclass or 'its default class'}{owner} answers it "
                "with a Bitmap Index Scan")
        notes.append(note)
        design = IndexDesign(
            table=table, key=(KeyColumn(column, opclass=kind.opclass, label=f"{column}_trgm"),),
            kind="filter", fraction=fraction, benefit=ev.visited_rows(table) - fraction * rows,
            reasons=(_scan_reason(ev, table, rows), note), method=kind.method, extension=kind.extension)
        out.append(design)
        tuned = _pattern_statistics(ev, table, column, shown)
        if tuned is not None:
            target, why = tuned
            out.append(dataclasses.replace(design, statistics_target=target, reasons=(*design.reasons, why)))
    return out


def _pattern_statistics(ev: Evidence, table: str, column: str, shown: str) -> tuple[int, str] | None:
    """A statistics target that lets the planner estimate a pattern, when the plan shows it cannot.

    PostgreSQL estimates `LIKE '%…%'` / ILIKE by the share of the column's histogram bounds that
    match (selfuncs.c, histogram_selectivity; 101 bounds at the default target of 100): a pattern
    rarer than about 1 % then matches one bound or none, and its estimate is 1 % or more, or a
    floor near zero, depending on the rows ANALYZE happened to sample. Near zero, the planner takes
    the trigram index even where a sequential scan stops after a few pages (`LIMIT`), and that
    flips from one ANALYZE to the next. A target giving ~PATTERN_BOUNDS_MATCHED matching bounds
    for the fraction the plan observed makes the estimate follow the data instead."""
    for node in ev.scans(table):
        if (not node.analyzed or node.estimate_error < MISESTIMATE_FACTOR or node.scanned <= 0
                or node.rows <= 0 or not any(_PATTERN_OPERATOR.search(c) and column in c
                                             for c in node.conditions)):
            continue
        fraction = node.rows / node.scanned
        target = math.ceil(PATTERN_BOUNDS_MATCHED / fraction / 100) * 100
        target = min(MAX_STATISTICS_TARGET, max(MIN_PATTERN_TARGET, target))
        why = (f"{node.label} was estimated at {fmt_count(node.plan_rows)} rows for {shown} and returned "
               f"{fmt_count(node.rows)} ({fmt_pct(fraction)}): PostgreSQL estimates such a pattern from "
               "the share of the column's histogram bounds it matches, about 100 at the default "
               f"statistics target, too few for a pattern this rare. With SET STATISTICS {target} on "
               f"{column} (and ANALYZE of it) about {PATTERN_BOUNDS_MATCHED} bounds match, and the "
               "planner keeps a sequential scan where LIMIT stops it early instead of reading the "
               "whole trigram index. ANALYZE of the column reads more rows and pg_statistic holds a "
               "larger histogram; nothing changes on writes")
        return target, why
    return None


def _order_limit_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """The ORDER BY … LIMIT trap: the planner walks an index in sort order hoping to meet the
    filtered rows early, and filters most of what it walks away (the plan shows it), or an index
    on the sort key invites it to. A composite key (equality columns, then the sort key) finds
    the first rows in order at once."""
    shape = ev.shape
    info = ev.table(table)
    if info is None or shape.limit is None or not shape.sort or shape.grouped:
        return []
    if not all(s.table == table and s.column for s in shape.sort):
        return []
    eq = list(dict.fromkeys(u.column for u in ev.uses(table, "equality")
                            if (u.operator or "=").upper() in EQUALITY_OPS))
    sort = tuple(KeyColumn(s.column or "", s.desc, s.nulls_first) for s in shape.sort if s.column not in eq)
    if not eq or not sort:
        return []
    walks = [n for n in ev.scans(table) if n.node_type in ("Index Scan", "Index Only Scan")
             and n.removed >= TRAP_REMOVED_RATIO * max(n.rows, 1.0)]
    lead = sort[0].name.lower()
    inviting = next((ix for ix in info.indexes if ix.columns and norm_column(ix.columns[0]) == lead), None)
    if not walks and inviting is None:
        return []
    if covering_index(info, eq, [k.name for k in sort]) is not None:
        return []
    rows = float(max(info.rows, 1))
    order = ", ".join(k.sql() for k in sort)
    if walks:
        walk = walks[0]
        seen = (f"{walk.label} walks {table} in {order} order for LIMIT {shape.limit} and its Filter "
                f"removes {fmt_count(walk.removed)} rows to return {fmt_count(walk.rows)}")
    else:
        seen = (f"{inviting.name if inviting else 'an index'} lets the planner walk {table} in {order} "
                f"order for LIMIT {shape.limit}, filtering on {', '.join(eq)} as it goes: when those rows "
                "are rare or elsewhere in the order it reads most of the table")
    key = (*(KeyColumn(c) for c in eq), *sort)
    note = (f"{seen}; an index on ({', '.join(k.sql() for k in key)}) finds the first {shape.limit} "
            "matching rows in order at once")
    notes.append(note)
    fraction = min(1.0, shape.limit / rows)
    return [IndexDesign(table=table, key=key, kind="sort", fraction=fraction,
                        benefit=ev.visited_rows(table) - shape.limit,
                        reasons=(_scan_reason(ev, table, rows), note), sort_served=True)]


def _operator_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """Every other WHERE term `col op constant` (or `f(col, constants) op constant`) whose
    operator the catalog says an index serves, and no B-tree does: full text (`@@`), overlap
    and containment of ranges and geometric types (`&&`, `@>`, `<@`), network inclusion (`<<`),
    and whatever an installed extension's classes serve. One index per column or expression,
    of the kind `afs.query.opclasses.choose` picks for all the operators the query applies to it.
    The terms the other rules read (jsonb and array tests, LIKE) are theirs."""
    info = ev.table(table)
    if info is None or not ev.catalog_read:
        return []
    rows = float(max(info.rows, 1))
    theirs = {p.column for p in ev.indexable(table) if p.expression is None}
    grouped: dict[tuple[str, str | None], list[OperatorTerm]] = {}
    for term in ev.operator_terms:
        if term.table == table and not (term.expression is None and term.column in theirs):
            grouped.setdefault((term.column, term.expression), []).append(term)
    out: list[IndexDesign] = []
    for (column, expression), terms in grouped.items():
        needs = [(t.operator, t.data_type) for t in terms]
        kind = ev.catalog_kind(needs)
        if kind is None:
            continue  # nothing in the catalog serves it
        if kind.method in ("btree", "hash") and (expression is None or any(
                p.expression and _norm_target(p.expression) == _norm_target(expression)
                for p in ev.indexable(table))):
            continue  # the filter rule's B-tree, or the expression rule's
        target = expression or column
        shown = " AND ".join(t.shown for t in terms)
        existing = next((ix for ix in info.indexes if index_method(ix) == kind.method
                         and [_norm_target(c) for c in ix.columns][:1] == [_norm_target(target)]
                         and _class_serves(ev, ix, kind.method, needs)), None)
        if existing is not None:
            notes.append(f"{existing.name} already serves {shown} on {table}, {_planner_verdict(ev, table)}")
            continue
        observed = ev.observed_fraction(table) if ev.only_filter(table) else None
        default = (DEFAULT_CONTAIN_SEL if kind.method not in ("btree", "hash")
                   else DEFAULT_EQ_SEL if all(t.operator == "=" for t in terms) else DEFAULT_RANGE_SEL)
        fraction, source = ((observed, "observed in the plan") if observed is not None else
                            (default, f"no statistics, assuming {fmt_pct(default)}"))
        if fraction > INDEX_MAX_FRACTION:
            notes.append(f"{shown} keeps ~{fmt_pct(fraction)} of {table}: an index would not beat a "
                         "sequential scan")
            continue
        owner = f" ({kind.owner})" if kind.owner else ""
        if kind.method in ("btree", "hash"):
            note = (f"{shown} keeps ~{fmt_pct(fraction)} of rows (~{fmt_count(fraction * rows)}, {source}); "
                    f"a plain index on {column} cannot serve a test of {target}, an index on the "
                    "expression can (PostgreSQL accepts it as a key); ANALYZE then gives the planner "
                    "statistics on it")
        else:
            note = (f"{shown} keeps ~{fmt_pct(fraction)} of rows (~{fmt_count(fraction * rows)}, {source}); "
                    f"no B-tree serves {', '.join(dict.fromkeys(kind.serves))} on {target}, the catalog's "
                    f"{kind.method.upper()} class {kind.opclass or '(the default)'}{owner} does: a Bitmap "
                    "Index Scan answers it")
        notes.append(note)
        label = _expression_label(column, expression)
        out.append(IndexDesign(
            table=table, key=(KeyColumn(column, expression=expression, opclass=kind.opclass, label=label),),
            kind="filter", fraction=fraction, benefit=ev.visited_rows(table) - fraction * rows,
            reasons=(_scan_reason(ev, table, rows), note), method=kind.method,
            analyze=expression is not None, extension=kind.extension))
    return out


def _nearest_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """`ORDER BY col <-> constant LIMIT n` (a distance): an index whose class the catalog lists
    for ordering by that operator (pg_amop's ordering purpose: GiST's point_ops, pg_trgm's
    gist_trgm_ops, …) returns the nearest rows first, n of them instead of all rows sorted."""
    info = ev.table(table)
    limit = ev.shape.limit
    if info is None or limit is None or not ev.catalog_read:
        return []
    terms = [t for t in ev.ordering_terms if t.table == table]
    if len(terms) != 1 or len(ev.shape.sort) != 1:
        return []
    (term,) = terms
    needs = [(term.operator, term.data_type)]
    kind = ev.catalog_kind(needs, purpose="order")
    if kind is None:
        notes.append(f"ORDER BY {term.shown}: no operator class in the catalog orders by {term.operator}")
        return []
    existing = next((ix for ix in info.indexes if index_method(ix) == kind.method
                     and [_norm_target(c) for c in ix.columns][:1] == [_norm_target(term.column)]), None)
    if existing is not None and ev.catalog_serves_order(term.operator, term.data_type, existing, kind.method):
        notes.append(f"{existing.name} already orders {table} by {term.shown}, {_planner_verdict(ev, table)}")
        return []
    rows = float(max(info.rows, 1))
    owner = f" ({kind.owner})" if kind.owner else ""
    note = (f"ORDER BY {term.shown} LIMIT {limit} sorts all {fmt_count(rows)} rows of {table} by the "
            f"distance; a {kind.method.upper()} index with {kind.opclass or 'its default class'}{owner} "
            f"orders by {term.operator} itself (pg_amop) and returns the {limit} nearest first")
    notes.append(note)
    return [IndexDesign(table=table, key=(KeyColumn(term.column, opclass=kind.opclass),), kind="sort",
                        fraction=min(1.0, limit / rows), benefit=ev.visited_rows(table) - limit,
                        reasons=(_scan_reason(ev, table, rows), note), method=kind.method,
                        sort_served=True, extension=kind.extension)]


def _expression_label(column: str, expression: str | None) -> str:
    """What an index name calls an expression key: the column, then the other names in it
    (`(stamp)::date` → stamp_date, `to_tsvector('english'::regconfig, body)` → body_to_tsvector)."""
    if expression is None:
        return column
    bare = re.sub(r"'(?:[^']|'')*'(?:::[a-z ]+)?", "", expression.lower())
    words = [w for w in dict.fromkeys(re.findall(r"[a-z_][a-z0-9_]*", bare)) if w != column.lower()]
    return "_".join([column, *words[:2]])


def _norm_target(text: str) -> str:
    """An index key or a term's expression, comparable whatever the casts and spacing
    pg_get_indexdef adds (`to_tsvector('english'::regconfig, body)`)."""
    return re.sub(r"::[a-z_ ]+|[\s()\"]+", "", norm_column(text).lower())


# The designs for one large table, each rule one kind of access: the WHERE / ORDER BY
# key (equality → range → sort), the join keys, the expressions and jsonb / array tests,
# LIKE / ILIKE patterns without a prefix (trigrams), the other operators an index of the
# catalog's kind serves, ORDER BY a distance LIMIT n (nearest neighbours), the ORDER BY … LIMIT
# trap.
# The design sparing the most row visits wins (the first of equals, in this order).
def _subplan_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """A plan that was not run (a slow query): a SubPlan the planner expects to run once per outer
    row, scanning `table` each time, gets the index on its correlation columns (afs.pg.bottleneck),
    with the columns the query aggregates from `table` as INCLUDE (an index-only scan per run).
    The row visits it spares are the planner's: the scan's estimated rows, over its executions.
    (An analysed plan leaves this to the loop, which reads the plan the first design leaves.)"""
    if ev.analysed:
        return []
    info = ev.table(table)
    if info is None:
        return []
    out: list[IndexDesign] = []
    for neck in bottlenecks(ev.ctx.plan, False):
        if neck.kind != "subplan_per_row" or ev.resolver.table_key(neck.table) != table:
            continue
        key = [c for c in dict.fromkeys(neck.columns) if ev.resolver.has_column(table, c)][:MAX_SUBPLAN_KEY]
        if not key or covering_index(info, key) is not None:
            continue
        looped = [n for n in ev.scans(table) if n.loops > 1]
        if not looped:
            continue
        visits = sum(n.scanned for n in looped)
        found = sum(n.rows for n in looped)
        extra = [c for c in ev.aggregated_columns(table) if c not in key]
        include = tuple(extra) if len(extra) <= INCLUDE_MAX_COLUMNS and all(
            (t := column_type(info, c)) is not None and not any(w in t for w in WIDE_TYPES)
            for c in extra) else ()
        loops = max(n.loops for n in looped)
        note = (f"{neck.detail}: the planner expects ~{fmt_count(loops)} runs of a scan of {table} "
                f"(~{fmt_count(visits)} row visits, estimated: the plan was not run); an index on "
                f"({', '.join(key)}) makes each run a lookup of ~{fmt_count(found / loops)} rows")
        notes.append(note)
        out.append(IndexDesign(table=table, key=tuple(KeyColumn(c) for c in key), kind="filter",
                               fraction=min(1.0, found / max(visits, 1.0)), benefit=visits - found,
                               include=include, reasons=(note,)))
    return out


_RANGE_TERM: Final = re.compile(r"\(?(\w+)\.(\w+)\)?(?:::[\w ]+)?\s*(>=|<=|>|<)\s*\(?(\w+)\.(\w+)\)?")
_FLIPPED: Final = {">=": "<=", "<=": ">=", ">": "<", "<": ">"}


def _range_join_pairs(plan: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(Join Filter, pairs it compares) of every nested loop that joins by a filter: its outer
    rows times its inner side's rows per loop, actual where EXPLAIN ran it, else estimated."""

    def rows(n: Mapping[str, Any], per_loop: bool) -> float:
        if "Actual Rows" in n:
            return float(n["Actual Rows"]) * (1.0 if per_loop else float(n.get("Actual Loops") or 1))
        return float(n.get("Plan Rows") or 0)

    found: list[tuple[str, float]] = []
    stack: list[Mapping[str, Any]] = [plan]
    while stack:
        node = stack.pop()
        kids = [c for c in node.get("Plans") or () if isinstance(c, Mapping)]
        stack.extend(kids)
        if node.get("Node Type") == "Nested Loop" and node.get("Join Filter") and len(kids) == 2:
            found.append((str(node["Join Filter"]), rows(kids[0], False) * rows(kids[1], True)))
    return found


def _range_join_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """A nested loop that joins by a range (`a.x >= b.lo AND a.x <= b.hi`, a BETWEEN) compares
    every pair of rows: an index on the column bounded from both sides by the other table's
    columns turns each row of the other table into one range scan of `table`."""
    info = ev.table(table)
    if info is None or float(info.rows) < SMALL_TABLE_ROWS:
        return []
    out: list[IndexDesign] = []
    for condition, pairs in _range_join_pairs(ev.ctx.plan):
        bounds: dict[str, set[str]] = {}
        for qa, ca, op, qb, cb in _RANGE_TERM.findall(condition):
            for (q, c), (oq, oc), o in (((qa, ca), (qb, cb), op), ((qb, cb), (qa, ca), _FLIPPED[op])):
                mine, theirs = ev.resolver.table_of(q, c), ev.resolver.table_of(oq, oc)
                if mine == table and theirs not in (None, table) and ev.resolver.has_column(table, c):
                    bounds.setdefault(c, set()).add("lower" if o in (">=", ">") else "upper")
        for column, sides in bounds.items():
            if sides != {"lower", "upper"} or covering_index(info, [], [column]) is not None:
                continue
            rows = float(max(info.rows, 1))
            estimated = "" if ev.analysed else " (estimated: the plan was not run)"
            note = (f"a nested loop compares ~{fmt_count(pairs)} row pairs{estimated} to join by a range on "
                    f"{table}.{column} ({shorten(condition, 90)}): an index on {column} makes each row of "
                    "the other side one range scan")
            notes.append(note)
            out.append(IndexDesign(table=table, key=(KeyColumn(column),), kind="join",
                                   fraction=min(1.0, 1.0 / rows), benefit=pairs - rows, reasons=(note,)))
    return out


DESIGN_RULES: Final[tuple[DesignRule, ...]] = (
    _filter_designs, _join_designs, _indexable_designs, _trigram_designs, _operator_designs,
    _nearest_designs, _order_limit_designs, _subplan_designs, _range_join_designs)


# -- sets of indexes: one proposal, several CREATE INDEX ---------------------------------------
@dataclass(frozen=True)
class IndexSet:
    """Indexes that pay only together: every foreign key a join walks, every arm of an OR."""

    designs: tuple[IndexDesign, ...]
    benefit: float  # row visits spared, over all its tables
    reasons: tuple[str, ...]
    action: str


# One set rule: the index sets a query calls for, given the single-table designs found so far.
SetRule: TypeAlias = Callable[[Evidence, Sequence[IndexDesign], list[str]], list[IndexSet]]


def _own_rows(ev: Evidence, table: str) -> float | None:
    """The rows of `table` its own equality filters keep (None: it has none)."""
    info = ev.table(table)
    if info is None:
        return None
    sels = {u.column: _selectivity_note(ev, table, u)[0] for u in ev.uses(table, "equality")
            if (u.operator or "=").upper() in EQUALITY_OPS}
    return float(max(info.rows, 1)) * math.prod(sels.values()) if sels else None


def _distinct(ev: Evidence, table: str, column: str, partner: str) -> float:
    """Distinct values of a join column: pg_stats; unique → every row; else the partner's rows."""
    info = ev.table(table)
    rows = float(max(info.rows, 1)) if info else 1.0
    stats = ev.stats(table, column)
    nd = distinct_values(stats, rows) if stats else None
    if nd is not None:
        return nd
    if info and (tuple(info.primary_key) == (column,) or any(
            ix.unique and [norm_column(c) for c in ix.columns] == [column.lower()] for ix in info.indexes)):
        return rows
    other = ev.table(partner)
    return float(other.rows) if other and other.rows else rows


def _join_set(ev: Evidence, singles: Sequence[IndexDesign], notes: list[str]) -> list[IndexSet]:
    """Walk the joins from the tables the query filters: a table reached from a narrow one
    through a join column keeps few rows too, and needs an index on that column for the
    planner to look them up (a nested loop) instead of scanning it whole. Every such column
    without an index, plus the filter key of every large filtered table the walk does not
    index, is one proposal: one index alone often leaves the other scans in place."""
    pairs = ev.shape.join_pairs
    if not pairs:
        return []
    narrow: dict[str, float] = {}
    for table in ev.query_tables():
        info, own = ev.table(table), _own_rows(ev, table)
        if info is not None and own is not None and own <= JOIN_MAX_FRACTION * max(info.rows, 1):
            narrow[table] = max(1.0, own)
    edges: dict[tuple[str, str], tuple[float, str]] = {}
    for _ in range(2 * len(pairs) + 1):  # a fixpoint; each table's estimate only shrinks
        changed = False
        for a, b in pairs:
            for (table, column), (partner, partner_col) in ((a, b), (b, a)):
                info = ev.table(table)
                looped = any(n.node_type == "Seq Scan" and n.loops > 1 for n in ev.scans(table))
                if info is None or (partner not in narrow and not looped):
                    continue
                rows = float(max(info.rows, 1))
                if partner in narrow:
                    nd = _distinct(ev, table, column, partner)
                    expected = max(1.0, narrow[partner] * rows / max(nd, 1.0))
                else:  # the inner side of a nested loop, scanned once per outer row
                    expected = max(1.0, sum(n.rows / n.loops for n in ev.scans(table)))
                if expected > JOIN_MAX_FRACTION * rows:
                    continue
                if expected < narrow.get(table, math.inf) - 0.5:
                    narrow[table] = expected
                    changed = True
                if (rows >= SMALL_TABLE_ROWS and covering_index(info, [column]) is None
                        and ev.visited_rows(table) - expected >= MIN_BENEFIT_ROWS):
                    loops = max(n.loops for n in ev.scans(table)) if looped else 0.0
                    how = (f"~{fmt_count(narrow[partner])} {partner} rows reach it" if partner in narrow
                           else f"the inner side of a nested loop, scanned {fmt_count(loops)} times")
                    note = (f"join {table}.{column} = {partner}.{partner_col}: {how}, matching "
                            f"~{fmt_count(expected)} of {fmt_count(rows)} {table} rows, but {table}.{column} "
                            "has no index")
                    if (table, column) not in edges or expected < edges[(table, column)][0]:
                        edges[(table, column)] = (expected, note)
        if not changed:
            break
    designs: list[IndexDesign] = []
    for (table, column), (expected, note) in edges.items():
        info = ev.table(table)
        rows = float(max(info.rows, 1)) if info else 1.0
        designs.append(IndexDesign(
            table=table, key=(KeyColumn(column),), kind="join", fraction=expected / rows,
            benefit=ev.visited_rows(table) - expected,
            reasons=(_scan_reason(ev, table, rows), note)))
    walked = {d.table for d in designs}
    for table in dict.fromkeys(d.table for d in singles):
        if table in walked:
            continue
        best = max((d for d in singles if d.table == table and d.kind == "filter" and d.method == "btree"
                    and d.benefit >= MIN_BENEFIT_ROWS), key=lambda d: d.benefit, default=None)
        if best is not None:
            designs.append(best)
    if len(designs) < 2:
        return []
    designs.sort(key=lambda d: -d.benefit)
    benefit = sum(max(0.0, d.benefit) for d in {d.table: d for d in designs}.values())
    described = "; ".join(d.describe() for d in designs)
    notes.append(f"the joins walk {len({d.table for d in designs})} tables from the filtered ones: "
                 f"{described} together")
    start = ", ".join(f"{t} (~{fmt_count(r)} rows)" for t, r in narrow.items()
                      if _own_rows(ev, t) is not None)
    lead = (f"Walking the joins from the filtered tables {start}: each table on the way needs an "
            "index on the column it is reached by (or on its own filter), or the plan scans it whole"
            if start else "The joins scan tables whole where an index would look the rows up")
    return [IndexSet(tuple(designs), benefit, (lead,), f"Create indexes {described} together")]


def _or_fraction(ev: Evidence, disjunction: Disjunction) -> tuple[float, str]:
    table = disjunction.table
    observed = ev.observed_fraction(table) if ev.only_filter(table) else None
    if observed is not None:
        return observed, "observed in the plan"
    info = ev.table(table)
    rows = float(max(info.rows, 1)) if info else 1.0
    total = 0.0
    for column in disjunction.columns:
        sel = equality_selectivity(ev.stats(table, column), rows)
        total += sel if sel is not None else DEFAULT_EQ_SEL
    return min(1.0, total), "pg_stats n_distinct of each arm's column"


def _or_set(ev: Evidence, singles: Sequence[IndexDesign], notes: list[str]) -> list[IndexSet]:
    """`a = 1 OR b = 2` across columns: no single B-tree serves it, one index per arm does
    (the planner ORs their bitmaps). The arms' columns that no index leads with, together."""
    del singles
    out: list[IndexSet] = []
    for disjunction in ev.shape.disjunctions:
        table = disjunction.table
        info = ev.table(table)
        if info is None or max(info.rows, ev.scanned_rows(table)) < SMALL_TABLE_ROWS:
            continue
        columns = list(dict.fromkeys(disjunction.columns))
        if len(columns) < 2:
            continue  # an OR on one column is an IN list: the filter rule's
        missing = [c for c in columns if covering_index(info, [c]) is None]
        if not missing:
            notes.append(f"every arm of {disjunction.shown} has an index on {table}, "
                         f"{_planner_verdict(ev, table)}")
            continue
        fraction, source = _or_fraction(ev, disjunction)
        rows = float(max(info.rows, 1))
        if fraction > INDEX_MAX_FRACTION:
            notes.append(f"{disjunction.shown} keeps ~{fmt_pct(fraction)} of {table}: a BitmapOr would "
                         "not beat a sequential scan")
            continue
        note = (f"{disjunction.shown} keeps ~{fmt_pct(fraction)} of rows (~{fmt_count(fraction * rows)}, "
                f"{source}); no single index serves an OR across columns, one index per arm "
                f"({', '.join(missing)}{' missing' if len(missing) < len(columns) else ''}) "
                "lets the planner combine them with a BitmapOr")
        notes.append(note)
        benefit = ev.visited_rows(table) - fraction * rows
        designs = tuple(IndexDesign(table=table, key=(KeyColumn(c),), kind="filter",
                                    fraction=fraction / len(columns), benefit=benefit / len(missing),
                                    reasons=(_scan_reason(ev, table, rows), note)) for c in missing)
        out.append(IndexSet(designs, benefit, (),
                            f"Create an index per arm of {disjunction.shown}: "
                            + "; ".join(d.describe() for d in designs)))
    return out


# Index sets: several indexes as one proposal (a join walked from its filtered tables, the
# arms of an OR across columns).
SET_RULES: Final[tuple[SetRule, ...]] = (_join_set, _or_set)


def _set_improvement(ev: Evidence, designs: Sequence[IndexDesign]) -> float:
    """Predicted percent for indexes on several tables: all the time but the other tables' scans."""
    tables = {d.table for d in designs}
    total = ev.ctx.execution_ms
    if total > 0 and ev.nodes:
        others = sum(ev.scan_ms(t) for t in ev.query_tables() if t not in tables)
        share = max(0.0, min(1.0, 1.0 - others / total))
    else:
        share = 0.8
    fraction = max(d.fraction for d in designs)
    return round(max(1.0, min(90.0, 100.0 * share * (1.0 - min(1.0, fraction)))), 1)


def _clearly_better(ev: Evidence, found: IndexSet, best: IndexDesign | None) -> bool:
    """A set leads the single best design when the tables it adds take a good share of the
    time or of the row visits (what the single index leaves in place), or it spares clearly
    more."""
    if best is None or best.benefit < MIN_BENEFIT_ROWS:
        return True
    if found.benefit >= SET_CLEARLY_BETTER * best.benefit:
        return True
    extra = {d.table for d in found.designs} - {best.table}
    total = ev.ctx.execution_ms
    if total > 0 and sum(ev.scan_ms(t) for t in extra) >= SET_EXTRA_SHARE * total:
        return True
    return sum(ev.visited_rows(t) for t in extra) >= SET_EXTRA_ROWS * ev.visited_rows(best.table)


def _confidence(ev: Evidence, best: IndexDesign) -> float:
    evidence_strength = 0.55
    observed = ev.observed_fraction(best.table)
    if ev.seq_scanned(best.table) or best.kind == "join":
        evidence_strength += 0.2
    if observed is not None and observed <= INDEX_MAX_FRACTION:
        evidence_strength += 0.1
    if all(ev.stats(best.table, c) is not None for c in best.columns):
        evidence_strength += 0.1
    if ev.writes_per_read(best.table) > WRITE_HEAVY:
        evidence_strength -= 0.15
    return evidence_strength


def _single_action(design: IndexDesign) -> str:
    action = f"Create index on {design.describe()}"
    if design.kind == "join":
        action += " to turn the join into a nested loop over the index"
    return action


def _single_improvement(ev: Evidence, design: IndexDesign) -> float:
    return predicted_improvement(ev, design.table, design.fraction,
                                 whole_join=design.kind == "join" or design.sort_served)


def decide_index_design(ctx: AnalysisContext, agent: AgentKey = "gemini25pro") -> Decision:
    """gemini-2.5-pro: a ranked set of index designs for the most expensive accesses in the plan.

    The first choice is the single index sparing the most row visits (a B-tree on columns or
    expressions, with a pattern operator class for LIKE prefixes; GIN for jsonb and trigrams),
    unless an index set (`SET_RULES`) is clearly better; the alternatives are the other sets,
    then the other single designs, each with different DDL, up to MAX_CANDIDATES in all."""
    ev = Evidence(ctx)
    insights = insights_of(ev)
    notes: list[str] = []
    if 0 < ctx.execution_ms < FAST_MS and not any(n.node_type == "Seq Scan" and n.removed > MIN_BENEFIT_ROWS
                                                  for n in ev.nodes):
        return nothing(insights, f"the query already runs in {fmt_ms(ctx.execution_ms)}", 0.8,
                        ev.main_table())
    designs: list[IndexDesign] = []
    for table in ev.query_tables():
        info = ev.table(table)
        if info is None:
            continue
        if max(info.rows, ev.scanned_rows(table)) < SMALL_TABLE_ROWS:
            if ev.uses(table, "equality", "range", "join") or ev.indexable(table):
                notes.append(f"{table} has {fmt_count(info.rows)} rows: scanning it is cheap")
            continue
        for rule in DESIGN_RULES:
            designs.extend(rule(ev, table, notes))
    ranked = sorted(designs, key=lambda d: -d.benefit)  # stable: the first of equals stays first
    best = ranked[0] if ranked else None
    sets = sorted((found for rule in SET_RULES for found in rule(ev, ranked, notes)),
                  key=lambda found: -found.benefit)
    insights.extend(dict.fromkeys(notes))
    if (best is None or best.benefit < MIN_BENEFIT_ROWS) and not sets:
        why = ("no filter, sort or join column of a large table lacks a fitting index"
               if best is None
               else f"the best index would spare too few row visits (~{fmt_count(best.benefit)})")
        confident = any("already" in n for n in notes)
        return nothing(insights, why, 0.85 if confident else 0.6, ev.main_table())

    # (proposal, action, improvement, confidence, target table), the first choice first
    options: list[tuple[OptimizationProposal, str, float, float, str]] = []
    lead = next((found for found in sets if _clearly_better(ev, found, best)), None)
    if lead is not None:
        main = lead.designs[0]
        improvement = _set_improvement(ev, lead.designs)
        options.append((_set_proposal(agent, ev, lead.designs, improvement, lead.reasons), lead.action,
                        improvement, _confidence(ev, main) - 0.05, main.table))
    for design in ranked[:1] if best is not None and best.benefit >= MIN_BENEFIT_ROWS else []:
        improvement = _single_improvement(ev, design)
        options.append((_index_proposal(agent, ev, design, improvement), _single_action(design),
                        improvement, _confidence(ev, design), design.table))
    for found in sets:
        if found is not lead:
            improvement = _set_improvement(ev, found.designs)
            options.append((_set_proposal(agent, ev, found.designs, improvement, found.reasons),
                            found.action, improvement, 0.5, found.designs[0].table))
    for design in ranked[1:]:
        if design.benefit >= MIN_BENEFIT_ROWS:
            improvement = _single_improvement(ev, design)
            options.append((_index_proposal(agent, ev, design, improvement), _single_action(design),
                            improvement, 0.5, design.table))
    distinct: dict[tuple[str, ...], OptimizationProposal] = {}
    for proposal, *_ in options:
        distinct.setdefault(proposal.sql_commands, proposal)
    chosen = list(distinct.values())[:MAX_CANDIDATES]
    first, action, improvement, confidence, target = options[0]
    return Decision(insights=tuple(insights), actions=(action,), confidence=confidence,
                    target_table=target, estimated_improvement=improvement, proposal=first,
                    alternatives=tuple(chosen[1:]))


# -- one low-risk index: the fallback of the other specialisations ---------------------------
def _equality_candidates(ev: Evidence, table: str, insights: list[str]) -> list[IndexDesign]:
    """A single-column B-tree per equality-tested column that no index starts with."""
    info = ev.table(table)
    if info is None:
        return []
    visited = max(ev.scanned_rows(table), float(info.rows))
    candidates: list[IndexDesign] = []
    for use in ev.uses(table, "equality"):
        if (use.operator or "=").upper() not in EQUALITY_OPS:
            continue
        if covering_index(info, [use.column]):
            insights.append(f"{use.column} on {table} is already indexed")
            continue
        sel, note = _selectivity_note(ev, table, use)
        insights.append(note)
        candidates.append(IndexDesign(
            table=table, key=(KeyColumn(use.column),), kind="filter", fraction=sel,
            benefit=visited * (1 - sel),
            reasons=(f"{use.column} is the most selective equality filter on {table} "
                     f"(~{fmt_pct(sel)} of {fmt_count(info.rows)} rows).",)))
    return candidates


def _pattern_candidates(ev: Evidence, table: str, insights: list[str]) -> list[IndexDesign]:
    """A B-tree with the pattern operator class per `LIKE 'prefix%'` column not yet so indexed."""
    info = ev.table(table)
    if info is None:
        return []
    visited = max(ev.scanned_rows(table), float(info.rows))
    candidates: list[IndexDesign] = []
    for choice in _pattern_choices(ev, table, _like_patterns(ev, table), ev.only_filter(table)):
        classes = {choice.column: choice.opclass} if choice.opclass else None
        if covering_index(info, [], [choice.column], opclasses=classes):
            insights.append(f"{choice.column} on {table} is already indexed"
                            + (f" with {choice.opclass}" if choice.opclass else ""))
            continue
        insights.append(choice.note)
        candidates.append(IndexDesign(
            table=table, key=(KeyColumn(choice.column, opclass=choice.opclass,
                                        label=f"{choice.column}_pattern" if choice.opclass else None),),
            kind="filter", fraction=choice.fraction, benefit=visited * (1 - choice.fraction),
            reasons=(choice.note,)))
    return candidates


def _expression_candidates(ev: Evidence, table: str, insights: list[str]) -> list[IndexDesign]:
    """The expression and GIN designs of `_indexable_designs`, their notes said once."""
    notes: list[str] = []
    candidates = _indexable_designs(ev, table, notes)
    insights.extend(n for n in dict.fromkeys(notes) if n not in insights)
    return candidates


# The fallback's candidates on one large table, in this order; the most selective B-tree
# wins, GIN only when no B-tree fits.
FALLBACK_RULES: Final[tuple[DesignRule, ...]] = (
    _equality_candidates, _pattern_candidates, _expression_candidates)


def fallback_index(agent: AgentKey, ev: Evidence, insights: list[str], why: str) -> Decision:
    """One index, or nothing: a low-risk B-tree on the most selective equality column,
    LIKE-prefixed column (with its pattern operator class) or equality-tested expression;
    GIN (medium risk) only when no B-tree fits, for jsonb containment or key tests."""
    best: IndexDesign | None = None
    for table in ev.query_tables():
        info = ev.table(table)
        if info is None or max(info.rows, ev.scanned_rows(table)) < SMALL_TABLE_ROWS:
            continue
        candidates = [design for rule in FALLBACK_RULES for design in rule(ev, table, insights)]
        for design in candidates:
            rank = (design.method != "btree", design.fraction)
            if design.fraction <= INDEX_MAX_FRACTION and (
                    best is None or rank < (best.method != "btree", best.fraction)):
                best = design
    insights.append(why)
    if best is None:
        return nothing(insights, "no selective equality, LIKE-prefix or expression filter on a large "
                        "table lacks an index", 0.6, ev.main_table())
    design, table = best, best.table
    if design.benefit < MIN_BENEFIT_ROWS:
        return nothing(insights, "an index would spare too few row visits", 0.6, table)
    improvement = predicted_improvement(ev, table, design.fraction)
    if improvement < MIN_IMPROVEMENT:
        share = time_share(ev, table)
        key = ", ".join(k.sql() for k in design.key)
        return nothing(insights, f"an index on {table} ({key}) would save at most ~{fmt_pct(share)} of "
                        "the time: the cost is elsewhere in the plan", 0.6, table)
    proposal = _index_proposal(agent, ev, design, improvement)
    return Decision(insights=tuple(insights), actions=(f"Create index on {design.describe()}",),
                    confidence=0.55, target_table=table, estimated_improvement=improvement,
                    proposal=proposal)


