"""Bounded resources in forks (issue 9, item 6): temp files, statement time, growth."""

from __future__ import annotations

import os

import pytest
import trio

from afs.bench import apply
from afs.config import ForkLimits, Settings
from afs.db import open_connection
from afs.errors import DatabaseError, ForkLimitError, ProposalFailedError
from afs.forks.client import open_fork_client
from afs.forks.limits import check_growth
from afs.forks.provider import LocalForkProvider
from afs.models import EstimatedImpact, OptimizationProposal
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")

RUNAWAY = "CREATE MATERIALIZED VIEW runaway AS SELECT * FROM order_items a, order_items b"


@pytest.fixture
def tight(sandbox: SandboxServer) -> LocalForkProvider:
    return LocalForkProvider(sandbox.dsn(), limits=ForkLimits(
        temp_file_limit_mb=1, max_growth_mb=20, statement_timeout_ms=30_000))


async def test_a_fork_role_has_limits_it_cannot_raise(tight: LocalForkProvider) -> None:
    fork = await tight.fork("afs_demo", ttl_seconds=120)
    try:
        async with open_connection(fork.dsn) as conn:
            assert await conn.fetchval("SHOW temp_file_limit") == "1MB"
            assert await conn.fetchval("SELECT current_setting('afs.max_growth_mb')") == "20"
            with pytest.raises(DatabaseError, match="permission denied"):
                await conn.execute("SET temp_file_limit = -1")
            await conn.execute("SET work_mem = '64kB'")
            with pytest.raises(DatabaseError, match="temp_file_limit"):
                await conn.execute("SELECT g FROM generate_series(1, 1000000) g ORDER BY g DESC")
        # a session that sets no statement timeout of its own gets the fork's
        dsn = fork.dsn
        async with open_connection(dsn, 0) as conn:
            assert await conn.fetchval("SELECT current_setting('idle_in_transaction_session_timeout')"
                                       ) != "0"
    finally:
        await tight.delete(fork.name)


def runaway_proposal() -> OptimizationProposal:
    return OptimizationProposal(
        agent="gemini-2.5-pro", proposal_type="materialized_view", sql_commands=(RUNAWAY,),
        rollback_commands=("DROP MATERIALIZED VIEW IF EXISTS runaway",), rationale="runaway",
        estimated_impact=EstimatedImpact(90, 1.0, "low", "low"),
        rewritten_query="SELECT count(*) FROM runaway")


async def test_a_runaway_materialized_view_fails_fast_and_says_why(tight: LocalForkProvider) -> None:
    fork = await tight.fork("afs_demo", ttl_seconds=120)
    try:
        async with open_connection(fork.dsn) as conn:
            started = trio.current_time()
            with pytest.raises(ForkLimitError, match=r"more than the fork may grow \(20 MB"):
                await check_growth(conn, RUNAWAY)
            with pytest.raises(ProposalFailedError, match="planner expects this statement to write about"):
                await apply(conn, runaway_proposal())
            # refused from the planner's estimate: run, it would hold the fork to its 30 s statement
            # timeout; a loaded machine's few round trips get more than 5 s of the difference
            assert trio.current_time() - started < 15
            assert await conn.fetchval("SELECT to_regclass('runaway')") is None
            # what fits goes through
            await check_growth(conn, "CREATE MATERIALIZED VIEW small AS SELECT status, count(*)"
                                     " FROM orders GROUP BY status")
    finally:
        await tight.delete(fork.name)


async def test_the_fork_server_cancels_a_fork_grown_past_its_cap(sandbox: SandboxServer) -> None:
    """The backstop: a statement that was never checked (psql, a planner's underestimate)."""
    tight = LocalForkProvider(sandbox.dsn(), limits=ForkLimits(temp_file_limit_mb=1024,
                                                               max_growth_mb=20))
    fork = await tight.fork("afs_demo", ttl_seconds=120)
    failure: list[BaseException] = []
    try:
        async with open_connection(fork.dsn) as conn:

            async def grow() -> None:
                try:
                    await conn.execute("CREATE TABLE big AS SELECT g, repeat('x', 500) AS pad"
                                       " FROM generate_series(1, 2000000) g")
                except DatabaseError as exc:
                    failure.append(exc)

            cancelled: set[str] = set()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(grow)
                with trio.fail_after(60):
                    while not failure:
                        cancelled.update(await tight.enforce_limits())
                        await trio.sleep(0.2)
            assert cancelled == {fork.name}, failure
            assert "cancel" in str(failure[0])
            assert await conn.fetchval("SELECT to_regclass('big')") is None
        assert await tight.enforce_limits() == []  # the aborted table's files are gone
    finally:
        await tight.delete(fork.name)


async def test_a_running_fork_server_enforces_the_growth_cap(settings: Settings) -> None:
    os.environ["AFS_FORK_MAX_GROWTH_MB"] = "20"  # the server process inherits it
    try:
        async with open_fork_client(settings) as client, client.open_fork("afs_demo") as fork, \
                open_connection(fork.dsn) as conn:
            assert await conn.fetchval("SELECT current_setting('afs.max_growth_mb')") == "20"
            started = trio.current_time()
            with pytest.raises(DatabaseError, match="cancel"):  # psql-like: never checked first
                await conn.execute("CREATE TABLE big AS SELECT g, repeat('x', 500) AS pad"
                                   " FROM generate_series(1, 2000000) g")
            assert trio.current_time() - started < 30
    finally:
        del os.environ["AFS_FORK_MAX_GROWTH_MB"]
