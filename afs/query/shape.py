"""The shape of a query, for the strategists (pure): what sqlglot tells beyond QueryFeatures.

    shape = query_shape(query, Resolver(ctx, query))

QueryShape holds the ORDER BY as SortItems, the top-level WHERE terms a partial index may rely
on, the join pairs, the tables read with `*`, GROUP BY / aggregates / DISTINCT, LIMIT, the
IndexablePredicates (expressions and jsonb / array tests an expression or GIN index serves)
and the Disjunctions (ORs an index per arm serves). `Resolver` maps what the query and its
plan name to the keys of the catalog (ctx.tables): a column node through the one resolver
(`Query.table_of`, block by block), a name EXPLAIN prints (`table_key`, `table_of`) through
the query's aliases. Helpers shared with other readers of queries: `read_query` (None rather
than an error), `conjuncts`, `is_literal`, `is_literal_or_array`, `function_name`,
`aggregates`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from sqlglot import exp

from afs.errors import InputError
from afs.models import AnalysisContext
from afs.pg.names import ident, quote_literal, relation_key, relation_name
from afs.pg.stats import base_type, column_type, like_prefix, pattern_opclass
from afs.query.query import Query
from afs.query.text import DIALECT

# casts of an extracted json value that are immutable, so that an index may hold them
_INDEXABLE_CASTS: Final = frozenset({
    "int", "integer", "bigint", "smallint", "numeric", "decimal", "boolean", "bool", "text",
    "double precision", "real", "float",
})


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
    """The tree of the one query in `query` (`Query.read`: read once, shared, not to be edited
    in place); None unless it is one query sqlglot reads."""
    try:
        return Query.read(query).tree
    except InputError:
        return None


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
    """What the query and its plan name → the keys of ctx.tables (module docstring)."""

    def __init__(self, ctx: AnalysisContext, query: Query | None = None) -> None:
        self.query = query
        self.tables = ctx.tables
        self.query_tables = tuple(ctx.features.tables) or tuple(ctx.tables)
        self.exact_aliases = dict(ctx.features.aliases)
        self.aliases = {k.lower(): v for k, v in ctx.features.aliases.items()}

    def table_key(self, name: str | None) -> str | None:
        """The key of ctx.tables that `name` means: a key itself, an alias (the same table in
        every block that has it: `Query.tables_named`), or a qualifier as sqlglot reads it
        (raw: `Orders` for `"Orders"`); case counts before it is ignored."""
        if not name:
            return None
        if name in self.tables:
            return name
        named = self.query.tables_named(name) if self.query is not None else frozenset()
        if len(named) > 1:
            return None  # an alias of several tables, in different blocks
        if named and next(iter(named)) in self.tables:
            return next(iter(named))
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
        """The table a column named as EXPLAIN prints it belongs to (`o.status`, `status`)."""
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
        """(table, column) of a column node of the query: the one resolver (`Query.table_of`)
        for a node of `query`'s tree; an unqualified column it leaves open (a CTE's, or one
        several tables of the block might hold), or a node of another tree: by its names."""
        found = self.query.table_of(node, self.tables) if self.query is not None else None
        if found is not None:
            table = self.table_key(found)
        elif node.table and self.query is not None and self.query.scope_of(node) is not None:
            table = None  # a CTE, a derived table or no source of its block
        else:
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


def query_shape(query: Query, resolver: Resolver) -> QueryShape:
    tree = query.tree
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
