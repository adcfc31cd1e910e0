"""Issue 23, item 1: every statement AFS plans, explains or runs on a user's database goes
through one path (afs.target.on_target): input limits, the structural check, the catalog
check, then a READ ONLY transaction as the low-privilege role.

The attacker is a NOSUPERUSER role of the target database that plants `public.bump()`,
IMMUTABLE (planning evaluates it: constant folding), calling `public.escalate()`, VOLATILE,
which does what only a superuser may when a superuser runs it: `COPY … TO PROGRAM` (allowed
in a read-only transaction) leaves a marker file on the host, and `ALTER ROLE … SUPERUSER`
makes the attacker a superuser. Run by the attacker itself, it does nothing, so its
statements run cleanly and land in pg_stat_statements. AFS then runs as the superuser.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import structlog.testing

from afs.apply import apply_winner, audit, load_plan
from afs.apply.target import prepare as apply_prepare
from afs.batch.fill import fill_statement
from afs.batch.job import BatchOptions, run_batch
from afs.batch.statements import BatchTarget
from afs.config import BATCH_PARAMETER_SETS, Settings
from afs.db import open_connection
from afs.errors import DatabaseError, InputError, UnsafeSqlError
from afs.models import (
    AgentOutcome,
    AnalysisResult,
    BenchmarkOutcome,
    ConsensusDecision,
    EstimatedImpact,
    Measurement,
    OptimizationProposal,
    RoutingDecision,
    TaskResult,
    Timing,
)
from afs.optimize import TaskRequest, new_task_id, prepare
from afs.sandbox.server import SandboxServer, dsn_for
from afs.service.worker import open_runtime, worker_name
from afs.store import Store, TaskSubmission, open_store
from afs.target import TARGET_ROLE, _read_only, generic_plan, on_target, plan_only, target_role

PLANTED = "SELECT id, total FROM orders WHERE user_id = public.bump()"
PLANTED_WITH_PARAMETER = "SELECT id FROM orders WHERE user_id = public.bump() AND id > 5"


@dataclass(frozen=True)
class Target:
    dsn: str  # the superuser's, as a privileged DSN AFS is pointed at
    database: str
    attacker: str
    marker: Path  # COPY … TO PROGRAM 'touch marker', run only by a superuser

    def attacker_is_superuser(self, sandbox: SandboxServer) -> bool:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s",
                               (self.attacker,)).fetchone()
        assert row is not None
        return bool(row[0])

    def untouched(self, sandbox: SandboxServer) -> bool:
        return not self.marker.exists() and not self.attacker_is_superuser(sandbox)


@pytest.fixture
def planted(sandbox: SandboxServer, settings: Settings) -> Iterator[Target]:
    """A target database with pg_stat_statements, `orders`, and an attacker's planted functions
    in pg_stat_statements (run by the attacker: no constant, and one with a parameter)."""
    suffix = os.urandom(4).hex()
    name, attacker = f"afs_target_t_{suffix}", f"afs_attacker_{suffix}"
    where = Path(tempfile.mkdtemp(prefix="afs-marker-"))
    where.chmod(0o777)  # the server's OS user may write there
    marker = where / "planted-function-ran"
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {attacker} LOGIN NOSUPERUSER PASSWORD 'attacker'")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, user_id int NOT NULL, total numeric)")
            conn.execute("INSERT INTO orders SELECT g, g % 100, g % 7 FROM generate_series(1, 5000) g")
            conn.execute("ANALYZE orders")
            conn.execute(f"GRANT SELECT ON orders TO {attacker}")
            conn.execute(f"GRANT CREATE ON SCHEMA public TO {attacker}")
        as_attacker = dsn_for(settings, name, user=attacker, password="attacker")
        with psycopg.connect(as_attacker, autocommit=True) as conn:
            conn.execute(f"""
                CREATE FUNCTION public.escalate() RETURNS int VOLATILE LANGUAGE plpgsql AS $f$
                BEGIN
                    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
                        BEGIN
                            EXECUTE 'COPY (SELECT 1) TO PROGRAM ' || quote_literal('touch {marker}');
                        EXCEPTION WHEN OTHERS THEN NULL;
                        END;
                        BEGIN
                            EXECUTE 'ALTER ROLE {attacker} SUPERUSER';
                        EXCEPTION WHEN OTHERS THEN NULL;
                        END;
                    END IF;
                    RETURN 1;
                END $f$""")
            conn.execute("CREATE FUNCTION public.bump() RETURNS int IMMUTABLE LANGUAGE plpgsql"
                         " AS $f$ BEGIN RETURN public.escalate(); END $f$")
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                         " WHERE datname = current_database()), 0)")
        with psycopg.connect(as_attacker, autocommit=True) as conn:
            for _ in range(5):
                conn.execute(PLANTED).fetchall()
                conn.execute(PLANTED_WITH_PARAMETER).fetchall()
        target = Target(sandbox.dsn(name), name, attacker, marker)
        assert target.untouched(sandbox)  # the attacker's own runs did nothing
        yield target
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {attacker}")
        shutil.rmtree(where, ignore_errors=True)


async def stored(store: Store, sql: tuple[str, ...], ptype: str = "index", *, query: str = PLANTED,
                 rewritten: str | None = None) -> str:
    """A completed task whose winner is `sql` (the shapes `afs optimize` records)."""
    task_id = new_task_id()
    await store.submit(TaskSubmission(task_id=task_id, query=query, source="afs_demo", dsn=None,
                               task_type="query_optimization", priority="normal", provider="heuristic",
                               weights=None, runs=2), worker="t", lease_s=30)
    timing = Measurement("baseline", Timing(40.0, 1.0, 5, 900), Timing(0.5, 0.1, 5, 4), 20, True, True)
    proposal = OptimizationProposal(
        agent="gemini25pro", proposal_type=ptype, sql_commands=sql,  # type: ignore[arg-type]
        rollback_commands=(), rationale="test winner", estimated_impact=EstimatedImpact(90, 1, "low", "low"),
        rewritten_query=rewritten)
    outcome = AgentOutcome(
        agent="gemini25pro", status="ok", fork="afs-fork-x", proposal=proposal,
        analysis=AnalysisResult(insights=(), proposed_actions=(), confidence=0.8),
        benchmark=BenchmarkOutcome((timing,), storage_before_mb=10.0, storage_after_mb=12.5, apply_s=0.8))
    result = TaskResult(
        task_id=task_id, status="completed", query=query, source="afs_demo",
        routing=RoutingDecision(("gemini25pro",), ("test",)), outcomes=(outcome,),
        decision=ConsensusDecision("gemini25pro", {}, ("gemini25pro",), ("the only one",), 0.9),
        provider="heuristic", provider_note="", duration_s=1.0)
    assert await store.finish(task_id, "t", status="completed", result=result)
    return task_id


@pytest.fixture
async def store(store_db: str) -> AsyncIterator[Store]:
    async with open_store(store_db) as opened:
        yield opened


async def test_a_batch_skips_a_planted_function_instead_of_running_it_as_the_batchs_role(
        planted: Target, sandbox: SandboxServer, settings: Settings, store_db: str) -> None:
    """The issue's escalation: before, the batch EXPLAINed both statements as the superuser."""
    async with open_runtime(settings, store_db) as rt:
        doc = await run_batch(rt, BatchTarget(planted.dsn, settings.demo_database, None),
                              options=BatchOptions(top=5, provider="heuristic", runs=1),
                              worker=worker_name("batch"))
    assert planted.untouched(sandbox)
    entries = {e["query"]: e for e in doc["statements"]}
    assert len(entries) == 2, doc["statements"]  # both statements were read, neither ran
    for entry in entries.values():
        assert "bump()" in entry["query"]
        assert entry["status"] == "skipped" and entry["task_id"] is None
        assert "bump" in entry["reason"] and "not built in" in entry["reason"], entry["reason"]


async def test_filling_a_planted_statement_refuses_it_before_any_plan(planted: Target,
                                                                       sandbox: SandboxServer) -> None:
    async with open_connection(planted.dsn) as conn:
        for query in ("SELECT id FROM orders WHERE user_id = public.bump() AND id > $1",
                      "SELECT id FROM orders WHERE user_id = public.bump()"):
            filled = await fill_statement(conn, query, BATCH_PARAMETER_SETS)
            assert filled.sets == () and filled.reason and "not built in" in filled.reason
    assert planted.untouched(sandbox)


async def test_apply_refuses_a_verification_query_with_a_planted_function_before_building(
        planted: Target, sandbox: SandboxServer, store: Store) -> None:
    """apply measures the query read-only on the target before and after the build: before,
    as the applying (superuser) role, where COPY … TO PROGRAM ran."""
    task_id = await stored(store, ("CREATE INDEX ix_orders_user ON orders (user_id)",))
    plan = await load_plan(store, task_id)
    with pytest.raises(UnsafeSqlError, match="not built in"):
        await apply_winner(store, plan, planted.dsn, approver="carol")
    assert planted.untouched(sandbox)
    [row] = await audit.entries(store, task_id)
    assert row["result"] == "refused" and "bump" in row["detail"]
    with psycopg.connect(planted.dsn) as conn:
        assert conn.execute("SELECT to_regclass('ix_orders_user')").fetchone() == (None,)  # nothing built


async def test_apply_refuses_a_planted_rewrite_and_rolls_back_what_it_built(
        planted: Target, sandbox: SandboxServer, store: Store) -> None:
    """The rewrite a materialized view serves reads the view, so it is checked once the view is
    built, before it is planned (before: planned as the applying role); refused, the view goes."""
    view = "CREATE MATERIALIZED VIEW mv_u AS SELECT user_id, count(*) AS n FROM orders GROUP BY user_id"
    task_id = await stored(store, (view,), "materialized_view",
                           query="SELECT user_id, count(*) FROM orders GROUP BY user_id",
                           rewritten="SELECT user_id, n FROM mv_u WHERE user_id = public.bump()")
    plan = await load_plan(store, task_id)
    row = await apply_winner(store, plan, planted.dsn, approver="carol")
    assert row["result"] == "failed" and "not built in" in row["detail"] and "rolled back" in row["detail"]
    assert planted.untouched(sandbox)
    with psycopg.connect(planted.dsn) as conn:
        assert conn.execute("SELECT to_regclass('mv_u')").fetchone() == (None,)


async def test_apply_judges_its_statements_by_the_targets_catalog_before_building(
        planted: Target, sandbox: SandboxServer, settings: Settings, store: Store) -> None:
    """The fork judged `lower(code)` as the built-in; on the target the attacker has since planted
    public.lower(varchar), a closer match for a varchar column than pg_catalog.lower(text): the
    index build would run it on every row as the table's owner (before: the superuser)."""
    with psycopg.connect(planted.dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders ADD COLUMN code varchar(20)")
        conn.execute("UPDATE orders SET code = 'C' || (id % 10)")
    as_attacker = dsn_for(settings, planted.database, user=planted.attacker, password="attacker")
    with psycopg.connect(as_attacker, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION public.lower(varchar) RETURNS text IMMUTABLE LANGUAGE plpgsql"
                     " AS $f$ BEGIN PERFORM public.escalate(); RETURN pg_catalog.lower($1::text); END $f$")
    task_id = await stored(store, ("CREATE INDEX ix_orders_code ON orders (lower(code))",),
                           query="SELECT id FROM orders WHERE user_id = 7")
    plan = await load_plan(store, task_id)
    with pytest.raises(UnsafeSqlError, match="lower"):
        await apply_prepare(plan, planted.dsn, sample_s=0.0)
    with pytest.raises(UnsafeSqlError, match="lower"):
        await apply_winner(store, plan, planted.dsn, approver="carol")
    assert planted.untouched(sandbox)
    [row] = await audit.entries(store, task_id)
    assert row["result"] == "refused" and "on the target" in row["detail"]
    with psycopg.connect(planted.dsn) as conn:
        assert conn.execute("SELECT to_regclass('ix_orders_code')").fetchone() == (None,)


async def test_optimize_refuses_a_planted_function_before_planning(planted: Target,
                                                                   sandbox: SandboxServer) -> None:
    with pytest.raises(UnsafeSqlError, match="not built in"):
        await prepare(TaskRequest(query=PLANTED), planted.dsn)
    assert planted.untouched(sandbox)


async def test_every_check_comes_before_the_plan(planted: Target, sandbox: SandboxServer) -> None:
    async with open_connection(planted.dsn) as conn:
        with pytest.raises(InputError, match="parameters"):  # $n only where the batch asks for it
            await on_target(conn, "SELECT id FROM orders WHERE id = $1", plan_only)
        with pytest.raises(UnsafeSqlError, match="only a SELECT"):
            await on_target(conn, "DELETE FROM orders", plan_only)
        with pytest.raises(InputError, match="bytes long"):
            await on_target(conn, "SELECT id FROM orders WHERE id IN (" + "1," * 200_000 + "1)", plan_only)
        with pytest.raises(UnsafeSqlError, match="not built in"):
            await on_target(conn, PLANTED_WITH_PARAMETER.replace("5", "$1"), plan_only, parameters=True)
        await on_target(conn, "SELECT id FROM orders WHERE id > $1", generic_plan, parameters=True)
        assert await conn.fetchval("SELECT current_user") == "postgres"
    assert planted.untouched(sandbox)


async def test_past_the_gate_a_function_runs_read_only_as_the_low_privilege_role(
        planted: Target, sandbox: SandboxServer) -> None:
    """The last layer alone (as if the gate missed a planted function): no COPY … TO PROGRAM,
    no ALTER ROLE, because the plan is made as afs_explain in a READ ONLY transaction."""
    async with open_connection(planted.dsn) as conn:
        assert await target_role(conn) == TARGET_ROLE
        await _read_only(conn, PLANTED, plan_only)  # bump() ran at plan time, as afs_explain
        assert await conn.fetchval("SELECT current_user") == "postgres"  # the session is as it was
        assert await conn.fetchval("SELECT current_setting('transaction_read_only')") == "off"
    assert planted.untouched(sandbox)


def _plant_a_writer(settings: Settings, planted: Target) -> str:
    """As the attacker: public.scribble(), IMMUTABLE, calling a VOLATILE function that writes to
    the attacker's own table (which the attacker may do: only READ ONLY stops it)."""
    as_attacker = dsn_for(settings, planted.database, user=planted.attacker, password="attacker")
    with psycopg.connect(as_attacker, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.notes (at timestamptz)")
        conn.execute("CREATE FUNCTION public.write_note() RETURNS int VOLATILE LANGUAGE sql"
                     " AS $f$ INSERT INTO public.notes VALUES (now()) RETURNING 1 $f$")
        conn.execute("CREATE FUNCTION public.scribble() RETURNS int IMMUTABLE LANGUAGE plpgsql"
                     " AS $f$ BEGIN RETURN public.write_note(); END $f$")
    return as_attacker


async def test_without_the_role_the_plan_is_read_only_and_a_warning_says_what_is_lost(
        planted: Target, sandbox: SandboxServer, settings: Settings) -> None:
    """A connected role that may neither create afs_explain nor SET ROLE to it: the catalog
    check and READ ONLY still hold; a warning is logged."""
    as_attacker = _plant_a_writer(settings, planted)
    async with open_connection(as_attacker) as conn:
        assert await target_role(conn) is None
        with structlog.testing.capture_logs() as logs:
            await on_target(conn, "SELECT id FROM orders WHERE id = 1", plan_only)
            with pytest.raises(UnsafeSqlError, match="not built in"):
                await on_target(conn, "SELECT id FROM orders WHERE id = public.scribble()", plan_only)
            with pytest.raises(DatabaseError, match="read-only transaction"):  # past the gate
                await _read_only(conn, "SELECT id FROM orders WHERE id = public.scribble()", plan_only)
        assert await conn.fetchval("SELECT count(*) FROM public.notes") == 0
    warned = [e for e in logs if e["event"] == "target_role_unavailable"]
    assert warned and warned[0]["log_level"] == "warning" and warned[0]["role"] == TARGET_ROLE
    assert warned[0]["user"] == planted.attacker


async def test_a_low_privilege_role_with_more_rights_is_refused_not_used(
        planted: Target, sandbox: SandboxServer) -> None:
    """afs_explain made a member of pg_execute_server_program (by anyone who could): AFS will not
    plan as it, nor fall back to the superuser."""
    async with open_connection(planted.dsn) as conn:
        await target_role(conn)  # made if missing
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"GRANT pg_execute_server_program TO {TARGET_ROLE}")
    try:
        async with open_connection(planted.dsn) as conn:
            with pytest.raises(InputError, match="pg_execute_server_program"):
                await on_target(conn, "SELECT id FROM orders WHERE id = 1", plan_only)
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"REVOKE pg_execute_server_program FROM {TARGET_ROLE}")
