"""The fork's growth cap reads what a statement writes from its parse tree (`afs.safety.
writes_from_query`), not from its first words: a comment before the statement, a parenthesized
or TABLE query, lower case, none of them skips the estimate."""

from __future__ import annotations

import pytest

from afs.config import ForkLimits
from afs.db import open_connection
from afs.errors import ForkLimitError
from afs.forks.limits import check_growth
from afs.forks.provider import LocalForkProvider
from afs.safety import writes_from_query
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")

RUNAWAYS = (
    "/* the squad's view */ CREATE MATERIALIZED VIEW runaway AS SELECT * FROM order_items a, order_items b",
    "-- a view\nCREATE MATERIALIZED VIEW runaway AS SELECT * FROM order_items a, order_items b",
    "CREATE MATERIALIZED VIEW runaway AS (SELECT * FROM order_items a, order_items b)",
    "create materialized view runaway as\tselect * from order_items a, order_items b",
)


@pytest.mark.parametrize("sql", RUNAWAYS)
def test_what_writes_from_a_query_is_read_from_the_tree(sql: str) -> None:
    assert writes_from_query(sql)


@pytest.mark.parametrize("sql", [
    "CREATE MATERIALIZED VIEW v AS SELECT 1 WITH NO DATA",
    "CREATE INDEX i ON orders (user_id)",
    "INSERT INTO t VALUES (1)",
    "ANALYZE orders",
    "SELECT 1 FROM orders",
    "not sql at all",
])
def test_what_writes_nothing_from_a_query_is_not_estimated(sql: str) -> None:
    assert not writes_from_query(sql)


@pytest.mark.parametrize("sql", [
    "INSERT INTO orders_new SELECT * FROM orders",
    "WITH o AS (SELECT * FROM orders) INSERT INTO orders_new SELECT * FROM o",
    "SELECT * INTO orders_copy FROM orders",
    "CREATE TABLE orders_copy AS SELECT * FROM orders",
])
def test_copies_are_estimated(sql: str) -> None:
    assert writes_from_query(sql)


async def test_a_commented_runaway_view_is_refused_before_it_runs(sandbox: SandboxServer) -> None:
    tight = LocalForkProvider(sandbox.dsn(), limits=ForkLimits(
        temp_file_limit_mb=1, max_growth_mb=20, statement_timeout_ms=30_000))
    fork = await tight.fork("afs_demo", ttl_seconds=120)
    try:
        async with open_connection(fork.dsn) as conn:
            for sql in RUNAWAYS:
                with pytest.raises(ForkLimitError, match=r"more than the fork may grow \(20 MB"):
                    await check_growth(conn, sql)
    finally:
        await tight.delete(fork.name)
