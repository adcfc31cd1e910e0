"""Rewrites that return the same rows: the rewrite strategist's rules (pure).

Each rule is a small function over the parsed query and what is known of its tables;
it yields one `Rewrite` per place it applies, each one edit of the original query:

    not_in_to_not_exists      x NOT IN (SELECT y …)   → NOT EXISTS (SELECT 1 … WHERE y = x)
                              only when x and y are NOT NULL columns, on no null-extended side
    sargable_range            col::date = 'D', date(col), date_trunc('month', col) = 'D',
                              extract(year FROM col) = 2024, col::date BETWEEN a AND b
                              → col >= lo AND col < hi, on timestamp / timestamptz / date columns
    scalar_subquery_to_join   (SELECT agg(…) FROM t2 WHERE t2.fk = t1.k …) in the select list
                              or WHERE → a join with (SELECT fk, agg(…) … GROUP BY fk)
    in_to_exists              x IN (SELECT y …) ↔ EXISTS (SELECT 1 … WHERE y = x), as a WHERE
    exists_to_in              conjunct (only TRUE keeps a row, so NULLs do not matter)
    redundant_distinct        SELECT DISTINCT over one table whose key is in the select list
    or_to_union               a = 1 OR b = 2 on two columns of one table → UNION ALL of the
                              branches, the second with (a = 1) IS NOT TRUE

A rule fires only when the equivalence holds; when a fact it needs is unknown (a column's
type or nullability, which table an unqualified column belongs to), it does not fire.
Rewrites are edits of the sqlglot tree (dialect "postgres"); every SQL string returned has
been re-parsed by pglast as exactly one SELECT.

Keyset pagination needs a value from the database, so it is two steps for the caller:
`keyset_probe` gives the query that fetches the ORDER BY key of the row just before the
page, `keyset_rewrite` the page read from that key instead of skipping OFFSET rows.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlglot import exp
from sqlglot.errors import SqlglotError

from afs.errors import InputError
from afs.models import AnalysisContext, EstimatedImpact, OptimizationProposal, TableInfo
from afs.pg.functions import ANONYMOUS_AGGREGATES, SET_RETURNING
from afs.pg.names import ident, index_name, qualified
from afs.query.query import Query, local, table_name
from afs.query.shape import conjuncts
from afs.query.text import DIALECT, select_text

__all__ = [
    "RULES",
    "KeysetProbe",
    "Rewrite",
    "keyset_probe",
    "keyset_rewrite",
    "rewrite_proposals",
    "rewrites",
]

DERIVED_ALIAS = "afs_s"  # the grouped derived table of scalar_subquery_to_join
UNION_ALIAS = "afs_u"  # the derived table around or_to_union's branches

# Volatile functions: evaluated once per row in the original, they may not be in a rewrite.
_VOLATILE = frozenset({"random", "rand", "nextval", "setval", "clock_timestamp", "timeofday",
                       "gen_random_uuid", "uuid", "random_normal", "txid_current"})
# sqlglot names of the aggregates scalar_subquery_to_join handles (count needs coalesce).
_SCALAR_AGGREGATES = (exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg)
# Nodes a constant operand may be made of: literals, casts, arithmetic, CURRENT_DATE.
_CONSTANT_NODES = (exp.Literal, exp.Cast, exp.DataType, exp.DataTypeParam, exp.Neg, exp.Paren,
                   exp.Null, exp.Boolean, exp.Interval, exp.Var, exp.CurrentDate, exp.Add, exp.Sub,
                   exp.Mul, exp.Div, exp.Identifier)
_DATE_LITERAL = re.compile(r"\s*(\d{4})-(\d{2})-(\d{2})(?:[ T]00:00(?::00(?:\.0+)?)?)?\s*")
_TIMESTAMP_TYPE = re.compile(r"timestamp(?:\(\d+\))? (with|without) time zone")
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")  # an output name that needs no quotes
_TRUNC_UNITS = {"DAY": "day", "MONTH": "month", "YEAR": "year"}


@dataclass(frozen=True)
class Rewrite:
    """One rewritten query and why it returns the same rows as the original."""

    kind: str  # the rule: "not_in_to_not_exists", "keyset_pagination", "sargable_range", …
    sql: str  # the whole rewritten query; pglast parses it as exactly one SELECT
    reason: str  # the equivalence argument, with the facts it relies on
    changes: str = ""  # a clause deliberately changed, stated (else "")
    needs_application_change: bool = False  # keyset: the application must pass the last key
    index_hints: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (table, key columns) that would pay


@dataclass(frozen=True)
class KeysetProbe:
    """What keyset pagination needs to know of a query `… ORDER BY keys LIMIT n OFFSET m`."""

    sql: str  # the ORDER BY key values of row m (the last row before the page): one row or none
    table: str
    keys: tuple[str, ...]  # the ORDER BY columns, in order; unique together, NOT NULL
    descending: bool
    offset: int  # m


Rule = Callable[["_Query"], Iterator[Rewrite]]


# -- public API ---------------------------------------------------------------------------------


def rewrites(query: Query, tables: Mapping[str, TableInfo]) -> tuple[Rewrite, ...]:
    """Every rewrite the query admits, each one rule applied once to the original query (its
    one reading: the rules edit copies).

    `tables` describes the tables the query reads, by the name the query uses. A query
    sqlglot cannot analyse has none.
    """
    if query.tree is None:
        return ()
    found: dict[str, Rewrite] = {}
    reading = _Query(query, tables)
    for rule in RULES:
        try:
            for rewrite in rule(reading):
                if _is_one_select(rewrite.sql) and rewrite.sql not in found:
                    found[rewrite.sql] = rewrite
        except SqlglotError:  # a construct the generator cannot render: the rule yields nothing more
            continue
    return tuple(found.values())


def keyset_probe(query: Query, tables: Mapping[str, TableInfo]) -> KeysetProbe | None:
    """For `… ORDER BY k1[, k2] [LIMIT n] OFFSET m` (m > 0) over one table, keys unique together.

    The probe's SQL keeps FROM, WHERE and ORDER BY, selects the keys with LIMIT 1 OFFSET m-1;
    the caller runs it (in a fork) and hands its row to `keyset_rewrite`. None when the query
    is not such a page: a join, keys that may be NULL or are not unique together, mixed
    directions, aggregates, DISTINCT, window functions, an OFFSET that is not a literal.
    """
    tree = query.tree
    if tree is None:
        return None
    page = _keyset_page(_Query(query, tables))
    if page is None:
        return None
    keys, descending, offset, source = page
    probe = tree.copy()
    assert isinstance(probe, exp.Select)
    order = probe.args["order"]
    probe.set("expressions", [ordered.this.copy() for ordered in order.expressions])
    probe.set("limit", exp.Limit(expression=exp.Literal.number(1)))
    probe.set("offset", exp.Offset(expression=exp.Literal.number(offset - 1)) if offset > 1 else None)
    try:
        sql = probe.sql(dialect=DIALECT)
    except SqlglotError:
        return None
    if not _is_one_select(sql):
        return None
    assert source.table is not None
    return KeysetProbe(sql, source.table, keys, descending, offset)


def keyset_rewrite(query: Query, probe: KeysetProbe, last_key: Sequence[object]) -> Rewrite | None:
    """The page read from the key of its previous row: WHERE (k1, k2) > (v1, v2), no OFFSET.

    `last_key` is the row the probe returned. None when it does not fit the probe or a
    value has no SQL literal here (bytes, intervals, NULL).
    """
    if len(last_key) != len(probe.keys):
        return None
    values = [_literal(value) for value in last_key]
    if any(value is None for value in values):
        return None
    tree = query.tree
    if not isinstance(tree, exp.Select) or tree.args.get("order") is None:
        return None
    ordered = tree.args["order"].expressions
    offset = tree.args.get("offset")
    if (not all(isinstance(o.this, exp.Column) for o in ordered)
            or tuple(o.this.name for o in ordered) != probe.keys
            or any(bool(o.args.get("desc")) != probe.descending for o in ordered)
            or offset is None or offset.expression.sql(DIALECT) != str(probe.offset)):
        return None  # not the query the probe was made for
    page = tree.copy()
    assert isinstance(page, exp.Select)
    keys = [o.this.copy() for o in page.args["order"].expressions]
    rows = [v for v in values if v is not None]
    left: exp.Expr = keys[0] if len(keys) == 1 else exp.Tuple(expressions=keys)
    right: exp.Expr = rows[0] if len(rows) == 1 else exp.Tuple(expressions=rows)
    page.set("offset", None)
    page.where(exp.LT(this=left, expression=right) if probe.descending
               else exp.GT(this=left, expression=right), append=True, copy=False)
    try:
        sql = page.sql(dialect=DIALECT)
    except SqlglotError:
        return None
    if not _is_one_select(sql):
        return None
    key_list = ", ".join(probe.keys)
    sign = "<" if probe.descending else ">"
    return Rewrite(
        kind="keyset_pagination",
        sql=sql,
        reason=(f"ORDER BY ({key_list}) is a total order: the keys are NOT NULL and unique together in "
                f"{probe.table}. The rows after row {probe.offset} are then exactly those with "
                f"({key_list}) {sign} the key of row {probe.offset}, so the same LIMIT over them is the "
                f"same page, without reading and discarding {probe.offset} rows first. It holds for "
                "the data as of the probe: rows inserted or deleted before the page move OFFSET pages, "
                "not keyset pages."),
        changes=(f"OFFSET {probe.offset} → WHERE ({key_list}) {sign} (the last key of the previous "
                 "page); the application passes that key instead of a page number"),
        needs_application_change=True,
        index_hints=((probe.table, probe.keys),),
    )


# -- what the query reads ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """A FROM or JOIN item of one query block."""

    alias: str  # how the block names it
    identifier: exp.Identifier  # that name as a node (quoting kept)
    table: str | None  # the base table it is, when it is one (not a CTE or subquery)
    null_extended: bool  # on the nullable side of an outer join
    node: exp.Expr


class _Query:
    """The original tree (never edited: the query's one reading) and what rules ask of it."""

    def __init__(self, query: Query, tables: Mapping[str, TableInfo]) -> None:
        assert query.tree is not None
        self.query = query
        self.tree = query.tree
        self.tables = tables
        self.ctes = frozenset(cte.alias_or_name for cte in self.tree.find_all(exp.CTE))
        self._sources: dict[int, dict[str, _Source]] = {}

    def sources(self, select: exp.Select) -> dict[str, _Source]:
        cached = self._sources.get(id(select))
        if cached is None:
            cached = self._sources[id(select)] = self._read_sources(select)
        return cached

    def _read_sources(self, select: exp.Select) -> dict[str, _Source]:
        from_ = select.args.get("from_")
        items: list[tuple[exp.Expr, bool]] = [(from_.this, False)] if from_ is not None else []
        for join in select.args.get("joins") or ():
            side = (join.args.get("side") or "").upper()
            if side in ("RIGHT", "FULL"):
                items = [(node, True) for node, _ in items]
            items.append((join.this, side in ("LEFT", "FULL")))
        found: dict[str, _Source] = {}
        for node, null_extended in items:
            alias = node.args.get("alias")
            identifier = alias.this if isinstance(alias, exp.TableAlias) and alias.this else None
            table = None
            if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
                if identifier is None:
                    identifier = node.this
                if node.db or node.name not in self.ctes:
                    table = table_name(node)
            if isinstance(identifier, exp.Identifier):
                found[identifier.name] = _Source(identifier.name, identifier, table, null_extended, node)
        return found

    def info(self, source: _Source) -> TableInfo | None:
        return self.tables.get(source.table) if source.table is not None else None

    def column_names(self, source: _Source) -> frozenset[str] | None:
        info = self.info(source)
        if info is None or not info.columns:
            return None
        return frozenset(c.name for c in info.columns)

    def resolve(self, column: exp.Column) -> tuple[exp.Select, _Source] | None:
        """The block and FROM item a column belongs to, as PostgreSQL resolves it (the one
        resolver: `Query.source_of`); None if unknown."""
        if column.args.get("db") or column.args.get("catalog"):
            return None
        found = self.query.source_of(column, self.tables)
        select = found[0].expression if found is not None else None
        if found is None or not isinstance(select, exp.Select):
            return None
        source = self.sources(select).get(found[1])
        return (select, source) if source is not None else None

    def not_null(self, source: _Source, name: str) -> str | None:
        """Why the column is never NULL in this block (a fact named for the reason), else None."""
        info = self.info(source)
        if info is None or source.null_extended:
            return None
        if name in info.primary_key:
            return f"{info.name}.{name} is a primary-key column"
        for column in info.columns:
            if column.name == name and not column.nullable:
                return f"{info.name}.{name} is NOT NULL"
        return None

    def data_type(self, source: _Source, name: str) -> str | None:
        info = self.info(source)
        for column in info.columns if info is not None else ():
            if column.name == name:
                return column.data_type
        return None

    def is_inside(self, column: exp.Column, block: exp.Select) -> bool | None:
        """True when the column belongs to `block` or a block within it; None when unknown."""
        resolved = self.resolve(column)
        if resolved is None:
            return None
        owner: exp.Expr | None = resolved[0]
        while owner is not None:
            if owner is block:
                return True
            owner = owner.parent
        return False


# -- tree helpers -------------------------------------------------------------------------------


def _enclosing_select(node: exp.Expr) -> exp.Select | None:
    parent = node.parent
    while parent is not None and not isinstance(parent, exp.Select):
        parent = parent.parent
    return parent


def _path(node: exp.Expr, below: type[exp.Expr] | None = None) -> tuple[tuple[str, int | None], ...]:
    """How to reach `node` from the root (or from its nearest ancestor of type `below`)."""
    steps: list[tuple[str, int | None]] = []
    while node.parent is not None and not (below is not None and isinstance(node, below)):
        key = node.arg_key or ""
        steps.append((key, node.index if isinstance(node.parent.args.get(key), list) else None))
        node = node.parent
    return tuple(reversed(steps))


def _locate(root: exp.Expr, path: tuple[tuple[str, int | None], ...]) -> exp.Expr:
    node = root
    for key, index in path:
        value = node.args[key]
        node = value[index] if index is not None else value
    return node


def _copy_at(tree: exp.Expr, node: exp.Expr) -> tuple[exp.Expr, exp.Expr]:
    """A copy of the tree, and the copy of `node` within it."""
    copy = tree.copy()
    return copy, _locate(copy, _path(node))


def _where_conjuncts(select: exp.Select) -> list[exp.Expr]:
    where = select.args.get("where")
    return conjuncts(where.this) if where is not None else []


def _replace(node: exp.Expr, new: exp.Expr) -> None:
    """Put `new` where `node` is, parenthesised unless it stands alone in an AND chain."""
    parent = node.parent
    if isinstance(new, exp.Connector) and not (
            isinstance(parent, exp.Where) or (isinstance(parent, exp.And) and isinstance(new, exp.And))):
        new = exp.Paren(this=new)
    node.replace(new)


def _function_names(node: exp.Expr) -> Iterator[str]:
    for n in node.walk():
        if isinstance(n, exp.Anonymous):
            yield str(n.this).lower()
        elif isinstance(n, exp.Func):
            yield n.sql_name().lower()


def _has_volatile(node: exp.Expr) -> bool:
    return any(name in _VOLATILE for name in _function_names(node))


def _has_set_returning(node: exp.Expr) -> bool:
    return any(name in SET_RETURNING for name in _function_names(node))


def _aggregates(node: exp.Expr) -> list[exp.Expr]:
    """Aggregate calls of this block (not nested blocks, not window functions)."""
    found = []
    for n in local(node):
        is_agg = isinstance(n, exp.AggFunc) or (
            isinstance(n, exp.Anonymous) and str(n.this).lower() in ANONYMOUS_AGGREGATES)
        if is_agg and not isinstance(n.parent, exp.Window) and not (
                isinstance(n.parent, exp.Filter) and isinstance(n.parent.parent, exp.Window)):
            found.append(n)
    return found


def _has_window(node: exp.Expr) -> bool:
    return any(isinstance(n, exp.Window) for n in local(node))


def _is_constant(node: exp.Expr) -> bool:
    return all(isinstance(n, _CONSTANT_NODES) for n in node.walk())


def _plain_select(select: exp.Expr) -> bool:
    """A block without grouping, aggregates, windows, DISTINCT, LIMIT/OFFSET, WITH or locks."""
    return (isinstance(select, exp.Select) and select.args.get("from_") is not None
            and not any(select.args.get(k) for k in ("group", "having", "limit", "offset", "distinct",
                                                     "with_", "locks", "windows", "qualify"))
            and not _aggregates(select) and not _has_window(select))


def _qualified(column: exp.Column, source: _Source) -> exp.Column:
    return exp.Column(this=column.this.copy(), table=source.identifier.copy())


def _subquery_select(node: exp.Expr | None) -> exp.Select | None:
    while isinstance(node, exp.Subquery) and not node.args.get("alias"):
        node = node.this
    return node if isinstance(node, exp.Select) else None


def _used_names(tree: exp.Expr) -> frozenset[str]:
    return frozenset(n.name for n in tree.find_all(exp.Identifier))


def _fresh(base: str, used: frozenset[str]) -> str:
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}{n}"
    return name


def _is_one_select(sql: str) -> bool:
    try:
        select_text(sql)
    except InputError:
        return False
    return True


def _render(tree: exp.Expr) -> str:
    return tree.sql(dialect=DIALECT)


def _describe(source: _Source, name: str) -> str:
    return f"{source.alias}.{name}"


# -- rule: NOT IN → NOT EXISTS -------------------------------------------------------------------


def not_in_to_not_exists(q: _Query) -> Iterator[Rewrite]:
    """`x NOT IN (SELECT y …)` → `NOT EXISTS (SELECT 1 … WHERE y = x …)` when x, y are never NULL."""
    for node in q.tree.find_all(exp.Not):
        found = _in_subquery(q, node.this)
        if found is None:
            continue
        x_source, inner, y_source = found
        x, y = node.this.this, inner.expressions[0]
        x_fact, y_fact = q.not_null(x_source, x.name), q.not_null(y_source, y.name)
        if x_fact is None or y_fact is None:
            continue
        tree, copy = _copy_at(q.tree, node)
        exists = _exists_with(copy.this, x_source)
        _replace(copy, exp.Not(this=exists))
        yield Rewrite(
            kind="not_in_to_not_exists",
            sql=_render(tree),
            reason=(f"{x.sql(DIALECT)} NOT IN (SELECT {y.sql(DIALECT)} …) is NULL, so keeps no row, once "
                    "the subquery yields a NULL or the left side is NULL; NOT EXISTS ignores NULLs. "
                    f"Here neither can be NULL: {x_fact} and {y_fact}, and neither is on the nullable "
                    "side of an outer join, so both are TRUE or FALSE for the same rows. PostgreSQL plans "
                    "NOT EXISTS as an anti-join; NOT IN over a subquery it cannot."),
        )


def _in_subquery(q: _Query, node: exp.Expr) -> tuple[_Source, exp.Select, _Source] | None:
    """For `x IN (SELECT y FROM …)` with plain columns x and y resolved: x's source, the block, y's."""
    if not isinstance(node, exp.In) or not isinstance(node.this, exp.Column):
        return None
    inner = _subquery_select(node.args.get("query"))
    if inner is None or len(inner.expressions) != 1 or node.expressions:
        return None
    y = inner.expressions[0].unalias()
    if not isinstance(y, exp.Column) or not _plain_select_but_distinct(inner):
        return None
    x_found, y_found = q.resolve(node.this), q.resolve(y)
    if x_found is None or y_found is None or y_found[0] is not inner:
        return None
    outer = _enclosing_select(node)
    if x_found[0] is not outer or x_found[1].alias in q.sources(inner):
        return None  # x would be captured by a FROM item of the subquery with the same name
    return x_found[1], inner, y_found[1]


def _plain_select_but_distinct(select: exp.Select) -> bool:
    """As _plain_select, but SELECT DISTINCT (not DISTINCT ON) is allowed: it changes no set."""
    distinct = select.args.get("distinct")
    if distinct is not None and distinct.args.get("on") is not None:
        return False
    probe = select.copy()
    probe.set("distinct", None)
    return _plain_select(probe)


def _exists_with(in_node: exp.In, x_source: _Source) -> exp.Exists:
    """EXISTS (SELECT 1 FROM … WHERE <its where> AND y = x) from `x IN (SELECT y FROM … WHERE …)`."""
    inner = _subquery_select(in_node.args["query"])
    assert inner is not None
    body = inner.copy()
    y = body.expressions[0].unalias()
    body.set("distinct", None)
    body.set("expressions", [exp.Literal.number(1)])
    x = in_node.this
    assert isinstance(x, exp.Column)
    body.where(exp.EQ(this=y.copy(), expression=_qualified(x, x_source)), append=True, copy=False)
    return exp.Exists(this=body)


# -- rule: IN ↔ EXISTS ---------------------------------------------------------------------------


def in_to_exists(q: _Query) -> Iterator[Rewrite]:
    """`x IN (SELECT y FROM t WHERE …)` as a WHERE conjunct → `EXISTS (SELECT 1 … WHERE y = x)`."""
    for select in q.tree.find_all(exp.Select):
        for conjunct in _where_conjuncts(select):
            found = _in_subquery(q, conjunct)
            if found is None:
                continue
            x_source = found[0]
            tree, copy = _copy_at(q.tree, conjunct)
            assert isinstance(copy, exp.In)
            _replace(copy, _exists_with(copy, x_source))
            yield Rewrite(
                kind="in_to_exists",
                sql=_render(tree),
                reason=_semijoin_reason(conjunct.this.sql(DIALECT),
                                        found[1].expressions[0].unalias().sql(DIALECT)),
            )


def exists_to_in(q: _Query) -> Iterator[Rewrite]:
    """`EXISTS (SELECT … FROM t WHERE t.y = x AND <uncorrelated>)` as a WHERE conjunct → `x IN (…)`."""
    for select in q.tree.find_all(exp.Select):
        for conjunct in _where_conjuncts(select):
            if not isinstance(conjunct, exp.Exists):
                continue
            found = _exists_correlation(q, conjunct, select)
            if found is None:
                continue
            tree, copy = _copy_at(q.tree, conjunct)
            body = _subquery_select(copy.this)
            assert body is not None
            body = body.copy()
            _drop_conjunct(body, found.conjunct)
            body.set("expressions", [found.inner.copy()])
            body.set("distinct", None)
            _replace(copy, exp.In(this=_qualified(found.outer, found.outer_source),
                                  query=exp.Subquery(this=body)))
            yield Rewrite(
                kind="exists_to_in",
                sql=_render(tree),
                reason=_semijoin_reason(found.outer.sql(DIALECT), found.inner.sql(DIALECT), True),
            )


def _semijoin_reason(x: str, y: str, uncorrelated_rest: bool = False) -> str:
    return (f"A WHERE conjunct keeps a row only when it is TRUE. {x} IN (SELECT {y} … WHERE rest) is TRUE "
            f"exactly when some row of the subquery has rest and {y} = {x} TRUE, which is exactly when "
            f"EXISTS (SELECT 1 … WHERE rest AND {y} = {x}) is TRUE; NULLs make either one FALSE or NULL, "
            "never TRUE, so the same rows pass. Neither form repeats an outer row (both are semi-joins)."
            + (" rest does not refer to the outer query." if uncorrelated_rest else ""))


def _drop_conjunct(body: exp.Select, conjunct: exp.Expr) -> None:
    """Remove from `body` (a copy of the subquery block) the copy of the original's `conjunct`."""
    where = _path(conjunct, below=exp.Select)
    rest = [c for c in _where_conjuncts(body) if _path(c, below=exp.Select) != where]
    body.set("where", exp.Where(this=exp.and_(*rest, copy=False)) if rest else None)


def _exists_correlation(q: _Query, node: exp.Exists, outer: exp.Select) -> _Correlation | None:
    """The one correlated conjunct `y = x` of an EXISTS subquery of `outer`'s WHERE."""
    inner = _subquery_select(node.this)
    if inner is None or not _plain_select_but_distinct(inner):
        return None
    return _correlation(q, inner, outer)


@dataclass(frozen=True)
class _Correlation:
    conjunct: exp.Expr  # inner = outer, a conjunct of the subquery's WHERE
    inner: exp.Column  # of the subquery's own FROM item
    outer: exp.Column  # of the enclosing block
    outer_source: _Source


def _correlation(q: _Query, inner: exp.Select, outer: exp.Select) -> _Correlation | None:
    """The subquery's only reference to the enclosing block, when it is one `y = x` WHERE conjunct."""
    found: list[_Correlation] = []
    for conjunct in _where_conjuncts(inner):
        columns = list(conjunct.find_all(exp.Column))
        inside = [q.is_inside(c, inner) for c in columns]
        if None in inside:
            return None
        if all(inside):
            continue
        if not (isinstance(conjunct, exp.EQ) and isinstance(conjunct.left, exp.Column)
                and isinstance(conjunct.right, exp.Column)):
            return None
        left, right = conjunct.left, conjunct.right
        y, x = (left, right) if q.is_inside(left, inner) else (right, left)
        y_found, x_found = q.resolve(y), q.resolve(x)
        if y_found is None or x_found is None or y_found[0] is not inner or x_found[0] is not outer:
            return None
        found.append(_Correlation(conjunct, y, x, x_found[1]))
    if len(found) != 1:
        return None
    # nothing else in the subquery (FROM, JOIN … ON, select list) may refer to the outer query
    for column in inner.find_all(exp.Column):
        if column is not found[0].outer and not q.is_inside(column, inner):
            return None
    return found[0]


# -- rule: sargable ranges ------------------------------------------------------------------------


def sargable_range(q: _Query) -> Iterator[Rewrite]:
    """A date cast, date_trunc or year extraction of a column compared with a constant → a range."""
    for node in q.tree.find_all(exp.EQ, exp.Between):
        found = _date_comparison(q, node)
        if found is None:
            continue
        column, source, data_type, low, high, what = found
        tree, copy = _copy_at(q.tree, node)
        bare = _locate(tree, _path(column))
        assert isinstance(bare, exp.Column)
        bare = bare.copy()
        _replace(copy, exp.and_(exp.GTE(this=bare, expression=low),
                                exp.LT(this=bare.copy(), expression=high), copy=False))
        assert source.table is not None
        zone = ("" if "with time zone" not in data_type else
                f" {_describe(source, column.name)} is timestamp with time zone: the cast to date, "
                "date_trunc and extract draw day boundaries in the session TimeZone, and comparing a "
                "timestamptz with a date or timestamp value converts that value in the same session "
                "TimeZone, so both forms select the same rows under any TimeZone setting (both run "
                "under the same one).")
        yield Rewrite(
            kind="sargable_range",
            sql=_render(tree),
            reason=(f"{what} holds exactly when {_describe(source, column.name)} ({data_type}) lies in "
                    f"[{low.sql(DIALECT)}, {high.sql(DIALECT)}); it is NULL when the column is NULL, "
                    "as the range is. A range on the bare column can use an index on it; the function "
                    f"of the column cannot.{zone}"),
            index_hints=((source.table, (column.name,)),),
        )


def _date_comparison(
    q: _Query, node: exp.Expr,
) -> tuple[exp.Column, _Source, str, exp.Expr, exp.Expr, str] | None:
    """(column, its source, its type, low, high, what the original says) for a sargable comparison."""
    if isinstance(node, exp.EQ):
        sides = [(node.left, node.right), (node.right, node.left)]
        for function, constant in sides:
            pattern = _date_function(q, function)
            if pattern is None:
                continue
            column, source, data_type, unit = pattern
            bounds = _bounds(unit, constant, constant)
            if bounds is not None:
                return column, source, data_type, *bounds, node.sql(DIALECT)
        return None
    if not isinstance(node, exp.Between) or node.args.get("symmetric"):
        return None
    pattern = _date_function(q, node.this)
    if pattern is None or pattern[3] not in ("cast", "extract"):
        return None
    column, source, data_type, unit = pattern
    bounds = _bounds(unit, node.args["low"], node.args["high"])
    if bounds is None:
        return None
    return column, source, data_type, *bounds, node.sql(DIALECT)


def _date_function(q: _Query, node: exp.Expr) -> tuple[exp.Column, _Source, str, str] | None:
    """(column, source, type, unit) for col::date, date(col), date_trunc(unit, col), extract(year …)."""
    unit: str | None = None
    column: exp.Expr | None = None
    if (isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DATE) or (
            isinstance(node, exp.Date) and not node.args.get("zone") and not node.expressions):
        unit, column = "cast", node.this
    elif isinstance(node, exp.TimestampTrunc) and not node.args.get("zone"):
        unit, column = _TRUNC_UNITS.get(node.text("unit").upper()), node.this
    elif isinstance(node, exp.Extract) and str(node.this.name).upper() == "YEAR":
        unit, column = "extract", node.expression
    if unit is None or not isinstance(column, exp.Column):
        return None
    found = q.resolve(column)
    if found is None:
        return None
    data_type = q.data_type(found[1], column.name)
    if data_type is None:
        return None
    timestamp = _TIMESTAMP_TYPE.fullmatch(data_type) is not None
    if not (timestamp or (data_type == "date" and unit == "extract")):
        return None
    return column, found[1], data_type, unit


def _bounds(unit: str, low: exp.Expr, high: exp.Expr) -> tuple[exp.Expr, exp.Expr] | None:
    """[lo, hi) for the function value between the constants `low` and `high` (equal for =)."""
    if unit == "cast":
        lo, hi = _as_date(low), _as_date(high)
        if lo is None or hi is None:
            return None
        return lo, exp.Add(this=hi, expression=exp.Interval(this=exp.Literal.string("1 day")))
    if unit == "extract":
        first, last = _year(low), _year(high)
        if first is None or last is None:
            return None
        return _date_literal(dt.date(first, 1, 1)), _date_literal(dt.date(last + 1, 1, 1))
    day = _aligned_date(low, unit)
    if day is None or low is not high:
        return None
    return _date_literal(day), exp.Add(this=_date_literal(day),
                                       expression=exp.Interval(this=exp.Literal.string(f"1 {unit}")))


def _as_date(node: exp.Expr) -> exp.Expr | None:
    """The constant as a date, when the original comparison also reads it as a date."""
    if isinstance(node, exp.Literal) and node.is_string:  # an untyped literal is read as a date
        return exp.Cast(this=node.copy(), to=exp.DataType.build("date"))
    if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DATE and _is_constant(node):
        return node.copy()
    if isinstance(node, exp.CurrentDate):
        return node.copy()
    return None


def _year(node: exp.Expr) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        year = int(node.this)
        return year if 1 <= year <= 9998 else None
    return None


def _aligned_date(node: exp.Expr, unit: str) -> dt.date | None:
    """The date a date_trunc result is compared with, when it is the start of a `unit`."""
    if isinstance(node, exp.Cast) and node.to.this in (
            exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ):
        node = node.this
    if not (isinstance(node, exp.Literal) and node.is_string):
        return None
    match = _DATE_LITERAL.fullmatch(node.this)
    if match is None:
        return None
    try:
        day = dt.date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return None
    if (unit in ("month", "year") and day.day != 1) or (unit == "year" and day.month != 1):
        return None
    return day


def _date_literal(day: dt.date) -> exp.Expr:
    return exp.Cast(this=exp.Literal.string(day.isoformat()), to=exp.DataType.build("date"))


# -- rule: correlated scalar subquery → join -------------------------------------------------------


def scalar_subquery_to_join(q: _Query) -> Iterator[Rewrite]:
    """`(SELECT agg(…) FROM t2 WHERE t2.fk = t1.k …)` → a join with t2 grouped by fk."""
    outer = q.tree
    if not isinstance(outer, exp.Select) or not _can_join_more(q, outer):
        return
    for node in outer.find_all(exp.Subquery):
        if _enclosing_select(node) is not outer or node.args.get("alias"):
            continue
        place = _clause_of(node, outer)
        if place not in ("expressions", "where"):
            continue
        found = _correlated_aggregate(q, node, outer)
        if found is None:
            continue
        yield _scalar_to_join(q, node, *found, place)


def _can_join_more(q: _Query, outer: exp.Select) -> bool:
    """The outer block can take one more LEFT JOIN without changing what else it computes."""
    if outer.args.get("from_") is None or any(outer.args.get(k) for k in ("group", "having", "locks")):
        return False
    if _aggregates(outer) or _has_volatile(outer):
        return False
    if any(isinstance(item, exp.Star) for item in outer.expressions):
        return False  # SELECT * would show the derived table's columns too
    # no comma join: the ON of a JOIN after it could not see the items before the comma
    joins = outer.args.get("joins") or ()
    return all(any(j.args.get(k) for k in ("on", "using", "kind", "side", "method")) for j in joins)


def _clause_of(node: exp.Expr, select: exp.Select) -> str | None:
    while node.parent is not None and node.parent is not select:
        node = node.parent
    return node.arg_key if node.parent is select else None


def _correlated_aggregate(
    q: _Query, node: exp.Subquery, outer: exp.Select,
) -> tuple[exp.Select, _Correlation] | None:
    """(subquery block, its correlation) for `(SELECT agg(…) FROM t2 WHERE t2.fk = t1.k AND …)`."""
    inner = node.this
    if not isinstance(inner, exp.Select) or len(inner.expressions) != 1 or inner.args.get("joins"):
        return None
    if any(inner.args.get(k) for k in ("group", "having", "limit", "offset", "distinct", "with_",
                                        "order", "locks", "windows")):
        return None
    agg = inner.expressions[0].unalias()
    if not isinstance(agg, _SCALAR_AGGREGATES) or _has_window(inner) or _has_volatile(inner):
        return None
    if len(_aggregates(inner)) != 1 or any(isinstance(n, exp.Subquery) for n in agg.walk()):
        return None
    if inner.find(exp.Select) is not inner or any(s is not inner for s in inner.find_all(exp.Select)):
        return None  # nested blocks: keep it simple
    found = _correlation(q, inner, outer)
    if found is None:
        return None
    return inner, found


def _scalar_to_join(q: _Query, node: exp.Subquery, inner: exp.Select, correlation: _Correlation,
                    place: str) -> Rewrite:
    fk, k = correlation.inner, correlation.outer
    used = _used_names(q.tree)
    alias = _fresh(DERIVED_ALIAS, used)
    key, value = _fresh("afs_k", used), _fresh("afs_v", used)
    agg = inner.expressions[0].unalias()
    is_count = isinstance(agg, exp.Count)
    # INNER JOIN only where a missing group makes the original drop the row anyway: a top-level
    # WHERE comparison with the subquery (NULL compares to nothing); count is 0, not NULL.
    outer = q.tree
    assert isinstance(outer, exp.Select)
    comparison = node.parent
    inner_join = (place == "where" and not is_count
                  and isinstance(comparison, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE))
                  and any(comparison is c for c in _where_conjuncts(outer)))

    grouped = inner.copy()
    _drop_conjunct(grouped, correlation.conjunct)
    grouped.set("expressions", [exp.alias_(fk.copy(), key), exp.alias_(agg.copy(), value)])
    grouped.set("group", exp.Group(expressions=[fk.copy()]))

    tree, copy = _copy_at(q.tree, node)
    result: exp.Expr = exp.column(value, table=alias)
    if is_count:
        result = exp.Coalesce(this=result, expressions=[exp.Literal.number(0)])
    in_list = copy.parent is tree  # a bare select item: keep its output column name
    _replace(copy, exp.alias_(result, _output_name(inner)) if in_list else result)
    assert isinstance(tree, exp.Select)
    tree.join(exp.Subquery(this=grouped, alias=exp.TableAlias(this=exp.to_identifier(alias))),
              on=exp.EQ(this=exp.column(key, table=alias),
                        expression=_qualified(k, correlation.outer_source)),
              join_type="INNER" if inner_join else "LEFT", copy=False)
    table = q.sources(inner)
    t2 = next(iter(table.values()))
    hints = ((t2.table, (fk.name,)),) if t2.table is not None else ()
    what = agg.sql(DIALECT)
    missing = ("count is 0 over no rows, hence coalesce(…, 0)" if is_count else
               f"{what} over no rows is NULL, as the missing LEFT JOIN match is"
               if not inner_join else
               f"{what} over no rows is NULL, and a comparison with NULL is never TRUE, so the original "
               "drops the rows an INNER JOIN finds no match for")
    return Rewrite(
        kind="scalar_subquery_to_join",
        sql=_render(tree),
        reason=(f"The subquery computes {what} over the rows of {t2.alias} with "
                f"{fk.sql(DIALECT)} = {k.sql(DIALECT)} (its other conditions do not refer to the outer "
                f"query). The derived table {alias} holds that value for every {fk.name} at once, one row "
                f"per {fk.name}, so the join adds no rows and {alias}.{value} is the subquery's value; "
                f"a NULL {k.sql(DIALECT)} matches nothing in either form; {missing}. The subquery "
                "runs once per outer row; the grouped table is computed once."),
        index_hints=hints,
    )


def _output_name(inner: exp.Select) -> str:
    """The column name PostgreSQL gives a scalar subquery in a select list: the inner item's name."""
    item = inner.expressions[0]
    if isinstance(item, exp.Alias):
        return item.alias
    agg = item.unalias()
    return agg.sql_name().lower() if isinstance(agg, exp.Func) else "?column?"


# -- rule: redundant DISTINCT ---------------------------------------------------------------------


def redundant_distinct(q: _Query) -> Iterator[Rewrite]:
    """SELECT DISTINCT whose rows are already unique: a key of its one table, or its GROUP BY keys."""
    select = q.tree
    if not isinstance(select, exp.Select):
        return
    distinct = select.args.get("distinct")
    if distinct is None or distinct.args.get("on") is not None or _has_set_returning(select):
        return
    fact = _unique_rows(q, select)
    if fact is None:
        return
    tree = select.copy()
    tree.set("distinct", None)
    yield Rewrite(
        kind="redundant_distinct",
        sql=_render(tree),
        reason=f"The rows are already distinct: {fact}. DISTINCT only adds a sort or hash of every row.",
    )


def _unique_rows(q: _Query, select: exp.Select) -> str | None:
    items = [item.unalias() for item in select.expressions]
    group = select.args.get("group")
    if group is not None:
        if any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets", "totals")):
            return None
        keys = list(group.expressions)
        if keys and all(_covers(item_key, items) for item_key in keys):
            return "the select list holds every GROUP BY key, and a grouped query has one row per key"
        return None
    sources = q.sources(select)
    if not sources or _aggregates(select):
        return None
    if len(sources) == 1 and not select.args.get("joins"):
        (source,) = sources.values()
        info = q.info(source)
        if info is None:
            return None
        selected = {item.name for item in items if isinstance(item, exp.Column)
                    and (not item.table or item.table == source.alias)}
        star = any(isinstance(item, exp.Star) or isinstance(item.this, exp.Star) for item in items)
        for name, key in _unique_keys(q, source):
            if star or set(key) <= selected:
                return f"the select list holds every column of {name} ({', '.join(key)}) of {info.name}"
        return None
    return _joined_unique_rows(q, select, items)


def _joined_unique_rows(q: _Query, select: exp.Select, items: list[exp.Expr]) -> str | None:
    """A join whose rows are unique: the select list holds a key of one FROM item (never
    null-extended), and every other item matches at most one row per row of those before it,
    because equalities with them (or constants) cover a key of its own. Then each row of the
    first item yields at most one joined row, and its key tells the rows apart."""
    joins = list(select.args.get("joins") or ())
    if any((j.args.get("side") or "").upper() in ("RIGHT", "FULL") or j.args.get("using")
           or (j.args.get("kind") or "").upper() not in ("", "INNER", "OUTER") for j in joins):
        return None
    sources = q.sources(select)
    if len(sources) != 1 + len(joins) or any(s.table is None for s in sources.values()):
        return None
    where = _where_conjuncts(select)
    own_on: dict[str, list[exp.Expr]] = {}
    shared = list(where)  # WHERE and the ON of inner joins filter the whole join
    for join in joins:
        on = conjuncts(join.args["on"]) if join.args.get("on") is not None else []
        alias = join.this.alias_or_name
        if (join.args.get("side") or "").upper() == "LEFT":
            own_on[alias] = on
        else:
            shared.extend(on)

    def bound(target: _Source, known: set[str]) -> set[str]:
        """Columns of `target` equal to a constant or to a column of the `known` items."""
        found: set[str] = set()
        for conjunct in [*shared, *own_on.get(target.alias, [])]:
            if not isinstance(conjunct, exp.EQ):
                continue
            for mine, other in ((conjunct.left, conjunct.right), (conjunct.right, conjunct.left)):
                if not isinstance(mine, exp.Column):
                    continue
                owner = q.resolve(mine)
                if owner is None or owner[0] is not select or owner[1] is not target:
                    continue
                if isinstance(other, exp.Column):
                    theirs = q.resolve(other)
                    if theirs is not None and theirs[0] is select and theirs[1].alias in known:
                        found.add(mine.name)
                elif _is_constant(other):
                    found.add(mine.name)
        return found

    star = any(isinstance(item, exp.Star) for item in items)
    for first in sources.values():
        if first.null_extended:
            continue
        selected = {item.name for item in items if isinstance(item, exp.Column)
                    and (resolved := q.resolve(item)) is not None and resolved[1] is first}
        starred = star or any(isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
                              and item.table == first.alias for item in items)
        key = next(((name, cols) for name, cols in _unique_keys(q, first)
                    if starred or set(cols) <= selected), None)
        if key is None:
            continue
        known, chain = {first.alias}, []
        progress = True
        while progress and len(known) < len(sources):
            progress = False
            for other in sources.values():
                if other.alias in known:
                    continue
                columns = bound(other, known)
                match = next((cols for _, cols in _unique_keys(q, other) if set(cols) <= columns), None)
                if match is not None:
                    known.add(other.alias)
                    chain.append(f"{other.alias} by ({', '.join(match)})")
                    progress = True
        if len(known) == len(sources):
            return (f"the select list holds every column of {key[0]} ({', '.join(key[1])}) of "
                    f"{first.alias}, and each joined table matches at most one row per {first.alias} row "
                    f"(equalities cover its key: {'; '.join(chain)})")
    return None


def _covers(key: exp.Expr, items: list[exp.Expr]) -> bool:
    if isinstance(key, exp.Literal) and key.is_int:
        return True  # GROUP BY 2 names a select item
    return any(key == item or (isinstance(key, exp.Column) and isinstance(item, exp.Column)
                               and key.name == item.name and key.table in ("", item.table))
               for item in items)


def _unique_keys(q: _Query, source: _Source) -> Iterator[tuple[str, tuple[str, ...]]]:
    """The primary key, and unique indexes over NOT NULL columns without a WHERE."""
    info = q.info(source)
    if info is None:
        return
    if info.primary_key:
        yield "the primary key", info.primary_key
    for index in info.indexes:
        if (index.unique and not index.primary and index.columns and " WHERE " not in index.definition
                and all(q.not_null(source, c) for c in index.columns)):
            yield f"the unique index {index.name} over NOT NULL columns", index.columns


# -- rule: OR → UNION ALL -------------------------------------------------------------------------


def or_to_union(q: _Query) -> Iterator[Rewrite]:
    """`a = 1 OR b = 2` on two columns of one table → UNION ALL of one branch per disjunct."""
    select = q.tree
    if not isinstance(select, exp.Select) or select.args.get("from_") is None:
        return
    if any(select.args.get(k) for k in ("group", "having", "distinct", "locks", "windows")):
        return
    if _aggregates(select) or _has_window(select) or _has_volatile(select) or _has_set_returning(select):
        return
    for conjunct in _where_conjuncts(select):
        disjuncts = _disjuncts(conjunct)
        if len(disjuncts) < 2:
            continue
        columns = [_simple_predicate(q, d) for d in disjuncts]
        if any(c is None for c in columns):
            continue
        found = [c for c in columns if c is not None]
        if len({source.alias for _, source in found}) != 1 or len({c.name for c, _ in found}) < 2:
            continue
        source = found[0][1]
        if source.table is None:
            continue
        order = _outer_order(q, select)
        if order is None:
            continue
        tree = _union_of(select, conjunct, disjuncts, order)
        hints = tuple(dict.fromkeys((source.table, (c.name,)) for c, _ in found))
        moved = [k for k in ("order", "limit", "offset") if select.args.get(k)]
        yield Rewrite(
            kind="or_to_union",
            sql=_render(tree),
            reason=("Branch i keeps the rows where disjunct i is TRUE and no earlier disjunct is TRUE "
                    "(IS NOT TRUE also passes NULL), so every row the OR keeps is in exactly one branch "
                    "and no other row is: UNION ALL returns the same multiset, NULLs and duplicates "
                    "included. Each branch can use an index on its own column; one OR over two "
                    "columns needs a bitmap OR of two indexes or a full scan."
                    + (" ORDER BY, LIMIT and OFFSET apply to the union, over the same output columns."
                       if moved else "")),
            index_hints=hints,
        )


def _disjuncts(node: exp.Expr) -> list[exp.Expr]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Or):
        return _disjuncts(node.left) + _disjuncts(node.right)
    return [node]


def _simple_predicate(q: _Query, node: exp.Expr) -> tuple[exp.Column, _Source] | None:
    """The column of `col op constant` (=, <, <=, >, >=, IN list, BETWEEN, IS NULL, LIKE)."""
    column: exp.Expr | None = None
    if isinstance(node, (exp.EQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
        if isinstance(node.left, exp.Column) and _is_constant(node.right):
            column = node.left
        elif isinstance(node.right, exp.Column) and _is_constant(node.left):
            column = node.right
    elif isinstance(node, exp.In) and not node.args.get("query") and node.expressions:
        if all(_is_constant(e) for e in node.expressions):
            column = node.this
    elif isinstance(node, exp.Between):
        if _is_constant(node.args["low"]) and _is_constant(node.args["high"]):
            column = node.this
    elif (isinstance(node, exp.Is) and isinstance(node.expression, exp.Null)) or (
            isinstance(node, exp.Like) and _is_constant(node.expression)):
        column = node.this
    if not isinstance(column, exp.Column):
        return None
    found = q.resolve(column)
    if found is None or found[0] is not _enclosing_select(node):
        return None
    return column, found[1]


def _outer_order(q: _Query, select: exp.Select) -> list[exp.Ordered] | None:
    """ORDER BY of the union: the same keys as output columns (by name or position); None if not."""
    order = select.args.get("order")
    if order is None:
        return []
    outputs = _outputs(q, select)
    if outputs is None:
        return None
    names = [name for name, _ in outputs]
    result = []
    for ordered in order.expressions:
        position = _output_position(q, ordered.this, select, outputs)
        if position is None:
            return None
        name = names[position]
        key: exp.Expr = (exp.column(name, table=UNION_ALIAS)
                         if name is not None and names.count(name) == 1 and _PLAIN_NAME.fullmatch(name)
                         else exp.Literal.number(position + 1))
        new = ordered.copy()
        new.set("this", key)
        result.append(new)
    return result


def _outputs(q: _Query, select: exp.Select) -> list[tuple[str | None, exp.Expr]] | None:
    """The output columns: (name, expression), stars expanded; None when a star cannot be."""
    outputs: list[tuple[str | None, exp.Expr]] = []
    sources = q.sources(select)
    for item in select.expressions:
        star_of: list[_Source] | None = None
        if isinstance(item, exp.Star):
            star_of = list(sources.values())
        elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            star_of = [sources[item.table]] if item.table in sources else None
            if star_of is None:
                return None
        if star_of is not None:
            for source in star_of:
                info = q.info(source)
                if info is None or not info.columns:
                    return None
                outputs.extend((c.name, exp.column(c.name, table=source.alias)) for c in info.columns)
        elif isinstance(item, exp.Alias):
            outputs.append((item.alias, item.this))
        elif isinstance(item, exp.Column):
            outputs.append((item.name, item))
        else:
            outputs.append((None, item))
    return outputs


def _output_position(q: _Query, key: exp.Expr, select: exp.Select,
                     outputs: list[tuple[str | None, exp.Expr]]) -> int | None:
    if isinstance(key, exp.Literal) and key.is_int:
        position = int(key.this) - 1
        if not any(isinstance(i, exp.Star) or isinstance(i.this, exp.Star) for i in select.expressions):
            return position if 0 <= position < len(outputs) else None
        return None
    aliases = [item.alias for item in select.expressions if isinstance(item, exp.Alias)]
    if isinstance(key, exp.Column) and not key.table and key.name in aliases:  # an output name
        named = [i for i, (name, _) in enumerate(outputs) if name == key.name]
        return named[0] if len(named) == 1 else None
    key_found = q.resolve(key) if isinstance(key, exp.Column) else None
    for i, (_, expr) in enumerate(outputs):
        if isinstance(key, exp.Column) and isinstance(expr, exp.Column) and key_found is not None:
            if expr.name == key.name and (expr.table == key_found[1].alias or (
                    not expr.table and (found := q.resolve(expr)) is not None and found[1] is key_found[1])):
                return i
        elif key == expr:
            return i
    return None


def _union_of(select: exp.Select, conjunct: exp.Expr, disjuncts: list[exp.Expr],
              order: list[exp.Ordered]) -> exp.Expr:
    base = select.copy()
    with_ = base.args.get("with_")
    tail = {k: base.args.get(k) for k in ("order", "limit", "offset")}
    for k in ("with_", "order", "limit", "offset"):
        base.set(k, None)
    path = _path(conjunct)
    branches: list[exp.Select] = []
    for i, disjunct in enumerate(disjuncts):
        branch = base.copy()
        earlier = [d.copy() for d in disjuncts[:i]]
        new: exp.Expr = disjunct.copy()
        if earlier:
            previous = exp.Paren(this=exp.or_(*earlier, copy=False))
            new = exp.and_(new, exp.Not(this=exp.Is(this=previous, expression=exp.Boolean(this=True))),
                           copy=False)
        target = _locate(branch, path)
        _replace(target, new)
        branches.append(branch)
    union: exp.Expr = branches[0]
    for branch in branches[1:]:
        union = exp.union(union, branch, distinct=False, copy=False)
    if order or tail["limit"] or tail["offset"]:
        wrapper = exp.select("*").from_(
            exp.Subquery(this=union, alias=exp.TableAlias(this=exp.to_identifier(UNION_ALIAS))), copy=False)
        if order:
            wrapper.set("order", exp.Order(expressions=order))
        wrapper.set("limit", tail["limit"])
        wrapper.set("offset", tail["offset"])
        union = wrapper
    if with_ is not None:
        union.set("with_", with_)
    return union


# -- keyset pagination ----------------------------------------------------------------------------


def _keyset_page(q: _Query) -> tuple[tuple[str, ...], bool, int, _Source] | None:
    """(keys, descending, offset, table) of `SELECT … FROM t … ORDER BY keys [LIMIT n] OFFSET m`."""
    select = q.tree
    if not isinstance(select, exp.Select) or select.args.get("joins"):
        return None
    if any(select.args.get(k) for k in ("group", "having", "distinct", "locks", "windows")):
        return None
    if _aggregates(select) or _has_window(select) or _has_set_returning(select):
        return None
    offset_node, order = select.args.get("offset"), select.args.get("order")
    if offset_node is None or order is None:
        return None
    offset_value = offset_node.expression
    if not (isinstance(offset_value, exp.Literal) and offset_value.is_int and int(offset_value.this) > 0):
        return None
    sources = q.sources(select)
    if len(sources) != 1:
        return None
    (source,) = sources.values()
    if source.table is None:
        return None
    keys: list[str] = []
    directions = set()
    aliases = {item.alias: item.this for item in select.expressions if isinstance(item, exp.Alias)}
    for ordered in order.expressions:
        key = ordered.this
        if not isinstance(key, exp.Column) or q.resolve(key) is None:
            return None
        named = aliases.get(key.name) if not key.table else None
        if named is not None and not (isinstance(named, exp.Column) and named.name == key.name):
            return None  # ORDER BY names an output column that is not this table column
        if q.not_null(source, key.name) is None:
            return None  # NULLs would sort outside a row comparison
        keys.append(key.name)
        directions.add(bool(ordered.args.get("desc")))
    if len(directions) != 1 or len(set(keys)) != len(keys):
        return None
    if not any(set(unique) <= set(keys) for _, unique in _unique_keys(q, source)):
        return None
    return tuple(keys), directions.pop(), int(offset_value.this), source


def _literal(value: object) -> exp.Expr | None:
    """An SQL literal for a value read back from PostgreSQL (its text form, typed by the comparison)."""
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, Decimal) and value.is_finite():
        return exp.Literal.number(str(value))
    if isinstance(value, float):
        return exp.Literal.number(repr(value)) if value == value and abs(value) != float("inf") \
            else exp.Literal.string(repr(value))
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return exp.Literal.string(value.isoformat())
    if isinstance(value, (str, uuid.UUID)):
        return exp.Literal.string(str(value))
    return None


RULES: tuple[Rule, ...] = (
    not_in_to_not_exists,
    sargable_range,
    scalar_subquery_to_join,
    in_to_exists,
    exists_to_in,
    redundant_distinct,
    or_to_union,
)


# -- as candidates of an agent -----------------------------------------------------------------
MAX_REWRITES = 3  # rewrite candidates per agent, the first found first


def rewrite_proposals(agent: str, ctx: AnalysisContext) -> tuple[OptimizationProposal, ...]:
    """The rewrites the query admits, as candidates: each alone, and, where an index would make
    it pay and none exists yet, with that index in the same proposal (the combined one first)."""
    try:
        query = Query.read(ctx.query)
    except InputError:
        return ()
    found = list(rewrites(query, ctx.tables))
    probe = keyset_probe(query, ctx.tables)
    if probe is not None and ctx.keyset_last_key is not None:
        page = keyset_rewrite(query, probe, ctx.keyset_last_key)
        if page is not None:
            found.insert(0, page)
    proposals: list[OptimizationProposal] = []
    for rewrite in found[:MAX_REWRITES]:
        indexes = _missing_indexes(rewrite, ctx.tables)
        if indexes:
            proposals.append(_proposal(agent, rewrite, indexes))
        proposals.append(_proposal(agent, rewrite, ()))
    return tuple(proposals)


def _missing_indexes(rewrite: Rewrite, tables: Mapping[str, TableInfo]) -> tuple[str, ...]:
    commands: list[str] = []
    for table, columns in rewrite.index_hints:
        info = tables.get(table)
        if info is None or not columns:
            continue
        if any(tuple(ix.columns[:len(columns)]) == tuple(columns) for ix in info.indexes):
            continue
        name = index_name(table, columns, taken=[ix.name for ix in info.indexes])
        commands.append(f"CREATE INDEX {ident(name)} ON {qualified(table)} "
                        f"({', '.join(ident(c) for c in columns)})")
    return tuple(dict.fromkeys(commands))


def _proposal(agent: str, rewrite: Rewrite, indexes: tuple[str, ...]) -> OptimizationProposal:
    what = rewrite.kind.replace("_", " ")
    rationale = f"Rewrite ({what}): {rewrite.reason}"
    if rewrite.changes:
        rationale += f" Changed on purpose: {rewrite.changes}"
    if rewrite.needs_application_change:
        rationale += " The application must pass the last key it showed instead of an OFFSET."
    if indexes:
        rationale += " With an index so the rewritten predicate can use it."
    return OptimizationProposal(
        agent=agent,
        proposal_type="query_rewrite",
        sql_commands=indexes,
        rollback_commands=(),
        rationale=rationale,
        estimated_impact=EstimatedImpact(query_time_improvement=50.0,
                                         storage_overhead_mb=0.0,
                                         complexity="low", risk="low"),
        rewritten_query=rewrite.sql,
        needs_application_change=rewrite.needs_application_change,
        validation_steps=("the rewrite returns the same rows for the query and other parameter values",),
    )
