"""The SQL safety gate: what a user may ask to optimize, and what an agent may change.

Everything is parsed with pglast (the real PostgreSQL parser); anything that does not
parse is refused. Two checks:

* `check_query` — the query to optimize must be exactly one read-only SELECT (WITH …
  SELECT, VALUES, TABLE, set operations): no SELECT INTO, no FOR UPDATE/SHARE, no
  data-modifying WITH, no call of a function with side effects (`DENIED_FUNCTIONS`), and
  the names in it judged by the catalog (below).
* `validate_proposal` — an agent's DDL, one statement per command, against an
  allow-list (DESIGN.md "Safety"):

    CREATE [UNIQUE] INDEX [CONCURRENTLY] [IF NOT EXISTS] … USING btree|hash|gist|spgist|gin|brin
        (expression, partial WHERE, INCLUDE, WITH (storage options); on tables and
        materialized views)
    CREATE MATERIALIZED VIEW … AS <read-only query>
    REFRESH MATERIALIZED VIEW [CONCURRENTLY] …   (not WITH NO DATA)
    CREATE STATISTICS [IF NOT EXISTS] name [(ndistinct | dependencies | mcv, …)]
        ON column | (simple expression), … FROM <one table>   (rollback: DROP STATISTICS IF EXISTS)
    ANALYZE [table [(columns)] …]
    ALTER TABLE … ALTER COLUMN name SET STATISTICS n, …   (1 ≤ n ≤ 10000: a finer histogram
        and more most-common values for the planner; rollback: SET STATISTICS -1, then
        ANALYZE of those columns)
    CREATE EXTENSION IF NOT EXISTS pg_trgm | btree_gin   (trusted extensions shipped with
        PostgreSQL, for their index operator classes; no SCHEMA, VERSION or CASCADE; the
        rollback leaves the extension in place)
    only in a "partitioning" proposal, the migration recipe:
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

  A "settings" proposal carries no commands at all: its per-query settings are checked by
  `check_settings` (`validate_candidate` checks both).

  Everything else is refused, and so is any allowed statement that names a relation in a
  system schema (pg_catalog, information_schema, pg_toast, pg_temp…, any pg_ prefix, in any
  case: `CREATE TABLE pg_temp.x` would hide the real table) or calls a function known by name
  to have side effects (`DENIED_FUNCTIONS`, and the patterns of the pg_ prefix) or to read
  what the statement does not name (`READS_UNNAMED`: table_to_xml, schema_to_xml,
  database_to_xml, query_to_xml and cursor_to_xml with their siblings read relations named
  as text; pg_stat_get_activity, pg_stat_get_backend_*, pg_blocking_pids, pg_lock_status, …
  read other sessions).

The gate has three layers, each run only when the one before passes: the structure (above,
pure), the names in the catalog (`judge_references`), and what PostgreSQL resolves the
statement to (`judge_resolved`). The text alone misses what the analyzer decides: `o.total`
may be the function `total(o)` (attribute notation), the `=` of `JOIN … USING` and `NATURAL
JOIN` is chosen by name, a domain may sit on a domain, in an array or in a composite's field.

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

Pure module: pglast only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pglast import ast, enums, parse_sql, split
from pglast.parser import ParseError, scan
from pglast.stream import RawStream, maybe_double_quote_name

from afs.errors import InputError, UnsafeSqlError
from afs.models import PROPOSAL_TYPES, OptimizationProposal, RiskLevel, UnsafeStatement, ValidationResult

__all__ = [
    "ALLOWED_EXTENSIONS",
    "DENIED_FUNCTIONS",
    "INDEX_ACCESS_METHODS",
    "READS_UNNAMED",
    "TRUSTED_EXTENSIONS",
    "VOLATILE_ALLOWED",
    "CatalogFact",
    "Change",
    "Creates",
    "NewIndex",
    "NewStatistics",
    "NewTable",
    "NewView",
    "Ref",
    "References",
    "Target",
    "Validated",
    "bind_parameters",
    "check_query",
    "creates",
    "denied_function",
    "judge_references",
    "judge_resolved",
    "parameter_count",
    "proposal_references",
    "query_references",
    "reads_unnamed",
    "split_statements",
    "validate",
    "validate_commands",
    "validate_proposal",
]

# -- functions with side effects -------------------------------------------------------
DENIED_FUNCTIONS: frozenset[str] = frozenset({
    # sleeping: not a query worth optimizing, and it holds a fork's benchmark slot
    "pg_sleep", "pg_sleep_for", "pg_sleep_until",
    # other backends, server configuration and logs
    "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile",
    "pg_rotate_logfile_old", "set_config", "pg_log_backend_memory_contexts", "pg_log_standby_snapshot",
    # server files
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_logdir_ls",
    # large objects
    "loread", "lowrite",
    # sequences
    "nextval", "setval",
    # notifications
    "pg_notify",
    # WAL, backups, recovery, replication
    "pg_switch_wal", "pg_switch_xlog", "pg_promote", "pg_logical_emit_message",
    "pg_create_restore_point", "pg_start_backup", "pg_stop_backup", "pg_backup_start",
    "pg_backup_stop", "pg_wal_replay_pause", "pg_wal_replay_resume", "pg_xlog_replay_pause",
    "pg_xlog_replay_resume",
    # functions that run SQL given as text
    "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema", "cursor_to_xml",
    "cursor_to_xmlschema", "ts_stat", "ts_rewrite", "connectby", "xpath_table",
    # statistics and caches the benchmark relies on
    "pg_stat_statements_reset", "pg_prewarm", "autoprewarm_start_worker", "autoprewarm_dump_now",
    "pg_truncate_visibility_map",
    # index maintenance functions that write
    "gin_clean_pending_list", "brin_summarize_new_values", "brin_summarize_range",
    "brin_desummarize_range",
    # catalog writes
    "pg_import_system_collations", "pg_extension_config_dump",
    # the best-known names the patterns below cover outside the pg_ prefix (large objects,
    # dblink, tablefunc, pgsql-http), refused before any catalog is asked
    "lo_import", "lo_export", "lo_unlink", "lo_put", "lo_create", "lo_creat", "lo_from_bytea", "lo_open",
    "lo_truncate", "lo_truncate64", "lo_manage", "dblink", "dblink_exec", "dblink_connect",
    "dblink_connect_u", "dblink_send_query", "dblink_open", "dblink_fetch", "crosstab", "crosstab2",
    "crosstab3", "crosstab4", "http", "http_get", "http_post", "http_put", "http_delete", "http_patch",
    "http_head",
})
# Built-ins that read what the query does not name: relations named as text (the *_to_xml family,
# which `check_query` and the relation checks never see) and other sessions' activity, locks and
# memory. Refused wherever PostgreSQL resolves them (a call, a view, attribute notation), like
# DENIED_FUNCTIONS; the patterns below cover their siblings.
READS_UNNAMED: frozenset[str] = frozenset({
    "table_to_xml", "table_to_xmlschema", "table_to_xml_and_xmlschema", "schema_to_xml",
    "schema_to_xmlschema", "schema_to_xml_and_xmlschema", "database_to_xml", "database_to_xmlschema",
    "database_to_xml_and_xmlschema", "pg_stat_get_activity", "pg_stat_get_progress_info",
    "pg_blocking_pids", "pg_safe_snapshot_blocking_pids", "pg_lock_status", "pg_prepared_xact",
    "pg_get_backend_memory_contexts", "pg_stat_get_wal_senders", "pg_stat_get_wal_receiver",
    "pg_stat_get_subscription",
})
_READS_UNNAMED_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"^(table|schema|database|query|cursor)_to_xml",  # reads a relation, schema or query named as text
    r"^pg_stat_get_backend_",  # another backend's query, user, client address, …
))
_DENIED_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"^dblink",  # dblink, dblink_exec, dblink_connect, …
    r"^pg_(try_)?advisory_",  # advisory locks
    r"^lo_",  # lo_import, lo_export, lo_unlink, lo_put, …
    r"^pg_read_", r"^pg_ls_", r"^pg_file_",  # server files (core and adminpack)
    r"replication_slot", r"^pg_logical_slot_", r"^pg_replication_origin_",
    r"^crosstab",  # tablefunc: runs SQL given as text
    r"^pg_stat_reset", r"^pg_\w*_reset$",  # pg_stat_reset_shared, pg_stat_statements_reset, …
    r"^pg_(restore|clear)_\w*_stats$",  # planner statistics (PostgreSQL 18)
    r"^pg_buffercache_evict",  # empties shared buffers (PostgreSQL 17, 18)
    r"^binary_upgrade_",
    r"^pg_background_",  # runs SQL in a background worker
    r"^http(_|$)",  # pgsql-http, pg_net: network requests
))


def denied_function(funcname: Sequence[str]) -> bool:
    """True when a built-in or extension function, named by its (possibly schema-qualified)
    parts, has side effects. Only meaningful for a function the catalog says is built in (or
    comes from an allowed extension): a user's own function is refused whatever its name.
    """
    if not funcname:
        return False
    name = funcname[-1].lower()
    return (name in DENIED_FUNCTIONS or any(p.search(name) for p in _DENIED_PATTERNS)
            or reads_unnamed(funcname))


def reads_unnamed(funcname: Sequence[str]) -> bool:
    """True when a built-in, named by its (possibly qualified) parts, reads relations named as
    text or other sessions' activity (`READS_UNNAMED`)."""
    name = funcname[-1].lower() if funcname else ""
    return name in READS_UNNAMED or any(p.search(name) for p in _READS_UNNAMED_PATTERNS)


def _denied_by_name(funcname: Sequence[str]) -> bool:
    """`denied_function` before the catalog is asked: the exact names, and the patterns of the
    system's own prefixes (pg_, binary_upgrade_). A user's own lo_total() or http_status() is
    not refused for its name (the catalog refuses it for being defined in the database)."""
    if not funcname:
        return False
    name = funcname[-1].lower()
    system_prefix = name.startswith(("pg_", "binary_upgrade_"))
    return (name in DENIED_FUNCTIONS or name in READS_UNNAMED
            or (system_prefix and denied_function(funcname)))


def _denial(funcname: Sequence[str]) -> str:
    """Why a denied function is refused, as the end of a sentence."""
    if reads_unnamed(funcname):
        return "reads relations named as text or other sessions' activity"
    return "has side effects"


def _system_schema(schema: str | None) -> bool:
    """A schema of the system, however it is spelled: pg_catalog, pg_toast, pg_temp_3,
    information_schema (PostgreSQL reserves the pg_ prefix; a quoted "PG_Catalog" is not the
    catalog, but no proposal needs a schema of that name)."""
    return schema is not None and (schema.lower().startswith("pg_") or schema.lower() == "information_schema")


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
_NUL = "contains a NUL character: PostgreSQL would not read what follows it, nor would this check"

_RISK_ORDER: dict[RiskLevel, int] = {"low": 0, "medium": 1, "high": 2}


class _Refused(Exception):
    """One statement is refused; `reason` says why (internal to this module)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- tree walking --------------------------------------------------------------------------
def _walk(node: Any) -> Iterator[ast.Node]:
    """Every node below (and including) `node`."""
    stack: list[Any] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Node):
            yield item
            stack.extend(getattr(item, attr) for attr in item)
        elif isinstance(item, tuple | list):
            stack.extend(item)


def _func_name(call: ast.FuncCall) -> tuple[str, ...]:
    return tuple(part.sval for part in call.funcname or () if isinstance(part, ast.String) and part.sval)


def _side_effect_problem(node: Any) -> str | None:
    """A call of a function known by name to have side effects, or a name no proposal may use
    (a system relation, another database, a function in pg_temp). The rest is judged by the
    catalog (`judge_references`)."""
    for sub in _walk(node):
        if isinstance(sub, ast.FuncCall):
            parts = _func_name(sub)
            if len(parts) > 2:
                return "cross-database names are not allowed"
            if len(parts) == 2 and _system_schema(parts[0]) and parts[0].lower() != "pg_catalog":
                return f"calls {'.'.join(parts)}(), which is not a built-in function"
            if _denied_by_name(parts):
                return f"calls {'.'.join(parts)}(), which {_denial(parts)}"
        elif isinstance(sub, ast.RangeVar):
            if sub.catalogname:
                return "cross-database names are not allowed"
            if _system_schema(sub.schemaname):
                return (f"{sub.schemaname}.{sub.relname} is in the system schema {sub.schemaname}: "
                        "system relations are neither read nor changed")
    return None


def _read_only_problem(stmt: Any) -> str | None:
    """Why `stmt` is not one read-only SELECT, or None when it is."""
    if not isinstance(stmt, ast.SelectStmt):
        return f"{_describe(stmt)} is not a read-only SELECT"
    for sub in _walk(stmt):
        if isinstance(sub, ast.IntoClause):
            return "SELECT INTO creates a table"
        if isinstance(sub, ast.LockingClause):
            return "FOR UPDATE/SHARE locks rows"
        if isinstance(sub, ast.InsertStmt | ast.UpdateStmt | ast.DeleteStmt | ast.MergeStmt):
            return "data-modifying WITH (INSERT/UPDATE/DELETE/MERGE)"
    return _side_effect_problem(stmt)


def _describe(stmt: Any) -> str:
    """A short SQL-ish name for a statement node: 'DELETE', 'CREATE INDEX', …"""
    special = {
        "SelectStmt": "SELECT", "InsertStmt": "INSERT", "UpdateStmt": "UPDATE", "DeleteStmt": "DELETE",
        "VariableSetStmt": "SET", "VariableShowStmt": "SHOW", "DoStmt": "DO", "CopyStmt": "COPY",
        "IndexStmt": "CREATE INDEX", "CreateStmt": "CREATE TABLE", "RuleStmt": "CREATE RULE",
        "TransactionStmt": "transaction control", "CreatedbStmt": "CREATE DATABASE",
        "DropdbStmt": "DROP DATABASE", "CreateTrigStmt": "CREATE TRIGGER", "ViewStmt": "CREATE VIEW",
        "RenameStmt": "ALTER … RENAME", "CreateSeqStmt": "CREATE SEQUENCE", "AlterSeqStmt": "ALTER SEQUENCE",
        "SecLabelStmt": "SECURITY LABEL", "CommentStmt": "COMMENT ON",
    }
    name = type(stmt).__name__
    if isinstance(stmt, ast.VacuumStmt):
        return "ANALYZE" if not stmt.is_vacuumcmd else "VACUUM"
    if isinstance(stmt, ast.DropStmt):
        return f"DROP {_object_word(stmt.removeType)}"
    if isinstance(stmt, ast.CreateTableAsStmt):
        if stmt.objtype == enums.ObjectType.OBJECT_MATVIEW:
            return "CREATE MATERIALIZED VIEW"
        return "SELECT INTO" if stmt.is_select_into else "CREATE TABLE AS"
    if name in special:
        return special[name]
    words = re.findall(r"[A-Z][a-z]*", name.removesuffix("Stmt"))
    return " ".join(words).upper() if words else name


# -- statement text ------------------------------------------------------------------------
def _trim(text: str) -> str:
    """Drop trailing comments (and a stray semicolon) so the text can be embedded safely."""
    tokens = [t for t in scan(text) if t.name not in ("SQL_COMMENT", "C_COMMENT")]
    while tokens and tokens[-1].name == "ASCII_59":  # ';'
        tokens.pop()
    if not tokens:
        return ""
    return text[: tokens[-1].end + 1].strip()


def split_statements(sql: str) -> list[str]:
    """Split a script into its statements (text, stripped, no semicolons, no trailing comments).

    Uses the parser; when the script does not parse, falls back to the scanner so that each
    piece can still be judged (and the broken one refused) on its own. Raises
    `UnsafeSqlError` when not even the scanner can split it (an unterminated string, …).
    """
    if "\x00" in sql:
        raise UnsafeSqlError(sql, _NUL)
    try:
        pieces = split(sql)
    except ParseError:
        try:
            pieces = split(sql, with_parser=False)
        except ParseError as exc:
            raise UnsafeSqlError(sql, f"does not parse: {exc.args[0]}") from exc
    out: list[str] = []
    for piece in pieces:
        try:
            text = _trim(piece)
        except ParseError:
            text = piece.strip()
        if text:
            out.append(text)
    return out


def _with_leading_comments(sql: str, statement: str) -> str:
    """`statement` with the comments that precede it in `sql` (planner hints like /*+ … */)."""
    slices = split(sql, only_slices=True)
    if len(slices) != 1:  # pragma: no cover - only called for one statement
        return statement
    prefix = sql[: slices[0].start]
    if any(t.name not in ("SQL_COMMENT", "C_COMMENT") for t in scan(prefix)):
        return statement
    return (prefix + sql[slices[0]]).strip()


def _parse_one(sql: str, *, what: str) -> tuple[str, ast.Node]:
    """The single statement in `sql` (text and node), or `_Refused`."""
    if "\x00" in sql:
        raise _Refused(_NUL)
    try:
        pieces = split(sql)
    except ParseError as exc:
        raise _Refused(f"does not parse: {exc.args[0]}") from exc
    if not pieces:
        raise _Refused(f"empty {what}")
    if len(pieces) > 1:
        raise _Refused("several statements" if what == "query" else "several statements in one command")
    text = _trim(_with_leading_comments(sql, pieces[0]))
    try:
        raw = parse_sql(text)
    except ParseError as exc:  # pragma: no cover - split already parsed it
        raise _Refused(f"does not parse: {exc.args[0]}") from exc
    if len(raw) != 1 or raw[0].stmt is None:  # pragma: no cover - split agreed
        raise _Refused("several statements")
    return text, raw[0].stmt


# -- the query ----------------------------------------------------------------------------
def check_query(sql: str) -> str:
    """The query to optimize: exactly one read-only SELECT, returned as text.

    The text is stripped, without a trailing semicolon or trailing comments, so a caller
    can wrap it (`EXPLAIN …`, `SELECT count(*) FROM (…) q`). Raises `UnsafeSqlError`.
    """
    try:
        text, stmt = _parse_one(sql, what="query")
    except _Refused as exc:
        raise UnsafeSqlError(sql, exc.reason) from None
    if isinstance(stmt, ast.SelectStmt):
        problem = _read_only_problem(stmt)
    else:
        problem = f"only a SELECT can be optimized, not {_describe(stmt)}"
    if problem:
        raise UnsafeSqlError(text, problem)
    return text


# -- proposals -----------------------------------------------------------------------------
def _qualified(schema: str | None, name: str) -> str:
    parts = [schema, name] if schema else [name]
    return ".".join(maybe_double_quote_name(p) for p in parts)


def _rv_sql(rv: ast.RangeVar | None) -> str:
    if rv is None or not rv.relname:
        raise _Refused("statement names no relation")
    return _qualified(rv.schemaname, rv.relname)


def _rv_key(rv: ast.RangeVar | None) -> str:
    """A name to compare relations by: `public.x` and `x` are the same."""
    if rv is None or not rv.relname:
        raise _Refused("statement names no relation")
    schema = rv.schemaname if rv.schemaname not in (None, "public") else None
    return f"{schema}.{rv.relname}" if schema else rv.relname


def _check_target(rv: ast.RangeVar | None) -> None:
    if rv is None or not rv.relname:
        raise _Refused("statement names no relation")
    if rv.catalogname:
        raise _Refused("cross-database names are not allowed")
    if _system_schema(rv.schemaname):
        temporary = (" (a temporary table would hide the real one)"
                     if (rv.schemaname or "").lower().startswith("pg_temp") else "")
        raise _Refused(f"system schema {rv.schemaname} is not changed by proposals{temporary}")


@dataclass
class _Verdict:
    risk: RiskLevel
    reversibility: float
    rollback: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    point_of_no_return: bool = False  # undoing earlier commands would destroy the only copy of data


# -- what only the catalog can judge --------------------------------------------------------
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


def _sql(node: ast.Node) -> str:
    """A node as SQL text (a new stream each time: one accumulates what it printed)."""
    return str(RawStream()(node))


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


def parameter_count(sql: str) -> int:
    """The highest $n in `sql` (0 when it has no parameters)."""
    numbers = [int(sql[t.start + 1:t.end + 1]) for t in scan(sql) if t.name == "PARAM"]
    return max(numbers, default=0)


def bind_parameters(sql: str, types: Sequence[str]) -> str:
    """`sql` with each $n replaced by `(NULL::<types[n-1]>)` (types as SQL text, from PostgreSQL):
    a query of pg_stat_statements resolves in a view as it does when planned with parameters."""
    out, last = [], 0
    for token in scan(sql):
        if token.name == "PARAM":
            n = int(sql[token.start + 1:token.end + 1])
            out += [sql[last:token.start], f"(NULL::{types[n - 1]})"]
            last = token.end + 1
    return "".join(out) + sql[last:]


def _operator_names(expr: ast.A_Expr) -> list[tuple[str | None, str]]:
    parts = [p.sval for p in expr.name or () if isinstance(p, ast.String) and p.sval]
    if not parts:
        return []
    kind = expr.kind
    if kind in (enums.A_Expr_Kind.AEXPR_BETWEEN, enums.A_Expr_Kind.AEXPR_NOT_BETWEEN,
                enums.A_Expr_Kind.AEXPR_BETWEEN_SYM, enums.A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM):
        return [(None, ">="), (None, "<=")]
    return [(parts[0] if len(parts) == 2 else None, parts[-1])]


def _collect(node: Any, statement: str, context: Context, out: list[Ref]) -> None:
    """Every function, operator, cast and relation under `node`, as `Ref`s in `out`."""
    ctes = {cte.ctename for cte in _walk(node) if isinstance(cte, ast.CommonTableExpr) and cte.ctename}
    stack: list[tuple[Any, Context]] = [(node, context)]
    while stack:
        item, ctx = stack.pop()
        if isinstance(item, tuple | list):
            stack.extend((sub, ctx) for sub in item)
            continue
        if not isinstance(item, ast.Node):
            continue
        if isinstance(item, ast.IndexElem | ast.StatsElem | ast.PartitionElem) or (
                isinstance(item, ast.Constraint) and item.contype == enums.ConstrType.CONSTR_GENERATED):
            ctx = "index"
        if isinstance(item, ast.IndexStmt) and item.whereClause is not None:
            stack.append((item.whereClause, "index"))
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
        stack.extend((getattr(item, attr), ctx) for attr in item
                     if not (isinstance(item, ast.IndexStmt) and attr == "whereClause"))


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
        for sub in _walk(element.expr):
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


def _only_set_statistics(stmt: ast.AlterTableStmt) -> bool:
    return bool(stmt.cmds) and all(isinstance(c, ast.AlterTableCmd)
                                   and c.subtype == enums.AlterTableType.AT_SetStatistics
                                   for c in stmt.cmds or ())


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


def _key_sql(key: str) -> str:
    """A relation key of `_rv_key` (schema.name or name) as SQL text."""
    schema, _, name = key.rpartition(".")
    return _qualified(schema or None, name)


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


def _object_word(objtype: Any) -> str:
    name = str(getattr(objtype, "name", objtype)).removeprefix("OBJECT_")
    words = {"MATVIEW": "MATERIALIZED VIEW", "FDW": "FOREIGN DATA WRAPPER", "STATISTIC_EXT": "STATISTICS"}
    return words.get(name, name.replace("_", " "))


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


# -- what a proposal creates ----------------------------------------------------------------
def _plain(rv: ast.RangeVar | None) -> str | None:
    """A relation as written, unquoted: schema.name or name (None when it names none)."""
    if rv is None or not rv.relname:
        return None
    return f"{rv.schemaname}.{rv.relname}" if rv.schemaname else rv.relname


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


@dataclass(frozen=True)
class NewStatistics:
    """CREATE STATISTICS `name` (as written, unquoted) on `table` over `columns` (plain ones)."""

    statement: str
    name: str
    table: str | None
    columns: tuple[str, ...]


@dataclass(frozen=True)
class NewTable:
    """CREATE TABLE of a partitioning recipe (`name` as written, unquoted)."""

    statement: str
    name: str


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
    ctes = {n.ctename for n in _walk(query) if isinstance(n, ast.CommonTableExpr) and n.ctename}
    found = dict.fromkeys(_plain(n) for n in _walk_in_order(query) if isinstance(n, ast.RangeVar))
    return tuple(n for n in found if n is not None and n != own and n not in ctes)


def _walk_in_order(node: Any) -> Iterator[ast.Node]:
    """Every node below `node`, in the order of the text (depth first, iterative)."""
    stack: list[Any] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Node):
            yield item
            stack.extend(reversed([getattr(item, attr) for attr in item]))
        elif isinstance(item, tuple | list):
            stack.extend(reversed(item))


def _fact(stmt: ast.Node, command: str) -> Fact:
    """What one accepted statement creates or changes (read before `_targets` alters the tree)."""
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


def proposal_references(proposal: OptimizationProposal) -> References:
    """The names in a proposal's commands and rewrite that the catalog must judge."""
    commands = validate(proposal).references if proposal.sql_commands else References()
    rewrite = query_references(proposal.rewritten_query) if proposal.rewritten_query else References()
    return References((*commands.refs, *rewrite.refs), commands.creates_extension, commands.preserved,
                      (*commands.targets, *rewrite.targets))


# -- per-query settings -------------------------------------------------------------------------
# Planner settings a proposal may recommend for one query (measured with SET LOCAL in the fork,
# recommended per role or per query, never globally), with the largest value accepted.
SETTING_LIMITS_KB: Mapping[str, int] = {"work_mem": 2 * 1024 * 1024, "hash_mem_multiplier": 0}
_MEMORY = re.compile(r"^\s*(\d+)\s*(kB|MB|GB)?\s*$")
_MULTIPLIER = re.compile(r"^\s*\d+(\.\d+)?\s*$")
_UNIT_KB = {None: 1, "kB": 1, "MB": 1024, "GB": 1024 * 1024}


def check_settings(settings: Sequence[tuple[str, str]]) -> list[UnsafeStatement]:
    """The refused settings of a proposal, each with its reason (empty when all are allowed)."""
    refused: list[UnsafeStatement] = []
    for name, value in settings:
        shown = f"SET LOCAL {name} = {value!r}"
        if name not in SETTING_LIMITS_KB:
            refused.append(UnsafeStatement(shown, f"only {', '.join(sorted(SETTING_LIMITS_KB))} may be set"))
        elif name == "hash_mem_multiplier":
            if not _MULTIPLIER.match(value) or not 1.0 <= float(value) <= 16.0:
                refused.append(UnsafeStatement(shown, "hash_mem_multiplier must be a number from 1 to 16"))
        else:
            match = _MEMORY.match(value)
            if match is None:
                refused.append(UnsafeStatement(shown, "a memory size such as 64MB is expected"))
            elif not 64 <= int(match[1]) * _UNIT_KB[match[2]] <= SETTING_LIMITS_KB[name]:
                refused.append(UnsafeStatement(shown, f"{name} must be between 64kB and 2GB"))
    return refused


def settings_sql(settings: Sequence[tuple[str, str]], scope: str = "SET LOCAL") -> tuple[str, ...]:
    """The statements that apply `settings` (already checked), e.g. for the report."""
    return tuple(f"{scope} {name} = '{value.strip()}'" for name, value in settings)


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
