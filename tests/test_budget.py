"""One set under a storage budget (issue 28 item 3): the sizes, the exact selection checked
against every subset (and the dynamic programme against the exhaustive search), drops that
free room, what is left out and why; then a chosen set measured together in one fork of a
database with a workload in pg_stat_statements (the real provider over MCP)."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator

import psycopg
import pytest
import trio
from psycopg.types.numeric import Int8

from afs.batch import budget
from afs.batch.budget import Item, candidates, choose, measure_set, parse_size
from afs.batch.indexes import Verifying
from afs.batch.report import Entry, build_report
from afs.batch.statements import read_counters
from afs.config import Settings
from afs.db import open_connection
from afs.errors import InputError
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.sandbox.server import SandboxServer


def test_sizes_read_as_postgresql_counts_them() -> None:
    assert parse_size("500MB") == 500.0
    assert parse_size("2GB") == 2048.0
    assert parse_size("1.5 g") == 1536.0
    assert parse_size("512kB") == 0.5
    assert parse_size("1TB") == 1048576.0
    assert parse_size("40") == 40.0
    for bad in ("", "2 GiB", "-1GB", "lots", "1e3MB"):
        with pytest.raises(InputError, match="--max-storage"):
            parse_size(bad)


def _item(n: int, size: float, read: float, write: float = 0.0, kind: str = "create") -> Item:
    return Item(f"CREATE INDEX i{n} ON t (c{n})" if kind == "create" else f"DROP INDEX CONCURRENTLY d{n}",
                kind, "t", size, read, write)  # type: ignore[arg-type]


def _best(items: list[Item], budget_mb: float) -> float:
    """The largest net saving of any subset that fits: every subset, no cleverness."""
    best = 0.0
    for r in range(len(items) + 1):
        for subset in itertools.combinations(items, r):
            if sum(i.size_mb for i in subset) <= budget_mb + 1e-9:
                best = max(best, sum(i.net_ms_per_day for i in subset))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_exhaustive_selection_is_the_best_subset_that_fits(seed: int) -> None:
    rng = random.Random(seed)
    items = [_item(n, round(rng.uniform(1, 60), 2), rng.uniform(0, 5000), rng.uniform(0, 1500))
             for n in range(rng.randint(3, 11))]
    items += [_item(100 + n, -round(rng.uniform(1, 30), 2), 0.0, rng.uniform(-50, 400), "drop")
              for n in range(rng.randint(0, 3))]
    cap = rng.uniform(10, 120)
    choice = choose(items, cap)
    assert choice.storage_mb <= cap + 1e-9
    assert choice.net_ms_per_day == pytest.approx(_best(items, cap), abs=1e-6)
    assert "exhaustive" in choice.method and choice.granularity_mb is None
    assert {id(i) for i in choice.chosen} | {id(i) for i, _ in choice.left_out} == {id(i) for i in items}


def test_the_dynamic_programme_beyond_twenty_items_matches_the_exhaustive_search() -> None:
    rng = random.Random(3)
    items = [_item(n, round(rng.uniform(0.5, 40), 1), rng.uniform(100, 5000), rng.uniform(0, 80))
             for n in range(26)]  # sizes on the 0.1 MB grid: rounding changes nothing
    choice = choose(items, 150.0)
    assert "dynamic programming" in choice.method and choice.granularity_mb == pytest.approx(0.1)
    options = [budget._Option(i, i.size_mb, i.net_ms_per_day) for i in items]
    value, _, _ = budget._exhaustive(options, 150.0)  # the same search the small case uses
    assert choice.net_ms_per_day == pytest.approx(value, abs=1e-6)
    assert choice.storage_mb <= 150.0 + 1e-9


def test_drops_free_room_and_what_is_left_out_says_why() -> None:
    big = _item(1, 10.0, 900.0, 100.0)
    useless = _item(2, 1.0, 50.0, 80.0)  # costs the writes more than it saves the reads
    huge = _item(3, 500.0, 5000.0)
    other = _item(4, 4.0, 300.0)
    drop = _item(5, -6.0, 0.0, 40.0, "drop")
    choice = choose([big, useless, huge, other, drop], 5.0)
    assert [i.key for i in choice.chosen] == [big.key, drop.key]  # 10 − 6 = 4 MB ≤ 5
    assert choice.net_ms_per_day == pytest.approx(800.0 + 40.0)
    why = {i.key: reason for i, reason in choice.left_out}
    assert "saves nothing a day" in why[useless.key]
    assert "more than the budget allows" in why[huge.key]
    assert "does not fit with the chosen set" in why[other.key]
    doc = choice.public()
    assert doc["sum_of_parts_ms_per_day"] == 840.0 and doc["storage_mb"] == 4.0
    assert [x["sql"] for x in doc["left_out"]] == [useless.key, huge.key, other.key]
    with pytest.raises(InputError):
        choose([big], -1.0)


def test_the_candidates_are_the_merged_indexes_and_the_verified_drops() -> None:
    def entry(queryid: int, sql: str, saved: float, size: float) -> Entry:
        e = Entry(queryid, f"SELECT {queryid}", 10, 1000.0, 100.0, "completed", task_id=str(queryid))
        e.winner = {"agent": "a", "proposal_type": "index", "sql_commands": [sql], "rewritten_query": None,
                    "settings": []}
        e.saved_ms_per_day, e.storage_mb = saved, size
        return e

    doc = build_report({"id": "x"}, [entry(1, "CREATE INDEX a ON orders (user_id)", 100.0, 2.0),
                                     entry(2, "CREATE INDEX b ON orders (user_id, created_at)", 300.0, 3.0)],
                       [], {})
    doc["statements"][1]["write_cost"] = {"ms_per_write": 0.01, "ms_per_day": 25.0, "writes_per_day": 2500}
    doc["index_review"] = {"advice": [
        {"index": "public.orders_dup", "table": "public.orders", "verdict": "drop", "kind": "duplicate",
         "reason": "same", "storage_mb": 1.5, "write_ms_saved_per_day": 12.0,
         "sql": "DROP INDEX CONCURRENTLY public.orders_dup;", "rollback": "CREATE INDEX CONCURRENTLY …;"},
        {"index": "public.orders_x", "table": "public.orders", "verdict": "keep", "kind": "unused",
         "reason": "short window", "storage_mb": 9.0, "write_ms_saved_per_day": None,
         "sql": "DROP INDEX CONCURRENTLY public.orders_x;", "rollback": "…"}]}
    doc["indexes"][0]["needs_rewrite"] = [1]
    items = candidates(doc)
    assert items[0].rewrite == (1,) and any("needs an application change" in n for n in items[0].notes)
    assert [(i.kind, i.size_mb, i.net_ms_per_day) for i in items] == [
        ("create", 3.0, 400.0 - 25.0), ("drop", -1.5, 12.0)]  # merged once; the kept index is no item
    assert items[0].write_measured and items[0].statements == (2, 1)
    assert items[1].key == "DROP INDEX CONCURRENTLY public.orders_dup"


# -- measured together in one fork -------------------------------------------------------------
@pytest.fixture
def workload_db(sandbox: SandboxServer) -> Iterator[str]:
    """A database with reads by user_id and by status, and inserts, in pg_stat_statements;
    registered as a fork source."""
    name = "afs_budget_t_" + os.urandom(4).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    provider = LocalForkProvider(sandbox.dsn())
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, user_id int NOT NULL, status int NOT NULL,"
                         " note text NOT NULL)")
            conn.execute("INSERT INTO t SELECT g, g % 3000, g % 50, md5(g::text)"
                         " FROM generate_series(1, 120000) g")
            conn.execute("ANALYZE t")
            conn.execute("SELECT pg_stat_statements_reset()")
            for n in range(60):
                conn.execute("SELECT id, note FROM t WHERE user_id = %s", (Int8(n),)).fetchall()
                conn.execute("SELECT count(*) FROM t WHERE status = %s AND user_id < 20", (Int8(n % 50),))
            for n in range(100):
                with conn.transaction(force_rollback=True):
                    conn.execute("INSERT INTO t (id, user_id, status, note) VALUES (%s, %s, %s, %s)",
                                 (Int8(500_000 + n), Int8(n), Int8(n % 50), f"x{n}"))
        trio.run(provider.register_source, name, "test:budget")
        yield name
    finally:
        try:
            trio.run(provider.drop_source, name)
        finally:
            with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.usefixtures("no_leaked_forks")
async def test_the_chosen_set_is_measured_together_in_one_fork(
        workload_db: str, sandbox: SandboxServer, forks: ForkClient, settings: Settings) -> None:
    items = [Item("CREATE INDEX b_user ON t (user_id)", "create", "t", 2.7, 5000.0, 10.0, (1,)),
             Item("CREATE INDEX b_status ON t (status, user_id)", "create", "t", 3.6, 3000.0, 10.0, (2,)),
             Item("CREATE INDEX b_note ON t (note)", "create", "t", 8.0, 100.0, 10.0, (3,))]
    choice = choose(items, 7.0)
    assert [i.key for i in choice.chosen] == [items[0].key, items[1].key]
    async with open_connection(sandbox.dsn(workload_db)) as target:
        counters = await read_counters(target)
        doc = await measure_set(Verifying(target, forks, workload_db, settings), choice, counters)
    measured = doc["measured"]
    by_kind = {s["kind"]: s for s in measured["statements"] if s["with_ms"] is not None}
    reads = [s for s in measured["statements"] if s["kind"] == "read" and s["with_ms"] is not None]
    assert reads and all(s["without_ms"] > s["with_ms"] for s in reads)  # the new indexes serve them
    assert "write" in by_kind  # the inserts replayed too (rolled back), their cost counted
    assert measured["total_ms_per_day"] > 0 and measured["sum_of_parts_ms_per_day"] == 7980.0
    assert measured["verdict"].startswith("measured together")
    assert doc["items"][0]["sql"] == items[0].key and doc["left_out"][0]["sql"] == items[2].key
    with psycopg.connect(sandbox.dsn(workload_db)) as conn:  # the user's database is untouched
        assert conn.execute("SELECT count(*) FROM pg_indexes WHERE tablename = 't'").fetchone() == (1,)


def test_the_net_saving_weighs_the_measured_write_cost_against_the_reads() -> None:
    from afs.batch.report import workload_lines
    from afs.replay import net_saving

    costly = {"ms_per_write": 0.05, "ms_per_day": 9000.0, "writes_per_day": 180000, "significant": True}
    cheap = {**costly, "ms_per_day": 100.0}
    assert net_saving(5000.0, costly) == -4000.0 and net_saving(5000.0, cheap) == 4900.0
    assert net_saving(None, costly) is None and net_saving(5000.0, {"ms_per_day": None}) is None
    doc = {"statements": [{"queryid": 1, "write_cost": costly, "net_ms_saved_per_day": -4000.0},
                          {"queryid": 2, "write_cost": cheap, "net_ms_saved_per_day": 4900.0}]}
    lines = "\n".join(workload_lines(doc))
    first, second = lines.split("winner of 2")
    assert "winner of 1:" in first and "more than the reads gain: not worth it" in first
    assert "net 4.9 s a day saved" in second
    # within the noise, a loss is not called one
    noisy = {**costly, "significant": False}
    assert "not worth it" not in "\n".join(workload_lines(
        {"statements": [{"queryid": 3, "write_cost": noisy, "net_ms_saved_per_day": -4000.0}]}))
