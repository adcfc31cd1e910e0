"""gemini-2.0-flash: pre-computation (pure).

A materialized view of an aggregation plus the rewrite that reads it (`materialize`
builds both from the parsed query); otherwise one low-risk index
(`index_design.fallback_index`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from sqlglot import exp

from afs.brains.strategists.evidence import FAST_MS, Decision, Evidence, insights_of, nothing
from afs.brains.strategists.index_design import fallback_index
from afs.models import AgentKey, AnalysisContext, EstimatedImpact, OptimizationProposal, RiskLevel
from afs.pg.names import ident, object_name, short_hash
from afs.pg.plan import fmt_count, fmt_ms
from afs.pg.stats import column_type, column_width, distinct_values
from afs.query.query import Query
from afs.query.shape import aggregates, conjuncts, function_name

MV_MIN_ROWS: Final = 10_000  # rows aggregated for a materialized view to pay off
MV_MAX_ROWS_SHARE: Final = 0.25  # a view keeping more of its table's rows saves too little
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


ColumnTypes = Callable[[exp.Column], "str | None"]  # a column's type, when known


@dataclass(frozen=True)
class MaterializedView:
    name: str
    definition: str  # the SELECT stored in the view
    rewrite: str  # the query that reads it and returns the original query's rows
    columns: tuple[str, ...]  # the view's columns
    filter_columns: tuple[str, ...]  # view columns the rewrite filters on
    group_columns: tuple[str, ...]  # view columns that identify a row; () when unknown
    moved: tuple[str, ...]  # predicates moved from the query into the rewrite
    # per group column: the (qualifier, column) of the query it holds; None for an expression
    group_sources: tuple[tuple[str | None, str] | None, ...] = ()
    regrouped: bool = False  # the view groups by more than the query; the rewrite re-aggregates


def _output_name(node: exp.Expr) -> str:
    """The column name PostgreSQL gives an unaliased select item (FigureColname, simplified)."""
    if isinstance(node, exp.Column):
        return str(node.name)
    if isinstance(node, exp.Cast):
        inner = _output_name(node.this)
        return inner if inner != "?column?" else node.to.sql(dialect="postgres").lower().split("(")[0]
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Filter):  # count(*) FILTER (WHERE …) is named after its function
        return _output_name(node.this)
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


def materialize(query: Query, column_types: ColumnTypes | None = None) -> MaterializedView | str:
    """A materialized view of an aggregate query and the rewrite reading it, or why not.

    The view never holds a literal of the query's WHERE or HAVING: it would be a cache of
    today's answer. It stores the query without ORDER BY / LIMIT / OFFSET, and

    * WHERE terms that only test GROUP BY columns move to the rewrite (filtering whole
      groups commutes with grouping), so the view serves every value and an index on
      those columns serves the lookup;
    * any other WHERE term with a literal (`status = 'paid'`, `country IN (…)`,
      `amount > 100`) moves to the rewrite too, and the columns it tests become GROUP BY
      keys of the view: the rewrite filters the view and re-aggregates its groups
      (count → sum of counts, sum → sum of sums, min/max → min/max, avg → sum / count).
      An aggregate that cannot be re-aggregated exactly (count(DISTINCT …), string_agg,
      a sum of floating-point values, …) means no view;
    * HAVING moves to the rewrite, its aggregates read from the view.

    A range on a timestamp makes the timestamp itself a group key: exact, but a view
    about as large as the table, which the caller declines (`decide_precomputation`).
    Day buckets would be smaller but exact only for bounds on whole days (and, for
    timestamptz, in one time zone), which the query's other parameter values are not.
    Terms without literals (join conditions, `shipped_at > created_at`) stay in the view.
    The rewrite keeps the original column names, order, ORDER BY and LIMIT, so it
    returns the same rows. `column_types` tells the type of a column when known."""
    return _materialize(query.tree, column_types)


def _materialize(tree: exp.Expr | None, column_types: ColumnTypes | None = None) -> MaterializedView | str:
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

    for join in tree.args.get("joins") or ():
        if join.args.get("on") is not None and _has_literal(join.args["on"]):
            return "a literal in a JOIN condition would stay in the view (a cache of today's answer)"

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
    where = core.args.get("where")
    terms = conjuncts(where.this) if where is not None else []
    having = core.args.get("having")
    simple = bool(plain_group) and core.find(exp.Window) is None and distinct is None
    group_sql = {_expression_key(g, one_table) for g in group_exprs if isinstance(g, exp.Column)}

    def on_group_keys(term: exp.Expr) -> bool:
        columns = list(term.find_all(exp.Column))
        return (bool(columns) and all(_expression_key(c, one_table) in group_sql for c in columns)
                and term.find(exp.Subquery, exp.Select, exp.AggFunc, exp.Window) is None)

    literal_terms = [t for t in terms if _has_literal(t)]
    split = _Split(core, items, names, order, limit, offset, one_table)
    if not simple and (literal_terms or (having is not None and _has_literal(having.this))):
        if not (plain_group or group is None) or distinct is not None or core.find(exp.Window) is not None:
            return ("a literal filter on a query with DISTINCT, windows or grouping sets "
                    "cannot move out of the view")
        return _regroup(split, group_exprs, column_types)
    if not all(on_group_keys(t) for t in literal_terms):
        return _regroup(split, group_exprs, column_types)

    moved: list[exp.Expr] = []
    filter_columns: list[str] = []
    if simple and where is not None:
        keep: list[exp.Expr] = []
        for term in terms:
            if not on_group_keys(term):
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
    if having is not None and _has_literal(having.this):
        # a view row is one group: the HAVING test reads the group's aggregates from the view
        moved_having = having.this.copy()
        created: set[int] = set()
        for unit in _aggregate_units(moved_having):
            found = view_column(unit, "afs_h", prefer_names=False)
            if found is None:
                return "a HAVING aggregate is not a column of the view"
            column = _col(found)
            created.add(id(column))
            unit.replace(column)
        for column in list(moved_having.find_all(exp.Column)):
            if id(column) not in created:
                found = view_column(column, "afs_g", prefer_names=False)
                if found is None:
                    return "a HAVING column is not a column of the view"
                column.replace(_col(found))
        moved.append(moved_having)
        core.set("having", None)

    group_columns: list[str] = []
    sources: list[tuple[str | None, str] | None] = []
    if plain_group:
        for g in group_exprs:
            output = _match_output(g, items, names, False, one_table)
            if output is None:
                hidden = [view_names[i] for i, it in enumerate(view_items)
                          if i >= len(items)
                          and _expression_key(it.unalias(), one_table) == _expression_key(g, one_table)]
                if not hidden:
                    group_columns, sources = [], []
                    break
                column_name = hidden[0]
            else:
                column_name = view_names[output]
            if column_name not in group_columns:
                group_columns.append(column_name)
                sources.append(_source(g))

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
        group_columns=tuple(group_columns), moved=tuple(m.sql(dialect="postgres") for m in moved),
        group_sources=tuple(sources))


# -- the view groups by the filtered columns; the rewrite filters and re-aggregates ------------
_LITERALS = (exp.Literal, exp.Boolean, exp.Placeholder, exp.Parameter)
FLOAT_TYPES: Final = ("real", "double precision", "float")


def _has_literal(node: exp.Expr) -> bool:
    """A literal a parameter set could vary (NULL is not one)."""
    return node.find(*_LITERALS) is not None


def _source(node: exp.Expr) -> tuple[str | None, str] | None:
    return (str(node.table) or None, str(node.name)) if isinstance(node, exp.Column) else None


def _aggregate_units(node: exp.Expr) -> list[exp.Expr]:
    """The outermost aggregate calls in `node` (with their FILTER), outside window functions."""
    found: list[exp.Expr] = []
    for agg in node.find_all(exp.AggFunc):
        if agg.find_ancestor(exp.Window) is not None:
            continue
        unit = agg.parent if isinstance(agg.parent, exp.Filter) else agg
        if any(u is unit or unit.find_ancestor(type(u)) is u for u in found):
            continue
        if not any(a is not agg and isinstance(a, exp.AggFunc) for a in _ancestors(agg)):
            found.append(unit)
    return found


def _ancestors(node: exp.Expr) -> list[exp.Expr]:
    out: list[exp.Expr] = []
    parent = node.parent
    while parent is not None:
        out.append(parent)
        parent = parent.parent
    return out


@dataclass(frozen=True)
class _Partial:
    """How one aggregate of the query is stored in the view and summed up again in the rewrite."""

    parts: tuple[exp.Expr, ...]  # what the view stores per group
    combine: Callable[[Sequence[exp.Expr]], exp.Expr]  # the rewrite's expression over those columns


def _partial(unit: exp.Expr, column_types: ColumnTypes | None) -> _Partial | str:
    agg = unit.this if isinstance(unit, exp.Filter) else unit
    where = unit.args.get("expression") if isinstance(unit, exp.Filter) else None
    label = agg.sql(dialect="postgres")
    if isinstance(agg.this, exp.Distinct) or agg.args.get("distinct"):
        return f"{label} counts distinct values: it cannot be re-aggregated from the view's groups"
    argument = agg.this
    if isinstance(agg, exp.Sum | exp.Avg) and isinstance(argument, exp.Column) and column_types is not None:
        data_type = (column_types(argument) or "").lower()
        if data_type.startswith(FLOAT_TYPES):
            return f"{label} sums floating-point values: a sum of partial sums may differ in the last digits"

    def filtered(node: exp.Expr) -> exp.Expr:
        return exp.Filter(this=node, expression=where.copy()) if where is not None else node

    if isinstance(agg, exp.Count):
        return _Partial((unit.copy(),), lambda c: exp.cast(
            exp.func("coalesce", exp.Sum(this=c[0]), exp.Literal.number(0)), "bigint"))
    if isinstance(agg, exp.Sum):
        return _Partial((unit.copy(),), lambda c: exp.Sum(this=c[0]))
    if isinstance(agg, exp.Min):
        return _Partial((unit.copy(),), lambda c: exp.Min(this=c[0]))
    if isinstance(agg, exp.Max):
        return _Partial((unit.copy(),), lambda c: exp.Max(this=c[0]))
    if isinstance(agg, exp.Avg) and argument is not None:
        return _Partial((filtered(exp.Sum(this=argument.copy())), filtered(exp.Count(this=argument.copy()))),
                        lambda c: exp.Div(this=exp.Sum(this=c[0]), typed=True,  # as avg() divides
                                          expression=exp.func("nullif", exp.Sum(this=c[1]),
                                                              exp.Literal.number(0))))
    return f"{label} cannot be re-aggregated from the view's groups"


@dataclass(frozen=True)
class _Split:
    """The query as `_materialize` takes it apart: `core` (the query without ORDER BY, LIMIT and
    OFFSET), its output items and their names, the parts taken off, and whether it reads one
    table (no join: column keys compare without their table)."""

    core: exp.Select
    items: Sequence[exp.Expr]
    names: Sequence[str]
    order: exp.Order | None
    limit: exp.Expr | None
    offset: exp.Expr | None
    one_table: bool


def _regroup(split: _Split, group_exprs: Sequence[exp.Expr],
             column_types: ColumnTypes | None) -> MaterializedView | str:
    """The view grouped by the query's keys and every column its literal filters test; the
    rewrite filters it and re-aggregates."""
    core, items, names, one_table = split.core, split.items, split.names, split.one_table
    order, limit, offset = split.order, split.limit, split.offset
    where = core.args.get("where")
    keep: list[exp.Expr] = []
    moved: list[exp.Expr] = []
    for term in conjuncts(where.this) if where is not None else []:
        if not _has_literal(term):
            keep.append(term)
        elif term.find(exp.Subquery, exp.Select, exp.AggFunc, exp.Window) is not None:
            return (f"the filter {term.sql(dialect='postgres')} has a subquery or an aggregate: "
                    "it cannot move out of the view")
        elif not list(term.find_all(exp.Column)):
            keep.append(term)  # a constant condition: no parameter of the query family
        else:
            moved.append(term)

    used: set[str] = set()
    keys: list[tuple[exp.Expr, str]] = []  # (expression of the query, view column)
    key_names: dict[str, str] = {}

    def fresh(preferred: str | None, prefix: str) -> str:
        if (preferred and preferred != "?column?" and preferred not in used
                and not preferred.startswith("afs_")):
            used.add(preferred)
            return preferred
        n = 1
        while f"{prefix}{n}" in used:
            n += 1
        used.add(f"{prefix}{n}")
        return f"{prefix}{n}"

    def add_key(expression: exp.Expr, preferred: str | None) -> str:
        key = _expression_key(expression, one_table)
        if key not in key_names:
            key_names[key] = fresh(preferred, "afs_g")
            keys.append((expression, key_names[key]))
        return key_names[key]

    group_columns: list[str] = []
    for g in group_exprs:
        found = _match_output(g, items, names, False, one_table)
        group_columns.append(add_key(g, names[found] if found is not None else
                                     (str(g.name) if isinstance(g, exp.Column) else None)))
    filter_columns: list[str] = []
    for term in moved:
        for column in term.find_all(exp.Column):
            filter_columns.append(add_key(column, str(column.name)))

    partials: dict[str, tuple[_Partial, tuple[str, ...]]] = {}
    having = core.args.get("having")
    order_targets = [o.this for o in order.expressions] if order else []
    output_names = set(names)

    def is_output_reference(target: exp.Expr) -> bool:
        return ((isinstance(target, exp.Literal) and not target.is_string)
                or (isinstance(target, exp.Column) and not target.table and target.name in output_names
                    and _expression_key(target, one_table) not in key_names))

    sources = [*(it.unalias() if isinstance(it, exp.Alias) else it for it in items),
               *([having.this] if having is not None else []),
               *(t for t in order_targets if not is_output_reference(t))]
    bases = [it.unalias() if isinstance(it, exp.Alias) else it for it in items]
    for source in sources:
        for unit in _aggregate_units(source):
            key = _expression_key(unit, one_table)
            if key in partials:
                continue
            partial = _partial(unit, column_types)
            if isinstance(partial, str):
                return partial
            position = next((i for i, b in enumerate(bases) if b is unit or b == unit), None)
            preferred = names[position] if position is not None and len(partial.parts) == 1 else None
            partials[key] = (partial, tuple(fresh(preferred if i == 0 else None, "afs_a")
                                            for i in range(len(partial.parts))))

    def transform(node: exp.Expr) -> exp.Expr | None:
        created: set[int] = set()

        def replace(sub: exp.Expr) -> exp.Expr:
            if isinstance(sub, exp.Filter | exp.AggFunc) and _expression_key(sub, one_table) in partials:
                partial, columns = partials[_expression_key(sub, one_table)]
                combined = partial.combine([_col(c) for c in columns])
                created.update(id(c) for c in combined.find_all(exp.Column))
                return combined
            key_name = key_names.get(_expression_key(sub, one_table))
            if key_name is not None and not isinstance(sub, exp.Literal):
                column = _col(key_name)
                created.add(id(column))
                return column
            return sub

        out = node.copy().transform(replace)
        if any(id(c) not in created for c in out.find_all(exp.Column)):
            return None  # a column that is neither a group key nor inside an aggregate
        return out

    rewrite_items: list[exp.Expr] = []
    for base, output in zip(bases, names, strict=True):
        new = transform(base)
        if new is None:
            return f"{base.sql(dialect='postgres')} is neither a group key nor an aggregate"
        same = isinstance(new, exp.Column) and new.name == output
        rewrite_items.append(new if same else _alias(new, output))
    select = exp.select(*rewrite_items).from_(exp.to_table("afs_mv"))
    moved_sql: list[str] = []
    for term in moved:
        new = transform(term)
        if new is None:  # pragma: no cover - every column of a moved term is a key
            return "internal: a filter column is missing from the view"
        select = select.where(new)
        moved_sql.append(new.sql(dialect="postgres"))
    if group_columns:
        select = select.group_by(*(_col(c) for c in dict.fromkeys(group_columns)))
    if having is not None:
        new = transform(having.this)
        if new is None:
            return "HAVING tests a column that is neither a group key nor an aggregate"
        select = select.having(new)
    if order is not None:
        ordered_items: list[exp.Expr] = []
        for item in order.expressions:
            ordered = item.copy()
            if not is_output_reference(item.this):
                new = transform(item.this)
                if new is None:
                    return f"ORDER BY {item.this.sql(dialect='postgres')} is not computable from the view"
                ordered.set("this", new)
            ordered_items.append(ordered)
        select.set("order", exp.Order(expressions=ordered_items))
    if limit is not None:
        select.set("limit", limit.copy())
    if offset is not None:
        select.set("offset", offset.copy())

    view_items: list[exp.Expr] = []
    for expression, key_column in keys:
        plain = isinstance(expression, exp.Column) and expression.name == key_column
        view_items.append(expression.copy() if plain else _alias(expression.copy(), key_column))
    for partial, columns in partials.values():
        view_items += [_alias(part, c) for part, c in zip(partial.parts, columns, strict=True)]
    view = core.copy()
    view.set("expressions", view_items)
    view.set("where", exp.Where(this=exp.and_(*keep)) if keep else None)
    view.set("group", exp.Group(expressions=[e.copy() for e, _ in keys]) if keys else None)
    view.set("having", None)
    definition = view.sql(dialect="postgres")
    name = f"afs_mv_{short_hash(definition, 10)}"
    select = select.from_(exp.to_table(name))
    return MaterializedView(
        name=name, definition=definition, rewrite=select.sql(dialect="postgres"),
        columns=tuple(c for _, c in keys) + tuple(c for _, cs in partials.values() for c in cs),
        filter_columns=tuple(dict.fromkeys(filter_columns)), group_columns=tuple(c for _, c in keys),
        moved=tuple(moved_sql), group_sources=tuple(_source(e) for e, _ in keys), regrouped=True)


def _aggregate_input_rows(ev: Evidence) -> float:
    aggregates = [n for n in ev.nodes if n.node_type == "Aggregate"]
    if aggregates:
        return max(max(n.input_rows for n in aggregates),
                   sum(n.scanned for n in ev.nodes if n.is_scan))
    return float(sum(info.rows for info in ev.ctx.tables.values()))


def _group_estimate(ev: Evidence, mv: MaterializedView, table: str | None) -> float:
    """Rows of the view: the query's own groups when the view is the query's grouping (from the
    plan), else the product of n_distinct of its group keys, at most the rows of its tables."""
    aggregates = [n for n in ev.nodes if n.node_type == "Aggregate"]
    if aggregates and not mv.moved:
        return max(1.0, min(aggregates, key=lambda n: n.depth).rows)
    if not mv.group_columns:
        return 1.0
    estimate = 1.0
    for position, column in enumerate(mv.group_columns):
        source = mv.group_sources[position] if position < len(mv.group_sources) else None
        owner = ev.resolver.table_of(source[0], source[1]) if source else table
        info = ev.table(owner) if owner else None
        stats = ev.stats(owner, source[1] if source else column) if owner else None
        nd = distinct_values(stats, info.rows) if stats and info else None
        estimate *= nd if nd else 100.0
    return max(1.0, min(_base_rows(ev, table), estimate))


def _base_rows(ev: Evidence, table: str | None) -> float:
    """Rows of the largest table the view reads."""
    rows = [float(info.rows) for t in ev.query_tables() if (info := ev.table(t)) is not None]
    return max(rows, default=1.0)


def _column_types(ev: Evidence) -> ColumnTypes:
    def type_of(column: exp.Column) -> str | None:
        resolved = ev.resolver.column(column)  # the one resolver, for a node of the query
        info = ev.table(resolved[0]) if resolved else None
        return column_type(info, str(column.name)) if info else None
    return type_of


def decide_precomputation(ctx: AnalysisContext, agent: AgentKey = "gemini20flash") -> Decision:
    """gemini-2.0-flash: a materialized view for an aggregation; else a low-risk index."""
    ev = Evidence(ctx)
    insights = insights_of(ev)
    if not ev.shape.grouped and ctx.features.aggregation_count == 0:
        return fallback_index(agent, ev, insights,
                               "no aggregation to precompute: a single low-risk index at most")
    mv = _materialize(ev.shape.tree, _column_types(ev))
    if isinstance(mv, str):
        return fallback_index(agent, ev, insights, f"no materialized view: {mv}")
    table = ev.main_table()
    aggregated = _aggregate_input_rows(ev)
    groups = _group_estimate(ev, mv, table)
    insights.append(f"the aggregation reads ~{fmt_count(aggregated)} rows to produce "
                    f"~{fmt_count(groups)} {'view rows' if mv.regrouped else 'groups'}")
    if aggregated < MV_MIN_ROWS and ctx.execution_ms < 10 * FAST_MS:
        return nothing(insights, f"the aggregation reads only {fmt_count(aggregated)} rows: "
                        "a materialized view would not pay for its refreshes", 0.6, table)
    base = _base_rows(ev, table)
    if groups > MV_MAX_ROWS_SHARE * base:
        return fallback_index(agent, ev, insights, (
            f"no materialized view: grouped by {', '.join(mv.group_columns)} it would keep "
            f"~{fmt_count(groups)} of {fmt_count(base)} rows, nearly the table itself"))
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
    if mv.regrouped:
        moved = (f" The view keeps no literal of the query: it groups by {', '.join(mv.group_columns)} "
                 f"instead of filtering, and the rewrite applies {' AND '.join(mv.moved)} to it (with the "
                 "view's index) and re-aggregates its groups (count → sum of counts, sum → sum of sums, "
                 "min/max → min/max, avg → sum / count), so the view answers every value of the filter.")
    elif mv.moved:
        moved = (f" The filter {' AND '.join(mv.moved)} moves from the view to the rewrite and uses the "
                 f"view's index, so the view also answers other values.")
    else:
        moved = ""
    staleness = (" The view is stale between refreshes, and each refresh costs about its build time."
                 + (f" {table} sees {wpr:.2f} writes per read: the view goes stale quickly."
                    if wpr >= 0.05 else f" {table} is read-mostly ({wpr:.2f} writes per read), so staleness "
                    "is cheap to manage." if table else ""))
    stored = (f"stores the aggregates of ~{fmt_count(groups)} finer groups; the rewritten query reads at "
              f"most those rows" if mv.regrouped else
              f"stores the result; the rewritten query reads ~{fmt_count(groups)} rows")
    rationale = (f"The query aggregates ~{fmt_count(aggregated)} rows on every run "
                 f"({fmt_ms(ctx.execution_ms)}). {mv.name} {stored} instead.{moved} "
                 f"Keep it fresh with {refresh}, "
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


