"""The SQL safety gate: what a user may ask to optimize, and what an agent may change.

Everything is parsed with pglast (the real PostgreSQL parser); anything that does not
parse is refused. Two checks:

* `check_query` — the query to optimize must be exactly one read-only SELECT (WITH …
  SELECT, VALUES, TABLE, set operations): no SELECT INTO, no FOR UPDATE/SHARE, no
  data-modifying WITH, no call of a function with side effects (`DENIED_FUNCTIONS`), and
  the names in it judged by the catalog (below).
* `validate_proposal` — an agent's DDL, one statement per command, against an
  allow-list (the README's "Security" section says what runs where, as whom):

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
    only in a "partitioning" proposal, the migration recipe (`afs.safety.partitioning` says
        each step's conditions): CREATE TABLE … PARTITION BY / PARTITION OF / (LIKE …),
        INSERT INTO <a table it created> SELECT … FROM <table>, ALTER TABLE … RENAME TO,
        ATTACH PARTITION to a table it created, DROP TABLE of what it created or copied whole;
        at the end every replaced table's rows are under its name

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

The rooms of the gate, each pure (pglast only; the catalog's I/O half is `afs.catalog`):

    tree          the parse tree: split, parse one statement, names as SQL text
    functions     functions judged by name: side effects, reads of what is not named
    query         the query to optimize: one read-only SELECT (`check_query`)
    references    what only the catalog can judge (`References`, `Target`) and its verdicts
    partitioning  a partitioning proposal's migration recipe, step by step
    creates       what a proposal creates, typed (`Creates`: indexes, views, statistics, tables)
    settings      the per-query settings a proposal may recommend
    statements    the allow-list, one statement at a time, and `validate`: the one validation
                  of a proposal, which every reader of what it creates shares

What a proposal creates is read once, from the parse trees the validator checked
(`validate(proposal).creates`, or `creates(proposal)`, kept per distinct commands): the
benchmark, the query family, consensus (the write cost, agreement), the apply plan and the batch
report read it, never the SQL text; so does the fork's growth cap (`writes_from_query`).
"""

from __future__ import annotations

from afs.safety.creates import (
    Change,
    ChangeKind,
    Creates,
    Fact,
    NewIndex,
    NewStatistics,
    NewTable,
    NewView,
    writes_from_query,
)
from afs.safety.functions import (
    DENIED_FUNCTIONS,
    READS_UNNAMED,
    denied_function,
    reads_unnamed,
)
from afs.safety.query import (
    check_query,
)
from afs.safety.references import (
    TRUSTED_EXTENSIONS,
    VOLATILE_ALLOWED,
    CatalogFact,
    Context,
    Ref,
    References,
    RefKind,
    Target,
    TargetKind,
    judge_references,
    judge_resolved,
    query_references,
)
from afs.safety.settings import (
    SETTING_LIMITS_KB,
    check_settings,
    settings_sql,
)
from afs.safety.statements import (
    ALLOWED_EXTENSIONS,
    INDEX_ACCESS_METHODS,
    MAX_STATISTICS_TARGET,
    STATISTICS_KINDS,
    Validated,
    creates,
    proposal_references,
    validate,
    validate_candidate,
    validate_commands,
    validate_proposal,
)
from afs.safety.tree import (
    bind_parameters,
    parameter_count,
    split_statements,
)

__all__ = [
    "ALLOWED_EXTENSIONS",
    "DENIED_FUNCTIONS",
    "INDEX_ACCESS_METHODS",
    "MAX_STATISTICS_TARGET",
    "READS_UNNAMED",
    "SETTING_LIMITS_KB",
    "STATISTICS_KINDS",
    "TRUSTED_EXTENSIONS",
    "VOLATILE_ALLOWED",
    "CatalogFact",
    "Change",
    "ChangeKind",
    "Context",
    "Creates",
    "Fact",
    "NewIndex",
    "NewStatistics",
    "NewTable",
    "NewView",
    "Ref",
    "RefKind",
    "References",
    "Target",
    "TargetKind",
    "Validated",
    "bind_parameters",
    "check_query",
    "check_settings",
    "creates",
    "denied_function",
    "judge_references",
    "judge_resolved",
    "parameter_count",
    "proposal_references",
    "query_references",
    "reads_unnamed",
    "settings_sql",
    "split_statements",
    "validate",
    "validate_candidate",
    "validate_commands",
    "validate_proposal",
    "writes_from_query",
]
