"""A partitioning proposal's migration recipe (pure), judged step by step with what the
steps before it did (`_Recipe`). Allowed only in a "partitioning" proposal:

    CREATE TABLE … PARTITION BY RANGE|LIST|HASH (…)  /  CREATE TABLE … (LIKE …)
    CREATE TABLE … PARTITION OF … FOR VALUES …   (CREATE TABLE without IF NOT EXISTS)
    INSERT INTO <table created in this proposal> [(cols)] SELECT … FROM <table>,
        unless that writes into an existing table (a partition of the target, or
        the target's partitioned table)
    ALTER TABLE … RENAME TO …
    ALTER TABLE <table created in this proposal> ATTACH PARTITION …
    DROP TABLE <one table> (no CASCADE), only for a table this proposal created (and
        no existing table attached to it) and that does not hold the only copy of a dropped
        table's rows, or for the table being replaced: one this proposal copied whole into
        a table it still has. A whole copy is INSERT … SELECT * FROM <it> with no column
        list, or names its columns on both sides in the same order (the catalog confirms
        they are all of them); nothing filtered, grouped or limited, not ONLY.
    At the end, a table that takes the name of an existing one renamed away or dropped
    must hold all of its rows (a whole copy, or the table itself attached as a partition).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pglast import ast, enums
from pglast.stream import maybe_double_quote_name

from afs.safety.query import _read_only_problem
from afs.safety.references import Ref, RefKind
from afs.safety.tree import _check_target, _key_sql, _Refused, _rv_key, _rv_sql, _Verdict

_Identity = tuple[str, str]  # ("created" | "existing" | "gone", a name)


@dataclass
class _Recipe:
    """What a partitioning proposal has done so far, to judge its INSERT, ATTACH and DROP steps.

    `names` maps a current name to the identity of the table behind it: ("created", name at
    creation) or ("existing", original name); a name not in it is an existing table, and a
    name renamed away or dropped is ("gone", name). `parents` maps a partition to its
    partitioned table (PARTITION OF, ATTACH PARTITION); `copies` maps a table to the tables it
    was copied into whole (`_whole_copy`); `dropped` holds the tables dropped so far.
    """

    names: dict[str, _Identity] = field(default_factory=dict)
    parents: dict[_Identity, _Identity] = field(default_factory=dict)
    copies: dict[_Identity, set[_Identity]] = field(default_factory=dict)
    dropped: set[_Identity] = field(default_factory=set)
    # what the catalog must judge, and the command being judged (set by `_validate`)
    refs: list[Ref] = field(default_factory=list)
    statement: str = ""
    # existing tables whose name was freed (renamed away, dropped), and the command that last
    # put something under a name
    freed: set[str] = field(default_factory=set)
    placed: dict[str, str] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)  # existing tables the recipe moves or reads whole

    def add(self, kind: RefKind, name: str, **more: Any) -> None:
        self.refs.append(Ref(kind, self.statement, name, **more))

    def identity(self, key: str) -> _Identity:
        return self.names.get(key, ("existing", key))

    def ancestors(self, table: _Identity) -> list[_Identity]:
        """The tables `table` is a partition of, nearest first."""
        found: list[_Identity] = []
        parent = self.parents.get(table)
        while parent is not None and parent not in found:
            found.append(parent)
            parent = self.parents.get(parent)
        return found

    def partitions(self, table: _Identity) -> set[_Identity]:
        """The partitions of `table`, at any depth."""
        return {t for t in self.parents if table in self.ancestors(t)}

    def family(self, table: _Identity) -> set[_Identity]:
        return {table, *self.ancestors(table), *self.partitions(table)}

    def copied_whole(self, table: _Identity, dropped: set[_Identity] | None = None) -> bool:
        """Whether the rows of `table` are in a table of this proposal that is still in place
        (after dropping `dropped`, by default the tables dropped so far)."""
        gone = self.dropped if dropped is None else dropped
        return any(not self.family(copy) & gone for copy in self.copies.get(table, ()))

    def holds_rows_of(self, holder: _Identity, table: _Identity) -> bool:
        """Whether `holder` (with its partitions) holds every row of `table`: it is the table,
        has it attached as a partition, or took a whole copy of it."""
        family = self.family(holder)
        return table in family or any(copy in family for copy in self.copies.get(table, ()))

    def replacement_problems(self) -> list[tuple[str, str]]:
        """(command, reason) for each existing table whose name now belongs to a table without
        its rows: a filtered copy renamed into its place, a new table created under its name."""
        problems: list[tuple[str, str]] = []
        for key in sorted(self.freed):
            original: _Identity = ("existing", key)
            now = self.names.get(key)
            if now is None or now[0] == "gone" or now == original:
                continue
            if not self.holds_rows_of(now, original):
                problems.append((self.placed.get(key, ""), (
                    f"{key} would be replaced by a table that does not hold all of its rows (a whole "
                    "copy, INSERT … SELECT * FROM it, or the table itself attached as a partition): "
                    "a migration must keep every row and column of the original")))
        return problems


def _check_create_table(stmt: ast.CreateStmt, recipe: _Recipe) -> _Verdict:
    _check_target(stmt.relation)
    assert stmt.relation is not None
    if stmt.relation.relpersistence != "p":
        raise _Refused("TEMPORARY and UNLOGGED tables are not in the allow-list")
    if stmt.if_not_exists:
        raise _Refused("CREATE TABLE IF NOT EXISTS would take an existing table of that name for a new one")
    if stmt.tablespacename:
        raise _Refused("TABLESPACE is not in the allow-list")
    if stmt.accessMethod not in (None, "heap"):
        raise _Refused(f"table access method {stmt.accessMethod} is not in the allow-list")
    if stmt.ofTypename is not None:
        raise _Refused("typed tables (OF type) are not in the allow-list")
    parents = stmt.inhRelations or ()
    likes = [e for e in stmt.tableElts or () if isinstance(e, ast.TableLikeClause)]
    if stmt.partbound is not None:
        if len(parents) != 1:  # pragma: no cover - the grammar names exactly one parent
            raise _Refused("PARTITION OF names one parent")
        _check_target(parents[0])
    elif parents:
        raise _Refused("table inheritance (INHERITS) is not in the allow-list")
    elif stmt.partspec is None and not likes:
        raise _Refused("in a partitioning proposal CREATE TABLE must be PARTITION BY …, "
                       "PARTITION OF … or (LIKE …)")
    for like in likes:
        _check_target(like.relation)
    key = _rv_key(stmt.relation)
    if recipe.names.get(key, ("existing", key))[0] != "gone":  # a name not freed by this proposal
        recipe.add("exists", stmt.relation.relname or "", schema=stmt.relation.schemaname)
    recipe.names[key] = ("created", key)
    recipe.placed[key] = recipe.statement
    if stmt.partbound is not None:
        recipe.parents[("created", key)] = recipe.identity(_rv_key(parents[0]))
    return _Verdict("high", 0.8, (f"DROP TABLE IF EXISTS {_rv_sql(stmt.relation)}",),
                    ("partitioning rollback is best effort: reverse renames, then drop the new tables",))


def _check_insert(stmt: ast.InsertStmt, recipe: _Recipe) -> _Verdict:
    _check_target(stmt.relation)
    if stmt.withClause is not None:
        raise _Refused("INSERT with WITH is not in the allow-list (use INSERT INTO … SELECT … FROM …)")
    if stmt.onConflictClause is not None:
        raise _Refused("INSERT … ON CONFLICT is not in the allow-list")
    if stmt.returningClause is not None:
        raise _Refused("INSERT … RETURNING is not in the allow-list")
    select = stmt.selectStmt
    if (not isinstance(select, ast.SelectStmt) or select.valuesLists
            or select.op != enums.SetOperation.SETOP_NONE):
        raise _Refused("only INSERT INTO <table> SELECT … FROM <table> is allowed")
    sources = [item for item in select.fromClause or () if isinstance(item, ast.RangeVar)]
    if not sources:
        raise _Refused("only INSERT INTO <table> SELECT … FROM <table> is allowed")
    problem = _read_only_problem(select)
    if problem:
        raise _Refused(f"INSERT source: {problem}")
    target = recipe.identity(_rv_key(stmt.relation))
    if target[0] != "created":
        raise _Refused("INSERT only into a table created earlier in this proposal")
    existing = sorted(name for kind, name in recipe.family(target) if kind == "existing")
    if existing:
        raise _Refused(f"INSERT would write rows into the existing table {existing[0]} "
                       "(a partition of it, or partitioned by it)")
    for source in sources:
        _check_target(source)
        kind, original = recipe.identity(_rv_key(source))
        if kind == "existing":
            recipe.touched.add(original)
    whole, columns = _whole_copy(stmt, select)
    if whole:
        copied = recipe.identity(_rv_key(sources[0]))
        if columns is not None and copied[0] == "existing":
            # a whole copy names every column: only the catalog knows them all
            recipe.add("columns", _key_sql(copied[1]), columns=columns)
        recipe.copies.setdefault(copied, set()).add(target)
    return _Verdict("high", 0.8, (), (
        "INSERT … SELECT copies every row: on a live database, writes made meanwhile are not copied",))


def _whole_copy(stmt: ast.InsertStmt, select: ast.SelectStmt) -> tuple[bool, tuple[str, ...] | None]:
    """Whether the INSERT copies every row and column of one table, and the columns it names.

    A whole copy is `INSERT INTO n SELECT * FROM t` (no column list), or names its columns on
    both sides in the same order, `INSERT INTO n (a, b) SELECT a, b FROM t`, in which case the
    catalog must confirm that a, b are all the columns of t (the names are returned). Every
    row: one table with its partitions (not ONLY), nothing filtered, grouped or limited. Only
    such a copy lets the proposal drop or replace the table it copied out of.
    """
    sources = select.fromClause or ()
    if not (len(sources) == 1 and isinstance(sources[0], ast.RangeVar) and bool(sources[0].inh)
            and not any((select.distinctClause, select.whereClause, select.groupClause,
                         select.havingClause, select.windowClause, select.limitCount,
                         select.limitOffset))):
        return False, None
    fields: list[tuple[Any, ...]] = []
    for target in select.targetList or ():
        if not isinstance(target, ast.ResTarget) or not isinstance(target.val, ast.ColumnRef):
            return False, None
        fields.append(tuple(target.val.fields or ()))
    if len(fields) == 1 and fields[0] and isinstance(fields[0][-1], ast.A_Star):
        return not stmt.cols, None  # SELECT * into a column list: only some columns are filled
    copied = tuple(f[-1].sval for f in fields if f and isinstance(f[-1], ast.String) and f[-1].sval)
    if len(copied) != len(fields) or not copied:
        return False, None
    if stmt.cols:
        targets = tuple(c.name for c in stmt.cols if isinstance(c, ast.ResTarget) and not c.indirection)
        if targets != copied:
            return False, None
    return True, copied


def _check_rename(stmt: ast.RenameStmt, recipe: _Recipe) -> _Verdict:
    if stmt.renameType != enums.ObjectType.OBJECT_TABLE or stmt.subname is not None or not stmt.newname:
        raise _Refused("only ALTER TABLE … RENAME TO … is allowed (partitioning)")
    _check_target(stmt.relation)
    assert stmt.relation is not None and stmt.relation.relname
    old_key = _rv_key(stmt.relation)
    new_rv = ast.RangeVar(schemaname=stmt.relation.schemaname, relname=stmt.newname)
    identity = recipe.identity(old_key)
    if identity == ("existing", old_key):
        recipe.freed.add(old_key)
    if identity[0] == "existing":
        recipe.touched.add(identity[1])
    recipe.names[old_key] = ("gone", old_key)
    recipe.names[_rv_key(new_rv)] = identity
    recipe.placed[_rv_key(new_rv)] = recipe.statement
    old_name = maybe_double_quote_name(stmt.relation.relname)
    back = f"ALTER TABLE IF EXISTS {_rv_sql(new_rv)} RENAME TO {old_name}"
    return _Verdict("high", 0.7, (back,), ())


def _check_alter_table(stmt: ast.AlterTableStmt, recipe: _Recipe) -> _Verdict:
    if stmt.objtype != enums.ObjectType.OBJECT_TABLE:
        raise _Refused("only ALTER TABLE … RENAME TO and ALTER TABLE … ATTACH PARTITION are allowed")
    _check_target(stmt.relation)
    parent = recipe.identity(_rv_key(stmt.relation))
    rollback: list[str] = []
    for cmd in stmt.cmds or ():
        if not isinstance(cmd, ast.AlterTableCmd) or cmd.subtype != enums.AlterTableType.AT_AttachPartition:
            raise _Refused("only ALTER TABLE … RENAME TO and ALTER TABLE … ATTACH PARTITION are allowed")
        part = cmd.def_
        if not isinstance(part, ast.PartitionCmd):  # pragma: no cover - the grammar guarantees it
            raise _Refused("ATTACH PARTITION without a partition")
        _check_target(part.name)
        kind, original = recipe.identity(_rv_key(part.name))
        if kind == "existing":
            recipe.touched.add(original)
        if any(kind != "created" for kind, _ in (parent, *recipe.ancestors(parent))):
            raise _Refused("ATTACH PARTITION only to a table created in this proposal "
                           "(attaching to an existing table changes its rows)")
        recipe.parents[recipe.identity(_rv_key(part.name))] = parent
        rollback.append(f"ALTER TABLE IF EXISTS {_rv_sql(stmt.relation)} "
                        f"DETACH PARTITION {_rv_sql(part.name)}")
    return _Verdict("high", 0.8, tuple(rollback), ())


def _check_drop(stmt: ast.DropStmt, recipe: _Recipe) -> _Verdict:
    if stmt.behavior == enums.DropBehavior.DROP_CASCADE:
        raise _Refused("DROP … CASCADE also drops dependent objects")
    objects = stmt.objects or ()
    if len(objects) != 1:
        raise _Refused("DROP TABLE of several tables is not allowed")
    parts = [p.sval for p in objects[0] if isinstance(p, ast.String) and p.sval]
    if len(parts) > 2 or not parts:
        raise _Refused("cross-database names are not allowed")
    rv = ast.RangeVar(schemaname=parts[0] if len(parts) == 2 else None, relname=parts[-1])
    _check_target(rv)
    key = _rv_key(rv)
    identity = recipe.identity(key)
    if identity[0] != "created" and not (identity[0] == "existing" and recipe.copied_whole(identity)):
        raise _Refused("DROP TABLE only for a table this proposal created, or copied whole into a table "
                       "it keeps (the table being replaced)")
    existing = sorted(name for kind, name in recipe.partitions(identity) if kind == "existing")
    if existing:
        raise _Refused(f"DROP TABLE {_rv_sql(rv)} would also drop the existing table {existing[0]}, "
                       "attached as its partition")
    lost = [name for kind, name in sorted(recipe.dropped | {identity}) if kind == "existing"
            and not recipe.copied_whole(("existing", name), recipe.dropped | {identity})]
    if lost:
        raise _Refused(f"DROP TABLE {_rv_sql(rv)} would drop the only copy of the rows of {lost[0]}")
    if identity == ("existing", key):
        recipe.freed.add(key)
    if identity[0] == "existing":
        recipe.touched.add(identity[1])
    recipe.names[key] = ("gone", key)
    recipe.dropped.add(identity)
    if identity[0] == "created":
        return _Verdict("high", 0.8, (), ())
    name = _rv_sql(rv)
    return _Verdict("high", 0.2, (), (f"DROP TABLE {name} cannot be undone: its rows survive only in "
                                      "the new table, so the rollback stops at this point",),
                    point_of_no_return=True)
