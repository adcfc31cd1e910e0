"""gemini-2.5-pro: index design (pure).

The best index for the most expensive access in the plan: a B-tree on columns or
expressions, composite keys (equality → range → sort), partial indexes for rare
constants, INCLUDE for index-only scans, join-key indexes, `LIKE 'prefix%'` through a
pattern operator class, expression indexes for `lower(col) = …` and
`payload ->> 'key' = …`, GIN for jsonb containment (`@>`) and key tests (`?`).

Per table, each rule of `DESIGN_RULES` offers its designs; the one sparing the most
row visits wins. `fallback_index` is the one low-risk index the other specialisations
propose when their own specialty finds nothing (its candidates: `FALLBACK_RULES`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from afs.brains.strategists.evidence import (
    FAST_MS,
    SMALL_TABLE_ROWS,
    WRITE_HEAVY,
    Decision,
    Evidence,
    covering_index,
    insights_of,
    norm_column,
    nothing,
    predicted_improvement,
    range_estimate,
    range_text,
    time_share,
    write_risk,
)
from afs.features import IndexablePredicate
from afs.models import (
    AgentKey,
    AnalysisContext,
    ColumnUse,
    EstimatedImpact,
    OptimizationProposal,
    ProposalType,
    TableInfo,
)
from afs.pg.names import ident, index_name, qualified, quote_literal, relation_name, schema_and_relation
from afs.pg.plan import fmt_count, fmt_ms, fmt_pct
from afs.pg.stats import (
    DEFAULT_CONTAIN_SEL,
    DEFAULT_EQ_SEL,
    DEFAULT_MATCH_SEL,
    JSON_VALUE_WIDTH,
    btree_mb,
    column_type,
    column_width,
    distinct_values,
    equality_selectivity,
    gin_mb,
    like_prefix,
    pattern_opclass,
    prefix_fraction,
    value_matches,
)

MIN_BENEFIT_ROWS: Final = 1_000  # an index must spare at least this many row visits
INDEX_MAX_FRACTION: Final = 0.2  # an index lookup beats a scan below ~20 % of the rows
JOIN_MAX_FRACTION: Final = 0.1  # a nested loop over an index beats a hash join below this
PARTIAL_MAX_FREQ: Final = 0.2  # a constant this rare is worth a partial index …
PARTIAL_MAX_DISTINCT: Final = 50  # … on a low-cardinality (enum-like) column
INCLUDE_MAX_COLUMNS: Final = 3
INCLUDE_MAX_TEXT_WIDTH: Final = 16  # avg bytes (pg_stats avg_width) of a text narrow enough to INCLUDE
MIN_IMPROVEMENT: Final = 10.0  # percent: the consensus gate; less is not worth proposing
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
    method: Literal["btree", "gin"] = "btree"
    analyze: bool = False  # an expression key: ANALYZE gives the planner statistics on it

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
                and pattern_opclass(column_type(info, u.column))):
            patterns.setdefault(u.column, []).append(u.value)
    return patterns


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
        opclass = pattern_opclass(column_type(info, column))
        note = (f"{column} LIKE {quote_literal(pattern)} keeps ~{fmt_pct(frac)} of rows "
                f"(~{fmt_count(frac * rows)}, {source}); a B-tree serves the prefix with {opclass}, "
                "whatever the collation")
        out.append(RangeChoice(column, frac, note, opclass))
    return out


def _sort_columns(ev: Evidence, table: str) -> tuple[KeyColumn, ...]:
    """ORDER BY as index key columns, when an index on `table` can deliver that order."""
    sort = ev.shape.sort
    if not sort or ev.shape.grouped or ev.ctx.features.join_count > 0:
        return ()
    if not all(s.table == table and s.column for s in sort):
        return ()
    return tuple(KeyColumn(s.column or "", s.desc, s.nulls_first) for s in sort)


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
        notes.append(f"the filters on {table} keep ~{fmt_pct(fraction)} of its {fmt_count(rows)} rows: "
                     "an index would not beat a sequential scan")
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
                reasons=(f"{table} is scanned for {fmt_count(scanned)} rows to join {fmt_count(outer)} "
                         f"{partner} rows",
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
        key = KeyColumn(pred.column, expression=pred.expression, opclass=pred.opclass, label=pred.label)
        if (key.target, key.opclass, pred.method) in seen:
            continue
        seen.add((key.target, key.opclass, pred.method))
        fraction, source = _indexable_fraction(ev, table, pred)
        note = f"{pred.shown} keeps ~{fmt_pct(fraction)} of rows (~{fmt_count(fraction * rows)}, {source})"
        notes.append(note)
        if fraction > INDEX_MAX_FRACTION:
            notes.append(f"{pred.shown} keeps too many rows of {table} for an index to beat a "
                         "sequential scan")
            continue
        if pred.method == "gin":
            existing = covering_index(info, [], [pred.column], method="gin")
            if existing is not None and pred.kind == "key_exists" and "jsonb_path_ops" in existing.definition:
                existing = None  # jsonb_path_ops has no operator for `?`
        else:
            existing = covering_index(info, [], [key.target],
                                      opclasses={key.target: pred.opclass} if pred.opclass else None)
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
        if pred.method == "gin":
            how = (f"a GIN index on {pred.column}"
                   + (f" with {pred.opclass} (smaller and faster than the default jsonb_ops for @>)"
                      if pred.opclass else "")
                   + " answers it with a Bitmap Index Scan")
        else:
            what = f"the expression {pred.expression}" + (f" with {pred.opclass}" if pred.opclass else "")
            how = (f"an index on {what} serves it (a plain index on {pred.column} cannot); ANALYZE then "
                   "gives the planner statistics on the expression")
        out.append(IndexDesign(
            table=table, key=(key,), kind="filter", fraction=fraction, benefit=benefit,
            reasons=(_scan_reason(ev, table, rows), note, f"{pred.shown}: {how}"), method=pred.method,
            analyze=pred.expression is not None))
    return out


def _key_width(info: TableInfo | None, key: KeyColumn) -> int:
    if key.expression is not None and info is not None and column_type(info, key.name) in ("json", "jsonb"):
        return JSON_VALUE_WIDTH
    return column_width(info, key.name)


def drop_index(table: str, name: str) -> str:
    """The rollback of an index named `name` on `table` (an index lives in its table's schema)."""
    schema, _ = schema_and_relation(table)
    return f"DROP INDEX IF EXISTS {ident(schema) + '.' if schema else ''}{ident(name)}"


def _index_proposal(agent: AgentKey, ev: Evidence, design: IndexDesign,
                    improvement: float) -> OptimizationProposal:
    info = ev.table(design.table)
    taken = [ix.name for ix in info.indexes] if info else []
    gin = design.method == "gin"
    name = index_name(design.table, design.labels, suffix="gin" if gin else "idx", taken=taken)
    sql = (f"CREATE INDEX {ident(name)} ON {qualified(design.table)}"
           f"{design.clauses([ident(c) for c in design.include])}")
    ptype: ProposalType = ("partial_index" if design.where
                           else "composite_index" if len(design.key) + len(design.include) > 1
                           else "index")
    rows = float(info.rows) if info else 0.0
    entries = rows * design.where_fraction
    widths = [_key_width(info, k) for k in design.key] + [column_width(info, c) for c in design.include]
    if gin:
        storage = gin_mb(entries, column_width(info, design.key[0].name), design.key[0].opclass)
    else:
        storage = btree_mb(entries, widths)
    risk, warnings = write_risk(ev, design.table)
    if gin:
        risk = "medium"
        warnings.append("A GIN index costs more on writes than a B-tree: each row adds several entries, "
                        "batched in a pending list that reads must also scan until it is merged.")
    scan = ("Bitmap Index Scan" if gin else "Index Only Scan" if design.include
            else "Index Scan (or Bitmap Index Scan)")
    steps = [f"EXPLAIN shows {scan} using {name} on {relation_name(design.table)}"]
    commands = [sql]
    if design.analyze:
        commands.append(f"ANALYZE {qualified(design.table)}")
        steps.insert(0, f"ANALYZE {relation_name(design.table)} collects statistics on the indexed "
                     "expression")
    if design.sort_served:
        steps.append("EXPLAIN shows no Sort node above that scan")
    steps.append("the query returns the same rows as before (count and checksum)")
    rationale = " ".join([
        *(w.rstrip(".") + "." for w in design.reasons),
        f"Proposed: CREATE INDEX on {design.describe()} ({ptype}), about {fmt_count(entries)} entries, "
        f"~{storage:.1f} MB; expected to read ~{fmt_pct(design.fraction)} of {fmt_count(rows)} rows.",
        *warnings,
    ])
    return OptimizationProposal(
        agent=agent, proposal_type=ptype, sql_commands=tuple(commands),
        rollback_commands=(drop_index(design.table, name),),
        rationale=rationale,
        estimated_impact=EstimatedImpact(query_time_improvement=improvement,
                                         storage_overhead_mb=storage, complexity="low", risk=risk),
        validation_steps=tuple(steps))


def _filter_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    found = _filter_design(ev, table, notes)
    return [found] if found else []


# The designs for one large table, each rule one kind of access: the WHERE / ORDER BY
# key (equality → range → sort), the join keys, the expressions and jsonb / array tests.
# The design sparing the most row visits wins (the first of equals, in this order).
DESIGN_RULES: Final[tuple[DesignRule, ...]] = (_filter_designs, _join_designs, _indexable_designs)


def decide_index_design(ctx: AnalysisContext, agent: AgentKey = "gemini25pro") -> Decision:
    """gemini-2.5-pro: the best index for the most expensive access in the plan: a B-tree on
    columns or expressions (with a pattern operator class for LIKE prefixes), or GIN for jsonb."""
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
    insights.extend(dict.fromkeys(notes))
    best = max(designs, key=lambda d: d.benefit, default=None)
    if best is None or best.benefit < MIN_BENEFIT_ROWS:
        why = ("no filter, sort or join column of a large table lacks a fitting index"
               if best is None
               else f"the best index would spare too few row visits (~{fmt_count(best.benefit)})")
        confident = any("already" in n for n in notes)
        return nothing(insights, why, 0.85 if confident else 0.6, ev.main_table())
    improvement = predicted_improvement(ev, best.table, best.fraction,
                               whole_join=best.kind == "join" or best.sort_served)
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
    action = f"Create index on {best.describe()}"
    if best.kind == "join":
        action += " to turn the join into a nested loop over the index"
    proposal = _index_proposal(agent, ev, best, improvement)
    return Decision(insights=tuple(insights), actions=(action,), confidence=evidence_strength,
                    target_table=best.table, estimated_improvement=improvement, proposal=proposal)



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
        classes = {choice.column: choice.opclass or ""}
        if covering_index(info, [], [choice.column], opclasses=classes):
            insights.append(f"{choice.column} on {table} is already indexed with {choice.opclass}")
            continue
        insights.append(choice.note)
        candidates.append(IndexDesign(
            table=table, key=(KeyColumn(choice.column, opclass=choice.opclass,
                                        label=f"{choice.column}_pattern"),),
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


