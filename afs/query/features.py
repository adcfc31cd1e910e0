"""What a query is made of: counts for the router, tables and column uses for the agents (pure).

Reads the one `Query` (afs.query.query): pglast decided it is one valid query, sqlglot
(dialect "postgres") read it once, unquoted identifiers folded to lower case as PostgreSQL does.

Counts cover the whole statement, every nesting level included:
    join_count           JOIN clauses, comma joins included
    subquery_count       nested query blocks: derived tables, scalar, IN and EXISTS
                         subqueries, CTE bodies (the branches of a set operation are not)
    aggregation_count    aggregate calls, except those used as window functions
    window_count         window function calls (`… OVER …`)
    set_operation_count  each UNION / INTERSECT / EXCEPT
    order_by_count       ORDER BY clauses of query blocks (not those of windows or aggregates)
    has_limit            the outermost query has LIMIT or FETCH FIRST

complexity_score is the seed's formula plus one per GROUP BY clause, so that the seed's
medium scenario ("1 JOIN, 1 aggregation, GROUP BY") scores 3:
    joins + subqueries + aggregations + windows + 2 × set operations + GROUP BY clauses

Column roles, with the table found by the one resolver (`Query.table_of`: through aliases
within each query block and its enclosing blocks, for correlated references). An unqualified
column belongs to the block's table when the block reads a single base table; otherwise its
table is None, as it is for columns of CTEs and derived tables.
    equality  col = const, col IN (consts), col IS NULL
    range     col <, <=, >, >= const; col BETWEEN const AND const; col LIKE 'prefix%'
    join      col = col of another table (in ON or WHERE), JOIN … USING (col), col IN (subquery)
    group     a plain column as GROUP BY key (ordinals resolved) or window PARTITION BY key
    sort      a plain column as ORDER BY key (ordinals and output names resolved) or window
              ORDER BY key; operator "ASC" / "DESC"
    select    the select list; `*` and `t.*` as column "*"
    other     any other use: in functions, casts or aggregates, <>, NOT IN, IS NOT NULL, …
A constant is an expression without columns of the block (a scalar subquery is one); `value`
holds its Python value when it is a literal (a cast literal keeps its value), otherwise None.

`see_through` puts the tables a query's views read in its features. What the strategists need
beyond QueryFeatures is afs.query.shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from afs.errors import InputError
from afs.models import ColumnRole, ColumnUse, QueryFeatures
from afs.query.query import BLOCKS, Query, base_table, local, table_name
from afs.query.text import check_input

_COMPARISONS: dict[type[exp.Expr], tuple[ColumnRole, str, str]] = {  # role, operator, when flipped
    exp.EQ: ("equality", "=", "="),
    exp.GT: ("range", ">", "<"),
    exp.GTE: ("range", ">=", "<="),
    exp.LT: ("range", "<", ">"),
    exp.LTE: ("range", "<=", ">="),
}
_UNKNOWN_POSITION = 1 << 30


def extract_features(query: Query | str) -> QueryFeatures:
    """Describe one query (read once: `Query.read`); InputError when it is not one valid query
    or sqlglot cannot analyse it."""
    query = query if isinstance(query, Query) else Query.read(query)
    tree = query.readable
    if query.problem is not None:  # e.g. an alias used twice in one FROM
        raise InputError(f"cannot analyse the query: {query.problem}")
    sources = sorted((source for scope in query.scopes for source in _base_sources(scope)),
                     key=lambda source: source[0])
    uses = sorted((use for scope in query.scopes for use in _Collector(query, scope).collect()),
                  key=lambda use: use[0])
    aliases: dict[str, str] = {}
    for _, name, alias in sources:
        if alias:
            aliases.setdefault(alias, name)

    joins = _count(tree, exp.Join)
    subqueries = sum(1 for block in tree.find_all(*BLOCKS) if _is_subquery(block))
    aggregations = sum(1 for agg in tree.find_all(exp.AggFunc) if not _is_window_function(agg))
    windows = sum(1 for window in tree.find_all(exp.Window) if window.arg_key != "windows")
    set_operations = _count(tree, exp.SetOperation)
    score = joins + subqueries + aggregations + windows + 2 * set_operations + _count(tree, exp.Group)
    return QueryFeatures(
        join_count=joins,
        subquery_count=subqueries,
        aggregation_count=aggregations,
        window_count=windows,
        set_operation_count=set_operations,
        order_by_count=sum(1 for order in tree.find_all(exp.Order)
                           if order.arg_key == "order" and isinstance(order.parent, exp.Query)),
        has_limit=_has_limit(tree),
        tables=tuple(dict.fromkeys(name for _, name, _ in sources)),
        aliases=aliases,
        columns=tuple(dict.fromkeys(use for _, use in uses)),
        main_table=_main_table(tree, {cte.alias_or_name: cte.this for cte in tree.find_all(exp.CTE)}),
        complexity_score=score,
        complexity="low" if score <= 2 else "medium" if score <= 5 else "high",
    )


# -- views ------------------------------------------------------------------------------
def see_through(features: QueryFeatures, views: Mapping[str, str]) -> QueryFeatures:
    """`features` with each view it reads replaced by what the view reads, so that agents
    analyse, index and measure the tables PostgreSQL actually scans.

    `views` maps a view's name (as in `tables`) to its SELECT (pg_get_viewdef), for the views
    of the query and those they read in turn. A use of a view's column becomes a use of the
    base column behind it when the view selects that column plainly (`user_id AS customer`),
    otherwise of no table; the view's own column uses (its joins and filters) are added; the
    counts add up; an alias of a view stands for the view's main table.
    """
    readings = {name: reading for name, sql in views.items()
                if (reading := _view_reading(sql)) is not None}
    if not any(table in readings for table in features.tables):
        return features

    def tables_of(name: str, seen: frozenset[str]) -> list[str]:
        if name not in readings or name in seen:
            return [name]
        return [t for inner in readings[name][0].tables for t in tables_of(inner, seen | {name})]

    def main_of(name: str | None, seen: frozenset[str] = frozenset()) -> str | None:
        if name not in readings or name in seen:
            return name
        return main_of(readings[name][0].main_table, seen | {name})

    def column_of(table: str | None, column: str, seen: frozenset[str]) -> tuple[str | None, str]:
        if table not in readings or table in seen:
            return table, column
        base = readings[table][1].get(column)
        return column_of(*base, seen | {table}) if base else (None, column)

    def uses_of(uses: tuple[ColumnUse, ...], seen: frozenset[str]) -> list[ColumnUse]:
        mapped: list[ColumnUse] = []
        for use in uses:
            if use.table in readings and use.table not in seen:
                table, column = column_of(use.table, use.column, seen)
                mapped.append(dataclasses.replace(use, table=table, column=column))
            else:
                mapped.append(use)
        return mapped

    read = [v for t in features.tables for v in _views_under(t, readings)]
    tables = tuple(dict.fromkeys(t for name in features.tables for t in tables_of(name, frozenset())))
    columns = uses_of(features.columns, frozenset())
    for view in dict.fromkeys(read):
        columns += uses_of(readings[view][0].columns, frozenset())
    parts = [features, *(readings[v][0] for v in dict.fromkeys(read))]
    score = sum(p.complexity_score for p in parts)
    return QueryFeatures(
        join_count=sum(p.join_count for p in parts),
        subquery_count=sum(p.subquery_count for p in parts),
        aggregation_count=sum(p.aggregation_count for p in parts),
        window_count=sum(p.window_count for p in parts),
        set_operation_count=sum(p.set_operation_count for p in parts),
        order_by_count=sum(p.order_by_count for p in parts),
        has_limit=features.has_limit,
        tables=tables,
        aliases={alias: main_of(table) or table for alias, table in features.aliases.items()},
        columns=tuple(dict.fromkeys(columns)),
        main_table=main_of(features.main_table),
        complexity_score=score,
        complexity="low" if score <= 2 else "medium" if score <= 5 else "high",
    )


def _views_under(name: str, readings: Mapping[str, tuple[QueryFeatures, dict[str, tuple[str, str]]]],
                 seen: frozenset[str] = frozenset()) -> list[str]:
    """`name` and the views it reads, when it is a view."""
    if name not in readings or name in seen:
        return []
    return [name, *(v for inner in readings[name][0].tables
                    for v in _views_under(inner, readings, seen | {name}))]


def _view_reading(sql: str) -> tuple[QueryFeatures, dict[str, tuple[str, str]]] | None:
    """A view's features and its output columns that are plain base columns
    (name → (table, column)); None when AFS cannot read the view."""
    try:
        check_input(sql)
        query = Query.read(sql)
        features = extract_features(query)
    except InputError:
        return None
    tree = query.tree
    outputs: dict[str, tuple[str, str]] = {}
    if isinstance(tree, exp.Select):
        for item in tree.expressions:
            column = item.unalias()
            if isinstance(column, exp.Column) and not isinstance(column.this, exp.Star):
                table = query.table_of(column)
                if table is not None:
                    outputs[item.alias_or_name] = (table, column.name)
    return features, outputs


# -- counts -------------------------------------------------------------------------
def _count(tree: exp.Expr, kind: type[exp.Expr]) -> int:
    return sum(1 for _ in tree.find_all(kind))


def _is_subquery(block: exp.Expr) -> bool:
    """A query block nested in another one, other than a branch of a set operation."""
    child, parent = block, block.parent
    while parent is not None and not isinstance(parent, BLOCKS):
        child, parent = parent, parent.parent
    if parent is None:
        return False
    return not (isinstance(parent, exp.SetOperation) and child.arg_key in ("this", "expression"))


def _is_window_function(agg: exp.Expr) -> bool:
    parent = agg.parent
    while isinstance(parent, exp.Filter):
        parent = parent.parent
    return isinstance(parent, exp.Window)


def _has_limit(tree: exp.Expr) -> bool:
    node = tree
    while isinstance(node, exp.Subquery) and node.args.get("limit") is None:
        node = node.this
    return node.args.get("limit") is not None


def _main_table(block: exp.Expr, ctes: dict[str, exp.Expr]) -> str | None:
    """The first table of the outermost FROM, followed into CTEs and derived tables."""
    seen: set[str] = set()
    while True:  # a loop, not recursion: a chain of CTEs can be as long as the query
        while isinstance(block, (exp.Subquery, exp.SetOperation)):
            block = block.this
        from_ = block.args.get("from_") if isinstance(block, exp.Select) else None
        source = from_.this if from_ is not None else None
        if isinstance(source, exp.Subquery):
            block = source
            continue
        if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
            return None
        if source.db or source.name not in ctes:
            return table_name(source)
        if source.name in seen:
            return None
        seen.add(source.name)
        block = ctes[source.name]


# -- tables -------------------------------------------------------------------------
def _base_sources(scope: Scope) -> Iterator[tuple[int, str, str]]:
    """Position, name and alias of each table of the database the block reads."""
    for node, source in scope.selected_sources.values():
        name = base_table(source)
        if name is not None:
            yield _position(node), name, node.alias


def _position(node: exp.Expr) -> int:
    for identifier in node.walk(bfs=False):
        if isinstance(identifier, exp.Identifier) and "start" in identifier.meta:
            return int(identifier.meta["start"])
    return _UNKNOWN_POSITION


# -- column uses --------------------------------------------------------------------
def _local_columns(node: exp.Expr | None) -> Iterator[exp.Column]:
    return (n for n in local(node) if isinstance(n, exp.Column))


def _select_item(key: exp.Expr, selects: list[exp.Expr]) -> exp.Expr:
    """The select item a GROUP BY / ORDER BY ordinal names, else the key itself."""
    if isinstance(key, exp.Literal) and key.is_int and 0 < int(key.this) <= len(selects):
        return selects[int(key.this) - 1]
    return key


def _is_block_constant(node: exp.Expr) -> bool:
    """No column of this block in it: literals, parameters, functions of them, scalar subqueries."""
    return not any(isinstance(n, (exp.Column, exp.Star)) for n in local(node))


def _value(node: exp.Expr) -> Any:
    while isinstance(node, exp.Cast):
        node = node.this
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return -_value(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        try:
            return int(node.this)
        except ValueError:
            return float(node.this)
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    return None


class _Collector:
    """The column uses of one query block."""

    def __init__(self, query: Query, scope: Scope) -> None:
        self.query = query
        self.scope = scope
        self.uses: list[tuple[int, ColumnUse]] = []
        self.claimed: set[int] = set()  # id() of the Column nodes given a role

    def add(self, column: exp.Column, role: ColumnRole, operator: str | None = None,
            value: Any = None, position: int | None = None) -> None:
        self.claimed.add(id(column))
        use = ColumnUse(self.query.table_of(column), column.name, role, operator, value)
        self.uses.append((_position(column) if position is None else position, use))

    def sole_table(self) -> str | None:
        """The base table of a block that reads one source, and only one."""
        sources = list(self.scope.selected_sources.values())
        return base_table(sources[0][1]) if len(sources) == 1 else None

    def source_table(self, node: exp.Expr) -> str | None:
        """The base table behind a FROM or JOIN item of this block."""
        selected = self.scope.selected_sources.get(node.alias_or_name)
        return base_table(selected[1]) if selected is not None else None

    def star(self, node: exp.Star) -> None:
        self.uses.append((_position(node), ColumnUse(self.sole_table(), "*", "select")))

    def predicate(self, node: exp.Expr | None) -> None:
        for n in local(node):
            if not _negated_or_alternative(n, node):
                self.comparison(n)

    def comparison(self, node: exp.Expr) -> None:
        if isinstance(node, exp.Binary) and type(node) in _COMPARISONS:
            self.binary(node)
            return
        column = node.this
        if not isinstance(column, exp.Column):
            return
        if isinstance(node, exp.Between):
            low, high = node.args["low"], node.args["high"]
            if _is_block_constant(low) and _is_block_constant(high):
                self.add(column, "range", "BETWEEN", (_value(low), _value(high)))
        elif isinstance(node, exp.In):
            if node.args.get("query") is not None:
                self.add(column, "join", "IN")
            elif node.expressions and all(_is_block_constant(e) for e in node.expressions):
                self.add(column, "equality", "IN", tuple(_value(e) for e in node.expressions))
        elif isinstance(node, exp.Is):
            if isinstance(node.expression, exp.Null) and not node.args.get("negate"):
                self.add(column, "equality", "IS NULL")
        elif (isinstance(node, exp.Like) and isinstance(node.expression, exp.Literal)
              and not node.args.get("negate")):
            pattern = _value(node.expression)
            if isinstance(pattern, str) and pattern[:1] not in ("", "%", "_"):
                self.add(column, "range", "LIKE", pattern)

    def binary(self, node: exp.Binary) -> None:
        left, right = node.left, node.right
        if isinstance(node, exp.EQ) and isinstance(left, exp.Column) and isinstance(right, exp.Column):
            if left.table != right.table:
                self.add(left, "join", "=")
                self.add(right, "join", "=")
            return
        role, operator, flipped = _COMPARISONS[type(node)]
        if isinstance(left, exp.Column) and _is_block_constant(right):
            self.add(left, role, operator, _value(right))
        elif isinstance(right, exp.Column) and _is_block_constant(left):
            self.add(right, role, flipped, _value(left))

    def window(self, window: exp.Window) -> None:
        for key in window.args.get("partition_by") or ():
            if isinstance(key, exp.Column):
                self.add(key, "group")
        self.ordering(window.args.get("order"), selects=[])

    def ordering(self, order: exp.Expr | None, selects: list[exp.Expr]) -> None:
        """ORDER BY: ordinals and output names stand for the select item they name."""
        named = {item.alias: item for item in selects if item.alias}
        for ordered in order.expressions if order is not None else ():
            key = ordered.this
            if isinstance(key, exp.Column) and not key.table and key.name in named:
                self.claimed.add(id(key))
                key = named[key.name]
            key = _select_item(key, selects).unalias()
            if isinstance(key, exp.Column):
                self.add(key, "sort", "DESC" if ordered.args.get("desc") else "ASC",
                         position=_position(ordered))

    def grouping(self, group: exp.Expr | None, selects: list[exp.Expr]) -> None:
        for item in group.expressions if group is not None else ():
            key = _select_item(item, selects).unalias()
            if isinstance(key, exp.Column):
                self.add(key, "group", position=_position(item))

    def joins(self, block: exp.Select) -> None:
        from_ = block.args.get("from_")
        left = self.source_table(from_.this) if from_ is not None else None
        for position, join in enumerate(block.args.get("joins") or ()):
            self.predicate(join.args.get("on"))
            right = self.source_table(join.this)
            for name in join.args.get("using") or ():
                for table in (left if position == 0 else None, right):
                    self.uses.append((_position(name), ColumnUse(table, name.name, "join", "USING")))

    def collect(self) -> list[tuple[int, ColumnUse]]:
        block = self.scope.expression
        selects = list(block.selects) if isinstance(block, exp.Query) else []
        if isinstance(block, exp.Select):
            for item in block.expressions:
                for window in local(item):
                    if isinstance(window, exp.Window):
                        self.window(window)
                if isinstance(item, exp.Star):
                    self.star(item)
                for column in _local_columns(item):
                    if id(column) not in self.claimed:
                        self.add(column, "select")
            self.joins(block)
            self.predicate(block.args.get("where"))
            self.predicate(block.args.get("having"))
            self.grouping(block.args.get("group"), selects)
            for window in block.args.get("windows") or ():
                self.window(window)
        self.ordering(block.args.get("order"), selects)
        for column in _local_columns(block):
            if id(column) not in self.claimed:
                self.add(column, "other")
        return self.uses


def _negated_or_alternative(node: exp.Expr, root: exp.Expr | None) -> bool:
    """True under a NOT or an OR of the predicate: such a comparison filters nothing on its own."""
    parent = node.parent
    while parent is not None and node is not root:
        if isinstance(parent, (exp.Not, exp.Or)):
            return True
        node, parent = parent, parent.parent
    return False
