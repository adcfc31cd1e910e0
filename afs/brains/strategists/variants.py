"""Other forms of a design the squad has (pure): what an agent measures in a slot that another
agent's measurement of its own design frees (afs.agents), once no other agent's candidate is left.

Each index of a design that is a set of plain B-trees (columns, no expressions or operator
classes, nothing but CREATE INDEX and ANALYZE) is varied the ways the query motivates, the others kept:

    covering / plain   INCLUDE the other columns the query reads from the table (narrow ones,
                       as the index designer carries them), or the same key without INCLUDE, or
                       its INCLUDE columns as trailing key columns instead (at most
                       MAX_SUBPLAN_KEY key columns)
    column order       the key's leading columns the query compares by equality (or joins on),
                       each of the others leading once
    partial / full     a key column the query compares with a rare constant of an enum-like
                       column (the index designer's rule: PARTIAL_MAX_DISTINCT, PARTIAL_MAX_FREQ)
                       as the index's WHERE (the rest of the key stays), or a partial index's
                       WHERE column as the first key column instead (every value of it)

An index of one key (a plain column, or an expression of one column the query tests: a B-tree's
too, after its forms above) is varied by its kind: every other (method, operator class) the
fork's catalog has that serves all the operators the query applies to that key
(afs.query.opclasses.candidates: pg_amop, pg_opclass, those of trusted extensions too), e.g.
GiST for a GIN trigram index, a hash index for an equality on `lower(email)`. A B-tree's other
B-tree classes are not varied to (they serve an equality alike). A design's ANALYZE of its
tables (an expression key's statistics) is kept with the variant.

Each variant is built by the index designer's own `_set_proposal` (name, rollback, size,
rationale) and none is an index the table has already (`covering_index`). Nothing here says a
variant is worth measuring: the agent screens it with the planner and measures it only where
the planner expects a gain, like any candidate (afs.agents).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Final

from afs.brains.strategists.evidence import Evidence, covering_index
from afs.brains.strategists.index_design import (
    EQUALITY_OPS,
    MAX_SUBPLAN_KEY,
    PARTIAL_MAX_DISTINCT,
    PARTIAL_MAX_FREQ,
    IndexDesign,
    KeyColumn,
    _expression_label,
    _include_columns,
    _norm_target,
    _selectivity_note,
    _set_proposal,
)
from afs.models import AgentKey, AnalysisContext, OptimizationProposal
from afs.pg.stats import column_type, distinct_values
from afs.query.opclasses import IndexKind, candidates, catalog_type
from afs.safety import creates, validate_commands
from afs.safety.creates import Change, NewIndex

__all__ = ["MAX_VARIANTS", "design_variants"]

MAX_VARIANTS: Final = 6  # variants of one design, at most


def _norm(text: str) -> str:
    return " ".join(text.replace('"', "").lower().split())


_CAST_CONSTANT = re.compile(r"CAST\(('(?:[^']|'')*') AS [a-z_ ]+\)", re.IGNORECASE)


def _same(a: str, b: str) -> bool:
    """Two index statements or keys alike once printed the same way: spacing, quoting and case
    aside, and a constant's cast (`'kind'::text`, `CAST('kind' AS text)`, `'kind'`) aside."""
    def loose(text: str) -> str:
        return _norm_target(_CAST_CONSTANT.sub(r"\1", text))
    return _norm(a) == _norm(b) or loose(a) == loose(b)


def _canonical(table: str, clauses: str) -> str:
    """`CREATE INDEX ON table<clauses>` as the validator prints it back (the form
    `NewIndex.canonical` has: `'english'::regconfig` and `CAST('english' AS regconfig)` alike);
    "" when it does not read as one index."""
    indexes = validate_commands((f"CREATE INDEX ON {table}{clauses}",), "index").creates.indexes
    return indexes[0].canonical if len(indexes) == 1 else ""


def _as_design(ev: Evidence, index: NewIndex) -> IndexDesign | None:
    """The index as an IndexDesign, when rebuilding it from its parts gives the same index (a
    B-tree on plain columns, ascending or descending: no expression, operator class or UNIQUE);
    else None."""
    table = ev.resolver.table_key(index.table)
    if table is None or ev.table(table) is None or index.method != "btree" or index.unique:
        return None
    keys = [KeyColumn(k[:-len(" DESC")], desc=True) if k.endswith(" DESC") else KeyColumn(k)
            for k in index.keys]
    if not keys or tuple(k.name for k in keys) != index.columns:
        return None
    design = IndexDesign(table=table, key=tuple(keys), kind="filter",
                         fraction=1.0, benefit=0.0, include=tuple(index.include),
                         where=index.where or None)
    _, _, on = index.canonical.partition(" ON ")
    rebuilt = f"{index.table}{design.clauses(design.include)}"
    return design if on and _norm(on) == _norm(rebuilt) else None


def _needs(ev: Evidence, table: str, column: str,
           expression: str | None = None) -> list[tuple[str, str | None]]:
    """The (operator, type) pairs the query applies to `column` of `table` itself (its WHERE
    terms with a symbolic operator, LIKE and ILIKE), or to `expression` of it (its WHERE terms
    with a symbolic operator on that expression, as pg_get_indexdef prints it)."""
    if expression is not None:
        return list(dict.fromkeys(
            (t.operator, t.data_type) for t in ev.operator_terms
            if t.table == table and t.expression is not None
            and _norm_target(t.expression) == _norm_target(expression)))
    info = ev.table(table)
    data_type = column_type(info, column) if info is not None else None
    shown = catalog_type(data_type) if data_type else None
    needs = [(t.operator, t.data_type or shown) for t in ev.operator_terms
             if t.table == table and t.column == column and t.expression is None]
    needs += [("~~", shown) for t, c, _ in sorted(ev.shape.like_terms) if (t, c) == (table, column)]
    needs += [("~~*", shown) for t, c, _ in sorted(ev.shape.ilike_terms) if (t, c) == (table, column)]
    return list(dict.fromkeys(needs))


def _key_of(ev: Evidence, table: str, index: NewIndex) -> tuple[str, str | None] | None:
    """The index's one key as (column, expression): a plain column (expression None), or an
    expression of one column the query applies an operator to (the expression as the query's
    term reads it, pg_get_indexdef's form); None for anything else (several keys, DESC, an
    expression the query does not test)."""
    if len(index.keys) != 1 or index.keys[0].endswith(" DESC"):
        return None
    if index.keys == index.columns:
        return index.columns[0], None
    mine = _canonical(index.table, f" ({index.keys[0]})")
    term = next((t for t in ev.operator_terms if t.table == table and t.expression is not None
                 and _same(_canonical(index.table, f" (({t.expression}))"), mine)), None)
    return (term.column, term.expression) if term is not None and term.expression else None


def _kind_design(ev: Evidence, index: NewIndex, kind: IndexKind,
                 key: tuple[str, str | None]) -> IndexDesign | None:
    table = ev.resolver.table_key(index.table)
    if table is None:
        return None
    column, expression = key
    label = _expression_label(column, expression) if expression is not None else None
    return IndexDesign(table=table, key=(KeyColumn(column, expression=expression, opclass=kind.opclass,
                                                   label=label),),
                       kind="filter", fraction=1.0, benefit=0.0, where=index.where or None,
                       method=kind.method, extension=kind.extension, analyze=expression is not None)


def _other_kinds(ev: Evidence, index: NewIndex, key: tuple[str, str | None], current: IndexKind,
                 kinds: list[IndexKind], needs: list[tuple[str, str | None]]
                 ) -> list[tuple[IndexDesign, str]]:
    """The designs of the other kinds of `kinds` (the catalog's, best first) on the index's one
    key, each with what changed: the first class of each method, never a B-tree's other B-tree
    classes (text_pattern_ops for an equality orders alike)."""
    target = key[1] or key[0]
    taken: set[str] = set()
    found: list[tuple[IndexDesign, str]] = []
    for kind in kinds:
        if ((kind.method, kind.opclass) == (current.method, current.opclass) or kind.method in taken
                or current.method == kind.method == "btree"):
            continue
        design = _kind_design(ev, index, kind, key)
        if design is None:
            continue
        taken.add(kind.method)
        found.append((design, f"{kind.named} instead of {current.named} (the catalog's classes for "
                              f"{', '.join(op for op, _ in needs)} on {target})"))
    return found


def _kinds(ev: Evidence, index: NewIndex) -> tuple[IndexDesign | None, list[tuple[IndexDesign, str]]]:
    """An index of one key (a plain column, or an expression of one column the query tests),
    of any access method and without INCLUDE: the index as an IndexDesign (its kind found among
    those the catalog has for the query's operators on the key, rebuilt to the same index), and
    the other kinds that serve them all (`_other_kinds`: a hash index for an equality on an
    expression, GiST for a GIN trigram index …); (None, []) when it cannot be rebuilt."""
    table = ev.resolver.table_key(index.table)
    if table is None or not ev.catalog_read or index.unique or index.include:
        return None, []
    key = _key_of(ev, table, index)
    if key is None:
        return None, []
    needs = _needs(ev, table, *key)
    kinds = candidates(ev.ctx.operator_classes, needs) if needs else []
    current = None
    for kind in kinds:
        design = _kind_design(ev, index, dataclasses.replace(kind, extension=None), key)
        if design is not None and _same(index.canonical, _canonical(index.table, design.clauses(()))):
            current = kind
    if current is None:
        return None, []
    base = _kind_design(ev, index, dataclasses.replace(current, extension=None), key)
    return base, _other_kinds(ev, index, key, current, kinds, needs)


def _btree_kinds(ev: Evidence, index: NewIndex, design: IndexDesign) -> list[tuple[IndexDesign, str]]:
    """A B-tree of one plain column (`design`, its INCLUDE columns aside): the other methods
    whose classes serve every operator the query applies to the column (a hash index for an
    equality); [] for a B-tree of several keys, or without the catalog."""
    if not ev.catalog_read or len(design.key) != 1 or design.key[0].desc or design.where:
        return []
    key = (design.key[0].name, None)
    needs = _needs(ev, design.table, *key)
    kinds = candidates(ev.ctx.operator_classes, needs) if needs else []
    current = next((k for k in kinds if k.method == "btree" and k.opclass is None), None)
    return _other_kinds(ev, index, key, current, kinds, needs) if current is not None else []


def _equality_columns(ev: Evidence, table: str) -> list[str]:
    """The columns of `table` the query compares by equality (or joins on), in the query's order."""
    found = [u.column for u in ev.uses(table, "equality", "join")
             if u.role == "join" or (u.operator or "=").upper() in EQUALITY_OPS]
    return list(dict.fromkeys(found))


def _constant_column(ev: Evidence, table: str, where: str) -> str | None:
    """The column whose constant predicate of the query `where` is (a partial index's WHERE)."""
    return next((column for (t, column), predicate in ev.shape.constant_predicates.items()
                 if t == table and _norm(predicate) == _norm(where)), None)


def _partial_worthy(ev: Evidence, table: str, column: str) -> bool:
    """Whether the query's constant on `column` is one the index designer makes a partial
    index's WHERE of: a rare value (PARTIAL_MAX_FREQ) of an enum-like column (at most
    PARTIAL_MAX_DISTINCT values), or IS NULL; a constant of a column of many values would make
    an index for the query's literal only."""
    info = ev.table(table)
    use = next((u for u in ev.uses(table, "equality") if u.column == column
                and (u.operator or "=").upper() in EQUALITY_OPS), None)
    if info is None or use is None:
        return False
    selectivity, _ = _selectivity_note(ev, table, use)
    stats = ev.stats(table, column)
    distinct = distinct_values(stats, float(max(info.rows, 1))) if stats else None
    enum_like = (use.operator or "=").upper() in ("IS NULL", "IS") or (
        distinct is not None and distinct <= PARTIAL_MAX_DISTINCT)
    return enum_like and selectivity <= PARTIAL_MAX_FREQ


def _forms(ev: Evidence, design: IndexDesign) -> list[tuple[IndexDesign, str]]:
    """The other forms of one index the query motivates, each with what changed."""
    table, columns, keys = design.table, list(design.columns), list(design.key)
    forms: list[tuple[IndexDesign, str]] = []
    where_column = _constant_column(ev, table, design.where) if design.where else None
    if design.include:
        forms.append((dataclasses.replace(design, include=()), "the same key without INCLUDE (smaller)"))
        if len(keys) + len(design.include) <= MAX_SUBPLAN_KEY:
            forms.append((dataclasses.replace(design, key=(*keys, *(KeyColumn(c) for c in design.include)),
                                              include=()),
                          f"{', '.join(design.include)} as trailing key columns instead of INCLUDE"))
    else:
        taken = {*columns, *([where_column] if where_column else [])}
        include = _include_columns(ev, table, taken)
        if include:
            forms.append((dataclasses.replace(design, include=include),
                          f"INCLUDE ({', '.join(include)}) for an index-only scan"))
    equal = _equality_columns(ev, table)
    lead = 0
    while lead < len(columns) and columns[lead] in equal:
        lead += 1
    for i in range(1, lead):  # each other equality column of the leading run leads once
        order = (keys[i], *keys[:i], *keys[i + 1:])
        forms.append((dataclasses.replace(design, key=order),
                      f"{columns[i]} first (the query compares {', '.join(columns[:lead])} by equality)"))
    if design.where is None:
        for column in columns:
            predicate = ev.shape.constant_predicates.get((table, column))
            rest = tuple(k for k in keys if k.name != column)
            if predicate and rest and _partial_worthy(ev, table, column):
                forms.append((dataclasses.replace(design, key=rest, where=predicate),
                              f"partial: WHERE {predicate} instead of {column} in the key"))
    elif where_column is not None and where_column not in columns:
        forms.append((dataclasses.replace(design, key=(KeyColumn(where_column), *design.key), where=None),
                      f"{where_column} as the first key column instead of WHERE {design.where} "
                      "(every value of it)"))
    return forms


def _fraction(ev: Evidence, design: IndexDesign) -> tuple[float, float]:
    """The share of the table's rows the index leads to (its equality columns' and WHERE's
    selectivities, pg_stats), and the share a partial index keeps."""
    uses = {u.column: u for u in ev.uses(design.table, "equality")
            if (u.operator or "=").upper() in EQUALITY_OPS}
    where_column = _constant_column(ev, design.table, design.where) if design.where else None
    where_fraction = 1.0
    if where_column is not None and where_column in uses:
        where_fraction, _ = _selectivity_note(ev, design.table, uses[where_column])
    keyed = [_selectivity_note(ev, design.table, uses[c])[0] for c in design.columns if c in uses]
    return min(1.0, math.prod(keyed) * where_fraction), where_fraction


def design_variants(agent: AgentKey, ctx: AnalysisContext,
                    proposal: OptimizationProposal) -> tuple[OptimizationProposal, ...]:
    """Other forms of `proposal`'s indexes (module docstring), at most MAX_VARIANTS; () for a
    design that is not a set of plain B-trees (a rewrite, a setting, a view, an expression)."""
    if proposal.rewritten_query is not None or proposal.settings or not proposal.sql_commands:
        return ()
    made = creates(proposal)
    indexes = made.indexes
    changes = [c for c in made.commands if isinstance(c, Change) and (
        c.kind in ("extension", "analyze"))]
    if not made.complete or len(indexes) + len(changes) != len(proposal.sql_commands):
        return ()  # something else than index builds (and ANALYZE of their tables): a view …
    ev = Evidence(ctx)
    designs: list[IndexDesign] = []
    forms_of: list[list[tuple[IndexDesign, str]]] = []
    for index in indexes:
        design = _as_design(ev, index)
        if design is not None:
            designs.append(design)
            # a B-tree's other forms, then the other methods that serve its one key's operators
            forms_of.append([*_forms(ev, design), *_btree_kinds(ev, index, design)])
            continue
        design, kinds = _kinds(ev, index)
        if design is None:
            return ()
        designs.append(design)
        forms_of.append(kinds)
    seen = {tuple(_norm(c) for c in sorted(index.canonical for index in indexes))}
    found: list[OptimizationProposal] = []
    for i, forms in enumerate(forms_of):
        for form, change in forms:
            info = ev.table(form.table)
            assert info is not None
            if (not form.include and form.method == "btree"
                    and covering_index(info, (), form.columns, form.where) is not None):
                continue  # the table has this index already
            fraction, where_fraction = _fraction(ev, form)
            observed = ev.observed_fraction(form.table) if ev.only_filter(form.table) else None
            if form.method != "btree" and observed is not None:
                fraction = observed  # what the query's filter keeps, as the plan shows it
            form = dataclasses.replace(form, fraction=fraction, where_fraction=where_fraction, reasons=(
                f"A variant of a design of the squad ({', '.join(d.describe() for d in designs)}): "
                f"{change} on {form.table}.",))
            others = [d for j, d in enumerate(designs) if j != i]
            variant = _set_proposal(agent, ev, [*others[:i], form, *others[i:]],
                                    proposal.estimated_impact.query_time_improvement)
            key = tuple(sorted(_norm(new.canonical) for new in creates(variant).indexes))
            if key in seen:
                continue
            seen.add(key)
            found.append(variant)
            if len(found) >= MAX_VARIANTS:
                return tuple(found)
    return tuple(found)
