"""psycopg under trio: cancellation reaches the server, timeouts are the server's."""

from __future__ import annotations

import time

import pytest
import trio

from afs.config import CONNECTING
from afs.db import open_connection
from afs.errors import DatabaseError, StatementTimeout
from afs.sandbox.server import SandboxServer


async def test_trio_cancel_stops_the_statement_on_the_server(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn()) as conn:
        started = time.monotonic()
        with trio.move_on_after(0.5) as scope:
            await conn.execute("SELECT pg_sleep(10)")
        elapsed = time.monotonic() - started
        assert scope.cancelled_caught
        # not cancelled, the statement would take its 10 s; a cancel request is a new connection
        # to the server (a backend started), which a loaded machine may take a second or more for
        assert elapsed < 7, f"cancellation took {elapsed:.2f} s"
        # the connection is idle and usable afterwards
        assert await conn.fetchval("SELECT 41 + 1") == 42
        # nothing is still running on the server for us
        busy = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(10)%%'"
            " AND state = 'active'")
        assert busy == 0


async def test_cancel_inside_a_transaction_leaves_the_connection_usable(
        sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn()) as conn:
        await conn.execute("BEGIN")
        with trio.move_on_after(0.3):
            await conn.execute("SELECT pg_sleep(5)")
        assert await conn.fetchval("SELECT 1") == 1  # rolled back, not stuck in error


async def test_many_randomly_timed_cancellations(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn()) as conn:
        for i in range(30):
            with trio.move_on_after(0.002 * (i % 10)):
                await conn.execute("SELECT pg_sleep(0.05)")
            assert await conn.fetchval("SELECT %s::int", (i,)) == i


async def test_statement_timeout_is_enforced_by_the_server(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn(), statement_timeout_ms=200) as conn:
        assert await conn.fetchval("SHOW statement_timeout") == "200ms"
        with pytest.raises(StatementTimeout, match="statement timeout"):
            await conn.execute("SELECT pg_sleep(2)")
        assert await conn.fetchval("SELECT 1") == 1


async def test_a_connection_whose_caller_names_no_timeout_has_configs(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn()) as conn:
        shown = await conn.fetchval("SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'")
    assert shown == CONNECTING.statement_timeout_ms == 60_000


async def test_errors_are_translated_with_sqlstate(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        with pytest.raises(DatabaseError) as caught:
            await conn.execute("SELECT * FROM no_such_table")
    assert caught.value.sqlstate == "42P01"
    assert "no_such_table" in str(caught.value)


async def test_bad_password_error_hides_the_password(sandbox: SandboxServer) -> None:
    dsn = sandbox.dsn("afs_demo").replace("postgres@", "nobody:s3cret-pw@")
    with pytest.raises(DatabaseError) as caught:
        async with open_connection(dsn):
            pass
    assert "s3cret-pw" not in str(caught.value)
