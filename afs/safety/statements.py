"""The allow-list, one statement at a time, and the one validation of a proposal (pure).

`validate(proposal)` checks each command (`_check_statement`: the allow-list of
`afs.safety`'s docstring; the recipe steps in `afs.safety.partitioning`) and returns, once per
distinct commands and type, the verdict (`ValidationResult`), what the catalog must judge
(`References`) and what the commands create (`Creates`). `validate_proposal`,
`validate_candidate` (with the per-query settings) and `proposal_references` read it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from pglast import ast, enums
from pglast.stream import maybe_double_quote_name

from afs.errors import InputError
from afs.models import PROPOSAL_TYPES, OptimizationProposal, RiskLevel, UnsafeStatement, ValidationResult
from afs.query.text import walk
from afs.safety.creates import Creates, Fact, _fact
from afs.safety.partitioning import (
    _check_alter_table,
    _check_create_table,
    _check_drop,
    _check_insert,
    _check_rename,
    _Recipe,
)
from afs.safety.query import _read_only_problem, _side_effect_problem
from afs.safety.references import References, Target, _collect, _targets, query_references
from afs.safety.settings import check_settings
from afs.safety.tree import (
    _check_target,
    _describe,
    _key_sql,
    _object_word,
    _only_set_statistics,
    _parse_one,
    _qualified,
    _Refused,
    _rv_key,
    _rv_sql,
    _system_schema,
    _Verdict,
)

INDEX_ACCESS_METHODS: frozenset[str] = frozenset({"btree", "hash", "gist", "spgist", "gin", "brin"})


_REFUSED: dict[str, str] = {
    "DoStmt": "DO blocks run arbitrary code",
    "CopyStmt": "COPY reads or writes server files and programs",
    "AlterSystemStmt": "ALTER SYSTEM changes the server configuration",
    "GrantStmt": "GRANT/REVOKE changes privileges",
    "GrantRoleStmt": "GRANT/REVOKE changes role membership",
    "CreateRoleStmt": "roles and users are not changed by proposals",
    "AlterRoleStmt": "roles and users are not changed by proposals",
    "AlterRoleSetStmt": "roles and users are not changed by proposals",
    "DropRoleStmt": "roles and users are not changed by proposals",
    "ReassignOwnedStmt": "roles and users are not changed by proposals",
    "DropOwnedStmt": "DROP OWNED drops objects",
    "CreateFunctionStmt": "CREATE FUNCTION/PROCEDURE defines code",
    "AlterFunctionStmt": "functions are not changed by proposals",
    "CreateTrigStmt": "CREATE TRIGGER defines code that runs on writes",
    "CreateEventTrigStmt": "event triggers define code",
    "RuleStmt": "CREATE RULE rewrites queries",
    "CreateExtensionStmt": "CREATE EXTENSION installs code",
    "AlterExtensionStmt": "extensions are not changed by proposals",
    "CallStmt": "CALL runs a procedure",
    "CreatedbStmt": "CREATE DATABASE is not a query optimization",
    "DropdbStmt": "DROP DATABASE destroys a database",
    "AlterDatabaseStmt": "databases are not changed by proposals",
    "AlterDatabaseSetStmt": "databases are not changed by proposals",
    "CreateSchemaStmt": "schemas are not changed by proposals",
    "ClusterStmt": "CLUSTER rewrites a table under an exclusive lock",
    "ReindexStmt": "REINDEX is not in the allow-list",
    "LockStmt": "LOCK takes table locks",
    "ListenStmt": "LISTEN/NOTIFY is not a schema change",
    "UnlistenStmt": "LISTEN/NOTIFY is not a schema change",
    "NotifyStmt": "LISTEN/NOTIFY is not a schema change",
    "PrepareStmt": "PREPARE/EXECUTE can hide any statement",
    "ExecuteStmt": "PREPARE/EXECUTE can hide any statement",
    "DeallocateStmt": "prepared statements are not part of a proposal",
    "DiscardStmt": "DISCARD changes session state",
    "LoadStmt": "LOAD loads a shared library",
    "SecLabelStmt": "SECURITY LABEL changes security metadata",
    "CommentStmt": "COMMENT ON is not a performance change",
    "CheckPointStmt": "CHECKPOINT is a server operation",
    "TransactionStmt": "transaction control is managed by AFS",
    "ExplainStmt": "EXPLAIN is run by AFS, not proposed",
    "TruncateStmt": "TRUNCATE destroys data",
    "DeleteStmt": "DELETE modifies data",
    "UpdateStmt": "UPDATE modifies data",
    "MergeStmt": "MERGE modifies data",
    "ViewStmt": "a plain view does not make a query faster (use a materialized view)",
    "VariableShowStmt": "SHOW is not a schema change",
    "CreateForeignServerStmt": "foreign servers reach other databases",
    "CreateForeignTableStmt": "foreign tables reach other databases",
    "CreateUserMappingStmt": "user mappings hold credentials",
    "ImportForeignSchemaStmt": "foreign schemas reach other databases",
    "CreateSubscriptionStmt": "logical replication is not a proposal",
    "CreatePublicationStmt": "logical replication is not a proposal",
    "DeclareCursorStmt": "cursors are not part of a proposal",
    "FetchStmt": "cursors are not part of a proposal",
    "ClosePortalStmt": "cursors are not part of a proposal",
    "AlterOwnerStmt": "ownership is not changed by proposals",
    "AlterObjectSchemaStmt": "moving objects between schemas is not in the allow-list",
    "CreateTableSpaceStmt": "tablespaces are not changed by proposals",
    "DropTableSpaceStmt": "tablespaces are not changed by proposals",
}


# extensions a proposal may create: trusted (a database owner may create them), shipped with
# PostgreSQL, and only defining operator classes and functions without side effects
ALLOWED_EXTENSIONS: frozenset[str] = frozenset({"pg_trgm", "btree_gin"})


_PARTITIONING_ONLY = "allowed only as a step of a partitioning proposal"


_RISK_ORDER: dict[RiskLevel, int] = {"low": 0, "medium": 1, "high": 2}


def _check_index(stmt: ast.IndexStmt, recipe: _Recipe) -> _Verdict:
    _check_target(stmt.relation)
    if stmt.primary or stmt.isconstraint:
        raise _Refused("constraints are not part of the allow-list")
    method = (stmt.accessMethod or "btree").lower()
    if method not in INDEX_ACCESS_METHODS:
        raise _Refused(f"index access method {method} is not in the allow-list")
    if stmt.tableSpace:
        raise _Refused("TABLESPACE is not in the allow-list")
    warnings: list[str] = []
    risk: RiskLevel = "low"
    if not stmt.concurrent:
        warnings.append("CREATE INDEX without CONCURRENTLY locks writes on a live database; "
                        "AFS applies CONCURRENTLY when a person applies it")
    if stmt.unique:
        risk = "medium"
        warnings.append("unique index can fail on existing duplicates and rejects later ones")
    if method != "btree" and method != "hash":
        risk = "medium"
    if not stmt.idxname:
        warnings.append("index name missing: PostgreSQL will choose one, so no rollback can be generated")
        return _Verdict(risk, 0.5, (), tuple(warnings))
    assert stmt.relation is not None  # _check_target
    name = _qualified(stmt.relation.schemaname, stmt.idxname)
    # the index goes into the schema of its table: it must not exist there yet
    recipe.add("exists", stmt.idxname, schema=stmt.relation.schemaname, near=_rv_sql(stmt.relation))
    if stmt.if_not_exists:
        warnings.append(f"IF NOT EXISTS: if an index {name} already exists nothing is built, "
                        "and the rollback would drop the existing one")
    return _Verdict(risk, 1.0, (f"DROP INDEX IF EXISTS {name}",), tuple(warnings))


def _check_extension(stmt: ast.CreateExtensionStmt) -> _Verdict:
    name = stmt.extname or ""
    if name not in ALLOWED_EXTENSIONS:
        raise _Refused(f"CREATE EXTENSION {name} is not in the allow-list "
                       f"(only {', '.join(sorted(ALLOWED_EXTENSIONS))})")
    if not stmt.if_not_exists:
        raise _Refused(f"CREATE EXTENSION {name} must say IF NOT EXISTS (the extension may be installed)")
    if stmt.options:
        raise _Refused("CREATE EXTENSION options (SCHEMA, VERSION, CASCADE) are not in the allow-list")
    return _Verdict("low", 1.0, (), (
        f"the target database needs the {name} extension; the rollback leaves it installed, "
        "since other objects may depend on it",))


def _check_matview(stmt: ast.CreateTableAsStmt, recipe: _Recipe) -> _Verdict:
    into = stmt.into
    if into is None:  # pragma: no cover - the grammar always sets it
        raise _Refused("materialized view without a name")
    _check_target(into.rel)
    if into.tableSpaceName:
        raise _Refused("TABLESPACE is not in the allow-list")
    if into.accessMethod not in (None, "heap"):
        raise _Refused(f"table access method {into.accessMethod} is not in the allow-list")
    problem = _read_only_problem(stmt.query)
    if problem:
        raise _Refused(f"materialized view query: {problem}")
    name = _rv_sql(into.rel)
    assert into.rel is not None and into.rel.relname  # _rv_sql
    recipe.add("exists", into.rel.relname, schema=into.rel.schemaname)
    warnings = ["materialized view needs REFRESH to stay current"]
    if into.skipData:
        warnings.append("WITH NO DATA: the view cannot be read until it is refreshed")
    if stmt.if_not_exists:
        warnings.append(f"IF NOT EXISTS: if {name} already exists nothing is created, "
                        "and the rollback would drop the existing one")
    return _Verdict("medium", 1.0, (f"DROP MATERIALIZED VIEW IF EXISTS {name}",), tuple(warnings))


STATISTICS_KINDS: frozenset[str] = frozenset({"ndistinct", "dependencies", "mcv"})


# what an expression of CREATE STATISTICS may be made of: columns, constants, operators,
# casts and plain function calls (no aggregates, windows or subqueries; denied functions are
# refused for every statement)
_STATISTICS_EXPRESSION_NODES: tuple[type[ast.Node], ...] = (
    ast.ColumnRef, ast.A_Const, ast.A_Expr, ast.TypeCast, ast.TypeName, ast.FuncCall, ast.String,
    ast.Integer, ast.Float, ast.Boolean, ast.BoolExpr, ast.NullTest, ast.CoalesceExpr, ast.CaseExpr,
    ast.CaseWhen, ast.CollateClause,
)


def _check_statistics(stmt: ast.CreateStatsStmt, recipe: _Recipe) -> _Verdict:
    parts = [p.sval for p in stmt.defnames or () if isinstance(p, ast.String) and p.sval]
    if not parts:
        raise _Refused("CREATE STATISTICS needs a name, so that the rollback can drop it")
    if len(parts) > 2:
        raise _Refused("cross-database names are not allowed")
    if len(parts) == 2 and _system_schema(parts[0]):
        raise _Refused(f"system schema {parts[0]} is not changed by proposals")
    relations = stmt.relations or ()
    if len(relations) != 1 or not isinstance(relations[0], ast.RangeVar):
        raise _Refused("CREATE STATISTICS on exactly one table is allowed")
    _check_target(relations[0])
    kinds = [k.sval for k in stmt.stat_types or () if isinstance(k, ast.String)]
    unknown = sorted({(k or "").lower() for k in kinds} - STATISTICS_KINDS)
    if unknown:
        raise _Refused(f"statistics kind {unknown[0]} is not in the allow-list "
                       f"({', '.join(sorted(STATISTICS_KINDS))})")
    for element in stmt.exprs or ():
        if not isinstance(element, ast.StatsElem):  # pragma: no cover - the grammar guarantees it
            raise _Refused("CREATE STATISTICS lists columns or expressions")
        if element.expr is None:
            continue
        for sub in walk(element.expr):
            if not isinstance(sub, _STATISTICS_EXPRESSION_NODES):
                raise _Refused(f"CREATE STATISTICS expression: {type(sub).__name__} is not a simple "
                               "expression (columns, constants, operators, casts, function calls)")
            if isinstance(sub, ast.FuncCall) and (sub.over is not None or sub.agg_star or sub.agg_distinct
                                                  or sub.agg_order or sub.agg_filter is not None):
                raise _Refused("CREATE STATISTICS expression: aggregates and window functions are not "
                               "simple expressions")
    name = _qualified(*parts) if len(parts) == 2 else _qualified(None, parts[0])
    recipe.add("statistics", parts[-1], schema=parts[0] if len(parts) == 2 else None)
    warnings = ["ANALYZE the table (or its columns) to build the statistics"]
    if stmt.if_not_exists:
        warnings.append(f"IF NOT EXISTS: if statistics {name} already exist nothing is created, "
                        "and the rollback would drop the existing ones")
    return _Verdict("low", 1.0, (f"DROP STATISTICS IF EXISTS {name}",), tuple(warnings))


MAX_STATISTICS_TARGET = 10_000  # PostgreSQL's own upper bound


def _check_set_statistics(stmt: ast.AlterTableStmt) -> _Verdict:
    """ALTER TABLE … ALTER COLUMN name SET STATISTICS n: the column's statistics target."""
    if stmt.objtype != enums.ObjectType.OBJECT_TABLE:
        raise _Refused("SET STATISTICS only on a table's columns")
    _check_target(stmt.relation)
    assert stmt.relation is not None
    columns = []
    for cmd in stmt.cmds or ():
        if not cmd.name:
            raise _Refused("SET STATISTICS names its column (not a column number)")
        target = cmd.def_
        if not isinstance(target, ast.Integer) or not 1 <= (target.ival or 0) <= MAX_STATISTICS_TARGET:
            raise _Refused(f"SET STATISTICS takes a target from 1 to {MAX_STATISTICS_TARGET}"
                           " (DEFAULT and -1 are what the rollback sets)")
        columns.append(maybe_double_quote_name(cmd.name))
    table = _rv_sql(stmt.relation)
    # the rollback runs in reverse: the default target first, then ANALYZE rebuilds with it
    back = (f"ANALYZE {table} ({', '.join(columns)})",
            f"ALTER TABLE IF EXISTS {table} "
            + ", ".join(f"ALTER COLUMN {c} SET STATISTICS -1" for c in columns))
    return _Verdict("low", 0.9, back,
                    ("ANALYZE the columns to rebuild their statistics with the new target",))


def _check_refresh(stmt: ast.RefreshMatViewStmt) -> _Verdict:
    _check_target(stmt.relation)
    if stmt.skipData:
        raise _Refused("REFRESH … WITH NO DATA empties the view: it cannot be read until refreshed again")
    warnings = () if stmt.concurrent else (
        "REFRESH MATERIALIZED VIEW without CONCURRENTLY blocks readers of the view while it runs",)
    return _Verdict("medium", 1.0, (), warnings)


def _check_analyze(stmt: ast.VacuumStmt) -> _Verdict:
    if stmt.is_vacuumcmd:
        raise _Refused("VACUUM is not in the allow-list (ANALYZE is)")
    for opt in stmt.options or ():
        if isinstance(opt, ast.DefElem) and (opt.defname or "").lower() not in ("verbose", "skip_locked",
                                                                                  "buffer_usage_limit"):
            raise _Refused(f"ANALYZE option {opt.defname} is not in the allow-list")
    rels = stmt.rels or ()
    for rel in rels:
        if isinstance(rel, ast.VacuumRelation) and rel.relation is not None and rel.relation.catalogname:
            raise _Refused("cross-database names are not allowed")
    warnings = () if rels else ("ANALYZE without a table analyzes the whole database",)
    return _Verdict("low", 1.0, (), warnings)


def _check_statement(stmt: ast.Node, partitioning: bool, recipe: _Recipe) -> _Verdict:
    problem = _side_effect_problem(stmt)
    if problem:
        raise _Refused(problem)
    if isinstance(stmt, ast.IndexStmt):
        return _check_index(stmt, recipe)
    if isinstance(stmt, ast.CreateExtensionStmt):
        return _check_extension(stmt)
    if isinstance(stmt, ast.CreateTableAsStmt):
        if stmt.objtype == enums.ObjectType.OBJECT_MATVIEW:
            return _check_matview(stmt, recipe)
        raise _Refused("CREATE TABLE AS is not in the allow-list")
    if isinstance(stmt, ast.RefreshMatViewStmt):
        return _check_refresh(stmt)
    if isinstance(stmt, ast.CreateStatsStmt):
        return _check_statistics(stmt, recipe)
    if isinstance(stmt, ast.VacuumStmt):
        return _check_analyze(stmt)
    if isinstance(stmt, ast.SelectStmt):
        if stmt.intoClause is not None:
            raise _Refused("SELECT INTO creates a table")
        raise _Refused("a query is not a schema change")
    if isinstance(stmt, ast.VariableSetStmt):
        name = (stmt.name or "").lower()
        if name in ("role", "session_authorization"):
            raise _Refused("SET/RESET ROLE and SESSION AUTHORIZATION change the session's privileges")
        raise _Refused("SET changes session settings")
    if isinstance(stmt, ast.DropStmt) and stmt.removeType != enums.ObjectType.OBJECT_TABLE:
        raise _Refused(f"DROP {_object_word(stmt.removeType)} is not in the allow-list")
    if isinstance(stmt, ast.AlterTableStmt) and _only_set_statistics(stmt):
        return _check_set_statistics(stmt)
    recipe_steps = (ast.CreateStmt, ast.InsertStmt, ast.RenameStmt, ast.AlterTableStmt, ast.DropStmt)
    if isinstance(stmt, recipe_steps):
        if not partitioning:
            raise _Refused(f"{_describe(stmt)} is {_PARTITIONING_ONLY}")
        if isinstance(stmt, ast.CreateStmt):
            return _check_create_table(stmt, recipe)
        if isinstance(stmt, ast.InsertStmt):
            return _check_insert(stmt, recipe)
        if isinstance(stmt, ast.RenameStmt):
            return _check_rename(stmt, recipe)
        if isinstance(stmt, ast.AlterTableStmt):
            return _check_alter_table(stmt, recipe)
        return _check_drop(stmt, recipe)
    reason = _REFUSED.get(type(stmt).__name__)
    raise _Refused(reason or f"{_describe(stmt)} is not in the allow-list")


@dataclass(frozen=True)
class Validated:
    """The one structural validation of a proposal's commands (`validate`): the verdict, what
    the catalog must judge, and what the commands create."""

    result: ValidationResult
    references: References
    creates: Creates


def validate(proposal: OptimizationProposal) -> Validated:
    """The structural validation of `proposal`'s commands, computed once per distinct commands
    and type (later calls return the same object): `validate_candidate`, `proposal_references`
    and every reader of what a proposal creates share it."""
    return validate_commands(proposal.sql_commands, proposal.proposal_type)


def validate_commands(sql_commands: Sequence[str], proposal_type: str) -> Validated:
    """`validate` of commands of a stored proposal (a batch report's winner)."""
    commands = (sql_commands,) if isinstance(sql_commands, str) else tuple(sql_commands)
    return _validated(commands, proposal_type)


def creates(proposal: OptimizationProposal) -> Creates:
    """What `proposal`'s commands create (`validate(proposal).creates`)."""
    return validate(proposal).creates


def validate_proposal(sql_commands: Sequence[str], proposal_type: str) -> ValidationResult:
    """Judge an agent's commands against the allow-list; never raises for bad SQL.

    Every refused command becomes an `UnsafeStatement` in `rejected` (and `is_valid` is
    False, risk "high", reversibility 0.0). Rollback commands undo the accepted ones in
    reverse order; partitioning rollback is best effort (reverse renames, detach, drop the
    new tables) and stops at a DROP of the replaced table, since undoing the steps before it
    would drop the only copy of the data. Raises `InputError` only for an unknown proposal type.

    What only the catalog knows (which function a name calls, whether an index exists) is
    judged afterwards: `proposal_references` and `judge_references`.
    """
    return validate_commands(sql_commands, proposal_type).result


@functools.lru_cache(maxsize=1024)
def _validated(sql_commands: tuple[str, ...], proposal_type: str) -> Validated:
    """The validation of commands (pure, so kept: a candidate is validated once, however many
    of its readers ask)."""
    if proposal_type not in PROPOSAL_TYPES:
        raise InputError(f"unknown proposal type {proposal_type!r} (known: {', '.join(PROPOSAL_TYPES)})")
    partitioning = proposal_type == "partitioning"
    recipe = _Recipe()
    rejected: list[UnsafeStatement] = []
    warnings: list[str] = []
    rollback: list[str] = []
    risk: RiskLevel = "low"
    reversibility = 1.0
    creates_extension = False
    targets: list[Target] = []
    facts: list[Fact] = []
    if not sql_commands:
        rejected.append(UnsafeStatement("", "empty proposal: no commands"))
    for command in sql_commands:
        recipe.statement = command
        try:
            if proposal_type == "settings":
                raise _Refused("a settings proposal carries per-query settings, no commands")
            _, stmt = _parse_one(command, what="command")
            verdict = _check_statement(stmt, partitioning, recipe)
        except _Refused as exc:
            rejected.append(UnsafeStatement(command, exc.reason))
            continue
        facts.append(_fact(stmt, command))  # before `_targets`, which marks a view WITH NO DATA
        _collect(stmt, command, "read", recipe.refs)
        if not (isinstance(stmt, ast.CreateStmt) and stmt.partbound is not None and any(
                kind == "existing" for kind, _ in recipe.ancestors(recipe.identity(_rv_key(stmt.relation))))):
            # (a partition of an existing table is not created ahead: that would scan its default
            # partition, running the existing partition key; its names are judged all the same)
            targets.extend(_targets(stmt, command))
        creates_extension = creates_extension or isinstance(stmt, ast.CreateExtensionStmt)
        if _RISK_ORDER[verdict.risk] > _RISK_ORDER[risk]:
            risk = verdict.risk
        reversibility = min(reversibility, verdict.reversibility)
        if verdict.point_of_no_return:
            rollback.clear()
        rollback.extend(verdict.rollback)
        warnings.extend(w for w in verdict.warnings if w not in warnings)
    rejected.extend(UnsafeStatement(command, reason) for command, reason in recipe.replacement_problems())
    undo = tuple(reversed(rollback))
    preserved = tuple(_key_sql(key) for key in sorted(recipe.touched))
    refs = References(tuple(recipe.refs), creates_extension, preserved, tuple(targets))
    created = Creates(tuple(facts), complete=not rejected)
    if rejected:
        return Validated(ValidationResult(False, "high", 0.0, tuple(warnings), undo, tuple(rejected)), refs,
                         created)
    return Validated(ValidationResult(True, risk, reversibility, tuple(warnings), undo), refs, created)


def proposal_references(proposal: OptimizationProposal) -> References:
    """The names in a proposal's commands and rewrite that the catalog must judge."""
    commands = validate(proposal).references if proposal.sql_commands else References()
    rewrite = query_references(proposal.rewritten_query) if proposal.rewritten_query else References()
    return References((*commands.refs, *rewrite.refs), commands.creates_extension, commands.preserved,
                      (*commands.targets, *rewrite.targets))


def validate_candidate(proposal: OptimizationProposal) -> ValidationResult:
    """`validate_proposal` of its commands, and its per-query settings checked too.

    A proposal may consist of settings or a rewrite alone (no commands): it changes nothing
    in the database, so it is low risk and needs no rollback. (The rewrite itself is checked
    with `check_query` by the caller.)
    """
    refused = check_settings(proposal.settings)
    if proposal.sql_commands or not (proposal.settings or proposal.rewritten_query):
        result = validate(proposal).result
    else:
        result = ValidationResult(True, "low", 1.0)
    if refused:
        return ValidationResult(False, "high", 0.0, result.warnings, result.rollback_commands,
                                (*result.rejected, *refused))
    return result
