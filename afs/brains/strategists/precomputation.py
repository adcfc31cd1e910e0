"""gemini-2.0-flash: pre-computation (pure).

A materialized view of an aggregation plus the rewrite that reads it (`materialize`
builds both from the parsed query); otherwise one low-risk index
(`index_design.fallback_index`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlglot import exp

from afs.brains.strategists.evidence import FAST_MS, Decision, Evidence, insights_of, nothing
from afs.brains.strategists.index_design import fallback_index
from afs.features import aggregates, conjuncts, function_name, read_query
from afs.models import AgentKey, AnalysisContext, EstimatedImpact, OptimizationProposal, RiskLevel
from afs.pg.names import ident, object_name, short_hash
from afs.pg.plan import fmt_count, fmt_ms
from afs.pg.stats import column_type, column_width, distinct_values

MV_MIN_ROWS: Final = 10_000  # rows aggregated for a materialized view to pay off
VOLATILE_FUNCTIONS: Final = frozenset({
    "now", "current_timestamp", "current_date", "current_time", "current_datetime",
    "localtime", "localtimestamp", "clock_timestamp", "statement_timestamp",
    "transaction_timestamp", "timeofday", "random", "rand", "setseed", "nextval",
    "currval", "lastval", "gen_random_uuid", "uuid", "uuid_generate_v4", "txid_current",
    "pg_current_xact_id", "random_normal",
})


def _volatile(tree: exp.Expr) -> tuple[str, ...]:
    found = {function_name(f) for f in tree.find_all(exp.Func)}
    return tuple(sorted(found & VOLATILE_FUNCTIONS))


@dataclass(frozen=True)
class MaterializedView:
    name: str
    definition: str  # the SELECT stored in the view
    rewrite: str  # the query that reads it and returns the original query's rows
    columns: tuple[str, ...]  # the view's columns
    filter_columns: tuple[str, ...]  # view columns the rewrite filters on
    group_columns: tuple[str, ...]  # view columns that identify a row; () when unknown
    moved: tuple[str, ...]  # predicates moved from the view to the rewrite


def _output_name(node: exp.Expr) -> str:
    """The column name PostgreSQL gives an unaliased select item (FigureColname, simplified)."""
    if isinstance(node, exp.Column):
        return str(node.name)
    if isinstance(node, exp.Cast):
        inner = _output_name(node.this)
        return inner if inner != "?column?" else node.to.sql(dialect="postgres").lower().split("(")[0]
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Func):
        if isinstance(node, exp.Anonymous):
            return str(node.name).lower()
        head = re.match(r"[A-Za-z_][A-Za-z0-9_]*", node.sql(dialect="postgres"))
        return head.group(0).lower() if head else "?column?"
    return "?column?"


def _expression_key(node: exp.Expr, one_table: bool) -> str:
    """What identifies an expression of the query: its SQL, without table qualifiers when the
    query reads one table (then `o.status` is `status`; in a join it may be another table's)."""
    if not one_table:
        return node.sql(dialect="postgres")
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        column.set("table", None)
        column.set("db", None)
    return copy.sql(dialect="postgres")


def _match_output(target: exp.Expr, items: Sequence[exp.Expr], names: Sequence[str],
                  prefer_names: bool, one_table: bool) -> int | None:
    """The select item an ORDER BY / GROUP BY expression denotes, as PostgreSQL resolves it."""
    if isinstance(target, exp.Literal) and not target.is_string:
        try:
            position = int(target.this)
        except ValueError:
            return None
        return position - 1 if 0 < position <= len(items) else None
    if prefer_names and isinstance(target, exp.Column) and not target.table:
        hits = [i for i, n in enumerate(names) if n == target.name]
        if len(hits) == 1:
            return hits[0]
    bases = [it.unalias() if isinstance(it, exp.Alias) else it for it in items]
    for i, base in enumerate(bases):
        if base == target:
            return i
    key = _expression_key(target, one_table)
    hits = [i for i, base in enumerate(bases) if _expression_key(base, one_table) == key]
    return hits[0] if len(hits) == 1 else None


def _alias(node: exp.Expr, name: str) -> exp.Expr:
    return exp.alias_(node, exp.to_identifier(name, quoted=ident(name) != name))


def _col(name: str) -> exp.Column:
    return exp.column(exp.to_identifier(name, quoted=ident(name) != name))


def materialize(query: str) -> MaterializedView | str:
    """A materialized view of an aggregate query and the rewrite reading it, or why not.

    The view stores the query without ORDER BY / LIMIT / OFFSET. WHERE terms that
    only test GROUP BY columns are moved to the rewrite (filtering whole groups
    commutes with grouping), so the view serves every value and an index on those
    columns serves the lookup. The rewrite keeps the original column names, order,
    ORDER BY and LIMIT, so it returns the same rows."""
    return _materialize(read_query(query))


def _materialize(tree: exp.Expr | None) -> MaterializedView | str:
    """`materialize` of a parsed query (`tree` is left as it is)."""
    if not isinstance(tree, exp.Select):
        return "not a single SELECT"
    if tree.args.get("locks"):
        return "SELECT … FOR UPDATE cannot be precomputed"
    group = tree.args.get("group")
    distinct = tree.args.get("distinct")
    if not (group or distinct or aggregates(tree)):
        return "no aggregation (GROUP BY, aggregate or DISTINCT) to precompute"
    volatile = _volatile(tree)
    if volatile:
        return f"the query calls {', '.join(volatile)}(): a materialized view would freeze its value"
    if tree.find(exp.Placeholder, exp.Parameter):
        return "the query has parameters: a view can only hold constants"
    if distinct is not None and distinct.args.get("on") is not None:
        return "DISTINCT ON depends on ORDER BY: not precomputed"

    one_table = not tree.args.get("joins")
    core = tree.copy()
    order = core.args.get("order")
    limit, offset = core.args.get("limit"), core.args.get("offset")
    for key in ("order", "limit", "offset"):
        core.set(key, None)
    items = list(core.expressions)
    names: list[str] = []
    view_items: list[exp.Expr] = []
    view_names: list[str] = []
    rewrite_items: list[exp.Expr] = []
    explicit = False
    for i, item in enumerate(items):
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            return "SELECT * in an aggregate query: columns cannot be named safely"
        name = str(item.alias) if isinstance(item, exp.Alias) else _output_name(item)
        names.append(name)
        base = item.unalias() if isinstance(item, exp.Alias) else item
        if name == "?column?" or name in view_names:
            view_name = f"afs_c{i + 1}"
            explicit = True
            rewrite_items.append(_alias(_col(view_name), name))
        else:
            view_name = name
            rewrite_items.append(_col(name))
        view_names.append(view_name)
        view_items.append(item.copy() if isinstance(item, exp.Alias | exp.Column) and view_name == name
                          else _alias(base.copy(), view_name))

    def view_column(target: exp.Expr, prefix: str, prefer_names: bool) -> str | None:
        nonlocal explicit
        found = _match_output(target, items, names, prefer_names, one_table)
        if found is not None:
            return view_names[found]
        if distinct is not None:
            return None  # an extra column would change what DISTINCT collapses
        hidden = f"{prefix}{len(view_items) + 1}"
        view_items.append(_alias(target.copy(), hidden))
        view_names.append(hidden)
        explicit = True
        return hidden

    new_order: list[exp.Expr] = []
    for item in order.expressions if order else ():
        target = item.this
        if isinstance(target, exp.Literal) and not target.is_string:
            new_order.append(item.copy())
            continue
        sort_column = view_column(target, "afs_o", prefer_names=True)
        if sort_column is None:
            return f"ORDER BY {target.sql(dialect='postgres')} is not an output column"
        ordered = item.copy()
        ordered.set("this", _col(sort_column))
        new_order.append(ordered)

    plain_group = (group is not None and group.expressions
                   and not any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets"))
                   and all(not isinstance(g, exp.Literal) or not g.is_string for g in group.expressions))
    group_exprs: list[exp.Expr] = []
    if plain_group and group is not None:
        for g in group.expressions:
            if isinstance(g, exp.Literal):
                position = _match_output(g, items, names, False, one_table)
                if position is None:
                    return "GROUP BY position out of range"
                base = items[position]
                group_exprs.append(base.unalias() if isinstance(base, exp.Alias) else base)
            else:
                group_exprs.append(g)
    group_sql = {_expression_key(g, one_table) for g in group_exprs if isinstance(g, exp.Column)}
    moved: list[exp.Expr] = []
    filter_columns: list[str] = []
    where = core.args.get("where")
    if plain_group and where is not None and core.find(exp.Window) is None and distinct is None:
        keep: list[exp.Expr] = []
        for term in conjuncts(where.this):
            columns = list(term.find_all(exp.Column))
            movable = (columns and all(_expression_key(c, one_table) in group_sql for c in columns)
                       and term.find(exp.Subquery, exp.Select, exp.AggFunc, exp.Window) is None)
            if not movable:
                keep.append(term)
                continue
            moved_term = term.copy()
            for column in list(moved_term.find_all(exp.Column)):
                group_column = view_column(column, "afs_g", prefer_names=False)
                if group_column is None:
                    return "internal: a group column is missing from the view"
                if group_column not in filter_columns:
                    filter_columns.append(group_column)
                column.replace(_col(group_column))
            moved.append(moved_term)
        core.set("where", exp.Where(this=exp.and_(*keep)) if keep else None)

    group_columns: list[str] = []
    if plain_group:
        for g in group_exprs:
            found = _match_output(g, items, names, False, one_table)
            if found is None:
                hidden = [view_names[i] for i, it in enumerate(view_items)
                          if i >= len(items)
                          and _expression_key(it.unalias(), one_table) == _expression_key(g, one_table)]
                if not hidden:
                    group_columns = []
                    break
                group_columns.append(hidden[0])
            else:
                group_columns.append(view_names[found])
        group_columns = list(dict.fromkeys(group_columns))

    core.set("expressions", view_items)
    definition = core.sql(dialect="postgres")
    name = f"afs_mv_{short_hash(definition, 10)}"
    select: exp.Select = exp.select(*(rewrite_items if explicit else [exp.Star()])).from_(exp.to_table(name))
    if moved:
        select = select.where(*moved)
    if new_order:
        select.set("order", exp.Order(expressions=new_order))
    if limit is not None:
        select.set("limit", limit.copy())
    if offset is not None:
        select.set("offset", offset.copy())
    return MaterializedView(
        name=name, definition=definition, rewrite=select.sql(dialect="postgres"),
        columns=tuple(view_names), filter_columns=tuple(filter_columns),
        group_columns=tuple(group_columns), moved=tuple(m.sql(dialect="postgres") for m in moved))


def _aggregate_input_rows(ev: Evidence) -> float:
    aggregates = [n for n in ev.nodes if n.node_type == "Aggregate"]
    if aggregates:
        return max(max(n.input_rows for n in aggregates),
                   sum(n.scanned for n in ev.nodes if n.is_scan))
    return float(sum(info.rows for info in ev.ctx.tables.values()))


def _group_estimate(ev: Evidence, mv: MaterializedView, table: str | None) -> float:
    aggregates = [n for n in ev.nodes if n.node_type == "Aggregate"]
    if aggregates and not mv.moved:
        return max(1.0, min(aggregates, key=lambda n: n.depth).rows)
    info = ev.table(table) if table else None
    if not mv.group_columns or info is None:
        return 1.0 if not mv.group_columns else 1000.0
    estimate = 1.0
    for column in mv.group_columns:
        stats = info.column_stats.get(column)
        nd = distinct_values(stats, info.rows) if stats else None
        estimate *= nd if nd else 100.0
    return max(1.0, min(float(info.rows), estimate))


def decide_precomputation(ctx: AnalysisContext, agent: AgentKey = "gemini20flash") -> Decision:
    """gemini-2.0-flash: a materialized view for an aggregation; else a low-risk index."""
    ev = Evidence(ctx)
    insights = insights_of(ev)
    if not ev.shape.grouped and ctx.features.aggregation_count == 0:
        return fallback_index(agent, ev, insights,
                               "no aggregation to precompute: a single low-risk index at most")
    mv = _materialize(ev.shape.tree)
    if isinstance(mv, str):
        return fallback_index(agent, ev, insights, f"no materialized view: {mv}")
    table = ev.main_table()
    aggregated = _aggregate_input_rows(ev)
    groups = _group_estimate(ev, mv, table)
    insights.append(f"the aggregation reads ~{fmt_count(aggregated)} rows to produce "
                    f"~{fmt_count(groups)} groups")
    if aggregated < MV_MIN_ROWS and ctx.execution_ms < 10 * FAST_MS:
        return nothing(insights, f"the aggregation reads only {fmt_count(aggregated)} rows: "
                        "a materialized view would not pay for its refreshes", 0.6, table)
    commands = [f"CREATE MATERIALIZED VIEW {mv.name} AS {mv.definition}"]
    # The rewrite filters on group keys: index them. Unique when they are the whole group
    # key, which also allows REFRESH … CONCURRENTLY. A view read whole needs no index.
    unique = bool(mv.group_columns) and set(mv.filter_columns) <= set(mv.group_columns)
    index_cols = list(dict.fromkeys([*mv.filter_columns, *(mv.group_columns if unique else ())]))
    if mv.filter_columns and unique:
        commands.append(f"CREATE UNIQUE INDEX {object_name(mv.name, *index_cols, suffix='key')} "
                        f"ON {mv.name} ({', '.join(ident(c) for c in index_cols)})")
    elif mv.filter_columns:
        commands.append(f"CREATE INDEX {object_name(mv.name, *mv.filter_columns, suffix='idx')} "
                        f"ON {mv.name} ({', '.join(ident(c) for c in mv.filter_columns)})")
    commands.append(f"ANALYZE {mv.name}")
    wpr = ev.writes_per_read(table)
    risk: RiskLevel = "low" if wpr < 0.05 else "medium"
    info = ev.table(table) if table else None
    # heap tuple header + the columns (real widths for the table's own columns, 8 bytes for
    # aggregates) + line pointer
    widths = [column_width(info, c) if info and column_type(info, c) else 8 for c in mv.columns]
    storage = round(max(0.01, groups * (24 + max(8, sum(widths)) + 4) / 1024 / 1024), 2)
    improvement = round(max(10.0, min(95.0, 100.0 * (1.0 - groups / max(aggregated, 1.0)))), 1)
    if mv.filter_columns and unique:
        refresh = f"REFRESH MATERIALIZED VIEW CONCURRENTLY {mv.name} (the unique index allows it)"
    elif mv.group_columns:
        refresh = (f"REFRESH MATERIALIZED VIEW {mv.name} (a unique index on "
                   f"({', '.join(mv.group_columns)}) would allow CONCURRENTLY)")
    else:
        refresh = f"REFRESH MATERIALIZED VIEW {mv.name}"
    moved = (f" The filter {' AND '.join(mv.moved)} moves from the view to the rewrite and uses the "
             f"view's index, so the view also answers other values." if mv.moved else "")
    staleness = (f" {table} sees {wpr:.2f} writes per read: the view goes stale between refreshes."
                 if wpr >= 0.05 else f" {table} is read-mostly ({wpr:.2f} writes per read), so staleness "
                 "is cheap to manage." if table else "")
    rationale = (f"The query aggregates ~{fmt_count(aggregated)} rows into ~{fmt_count(groups)} groups "
                 f"on every run ({fmt_ms(ctx.execution_ms)}). {mv.name} stores the result; the rewritten "
                 f"query reads ~{fmt_count(groups)} rows instead.{moved} Keep it fresh with {refresh}, "
                 f"e.g. from a scheduled batch job.{staleness}")
    proposal = OptimizationProposal(
        agent=agent, proposal_type="materialized_view", sql_commands=tuple(commands),
        rollback_commands=(f"DROP MATERIALIZED VIEW IF EXISTS {mv.name}",), rationale=rationale,
        estimated_impact=EstimatedImpact(query_time_improvement=improvement, storage_overhead_mb=storage,
                                         complexity="medium", risk=risk),
        rewritten_query=mv.rewrite, needs_refresh=True,
        validation_steps=(f"the rewritten query ({mv.rewrite}) returns the same rows as the original "
                          "(count and checksum)",
                          f"EXPLAIN of the rewrite scans {mv.name} only",
                          refresh.split(" (")[0] + " succeeds"))
    return Decision(insights=tuple(insights),
                    actions=(f"Create materialized view {mv.name} and read it with: {mv.rewrite}",),
                    confidence=0.7 if ev.nodes else 0.55, target_table=table,
                    estimated_improvement=improvement, proposal=proposal)


