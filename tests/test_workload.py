"""`afs sandbox workload`: the demo shop's mixed workload on the embedded PostgreSQL, and what
pg_stat_statements (and so `afs batch`) makes of it."""

from __future__ import annotations

import json
import random
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
import trio

from afs.batch.statements import read_workload
from afs.config import DemoWorkload, Settings
from afs.db import open_connection
from afs.errors import InputError
from afs.sandbox.server import SandboxServer
from afs.sandbox.workload import SHAPES, pick, run_workload, skewed_id
from afs.testing import afs_command

SLOW = [s for s in SHAPES if s.kind == "slow"]


def _prefix(sql: str) -> str:
    """A shape's text up to its first parameter: how its pg_stat_statements entry starts."""
    return sql.split("%s")[0]


@pytest.fixture
def demo_without_statistics(sandbox: SandboxServer, settings: Settings) -> Iterator[str]:
    """The shared demo database, its pg_stat_statements dropped afterwards (as it was)."""
    dsn = sandbox.dsn(settings.demo_database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP EXTENSION IF EXISTS pg_stat_statements")
    try:
        yield dsn
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP EXTENSION IF EXISTS pg_stat_statements")


async def test_a_short_workload_fills_pg_stat_statements_and_the_slow_shapes_rank_first(
        demo_without_statistics: str) -> None:
    dsn = demo_without_statistics
    with psycopg.connect(dsn) as conn:
        before = conn.execute("SELECT count(*), sum(total_amount) FROM orders").fetchone()
    lines: list[str] = []
    report = await run_workload(dsn, DemoWorkload(duration_s=3, clients=3, seed=7), progress=lines.append)
    assert report.errors == 0 and report.statements > 0 and not report.interrupted
    assert 2.5 < report.seconds < 30
    assert lines and all("statements" in line and "/s" in line for line in lines)  # once a second
    ran = {s["name"]: s["calls"] for s in report.shapes}
    assert sum(ran.values()) == report.statements

    with psycopg.connect(dsn) as conn:
        after = conn.execute("SELECT count(*), sum(total_amount) FROM orders").fetchone()
        rows = conn.execute(
            "SELECT query, calls FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
            " WHERE datname = current_database())").fetchall()
    assert after == before  # the writes were rolled back: the demo data is as seeded
    for shape in SLOW:  # each slow shape is one normalised entry, with real bind parameters
        [(query, calls)] = [(q, c) for q, c in rows if q.startswith(_prefix(shape.sql))]
        assert "$1" in query and calls == ran[shape.name] > 0, shape.name
    assert not any(q.startswith("CREATE TABLE") for q, _ in rows)  # the seeding's entries were reset
    writes = [s for s in SHAPES if s.kind == "write"]
    assert any(q.startswith(_prefix(w.sql)) for q, _ in rows for w in writes)

    async with open_connection(dsn) as conn:
        workload = await read_workload(conn, top=5)
    first = workload.statements[0].query
    assert any(first.startswith(_prefix(s.sql)) for s in SLOW), first
    assert not any(s.query.startswith(("UPDATE", "INSERT")) for s in workload.statements)


async def test_the_workload_refuses_bad_options(sandbox: SandboxServer, settings: Settings) -> None:
    dsn = sandbox.dsn(settings.demo_database)
    with pytest.raises(InputError, match="--duration"):
        await run_workload(dsn, DemoWorkload(duration_s=0))
    with pytest.raises(InputError, match="--clients"):
        await run_workload(dsn, DemoWorkload(duration_s=1, clients=0))


def test_ids_are_skewed_like_the_demo_data_and_the_mix_is_mostly_fast() -> None:
    rng = random.Random(1)
    ids = [skewed_id(rng, 1000, 3.0) for _ in range(20_000)]
    assert min(ids) == 1 and max(ids) <= 1000
    counts = Counter(ids)
    assert counts[1] > 50 * max(1, counts[500])  # the head is hot, the middle cold
    assert sum(1 for i in ids if i <= 100) > 0.4 * len(ids)
    kinds = Counter(pick(rng).kind for _ in range(10_000))
    assert kinds["fast"] > 0.7 * 10_000 and 0.05 * 10_000 < kinds["slow"] < 0.2 * 10_000
    assert 0 < kinds["write"] < 0.1 * 10_000
    assert len(SLOW) == 4 and all(s.lacks for s in SLOW)


def _afs(*args: str) -> list[str | bytes]:
    return afs_command(*args)


async def test_cli_runs_the_workload_and_ctrl_c_stops_it_with_its_summary(
        demo_without_statistics: str) -> None:
    done = await trio.run_process(_afs("sandbox", "workload", "--duration", "1", "--clients", "2", "--json"),
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    doc = json.loads(done.stdout)
    assert doc["statements"] > 0 and doc["interrupted"] is False and doc["database"] == "afs_demo"
    assert {s["name"] for s in doc["shapes"]} == {s.name for s in SHAPES}

    bad = await trio.run_process(_afs("sandbox", "workload", "--clients", "0"), capture_stdout=True,
                                 capture_stderr=True, check=False)
    assert bad.returncode == 2 and b"--clients" in bad.stderr

    process = await trio.lowlevel.open_process(_afs("sandbox", "workload", "--duration", "120"),
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    try:
        with trio.fail_after(60):
            seen = b""
            while b"statements" not in seen:  # its first progress line
                seen += await process.stderr.receive_some()
        process.send_signal(signal.SIGINT)
        out = b""
        with trio.fail_after(30):
            while chunk := await process.stdout.receive_some():
                out += chunk
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 130
    assert b"stopped early" in out and b"orders_of_product" in out
