"""What a query is made of: counts for the router, tables and column uses for the agents (pure).

pglast (PostgreSQL's own parser) decides whether the text is one valid query; sqlglot
(dialect "postgres") analyses it. Unquoted identifiers are folded to lower case, as
PostgreSQL does. These two steps, `select_text` and `parse_query`, are shared with afs.suite.

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

Column roles, with the table resolved through aliases within each query block (and its
enclosing blocks, for correlated references). An unqualified column belongs to the block's
table when the block reads a single base table; otherwise its table is None, as it is for
columns of CTEs and derived tables.
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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pglast
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
from sqlglot.optimizer.scope import Scope, traverse_scope

from afs.errors import InputError
from afs.models import ColumnRole, ColumnUse, QueryFeatures

DIALECT = "postgres"
_BLOCKS = (exp.Select, exp.SetOperation)  # query blocks; exp.Subquery is only parentheses
_COMPARISONS: dict[type[exp.Expr], tuple[ColumnRole, str, str]] = {  # role, operator, when flipped
    exp.EQ: ("equality", "=", "="),
    exp.GT: ("range", ">", "<"),
    exp.GTE: ("range", ">=", "<="),
    exp.LT: ("range", "<", ">"),
    exp.LTE: ("range", "<=", ">="),
}
_UNKNOWN_POSITION = 1 << 30


def extract_features(sql: str) -> QueryFeatures:
    """Parse one query and describe it; raise InputError when it is not one valid query."""
    tree = _parse(sql)
    try:
        scopes = traverse_scope(tree)
        sources = sorted((source for scope in scopes for source in _base_sources(scope)),
                         key=lambda source: source[0])
        uses = sorted((use for scope in scopes for use in _Collector(scope).collect()),
                      key=lambda use: use[0])
    except SqlglotError as exc:  # e.g. an alias used twice in one FROM
        raise InputError(f"cannot analyse the query: {first_line(exc)}") from exc
    aliases: dict[str, str] = {}
    for _, name, alias in sources:
        if alias:
            aliases.setdefault(alias, name)

    joins = _count(tree, exp.Join)
    subqueries = sum(1 for block in tree.find_all(*_BLOCKS) if _is_subquery(block))
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


# -- parsing (shared with afs.suite) -------------------------------------------------
def select_text(sql: str) -> str:
    """The text of the one query in `sql`, without its terminating `;` (pglast decides).

    A query is what PostgreSQL parses as a SELECT: WITH … SELECT, VALUES, TABLE and set
    operations included. Raises InputError for anything else.
    """
    try:
        statements = pglast.parse_sql(sql)
    except pglast.parser.ParseError as exc:
        raise InputError(f"invalid SQL: {first_line(exc)}") from exc
    if not statements:
        raise InputError("no SQL statement, only whitespace or comments")
    if len(statements) != 1:
        raise InputError(f"expected one query, got {len(statements)} statements")
    kind = type(statements[0].stmt).__name__
    if kind != "SelectStmt":
        raise InputError(f"expected a query (SELECT, WITH … SELECT, VALUES), got {kind}")
    (text,) = pglast.split(sql)
    return text


def parse_query(text: str) -> exp.Expr:
    """`text` as a sqlglot tree, unquoted names folded to lower case as PostgreSQL does.

    Raises SqlglotError.
    """
    return normalize_identifiers(sqlglot.parse_one(text, dialect=DIALECT), dialect=DIALECT)


def first_line(exc: Exception) -> str:
    """The first line of an error message (the exception's type when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _parse(sql: str) -> exp.Expr:
    text = select_text(sql)
    try:
        return parse_query(text)
    except SqlglotError as exc:
        raise InputError(f"cannot analyse the query: {first_line(exc)}") from exc


# -- counts -------------------------------------------------------------------------
def _count(tree: exp.Expr, kind: type[exp.Expr]) -> int:
    return sum(1 for _ in tree.find_all(kind))


def _is_subquery(block: exp.Expr) -> bool:
    """A query block nested in another one, other than a branch of a set operation."""
    child, parent = block, block.parent
    while parent is not None and not isinstance(parent, _BLOCKS):
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


def _main_table(block: exp.Expr, ctes: dict[str, exp.Expr], seen: frozenset[str] = frozenset()) -> str | None:
    """The first table of the outermost FROM, followed into CTEs and derived tables."""
    while isinstance(block, (exp.Subquery, exp.SetOperation)):
        block = block.this
    from_ = block.args.get("from_") if isinstance(block, exp.Select) else None
    source = from_.this if from_ is not None else None
    if isinstance(source, exp.Subquery):
        return _main_table(source, ctes, seen)
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
        return None
    if not source.db and source.name in ctes:
        if source.name in seen:
            return None
        return _main_table(ctes[source.name], ctes, seen | {source.name})
    return _table_name(source)


# -- tables -------------------------------------------------------------------------
def _table_name(table: exp.Table) -> str:
    return ".".join(part for part in (table.catalog, table.db, table.name) if part)


def _base_table(source: object) -> str | None:
    """The name of a source that is a table of the database (not a CTE, function or subquery)."""
    if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier):
        return _table_name(source)
    return None


def _base_sources(scope: Scope) -> Iterator[tuple[int, str, str]]:
    """Position, name and alias of each table of the database the block reads."""
    for node, source in scope.selected_sources.values():
        name = _base_table(source)
        if name is not None:
            yield _position(node), name, node.alias


def _position(node: exp.Expr) -> int:
    for identifier in node.walk(bfs=False):
        if isinstance(identifier, exp.Identifier) and "start" in identifier.meta:
            return int(identifier.meta["start"])
    return _UNKNOWN_POSITION


# -- column uses --------------------------------------------------------------------
def _local(node: exp.Expr | None) -> Iterator[exp.Expr]:
    """`node` and what it contains, without descending into nested query blocks."""
    if node is None:
        return
    yield from node.walk(prune=lambda n: n is not node and isinstance(n, _BLOCKS))


def _local_columns(node: exp.Expr | None) -> Iterator[exp.Column]:
    return (n for n in _local(node) if isinstance(n, exp.Column))


def _select_item(key: exp.Expr, selects: list[exp.Expr]) -> exp.Expr:
    """The select item a GROUP BY / ORDER BY ordinal names, else the key itself."""
    if isinstance(key, exp.Literal) and key.is_int and 0 < int(key.this) <= len(selects):
        return selects[int(key.this) - 1]
    return key


def _is_constant(node: exp.Expr) -> bool:
    """No column of this block in it: literals, parameters, functions of them, scalar subqueries."""
    return not any(isinstance(n, (exp.Column, exp.Star)) for n in _local(node))


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

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.uses: list[tuple[int, ColumnUse]] = []
        self.claimed: set[int] = set()  # id() of the Column nodes given a role

    def add(self, column: exp.Column, role: ColumnRole, operator: str | None = None,
            value: Any = None, position: int | None = None) -> None:
        self.claimed.add(id(column))
        use = ColumnUse(self.table_of(column), column.name, role, operator, value)
        self.uses.append((_position(column) if position is None else position, use))

    def sole_table(self) -> str | None:
        """The base table of a block that reads one source, and only one."""
        sources = list(self.scope.selected_sources.values())
        return _base_table(sources[0][1]) if len(sources) == 1 else None

    def table_of(self, column: exp.Column) -> str | None:
        qualifier = column.table
        if not qualifier:
            return self.sole_table()
        scope: Scope | None = self.scope
        while scope is not None:
            if qualifier in scope.selected_sources:
                return _base_table(scope.selected_sources[qualifier][1])
            scope = scope.parent
        return None

    def source_table(self, node: exp.Expr) -> str | None:
        """The base table behind a FROM or JOIN item of this block."""
        selected = self.scope.selected_sources.get(node.alias_or_name)
        return _base_table(selected[1]) if selected is not None else None

    def star(self, node: exp.Star) -> None:
        self.uses.append((_position(node), ColumnUse(self.sole_table(), "*", "select")))

    def predicate(self, node: exp.Expr | None) -> None:
        for n in _local(node):
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
            if _is_constant(low) and _is_constant(high):
                self.add(column, "range", "BETWEEN", (_value(low), _value(high)))
        elif isinstance(node, exp.In):
            if node.args.get("query") is not None:
                self.add(column, "join", "IN")
            elif node.expressions and all(_is_constant(e) for e in node.expressions):
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
        if isinstance(left, exp.Column) and _is_constant(right):
            self.add(left, role, operator, _value(right))
        elif isinstance(right, exp.Column) and _is_constant(left):
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
                for window in _local(item):
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
