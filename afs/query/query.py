"""The query read once (pure): a frozen `Query` holds pglast's verdict, sqlglot's tree and
its scopes, and the one column resolver every reader of the query uses.

    query = Query.read(sql)         InputError unless pglast reads one query (SELECT, WITH …,
                                    VALUES, set operations); remembered by text, so the router,
                                    the suite, the parameter sets and every strategist of every
                                    agent share one reading (afs.query.text.PARSES counts them)
    query.text                      the query as pglast splits it (no terminating `;`)
    query.tree                      sqlglot's tree (names folded as PostgreSQL folds them), or
                                    None when sqlglot cannot read it (`query.problem` says why).
                                    Shared: read it, never edit it in place; `query.copy()`
                                    gives a tree to edit
    query.scope_of(node)            the sqlglot Scope of the query block `node` is in
    query.source_of(column, tables) the one column resolver (below): the block and FROM item
    query.table_of(column, tables)  the same, as the base table's name

How a column finds its table, as PostgreSQL resolves it, block by block:
    qualified `t.c`    `t` is looked up among the sources of the column's own block, then of
                       the enclosing blocks (a correlated reference); the first block that has
                       it decides. A base table gives its name (afs.pg.names.relation_key:
                       `orders`, `"Orders"`); a CTE or a derived table gives None.
    unqualified `c`    given the catalog (`tables`, TableInfo by the same names) and a block
                       whose every source it describes: the one source that has a column `c`;
                       none: the enclosing block, in the same way (a correlated reference);
                       several: None (PostgreSQL calls it ambiguous). Without the catalog, or
                       with a source it does not describe (a CTE, a derived table): the
                       block's only source (with the catalog: only in the outermost block,
                       where no enclosing block could own `c`), else None.

Helpers for the readers: `local(node)` (a node and what it holds, nested blocks left out),
`block_of(node)`, `base_table(source)` and `BLOCKS`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.scope import Scope, traverse_scope

from afs.errors import InputError
from afs.models import TableInfo
from afs.pg.names import relation_key
from afs.query.text import first_line, parse_query, select_text

BLOCKS = (exp.Select, exp.SetOperation)  # query blocks; exp.Subquery is only parentheses


def local(node: exp.Expr | None) -> Iterator[exp.Expr]:
    """`node` and what it contains, without descending into nested query blocks."""
    if node is None:
        return
    yield from node.walk(bfs=False, prune=lambda n: n is not node and isinstance(n, BLOCKS))


def block_of(node: exp.Expr) -> exp.Expr | None:
    """The innermost query block `node` is in (itself excluded)."""
    parent = node.parent
    while parent is not None and not isinstance(parent, BLOCKS):
        parent = parent.parent
    return parent


def table_name(table: exp.Table) -> str:
    """The table's name as PostgreSQL prints it: `orders`, `"Orders"` (afs.pg.names)."""
    return relation_key(*(part for part in (table.catalog, table.db, table.name) if part))


def base_table(source: object) -> str | None:
    """The name of a source that is a table of the database (not a CTE, function or subquery)."""
    if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier):
        return table_name(source)
    return None


def has_column(info: TableInfo, name: str) -> bool:
    """The catalog knows a column `name` of the table (its columns or its statistics)."""
    return name in info.column_stats or any(c.name == name for c in info.columns)


@dataclass(frozen=True, eq=False)
class Query:
    """One query as AFS reads it, once (module docstring)."""

    text: str
    tree: exp.Expr | None
    problem: str | None = None  # why sqlglot cannot read or scope it
    scopes: tuple[Scope, ...] = ()
    _by_block: Mapping[int, Scope] = field(default_factory=dict, repr=False)

    @staticmethod
    def read(sql: str) -> Query:
        """The query of `sql`, read once and remembered; InputError unless it is one query."""
        return _read(sql)

    @property
    def readable(self) -> exp.Expr:
        """The tree, or InputError saying why sqlglot cannot read the query."""
        if self.tree is None:
            raise InputError(f"cannot analyse the query: {self.problem}")
        return self.tree

    def copy(self) -> exp.Expr:
        """A tree of one's own to edit (a copy, not a new reading)."""
        return self.readable.copy()

    def scope_of(self, node: exp.Expr) -> Scope | None:
        """The Scope of the block `node` is in (of `node` itself when it is a block)."""
        block = node if isinstance(node, BLOCKS) else block_of(node)
        return self._by_block.get(id(block)) if block is not None else None

    def source_of(self, column: exp.Column,
                  tables: Mapping[str, TableInfo] | None = None) -> tuple[Scope, str] | None:
        """The block (its Scope) and the name of the FROM item `column` (a node of this
        query's tree) belongs to: the one column resolver (module docstring)."""
        scope = self.scope_of(column)
        if column.table:
            while scope is not None:
                if column.table in scope.selected_sources:
                    return scope, column.table
                scope = scope.parent
            return None
        own = scope
        while scope is not None:
            names = list(scope.selected_sources)
            bases = [base_table(scope.selected_sources[name][1]) for name in names]
            if tables is not None and all(_described(base, tables) for base in bases):
                owners = [name for name, base in zip(names, bases, strict=True)
                          if base is not None and has_column(tables[base], column.name)]
                if len(owners) == 1:
                    return scope, owners[0]
                if owners:
                    return None  # ambiguous: PostgreSQL refuses it
                scope = scope.parent  # a correlated reference, or no such column
                continue
            if len(names) == 1 and (tables is None or (scope is own and scope.parent is None)):
                return scope, names[0]  # the block's only source
            return None
        return None

    def tables_named(self, name: str) -> frozenset[str | None]:
        """What a FROM item called `name` (an alias, or a table's own name) is in the blocks
        that have one: base tables by name, None for a CTE or a derived table. One element
        when every block agrees; a name without a block (as EXPLAIN prints it) means that."""
        return frozenset(base_table(scope.selected_sources[name][1])
                         for scope in self.scopes if name in scope.selected_sources)

    def table_of(self, column: exp.Column,
                 tables: Mapping[str, TableInfo] | None = None) -> str | None:
        """The base table `column` belongs to; None for a CTE's or a derived table's column,
        or when it cannot be told (module docstring)."""
        found = self.source_of(column, tables)
        return base_table(found[0].selected_sources[found[1]][1]) if found is not None else None


def _described(base: str | None, tables: Mapping[str, TableInfo]) -> bool:
    """The catalog lists the columns of this source (a base table it describes)."""
    info = tables.get(base) if base is not None else None
    return info is not None and bool(info.columns or info.column_stats)


@functools.lru_cache(maxsize=64)
def _read(sql: str) -> Query:
    text = select_text(sql)
    try:
        tree = parse_query(text)
    except SqlglotError as exc:
        return Query(text, None, first_line(exc))
    try:
        scopes = tuple(traverse_scope(tree))
        for scope in scopes:  # computed on first use: its errors belong here
            scope.selected_sources  # noqa: B018
    except SqlglotError as exc:  # e.g. an alias used twice in one FROM
        return Query(text, tree, first_line(exc))
    return Query(text, tree, None, scopes, {id(scope.expression): scope for scope in scopes})
