"""What only the catalog can judge, and what PostgreSQL resolves (pure: the decisions; the
queries that ask are in `afs.catalog`).

Names only the catalog can judge. Structure says `f(x)`, `a === b`, `x::t`, `FROM pg_authid`,
`CREATE INDEX IF NOT EXISTS i`; what they mean depends on the database. Every check above
also records them as `References` (`proposal_references`, `query_references`); the caller
resolves them in one query against the catalog of the fork where they would run
(`afs/catalog.py`) and `judge_references` decides. Decisions:

* A function runs only if it is built in (a system OID, below 16384, and no extension) or
  belongs to an extension in `TRUSTED_EXTENSIONS` (shipped with PostgreSQL, side effects only
  in VOLATILE functions). Functions defined in the database are refused wherever they are
  called — index expressions, views, rewrites, partition keys, defaults, and the user's own
  query: they run arbitrary code, and their IMMUTABLE or STABLE label is the author's claim,
  not a guarantee. So are functions of any other extension (aws_s3, pg_cron, pg_surgery's
  heap_force_kill, dblink, …) and SECURITY DEFINER functions. The same holds for the function
  behind an operator and for the functions a cast runs (the type's input function, the casts
  to the type, the checks of a domain). A name with several overloads is judged by all those
  the search path reaches with that many arguments (the operand types pick one at run time:
  an overload of the user's beside a built-in refuses the name). The same goes for
  operators: in a database with an extension that overloads `=` and is not in the
  allow-list (PostGIS, say), every `=` is refused until that extension is reviewed and added
  to `TRUSTED_EXTENSIONS` — a false refusal, never a false acceptance.
* Volatility: in an index expression or predicate, statistics expression, partition key or
  generated column, a function must have an IMMUTABLE overload (PostgreSQL checks the one it
  picks); elsewhere no overload may be VOLATILE unless the name is in `VOLATILE_ALLOWED`
  (random(), clock_timestamp(), …; now() is STABLE and needs no entry). Operators and casts
  are judged by origin only: their volatility depends on the operand types.
* Relations: a name that resolves into a system schema (an unqualified pg_authid, a temporary
  table shadowing the real one) or to a foreign table is refused, in proposals and in the
  user's query alike (a query on the catalogs is refused by design).
* What a proposal creates (an index, a materialized view, statistics, a table) must not exist
  yet: IF NOT EXISTS on an existing index builds nothing, the baseline would then hide the
  user's own index and the rollback drop it.
* Names the denied patterns match outside the pg_ prefix (lo_*, http_*, dblink*, crosstab*)
  are refused by name only when the catalog says they are built in or an extension's: a
  user's lo_total() is refused for being the user's, and a column named http_x or lo_x is
  never refused.

* A view a statement reads runs its own functions: those of every view it reads, at any
  depth, are judged as above (materialized views too, which REFRESH runs), with the operators
  and types its rules use.
* Types are judged through everything inside them (`afs.catalog`): a cast to a type runs its
  input function, the casts to it, the checks of a domain, of the domain under it, of an
  array's element and of a composite's fields, and a range's functions. A relation read also
  has the types of its columns judged, for what reading them may run: the element and field
  types inside them (a literal compared with an array of a domain runs the domain's checks
  while PostgreSQL parses the statement, before anything is planned) and a range's
  subtype_diff (run by the planner's estimates); a column of a domain itself runs its checks
  only when written, which the created table's dependencies cover.
* Ordered-set and hypothetical-set aggregates (`percentile_cont(0.9) WITHIN GROUP (ORDER BY
  x)`) are looked up with their direct and their WITHIN GROUP arguments, as PostgreSQL does.

What PostgreSQL resolves. Each check above also lists, as `Target`s, what PostgreSQL must
resolve: the query or rewrite, a materialized view's query, an index's or statistics object's
expressions and predicate (`SELECT (expr) AS e1, … FROM <table> WHERE <predicate>`), the
source of a recipe's copy; a recipe's CREATE TABLE, RENAME and DROP are run so that what
follows resolves. `afs.catalog` creates a temporary view over each (parse analysis only:
nothing is planned or run) in a transaction that is always rolled back, and reads what its
rewrite rule depends on (pg_depend, and the rule's own tree for the built-ins pg_depend never
records); `judge_resolved` decides: every function reached, directly or through an operator,
a type or a view, is judged by origin and against the deny lists, the ones called directly by
volatility too (IMMUTABLE for an index target, not VOLATILE for a read); a read target that
PostgreSQL cannot resolve is refused (it could not be judged, and would not run either).

Not judged here: row-level security policies, triggers (proposals write only into tables they
create), operator classes, and the planner's own support functions (written in C, so by a
superuser).
A migration recipe is also checked where it runs: agents.py counts and checksums the rows of
every table it moves before and after (`afs.catalog.lost_rows`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pglast import ast, enums

from afs.models import UnsafeStatement
from afs.query.text import walk
from afs.safety.functions import _denial, denied_function
from afs.safety.query import _read_only_problem
from afs.safety.tree import _func_name, _parse_one, _qualified, _Refused, _rv_sql, _sql, _system_schema

RefKind = Literal["function", "operator", "type", "relation", "exists", "statistics", "columns"]


Context = Literal["index", "read"]  # index expressions and predicates need IMMUTABLE functions


@dataclass(frozen=True)
class Ref:
    """One name a statement uses whose meaning only the database's catalog knows.

    * function: `name` called with `nargs` arguments (`schema` when qualified), in `context`;
    * operator: `name` with `nargs` operands (1: prefix, 2: infix);
    * type: a cast to `name` (SQL text): its input function, the casts to it, its domain checks;
    * relation: a relation read or changed (`name` as SQL text): not a system relation;
    * exists / statistics: a relation (index, view, table) / statistics object the proposal
      creates as `name` in `schema` (for an index: the schema of the table `near`): it must be new;
    * columns: an INSERT copies `columns` of the table `name`: they must be all of its columns.
    """

    kind: RefKind
    statement: str
    name: str
    schema: str | None = None
    context: Context = "read"
    nargs: int = 0
    near: str | None = None
    columns: tuple[str, ...] = ()


TargetKind = Literal["read", "index", "matview", "create", "execute"]


@dataclass(frozen=True)
class Target:
    """One piece of a query or proposal whose meaning PostgreSQL itself resolves (`afs.catalog`),
    in order, inside a transaction that is always rolled back.

    * read: `sql` is a SELECT (the query, a rewrite, a materialized view's query, the source of a
      copy, `SELECT 1 FROM <matview>` for a REFRESH): a temporary view over it is created and
      what its rewrite rule depends on is judged (direct calls must not be VOLATILE);
    * index: `sql` is `SELECT (expression) AS e1, … FROM <table> WHERE <predicate>` for an index
      or statistics object: as read, but direct calls must be IMMUTABLE;
    * matview: `sql` is the CREATE MATERIALIZED VIEW … WITH NO DATA (created empty: its query is
      analysed, not run), judged as read, so that an index on it or its REFRESH resolve after it;
    * create: `sql` is a recipe's CREATE TABLE, run in that transaction, then the dependencies of
      the table `relation` (column types, defaults, partition key, constraints) are judged;
    * execute: `sql` is a recipe's RENAME, DROP TABLE or CREATE EXTENSION, run so that the
      statements after it resolve as they will in the fork; nothing of the database's runs.

    A read, index or matview target that PostgreSQL cannot resolve is refused (what it cannot
    resolve cannot be judged, and would not run either); a create or execute one that fails is
    left to fail where it runs, and what follows it is still resolved (or refused) on its own.
    """

    kind: TargetKind
    statement: str
    sql: str
    relation: str | None = None


@dataclass(frozen=True)
class References:
    """What the catalog must judge for one query or proposal (`judge_references`).

    `creates_extension`: the proposal installs an allowed extension, so names it defines may not
    exist yet. `preserved`: existing tables a partitioning recipe moves, renames, drops or copies,
    as SQL text: each must hold the same rows and columns under its name afterwards. `targets`:
    what PostgreSQL is asked to resolve after the names pass (`judge_resolved`).
    """

    refs: tuple[Ref, ...] = ()
    creates_extension: bool = False
    preserved: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()


@dataclass(frozen=True)
class CatalogFact:
    """One row of the catalog about `References.refs[ref]` (see `afs/catalog.py`).

    For a function, operator or type: one function it may run (`schema`.`name`, whether it is
    built in, its extension, volatility 'i'/'s'/'v', SECURITY DEFINER; `via` says which operator
    or cast runs it); a type that does not exist gives one row with `name` None. For a relation:
    the schema it resolves to and its kind (`extra`). For exists/statistics: the existing object.
    For columns: the table's columns (`extra`).
    """

    ref: int
    schema: str | None = None
    name: str | None = None
    builtin: bool = False
    extension: str | None = None
    volatility: str | None = None
    security_definer: bool = False
    via: str | None = None
    extra: tuple[str, ...] = ()
    kind: Literal["function", "relation"] = "function"  # what `name` is (for `judge_resolved`)


# extensions whose functions and operators a proposal or query may use, judged by their
# volatility like built-in ones: shipped with PostgreSQL, and free of side effects short of
# VOLATILE functions (which are refused outside the short list below)
TRUSTED_EXTENSIONS: frozenset[str] = frozenset({
    "pg_trgm", "btree_gin", "btree_gist", "citext", "hstore", "cube", "earthdistance",
    "fuzzystrmatch", "intarray", "isn", "ltree", "seg", "unaccent",
})


# VOLATILE functions a query, rewrite or view may call: they change nothing
VOLATILE_ALLOWED: frozenset[str] = frozenset({
    "random", "random_normal", "clock_timestamp", "timeofday", "gen_random_uuid", "uuidv4", "uuidv7",
})


# relation kinds that reach outside the database
_FOREIGN_RELKINDS = frozenset({"f"})


def _origin_problem(fact: CatalogFact, subject: str) -> str | None:
    """Why a function that would run is refused for what it is (not for its volatility)."""
    if fact.security_definer:
        return f"{subject}is SECURITY DEFINER: it would run with its owner's rights"
    # an extension's function is judged by the allow-list even when it was installed with
    # PostgreSQL (plpgsql's handler lives in pg_catalog with a system OID)
    trusted = fact.extension in TRUSTED_EXTENSIONS if fact.extension else fact.builtin
    if not trusted:
        origin = (f"comes from the extension {fact.extension}, which is not in the allow-list"
                  if fact.extension else "is defined in the database")
        return (f"{subject}is not built in: it {origin} (only built-in functions and those of "
                f"{', '.join(sorted(TRUSTED_EXTENSIONS))} may run)")
    if denied_function((fact.name or "",)):
        return f"{subject}{_denial((fact.name or '',))}"
    return None


def _ref_problem(ref: Ref, facts: Sequence[CatalogFact], creates_extension: bool) -> str | None:
    """Why the catalog refuses one reference, or None."""
    if ref.kind in ("function", "operator", "type"):
        shown = {"function": f"{ref.name}()", "operator": f"operator {ref.name}",
                 "type": f"the cast to {ref.name}"}[ref.kind]
        if ref.schema is not None and ref.kind != "type":
            shown = f"{ref.schema}.{shown}" if ref.kind == "function" else f"operator {ref.schema}.{ref.name}"
        runs = [f for f in facts if f.name is not None]
        if not runs:
            if ref.kind == "type" and facts:  # the type does not exist
                return None if creates_extension else f"type {ref.name} does not exist in the database"
            if ref.kind == "type" or creates_extension:
                return None  # a cast that runs no function (binary coercible, I/O of a built-in type)
            return f"{shown} does not exist in the database (with {ref.nargs} argument(s))"
        for fact in runs:
            qualified = f"{fact.schema}.{fact.name}()"
            through = "" if ref.kind == "function" else f"{shown} runs {qualified}, which "
            subject = f"calls {qualified}, which " if ref.kind == "function" else through
            problem = _origin_problem(fact, subject)
            if problem:
                return problem
        if ref.kind != "function":
            return None  # operand types decide which one runs: volatility is PostgreSQL's check
        volatile = [f for f in runs if f.volatility == "v" and f.name not in VOLATILE_ALLOWED]
        if ref.context == "read" and volatile:
            return (f"calls {volatile[0].schema}.{volatile[0].name}(), which is VOLATILE: it may change "
                    f"data (only {', '.join(sorted(VOLATILE_ALLOWED))} are allowed)")
        if ref.context == "index" and not any(f.volatility == "i" for f in runs):
            return (f"calls {runs[0].schema}.{runs[0].name}(), which is not IMMUTABLE "
                    "(index expressions and predicates must be)")
        return None
    if ref.kind == "relation":
        # the relation itself first: a system relation is refused for what it is
        for fact in sorted(facts, key=lambda f: (f.kind != "relation", f.via is not None)):
            if fact.kind == "function":  # what a view (at any depth) or a column's type runs
                problem = _origin_problem(fact, f"{ref.name} runs {fact.schema}.{fact.name}() (through "
                                                f"{fact.via}), which ")
                if problem:
                    return problem
                continue
            if fact.via is None and _system_schema(fact.schema):
                return (f"{ref.name} is {fact.schema}.{fact.name}, a system relation: system "
                        "relations are neither read nor changed")
            if set(fact.extra) & _FOREIGN_RELKINDS:
                if fact.via is not None:
                    return (f"{ref.name} reads {fact.schema}.{fact.name} through {fact.via}, a foreign "
                            "table: it reaches another database")
                return f"{ref.name} is a foreign table: it reaches another database"
        return None
    if ref.kind in ("exists", "statistics"):
        if facts:
            what = "statistics" if ref.kind == "statistics" else (facts[0].extra or ("relation",))[0]
            return (f"{what} {facts[0].schema}.{ref.name} already exists: the proposal would create "
                    "nothing new, and its rollback would drop the existing one")
        return None
    # columns
    if not facts:
        return f"cannot confirm that the copy keeps every column of {ref.name}: no such table"
    missing = [c for c in facts[0].extra if c not in ref.columns]
    if missing:
        return (f"copies only some columns of {ref.name} (not {', '.join(missing)}): a migration must "
                "keep every row and column of the original")
    return None


def judge_references(refs: References, facts: Sequence[CatalogFact]) -> tuple[UnsafeStatement, ...]:
    """The statements the catalog refuses, each with its first reason (empty when all pass).

    Functions, and the functions behind operators and casts, must be built in (or from a
    `TRUSTED_EXTENSIONS` extension), not SECURITY DEFINER, not known to have side effects; a
    function called by name must be IMMUTABLE in an index expression or predicate (one of its
    overloads: PostgreSQL checks the one it picks), and not VOLATILE elsewhere (any overload)
    unless in `VOLATILE_ALLOWED`. Relations must not resolve into a system schema or be
    foreign tables; what a proposal creates must not exist yet; a copy must name every column.
    """
    by_ref: dict[int, list[CatalogFact]] = {}
    for fact in facts:
        by_ref.setdefault(fact.ref, []).append(fact)
    problems: dict[str, str] = {}
    for i, ref in enumerate(refs.refs):
        if ref.statement in problems:
            continue
        problem = _ref_problem(ref, by_ref.get(i, []), refs.creates_extension)
        if problem:
            problems[ref.statement] = problem
    return tuple(UnsafeStatement(statement, reason) for statement, reason in problems.items())


def _resolved_problem(target: Target, facts: Sequence[CatalogFact]) -> str | None:
    """Why what PostgreSQL resolved for one target is refused, or None."""
    for fact in facts:
        qualified = f"{fact.schema}.{fact.name}"
        if fact.kind == "relation":
            if fact.via is None and _system_schema(fact.schema):
                return f"reads {qualified}, a system relation: system relations are neither read nor changed"
            if set(fact.extra) & _FOREIGN_RELKINDS:
                through = f" (through {fact.via})" if fact.via else ""
                return f"reads {qualified}{through}, a foreign table: it reaches another database"
            continue
        subject = (f"uses {fact.via}, which runs {qualified}(), which " if fact.via
                   else f"calls {qualified}(), which ")
        if target.kind == "create" and fact.name == "nextval" and fact.builtin:
            continue  # a serial column's default, as LIKE … INCLUDING ALL copies it
        problem = _origin_problem(fact, subject)
        if problem:
            return problem
        if fact.via is not None:
            continue  # behind an operator, a type or a view: judged by origin (as above)
        if target.kind == "index" and fact.volatility != "i":
            return f"{subject}is not IMMUTABLE (index expressions and predicates must be)"
        reads = target.kind in ("read", "matview")
        if reads and fact.volatility == "v" and fact.name not in VOLATILE_ALLOWED:
            return (f"{subject}is VOLATILE: it may change data "
                    f"(only {', '.join(sorted(VOLATILE_ALLOWED))} are allowed)")
    return None


def judge_resolved(refs: References, facts: Sequence[CatalogFact],
                   failures: Mapping[int, str]) -> tuple[UnsafeStatement, ...]:
    """The statements refused for what PostgreSQL resolved of `refs.targets`, each with its first
    reason (empty when all pass). `facts[k].ref` and the keys of `failures` (what PostgreSQL
    said when a target did not resolve) count the targets from 0.

    Every function that would run, directly or behind an operator, a type (its input and output
    functions, the checks of a domain at any depth, a range's functions) or a view at any depth,
    is judged as in `judge_references`, by what it is; one called directly must also be
    IMMUTABLE for an index target and not VOLATILE (outside `VOLATILE_ALLOWED`) for a read one.
    A target that does not resolve is refused: what PostgreSQL cannot resolve cannot be judged.
    """
    by_target: dict[int, list[CatalogFact]] = {}
    for fact in facts:
        by_target.setdefault(fact.ref, []).append(fact)
    problems: dict[str, str] = {}
    for i, target in enumerate(refs.targets):
        if target.statement in problems:
            continue
        if i in failures:
            problem = (f"does not run on the database: {failures[i]}"
                       if target.kind in ("read", "index", "matview") else None)
        else:
            problem = _resolved_problem(target, by_target.get(i, []))
        if problem:
            problems[target.statement] = problem
    return tuple(UnsafeStatement(statement, reason) for statement, reason in problems.items())


def _targets(stmt: ast.Node, command: str) -> list[Target]:
    """What PostgreSQL must resolve of one accepted statement (`Target`)."""
    if isinstance(stmt, ast.IndexStmt | ast.CreateStatsStmt):
        if isinstance(stmt, ast.IndexStmt):
            table, elements, where = stmt.relation, stmt.indexParams or (), stmt.whereClause
        else:
            table, elements, where = (stmt.relations or (None,))[0], stmt.exprs or (), None
        exprs = [e.expr for e in elements if getattr(e, "expr", None) is not None]
        if not isinstance(table, ast.RangeVar) or not (exprs or where is not None):
            return []
        columns = ", ".join(f"({_sql(e)}) AS e{i}" for i, e in enumerate(exprs, 1)) or "1 AS e0"
        predicate = f" WHERE {_sql(where)}" if where is not None else ""
        return [Target("index", command, f"SELECT {columns} FROM {_rv_sql(table)}{predicate}")]
    if isinstance(stmt, ast.CreateTableAsStmt) and stmt.into is not None:
        # created empty (WITH NO DATA runs nothing), so that an index or REFRESH after it resolves
        stmt.into.skipData = True
        return [Target("matview", command, _sql(stmt), _rv_sql(stmt.into.rel))]
    if isinstance(stmt, ast.RefreshMatViewStmt):
        return [Target("read", command, f"SELECT 1 FROM {_rv_sql(stmt.relation)}")]
    if isinstance(stmt, ast.InsertStmt) and stmt.selectStmt is not None:
        return [Target("read", command, _sql(stmt.selectStmt))]
    if isinstance(stmt, ast.CreateStmt):
        return [Target("create", command, command, _rv_sql(stmt.relation))]
    if isinstance(stmt, ast.RenameStmt | ast.DropStmt | ast.CreateExtensionStmt):
        return [Target("execute", command, command)]
    return []  # ANALYZE, SET STATISTICS, ATTACH PARTITION: names only (`judge_references`)


def _operator_names(expr: ast.A_Expr) -> list[tuple[str | None, str]]:
    parts = [p.sval for p in expr.name or () if isinstance(p, ast.String) and p.sval]
    if not parts:
        return []
    kind = expr.kind
    if kind in (enums.A_Expr_Kind.AEXPR_BETWEEN, enums.A_Expr_Kind.AEXPR_NOT_BETWEEN,
                enums.A_Expr_Kind.AEXPR_BETWEEN_SYM, enums.A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM):
        return [(None, ">="), (None, "<=")]
    return [(parts[0] if len(parts) == 2 else None, parts[-1])]


def _immutable_parts(node: Any) -> set[int]:
    """The nodes under `node` (by identity) whose functions must be IMMUTABLE: index and
    statistics elements, partition keys, generated columns and index predicates."""
    roots: list[ast.Node] = []
    for item in walk(node):
        if isinstance(item, ast.IndexElem | ast.StatsElem | ast.PartitionElem) or (
                isinstance(item, ast.Constraint) and item.contype == enums.ConstrType.CONSTR_GENERATED):
            roots.append(item)
        elif isinstance(item, ast.IndexStmt) and item.whereClause is not None:
            roots.append(item.whereClause)
    return {id(sub) for sub in walk(roots)}


def _collect(node: Any, statement: str, context: Context, out: list[Ref]) -> None:
    """Every function, operator, cast and relation under `node`, as `Ref`s in `out` (in the
    order of the text), in `context` or, inside `_immutable_parts`, "index"."""
    ctes = {cte.ctename for cte in walk(node) if isinstance(cte, ast.CommonTableExpr) and cte.ctename}
    immutable = _immutable_parts(node)
    for item in walk(node):
        ctx: Context = "index" if id(item) in immutable else context
        if isinstance(item, ast.FuncCall):
            parts = _func_name(item)
            if parts:
                # an ordered-set aggregate takes its direct arguments, then those of WITHIN GROUP
                nargs = len(item.args or ()) + (len(item.agg_order or ()) if item.agg_within_group else 0)
                out.append(Ref("function", statement, parts[-1], parts[0] if len(parts) > 1 else None,
                               ctx, nargs))
        elif isinstance(item, ast.A_Expr):
            operands = 1 if item.lexpr is None else 2
            out.extend(Ref("operator", statement, name, schema, ctx, operands)
                       for schema, name in _operator_names(item))
        elif isinstance(item, ast.SubLink):
            if item.subLinkType in (enums.SubLinkType.ANY_SUBLINK, enums.SubLinkType.ALL_SUBLINK,
                                    enums.SubLinkType.ROWCOMPARE_SUBLINK):
                op = [p.sval for p in item.operName or () if isinstance(p, ast.String) and p.sval]
                out.append(Ref("operator", statement, op[-1] if op else "=",
                               op[0] if len(op) == 2 else None, ctx, 2))
        elif isinstance(item, ast.CaseExpr) and item.arg is not None:
            out.append(Ref("operator", statement, "=", None, ctx, 2))
        elif isinstance(item, ast.SortBy) and item.useOp:
            op = [p.sval for p in item.useOp if isinstance(p, ast.String) and p.sval]
            out.append(Ref("operator", statement, op[-1], op[0] if len(op) == 2 else None, ctx, 2))
        elif isinstance(item, ast.TypeCast | ast.ColumnDef) and item.typeName is not None:
            # a cast runs the type's functions; so does every row written into a column of a
            # type the proposal chose (a domain's checks)
            names = [p.sval for p in item.typeName.names or () if isinstance(p, ast.String) and p.sval]
            if names and len(names) <= 2:
                type_sql = _qualified(names[0] if len(names) == 2 else None, names[-1])
                out.append(Ref("type", statement, type_sql, None, ctx))
        elif (isinstance(item, ast.RangeVar) and item.relname
              and not (item.schemaname is None and item.relname in ctes)):
                out.append(Ref("relation", statement, _qualified(item.schemaname, item.relname)))


def query_references(sql: str) -> References:
    """The names in a query (already passed by `check_query`) that the catalog must judge."""
    try:
        text, stmt = _parse_one(sql, what="query")
    except _Refused:
        return References()
    refs: list[Ref] = []
    _collect(stmt, text, "read", refs)
    # only what `check_query` accepts is resolved (a rewrite is judged before its structure)
    readable = isinstance(stmt, ast.SelectStmt) and _read_only_problem(stmt) is None
    return References(tuple(refs), targets=(Target("read", text, text),) if readable else ())
