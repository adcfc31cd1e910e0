"""What a proposal creates, typed (pure): read by the validator from the parse tree of each
command it accepts, in order (`afs.safety.statements.validate`), and read by the benchmark
(indexes it may hide), the query family (views and their queries), consensus (the tables that
get an index), the apply plan (its steps) and the batch report (indexes merged), none of which
parses the SQL again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from pglast import ast, enums

from afs.query.text import walk
from afs.safety.tree import _only_set_statistics, _parse_one, _plain, _Refused, _sql


@dataclass(frozen=True)
class NewIndex:
    """CREATE INDEX: the index `name` (schema of its table . index name, unquoted; None when the
    statement names none) on `table` (as written, unquoted)."""

    statement: str
    table: str
    name: str | None
    columns: tuple[str, ...]  # the plain columns among its keys
    keys: tuple[str, ...]  # every key: a column or (expression), then " DESC" when descending
    method: str  # the access method (btree when not said)
    where: str  # the predicate of a partial index, as SQL ("" when none)
    include: tuple[str, ...]  # INCLUDE columns
    unique: bool
    concurrently: str  # the statement as applied to a live database: CONCURRENTLY, no IF NOT EXISTS
    canonical: str = ""  # `_canonical`: what two proposals that make the same change share

    def on(self, table: str, name: str, *, concurrent: bool) -> str:
        """The same index on another table (schema.name unquoted), under `name`: ON ONLY and
        not CONCURRENTLY unless `concurrent` (a partition's index, `afs.apply.plan`)."""
        _, stmt = _parse_one(self.statement, what="command")
        assert isinstance(stmt, ast.IndexStmt)
        schema, _, rel = table.rpartition(".")
        stmt.relation = ast.RangeVar(schemaname=schema or None, relname=rel, inh=concurrent)
        stmt.idxname = name
        stmt.concurrent = concurrent
        stmt.if_not_exists = False
        return _sql(stmt)


@dataclass(frozen=True)
class NewView:
    """CREATE MATERIALIZED VIEW `name` (as written, unquoted) AS `query` (SQL text), which reads
    the relations `reads` (as written, CTE names and the view itself left out)."""

    statement: str
    name: str
    query: str
    reads: tuple[str, ...]
    canonical: str = ""  # `_canonical`: what two proposals that make the same change share


@dataclass(frozen=True)
class NewStatistics:
    """CREATE STATISTICS `name` (as written, unquoted) on `table` over `columns` (plain ones)."""

    statement: str
    name: str
    table: str | None
    columns: tuple[str, ...]
    canonical: str = ""  # `_canonical`: what two proposals that make the same change share


@dataclass(frozen=True)
class NewTable:
    """CREATE TABLE of a partitioning recipe (`name` as written, unquoted)."""

    statement: str
    name: str
    canonical: str = ""  # `_canonical`: what two proposals that make the same change share


ChangeKind = Literal["statistics_target", "analyze", "extension", "refresh", "insert", "rename",
                     "attach", "drop"]


@dataclass(frozen=True)
class Change:
    """An accepted command that creates nothing: ANALYZE, SET STATISTICS (`table`, `columns`),
    CREATE EXTENSION, REFRESH, and a partitioning recipe's INSERT, RENAME, ATTACH and DROP."""

    kind: ChangeKind
    statement: str
    table: str | None = None
    columns: tuple[str, ...] = ()
    canonical: str = ""  # `_canonical`: what two proposals that make the same change share


Fact = NewIndex | NewView | NewStatistics | NewTable | Change


@dataclass(frozen=True)
class Creates:
    """What a proposal's accepted commands create and change, in their order, read once from
    their parse trees by the validator (`validate`). `complete`: every command was accepted (so
    nothing else happens than what is listed)."""

    commands: tuple[Fact, ...] = ()
    complete: bool = True

    @property
    def indexes(self) -> tuple[NewIndex, ...]:
        return tuple(f for f in self.commands if isinstance(f, NewIndex))

    @property
    def views(self) -> tuple[NewView, ...]:
        return tuple(f for f in self.commands if isinstance(f, NewView))

    @property
    def statistics(self) -> tuple[NewStatistics, ...]:
        return tuple(f for f in self.commands if isinstance(f, NewStatistics))

    @property
    def tables(self) -> tuple[NewTable, ...]:
        return tuple(f for f in self.commands if isinstance(f, NewTable))

    @property
    def reads(self) -> tuple[str, ...]:
        """The relations the materialized views read, each once."""
        return tuple(dict.fromkeys(t for view in self.views for t in view.reads))

    @property
    def indexed_tables(self) -> tuple[str, ...]:
        """The tables that get a new index, as written, each once."""
        return tuple(dict.fromkeys(index.table for index in self.indexes))


def _relations_read(query: ast.Node | None, own: str | None) -> tuple[str, ...]:
    """The relations a query reads, as written (its CTEs' names and `own` left out)."""
    ctes = {n.ctename for n in walk(query) if isinstance(n, ast.CommonTableExpr) and n.ctename}
    found = dict.fromkeys(_plain(n) for n in walk(query) if isinstance(n, ast.RangeVar))
    return tuple(n for n in found if n is not None and n != own and n not in ctes)


def _canonical(stmt: ast.Node) -> str:
    """The statement as pglast prints it back (case, spaces, comments and `USING btree` gone),
    without what does not change what it makes: an index's name, CONCURRENTLY, IF NOT EXISTS."""
    if not isinstance(stmt, ast.IndexStmt):
        return _sql(stmt)
    as_written = stmt.idxname, stmt.concurrent, stmt.if_not_exists
    stmt.idxname, stmt.concurrent, stmt.if_not_exists = None, False, False
    try:
        return _sql(stmt)
    finally:
        stmt.idxname, stmt.concurrent, stmt.if_not_exists = as_written


def _fact(stmt: ast.Node, command: str) -> Fact:
    """What one accepted statement creates or changes (read before `_targets` alters the tree)."""
    return dataclasses.replace(_read(stmt, command), canonical=_canonical(stmt))


def _read(stmt: ast.Node, command: str) -> Fact:
    if isinstance(stmt, ast.IndexStmt):
        assert stmt.relation is not None  # _check_index
        table = _plain(stmt.relation) or ""
        name = None
        if stmt.idxname:
            name = f"{stmt.relation.schemaname}.{stmt.idxname}" if stmt.relation.schemaname else stmt.idxname
        elements = [e for e in stmt.indexParams or () if isinstance(e, ast.IndexElem)]
        keys = tuple((e.name or (f"({_sql(e.expr)})" if e.expr is not None else ""))
                     + (" DESC" if e.ordering == enums.SortByDir.SORTBY_DESC else "") for e in elements)
        as_written = stmt.concurrent, stmt.if_not_exists
        stmt.concurrent, stmt.if_not_exists = True, False
        concurrently = _sql(stmt)
        stmt.concurrent, stmt.if_not_exists = as_written
        return NewIndex(command, table, name, tuple(e.name for e in elements if e.name), keys,
                        (stmt.accessMethod or "btree").lower(),
                        _sql(stmt.whereClause) if stmt.whereClause is not None else "",
                        tuple(e.name for e in stmt.indexIncludingParams or ()
                              if isinstance(e, ast.IndexElem) and e.name),
                        bool(stmt.unique), concurrently)
    if isinstance(stmt, ast.CreateTableAsStmt):
        assert stmt.into is not None and stmt.query is not None  # _check_matview
        view = _plain(stmt.into.rel) or ""
        return NewView(command, view, _sql(stmt.query), _relations_read(stmt.query, view))
    if isinstance(stmt, ast.CreateStatsStmt):
        parts = [p.sval for p in stmt.defnames or () if isinstance(p, ast.String) and p.sval]
        rels = [r for r in stmt.relations or () if isinstance(r, ast.RangeVar)]
        columns = tuple(e.name for e in stmt.exprs or () if isinstance(e, ast.StatsElem) and e.name)
        return NewStatistics(command, ".".join(parts), _plain(rels[0]) if rels else None, columns)
    if isinstance(stmt, ast.CreateStmt):
        return NewTable(command, _plain(stmt.relation) or "")
    if isinstance(stmt, ast.AlterTableStmt) and _only_set_statistics(stmt):
        return Change("statistics_target", command, _plain(stmt.relation),
                      tuple(c.name for c in stmt.cmds or () if isinstance(c, ast.AlterTableCmd) and c.name))
    kinds: tuple[tuple[type[ast.Node], ChangeKind], ...] = (
        (ast.VacuumStmt, "analyze"), (ast.CreateExtensionStmt, "extension"),
        (ast.RefreshMatViewStmt, "refresh"), (ast.InsertStmt, "insert"), (ast.RenameStmt, "rename"),
        (ast.AlterTableStmt, "attach"), (ast.DropStmt, "drop"))
    kind = next(k for cls, k in kinds if isinstance(stmt, cls))
    return Change(kind, command, _plain(getattr(stmt, "relation", None)))


def writes_from_query(sql: str) -> bool:
    """Whether a statement writes a relation from a query, which EXPLAIN can estimate before it
    runs (the fork's growth cap, `afs.forks.limits.check_growth`): CREATE MATERIALIZED VIEW or
    TABLE … AS with data, INSERT … SELECT (not VALUES), SELECT … INTO. Read from the parse tree,
    so comments, parentheses and case do not hide it; False for what does not parse."""
    try:
        _, stmt = _parse_one(sql, what="command")
    except _Refused:
        return False
    if isinstance(stmt, ast.CreateTableAsStmt):
        return stmt.into is None or not stmt.into.skipData
    if isinstance(stmt, ast.InsertStmt):
        select = stmt.selectStmt
        return isinstance(select, ast.SelectStmt) and not select.valuesLists
    return isinstance(stmt, ast.SelectStmt) and stmt.intoClause is not None
