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

What the strategists need beyond QueryFeatures is `query_shape(query, Resolver(ctx))`, a
QueryShape: the ORDER BY as SortItems, the top-level WHERE terms a partial index may rely on,
the join pairs, the tables read with `*`, GROUP BY / aggregates / DISTINCT, LIMIT, and the
IndexablePredicates (expressions and jsonb / array tests an expression or GIN index serves).
`Resolver` finds a column's base table through the query's aliases and the catalog's columns.
Helpers shared with other readers of queries: `read_query` (None rather than an error),
`conjuncts`, `is_literal`, `is_literal_or_array`, `function_name`, `aggregates`.

`check_input` comes first, before any other reader (the safety check included) sees the text:
it refuses what AFS cannot read safely, once, up front: a query larger than MAX_QUERY_BYTES
(every agent reads it many times: a 1 MB IN list cost 51 s of CPU per agent), nested deeper
than MAX_QUERY_DEPTH (sqlglot and the readers built on it recurse; 50 parentheses exhausted
Python's stack), or holding parameters ($1, as pg_stat_statements stores queries).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import pglast
import sqlglot
from pglast import ast as pg_ast
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
from sqlglot.optimizer.scope import Scope, traverse_scope

from afs.errors import InputError
from afs.models import AnalysisContext, ColumnRole, ColumnUse, QueryFeatures
from afs.pg.names import ident, quote_literal, relation_key, relation_name
from afs.pg.stats import base_type, column_type, like_prefix, pattern_opclass

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
MAX_QUERY_BYTES: Final = 100_000
# Levels of the query's syntax tree (as PostgreSQL parses it) plus twice the levels of
# parentheses and brackets (sqlglot's parser spends about twice the frames on one): a bound
# of how deep the readers recurse. Measured: 40 parentheses read, 50 did not; at this limit
# every nesting (parentheses, CASE, NOT, subqueries, casts, `+` chains, UNION, JOIN) reads
# with 400 frames already on the stack (trio, a brain, pytest), 60 % of Python's default.
MAX_QUERY_DEPTH: Final = 56
# sqlglot's time to read nested ARRAY[…] doubles with each level (1 s at 12, 17 s at 17)
MAX_BRACKET_DEPTH: Final = 8
# casts of an extracted json value that are immutable, so that an index may hold them
_INDEXABLE_CASTS: Final = frozenset({
    "int", "integer", "bigint", "smallint", "numeric", "decimal", "boolean", "bool", "text",
    "double precision", "real", "float",
})


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
        features = extract_features(sql)
        tree = parse_query(select_text(sql))
        scopes = traverse_scope(tree)
    except (InputError, SqlglotError):
        return None
    outputs: dict[str, tuple[str, str]] = {}
    if isinstance(tree, exp.Select) and scopes:
        root = _Collector(scopes[-1])
        for item in tree.expressions:
            column = item.unalias()
            if isinstance(column, exp.Column) and not isinstance(column.this, exp.Star):
                table = root.table_of(column)
                if table is not None:
                    outputs[item.alias_or_name] = (table, column.name)
    return features, outputs


# -- the input check ----------------------------------------------------------------
def check_input(sql: str, *, allow_parameters: bool = False) -> None:
    """Refuse a query AFS cannot read safely (InputError): larger than MAX_QUERY_BYTES,
    nested deeper than MAX_QUERY_DEPTH, or with parameters ($1) unless `allow_parameters`
    (pg_stat_statements' texts, planned generically by the batch). Iterative and linear in
    the size of the query, so it cannot itself run out of stack or time. Text that does not
    parse passes: the safety check (afs.safety.check_query) comes next and refuses it."""
    size = len(sql.encode())
    if size > MAX_QUERY_BYTES:
        raise InputError(f"the query is {size:,} bytes long; AFS reads queries of at most "
                         f"{MAX_QUERY_BYTES:,} bytes (each agent analyses it many times)")
    try:
        statements = pglast.parse_sql(sql)
    except pglast.parser.ParseError:
        return  # not SQL: the safety check that follows says so in its own words
    parentheses, brackets = _parenthesis_depth(sql)
    depth = _syntax_depth(statements) + 2 * parentheses
    if brackets > MAX_BRACKET_DEPTH:
        raise InputError(f"the query nests too deeply for AFS to analyse: {brackets} levels of "
                         f"brackets (ARRAY[ARRAY[…]]), at most {MAX_BRACKET_DEPTH}")
    if depth > MAX_QUERY_DEPTH:
        raise InputError(f"the query nests too deeply for AFS to analyse: {depth} levels of "
                         f"expressions, subqueries and parentheses, at most {MAX_QUERY_DEPTH}")
    parameters = [] if allow_parameters else sorted(_parameters(statements))
    if parameters:
        shown = ", ".join(f"${n}" for n in parameters[:5]) + (", …" if len(parameters) > 5 else "")
        raise InputError(
            f"the query has parameters ({shown}), as pg_stat_statements stores queries: AFS "
            "measures a query with values. Put values in their place, or let `afs batch` fill "
            "them in from the statistics (it reads such statements from pg_stat_statements)")


def _children(node: pg_ast.Node) -> Iterator[pg_ast.Node]:
    """The nodes directly below `node` (in its fields, or in lists in them)."""
    slots: Any = getattr(type(node), "__slots__")  # noqa: B009 - the stubs do not declare it
    pending: list[Any] = [getattr(node, name) for name in slots]
    while pending:
        value = pending.pop()
        if isinstance(value, pg_ast.Node):
            yield value
        elif isinstance(value, tuple | list):
            pending.extend(value)


def _syntax_depth(statements: Any) -> int:
    """The depth of PostgreSQL's syntax tree. An AND / OR of many terms is one node with a list
    of arguments there, and counts once (sqlglot nests them, but reads and walks them without
    recursing)."""
    deepest = 0
    stack: list[tuple[pg_ast.Node, int]] = [(s, 1) for s in statements]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in _children(node))
    return deepest


def _parameters(statements: Any) -> set[int]:
    found: set[int] = set()
    stack: list[pg_ast.Node] = list(statements)
    while stack:
        node = stack.pop()
        if isinstance(node, pg_ast.ParamRef):
            found.add(int(node.number or 0))
        stack.extend(_children(node))
    return found


def _parenthesis_depth(sql: str) -> tuple[int, int]:
    """The deepest nesting of parentheses and brackets together, and of brackets alone."""
    depth = deepest = brackets = deepest_brackets = 0
    for token in pglast.parser.scan(sql):
        if token.name in ("ASCII_40", "ASCII_91"):  # ( and [
            depth += 1
            deepest = max(deepest, depth)
            if token.name == "ASCII_91":
                brackets += 1
                deepest_brackets = max(deepest_brackets, brackets)
        elif token.name in ("ASCII_41", "ASCII_93"):
            depth -= 1
            brackets -= token.name == "ASCII_93"
    return deepest, deepest_brackets


# -- parsing (shared with afs.suite) -------------------------------------------------
@functools.lru_cache(maxsize=1024)
def select_text(sql: str) -> str:
    """The text of the one query in `sql`, without its terminating `;` (pglast decides;
    remembered: a task asks for the same few texts again and again).

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

    Raises SqlglotError, or InputError when the query nests too deeply to read (check_input
    refuses such queries first; this is the net behind it).
    """
    try:
        return normalize_identifiers(sqlglot.parse_one(text, dialect=DIALECT), dialect=DIALECT)
    except RecursionError:
        raise InputError("the query nests too deeply for AFS to analyse") from None


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
            return _table_name(source)
        if source.name in seen:
            return None
        seen.add(source.name)
        block = ctes[source.name]


# -- tables -------------------------------------------------------------------------
def _table_name(table: exp.Table) -> str:
    """The table's name as PostgreSQL prints it: `orders`, `"Orders"` (afs.pg.names)."""
    return relation_key(*(part for part in (table.catalog, table.db, table.name) if part))


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


def _is_block_constant(node: exp.Expr) -> bool:
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


# -- the shape of a query, for the strategists --------------------------------------------
# -- the query --------------------------------------------------------------------------
@dataclass(frozen=True)
class SortItem:
    table: str | None
    column: str | None  # None when the ORDER BY item is not a plain column of a table
    desc: bool
    nulls_first: bool  # as sqlglot normalises it: PostgreSQL's default is NULLS FIRST for DESC
    sql: str


@dataclass(frozen=True)
class IndexablePredicate:
    """A top-level WHERE term that an expression index or a GIN index can serve (QueryFeatures
    calls its column's use "other"): `lower(email) = 'x'`, `payload ->> 'kind' = 'x'`,
    `lower(email) LIKE 'ab%'`, `payload @> '{…}'`, `payload ? 'key'`."""

    table: str
    column: str  # the column the term reads
    kind: Literal["equality", "prefix", "containment", "key_exists"]
    expression: str | None  # the index key expression; None: the column itself (GIN)
    label: str  # what the index name calls the key, e.g. "lower_email"
    method: Literal["btree", "gin"]
    opclass: str | None
    shown: str  # the term as written
    values: int = 1  # how many constants it compares with (IN lists)
    prefix: str | None = None  # the fixed start of a LIKE pattern
    from_json: bool = False  # the expression extracts a value from json


@dataclass(frozen=True)
class Disjunction:
    """A top-level WHERE term `a = 1 OR b < 2 OR …` on one table: each arm (or, for an arm
    that is an AND, one of its terms) compares a plain column with constants, so one index per
    column lets the planner answer it with a BitmapOr."""

    table: str
    columns: tuple[str, ...]  # one per arm: the column an index must lead with, in order
    shown: str  # the term as written


@dataclass(frozen=True)
class QueryShape:
    """What sqlglot tells about the query beyond QueryFeatures."""

    tree: exp.Expr | None
    sort: tuple[SortItem, ...] = ()
    # (table, column) → the predicate as an index WHERE clause, for top-level AND conjuncts
    # `col = <constant>` and `col IS NULL` only: those a partial index may rely on.
    constant_predicates: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # (table, column) pairs a join compares: `a.x = b.y` anywhere, and `a.x IN (SELECT b.y …)`
    join_pairs: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = ()
    star_tables: frozenset[str] = frozenset()  # tables whose every column is selected
    grouped: bool = False  # GROUP BY, aggregates or DISTINCT at the top
    limit: int | None = None
    indexable: tuple[IndexablePredicate, ...] = ()
    filters: Mapping[str, int] = field(default_factory=dict)  # top-level WHERE terms on one table
    # (table, column, pattern) of the top-level `col LIKE 'pattern'` terms (not NOT LIKE, not in OR)
    like_terms: frozenset[tuple[str, str, str]] = frozenset()
    # the same for `col ILIKE 'pattern'`
    ilike_terms: frozenset[tuple[str, str, str]] = frozenset()
    # top-level OR terms over one table whose every arm an index can serve (a BitmapOr)
    disjunctions: tuple[Disjunction, ...] = ()


def read_query(query: str) -> exp.Expr | None:
    """The one statement of `query`, unquoted identifiers folded to lower case as PostgreSQL
    (and QueryFeatures) folds them; None unless sqlglot reads exactly one statement."""
    try:
        statements = [s for s in sqlglot.parse(query, read=DIALECT) if s is not None]
    except (SqlglotError, ValueError, RecursionError):
        return None
    return normalize_identifiers(statements[0], dialect=DIALECT) if len(statements) == 1 else None


def conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    """The top-level AND terms of a condition."""
    terms: list[exp.Expr] = []
    stack = [node] if node is not None else []
    while stack:  # not recursive: a WHERE of thousands of terms nests as deep
        node = stack.pop()
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.And):
            stack.extend((node.right, node.left))
        else:
            terms.append(node)
    return terms


def is_literal(node: exp.Expr) -> bool:
    """A literal or a boolean, possibly cast, negated or in parentheses (what a partial index's
    WHERE may hold); compare `_is_block_constant`, which also takes functions and subqueries."""
    if isinstance(node, exp.Literal | exp.Boolean):
        return True
    if isinstance(node, exp.Cast | exp.Neg | exp.Paren):
        return is_literal(node.this)
    return False


def function_name(node: exp.Func) -> str:
    """The lower-case name of a function call, as PostgreSQL would look it up."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    return node.sql_name().lower()


def is_literal_or_array(node: exp.Expr) -> bool:
    """A literal, a cast literal or an ARRAY of them."""
    if isinstance(node, exp.Array):
        return all(is_literal_or_array(e) for e in node.expressions)
    return is_literal(node)


def _index_expression(node: exp.Expr, resolver: Resolver) -> tuple[str, str, str, str, bool] | None:
    """(table, column, expression SQL, label, from json) when `node` is an expression an index
    can hold and the planner will match: lower/upper of a text column; `->` / `->>` with
    literal keys on a json(b) column; an immutable cast of such an extracted value."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Lower | exp.Upper) and isinstance(node.this, exp.Column):
        typed = resolver.typed_column(node.this)
        if typed is None or pattern_opclass(typed[2]) is None:
            return None
        table, column, _ = typed
        fn = "lower" if isinstance(node, exp.Lower) else "upper"
        return table, column, f"{fn}({ident(column)})", f"{fn}_{column}", False
    if isinstance(node, exp.Cast):
        inner = _index_expression(node.this, resolver)
        to = node.to.sql(dialect=DIALECT).lower()
        if inner is None or not inner[4] or base_type(to) not in _INDEXABLE_CASTS:
            return None
        table, column, sql, label, _ = inner
        return table, column, f"({sql})::{to}", label, True
    if isinstance(node, exp.JSONExtract | exp.JSONExtractScalar):
        path = node.expression
        parts = path.expressions if isinstance(path, exp.JSONPath) else []
        if (len(parts) != 2 or not isinstance(parts[0], exp.JSONPathRoot)
                or not isinstance(parts[1], exp.JSONPathKey) or not isinstance(parts[1].this, str)):
            return None
        key = parts[1].this
        op = "->>" if isinstance(node, exp.JSONExtractScalar) else "->"
        base = node.this
        while isinstance(base, exp.Paren):
            base = base.this
        if isinstance(base, exp.Column):
            typed = resolver.typed_column(base)
            if typed is None or typed[2] not in ("json", "jsonb"):
                return None
            table, column, _ = typed
            sql, label = ident(column), column
        elif isinstance(base, exp.JSONExtract):
            inner = _index_expression(base, resolver)
            if inner is None:
                return None
            table, column, sql, label, _ = inner
        else:
            return None
        return table, column, f"{sql} {op} {quote_literal(key)}", f"{label}_{key}", True
    return None


_KEY_TESTS = (exp.JSONBContainsTopKey, exp.JSONBContainsAnyTopKeys, exp.JSONBContainsAllTopKeys)


def _indexable_predicate(term: exp.Expr, resolver: Resolver) -> IndexablePredicate | None:
    """The index that can serve one top-level WHERE term, when QueryFeatures' plain-column
    roles cannot describe it (see IndexablePredicate)."""
    if term.args.get("negate"):
        return None  # `NOT LIKE`, `NOT IN`: an index cannot find what is absent
    shown = _shown(term)
    if isinstance(term, exp.EQ | exp.In):
        if isinstance(term, exp.EQ):
            left, right = term.this, term.expression
            if is_literal_or_array(left):
                left, right = right, left
            if not is_literal_or_array(right):
                return None
            values = 1
        else:
            if term.args.get("query") is not None or not term.expressions or not all(
                    is_literal_or_array(e) for e in term.expressions):
                return None
            left, values = term.this, len(term.expressions)
        found = _index_expression(left, resolver)
        if found is None:
            return None
        table, column, sql, label, from_json = found
        return IndexablePredicate(table, column, "equality", sql, label, "btree", None, shown,
                                  values=values, from_json=from_json)
    if isinstance(term, exp.Like) and isinstance(term.expression, exp.Literal) and term.expression.is_string:
        prefix = like_prefix(str(term.expression.this))
        found = _index_expression(term.this, resolver)
        if not prefix or found is None or "::" in found[2]:
            return None
        table, column, sql, label, from_json = found
        return IndexablePredicate(table, column, "prefix", sql, f"{label}_pattern", "btree",
                                  "text_pattern_ops", shown, prefix=prefix, from_json=from_json)
    column_node: exp.Expr | None = None
    kind: Literal["containment", "key_exists"] = "containment"
    if isinstance(term, exp.ArrayContainsAll) and is_literal_or_array(term.expression):
        column_node = term.this
    elif isinstance(term, exp.ArrayContainedBy) and is_literal_or_array(term.this):
        column_node = term.expression
    elif isinstance(term, _KEY_TESTS) and is_literal_or_array(term.expression):
        column_node, kind = term.this, "key_exists"
    while isinstance(column_node, exp.Paren):
        column_node = column_node.this
    if not isinstance(column_node, exp.Column):
        return None
    typed = resolver.typed_column(column_node)
    if typed is None:
        return None
    table, column, data_type = typed
    if data_type == "jsonb":
        # jsonb_path_ops: smaller and faster for @>, but it has no operator for `?`
        opclass = "jsonb_path_ops" if kind == "containment" else None
    elif data_type.endswith("[]") and kind == "containment":
        opclass = None
    else:
        return None
    return IndexablePredicate(table, column, kind, None, column, "gin", opclass, shown)


def _shown(term: exp.Expr) -> str:
    return term.sql(dialect=DIALECT, normalize_functions="lower")


def aggregates(select: exp.Select) -> bool:
    """The select list calls an aggregate (not as a window function)."""
    return any(agg.find_ancestor(exp.Window) is None
               for item in select.expressions for agg in item.find_all(exp.AggFunc))


class Resolver:
    """Column → base table, through the query's aliases and the tables' column lists."""

    def __init__(self, ctx: AnalysisContext) -> None:
        self.tables = ctx.tables
        self.query_tables = tuple(ctx.features.tables) or tuple(ctx.tables)
        self.exact_aliases = dict(ctx.features.aliases)
        self.aliases = {k.lower(): v for k, v in ctx.features.aliases.items()}

    def table_key(self, name: str | None) -> str | None:
        """The key of ctx.tables that `name` means: a key itself, an alias, or a qualifier as
        sqlglot reads it (raw: `Orders` for `"Orders"`); case counts before it is ignored."""
        if not name:
            return None
        if name in self.tables:
            return name
        if self.exact_aliases.get(name) in self.tables:
            return self.exact_aliases[name]
        if relation_key(name) in self.tables:
            return relation_key(name)
        for key in self.tables:
            if relation_name(key) == name:
                return key
        low = name.lower()
        if low in self.aliases and self.aliases[low] in self.tables:
            return self.aliases[low]
        for key in self.tables:
            if key.lower() == low or relation_name(key).lower() == low:
                return key
        return self.exact_aliases.get(name, self.aliases.get(low))

    def has_column(self, table: str, column: str) -> bool:
        info = self.tables.get(table)
        return info is None or not info.columns or any(c.name == column for c in info.columns)

    def table_of(self, qualifier: str | None, column: str) -> str | None:
        if qualifier:
            return self.table_key(qualifier)
        owners = [t for t in self.query_tables
                  if t in self.tables and any(c.name == column for c in self.tables[t].columns)]
        if len(owners) == 1:
            return owners[0]
        if len(self.query_tables) == 1:
            return self.table_key(self.query_tables[0])
        return None

    def column(self, node: exp.Column) -> tuple[str, str] | None:
        table = self.table_of(node.table or None, node.name)
        if table is None or not self.has_column(table, node.name):
            return None
        return table, node.name

    def typed_column(self, node: exp.Column) -> tuple[str, str, str] | None:
        """(table, column, data type) of a column whose table the catalog describes."""
        resolved = self.column(node)
        info = self.tables.get(resolved[0]) if resolved else None
        data_type = column_type(info, resolved[1]) if resolved and info else None
        return (*resolved, data_type) if resolved and data_type else None


def query_shape(query: str, resolver: Resolver) -> QueryShape:
    tree = read_query(query)
    if tree is None:
        return QueryShape(tree=None)
    select = tree if isinstance(tree, exp.Select) else None
    sort: list[SortItem] = []
    constants: dict[tuple[str, str], str] = {}
    star: set[str] = set()
    grouped = False
    limit: int | None = None
    indexable: list[IndexablePredicate] = []
    filters: dict[str, int] = {}
    likes: set[tuple[str, str, str]] = set()
    ilikes: set[tuple[str, str, str]] = set()
    disjunctions: list[Disjunction] = []
    if select is not None:
        order = select.args.get("order")
        for item in order.expressions if order else ():
            target = item.this
            resolved = resolver.column(target) if isinstance(target, exp.Column) else None
            sort.append(SortItem(
                table=resolved[0] if resolved else None, column=resolved[1] if resolved else None,
                desc=bool(item.args.get("desc")), nulls_first=bool(item.args.get("nulls_first")),
                sql=item.sql(dialect=DIALECT)))
        where = select.args.get("where")
        for term in conjuncts(where.this if where else None):
            owners = {r[0] for r in (resolver.column(c) for c in term.find_all(exp.Column)) if r}
            if len(owners) == 1:
                owner = owners.pop()
                filters[owner] = filters.get(owner, 0) + 1
            found = _indexable_predicate(term, resolver)
            if found is not None:
                indexable.append(found)
            if (isinstance(term, exp.Like | exp.ILike) and not term.args.get("negate")
                    and isinstance(term.this, exp.Column)
                    and isinstance(term.expression, exp.Literal) and term.expression.is_string):
                resolved = resolver.column(term.this)
                if resolved:
                    (likes if isinstance(term, exp.Like) else ilikes).add(
                        (*resolved, str(term.expression.this)))
            found_or = _disjunction(term, resolver)
            if found_or is not None:
                disjunctions.append(found_or)
            if isinstance(term, exp.EQ):
                left, right = term.this, term.expression
                if isinstance(right, exp.Column) and is_literal(left):
                    left, right = right, left
                if isinstance(left, exp.Column) and is_literal(right):
                    resolved = resolver.column(left)
                    if resolved:
                        constants[resolved] = f"{ident(left.name)} = {right.sql(dialect=DIALECT)}"
            elif (isinstance(term, exp.Is) and isinstance(term.expression, exp.Null)
                  and isinstance(term.this, exp.Column)):
                resolved = resolver.column(term.this)
                if resolved:
                    constants[resolved] = f"{ident(term.this.name)} IS NULL"
        for item in select.expressions:
            if isinstance(item, exp.Star):
                star.update(resolver.query_tables)
            elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                key = resolver.table_key(item.table)
                if key:
                    star.add(key)
        grouped = bool(select.args.get("group") or select.args.get("distinct")) or aggregates(select)
        lim = select.args.get("limit")
        if isinstance(lim, exp.Limit) and isinstance(lim.expression, exp.Literal):
            try:
                limit = int(lim.expression.this)
            except ValueError:
                limit = None
    pairs: list[tuple[tuple[str, str], tuple[str, str]]] = []
    for eq in tree.find_all(exp.EQ):
        if isinstance(eq.this, exp.Column) and isinstance(eq.expression, exp.Column):
            a, b = resolver.column(eq.this), resolver.column(eq.expression)
            if a and b and a[0] != b[0] and (a, b) not in pairs:
                pairs.append((a, b))
    for semi in tree.find_all(exp.In):  # x IN (SELECT y …): a semi-join on x = y
        inner = semi.args.get("query")
        inner = inner.this if isinstance(inner, exp.Subquery) else inner
        if (isinstance(semi.parent, exp.Not) or not isinstance(semi.this, exp.Column)
                or not isinstance(inner, exp.Select) or len(inner.expressions) != 1):
            continue
        column = inner.expressions[0].unalias()
        if isinstance(column, exp.Column):
            a, b = resolver.column(semi.this), resolver.column(column)
            if a and b and a[0] != b[0] and (a, b) not in pairs:
                pairs.append((a, b))
    return QueryShape(
        tree=tree, sort=tuple(sort), constant_predicates=constants, join_pairs=tuple(pairs),
        star_tables=frozenset(star), grouped=grouped, limit=limit,
        indexable=tuple(indexable), filters=filters, like_terms=frozenset(likes),
        ilike_terms=frozenset(ilikes), disjunctions=tuple(disjunctions))


_ARM_COMPARISONS = (exp.EQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


def _serves_arm(arm: exp.Expr) -> bool:
    """`col IN (constants)`, `col BETWEEN constants`, `col IS NULL`, `col LIKE 'prefix%'`."""
    if isinstance(arm, exp.In):
        return bool(arm.expressions) and all(is_literal(e) for e in arm.expressions)
    if isinstance(arm, exp.Between):
        return is_literal(arm.args["low"]) and is_literal(arm.args["high"])
    if isinstance(arm, exp.Is):
        return isinstance(arm.expression, exp.Null)
    return (isinstance(arm, exp.Like) and isinstance(arm.expression, exp.Literal)
            and bool(like_prefix(str(arm.expression.this))))


def _arm_column(arm: exp.Expr, resolver: Resolver) -> tuple[str, str] | None:
    """(table, column) of one OR arm that a B-tree on that column serves: `col op constant`,
    `col IN (constants)`, `col BETWEEN constants`, `col IS NULL`, `col LIKE 'prefix%'`; for an
    AND, its first such term (an index on it narrows the arm)."""
    while isinstance(arm, exp.Paren):
        arm = arm.this
    if isinstance(arm, exp.And):
        return next((found for term in conjuncts(arm) if (found := _arm_column(term, resolver))), None)
    if arm.args.get("negate"):
        return None
    column: exp.Expr | None = None
    if isinstance(arm, _ARM_COMPARISONS):
        left, right = arm.this, arm.expression
        if isinstance(right, exp.Column) and is_literal(left):
            left, right = right, left
        if is_literal(right):
            column = left
    elif _serves_arm(arm):
        column = arm.this
    return resolver.column(column) if isinstance(column, exp.Column) else None


def _disjunction(term: exp.Expr, resolver: Resolver) -> Disjunction | None:
    """The Disjunction of a top-level WHERE term, when it is an OR an index per arm serves."""
    while isinstance(term, exp.Paren):
        term = term.this
    if not isinstance(term, exp.Or):
        return None
    arms: list[exp.Expr] = []
    stack: list[exp.Expr] = [term]
    while stack:
        node = stack.pop()
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Or):
            stack.extend((node.right, node.left))
        else:
            arms.append(node)
    found = [_arm_column(arm, resolver) for arm in arms]
    tables = {f[0] for f in found if f}
    if any(f is None for f in found) or len(tables) != 1:
        return None
    return Disjunction(tables.pop(), tuple(f[1] for f in found if f), _shown(term))
