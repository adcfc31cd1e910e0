"""Issue 28 item 1: a verified index drop applied through `afs apply --drop-index`, with approval,
the audit, and `afs rollback --audit ID` recreating the index (afs.apply.drop)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import psycopg
import pytest
import trio
from psycopg.types.numeric import Int8

from afs.apply.drop import DropPlan, check_drop, dropped_name, plan_drop
from afs.batch.indexes import Verifying
from afs.config import Settings
from afs.db import open_connection
from afs.errors import InputError, UnsafeSqlError
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.safety import validate_proposal
from afs.sandbox.server import SandboxServer
from afs.store import open_store
from afs.testing import run_afs_async

SETUP = """
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
CREATE TABLE t (id bigint PRIMARY KEY, a int NOT NULL, b int NOT NULL, u int NOT NULL);
INSERT INTO t SELECT g, g % 2000, g % 7, g FROM generate_series(1, 40000) g;
CREATE UNIQUE INDEX t_u_key ON t (u);
CREATE INDEX t_a ON t (a);
CREATE INDEX t_b ON t (b);
CREATE INDEX t_b_twin ON t (b);
ANALYZE t;
"""


@pytest.fixture
def planted(sandbox: SandboxServer) -> Iterator[str]:
    """A database of its own with a planted duplicate (t_b_twin of t_b), a primary key, a unique
    index, and a workload in pg_stat_statements; registered as a fork source (its copy)."""
    name = "afs_drop_t_" + os.urandom(4).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    provider = LocalForkProvider(sandbox.dsn())
    try:
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute(SETUP)
            conn.execute("SELECT pg_stat_statements_reset()")
            for n in range(100):
                conn.execute("SELECT id FROM t WHERE a = %s", (Int8(n),)).fetchall()
            for n in range(100):
                with conn.transaction(force_rollback=True):
                    conn.execute("INSERT INTO t (id, a, b, u) VALUES (%s, %s, %s, %s)",
                                 (Int8(100_000 + n), Int8(n), Int8(n % 7), Int8(100_000 + n)))
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_reset()")
        trio.run(provider.register_source, name, "test:apply-drop")
        yield name
    finally:
        try:
            trio.run(provider.drop_source, name)
        finally:
            with psycopg.connect(sandbox.dsn(), autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def definitions(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
                            " JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 't'::regclass"
                            " AND i.indisvalid").fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


async def afs(*args: str, store_db: str) -> tuple[int, str, str]:
    done = await run_afs_async(*args, AFS_STORE_URL=store_db)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_a_duplicate_is_dropped_after_approval_audited_and_recreated_by_rollback(
        planted: str, sandbox: SandboxServer, store_db: str, no_leaked_forks: None) -> None:
    dsn = sandbox.dsn(planted)
    before = definitions(dsn)
    assert "t_b_twin" in before
    # no terminal, no --yes: the plan is shown, nothing is dropped (as for a winner)
    code, out, err = await afs("apply", "--drop-index", "public.t_b_twin", "--dsn", dsn, store_db=store_db)
    assert code == 2 and "no terminal" in err, err[-2000:]
    assert 'DROP INDEX CONCURRENTLY "public"."t_b_twin"' in out
    assert "CREATE INDEX CONCURRENTLY t_b_twin" in out
    assert "duplicate" in out and "verified in a fork" in out
    assert definitions(dsn) == before

    code, out, err = await afs("apply", "--drop-index", "public.t_b_twin", "--dsn", dsn, "--yes",
                               "--approver", "alice", "--json", store_db=store_db)
    assert code == 0, err[-2000:]
    doc = json.loads(out)
    assert doc["applied"] is True and doc["plan"]["why"] == "duplicate"
    row = doc["audit"]
    assert (row["kind"], row["action"], row["result"], row["approver"], row["task_id"]) == (
        "drop_index", "apply", "applied", "alice", None)
    assert row["subject"] == '"public"."t_b_twin"'
    assert row["sql_commands"] == ['DROP INDEX CONCURRENTLY "public"."t_b_twin"']
    assert row["rollback_sql"] == [before["t_b_twin"].replace("CREATE INDEX ", "CREATE INDEX CONCURRENTLY ")]
    assert "t_b_twin" not in definitions(dsn) and "t_b" in definitions(dsn)

    code, out, _ = await afs("audit", "--json", store_db=store_db)
    rows = json.loads(out)
    assert code == 0 and [(r["id"], r["kind"]) for r in rows][:1] == [(row["id"], "drop_index")]
    code, out, _ = await afs("audit", store_db=store_db)
    assert code == 0 and 'drop "public"."t_b_twin"' in out

    code, out, err = await afs("rollback", "--audit", str(row["id"]), "--dsn", dsn, "--yes", "--approver",
                               "alice", store_db=store_db)
    assert code == 0, err[-2000:]
    assert definitions(dsn) == before  # the same definition, valid
    # undone: a second rollback has nothing in place; the audit has both rows
    code, _, err = await afs("rollback", "--audit", str(row["id"]), "--dsn", dsn, "--yes", store_db=store_db)
    assert code == 2 and "nothing to roll back" in err
    code, out, _ = await afs("audit", "--json", store_db=store_db)
    assert [(r["action"], r["result"]) for r in json.loads(out)][:2] == [("rollback", "rolled_back"),
                                                                         ("apply", "applied")]


async def test_a_primary_key_a_unique_index_and_a_missing_index_are_refused_untouched(
        planted: str, sandbox: SandboxServer, store_db: str, no_leaked_forks: None) -> None:
    dsn = sandbox.dsn(planted)
    before = definitions(dsn)
    for name, reason in (("public.t_pkey", "behind constraint t_pkey"), ("public.t_u_key", "unique"),
                         ("public.no_such_index", "no index public.no_such_index"),
                         ("pg_catalog.pg_class_oid_index", "never dropped"),
                         ("t_b;DROP TABLE t", "no index t_b;DROP TABLE t"),
                         ("a.b.c.d", "not an index name")):
        code, out, err = await afs("apply", "--drop-index", name, "--dsn", dsn, "--yes", store_db=store_db)
        assert code == 2, (name, err[-2000:])
        assert reason in err, (name, err[-2000:])
        assert "DROP INDEX" not in out
    assert definitions(dsn) == before
    async with open_store(store_db) as s:  # each refusal audited, nothing applied
        rows = await s.conn.fetchall("SELECT action, result, kind FROM afs_store.audit")
    assert rows and all(r == ("apply", "refused", "drop_index") for r in rows)
    # a task id and --drop-index together, or neither: a usage error
    code, _, err = await afs("apply", "abc", "--drop-index", "public.t_b", "--dsn", dsn, store_db=store_db)
    assert code == 2 and "one of the two" in err


async def test_only_a_drop_the_review_advises_now(planted: str, sandbox: SandboxServer, forks: ForkClient,
                                                 settings: Settings, no_leaked_forks: None) -> None:
    async with open_connection(sandbox.dsn(planted)) as conn:
        # t_a: no scan since the reset, but the window is minutes, not the 7 days asked: kept
        with pytest.raises(InputError, match="the index review keeps"):
            await plan_drop(Verifying(conn, forks, planted, settings), "public.t_a")
        # with any window, the replay finds the read that needs it: still kept
        with pytest.raises(InputError, match="got slower without it"):
            await plan_drop(Verifying(conn, forks, planted, settings), "public.t_a", min_window_s=0)
        # t_b, the one of the twins kept: not a duplicate; unused over too short a window: kept
        with pytest.raises(InputError, match="the index review keeps"):
            await plan_drop(Verifying(conn, forks, planted, settings), "public.t_b")
        plan = await plan_drop(Verifying(conn, forks, planted, settings), "public.t_b_twin")
        assert plan.sql == 'DROP INDEX CONCURRENTLY "public"."t_b_twin"'
        await check_drop(conn, plan)  # the target's catalog accepts it as judged
        # replaced since it was judged (another oid, another definition): refused
        await conn.execute("DROP INDEX t_b_twin")
        await conn.execute("CREATE INDEX t_b_twin ON t (a)")
        with pytest.raises(InputError, match="no longer the index that was verified"):
            await check_drop(conn, plan)


def test_the_statement_is_exactly_one_concurrent_index_drop_and_never_an_agents() -> None:
    assert dropped_name('DROP INDEX CONCURRENTLY "public"."t_b_twin"') == '"public"."t_b_twin"'
    for sql in ("DROP INDEX public.t_b_twin", "DROP INDEX CONCURRENTLY t_b_twin CASCADE",
                "DROP INDEX CONCURRENTLY a, b", "DROP TABLE t", "DROP INDEX CONCURRENTLY x; DROP TABLE t",
                "DROP INDEX CONCURRENTLY"):
        with pytest.raises(UnsafeSqlError):
            dropped_name(sql)
    plan = DropPlan('"public"."x"', "t", 1, "CREATE INDEX x ON public.t USING btree (b)", "duplicate", "",
                    0.0, None)
    assert plan.rollback == "CREATE INDEX CONCURRENTLY x ON public.t USING btree (b)"
    for ptype in ("index", "statistics"):  # agents' proposals never drop anything
        assert not validate_proposal(('DROP INDEX CONCURRENTLY "public"."x"',), ptype).is_valid
