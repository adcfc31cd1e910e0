"""Forks measure in the user's conditions (issue 29): the user's plan settings in every fork,
the same plan as the user's server or a warning, the copy's visibility map, a stale copy named.

The user's server is a SECOND embedded PostgreSQL with non-default planner settings
(work_mem 16MB, random_page_cost 1.1 for its database, enable_hashjoin off for a role): its
database is imported into the test sandbox (4MB work_mem), forked, and optimized.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from afs.brains import Squad
from afs.conditions import carry_settings, read_source_settings, task_conditions
from afs.config import Settings, load_settings
from afs.db import open_connection
from afs.errors import InputError
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.models import AgentKey, EstimatedImpact, OptimizationProposal, TableState
from afs.optimize import Crew, TaskRequest, optimize
from afs.pg.plan import plan_of, plan_shape, shape_differences
from afs.pg.settings import alter_database_sql, carry, is_plan_setting, overlay, server_gaps
from afs.report import render_text, to_json
from afs.router import load_rules
from afs.sandbox.importer import import_database, import_owner
from afs.sandbox.server import SandboxServer
from afs.testing import ScriptedBrain

USER_DB = "uc_shop"
# a hashed subplan needs rows * (8 + 24) bytes = 16 MB of hash memory for b's 500,000 rows: it fits
# in work_mem 16MB (x hash_mem_multiplier 2), not in the default 4MB
NOT_IN = "SELECT count(*) FROM a WHERE id NOT IN (SELECT x FROM b)"
# stale statistics on the user's server (autovacuum off, analysed when c held 1..10 only)
STALE = "SELECT c.id, a.id FROM c JOIN a ON a.id = c.k WHERE c.k > 500"


# -- pure: shapes and settings ------------------------------------------------------------------
def _node(node_type: str, **extra: object) -> dict[str, object]:
    return {"Node Type": node_type, "Total Cost": 1.0, "Plan Rows": 5, **extra}


def test_a_shape_keeps_what_the_planner_chose_and_drops_its_numbers() -> None:
    inner = _node("Seq Scan", **{"Relation Name": "b", "Subplan Name": "SubPlan 1"})
    hashed = _node("Aggregate", Strategy="Plain", Plans=[
        _node("Seq Scan", **{"Relation Name": "a", "Filter": "(NOT (ANY (id = (hashed SubPlan 1).col1)))",
                             "Plans": [inner]})])
    per_row = _node("Aggregate", Strategy="Plain", Plans=[
        _node("Index Only Scan", **{"Relation Name": "a", "Index Name": "a_pkey",
                                    "Filter": "(NOT (ANY (id = (SubPlan 1).col1)))", "Plans": [
                                        _node("Materialize", **{"Subplan Name": "SubPlan 1", "Plans": [
                                            _node("Seq Scan", **{"Relation Name": "b"})]})]})])
    assert plan_shape(hashed) == ("Plain Aggregate", "  Seq Scan on a",
                                  "    [hashed SubPlan 1] Seq Scan on b")
    assert plan_shape({**hashed, "Total Cost": 99.0, "Plan Rows": 7}) == plan_shape(hashed)
    assert "    [SubPlan 1] Materialize" in plan_shape(per_row)
    differences = shape_differences(plan_shape(hashed), plan_shape(per_row))
    assert "source: [hashed SubPlan 1] Seq Scan on b" in differences
    assert "fork: Index Only Scan using a_pkey on a" in differences
    assert shape_differences(plan_shape(hashed), plan_shape(hashed)) == ()


def test_only_plan_settings_are_carried_and_only_as_session_settings() -> None:
    assert is_plan_setting("work_mem") and is_plan_setting("enable_hashjoin")
    assert is_plan_setting("cpu_operator_cost") and not is_plan_setting("shared_buffers")
    assert not is_plan_setting("search_path") and not is_plan_setting("enable_x; DROP TABLE t")
    carried, gaps = carry({"work_mem": "16MB", "enable_futurescan": "off", "jit_above_cost": "1",
                           "search_path": "evil"},
                          {"work_mem": "user", "jit_above_cost": "superuser"})
    assert carried == {"work_mem": "16MB"}
    assert [(g.name, g.source) for g in gaps] == [("enable_futurescan", "off"), ("jit_above_cost", "1")]
    assert alter_database_sql("f", "work_mem", "1'; DROP") == \
        """ALTER DATABASE "f" SET work_mem = '1''; DROP'"""
    with pytest.raises(ValueError):
        alter_database_sql("f", "search_path", "x")
    assert overlay({"work_mem": "4MB"}, [["work_mem=8MB"], ["work_mem=16MB", "search_path=x"]]) == \
        {"work_mem": "16MB"}
    assert [g.name for g in server_gaps({"server_version": "16.4", "shared_buffers": "8GB"},
                                        {"server_version": "18.6", "shared_buffers": "256MB"})] == \
        ["server_version", "shared_buffers"]
    assert server_gaps({"server_version": "18.1"}, {"server_version": "18.6"}) == ()


# -- the user's server --------------------------------------------------------------------------
def _vacuum(conn: psycopg.Connection[tuple[object, ...]], *tables: str) -> None:
    """VACUUM (ANALYZE), every page all-visible (the session commits synchronously: VACUUM sets
    no all-visible bit on rows whose commit is not flushed yet, and the server's default is off)."""
    for table in tables:
        conn.execute(f"VACUUM (ANALYZE) {table}")
        pages, visible = conn.execute("SELECT relpages, relallvisible FROM pg_class WHERE oid = %s::regclass",
                                      (table,)).fetchone()  # type: ignore[misc]
        assert visible == pages, (table, pages, visible)


@pytest.fixture(scope="module")
def user_dsn() -> Iterator[str]:
    """A second embedded cluster, the user's server: work_mem 16MB and shared_buffers 128MB (the
    sandbox's: 256MB) for the server, random_page_cost 1.1 for its database, enable_hashjoin off
    for the role `app` in it; stopped with pg_ctl after."""
    home = Path(tempfile.mkdtemp(prefix="afs-u-"))
    server = SandboxServer(load_settings({"AFS_HOME": str(home)}))
    try:
        server.start()
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET work_mem = '16MB'")
            conn.execute("ALTER SYSTEM SET shared_buffers = '128MB'")  # no fork can take it
        server.stop()
        server.start()
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {USER_DB}")
            conn.execute(f"ALTER DATABASE {USER_DB} SET random_page_cost = 1.1")
            conn.execute("CREATE ROLE app LOGIN")
            conn.execute(f"ALTER ROLE app IN DATABASE {USER_DB} SET enable_hashjoin = off")
        with psycopg.connect(server.dsn(USER_DB), autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            conn.execute("CREATE TABLE a (id int PRIMARY KEY, note text)")
            conn.execute("INSERT INTO a SELECT g, 'n' || g FROM generate_series(1, 100000) g")
            conn.execute("CREATE TABLE b (x int)")
            conn.execute("INSERT INTO b SELECT g * 2 FROM generate_series(1, 500000) g")
            conn.execute("CREATE TABLE c (id int, k int) WITH (autovacuum_enabled = off)")
            conn.execute("INSERT INTO c SELECT g, g % 10 + 1 FROM generate_series(1, 1000) g")
            _vacuum(conn, "a", "b", "c")
            conn.execute("INSERT INTO c SELECT g, 1000 + g % 50000 FROM generate_series(1, 200000) g")
        yield server.dsn(USER_DB)
    finally:
        try:
            server.destroy()  # pg_ctl stop, then the data directory
        finally:
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def imported(user_dsn: str, sandbox: SandboxServer) -> Iterator[str]:
    """The user's database imported into the test sandbox (dropped after)."""
    import trio

    trio.run(import_database, sandbox, user_dsn, USER_DB)
    try:
        yield USER_DB
    finally:
        trio.run(LocalForkProvider(sandbox.dsn()).drop_source, USER_DB)


def _shape(dsn: str, query: str, *settings: str) -> tuple[str, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in settings:
            conn.execute(setting)
        return plan_shape(plan_of(conn.execute(f"EXPLAIN (FORMAT JSON) {query}").fetchone()[0]))  # type: ignore[index]


def _source_ms(dsn: str, query: str) -> float:
    """The query's execution time on the user's server (the median of 3, after a warm-up)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        times = [float(conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}").fetchone()[0][0]  # type: ignore[index]
                       ["Execution Time"]) for _ in range(4)][1:]
    return sorted(times)[1]


def _hashed(shape: tuple[str, ...]) -> bool:
    return any("[hashed SubPlan" in line for line in shape)


async def test_settings_are_read_for_the_application_role(user_dsn: str) -> None:
    async with open_connection(user_dsn) as conn:
        mine = await read_source_settings(conn)
        app = await read_source_settings(conn, "app")
    assert mine["work_mem"] == "16MB" and mine["random_page_cost"] == "1.1"
    assert mine["enable_hashjoin"] == "on" and app["enable_hashjoin"] == "off"
    assert app["random_page_cost"] == "1.1"


async def test_a_fork_plans_the_hashed_subplan_as_the_user_server_does(
        user_dsn: str, imported: str, sandbox: SandboxServer, provider: LocalForkProvider) -> None:
    source = _shape(user_dsn, NOT_IN)
    assert _hashed(source)
    # the sandbox's own work_mem (4MB) plans it per row: the case of the issue
    with psycopg.connect(sandbox.dsn("postgres")) as conn:
        default = conn.execute("SHOW work_mem").fetchone()
    assert default == ("4MB",)
    assert not _hashed(_shape(sandbox.dsn(imported), NOT_IN, "SET work_mem = '4MB'"))
    fork = await provider.fork(imported)
    try:
        assert _shape(fork.dsn, NOT_IN) == source  # every session of the fork, as its own role
        with psycopg.connect(fork.dsn, autocommit=True) as conn:
            assert conn.execute("SHOW work_mem").fetchone() == ("16MB",)
            assert conn.execute("SHOW random_page_cost").fetchone() == ("1.1",)
    finally:
        await provider.delete(fork.name)


async def test_the_copy_is_vacuumed_like_the_user_server(imported: str, provider: LocalForkProvider,
                                                         sandbox: SandboxServer) -> None:
    record = (await provider.get_service(imported))["copy_state"]
    assert record["imported_at"]
    b = record["tables"]["public.b"]
    # a visibility map, as on the source (a restore leaves a few new pages at the end, which
    # VACUUM does not mark: 2213 of 2256 here)
    assert b["pages"] > 0 and b["all_visible"] / b["pages"] > 0.95
    assert b["source_all_visible"] == b["source_pages"]
    assert record["settings"]["work_mem"] == "16MB"
    with psycopg.connect(sandbox.dsn(imported)) as conn:
        pages, visible = conn.execute("SELECT relpages, relallvisible FROM pg_class"
                                      " WHERE relname = 'b'").fetchone()  # type: ignore[misc]
    assert visible / pages > 0.95


async def test_a_setting_the_sandbox_cannot_take_is_a_gap_with_both_values(
        sandbox: SandboxServer, provider: LocalForkProvider) -> None:
    fork = await provider.fork("afs_demo")
    try:
        async with open_connection(fork.dsn) as conn:
            carried, gaps = await carry_settings(conn, fork.name, {
                "work_mem": "12MB", "enable_futurescan": "off", "random_page_cost": "fast"})
        assert carried == {"work_mem": "12MB"}
        by_name = {g.name: g for g in gaps}
        assert by_name["enable_futurescan"].sandbox is None
        assert by_name["random_page_cost"].sandbox == "4" and "refused" in by_name["random_page_cost"].reason
        with psycopg.connect(fork.dsn, autocommit=True) as conn:
            assert conn.execute("SHOW work_mem").fetchone() == ("12MB",)
    finally:
        await provider.delete(fork.name)


def _not_exists(agent: AgentKey) -> OptimizationProposal:
    """The issue's rewrite (b.x has no NULLs: the same rows)."""
    return OptimizationProposal(
        agent=agent, proposal_type="query_rewrite", sql_commands=(), rollback_commands=(),
        rationale="NOT EXISTS plans a hashed anti-join whatever work_mem is",
        estimated_impact=EstimatedImpact(50, 0.0, "low", "low"),
        rewritten_query="SELECT count(*) FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.x = a.id)")


def _index_on_c(agent: AgentKey) -> OptimizationProposal:
    return OptimizationProposal(
        agent=agent, proposal_type="index", sql_commands=("CREATE INDEX afs_c_k ON c (k)",),
        rollback_commands=("DROP INDEX IF EXISTS afs_c_k",), rationale="the filter and join key",
        estimated_impact=EstimatedImpact(50, 5.0, "low", "low"))


async def _optimize(settings: Settings, forks: ForkClient, user_dsn: str, query: str,
                    script: Callable[[AgentKey], OptimizationProposal]) -> dict[str, object]:
    events = Emitter("uc" + os.urandom(3).hex())
    brain = ScriptedBrain(script)
    squad = Squad(brain_for=lambda agent: brain, provider="scripted", agents=("gemini20flash",))
    result = await optimize(settings, TaskRequest(query=query, runs=3), source=USER_DB,
                            source_dsn=user_dsn, crew=Crew(forks=forks, squad=squad, rules=load_rules(None)),
                            events=events)
    text = render_text(result)
    print(f"\n$ afs optimize --dsn <user's server> --query {query!r}\n{text}")  # the figures
    return {"doc": to_json(result), "text": text}


@pytest.mark.usefixtures("no_leaked_forks")
async def test_optimize_measures_the_not_in_query_as_the_user_server_plans_it(
        settings: Settings, forks: ForkClient, user_dsn: str, imported: str) -> None:
    report = await _optimize(settings, forks, user_dsn, NOT_IN, _not_exists)
    doc = report["doc"]
    assert isinstance(doc, dict)
    assert doc["plan_matches_source"] is True, doc["plan_differences"]
    proposal = doc["proposals"][0]
    assert _hashed(tuple(proposal["plan_check"]["fork_shape"]))
    assert proposal["plan_check"]["carried_settings"]["work_mem"] == "16MB"
    assert proposal["benchmarks"], proposal
    on_source = _source_ms(user_dsn, NOT_IN)
    print(f"the query on the user's server: {on_source:.1f} ms (median of 3, EXPLAIN ANALYZE)")
    for m in proposal["benchmarks"]:  # the baseline is the hashed plan's: no rewrite 100s of times faster
        assert m["baseline_ms"] < 4 * on_source + 100, (m["baseline_ms"], on_source)
        assert m["baseline_ms"] / max(m["optimized_ms"], 0.001) < 10
    assert "WARNING" not in str(report["text"])
    # what no fork can take is listed with both values
    assert "  shared_buffers: 128MB / 256MB (a server setting" in str(report["text"])
    gap = {"name": "shared_buffers", "source": "128MB", "sandbox": "256MB",
           "reason": "a server setting: the sandbox's server has its own"}
    assert gap in doc["conditions"]["not_carried"]


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_plan_that_differs_from_the_user_server_is_the_report_headline(
        settings: Settings, forks: ForkClient, user_dsn: str, imported: str) -> None:
    # statistics are not carried: the user's server planned with a sample taken before c grew
    report = await _optimize(settings, forks, user_dsn, STALE, _index_on_c)
    doc, text = report["doc"], str(report["text"])
    assert isinstance(doc, dict)
    assert doc["plan_matches_source"] is False and doc["plan_differences"]
    head = text.split("\n[")[0]  # before the first agent's section
    assert "WARNING: the forks planned this query otherwise than your server" in head
    assert "plan on your server:" in head and "plan in the fork:" in head
    proposal = doc["proposals"][0]
    assert proposal["benchmarks"], proposal
    if proposal["benchmarks"]:  # every speedup carries the warning
        rows = [line for line in text.splitlines() if line.strip().startswith(("baseline", "limit", "sort"))]
        assert rows and all(line.rstrip().endswith("!") or " ! " in line for line in rows), rows
    if doc["winner"]:
        assert "may not hold there" in text.split("winner:")[1].splitlines()[0]
    assert proposal["plan_check"]["matches"] is False


async def test_a_function_planted_in_the_user_database_is_not_called(
        forks: ForkClient, user_dsn: str, imported: str) -> None:
    # an exact match for pg_relation_size(c.oid) (the catalog's takes regclass): without a pinned
    # search_path, AFS's read of the tables' sizes would run it with AFS's rights
    with psycopg.connect(user_dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION public.pg_relation_size(oid) RETURNS bigint LANGUAGE plpgsql"
                     " AS $$BEGIN RAISE EXCEPTION 'planted function ran'; END$$")
    try:
        conditions = await task_conditions(await forks.get(USER_DB), user_dsn, NOT_IN, ("a", "b"), None)
        assert not any("could not" in note for note in conditions.notes), conditions.notes
        assert {t.name for t in conditions.tables} == {"public.a", "public.b"}
    finally:
        with psycopg.connect(user_dsn, autocommit=True) as conn:
            conn.execute("DROP FUNCTION public.pg_relation_size(oid)")


async def test_a_stale_copy_and_another_visibility_are_named(
        forks: ForkClient, user_dsn: str, imported: str) -> None:
    # c grew on the user's server after the import; its pages were never vacuumed there
    # (c stays grown: the next test refreshes the copy)
    with psycopg.connect(user_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO c SELECT g, 1000 + g FROM generate_series(1, 100000) g")
    conditions = await task_conditions(await forks.get(USER_DB), user_dsn, STALE, ("c", "a"), None)
    assert conditions.imported_at
    assert any(line.startswith("public.c: ") for line in conditions.stale), conditions.stale
    assert not any(line.startswith("public.a: ") for line in conditions.stale)
    assert any(line.startswith("public.c: ") for line in conditions.unsettled), conditions.tables
    states = {t.name: t for t in conditions.tables}
    assert isinstance(states["public.c"], TableState) and (states["public.c"].copy_all_visible or 0) > 0.95


def test_the_settings_module_is_pure() -> None:
    import ast

    import afs.pg.settings

    tree = ast.parse(Path(afs.pg.settings.__file__).read_text())
    imported = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "re", "collections", "typing", "afs"}, imported


def test_the_report_names_what_the_forks_could_not_take_with_both_values() -> None:
    from afs.models import AgentOutcome, PlanCheck, RoutingDecision, SettingGap, TaskResult, UserConditions

    check = PlanCheck(matches=True, source_shape=("Seq Scan on a",), fork_shape=("Seq Scan on a",),
                      carried={"work_mem": "16MB"},
                      gaps=(SettingGap("shared_buffers", "8GB", "256MB", "a server setting"),))
    conditions = UserConditions(
        carried={"work_mem": "16MB"}, imported_at="2026-11-27T12:00:00+00:00",
        stale=("c: 10.4 MB on the source, 7.1 MB in the copy (-31%, more than 20%)",),
        unsettled=("c: 0% of its pages all-visible on the source, 98% in the copy (…)",))
    result = TaskResult(task_id="t", status="no_improvement", query="SELECT 1 FROM a", source="s",
                        routing=RoutingDecision(agents=("gemini25pro",), rationale=("fixed",)),
                        outcomes=(AgentOutcome(agent="gemini25pro", status="ok", plan_check=check),),
                        decision=None, provider="heuristic", provider_note="", duration_s=1.0,
                        conditions=conditions)
    text = render_text(result)
    assert "  shared_buffers: 8GB / 256MB (a server setting)" in text
    assert "copy: imported 2026-11-27T12:00:00+00:00" in text
    assert "the copy is stale" in text and "c: 10.4 MB on the source" in text
    assert "visibility differs from your server's" in text
    assert "WARNING" not in text
    doc = to_json(result)
    assert doc["plan_matches_source"] is True
    assert doc["conditions"]["not_carried"] == [
        {"name": "shared_buffers", "source": "8GB", "sandbox": "256MB", "reason": "a server setting"}]


async def test_refresh_brings_a_stale_copy_up_to_date(
        forks: ForkClient, user_dsn: str, imported: str, sandbox: SandboxServer,
        provider: LocalForkProvider) -> None:
    with pytest.raises(InputError, match="was imported from"):
        await import_database(sandbox, sandbox.dsn("afs_demo"), imported, refresh=True)
    with pytest.raises(InputError, match="not an import"):
        await import_database(sandbox, user_dsn, "uc_nothing", refresh=True)
    with pytest.raises(InputError, match="--refresh"):
        await import_database(sandbox, user_dsn, imported)
    assert (await task_conditions(await forks.get(USER_DB), user_dsn, STALE, ("c",), None)).stale
    await import_database(sandbox, user_dsn, imported, refresh=True)
    conditions = await task_conditions(await forks.get(USER_DB), user_dsn, STALE, ("c",), None)
    assert not conditions.stale, conditions.stale
    fork = await provider.fork(imported)
    try:
        with psycopg.connect(fork.dsn) as conn:
            assert conn.execute("SELECT count(*) FROM c").fetchone() == (301000,)
            assert conn.execute("SHOW work_mem").fetchone() == ("16MB",)
    finally:
        await provider.delete(fork.name)
    async with open_connection(sandbox.dsn()) as conn:
        owners = await conn.fetchall("SELECT rolname FROM pg_roles WHERE rolname LIKE 'afs\\_import\\_uc%%'")
    assert owners == [(import_owner(imported),)]
