"""The rewrite rules as pure functions: when each one fires, what it writes, when it must not."""

from __future__ import annotations

import ast
import datetime as dt
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pglast
import pytest
from pglast import parser as pg_parser

import afs.brains.strategists.rewrites as rewrites_module
from afs.brains.strategists.rewrites import Rewrite, keyset_probe, keyset_rewrite, rewrites
from afs.errors import InputError
from afs.models import ColumnInfo, IndexInfo, TableInfo
from afs.query.query import Query


def _table(name: str, columns: list[tuple[str, str, bool]], primary_key: tuple[str, ...] = ("id",),
           indexes: tuple[IndexInfo, ...] = ()) -> TableInfo:
    return TableInfo(name, 10_000, 1.0, tuple(ColumnInfo(n, t, nullable) for n, t, nullable in columns),
                     indexes, primary_key)


TABLES = {
    "users": _table("users", [("id", "bigint", False), ("email", "text", False), ("country", "text", True),
                              ("signed_up", "timestamp with time zone", False), ("birthday", "date", True),
                              ("referrer_id", "bigint", True)],
                    indexes=(IndexInfo("users_email_key",
                                       "CREATE UNIQUE INDEX users_email_key ON users (email)",
                                       ("email",), unique=True),)),
    "orders": _table("orders", [("id", "bigint", False), ("user_id", "bigint", False),
                                ("status", "text", True),
                                ("total", "numeric(10,2)", True),
                                ("created_at", "timestamp without time zone", False),
                                ("coupon_id", "bigint", True)]),
}


def _nodes(sql: str) -> Counter[str]:
    """Node types of PostgreSQL's parse tree, with SubLink, BoolExpr and join kinds spelt out."""
    counts: Counter[str] = Counter()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("op", "SETOP_NONE") != "SETOP_NONE":  # a set operation (larg/rarg are bare)
                counts[value["op"] + ("_ALL" if value.get("all") else "")] += 1
            for key, child in value.items():
                if key[:1].isupper():
                    counts[key] += 1
                    if key == "SubLink":
                        counts[child["subLinkType"]] += 1
                    elif key == "BoolExpr":
                        counts[child["boolop"]] += 1
                    elif key == "JoinExpr":
                        counts[child["jointype"]] += 1
                else:
                    counts[key] += 1
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    walk(json.loads(pg_parser.parse_sql_json(sql)))
    return counts


def _one(query: str, kind: str, tables: dict[str, TableInfo] | None = None) -> Rewrite:
    found = [r for r in rewrites(Query.read(query), TABLES if tables is None else tables) if r.kind == kind]
    assert len(found) == 1, [r.sql for r in found]
    rewrite = found[0]
    (statement,) = pglast.parse_sql(rewrite.sql)
    assert type(statement.stmt).__name__ == "SelectStmt"
    return rewrite


def _none(query: str, kind: str, tables: dict[str, TableInfo] | None = None) -> None:
    read = Query.read(query)
    found = [r.sql for r in rewrites(read, TABLES if tables is None else tables) if r.kind == kind]
    assert found == []


def _without(table: str, column: str, **changes: Any) -> dict[str, TableInfo]:
    """TABLES with one column changed (nullable, data_type) or dropped from the primary key."""
    info = TABLES[table]
    columns = tuple(ColumnInfo(c.name, changes.get("data_type", c.data_type),
                               changes.get("nullable", c.nullable))
                    if c.name == column else c for c in info.columns)
    key = tuple(k for k in info.primary_key if k != column or changes.get("keep_key", True))
    return {**TABLES, table: TableInfo(info.name, info.rows, info.size_mb, columns, info.indexes, key)}


# -- NOT IN → NOT EXISTS ------------------------------------------------------------------------


def test_not_in_becomes_not_exists_when_both_columns_are_not_null() -> None:
    r = _one("SELECT u.id, u.email FROM users u WHERE u.id NOT IN (SELECT user_id FROM orders "
             "WHERE status = 'void') ORDER BY u.id LIMIT 20", "not_in_to_not_exists")
    nodes = _nodes(r.sql)
    assert nodes["EXISTS_SUBLINK"] == 1 and nodes["NOT_EXPR"] == 1 and nodes["ANY_SUBLINK"] == 0
    assert nodes["sortClause"] == 1 and nodes["limitCount"] == 1
    assert "user_id = u.id" in r.sql and "status = 'void'" in r.sql
    assert "users.id is a primary-key column" in r.reason and "orders.user_id is NOT NULL" in r.reason
    assert "NULL" in r.reason and r.changes == "" and not r.needs_application_change


def test_not_in_keeps_the_subquery_where_and_qualifies_the_outer_column() -> None:
    r = _one("SELECT id FROM users WHERE id NOT IN (SELECT o.user_id FROM orders o WHERE o.total > 10)",
             "not_in_to_not_exists")
    assert "WHERE o.total > 10 AND o.user_id = users.id" in r.sql


@pytest.mark.parametrize("query, tables", [
    pytest.param("SELECT id FROM users WHERE id NOT IN (SELECT coupon_id FROM orders)", None,
                 id="nullable-subquery-column"),
    pytest.param("SELECT id FROM users WHERE referrer_id NOT IN (SELECT user_id FROM orders)", None,
                 id="nullable-outer-column"),
    pytest.param("SELECT id FROM users WHERE id NOT IN (SELECT user_id FROM orders)",
                 _without("orders", "user_id", nullable=True), id="nullable-per-catalog"),
    pytest.param("SELECT o.id FROM users u LEFT JOIN orders o ON o.user_id = u.id "
                 "WHERE o.id NOT IN (SELECT user_id FROM orders)", None, id="outer-join-null-extended"),
    pytest.param("SELECT id FROM users WHERE id NOT IN (SELECT user_id FROM orders)", {},
                 id="unknown-tables"),
    pytest.param("SELECT id FROM users WHERE id NOT IN (SELECT user_id FROM orders LIMIT 3)", None,
                 id="limit-inside"),
    pytest.param("SELECT id FROM users WHERE id NOT IN (SELECT max(user_id) FROM orders)", None,
                 id="aggregate-inside"),
    pytest.param("SELECT id FROM orders WHERE id NOT IN (SELECT user_id FROM orders)", None,
                 id="same-name-would-be-captured"),
])
def test_not_in_is_left_alone_when_a_null_is_possible_or_unknown(
        query: str, tables: dict[str, TableInfo] | None) -> None:
    _none(query, "not_in_to_not_exists", tables)


# -- sargable ranges ----------------------------------------------------------------------------


@pytest.mark.parametrize("predicate, low, high", [
    ("created_at::date = '2024-03-05'", "CAST('2024-03-05' AS DATE)",
     "CAST('2024-03-05' AS DATE) + INTERVAL '1 day'"),
    ("date(created_at) = '2024-03-05'", "CAST('2024-03-05' AS DATE)",
     "CAST('2024-03-05' AS DATE) + INTERVAL '1 day'"),
    ("CAST(created_at AS date) = DATE '2024-03-05'", "CAST('2024-03-05' AS DATE)",
     "CAST('2024-03-05' AS DATE) + INTERVAL '1 day'"),
    ("'2024-03-05' = created_at::date", "CAST('2024-03-05' AS DATE)",
     "CAST('2024-03-05' AS DATE) + INTERVAL '1 day'"),
    ("date_trunc('day', created_at) = '2024-03-05'", "CAST('2024-03-05' AS DATE)",
     "CAST('2024-03-05' AS DATE) + INTERVAL '1 day'"),
    ("date_trunc('month', created_at) = '2024-03-01 00:00:00'", "CAST('2024-03-01' AS DATE)",
     "CAST('2024-03-01' AS DATE) + INTERVAL '1 month'"),
    ("date_trunc('year', created_at) = '2024-01-01'::timestamp", "CAST('2024-01-01' AS DATE)",
     "CAST('2024-01-01' AS DATE) + INTERVAL '1 year'"),
    ("extract(year FROM created_at) = 2024", "CAST('2024-01-01' AS DATE)", "CAST('2025-01-01' AS DATE)"),
    ("date_part('year', created_at) = 2024", "CAST('2024-01-01' AS DATE)", "CAST('2025-01-01' AS DATE)"),
    ("extract(year FROM created_at) BETWEEN 2020 AND 2023", "CAST('2020-01-01' AS DATE)",
     "CAST('2024-01-01' AS DATE)"),
    ("created_at::date BETWEEN '2024-03-01' AND '2024-03-31'", "CAST('2024-03-01' AS DATE)",
     "CAST('2024-03-31' AS DATE) + INTERVAL '1 day'"),
])
def test_a_function_of_a_timestamp_compared_with_a_constant_becomes_a_range(
        predicate: str, low: str, high: str) -> None:
    r = _one(f"SELECT id, total FROM orders WHERE status = 'paid' AND {predicate} ORDER BY id DESC LIMIT 5",
             "sargable_range")
    assert f"created_at >= {low} AND created_at < {high}" in r.sql
    nodes = _nodes(r.sql)
    assert nodes["FuncCall"] == 0 and nodes["sortClause"] == 1 and nodes["limitCount"] == 1
    assert "status = 'paid'" in r.sql
    assert r.index_hints == (("orders", ("created_at",)),)
    assert "timestamp without time zone" in r.reason and "TimeZone" not in r.reason


def test_timestamptz_ranges_say_they_rely_on_the_session_time_zone() -> None:
    r = _one("SELECT id FROM users WHERE signed_up::date = '2024-03-05'", "sargable_range")
    assert "signed_up >= CAST('2024-03-05' AS DATE)" in r.sql
    assert "session TimeZone" in r.reason and "timestamp with time zone" in r.reason


def test_a_range_under_or_is_parenthesised() -> None:
    r = _one("SELECT id FROM orders WHERE created_at::date = '2024-03-05' OR status = 'x'", "sargable_range")
    assert _nodes(r.sql)["OR_EXPR"] == 1 and _nodes(r.sql)["AND_EXPR"] == 1
    assert "(created_at >= " in r.sql


def test_a_year_of_a_date_column_is_a_date_range() -> None:
    r = _one("SELECT id FROM users WHERE extract(year FROM birthday) = 1990", "sargable_range")
    assert "birthday >= CAST('1990-01-01' AS DATE) AND birthday < CAST('1991-01-01' AS DATE)" in r.sql


@pytest.mark.parametrize("predicate", [
    "date_trunc('month', created_at) = '2024-03-15'",  # never equal: not the start of a month
    "date_trunc('day', created_at) = '2024-03-05 10:00'",
    "date_trunc('week', created_at) = '2024-03-04'",
    "created_at::date = '2024-03-05'::timestamp",  # compared as timestamps, not dates
    "extract(month FROM created_at) = 3",
    "extract(year FROM created_at) = 2024.5",
    "status::date = '2024-03-05'",  # not a timestamp column
    "created_at::date = status",  # not a constant
    "created_at::date BETWEEN SYMMETRIC '2024-03-05' AND '2024-03-01'",
    "date_trunc('month', created_at) BETWEEN '2024-01-01' AND '2024-03-01'",
])
def test_no_range_when_the_equivalence_does_not_hold(predicate: str) -> None:
    _none(f"SELECT id FROM orders WHERE {predicate}", "sargable_range")


def test_no_range_when_the_column_type_is_unknown() -> None:
    _none("SELECT id FROM orders WHERE created_at::date = '2024-03-05'", "sargable_range", {})
    _none("SELECT id FROM users WHERE birthday::date = '2024-03-05'", "sargable_range")  # a no-op cast


# -- correlated scalar subquery → join -----------------------------------------------------------


def test_a_count_subquery_in_the_select_list_becomes_a_left_join_with_coalesce() -> None:
    r = _one("SELECT DISTINCT u.id, (SELECT count(*) FROM orders o WHERE o.user_id = u.id "
             "AND o.status = 'paid') AS paid FROM users u ORDER BY paid DESC, u.id LIMIT 10",
             "scalar_subquery_to_join")
    nodes = _nodes(r.sql)
    assert nodes["JOIN_LEFT"] == 1 and nodes["EXPR_SUBLINK"] == 0 and nodes["groupClause"] == 1
    assert nodes["distinctClause"] == 1 and nodes["sortClause"] == 1 and nodes["limitCount"] == 1
    assert "COALESCE(afs_s.afs_v, 0) AS paid" in r.sql
    assert ("LEFT JOIN (SELECT o.user_id AS afs_k, COUNT(*) AS afs_v FROM orders AS o "
            "WHERE o.status = 'paid' GROUP BY o.user_id) AS afs_s ON afs_s.afs_k = u.id") in r.sql
    assert r.index_hints == (("orders", ("user_id",)),)
    assert "count is 0 over no rows" in r.reason


def test_a_sum_subquery_keeps_its_null_and_its_output_name() -> None:
    r = _one("SELECT u.email, (SELECT sum(total) FROM orders WHERE orders.user_id = u.id) FROM users u",
             "scalar_subquery_to_join")
    assert "afs_s.afs_v AS sum" in r.sql and "COALESCE" not in r.sql


def test_a_comparison_in_where_becomes_an_inner_join() -> None:
    r = _one("SELECT u.id FROM users u WHERE u.id > 10 AND "
             "u.id < (SELECT avg(total) FROM orders o WHERE o.user_id = u.id)", "scalar_subquery_to_join")
    nodes = _nodes(r.sql)
    assert nodes["JOIN_INNER"] == 1 and nodes["EXPR_SUBLINK"] == 0
    assert "u.id < afs_s.afs_v" in r.sql and "comparison with NULL is never TRUE" in r.reason


def test_a_count_in_where_stays_a_left_join_because_no_rows_count_zero() -> None:
    r = _one("SELECT u.id FROM users u WHERE (SELECT count(*) FROM orders o WHERE o.user_id = u.id) < 2",
             "scalar_subquery_to_join")
    assert _nodes(r.sql)["JOIN_LEFT"] == 1 and "COALESCE(afs_s.afs_v, 0) < 2" in r.sql


def test_the_derived_table_alias_does_not_clash() -> None:
    r = _one("SELECT afs_s.id, (SELECT max(created_at) FROM orders o WHERE o.user_id = afs_s.id) "
             "FROM users afs_s", "scalar_subquery_to_join")
    assert "AS afs_s2 ON afs_s2.afs_k = afs_s.id" in r.sql


@pytest.mark.parametrize("query", [
    pytest.param("SELECT u.id, (SELECT count(*) FROM orders o WHERE o.user_id = u.id AND o.id = u.id) "
                 "FROM users u", id="two-correlations"),
    pytest.param("SELECT u.id, (SELECT count(*) FROM orders o WHERE o.user_id > u.id) FROM users u",
                 id="not-an-equality"),
    pytest.param("SELECT u.id, (SELECT o.total FROM orders o WHERE o.user_id = u.id LIMIT 1) FROM users u",
                 id="not-an-aggregate"),
    pytest.param("SELECT u.id, (SELECT max(total) FROM orders o WHERE o.user_id = u.id LIMIT 1) FROM users u",
                 id="limit-inside"),
    pytest.param("SELECT *, (SELECT count(*) FROM orders o WHERE o.user_id = u.id) FROM users u",
                 id="select-star-would-grow"),
    pytest.param("SELECT u.country, (SELECT count(*) FROM orders o WHERE o.user_id = min(u.id)) FROM users u "
                 "GROUP BY u.country", id="outer-group-by"),
    pytest.param("SELECT u.id, (SELECT count(*) FROM orders o WHERE user_id = id) FROM users u",
                 id="not-correlated-at-all"),
    pytest.param("SELECT u.id, (SELECT count(*) FROM orders o WHERE o.user_id = u.id) FROM users u, orders x",
                 id="comma-join"),
    pytest.param("SELECT u.id, (SELECT coalesce(sum(total), 0) FROM orders o WHERE o.user_id = u.id) "
                 "FROM users u", id="expression-over-aggregate"),
])
def test_scalar_subquery_is_left_alone(query: str) -> None:
    _none(query, "scalar_subquery_to_join")


# -- IN ↔ EXISTS ---------------------------------------------------------------------------------


def test_in_becomes_exists_and_back() -> None:
    r = _one("SELECT u.id FROM users u WHERE u.country = 'FR' AND u.id IN "
             "(SELECT o.user_id FROM orders o WHERE o.status = 'paid') ORDER BY u.id LIMIT 3", "in_to_exists")
    nodes = _nodes(r.sql)
    assert nodes["EXISTS_SUBLINK"] == 1 and nodes["ANY_SUBLINK"] == 0 and nodes["limitCount"] == 1
    assert "WHERE o.status = 'paid' AND o.user_id = u.id" in r.sql
    back = _one(r.sql, "exists_to_in")
    assert _nodes(back.sql)["ANY_SUBLINK"] == 1 and _nodes(back.sql)["EXISTS_SUBLINK"] == 0
    assert "u.id IN (SELECT o.user_id FROM orders AS o WHERE o.status = 'paid')" in back.sql


def test_in_to_exists_does_not_care_about_nulls() -> None:
    r = _one("SELECT id FROM users WHERE referrer_id IN (SELECT coupon_id FROM orders)", "in_to_exists")
    assert "coupon_id = users.referrer_id" in r.sql


@pytest.mark.parametrize("query", [
    "SELECT id FROM users WHERE country = 'FR' OR id IN (SELECT user_id FROM orders)",
    "SELECT id FROM users WHERE NOT (id IN (SELECT user_id FROM orders))",
    "SELECT id, id IN (SELECT user_id FROM orders) FROM users",
])
def test_in_under_or_not_or_in_the_select_list_is_left_alone(query: str) -> None:
    _none(query, "in_to_exists")


@pytest.mark.parametrize("query", [
    pytest.param("SELECT id FROM users u WHERE EXISTS (SELECT 1 FROM orders o WHERE o.user_id = u.id "
                 "AND o.coupon_id = u.referrer_id)", id="two-correlations"),
    pytest.param("SELECT id FROM users u WHERE EXISTS (SELECT count(*) FROM orders o WHERE o.user_id = u.id)",
                 id="aggregate-is-always-one-row"),
    pytest.param("SELECT id FROM users u WHERE EXISTS (SELECT 1 FROM orders o WHERE o.user_id < u.id)",
                 id="not-an-equality"),
    pytest.param("SELECT id FROM users u WHERE u.id = 1 OR EXISTS (SELECT 1 FROM orders o "
                 "WHERE o.user_id = u.id)", id="under-or"),
    pytest.param("SELECT id FROM users u WHERE EXISTS (SELECT 1 FROM orders o "
                 "WHERE o.user_id = u.id LIMIT 1)", id="limit-inside"),
])
def test_exists_is_left_alone(query: str) -> None:
    _none(query, "exists_to_in")


# -- redundant DISTINCT --------------------------------------------------------------------------


@pytest.mark.parametrize("query, fact", [
    ("SELECT DISTINCT id, status FROM orders WHERE total > 5 ORDER BY id LIMIT 5", "the primary key (id)"),
    ("SELECT DISTINCT o.status, o.id AS order_id FROM orders o", "the primary key (id)"),
    ("SELECT DISTINCT * FROM orders", "the primary key (id)"),
    ("SELECT DISTINCT email, country FROM users", "users_email_key"),
    ("SELECT DISTINCT status, count(*) FROM orders GROUP BY status", "GROUP BY key"),
    # a join that cannot repeat an order: each order has at most one user (users.id is its key)
    ("SELECT DISTINCT o.id FROM orders o JOIN users u ON u.id = o.user_id", "u by (id)"),
    ("SELECT DISTINCT o.id, o.total FROM orders o JOIN users u ON o.user_id = u.id"
     " WHERE u.country IN ('DE', 'FR')", "primary key (id) of o"),
    ("SELECT DISTINCT o.id, u.email FROM orders o LEFT JOIN users u ON u.id = o.user_id", "u by (id)"),
    ("SELECT DISTINCT o.* FROM users u JOIN orders o ON o.user_id = u.id WHERE u.email = 'a@b'",
     "primary key (id) of o"),
    ("SELECT DISTINCT o.id FROM orders o, users u WHERE u.id = o.user_id", "u by (id)"),
])
def test_distinct_over_a_key_is_dropped(query: str, fact: str) -> None:
    r = _one(query, "redundant_distinct")
    assert _nodes(r.sql)["distinctClause"] == 0 and fact in r.reason
    assert _nodes(r.sql)["sortClause"] == _nodes(query)["sortClause"]
    assert _nodes(r.sql)["limitCount"] == _nodes(query)["limitCount"]


@pytest.mark.parametrize("query", [
    "SELECT DISTINCT status FROM orders",
    # a user has many orders: joining them repeats the user
    "SELECT DISTINCT u.id FROM users u JOIN orders o ON o.user_id = u.id",
    "SELECT DISTINCT o.id FROM orders o JOIN users u ON u.referrer_id = o.user_id",  # no key of users
    "SELECT DISTINCT o.id FROM orders o JOIN users u ON u.id > o.user_id",
    "SELECT DISTINCT o.id FROM orders o, users u",
    "SELECT DISTINCT o.id FROM orders o RIGHT JOIN users u ON u.id = o.user_id",
    "SELECT DISTINCT o.id FROM orders o LEFT JOIN users u ON u.id = o.coupon_id"
    " JOIN orders p ON p.user_id = o.user_id",
    "SELECT DISTINCT ON (user_id) id, user_id FROM orders",
    "SELECT DISTINCT country FROM users",  # a nullable unique index would not do either
    "SELECT DISTINCT status FROM orders GROUP BY status, user_id",
    "SELECT DISTINCT id, unnest(ARRAY[1, 1]) FROM orders",
])
def test_distinct_that_may_remove_rows_is_kept(query: str) -> None:
    _none(query, "redundant_distinct")


def test_a_unique_index_over_a_nullable_column_is_no_key() -> None:
    tables = _without("users", "email", nullable=True)
    _none("SELECT DISTINCT email, country FROM users", "redundant_distinct", tables)


# -- OR → UNION ALL ------------------------------------------------------------------------------


def test_or_over_two_columns_becomes_union_all_with_is_not_true() -> None:
    r = _one("SELECT id, status FROM orders WHERE total > 0 AND (status = 'paid' OR user_id = 7)",
             "or_to_union")
    nodes = _nodes(r.sql)
    assert nodes["SETOP_UNION_ALL"] == 1 and nodes["OR_EXPR"] == 0 and nodes["IS_NOT_TRUE"] == 0
    assert "user_id = 7 AND NOT (status = 'paid') IS TRUE" in r.sql
    assert r.sql.count("total > 0") == 2
    assert r.index_hints == (("orders", ("status",)), ("orders", ("user_id",)))
    assert '"BooleanTest"' in pg_parser.parse_sql_json(r.sql)


def test_order_by_limit_offset_move_outside_the_union() -> None:
    r = _one("SELECT o.id, o.created_at FROM orders o WHERE o.status = 'paid' OR o.user_id = 7 "
             "ORDER BY o.created_at DESC, 1 LIMIT 10 OFFSET 20", "or_to_union")
    assert r.sql.startswith("SELECT * FROM (SELECT o.id, o.created_at FROM orders AS o "
                            "WHERE o.status = 'paid' UNION ALL ")
    assert r.sql.endswith(") AS afs_u ORDER BY afs_u.created_at DESC, afs_u.id LIMIT 10 OFFSET 20")


def test_three_disjuncts_make_three_branches() -> None:
    r = _one("SELECT * FROM orders WHERE status = 'a' OR user_id = 1 OR coupon_id IS NULL ORDER BY id",
             "or_to_union")
    assert _nodes(r.sql)["SETOP_UNION_ALL"] == 2
    assert "coupon_id IS NULL AND NOT (status = 'a' OR user_id = 1) IS TRUE" in r.sql
    assert r.sql.endswith("ORDER BY afs_u.id")


@pytest.mark.parametrize("query", [
    pytest.param("SELECT count(*) FROM orders WHERE status = 'a' OR user_id = 1", id="aggregate"),
    pytest.param("SELECT DISTINCT user_id FROM orders WHERE status = 'a' OR user_id = 1", id="distinct"),
    pytest.param("SELECT id FROM orders WHERE status = 'a' OR status = 'b'", id="one-column"),
    pytest.param("SELECT id FROM orders WHERE status = 'a' OR user_id = 1 ORDER BY total",
                 id="order-not-output"),
    pytest.param("SELECT o.id FROM orders o JOIN users u ON u.id = o.user_id WHERE o.status = 'a' "
                 "OR u.country = 'FR'", id="two-tables"),
    pytest.param("SELECT id, row_number() OVER () FROM orders WHERE status = 'a' OR user_id = 1",
                 id="window"),
    pytest.param("SELECT id FROM orders WHERE status = 'a' OR user_id = 1 UNION SELECT 1", id="set-op"),
    pytest.param("SELECT id FROM orders WHERE status = 'a' OR lower(status) = 'b'", id="function-of-column"),
    pytest.param("SELECT id FROM orders WHERE status = 'a' OR user_id = 1 FOR UPDATE", id="locking"),
])
def test_or_is_left_alone(query: str) -> None:
    _none(query, "or_to_union")


# -- keyset pagination ---------------------------------------------------------------------------


def test_keyset_probe_and_page() -> None:
    query = "SELECT id, status FROM orders WHERE status = 'paid' ORDER BY created_at, id LIMIT 10 OFFSET 40"
    probe = keyset_probe(Query.read(query), TABLES)
    assert probe is not None
    assert probe.keys == ("created_at", "id") and not probe.descending and probe.offset == 40
    assert probe.sql == ("SELECT created_at, id FROM orders WHERE status = 'paid' "
                         "ORDER BY created_at, id LIMIT 1 OFFSET 39")
    r = keyset_rewrite(Query.read(query), probe, (dt.datetime(2024, 3, 5, 10, 30), 1234))
    assert r is not None and r.kind == "keyset_pagination"
    assert r.sql == ("SELECT id, status FROM orders WHERE status = 'paid' AND "
                     "(created_at, id) > ('2024-03-05T10:30:00', 1234) ORDER BY created_at, id LIMIT 10")
    nodes = _nodes(r.sql)
    assert nodes["limitOffset"] == 0 and nodes["limitCount"] == 1 and nodes["RowExpr"] == 2
    assert r.needs_application_change and "OFFSET 40" in r.changes
    assert r.index_hints == (("orders", ("created_at", "id")),)


def test_keyset_descending_single_key_and_the_first_row() -> None:
    query = "SELECT * FROM users ORDER BY id DESC OFFSET 1"
    probe = keyset_probe(Query.read(query), TABLES)
    assert probe is not None and probe.descending
    assert probe.sql == "SELECT id FROM users ORDER BY id DESC LIMIT 1"
    r = keyset_rewrite(Query.read(query), probe, [99])
    assert r is not None and r.sql == "SELECT * FROM users WHERE id < 99 ORDER BY id DESC"


@pytest.mark.parametrize("query", [
    pytest.param("SELECT * FROM orders ORDER BY created_at DESC, id LIMIT 10 OFFSET 20",
                 id="mixed-directions"),
    pytest.param("SELECT * FROM orders ORDER BY created_at LIMIT 10 OFFSET 20", id="not-unique"),
    pytest.param("SELECT * FROM orders ORDER BY coupon_id, id LIMIT 10 OFFSET 20", id="nullable-key"),
    pytest.param("SELECT * FROM orders ORDER BY id LIMIT 10", id="no-offset"),
    pytest.param("SELECT * FROM orders ORDER BY id LIMIT 10 OFFSET 0", id="offset-zero"),
    pytest.param("SELECT o.* FROM orders o JOIN users u ON u.id = o.user_id ORDER BY o.id LIMIT 10 OFFSET 5",
                 id="join"),
    pytest.param("SELECT id, row_number() OVER (ORDER BY id) FROM orders ORDER BY id OFFSET 5", id="window"),
    pytest.param("SELECT total AS id FROM orders ORDER BY id OFFSET 5", id="output-name-shadows"),
    pytest.param("SELECT * FROM orders ORDER BY lower(status), id OFFSET 5", id="expression-key"),
])
def test_no_keyset_probe(query: str) -> None:
    assert keyset_probe(Query.read(query), TABLES) is None


def test_keyset_rewrite_refuses_a_key_it_cannot_write() -> None:
    query = "SELECT * FROM orders ORDER BY created_at, id LIMIT 10 OFFSET 20"
    probe = keyset_probe(Query.read(query), TABLES)
    assert probe is not None
    assert keyset_rewrite(Query.read(query), probe, [1]) is None
    assert keyset_rewrite(Query.read(query), probe, [b"\x00", 1]) is None
    assert keyset_rewrite(Query.read(query), probe, [None, 1]) is None
    other = Query.read("SELECT * FROM orders ORDER BY id LIMIT 10 OFFSET 20")
    assert keyset_rewrite(other, probe, [1, 2]) is None
    assert keyset_rewrite(Query.read(query.replace("OFFSET 20", "OFFSET 30")), probe, [1, 2]) is None
    assert keyset_rewrite(Query.read(query.replace(", id", ", id DESC")), probe, [1, 2]) is None


# -- the whole -----------------------------------------------------------------------------------


QUERIES = [
    "SELECT u.id FROM users u WHERE u.id NOT IN (SELECT user_id FROM orders) "
    "AND u.signed_up::date = '2024-01-02' "
    "AND u.id IN (SELECT user_id FROM orders WHERE status = 'a' OR user_id = 3)",
    "WITH recent AS (SELECT * FROM orders WHERE created_at > '2024-01-01') "
    "SELECT id, (SELECT count(*) FROM recent r WHERE r.user_id = users.id) FROM users "
    "WHERE country = 'FR' OR email LIKE 'a%' ORDER BY 1",
    "SELECT DISTINCT id FROM orders WHERE extract(year FROM created_at) = 2023",
]


@pytest.mark.parametrize("query", QUERIES)
def test_every_rewrite_parses_as_one_select_and_is_one_edit(query: str) -> None:
    found = rewrites(Query.read(query), TABLES)
    assert found
    for r in found:
        (statement,) = pglast.parse_sql(r.sql)
        assert type(statement.stmt).__name__ == "SelectStmt"
        assert r.reason and r.kind in {rule.__name__ for rule in rewrites_module.RULES}
    assert len({r.sql for r in found}) == len(found)


def test_a_cte_named_like_a_table_is_not_that_table() -> None:
    query = ("WITH orders AS (SELECT 1 AS user_id UNION ALL SELECT NULL) "
             "SELECT id FROM users WHERE id NOT IN (SELECT user_id FROM orders)")
    _none(query, "not_in_to_not_exists")


def test_input_that_is_not_one_query_is_refused() -> None:
    """The rules take the one Query, and there is none unless the text is one query."""
    with pytest.raises(InputError):
        rewrites(Query.read("DELETE FROM orders"), TABLES)
    with pytest.raises(InputError):
        keyset_probe(Query.read("SELECT 1; SELECT 2"), TABLES)
    assert rewrites(Query.read("SELECT 1"), TABLES) == ()


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_the_module_is_pure() -> None:
    allowed = {"__future__", "datetime", "re", "uuid", "collections.abc", "dataclasses", "decimal",
               "sqlglot", "sqlglot.errors", "pglast", "afs.errors", "afs.query.query", "afs.query.shape",
               "afs.query.text", "afs.models",
               "afs.pg.names", "afs.pg.functions"}
    imported = set(_imports(Path(rewrites_module.__file__)))
    assert imported <= allowed, imported - allowed
