"""What a user's query and database can hold (issue 9, items 12 to 15): input AFS must refuse
clearly, once, before any fork (too large, too deep, parameters); names in mixed case; views."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from mcp import Client

from afs.analysis import gather_context
from afs.brains import Squad, StrategistBrain
from afs.config import Settings
from afs.db import connect_sync, open_connection
from afs.errors import DatabaseError, InputError
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.forks.server import build_server
from afs.models import AgentKey, EstimatedImpact, OptimizationProposal
from afs.optimize import Crew, TaskRequest, optimize, prepare, read_input
from afs.params.family import apply_parameters, parameter_sets
from afs.query.features import extract_features
from afs.query.query import Query
from afs.query.shape import Resolver, query_shape, read_query
from afs.query.text import MAX_QUERY_BYTES, check_input, parse_query
from afs.router import load_rules
from afs.safety import check_query
from afs.sandbox.server import SandboxServer
from afs.suite import build_suite
from afs.target import TARGET_ROLE, _read_only, plan_only
from afs.testing import Child, ScriptedBrain, run_afs

NESTED_50 = "SELECT id FROM orders WHERE " + "(" * 50 + "id = 1" + ")" * 50
PARAMETERISED = "SELECT id FROM orders WHERE user_id = $1 AND status = $2"


def in_list(size: int) -> str:
    """SELECT … WHERE user_id IN (0, 1, 2, …) of about `size` bytes."""
    head, items, length, i = "SELECT id FROM orders WHERE user_id IN (", [], 0, 0
    while length < size:
        items.append(str(i))
        length += len(items[-1]) + 2
        i += 1
    return head + ", ".join(items) + ")"


# -- the check itself (pure) ---------------------------------------------------------------
def test_a_query_nested_too_deeply_is_refused_with_a_clear_error() -> None:
    with pytest.raises(InputError, match="nests too deeply"):
        read_input(NESTED_50)


def test_a_query_too_large_is_refused_by_its_size() -> None:
    with pytest.raises(InputError, match=r"1,0\d\d,\d\d\d bytes long; .* at most 100,000"):
        read_input(in_list(1_000_000))


def test_a_parameterised_query_is_refused_and_the_message_says_why() -> None:
    with pytest.raises(InputError, match=r"parameters \(\$1, \$2\).*pg_stat_statements") as info:
        read_input(PARAMETERISED)
    assert "`afs batch`" in str(info.value) and "not there yet" not in str(info.value)


def _readers(sql: str) -> None:
    """What a task and an agent do with the query text."""
    text, _ = read_input(sql)
    tree = read_query(text)
    assert tree is not None
    tree.copy().sql(dialect="postgres")
    build_suite(Query.read(text), None, None)
    for pset in parameter_sets(Query.read(text), {}, 3):
        apply_parameters(text, pset)


def _with_stack(frames: int, fn: Callable[[], None]) -> None:
    """`fn()` with `frames` more frames on the stack: with pytest's own, about what is below an
    agent in a trio task under pytest."""
    if frames == 0:
        fn()
    else:
        _with_stack(frames - 1, fn)


NESTINGS: dict[str, Callable[[int], str]] = {
    "parentheses": lambda n: "SELECT id FROM orders WHERE " + "(" * n + "id = 1" + ")" * n,
    "subqueries": lambda n: ("SELECT id FROM orders WHERE id IN "
                             + "(SELECT id FROM orders WHERE id IN " * n + "(1)" + ")" * n),
    "functions": lambda n: "SELECT " + "coalesce(" * n + "id" + ", 1)" * n + " FROM orders",
    "NOT": lambda n: "SELECT id FROM orders WHERE " + "NOT " * n + "(id = 1)",
    "NOT (…)": lambda n: "SELECT id FROM orders WHERE " + "NOT (" * n + "id = 1" + ")" * n,
    "minus": lambda n: "SELECT " + "- " * n + "id FROM orders",
    "CASE": lambda n: "SELECT " + "CASE WHEN id = 1 THEN " * n + "1" + " END" * n + " FROM orders",
    "+ chain": lambda n: "SELECT " + " + ".join(["id"] * n) + " FROM orders",
    "UNION": lambda n: " UNION ".join(["SELECT id FROM orders"] * n),
    "JOIN": lambda n: "SELECT 1 FROM orders o0 " + " ".join(
        f"JOIN orders o{i} ON o{i}.id = o{i - 1}.id" for i in range(1, n)),
    "ARRAY": lambda n: "SELECT " + "ARRAY[" * n + "1" + "]" * n + " FROM orders",
    "CAST": lambda n: "SELECT " + "CAST(" * n + "id" + " AS int)" * n + " FROM orders",
}


def _deepest_accepted(make: Callable[[int], str]) -> int:
    def accepted(n: int) -> bool:
        try:
            check_input(make(n))
        except InputError:
            return False
        return True

    low, high = 1, 2
    while accepted(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if accepted(middle) else (low, middle)
    return low


@pytest.mark.parametrize("kind", sorted(NESTINGS))
def test_every_nesting_the_check_accepts_reads_with_room_on_the_stack(kind: str) -> None:
    make = NESTINGS[kind]
    deepest = _deepest_accepted(make)
    assert deepest >= (6 if kind == "ARRAY" else 10)  # no obstacle to ordinary queries
    with pytest.raises(InputError, match="nests too deeply"):
        check_input(make(deepest + 1))
    _with_stack(300, lambda: _readers(make(deepest)))


def test_long_flat_lists_are_not_nesting() -> None:
    """AND / OR chains and IN lists are lists for PostgreSQL: only their size counts."""
    terms = " AND ".join(f"(user_id <> {i} OR status = 'x')" for i in range(600))
    sql = f"SELECT id FROM orders WHERE {terms}"
    assert len(sql) < MAX_QUERY_BYTES
    _with_stack(300, lambda: _readers(sql))
    chain = ("WITH " + ", ".join(f"c{i} AS (SELECT id FROM {'orders' if i == 0 else f'c{i - 1}'})"
                                 for i in range(1500)) + " SELECT * FROM c1499")
    assert extract_features(chain).main_table == "orders"  # followed without recursing


def test_the_reader_turns_a_stack_overflow_into_input_error() -> None:
    """The net behind check_input: no RecursionError (and no traceback) ever leaves parse_query."""
    with pytest.raises(InputError, match="nests too deeply"):
        parse_query(check_query("SELECT id FROM orders WHERE " + "(" * 200 + "id = 1" + ")" * 200))
    assert read_query("SELECT id FROM orders WHERE " + "(" * 200 + "id = 1" + ")" * 200) is None


def test_query_shape_reads_a_where_of_thousands_of_terms() -> None:
    from afs.models import AnalysisContext

    sql = "SELECT id FROM orders WHERE " + " AND ".join(f"user_id <> {i}" for i in range(1500))
    ctx = AnalysisContext(task_id="t", task_type="query_optimization", query=sql,
                          features=extract_features(sql), plan={}, execution_ms=1.0, tables={})
    query = Query.read(sql)
    assert query_shape(query, Resolver(ctx, query)).filters == {}  # read, not a RecursionError


# -- the command line -------------------------------------------------------------------
def afs_cli(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return run_afs(*args, home=home, child=Child(timeout_s=120))


@pytest.mark.parametrize(("query", "message"), [
    (NESTED_50, "nests too deeply"),
    (in_list(110_000), "bytes long"),  # more fits no command-line argument (128 kB)
    (PARAMETERISED, "parameters ($1, $2)"),
])
def test_cli_refuses_bad_input_with_exit_2_before_starting_anything(
        tmp_path: Path, query: str, message: str) -> None:
    result = afs_cli(tmp_path, "optimize", "--query", query, "--provider", "heuristic")
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("afs: error: ") and message in stderr
    assert not (tmp_path / "pgdata").exists()  # no sandbox was started for it


# -- inside a task -------------------------------------------------------------------------
def _squad(brains: dict[str, object]) -> Squad:
    default = StrategistBrain()
    return Squad(brain_for=lambda agent: brains.get(agent, default),  # type: ignore[arg-type, return-value]
                 provider="heuristic", agents=tuple(brains))  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_leaked_forks")
@pytest.mark.parametrize("query", [NESTED_50, PARAMETERISED, in_list(200_000)])
async def test_optimize_refuses_before_any_fork(settings: Settings, sandbox: SandboxServer,
                                                forks: ForkClient, query: str) -> None:
    events = Emitter("bad-input")
    with pytest.raises(InputError):
        await optimize(settings, TaskRequest(query=query), source="afs_demo",
                       source_dsn=sandbox.dsn("afs_demo"),
                       crew=Crew(forks=forks, squad=_squad({"gemini25pro": StrategistBrain()}),
                                 rules=load_rules(None)),
                       events=events)
    assert not [e for e in events.history if e.kind == "fork_created"]


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_rewrite_too_deep_to_read_is_rejected_and_the_squad_goes_on(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    query = "SELECT id FROM orders WHERE user_id = 42"

    def deep(agent: AgentKey) -> OptimizationProposal:
        return OptimizationProposal(
            agent=agent, proposal_type="query_rewrite", sql_commands=(), rollback_commands=(),
            rewritten_query=NESTED_50.replace("id = 1", "user_id = 42"), rationale="parentheses",
            estimated_impact=EstimatedImpact(50.0, 0.0, "low", "low"))

    events = Emitter("deep-rewrite")
    result = await optimize(
        settings, TaskRequest(query=query, runs=1), source="afs_demo",
        source_dsn=sandbox.dsn("afs_demo"),
        crew=Crew(forks=forks,
                  squad=_squad({"gemini25pro": ScriptedBrain(deep), "gemini20flash": StrategistBrain()}),
                  rules=load_rules(None)),
        events=events)
    by_agent = {o.agent: o for o in result.outcomes}
    assert by_agent["gemini25pro"].status == "rejected"
    assert "nests too deeply" in (by_agent["gemini25pro"].error or "")
    assert by_agent["gemini20flash"].status != "failed"


async def test_the_event_loop_runs_while_a_large_query_is_read() -> None:
    """Reading happens in a worker thread: a trio task ticks meanwhile."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await trio.to_thread.run_sync(read_input, in_list(90_000))
        nursery.cancel_scope.cancel()
    assert ticks > 5



# -- a database of the user's: names in mixed case, views ------------------------------------
CASES_DB = "afs_inputs_cases"
CASES_SQL = """
CREATE TABLE orders (id int PRIMARY KEY, user_id int NOT NULL, status text NOT NULL,
                     created_at timestamptz NOT NULL);
INSERT INTO orders SELECT i, i % 500, CASE WHEN i % 10 = 0 THEN 'cancelled' ELSE 'paid' END,
       timestamptz '2025-01-01' + i * interval '1 minute' FROM generate_series(1, 20000) AS i;
CREATE TABLE "Orders" (id int PRIMARY KEY, "Total" int NOT NULL, note text);
INSERT INTO "Orders" SELECT i, i % 7, 'n' FROM generate_series(1, 40) AS i;
CREATE VIEW live_orders AS SELECT id, user_id AS customer, created_at FROM orders
    WHERE status <> 'cancelled';
CREATE VIEW big_live_orders AS SELECT id, customer FROM live_orders WHERE id > 100;
CREATE TABLE audit (who text);
CREATE FUNCTION writer() RETURNS void VOLATILE LANGUAGE plpgsql
    AS $$ BEGIN INSERT INTO audit VALUES (current_user); END $$;
-- planning folds immutable calls: these run when the query is only EXPLAINed
CREATE FUNCTION sneaky() RETURNS int IMMUTABLE LANGUAGE plpgsql
    AS $$ BEGIN PERFORM writer(); RETURN 1; END $$;
CREATE FUNCTION whoami() RETURNS int IMMUTABLE LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planned as %', current_user; END $$;
ANALYZE;
"""


@pytest.fixture(scope="module")
def cases_db(sandbox: SandboxServer) -> Iterator[str]:
    """A user's database beside the demo: `orders` and `"Orders"`, views over orders; forkable."""
    admin = connect_sync(sandbox.dsn())
    try:
        admin.execute(f"DROP DATABASE IF EXISTS {CASES_DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {CASES_DB}")
        with connect_sync(sandbox.dsn(CASES_DB)) as conn:
            conn.execute(CASES_SQL)
        trio.run(LocalForkProvider(sandbox.dsn()).register_source, CASES_DB, "tests")
        yield CASES_DB
    finally:
        trio.run(LocalForkProvider(sandbox.dsn()).drop_source, CASES_DB)
        admin.close()


async def test_a_quoted_mixed_case_table_is_not_its_lower_case_namesake(
        sandbox: SandboxServer, cases_db: str) -> None:
    query, features = read_input('SELECT id, note FROM "Orders" WHERE "Total" = 3')
    assert features.tables == ('"Orders"',)
    assert {(u.table, u.column, u.role) for u in features.columns} >= {('"Orders"', "Total", "equality")}
    _, _, stats = await prepare(TaskRequest(query=query), sandbox.dsn(cases_db))
    assert stats['"Orders"'].rows == 40  # its own statistics, not those of orders (20,000 rows)

    both = ('SELECT o.id FROM orders o JOIN "Orders" x ON x.id = o.id '
            'WHERE x."Total" = 3 AND o.user_id = 7')
    query, features = read_input(both)
    async with open_connection(sandbox.dsn(cases_db)) as conn:
        ctx = await gather_context(conn, task_id="t", task_type="query_optimization", query=query,
                                   features=features, source_stats={})
    assert ctx.tables['"Orders"'].rows == 40 and ctx.tables["orders"].rows == 20_000
    assert "Total" in ctx.tables['"Orders"'].column_stats
    assert ctx.tables['"Orders"'].ddl.startswith('CREATE TABLE "Orders" (\n  id integer NOT NULL,\n'
                                                 '  "Total" integer')
    resolver = Resolver(ctx)
    assert resolver.table_key("Orders") == '"Orders"' and resolver.table_key("orders") == "orders"
    assert resolver.table_key("x") == '"Orders"' and resolver.table_key("o") == "orders"


async def test_unknown_mixed_case_table_is_unknown(sandbox: SandboxServer, cases_db: str) -> None:
    with pytest.raises(InputError, match='unknown table "ORDERS"'):
        await prepare(TaskRequest(query='SELECT 1 FROM "ORDERS"'), sandbox.dsn(cases_db))


@pytest.mark.usefixtures("no_leaked_forks")
async def test_agents_see_through_views_to_their_tables(
        settings: Settings, sandbox: SandboxServer, cases_db: str, provider: LocalForkProvider) -> None:
    """A query on a view of a view: the features, statistics and analysis are about orders,
    and the proposal indexes orders."""
    query = "SELECT id, customer FROM big_live_orders b WHERE b.customer = 42"
    _, features, stats = await prepare(TaskRequest(query=query), sandbox.dsn(cases_db))
    assert features.tables == ("orders",) and features.main_table == "orders"
    assert set(stats) == {"orders"} and stats["orders"].rows == 20_000
    uses = {(u.table, u.column, u.role, u.operator) for u in features.columns}
    assert ("orders", "user_id", "equality", "=") in uses  # customer is user_id
    assert ("orders", "status", "other", None) in uses  # the view's own filter
    assert ("orders", "id", "range", ">") in uses
    assert features.aliases == {"b": "orders"}

    async with Client(build_server(provider)) as client:
        result = await optimize(
            settings, TaskRequest(query=query, runs=3), source=cases_db,
            source_dsn=sandbox.dsn(cases_db),
            crew=Crew(forks=ForkClient(client), squad=_squad({"gemini25pro": StrategistBrain()}),
                      rules=load_rules(None)),
            events=Emitter("views"))
    (outcome,) = result.outcomes
    assert outcome.status == "ok", outcome.error
    assert outcome.proposal is not None
    assert any("ON orders" in c and "user_id" in c for c in outcome.proposal.sql_commands), \
        outcome.proposal.sql_commands
    assert outcome.benchmark is not None and outcome.benchmark.average_improvement_pct > 10


async def test_explain_on_the_source_is_read_only_and_low_privileged(
        sandbox: SandboxServer, cases_db: str) -> None:
    """Item 7: a function that planning evaluates cannot write, and runs as afs_explain."""
    async with open_connection(sandbox.dsn(cases_db)) as conn:
        with pytest.raises(DatabaseError, match="read-only transaction"):
            await _read_only(conn, "SELECT id FROM orders WHERE id = sneaky()", plan_only)  # past the gate
        with pytest.raises(DatabaseError, match=f"planned as {TARGET_ROLE}"):
            await _read_only(conn, "SELECT whoami()", plan_only)
        await _read_only(conn, "SELECT id FROM orders WHERE id = 1", plan_only)  # a plain query plans
        assert await conn.fetchval("SELECT count(*) FROM audit") == 0
        assert await conn.fetchval("SELECT current_user") == "postgres"  # the session is as it was
        member = await conn.fetchval("SELECT pg_has_role(%s, 'pg_read_all_data', 'MEMBER')",
                                     (TARGET_ROLE,))
        writes = await conn.fetchval("SELECT has_table_privilege(%s, 'orders', 'INSERT')",
                                     (TARGET_ROLE,))
        assert member and not writes
    with pytest.raises(InputError):
        await prepare(TaskRequest(query="SELECT id FROM orders WHERE id = sneaky()"),
                      sandbox.dsn(cases_db))
    async with open_connection(sandbox.dsn(cases_db)) as conn:
        assert await conn.fetchval("SELECT count(*) FROM audit") == 0
