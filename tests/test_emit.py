"""`afs batch --emit DIR` (issue 28 item 5): a batch's chosen changes as a migration — one
CONCURRENTLY statement a file, numbered in apply order, up and down, a summary with the measured
figures; a non-empty DIR refused unless forced; never half a migration. The files are run on
the embedded PostgreSQL, up then down, as a reviewer's tool would run them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pglast import ast, parse_sql

from afs.batch.emit import SUMMARY, emit_migration
from afs.batch.report import Entry, build_report
from afs.errors import InputError
from afs.sandbox.server import SandboxServer
from afs.store import open_store
from afs.testing import run_afs_async


def _doc(**extra: Any) -> dict[str, Any]:
    def entry(queryid: int, sql: str, saved: float, size: float) -> Entry:
        e = Entry(queryid, f"SELECT {queryid}", 10, 1000.0, 100.0, "completed", task_id=str(queryid))
        e.winner = {"agent": "a", "proposal_type": "index", "sql_commands": [sql], "rewritten_query": None,
                    "settings": []}
        e.saved_ms_per_day, e.storage_mb = saved, size
        return e

    doc = build_report({"id": "b1", "database": "shop", "created_at": "2026-11-27T10:00:00",
                        "period_s": 7200.0},
                       [entry(1, "CREATE INDEX IF NOT EXISTS ix_user ON orders (user_id, created_at)",
                              90_000.0, 2.0),
                        entry(2, "CREATE INDEX ON orders (status) WHERE status = 'pending'", 30_000.0, 0.5)],
                       [], {})
    doc["statements"][0]["write_cost"] = {"ms_per_write": 0.02, "ms_per_day": 1500.0, "writes_per_day": 75000}
    doc["index_review"] = {"advice": [
        {"index": "public.orders_total_dup", "table": "public.orders", "verdict": "drop", "kind": "duplicate",
         "reason": "the same definition as public.orders_total", "storage_mb": 1.2,
         "write_ms_saved_per_day": 800.0, "sql": "DROP INDEX CONCURRENTLY public.orders_total_dup;",
         "rollback": "CREATE INDEX CONCURRENTLY orders_total_dup ON public.orders USING btree (total);"}]}
    return doc | extra


def _statements(path: Path) -> list[Any]:
    return [s.stmt for s in parse_sql(path.read_text())]


def test_a_migration_has_one_concurrent_statement_a_file_in_apply_order(tmp_path: Path) -> None:
    out = tmp_path / "mig"
    written = emit_migration(_doc(), out)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(written["files"]) and written["changes"] == 3
    ups = sorted(out.glob("*.up.sql"))
    assert [p.name[:4] for p in ups] == ["0001", "0002", "0003"]
    kinds = []
    for up in ups:
        [stmt] = _statements(up)  # one statement a file
        [down] = _statements(up.with_name(up.name.replace(".up.", ".down.")))
        if isinstance(stmt, ast.IndexStmt):
            assert stmt.concurrent and stmt.idxname and not stmt.if_not_exists
            assert isinstance(down, ast.DropStmt) and down.concurrent and down.missing_ok
            kinds.append("create")
        else:
            assert isinstance(stmt, ast.DropStmt) and stmt.concurrent
            assert isinstance(down, ast.IndexStmt) and down.concurrent
            kinds.append("drop")
    assert kinds == ["create", "create", "drop"]  # the new indexes before an old one goes
    text = (out / SUMMARY).read_text()
    assert "| 1 | `CREATE INDEX CONCURRENTLY ix_user ON orders" in text
    assert "1.5 s" in text and "(not measured)" in text  # a measured write cost, and one that was not
    assert "duplicate: the same definition as public.orders_total" in text
    assert "descending order" in text


def test_the_chosen_set_alone_is_emitted(tmp_path: Path) -> None:
    doc = _doc()
    doc["chosen_set"] = {"budget_mb": 1.0, "method": "exhaustive search", "left_out": [
        {"sql": doc["indexes"][0]["sql"], "why": "does not fit"}],
        "items": [{"sql": doc["indexes"][1]["sql"]},
                  {"sql": "DROP INDEX CONCURRENTLY public.orders_total_dup"}],
        "measured": {"verdict": "measured together 40.0 ≥ the sum of the parts 30.8 ms a day"}}
    written = emit_migration(doc, tmp_path / "m")
    assert written["changes"] == 2 and "under 1 MB" in written["source"]
    text = (tmp_path / "m" / SUMMARY).read_text()
    assert "ix_user" not in "".join(p.read_text() for p in (tmp_path / "m").glob("*.sql"))
    assert "Left out by the storage budget" in text and "Measured together in one fork" in text


def test_a_non_empty_directory_is_refused_unless_forced_and_a_failure_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "mig"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="not empty"):
        emit_migration(_doc(), out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    emit_migration(_doc(), out, force=True)
    assert not (out / "keep.txt").exists() and (out / SUMMARY).exists()
    broken = tmp_path / "broken"
    with pytest.raises(ValueError):  # the summary fails after the SQL files were written
        emit_migration(_doc(period_s="not a number"), broken)
    assert not broken.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mig"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        emit_migration(_doc(), tmp_path / "file")


@pytest.fixture
def shop(sandbox: SandboxServer) -> Iterator[str]:
    name = "afs_emit_t_" + os.urandom(4).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, user_id int, status text, total int,"
                         " created_at timestamptz)")
            conn.execute("CREATE INDEX orders_total ON orders (total)")
            conn.execute("CREATE INDEX orders_total_dup ON orders (total)")
        yield sandbox.dsn(name)
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _indexes(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'orders'")}


def test_the_files_run_up_then_down_on_postgresql(tmp_path: Path, shop: str) -> None:
    emit_migration(_doc(), tmp_path / "m")
    before = _indexes(shop)
    with psycopg.connect(shop, autocommit=True) as conn:  # each file alone, outside a transaction
        for up in sorted((tmp_path / "m").glob("*.up.sql")):
            conn.execute(up.read_text().encode())
    after = _indexes(shop)
    assert after - before == {"ix_user", "orders_status_afs_idx"} and before - after == {"orders_total_dup"}
    with psycopg.connect(shop, autocommit=True) as conn:
        for down in sorted((tmp_path / "m").glob("*.down.sql"), reverse=True):
            conn.execute(down.read_text().encode())
    assert _indexes(shop) == before


async def test_afs_batch_show_emits_a_stored_batch(tmp_path: Path, store_db: str) -> None:
    doc = _doc()
    async with open_store(store_db) as store:
        await store.conn.execute(
            "INSERT INTO afs_store.batches (id, origin, created_at, options, report, markdown, finished_at)"
            " VALUES ('b1', 'x', now(), '{}', %s, '# b1', now())", (json.dumps(doc),))
    out = tmp_path / "m"
    done = await run_afs_async("batch", "show", "b1", "--emit", str(out), "--json", AFS_STORE_URL=store_db)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["emitted"]["changes"] == 3 and (out / SUMMARY).exists()
    again = await run_afs_async("batch", "show", "b1", "--emit", str(out), AFS_STORE_URL=store_db)
    assert again.returncode == 2 and b"not empty" in again.stderr


async def test_afs_batch_refuses_a_bad_budget_or_a_full_directory_before_anything_runs(
        tmp_path: Path, store_db: str) -> None:
    bad = await run_afs_async("batch", "--max-storage", "lots", AFS_STORE_URL=store_db)
    assert bad.returncode == 2 and b"--max-storage" in bad.stderr
    (tmp_path / "x").write_text("mine")
    full = await run_afs_async("batch", "--emit", str(tmp_path), AFS_STORE_URL=store_db)
    assert full.returncode == 2 and b"not empty" in full.stderr and b"--force-emit" in full.stderr
    async with open_store(store_db) as store:
        assert not await store.tasks(limit=10)  # nothing ran
