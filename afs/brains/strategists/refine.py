"""The strategists' next step of an agent's loop (pure): a measured design, extended to remove
the bottleneck the plan of the query *with* it in place shows (afs.pg.bottleneck).

    scan_filter      a scan with a filter on a table the design does not index well → an index
                     on the filtered columns (equality first, then range)
    join_inner       the inner side of a nested loop, or a table scanned whole to be joined →
                     an index on its join key (then its equality filters)
    subplan_per_row  a SubPlan run per outer row → an index on its correlation columns, then
                     the column the subquery aggregates or compares (an index-only scan)
    heap_fetch       an index scan that visits the table for each row → the index the plan
                     uses, with the other columns the query reads as INCLUDE (index-only scan)
    spill, sort,     nothing here: work_mem is proposed by the plan fixes already, and the rows
    rows_returned    a query returns are its result

The given bottleneck first; when it leads nowhere new (the design already has that index,
a column cannot be named), the next of the after-plan's, most costly first. Columns come
from the plan's conditions (afs.pg.bottleneck) and their tables from the query's resolver
(afs.query through `Evidence.resolver`); the index is built by the index designer's own
helpers (IndexDesign, `_set_proposal`). The new design is the current one plus the new
index: its statements after the current ones, its rollback before theirs; a plain index of
the current design whose key the new one starts with is replaced by it. A table of fewer
than SMALL_TABLE_ROWS rows (times the loops that read it) gets no index, and a plan that ran
in less than FAST_MS nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from sqlglot import exp

from afs.brains.strategists.evidence import FAST_MS, SMALL_TABLE_ROWS, Evidence, covering_index, norm_column
from afs.brains.strategists.index_design import (
    INCLUDE_MAX_COLUMNS,
    WIDE_TYPES,
    IndexDesign,
    KeyColumn,
    _set_proposal,
)
from afs.models import AgentKey, AnalysisContext, LoopStep, OptimizationProposal, ProposalType
from afs.pg.bottleneck import Bottleneck, bottlenecks
from afs.pg.names import qualified
from afs.pg.stats import column_type

__all__ = ["MAX_KEY_COLUMNS", "refine_design"]

MAX_KEY_COLUMNS: Final = 4  # key columns of one index the loop adds
EQUALITY_ROLES: Final = ("equality", "join")  # a key looked up by equality (a join key is one)
_REMOVABLE: Final = ("scan_filter", "join_inner", "subplan_per_row", "heap_fetch")
_CREATED: Final = re.compile(r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?"
                             r"(?:IF\s+NOT\s+EXISTS\s+)?"
                             r"(\"(?:[^\"]|\"\")+\"|[\w$]+)\s+ON\s+(.*)$", re.IGNORECASE | re.DOTALL)


def _created(proposal: OptimizationProposal) -> dict[str, str]:
    """name → what follows ON (table, method, key, INCLUDE, WHERE), normalised, of every index
    the design creates."""
    found: dict[str, str] = {}
    for command in proposal.sql_commands:
        match = _CREATED.match(command)
        if match:
            found[match.group(1).strip('"')] = norm_column(match.group(2))
    return found


_KEY: Final = re.compile(r"^(?:ONLY\s+)?(\S+)\s*(?:USING\s+btree\s*)?\(([^()]*)\)\s*$", re.IGNORECASE)


def _superseded(current: OptimizationProposal, design: IndexDesign) -> set[str]:
    """The names of the plain B-tree indexes the design creates on `design.table` whose key
    `design` starts with (the same key, when it adds INCLUDE columns): the new index serves
    every lookup they serve, so it replaces them rather than joining them."""
    names: set[str] = set()
    key = [norm_column(c) for c in design.columns]
    for command in current.sql_commands:
        match = _CREATED.match(command)
        on = _KEY.match(match.group(2).strip()) if match else None
        if match is None or on is None or norm_column(on.group(1)) != norm_column(qualified(design.table)):
            continue
        old = [norm_column(c) for c in on.group(2).split(",")]
        if key[:len(old)] == old and (len(old) < len(key) or design.include):
            names.add(match.group(1).strip('"'))
    return names


def _key_order(ev: Evidence, table: str, columns: Sequence[str]) -> list[str]:
    """The key: the columns compared by equality (or joined on) first, then those compared as
    ranges, in the plan's order within each; a column the query uses otherwise is left out of
    the key when an equality or range column exists."""
    roles: dict[str, set[str]] = {}
    for use in ev.uses(table):
        roles.setdefault(use.column, set()).add(use.role)
    equal = [c for c in columns if roles.get(c, set()) & set(EQUALITY_ROLES)]
    ranged = [c for c in columns if c not in equal and "range" in roles.get(c, set())]
    key = [*equal, *ranged] or list(columns)
    return key[:MAX_KEY_COLUMNS]


def _aggregated(ev: Evidence, table: str) -> list[str]:
    """The columns of `table` the query aggregates (inside an aggregate function), found by the
    query's one resolver."""
    query = ev.query
    if query is None or query.tree is None:
        return []
    found: list[str] = []
    for agg in query.tree.find_all(exp.AggFunc):
        for column in agg.find_all(exp.Column):
            if column.name and column.name not in found and (
                    ev.resolver.table_key(query.table_of(column, ev.ctx.tables)) == table):
                found.append(column.name)
    return found


def _includable(ev: Evidence, table: str, columns: Sequence[str]) -> list[str]:
    """Of `columns`, those an index may carry as INCLUDE (not too wide), at most
    INCLUDE_MAX_COLUMNS; [] when one of them cannot."""
    info = ev.table(table)
    if info is None or len(columns) > INCLUDE_MAX_COLUMNS:
        return []
    for c in columns:
        data_type = column_type(info, c)
        if data_type is None or any(w in data_type for w in WIDE_TYPES):
            return []
    return list(columns)


def _design(ev: Evidence, neck: Bottleneck, current: Mapping[str, str]) -> IndexDesign | None:
    """The index that removes `neck`, or None."""
    table = ev.resolver.table_key(neck.table)
    if table is None or ev.table(table) is None:
        return None
    info = ev.table(table)
    assert info is not None
    if info.rows * max(neck.loops, 1) < SMALL_TABLE_ROWS:
        return None  # scanning so few rows is cheap: no index for it
    columns = [c for c in neck.columns if ev.resolver.has_column(table, c)]
    include: list[str] = []
    if neck.kind == "heap_fetch" and neck.node == "Index Only Scan":
        return None  # its heap fetches are pages not all-visible: VACUUM's, not an index's
    if neck.kind == "heap_fetch":
        key = _key_order(ev, table, columns)
        taken = set(key)
        include = _includable(ev, table, [c for c in ev.referenced_columns(table) if c not in taken])
        if not key or not include or table in ev.shape.star_tables:
            return None
    elif neck.kind == "subplan_per_row":
        key = _key_order(ev, table, columns)
        extra = [c for c in _aggregated(ev, table) if c not in key and ev.resolver.has_column(table, c)]
        include = _includable(ev, table, extra)
    else:
        key = _key_order(ev, table, columns)
    if not key:
        return None
    equality = [c for c in key if {u.role for u in ev.uses(table, *EQUALITY_ROLES) if u.column == c}]
    rest = key[len(equality):] if key[:len(equality)] == equality else key
    if not include and covering_index(info, equality if rest is not key else (), rest) is not None:
        return None  # an index on the source serves this key already
    why = f"The plan with the design in place: {neck.detail}."
    design = IndexDesign(table=table, key=tuple(KeyColumn(c) for c in key), kind="join" if neck.kind in (
        "join_inner",) else "filter", fraction=min(1.0, neck.share), benefit=0.0,
        include=tuple(include), reasons=(why,))
    shown = norm_column(f"{design.table}{design.clauses(design.include)}")
    if any(shown == on or on.endswith(shown) for on in current.values()):
        return None  # the design creates this index already
    return design


def refine_design(agent: AgentKey, ctx: AnalysisContext, current: OptimizationProposal,
                  after_plan: Mapping[str, Any], bottleneck: Bottleneck | None,
                  steps: Sequence[LoopStep]) -> OptimizationProposal | None:
    """`current` plus the index that removes `bottleneck` (or, when that leads nowhere new, the
    next bottleneck of `after_plan` that does); None when there is none (module docstring)."""
    if current.rewritten_query is not None or current.proposal_type in (
            "materialized_view", "partitioning", "settings"):
        return None  # the after-plan is of another query (or a setting): not extended here
    if bottleneck is not None and bottleneck.kind == "rows_returned":
        return None
    root = after_plan.get("Plan", after_plan) if isinstance(after_plan.get("Plan"), Mapping) else after_plan
    analysed = "Actual Total Time" in root
    if analysed and float(root["Actual Total Time"]) < FAST_MS:
        return None  # a query this fast leaves nothing to measure
    ev = Evidence(dataclasses.replace(ctx, plan=after_plan))
    created = _created(current)
    necks = [bottleneck] if bottleneck is not None else []
    necks += [b for b in bottlenecks(after_plan, analysed) if b != bottleneck]
    for neck in necks:
        if neck.kind not in _REMOVABLE:
            continue
        design = _design(ev, neck, created)
        if design is None:
            continue
        extra = _set_proposal(agent, ev, (design,), current.estimated_impact.query_time_improvement)
        replaced = _superseded(current, design)
        if any(name in set(created) - replaced for name in _created(extra)):
            continue  # the index designer named it as one of ours: the same index
        kept_commands = tuple(c for c in current.sql_commands
                              if not ((m := _CREATED.match(c)) and m.group(1).strip('"') in replaced))
        kept_rollback = tuple(c for c in current.rollback_commands
                              if not any(re.search(rf"\b{re.escape(n)}\b", c) for n in replaced))
        step = len(steps) + 1
        ptype: ProposalType = current.proposal_type
        if not current.sql_commands and not current.settings:
            ptype = extra.proposal_type  # nothing yet (the query as it is): the index alone
        elif ptype == "index":
            ptype = "composite_index"
        impact = dataclasses.replace(
            current.estimated_impact,
            storage_overhead_mb=round(current.estimated_impact.storage_overhead_mb
                                      + extra.estimated_impact.storage_overhead_mb, 2),
            complexity="medium" if current.sql_commands else extra.estimated_impact.complexity)
        return dataclasses.replace(
            current, agent=agent, proposal_type=ptype,
            sql_commands=(*kept_commands, *extra.sql_commands),
            rollback_commands=(*extra.rollback_commands, *kept_rollback),
            rationale=f"{current.rationale} Step {step}: {extra.rationale}".strip(),
            estimated_impact=impact,
            validation_steps=(*current.validation_steps, *extra.validation_steps[:-1]))
    return None
