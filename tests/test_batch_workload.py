"""The batch's reading of the workload and its parameters: pg_stat_statements of one
database on the embedded PostgreSQL (preloaded by the sandbox), pg_stats, EXPLAIN."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from afs.batch.fill import fill_statement
from afs.batch.job import BatchOptions, run_batch
from afs.batch.statements import BatchTarget, read_workload, select_workload, why_not
from afs.config import BATCH_PARAMETER_SETS, Settings
from afs.db import open_connection
from afs.errors import InputError
from afs.forks.provider import LocalForkProvider
from afs.models import ColumnInfo, ColumnStats, TableInfo
from afs.params.fill import fill, slots, substitute
from afs.sandbox.importer import import_database, origin_of, sandbox_source
from afs.sandbox.server import SandboxServer, dsn_for
from afs.service.worker import open_runtime, worker_name

SLOW = "SELECT id, total FROM shop_orders WHERE customer = {c} AND state = '{s}' ORDER BY placed DESC"
FAST = "SELECT count(*) FROM shop_orders WHERE id = {i}"


@pytest.fixture
def workload_db(sandbox: SandboxServer) -> Iterator[str]:
    """A database with pg_stat_statements created, a table, its statistics and a workload."""
    name = "afs_batch_t_" + os.urandom(4).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute("CREATE TABLE shop_orders (id bigint PRIMARY KEY, customer integer NOT NULL,"
                         " state text NOT NULL, total numeric(10,2), placed timestamptz NOT NULL)")
            conn.execute("INSERT INTO shop_orders SELECT g, g % 500, (ARRAY['new','paid','sent'])[g % 3 + 1],"
                         " g % 97, '2026-01-01'::timestamptz + g * interval '1 minute'"
                         " FROM generate_series(1, 20000) g")
            conn.execute("ANALYZE shop_orders")
            for i in range(30):
                conn.execute(SLOW.format(c=i, s="paid").encode())
            for i in range(3):
                conn.execute(FAST.format(i=i).encode())
            conn.execute("UPDATE shop_orders SET total = total WHERE id = 1")
            for _ in range(3):
                conn.execute("SELECT count(*) FROM pg_attribute a CROSS JOIN pg_class c")
        with psycopg.connect(sandbox.dsn(), autocommit=True) as other:  # another database's statement
            for _ in range(50):
                other.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'zz%'")
        yield sandbox.dsn(name)
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_the_workload_is_this_databases_selects_ranked_by_total_time(workload_db: str) -> None:
    async with open_connection(workload_db) as conn:
        workload = await read_workload(conn, top=5)
        kept = [s.query for s in workload.statements]
        assert kept and all("shop_orders" in q for q in kept)  # no other database's statement
        assert "$1" in kept[0] and "$2" in kept[0]  # normalised
        slow = next(s for s in workload.statements if "ORDER BY placed" in s.query)
        assert slow.calls == 30 and slow.total_ms > 0 and slow.mean_ms == pytest.approx(
            slow.total_ms / slow.calls, rel=1e-6)
        totals = [s.total_ms for s in workload.statements]
        assert totals == sorted(totals, reverse=True)
        reasons = {s.query.split()[0].upper(): s.reason for s in workload.skipped}
        assert "UPDATE" in reasons or "CREATE" in reasons or "INSERT" in reasons
        assert any("pg_class" in s.query and "system" in s.reason for s in workload.skipped)
        few = await read_workload(conn, top=5, min_calls=10)
        assert [s.query for s in few.statements] == [slow.query] and few.below_thresholds > 0
        one = await read_workload(conn, top=1)
        assert len(one.statements) == 1


async def test_parameters_are_filled_from_pg_stats_and_the_filled_queries_plan(workload_db: str) -> None:
    async with open_connection(workload_db) as conn:
        workload = await read_workload(conn, top=5, min_calls=10)
        statement = workload.statements[0]
        filled = await fill_statement(conn, statement.query, count=3)
        assert filled.reason is None and len(filled.sets) >= 2
        for pset in filled.sets:
            assert "$" not in pset.query
            rows = await conn.fetchall(pset.query)  # a representative value finds rows
            assert rows, pset.label
            assert pset.values[2].strip("'") in ("new", "paid", "sent")  # a common value of state
        assert len({s.query for s in filled.sets}) == len(filled.sets)
        bad = await fill_statement(conn, "SELECT id FROM shop_orders WHERE id + $1 = 3", BATCH_PARAMETER_SETS)
        assert bad.sets == () and bad.reason is not None and "$1" in bad.reason
        unplanned = await fill_statement(conn, "SELECT id FROM shop_orders WHERE nothing = $1",
                                         BATCH_PARAMETER_SETS)
        # the catalog check resolves it before it is planned (afs.target.on_target): either says why
        assert unplanned.sets == () and "GENERIC_PLAN" not in (unplanned.reason or "x") and \
            "nothing" in (unplanned.reason or "") and ("does not plan" in (unplanned.reason or "")
                                                       or "does not run" in (unplanned.reason or ""))


async def test_a_role_without_pg_read_all_stats_is_told_why_it_sees_no_text(
        workload_db: str, settings: Settings, sandbox: SandboxServer) -> None:
    database = psycopg.conninfo.conninfo_to_dict(workload_db)["dbname"]
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute("CREATE ROLE afs_batch_reader LOGIN PASSWORD 'reader'")
    try:
        reader = dsn_for(settings, str(database), user="afs_batch_reader", password="reader")
        async with open_connection(reader) as conn:
            workload = await read_workload(conn, top=3)
        assert workload.statements == ()
        assert workload.skipped and all("pg_read_all_stats" in s.reason for s in workload.skipped)
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute("DROP ROLE afs_batch_reader")


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_batch_on_a_dsn_runs_its_tasks_on_the_databases_copy_in_the_sandbox(
        workload_db: str, settings: Settings, sandbox: SandboxServer, store_db: str,
        provider: LocalForkProvider) -> None:
    copy = "afs_batch_copy_" + os.urandom(3).hex()
    await import_database(sandbox, workload_db, copy)
    try:
        async with open_runtime(settings, store_db) as rt:
            source = await sandbox_source(rt.forks, settings.demo_database, workload_db)
            assert source == copy
            doc = await run_batch(rt, BatchTarget(workload_db, source, workload_db),
                                  options=BatchOptions(top=1, min_calls=10, provider="heuristic", runs=1),
                                  worker=worker_name("batch"))
            [entry] = doc["statements"]
            assert entry["calls"] == 30 and "ORDER BY placed" in entry["query"]
            task = await rt.store.get(entry["task_id"])
            assert task.source == copy and task.finished and task.query == entry["filled_query"]
            assert doc["origin"] == origin_of(workload_db)
    finally:
        await provider.drop_source(copy)


async def test_a_database_without_the_extension_is_refused_saying_how_to_fix_it(
        sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn()) as conn:  # postgres: not created there
        with pytest.raises(InputError, match="CREATE EXTENSION pg_stat_statements"):
            await read_workload(conn, top=3)
        with pytest.raises(InputError, match="--top"):
            await read_workload(conn, top=0)


# -- pure ---------------------------------------------------------------------------------
def test_select_workload_keeps_selects_and_says_why_not_the_others() -> None:
    rows = [
        (1, "UPDATE t SET a = $1", 9, 900.0, 100.0, 9),
        (2, "SELECT a FROM t WHERE b = $1", 50, 500.0, 10.0, 50),
        (3, "<insufficient privilege>", 4, 400.0, 100.0, 4),
        (4, "SELECT a FROM t WHERE c = $1", 2, 300.0, 150.0, 2),
        (5, "SELECT 1", 99, 200.0, 2.0, 99),
        (6, "SELECT a FROM t WHERE d = $1", 80, 100.0, 1.25, 80),
    ]
    w = select_workload("db", rows, top=2, min_calls=3)
    assert [s.queryid for s in w.statements] == [2, 6]
    why = [(s.queryid, s.reason.split()[0]) for s in w.skipped]
    assert why == [(1, "refused"), (3, "query"), (5, "reads")]
    assert "pg_read_all_stats" in w.skipped[1].reason
    assert w.below_thresholds == 1
    assert [s.queryid for s in select_workload("db", rows, top=9, min_mean_ms=50).statements] == [4]
    assert why_not("SELECT a FROM t FOR UPDATE") is not None
    with pytest.raises(InputError):
        select_workload("db", rows, top=0)


def _table() -> TableInfo:
    return TableInfo(
        name="t", rows=1000, size_mb=1.0,
        columns=(ColumnInfo("id", "bigint"), ColumnInfo("kind", "text"), ColumnInfo("at", "date")),
        indexes=(),
        column_stats={
            "kind": ColumnStats(most_common_vals=("rare", "often"), most_common_freqs=(0.1, 0.6)),
            "id": ColumnStats(histogram_bounds=tuple(str(i) for i in range(0, 1001, 100))),
            "at": ColumnStats(histogram_bounds=("2026-01-01", "2026-02-01", "2026-03-01", "2026-04-01",
                                                "2026-05-01")),
        })


def test_fill_takes_common_values_for_equalities_and_percentiles_for_ranges() -> None:
    query = ("SELECT x.id FROM t x WHERE x.kind = $1 AND x.at BETWEEN $2 AND $3 AND id > $4"
             " AND kind IN ($5, $6) LIMIT $7")
    found = {s.number: (s.role, s.table, s.column) for s in slots(query, {"t": _table()})}
    assert found[1] == ("eq", "t", "kind") and found[4] == ("lower", "t", "id")
    assert found[2][0] == "lower" and found[3][0] == "upper" and found[7][0] == "limit"
    filled = fill(query, {"t": _table()}, count=2)
    assert filled.reason is None and len(filled.sets) == 2
    first = filled.sets[0].values
    assert first[1] == "'often'" and first[2] == "'2026-02-01'" and first[3] == "'2026-04-01'"
    assert first[4] == "200"  # the 25th percentile of id, unquoted: a number
    assert filled.sets[1].values[1] == "'rare'"
    assert first[7] == "100"
    assert filled.sets[0].query.endswith("LIMIT 100")


def test_fill_says_which_parameter_cannot_be_filled() -> None:
    assert fill("SELECT id FROM t WHERE other = $1", {"t": _table()}, BATCH_PARAMETER_SETS).reason == \
        "$1: cannot tell which table's column other it is"
    no_stats = TableInfo(name="u", rows=1, size_mb=0, columns=(ColumnInfo("v", "text"),), indexes=())
    reason = fill("SELECT v FROM u WHERE v = $1", {"u": no_stats}, BATCH_PARAMETER_SETS).reason
    assert "u.v has no statistics" in (reason or "")
    reason = fill("SELECT id FROM t WHERE lower(kind) = $1", {"t": _table()}, BATCH_PARAMETER_SETS).reason
    assert reason is not None and "$1" in reason and "not a column" in reason
    reason = fill("SELECT id FROM t WHERE coalesce($1, 0) > 3", {"t": _table()}, BATCH_PARAMETER_SETS).reason
    assert reason is not None and "$1" in reason


def test_substitute_leaves_strings_and_comments_alone() -> None:
    assert substitute("SELECT '$1', $1 /* $1 */ FROM t WHERE a = $12", {1: "7", 12: "'x'"}) == \
        "SELECT '$1', 7 /* $1 */ FROM t WHERE a = 'x'"


def test_a_normalised_typed_literal_is_written_as_a_cast() -> None:
    from afs.params.fill import typed_parameters

    assert typed_parameters("SELECT 1 FROM t WHERE at > now() - interval $2 AND d = date $10") == \
        "SELECT 1 FROM t WHERE at > now() - $2::interval AND d = $10::date"
