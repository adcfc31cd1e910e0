"""Replaying a table's statements in a fork (afs.batch.replay): the filling of writes (pure)
and the runs with and without an index on the embedded PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
import trio

from afs.batch.replay import (
    WorkStatement,
    fill_write,
    replay_one,
    write_cost,
    write_slots,
    write_target,
)
from afs.bench import StopRule
from afs.config import Settings
from afs.db import open_connection
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.models import ColumnInfo, ColumnStats, TableInfo
from afs.sandbox.server import SandboxServer


def test_write_target_only_single_writes() -> None:
    assert write_target("UPDATE orders SET status = $1 WHERE id = $2") == "orders"
    assert write_target('INSERT INTO "Shop".items (a) VALUES ($1)') == '"Shop".items'
    assert write_target("DELETE FROM public.t WHERE id = $1") == "public.t"
    assert write_target("SELECT * FROM t") is None
    assert write_target("WITH x AS (DELETE FROM t RETURNING *) INSERT INTO u SELECT * FROM x") is None
    assert write_target("UPDATE t SET a = 1; DELETE FROM t") is None
    assert write_target("not sql") is None


def test_write_slots_assignments_and_comparisons() -> None:
    slots = write_slots("UPDATE t SET a = $1, b = now() WHERE id = $2 AND $3 < c", "t")
    assert [(s.number, s.role, s.column) for s in slots] == [
        (1, "eq", "a"), (2, "eq", "id"), (3, "lower", "c")]
    insert = write_slots("INSERT INTO t (x, y) VALUES ($1, $2), ($3, lower($4))", "t")
    assert [(s.number, s.column) for s in insert[:3]] == [(1, "x"), (2, "y"), (3, "x")]
    assert insert[3].problem  # inside an expression: not filled
    assert write_slots("INSERT INTO t VALUES ($1)", "t")[0].problem  # no column list


def _table() -> TableInfo:
    stats = {"a": ColumnStats(null_frac=0.0, n_distinct=-1.0, histogram_bounds=("1", "5", "9")),
             "id": ColumnStats(null_frac=0.0, n_distinct=-1.0, histogram_bounds=("10", "20", "30"))}
    return TableInfo(name="t", rows=100, size_mb=1.0,
                     columns=(ColumnInfo("id", "bigint"), ColumnInfo("a", "integer")),
                     indexes=(), column_stats=stats)


def test_fill_write_from_statistics() -> None:
    values, reason = fill_write("UPDATE t SET a = $1 WHERE id = $2", "t", {"t": _table()})
    assert reason is None and values == {1: "5", 2: "20"}
    none, why = fill_write("UPDATE t SET a = $1 WHERE b = $2", "t", {"t": _table()})
    assert none is None and why and "b" in why


@pytest.fixture(scope="module")
def replay_db(sandbox: SandboxServer) -> Iterator[str]:
    name = "afs_rp_t_" + os.urandom(4).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    provider = LocalForkProvider(sandbox.dsn())
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, a int NOT NULL, c text NOT NULL);"
                         "INSERT INTO t SELECT g, g % 500, md5(g::text) FROM generate_series(1, 30000) g;"
                         "CREATE INDEX t_a ON t (a); CREATE INDEX t_c ON t (c); ANALYZE t;"
                         "CREATE TABLE line (tid bigint REFERENCES t, n int, q int, PRIMARY KEY (tid, n));"
                         "INSERT INTO line SELECT g, 1, 1 FROM generate_series(1, 1000) g;"
                         "CREATE INDEX line_q ON line (q); ANALYZE line")
        trio.run(provider.register_source, name, "test:replay")
        yield name
    finally:
        try:
            trio.run(provider.drop_source, name)
        finally:
            with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_replay_in_a_fork(replay_db: str, forks: ForkClient, settings: Settings,
                                no_leaked_forks: None) -> None:
    rule = StopRule.of(settings.measuring)
    # the filled key collides with a row of the table: the replay writes a key past the largest
    insert = WorkStatement(1, "INSERT INTO t (id, a, c) VALUES ($1, $2, $3)",
                           "INSERT INTO t (id, a, c) VALUES (20, 5, 'x')", "write", "t", 100, 50.0,
                           ((1, "20"), (2, "5"), (3, "'x'")))
    read = WorkStatement(2, "SELECT id FROM t WHERE a = $1", "SELECT id FROM t WHERE a = 7", "read", "t",
                         100, 50.0)
    untouched = WorkStatement(3, "SELECT id FROM t WHERE id = $1", "SELECT id FROM t WHERE id = 7", "read",
                              "t", 100, 5.0)
    async with forks.open_fork(replay_db) as fork, open_connection(fork.dsn) as conn:
        wrote = await replay_one(conn, insert, ("public.t_c",), rule)
        slower = await replay_one(conn, read, ("public.t_a",), rule)
        same = await replay_one(conn, untouched, ("public.t_a",), rule)
        # a composite key: its last integer column goes past the largest, the foreign key stays valid
        line = await replay_one(conn, WorkStatement(
            4, "INSERT INTO line (tid, n, q) VALUES ($1, $2, $3)",
            "INSERT INTO line (tid, n, q) VALUES (5, 1, 1)",
            "write", "line", 10, 1.0, ((1, "5"), (2, "1"), (3, "1"))), ("public.line_q",), rule)
        rows = await conn.fetchval("SELECT count(*) FROM t")
    assert wrote.note == "" and wrote.with_index is not None and wrote.without_index is not None
    assert wrote.with_index.runs >= settings.measuring.min_runs and wrote.repeats >= 1
    cost = write_cost([wrote], 86_400.0)
    assert cost["writes_per_day"] == 100 and cost["measured"][0]["statement"] == insert.statement
    assert slower.plan_changed and slower.slower_without and slower.delta_ms > 0
    assert not same.plan_changed and same.with_index is None and not same.slower_without
    assert rows == 30000  # every run rolled back
    assert line.note == "" and line.with_index is not None
