"""The rewrite rules against real PostgreSQL: original and rewrite return the same rows.

A throw-away database with two small tables (NULLs where they matter, users without
orders, a DST change inside the timestamptz range) is created once for the module and
dropped at the end, even after failures. The table facts come from the catalog through
afs.analysis.table_info, as they do in a real run.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from afs.analysis import table_info
from afs.brains.strategists.rewrites import Rewrite, keyset_probe, keyset_rewrite, rewrites
from afs.db import Connection, connect_sync, open_connection
from afs.models import TableInfo
from afs.query.query import Query
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.slow

SCHEMA = """
CREATE TABLE users (
  id bigint PRIMARY KEY,
  email text NOT NULL UNIQUE,
  country text,
  signed_up timestamptz NOT NULL,
  birthday date,
  referrer_id bigint
);
INSERT INTO users
SELECT g, 'u' || g || '@example.org',
       CASE WHEN g % 7 = 0 THEN NULL ELSE (ARRAY['FR', 'DE', 'US'])[1 + g % 3] END,
       timestamptz '2024-03-01 00:00:00+00' + g * interval '17 minutes',
       CASE WHEN g % 5 = 0 THEN NULL ELSE date '1985-01-01' + g * 5 END,
       CASE WHEN g % 3 = 0 THEN NULL ELSE g / 2 END
FROM generate_series(1, 2000) g;
CREATE TABLE orders (
  id bigint PRIMARY KEY,
  user_id bigint NOT NULL,
  status text,
  total numeric(10, 2),
  created_at timestamp NOT NULL,
  coupon_id bigint
);
INSERT INTO orders
SELECT g, 1 + (g * g) % 2003,
       CASE WHEN g % 11 = 0 THEN NULL ELSE (ARRAY['paid', 'void', 'new'])[1 + g % 3] END,
       CASE WHEN g % 13 = 0 THEN NULL ELSE (g % 500) / 3.0 END,
       timestamp '2023-12-30 00:00' + g * interval '41 minutes',
       CASE WHEN g % 4 = 0 THEN NULL ELSE g % 900 END
FROM generate_series(1, 6000) g;
ANALYZE users;
ANALYZE orders;
"""
ZONES = ("America/New_York", "Asia/Kathmandu")  # a DST change on 2024-03-10; a +05:45 offset


@pytest.fixture(scope="module")
def rewrites_db(sandbox: SandboxServer) -> Iterator[str]:
    name = f"afs_rewrites_{uuid.uuid4().hex[:8]}"
    admin = connect_sync(sandbox.dsn())
    try:
        admin.execute(f"CREATE DATABASE {name}")
        try:
            with connect_sync(sandbox.dsn(name)) as conn:
                conn.execute(SCHEMA)
            yield sandbox.dsn(name)
        finally:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        admin.close()


async def _tables(conn: Connection) -> dict[str, TableInfo]:
    found = {}
    for name in ("users", "orders"):
        info = await table_info(conn, name, set())
        assert info is not None
        found[name] = info
    return found


def _rows(rows: list[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    return Counter(rows)


async def _rewrite(conn: Connection, query: str, kind: str) -> Rewrite:
    found = [r for r in rewrites(Query.read(query), await _tables(conn)) if r.kind == kind]
    assert len(found) == 1, (query, [r.kind for r in rewrites(Query.read(query), await _tables(conn))])
    return found[0]


async def _same_rows(conn: Connection, query: str, kind: str, ordered: bool = False) -> Rewrite:
    rewrite = await _rewrite(conn, query, kind)
    before, after = await conn.fetchall(query), await conn.fetchall(rewrite.sql)
    assert before, f"the case proves nothing without rows: {query}"
    if ordered:
        assert after == before, rewrite.sql
    else:
        assert _rows(after) == _rows(before), rewrite.sql
    return rewrite


async def test_not_in_to_not_exists_returns_the_same_rows(rewrites_db: str) -> None:
    async with open_connection(rewrites_db) as conn:
        await _same_rows(conn, "SELECT u.id, u.email FROM users u WHERE u.id NOT IN "
                               "(SELECT user_id FROM orders WHERE status = 'void')", "not_in_to_not_exists")
        await _same_rows(conn, "SELECT id FROM users WHERE id NOT IN (SELECT o.user_id FROM orders o "
                               "WHERE o.total > 100) ORDER BY id LIMIT 50", "not_in_to_not_exists",
                         ordered=True)


async def test_not_in_over_a_nullable_column_is_not_rewritten_and_would_differ(rewrites_db: str) -> None:
    query = "SELECT id FROM users WHERE id NOT IN (SELECT coupon_id FROM orders)"
    naive = ("SELECT id FROM users WHERE NOT EXISTS "
             "(SELECT 1 FROM orders WHERE orders.coupon_id = users.id)")
    async with open_connection(rewrites_db) as conn:
        tables = await _tables(conn)
        assert not any(c.nullable is False for c in tables["orders"].columns if c.name == "coupon_id")
        assert [r for r in rewrites(Query.read(query), tables) if r.kind == "not_in_to_not_exists"] == []
        assert await conn.fetchall(query) == []  # a NULL coupon_id: NOT IN is never TRUE
        assert len(await conn.fetchall(naive)) > 1000  # the rewrite would have returned these


@pytest.mark.parametrize("zone", ZONES)
async def test_sargable_ranges_return_the_same_rows_in_any_time_zone(rewrites_db: str, zone: str) -> None:
    predicates = [
        "signed_up::date = '2024-03-10'",
        "date(signed_up) = '2024-03-11'",
        "CAST(signed_up AS date) = DATE '2024-03-09'",
        "date_trunc('day', signed_up) = '2024-03-10'",
        "date_trunc('month', signed_up) = '2024-03-01'",
        "extract(year FROM signed_up) = 2024",
        "signed_up::date BETWEEN '2024-03-09' AND '2024-03-11'",
        "extract(year FROM birthday) BETWEEN 1990 AND 1991",
    ]
    async with open_connection(rewrites_db) as conn:
        await conn.execute(f"SET TimeZone = '{zone}'")
        for predicate in predicates:
            rewrite = await _same_rows(conn, f"SELECT id, signed_up FROM users WHERE {predicate}",
                                       "sargable_range")
            assert rewrite.index_hints[0][0] == "users"
        for predicate in ("created_at::date = '2024-02-29'",
                          "date_trunc('month', created_at) = '2024-02-01'",
                          "date_trunc('year', created_at) = '2024-01-01'",
                          "date_part('year', created_at) = 2023",
                          "created_at::date BETWEEN '2024-01-30' AND '2024-02-02'"):
            await _same_rows(conn, f"SELECT id FROM orders WHERE {predicate} OR id = 1", "sargable_range")


async def test_scalar_subqueries_to_joins_return_the_same_rows(rewrites_db: str) -> None:
    async with open_connection(rewrites_db) as conn:
        r = await _same_rows(conn, "SELECT u.id, (SELECT count(*) FROM orders o WHERE o.user_id = u.id "
                                   "AND o.status = 'paid') AS paid FROM users u", "scalar_subquery_to_join")
        assert "COALESCE" in r.sql
        await _same_rows(conn, "SELECT u.id, (SELECT sum(total) FROM orders o WHERE o.user_id = u.id) "
                               "FROM users u ORDER BY u.id LIMIT 300", "scalar_subquery_to_join",
                         ordered=True)
        await _same_rows(conn, "SELECT u.id, (SELECT max(created_at) FROM orders o "
                               "WHERE o.user_id = u.referrer_id) FROM users u", "scalar_subquery_to_join")
        r = await _same_rows(conn, "SELECT u.id FROM users u WHERE u.id / 20.0 < "
                                   "(SELECT avg(total) FROM orders o WHERE o.user_id = u.id)",
                             "scalar_subquery_to_join")
        assert "INNER JOIN" in r.sql
        await _same_rows(conn, "SELECT u.id FROM users u WHERE "
                               "(SELECT count(coupon_id) FROM orders o WHERE o.user_id = u.id) < 2",
                         "scalar_subquery_to_join")


async def test_in_and_exists_return_the_same_rows_with_nulls(rewrites_db: str) -> None:
    async with open_connection(rewrites_db) as conn:
        await _same_rows(conn, "SELECT u.id FROM users u WHERE u.country = 'DE' AND u.referrer_id IN "
                               "(SELECT coupon_id FROM orders WHERE status = 'paid')", "in_to_exists")
        await _same_rows(conn, "SELECT o.id FROM orders o WHERE EXISTS (SELECT 1 FROM users u "
                               "WHERE u.referrer_id = o.coupon_id AND u.country IS NULL)", "exists_to_in")


async def test_redundant_distinct_returns_the_same_rows(rewrites_db: str) -> None:
    async with open_connection(rewrites_db) as conn:
        for query in ("SELECT DISTINCT id, status FROM orders WHERE total > 50",
                      "SELECT DISTINCT email, country FROM users",
                      "SELECT DISTINCT status, count(*) FROM orders GROUP BY status",
                      # a join that cannot repeat an order (and one that left-joins users)
                      "SELECT DISTINCT o.id, o.total FROM orders o JOIN users u ON u.id = o.user_id"
                      " WHERE u.country IN ('DE', 'FR')",
                      "SELECT DISTINCT o.id, u.country FROM orders o LEFT JOIN users u"
                      " ON u.id = o.coupon_id"):
            await _same_rows(conn, query, "redundant_distinct")


async def test_or_to_union_returns_the_same_rows_with_nulls(rewrites_db: str) -> None:
    async with open_connection(rewrites_db) as conn:
        await _same_rows(conn, "SELECT id, status, user_id FROM orders WHERE total > 1 "
                               "AND (status = 'paid' OR user_id < 300)", "or_to_union")
        await _same_rows(conn, "SELECT status, user_id FROM orders WHERE status = 'void' OR user_id < 300 "
                               "OR coupon_id IS NULL", "or_to_union")  # duplicate rows stay duplicates
        await _same_rows(conn, "SELECT id, status FROM orders WHERE status = 'paid' OR user_id < 300 "
                               "ORDER BY id DESC LIMIT 20 OFFSET 10", "or_to_union", ordered=True)


async def test_keyset_page_is_the_offset_page(rewrites_db: str) -> None:
    async with open_connection(rewrites_db) as conn:
        tables = await _tables(conn)
        for query in ("SELECT id, status FROM orders WHERE status IS NOT NULL "
                      "ORDER BY created_at, id LIMIT 10 OFFSET 40",
                      "SELECT id, email FROM users WHERE country = 'FR' ORDER BY signed_up DESC, id DESC "
                      "LIMIT 25 OFFSET 100"):
            probe = keyset_probe(Query.read(query), tables)
            assert probe is not None, query
            last = await conn.fetchone(probe.sql)
            assert last is not None
            rewrite = keyset_rewrite(Query.read(query), probe, last)
            assert rewrite is not None and rewrite.needs_application_change
            page = await conn.fetchall(query)
            assert len(page) > 1 and await conn.fetchall(rewrite.sql) == page
