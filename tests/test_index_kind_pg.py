"""Issue 25 item 7: the index kind from the catalog. A source of our own, a real fork per case:
the analysis reads the operator classes of the query's operators from the fork's catalog, the
index design strategist proposes the kind they call for, and PostgreSQL's planner, with the
proposal applied in the fork, scans the index it created."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio

from afs.analysis import gather_context
from afs.brains.strategists.index_design import decide_index_design
from afs.brains.strategists.variants import design_variants
from afs.db import Connection, open_connection
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.models import AnalysisContext, OptimizationProposal
from afs.query.features import extract_features
from afs.safety import validate_candidate
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")

SOURCE = "afs_index_kind"
ROWS = 60_000
SCHEMA = f"""
CREATE TABLE k (
    id bigint PRIMARY KEY, a int NOT NULL, b int NOT NULL,
    title text NOT NULL, name text COLLATE "C.utf8" NOT NULL, code text COLLATE "C" NOT NULL,
    email text NOT NULL, payload jsonb NOT NULL, during int4range NOT NULL,
    period tstzrange NOT NULL, doc tsvector NOT NULL, body text NOT NULL,
    created timestamptz NOT NULL, stamp timestamp NOT NULL, location point NOT NULL);
INSERT INTO k SELECT g, g % 1000, g % 77,
    md5(g::text) || ' ' || md5((g * 31)::text), md5(g::text), md5((g * 7)::text),
    'User' || g || '@Example.org',
    jsonb_build_object('kind', 'k' || (g % 500), 'n', g) || CASE WHEN g % 50 = 0
        THEN jsonb_build_object('flag', true) ELSE '{{}}'::jsonb END,
    int4range(g * 10, g * 10 + 10),
    tstzrange(timestamptz '2020-01-01' + g * interval '1 minute',
              timestamptz '2020-01-01' + (g + 5) * interval '1 minute'),
    to_tsvector('english', 'word' || (g % 3000) || ' common text'),
    'word' || (g % 3000) || ' common text',
    timestamptz '2020-01-01' + g * interval '10 seconds',
    timestamp '2020-01-01' + g * interval '10 seconds',
    point(g % 1000, g / 1000)
FROM generate_series(1, {ROWS}) g;
ANALYZE k
"""


@pytest.fixture(scope="module")
def source(sandbox: SandboxServer) -> Iterator[str]:
    """The cases' table in a database registered as a fork source (dropped after the module)."""
    with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {SOURCE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {SOURCE}")
    with psycopg.connect(sandbox.dsn(SOURCE), autocommit=True) as conn:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
    provider = LocalForkProvider(sandbox.dsn())
    try:
        trio.run(provider.register_source, SOURCE, "test")
        yield SOURCE
    finally:
        trio.run(provider.drop_source, SOURCE)


async def analyse(conn: Connection, query: str) -> AnalysisContext:
    return await gather_context(conn, task_id="t-kind", task_type="query_optimization", query=query,
                                features=extract_features(query), source_stats={})


def index_names(plan: Any) -> set[str]:
    found: set[str] = set()
    pending = [plan]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if "Index Name" in node:
                found.add(str(node["Index Name"]))
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


async def planner_scans(conn: Connection, proposal: OptimizationProposal, query: str) -> str:
    """Apply the proposal in the fork; the name of the index it creates, which the plan of the
    query must scan (an assertion of the caller)."""
    for command in proposal.sql_commands:
        await conn.execute(command)
    created = next(c for c in proposal.sql_commands if c.startswith("CREATE INDEX"))
    name = created.split()[2]
    plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}")
    assert name in index_names(plan), (proposal.sql_commands, plan)
    return name


def index_of(proposal: OptimizationProposal) -> str:
    """What follows the table name in the proposal's CREATE INDEX."""
    created = next(c for c in proposal.sql_commands if c.startswith("CREATE INDEX"))
    return created.split(" ON k", 1)[1].strip()


CASES = [
    # (query, what the first proposal's CREATE INDEX says after the table name)
    pytest.param("SELECT id FROM k WHERE a = 5 AND b > 70", "(a, b) INCLUDE (id)", id="btree-range"),
    pytest.param("SELECT id, a, b FROM k ORDER BY a DESC, b ASC LIMIT 10", "(a DESC, b) INCLUDE (id)",
                 id="btree-mixed-order"),
    pytest.param("""SELECT id FROM k WHERE payload @> '{"kind": "k7"}'""",
                 "USING gin (payload jsonb_path_ops)", id="jsonb-containment"),
    pytest.param("""SELECT id FROM k WHERE payload @> '{"kind": "k7"}' AND payload ? 'flag'""",
                 "USING gin (payload)", id="jsonb-containment-and-key"),
    pytest.param("SELECT id FROM k WHERE doc @@ to_tsquery('english', 'word42')", "USING gin (doc)",
                 id="tsvector"),
    pytest.param("SELECT id FROM k WHERE during && int4range(5000, 5030)", "USING gist (during)",
                 id="int4range-overlap"),
    pytest.param("SELECT id FROM k WHERE period && tstzrange('2020-01-10', '2020-01-10 00:05')",
                 "USING gist (period)", id="tstzrange-overlap"),
    pytest.param("SELECT id FROM k WHERE name LIKE 'abc%'", "(name text_pattern_ops) INCLUDE (id)",
                 id="prefix-non-c-collation"),
    pytest.param("SELECT id FROM k WHERE code LIKE 'abc%'", "(code) INCLUDE (id)", id="prefix-c-collation"),
    pytest.param("SELECT id FROM k WHERE lower(email) = 'user42@example.org'", "((lower(email)))",
                 id="lower-expression"),
    pytest.param("SELECT id FROM k WHERE to_tsvector('english', body) @@ to_tsquery('english', 'word42')",
                 "USING gin ((to_tsvector('english'::regconfig, body)))", id="tsvector-expression"),
    # a third of the rows, in physical order: too many for a B-tree, BRIN skips the rest
    pytest.param("SELECT count(*) FROM k WHERE created >= '2020-01-02' AND created < '2020-01-04'",
                 "USING brin (created)", id="brin-correlated-range"),
    # one day of ~7: an index on the (immutable) expression
    pytest.param("SELECT id FROM k WHERE stamp::date = '2020-01-03'", "(((stamp::date)))",
                 id="cast-expression"),
    # nearest neighbours: a class that orders by the distance operator (pg_amop, purpose 'o')
    pytest.param("SELECT id FROM k ORDER BY location <-> point '(500, 30)' LIMIT 10",
                 "USING gist (location)", id="knn-distance"),
]


@pytest.mark.parametrize(("query", "expected"), CASES)
async def test_the_catalog_gives_the_index_kind_and_the_planner_uses_it(
        source: str, forks: ForkClient, query: str, expected: str) -> None:
    async with forks.open_fork(source) as fork, open_connection(fork.dsn) as conn:
        ctx = await analyse(conn, query)
        assert ctx.operator_classes, "the analysis read the catalog"
        decision = decide_index_design(ctx)
        assert decision.proposal is not None, decision.insights
        assert index_of(decision.proposal) == expected, decision.proposal.sql_commands
        assert not any(c.startswith("CREATE EXTENSION") for c in decision.proposal.sql_commands)
        await planner_scans(conn, decision.proposal, query)


TRIGRAM_QUERY = "SELECT id, title FROM k WHERE title LIKE '%beef42%'"


async def test_a_trigram_class_of_an_installed_extension_is_used_without_creating_it(
        source: str, forks: ForkClient) -> None:
    async with forks.open_fork(source) as fork, open_connection(fork.dsn) as conn:
        available = await conn.fetchval(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if not available:
            pytest.skip("pg_trgm is not available in this PostgreSQL build")
        await conn.execute("CREATE EXTENSION pg_trgm")
        ctx = await analyse(conn, TRIGRAM_QUERY)
        trigram = [s for s in ctx.operator_classes["~~ text"] if s.opclass == "gin_trgm_ops"]
        assert trigram and trigram[0].installed and trigram[0].extension == "pg_trgm"
        decision = decide_index_design(ctx)
        assert decision.proposal is not None, decision.insights
        assert decision.proposal.sql_commands[0] == (
            "CREATE INDEX afs_k_title_trgm_gin ON k USING gin (title gin_trgm_ops)")
        assert "needs the pg_trgm extension" not in decision.proposal.rationale
        await planner_scans(conn, decision.proposal, TRIGRAM_QUERY)


async def test_a_trigram_class_of_an_available_trusted_extension_comes_with_it_and_without_none(
        source: str, forks: ForkClient) -> None:
    async with forks.open_fork(source) as fork, open_connection(fork.dsn) as conn:
        ctx = await analyse(conn, TRIGRAM_QUERY)
        # read in a transaction rolled back: nothing stays in the fork
        assert await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'") == 0
        assert await conn.fetchval("SELECT to_regclass('pg_temp.afs_operator_probe')") is None
        trigram = [s for s in ctx.operator_classes.get("~~ text", ()) if s.opclass == "gin_trgm_ops"]
        if not trigram:
            pytest.skip("pg_trgm is not available in this PostgreSQL build")
        assert not trigram[0].installed
        decision = decide_index_design(ctx)
        assert decision.proposal is not None, decision.insights
        assert decision.proposal.sql_commands == (
            "CREATE EXTENSION IF NOT EXISTS pg_trgm",
            "CREATE INDEX afs_k_title_trgm_gin ON k USING gin (title gin_trgm_ops)")
        await planner_scans(conn, decision.proposal, TRIGRAM_QUERY)
    # the same catalog without pg_trgm's classes (an extension neither installed nor available)
    without = {key: tuple(s for s in found if s.extension != "pg_trgm")
               for key, found in ctx.operator_classes.items()}
    decision = decide_index_design(dataclasses.replace(ctx, operator_classes=without))
    assert all("trgm" not in c for p in (decision.proposal, *decision.alternatives) if p
               for c in p.sql_commands)
    assert any("no operator class in the catalog serves LIKE on title" in i for i in decision.insights)


async def test_no_brin_for_a_large_range_on_a_column_out_of_physical_order(
        source: str, forks: ForkClient) -> None:
    query = "SELECT count(*) FROM k WHERE a BETWEEN 100 AND 400"  # a = id % 1000: no order on disk
    async with forks.open_fork(source) as fork, open_connection(fork.dsn) as conn:
        ctx = await analyse(conn, query)
    assert ctx.operator_classes
    decision = decide_index_design(ctx)
    assert decision.proposal is None, decision.proposal
    assert any("a B-tree would not beat a sequential scan" in i for i in decision.insights)


async def test_no_index_on_an_expression_postgresql_refuses_as_a_key(source: str, forks: ForkClient) -> None:
    """A timestamptz's date depends on the session's time zone and the one-argument
    to_tsvector on its configuration: not immutable, PostgreSQL refuses them as index keys."""
    query = ("SELECT id FROM k WHERE created::date = '2020-01-03'"
             " AND to_tsvector(body) @@ to_tsquery('word42')")
    async with forks.open_fork(source) as fork, open_connection(fork.dsn) as conn:
        ctx = await analyse(conn, query)
    assert ctx.operator_classes and not ctx.index_expressions
    decision = decide_index_design(ctx)
    assert decision.proposal is None, decision.proposal


async def test_a_domain_column_is_served_by_its_base_types_classes(source: str, forks: ForkClient) -> None:
    query = "SELECT id, e FROM dd ORDER BY e DESC LIMIT 5"
    async with forks.open_fork(source) as fork, open_connection(fork.dsn) as conn:
        for statement in ("CREATE DOMAIN email_t AS text",
                          "CREATE TABLE dd (id int PRIMARY KEY, e email_t NOT NULL)",
                          "INSERT INTO dd SELECT g, 'u' || g FROM generate_series(1, 50000) g",
                          "ANALYZE dd"):
            await conn.execute(statement)
        ctx = await analyse(conn, query)
        assert "> email_t" in ctx.operator_classes  # the sort operator is text's
        decision = decide_index_design(ctx)
        assert decision.proposal is not None, decision.insights
        assert decision.proposal.sql_commands[0] == "CREATE INDEX afs_dd_e_idx ON dd (e DESC) INCLUDE (id)"
        await planner_scans(conn, decision.proposal, query)


VARIED = [
    # (query, a variant the squad may measure in a spare slot: another kind for the one key)
    pytest.param("SELECT id FROM k WHERE lower(email) = 'user42@example.org'",
                 "USING hash ((lower(email)))", id="lower-expression-hash"),
    pytest.param("SELECT id FROM k WHERE to_tsvector('english', body) @@ to_tsquery('english', 'word42')",
                 "USING gist ((to_tsvector('english'::regconfig, body)))", id="tsvector-expression-gist"),
    pytest.param("SELECT id FROM k WHERE during && int4range(5000, 5030)", "USING spgist (during)",
                 id="int4range-spgist"),
    pytest.param("SELECT id, a, b FROM k WHERE a = 5", "USING hash (a)", id="btree-column-hash"),
    pytest.param("SELECT id FROM k WHERE payload ->> 'kind' = 'k7'",
                 "USING hash (((payload ->> 'kind'::text)))", id="jsonb-field-expression-hash"),
]


@pytest.mark.parametrize(("query", "variant"), VARIED)
async def test_a_one_key_design_varies_to_the_other_kinds_the_catalog_has_and_the_planner_uses_them(
        source: str, forks: ForkClient, query: str, variant: str) -> None:
    """Issue 25 item 3 with item 7: a design of one key (a column, or an expression the query
    tests; a B-tree too) varies to every other method whose classes serve the query's operators
    on that key, with the design's ANALYZE kept; PostgreSQL scans each variant's index."""
    async with forks.open_fork(source) as fork, open_connection(fork.dsn) as conn:
        ctx = await analyse(conn, query)
        decision = decide_index_design(ctx)
        assert decision.proposal is not None, decision.insights
        found = design_variants("gemini25pro", ctx, decision.proposal)
        by_index = {index_of(v): v for v in found}
        assert variant in by_index, (decision.proposal.sql_commands, list(by_index))
        chosen = by_index[variant]
        assert validate_candidate(chosen).is_valid, chosen.sql_commands
        if "ANALYZE" in " ".join(decision.proposal.sql_commands):
            assert any(c.startswith("ANALYZE") for c in chosen.sql_commands), chosen.sql_commands
        # never a B-tree's other B-tree class, never the design itself
        assert index_of(decision.proposal) not in by_index
        assert not any(" USING " not in k and "_pattern_ops" in k for k in by_index), list(by_index)
        await planner_scans(conn, chosen, query)
