"""The catalog gate asks PostgreSQL: an adversarial corpus, planted by a NOSUPERUSER role in real forks.

Each bypass class of issue 23 item 3 is planted in a fork of the demo database by the fork's own
role (NOSUPERUSER, NOCREATEROLE, owner of the copy, as a user of the database is): functions that
count their calls in a sequence (`gate.calls`: nextval survives the rollback of the transaction it
ran in), behind attribute notation, a domain over a domain, an array of a domain, a composite with
a domain field, a view's operator or domain, the `=` a `JOIN … USING` or `NATURAL JOIN` chooses by
name; and built-ins that read what the query does not name (`table_to_xml`,
`pg_stat_get_activity`). Every such query or proposal is refused with a clear reason, and then
treated as the workflow treats what the gate passes (the query run with EXPLAIN ANALYZE, the
proposal's commands run, both in a transaction rolled back): the counter shows the planted code
never ran. Ordered-set aggregates and ordinary queries of the demo pass.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import psycopg
import pytest

from afs.brains import Squad
from afs.catalog import catalog_problems, check_query_catalog
from afs.config import Settings
from afs.db import Connection, open_connection
from afs.errors import DatabaseError, UnsafeSqlError
from afs.events import Emitter
from afs.forks.client import Fork, ForkClient
from afs.models import EstimatedImpact, OptimizationProposal, UnsafeStatement
from afs.optimize import Crew, TaskRequest, optimize
from afs.router import load_rules
from afs.safety import check_query, proposal_references, query_references, validate_candidate
from afs.sandbox.server import SandboxServer
from afs.testing import ScriptedBrain

# planted by the fork's role: every function counts its calls in gate.calls
PLANT = """
CREATE SCHEMA gate;
CREATE SEQUENCE gate.calls;
CREATE FUNCTION gate.ran() RETURNS boolean LANGUAGE plpgsql VOLATILE
  AS $$BEGIN PERFORM nextval('gate.calls'); RETURN true; END$$;
CREATE FUNCTION gate.check_status(x text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE
  AS $$BEGIN RETURN gate.ran(); END$$;
CREATE FUNCTION public.total_with_tax(o orders) RETURNS numeric LANGUAGE plpgsql IMMUTABLE
  AS $$BEGIN PERFORM gate.ran(); RETURN o.total_amount * 1.2; END$$;
CREATE DOMAIN gate.checked AS text CHECK (gate.check_status(VALUE));
CREATE DOMAIN gate.outer_text AS gate.checked;
CREATE TYPE gate.holder AS (s gate.checked);
CREATE TABLE gate.tagged (id int, tags gate.checked[]);
INSERT INTO gate.tagged VALUES (1, '{a}');
CREATE FUNCTION gate.eq(a text, b text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE
  AS $$BEGIN PERFORM gate.ran(); RETURN a = b; END$$;
CREATE OPERATOR gate.=== (LEFTARG = text, RIGHTARG = text, FUNCTION = gate.eq);
CREATE VIEW gate.paid AS SELECT id, total_amount FROM orders WHERE status OPERATOR(gate.===) 'paid';
CREATE VIEW gate.checked_orders AS SELECT id, status::gate.outer_text AS status FROM orders;
CREATE TABLE gate.secrets (secret text);
INSERT INTO gate.secrets VALUES ('s3cr3t');
CREATE VIEW gate.as_xml AS SELECT table_to_xml('gate.secrets', true, false, '') AS x;
CREATE FUNCTION gate.next_id() RETURNS bigint LANGUAGE plpgsql VOLATILE
  AS $$BEGIN PERFORM gate.ran(); RETURN 1; END$$;
CREATE TABLE gate.template (id bigint DEFAULT gate.next_id(), status text CHECK (gate.check_status(status)));
SELECT setval('gate.calls', 1, false);
"""
# an `=` of the user's for an enum of the user's: JOIN … USING and NATURAL JOIN choose it by name
PLANT_EQUALS = """
CREATE TYPE gate.tag AS ENUM ('a', 'b');
CREATE FUNCTION gate.tag_eq(a gate.tag, b gate.tag) RETURNS boolean LANGUAGE plpgsql IMMUTABLE
  AS $$BEGIN PERFORM gate.ran(); RETURN a::text = b::text; END$$;
CREATE OPERATOR public.= (LEFTARG = gate.tag, RIGHTARG = gate.tag, FUNCTION = gate.tag_eq);
CREATE TABLE gate.left_side (id int, tg gate.tag);
CREATE TABLE gate.right_side (rid int, tg gate.tag);
INSERT INTO gate.left_side SELECT g, 'a' FROM generate_series(1, 100) g;
INSERT INTO gate.right_side SELECT g, 'a' FROM generate_series(1, 100) g;
SELECT setval('gate.calls', 1, false);
"""


@dataclass(frozen=True)
class Case:
    id: str
    sql: tuple[str, ...]
    reason: str  # a fragment of the refusal reason
    kind: str = "query"  # "query", or a proposal type
    plant: str = ""  # more to plant first


MV = "materialized_view"
BYPASSES: list[Case] = [
    Case("attribute-notation", ("SELECT o.id, o.total_with_tax FROM orders o WHERE o.id < 50",),
         "calls public.total_with_tax(), which is not built in"),
    Case("attribute-notation-parenthesized", ("SELECT (o).total_with_tax FROM orders o WHERE o.id < 50",),
         "public.total_with_tax()"),
    Case("attribute-notation-with-parameters", ("SELECT o.total_with_tax FROM orders o WHERE o.id = $1",),
         "public.total_with_tax()"),
    Case("attribute-notation-in-mv", ("CREATE MATERIALIZED VIEW x1 AS SELECT o.id, o.total_with_tax "
                                      "FROM orders o",), "public.total_with_tax()", MV),
    Case("attribute-notation-in-rewrite", ("SELECT o.id, o.total_with_tax FROM orders o WHERE o.id < 50",),
         "public.total_with_tax()", "query_rewrite"),
    Case("domain-over-domain", ("SELECT id FROM orders WHERE status::gate.outer_text IS NOT NULL",),
         "gate.check_status()"),
    Case("domain-over-domain-column-in-recipe",
         ("CREATE TABLE x1 (id bigint, status gate.outer_text) PARTITION BY RANGE (id)",
          "CREATE TABLE x1_all PARTITION OF x1 DEFAULT",
          "INSERT INTO x1 SELECT id, status FROM orders"), "gate.check_status()", "partitioning"),
    Case("defaults-and-checks-taken-over-with-like",
         ("CREATE TABLE x1 (LIKE gate.template INCLUDING ALL) PARTITION BY LIST (status)",
          "CREATE TABLE x1_all PARTITION OF x1 DEFAULT",
          "INSERT INTO x1 (status) SELECT status FROM orders WHERE id < 10"), "calls gate.",
         "partitioning"),
    Case("array-of-domain-column", ("SELECT id FROM gate.tagged WHERE tags = '{b}'",),
         "gate.check_status()"),
    Case("composite-with-domain-field", ("SELECT ROW(status)::gate.holder FROM orders WHERE id < 50",),
         "gate.check_status()"),
    Case("view-with-user-operator", ("SELECT sum(total_amount) FROM gate.paid",), "gate.eq()"),
    Case("view-with-user-operator-in-mv", ("CREATE MATERIALIZED VIEW x1 AS SELECT id FROM gate.paid",),
         "gate.eq()", MV),
    Case("view-with-domain", ("SELECT count(*) FROM gate.checked_orders",), "gate.check_status()"),
    Case("join-using", ("SELECT count(*) FROM gate.left_side JOIN gate.right_side USING (tg)",),
         "operator public.=, which runs gate.tag_eq()", plant=PLANT_EQUALS),
    Case("natural-join", ("SELECT count(*) FROM gate.left_side NATURAL JOIN gate.right_side",),
         "gate.tag_eq()", plant=PLANT_EQUALS),
    Case("join-using-in-mv", ("CREATE MATERIALIZED VIEW x1 AS SELECT l.id FROM gate.left_side l "
                              "JOIN gate.right_side r USING (tg)",), "gate.tag_eq()", MV, PLANT_EQUALS),
    Case("table-to-xml", ("SELECT table_to_xml('gate.secrets', true, false, '')",),
         "reads relations named as text"),
    Case("schema-to-xml", ("SELECT schema_to_xml('gate', true, false, '')",),
         "reads relations named as text"),
    Case("table-to-xml-behind-a-view", ("SELECT x FROM gate.as_xml",), "reads relations named as text"),
    Case("other-sessions", ("SELECT pid FROM pg_stat_get_activity(NULL)",), "other sessions' activity"),
    Case("other-sessions-in-attribute-notation", ("SELECT (1).pg_stat_get_activity",),
         "pg_catalog.pg_stat_get_activity(), which reads"),
]

ORDINARY: list[Case] = [
    Case("ordered-set-percentile", ("SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY total_amount) "
                                    "FROM orders",), ""),
    Case("ordered-set-mode-in-mv", ("CREATE MATERIALIZED VIEW x2 AS SELECT user_id, mode() WITHIN GROUP "
                                    "(ORDER BY status) AS usual FROM orders GROUP BY user_id",), "", MV),
    Case("hypothetical-set", ("SELECT rank(100) WITHIN GROUP (ORDER BY total_amount) FROM orders",), ""),
    Case("join-filter-sort", ("SELECT u.id, o.id, o.total_amount FROM users u "
                              "JOIN orders o ON o.user_id = u.id WHERE o.status = 'paid' "
                              "AND o.created_at > now() - interval '30 days' "
                              "ORDER BY o.created_at DESC LIMIT 20",), ""),
    Case("join-using-builtin", ("SELECT count(*) FROM orders o JOIN users u ON u.id = o.user_id "
                                "JOIN (SELECT id AS user_id FROM users) x USING (user_id)",), ""),
    Case("aggregates-and-windows", ("SELECT user_id, count(*), sum(total_amount), avg(total_amount), "
                                    "row_number() OVER (ORDER BY sum(total_amount) DESC) FROM orders "
                                    "GROUP BY user_id HAVING count(*) > 1",), ""),
    Case("cte-exists-in", ("WITH big AS (SELECT user_id FROM orders WHERE total_amount > 100) "
                           "SELECT id FROM users u WHERE EXISTS (SELECT 1 FROM big WHERE big.user_id = u.id) "
                           "AND u.id IN (SELECT user_id FROM orders WHERE status IN ('paid', 'sent'))",), ""),
    Case("text-and-dates", ("SELECT lower(status), date_trunc('day', created_at), "
                            "extract(year FROM created_at), coalesce(status, 'none'), "
                            "CASE WHEN total_amount > 10 THEN 'big' END, "
                            "to_char(created_at, 'YYYY-MM'), created_at::date FROM orders "
                            "WHERE status ILIKE 'p%' LIMIT 10",), ""),
    Case("distinct-on-and-lateral", ("SELECT DISTINCT ON (o.user_id) o.user_id, o.id FROM orders o, "
                                     "LATERAL (SELECT count(*) AS n FROM orders p "
                                     "WHERE p.user_id = o.user_id) c "
                                     "ORDER BY o.user_id, o.created_at DESC",), ""),
    Case("parameters", ("SELECT id, status FROM orders WHERE user_id = $1 AND created_at > $2 "
                        "LIMIT $3",), ""),
    Case("json-and-arrays", ("SELECT json_build_object('id', id, 'total', total_amount), "
                             "array_agg(status) OVER (PARTITION BY user_id) FROM orders LIMIT 5",), ""),
    Case("random-sample", ("SELECT id FROM orders ORDER BY random() LIMIT 5",), ""),
    Case("index-expression", ("CREATE INDEX x2 ON orders (lower(status)) WHERE total_amount > 0",), "",
         "index"),
    Case("mv-then-index-then-refresh", ("CREATE MATERIALIZED VIEW x2 AS SELECT user_id, count(*) AS n "
                                        "FROM orders GROUP BY user_id",
                                        "CREATE UNIQUE INDEX x2_user ON x2 (user_id)",
                                        "REFRESH MATERIALIZED VIEW x2"), "", MV),
    Case("statistics-expression", ("CREATE STATISTICS x2 ON (lower(status)), user_id FROM orders",), "",
         "statistics"),
]


@pytest.fixture
async def fork(forks: ForkClient) -> AsyncIterator[Fork]:
    """A fork of the demo database (via the MCP fork tools), destroyed after the test."""
    async with forks.open_fork("afs_demo") as made:
        yield made


async def plant(fork: Fork, sql: str) -> None:
    """Plant `sql` as the fork's own role (NOSUPERUSER), as a user of the database would."""
    async with open_connection(fork.dsn) as conn:
        assert await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is False
        await conn.execute(sql)


async def calls(conn: Connection) -> int:
    """How many times a planted function ran (gate.calls counts them, whatever was rolled back)."""
    row = await conn.fetchone("SELECT last_value, is_called FROM gate.calls")
    assert row is not None
    return int(row[0]) if row[1] else 0


def proposal_of(case: Case) -> OptimizationProposal:
    rewrite = case.sql[0] if case.kind == "query_rewrite" else None
    return OptimizationProposal("gemini25pro", case.kind, () if rewrite else case.sql, (),  # type: ignore[arg-type]
                                "test", EstimatedImpact(50, 0, "low", "low"), rewritten_query=rewrite)


async def gate(conn: Connection, case: Case) -> tuple[UnsafeStatement, ...]:
    """What the gate refuses of `case`, as optimize.py / afs.target (a query) and agents.py (a
    proposal) apply it: structure, then the catalog (names, then what PostgreSQL resolves)."""
    if case.kind == "query":
        (sql,) = case.sql
        try:
            query = check_query(sql)
            await check_query_catalog(conn, query, query_references(query))
        except UnsafeSqlError as exc:
            return (UnsafeStatement(exc.statement, exc.reason),)
        return ()
    proposal = proposal_of(case)
    validation = validate_candidate(proposal)
    if not validation.is_valid:
        return validation.rejected
    if proposal.rewritten_query is not None:
        try:
            check_query(proposal.rewritten_query)
        except UnsafeSqlError as exc:
            return (UnsafeStatement(exc.statement, exc.reason),)
    return await catalog_problems(conn, proposal_references(proposal))


async def then_run(conn: Connection, case: Case) -> None:
    """What the workflow does with what the gate passed, in a transaction rolled back: the query
    (or rewrite) measured with EXPLAIN ANALYZE, a proposal's commands run in the fork."""
    statements = ([f"EXPLAIN ANALYZE {case.sql[0]}"] if case.kind in ("query", "query_rewrite")
                  else list(case.sql))
    if "$1" in case.sql[0]:
        statements = [f"PREPARE q AS {case.sql[0]}", "EXPLAIN ANALYZE EXECUTE q(1, now(), 5)"]
    await conn.execute("BEGIN")
    try:
        for statement in statements:
            await conn.execute(statement)
    except DatabaseError:
        pass
    finally:
        await conn.execute("ROLLBACK")


@pytest.mark.parametrize("case", BYPASSES, ids=[c.id for c in BYPASSES])
async def test_a_planted_function_is_refused_and_never_runs(fork: Fork, case: Case) -> None:
    await plant(fork, PLANT + case.plant)
    async with open_connection(fork.dsn) as conn:
        if case.plant:  # the user's `=` is reached through the search path, as the user's own is
            await conn.execute("SET search_path = public, gate")
        refused = await gate(conn, case)
        if not refused:
            await then_run(conn, case)
        ran = await calls(conn)
        secrets_read = case.id.startswith(("table-to-xml", "schema-to-xml"))
    assert refused, f"accepted: {case.sql} (the planted function then ran {ran} times)"
    assert any(case.reason in r.reason for r in refused), refused
    assert ran == 0, f"the planted function ran {ran} times while the gate judged it"
    assert not secrets_read or refused


@pytest.mark.parametrize("case", ORDINARY, ids=[c.id for c in ORDINARY])
async def test_ordinary_queries_and_proposals_pass(fork: Fork, case: Case) -> None:
    async with open_connection(fork.dsn) as conn:
        assert await gate(conn, case) == ()


def status(conn: Connection) -> str:
    return conn.raw.info.transaction_status.name


async def test_the_gate_leaves_nothing_behind(fork: Fork) -> None:
    """Resolving creates temporary views in a transaction that is rolled back, or in a savepoint
    when the caller is inside a transaction of its own, which goes on."""
    await plant(fork, PLANT)
    async with open_connection(fork.dsn) as conn:
        refs = query_references("SELECT o.total_with_tax FROM orders o")
        assert await catalog_problems(conn, refs)
        assert await conn.fetchval("SELECT count(*) FROM pg_class WHERE relname LIKE 'afs_gate%'") == 0
        assert status(conn) == "IDLE"
        await conn.execute("BEGIN")
        await conn.execute("CREATE TABLE mine (x int)")
        assert await catalog_problems(conn, query_references("SELECT x FROM mine")) == ()
        assert status(conn) == "INTRANS"
        assert await conn.fetchval("SELECT count(*) FROM mine") == 0  # the caller's transaction is intact
        await conn.execute("ROLLBACK")
        assert await conn.fetchval("SELECT to_regclass('mine')") is None
        assert await calls(conn) == 0


async def test_a_statement_postgresql_cannot_resolve_is_refused(fork: Fork) -> None:
    async with open_connection(fork.dsn) as conn:
        query = "SELECT nope FROM orders"
        with pytest.raises(UnsafeSqlError, match='does not run on the database: column "nope" does not'):
            await check_query_catalog(conn, query, query_references(query))


async def test_as_a_superuser_the_gate_reads_as_the_low_privilege_role(fork: Fork,
                                                                       sandbox: SandboxServer) -> None:
    """As a superuser the gate would create its views as afs_explain (created if missing); in a
    fork, where PUBLIC has no TEMP right, afs_explain may not create them, and the gate resolves
    as the connection's role instead, still in a transaction rolled back, still refusing."""
    await plant(fork, PLANT)
    async with open_connection(sandbox.dsn(fork.name)) as conn:
        assert await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is True
        query = "SELECT o.total_with_tax FROM orders o"
        with pytest.raises(UnsafeSqlError, match=r"public\.total_with_tax\(\)"):
            await check_query_catalog(conn, query, query_references(query))
        assert await gate(conn, ORDINARY[0]) == ()
        assert await calls(conn) == 0
        assert await conn.fetchval("SELECT pg_has_role(current_user, 'afs_explain', 'MEMBER')") is True


# -- the user's query, end to end: refused on the source before anything plans it ---------------
PLANT_ON_SOURCE = """
CREATE FUNCTION public.doubled(x integer) RETURNS integer LANGUAGE plpgsql IMMUTABLE
  AS $$BEGIN RAISE EXCEPTION 'planted function ran as %', current_user; END$$;
"""


@pytest.fixture
def planted_source(sandbox: SandboxServer) -> Iterator[str]:
    """A copy of the demo database where a NOSUPERUSER role planted `PLANT_ON_SOURCE` (its DSN as
    the superuser AFS connects as); the copy and the role are dropped after."""
    suffix = os.urandom(4).hex()
    name, role = f"afs_gate_src_{suffix}", f"afs_gate_user_{suffix}"
    with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE afs_demo")
        admin.execute(f"CREATE ROLE {role} NOSUPERUSER NOLOGIN")
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
            conn.execute(f"SET ROLE {role}")
            conn.execute(PLANT_ON_SOURCE)
        yield sandbox.dsn(name)
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"DROP ROLE IF EXISTS {role}")


async def test_the_users_query_in_attribute_notation_is_refused_before_it_is_planted(
        settings: Settings, forks: ForkClient, planted_source: str) -> None:
    # (42).doubled is doubled(42): IMMUTABLE with a constant argument, so planning (EXPLAIN on the
    # source, as the first thing after the gate) would fold it, running the planted function
    events = Emitter("gate" + os.urandom(3).hex())
    squad = Squad(brain_for=lambda _: ScriptedBrain(lambda agent: None), provider="scripted",
                  agents=("gemini25pro",))
    with pytest.raises(UnsafeSqlError) as caught:
        await optimize(settings, TaskRequest(query="SELECT id, status FROM orders WHERE id = (42).doubled"),
                       source="afs_demo", source_dsn=planted_source,
                       crew=Crew(forks=forks, squad=squad, rules=load_rules(None)), events=events)
    assert "calls public.doubled(), which is not built in" in caught.value.reason
    assert "planted function ran" not in str(caught.value)
    assert not [e for e in events.history if e.kind == "fork_created"]
