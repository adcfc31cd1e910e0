"""The benchmark suite (afs/suite.py): pure, no server.

Variants are checked against hand-written SQL by comparing PostgreSQL parse trees
(pglast, positions ignored), so the tests pin meaning rather than sqlglot's spacing.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pglast
import pytest
from pglast import parser as pg_parser

from afs.errors import InputError
from afs.models import ColumnInfo, ColumnStats, QueryVariant, TableInfo
from afs.query.query import Query
from afs.suite import build_suite, result_checksum_sql

# -- the demo schema ---------------------------------------------------------------------

TSTZ = "timestamp with time zone"
# 13 bounds, as pg_stats prints them: 12 equal-frequency buckets over 2024
BOUNDS = (*(f"2024-{m:02d}-01 00:00:00+00" for m in range(1, 13)), "2024-12-31 18:30:00.25+00")
LO = "2024-10-01 00:00:00+00:00"  # bounds[floor(0.75 * 12)] = bounds[9]
HI = "2025-01-01 18:30:00.250000+00:00"  # the last bound + 1 day
HISTOGRAM = ColumnStats(null_frac=0.0, n_distinct=-1.0, correlation=0.99, histogram_bounds=BOUNDS)


def table(name: str, columns: Sequence[tuple[str, str]], pk: Sequence[str],
          stats: Mapping[str, ColumnStats] | None = None) -> TableInfo:
    return TableInfo(name=name, rows=100_000, size_mb=10.0,
                     columns=tuple(ColumnInfo(c, t) for c, t in columns), indexes=(),
                     primary_key=tuple(pk), column_stats=dict(stats or {}))


ORDERS = table("orders", [("id", "bigint"), ("user_id", "bigint"), ("status", "text"),
                          ("total_amount", "numeric"), ("shipping_country", "text"),
                          ("created_at", TSTZ), ("updated_at", TSTZ)], ["id"],
               {"created_at": HISTOGRAM, "updated_at": HISTOGRAM})
USERS = table("users", [("id", "bigint"), ("email", "text"), ("country", "text"), ("tier", "text"),
                        ("created_at", TSTZ)], ["id"], {"created_at": HISTOGRAM})
PRODUCTS = table("products", [("id", "bigint"), ("name", "text"), ("category", "text"),
                              ("price", "numeric")], ["id"])
ORDER_ITEMS = table("order_items", [("order_id", "bigint"), ("line_no", "integer"),
                                    ("product_id", "bigint"), ("quantity", "integer"),
                                    ("unit_price", "numeric")], ["order_id", "line_no"])
EVENTS_NO_STATS = table("events", [("id", "bigint"), ("user_id", "bigint"), ("kind", "text"),
                                   ("payload", "jsonb"), ("created_at", TSTZ)], ["id"],
                        {"created_at": ColumnStats(null_frac=0.0, n_distinct=3.0)})

ISSUE_QUERY = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending' AND o.user_id = 4242 "
               "ORDER BY o.created_at DESC")


# -- helpers -----------------------------------------------------------------------------


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items()
                if not re.fullmatch(r"location|stmt_len|.*list_start|.*list_end", k)}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def tree(sql: str) -> Any:
    return _strip(json.loads(pg_parser.parse_sql_json(sql)))


def assert_same(actual: str, expected: str) -> None:
    assert tree(actual) == tree(expected), f"\n  got:      {actual}\n  expected: {expected}"


def suite(query: str, main: TableInfo | None = ORDERS, alias: str | None = None,
          ) -> tuple[dict[str, QueryVariant], tuple[str, ...]]:
    variants, skipped = build_suite(Query.read(query), main, alias)
    for variant in variants:  # every emitted statement is one SELECT for PostgreSQL
        stmts = pglast.parse_sql(variant.sql)
        assert len(stmts) == 1 and type(stmts[0].stmt).__name__ == "SelectStmt", variant.sql
        for ordered in (True, False):
            assert len(pglast.parse_sql(result_checksum_sql(variant.sql, ordered))) == 1
    names = [v.name for v in variants]
    assert names[0] == "baseline" and len(set(names)) == len(names)
    assert len(variants) + len(skipped) == 4
    return {v.name: v for v in variants}, skipped


def flags(variant: QueryVariant) -> tuple[bool, bool]:
    return variant.ordered, variant.exact


# -- the issue's example -------------------------------------------------------------------


def test_issue_example_has_four_variants() -> None:
    v, skipped = suite(ISSUE_QUERY, ORDERS, "o")
    assert skipped == ()
    assert v["baseline"].sql == ISSUE_QUERY  # the user's text, untouched
    assert flags(v["baseline"]) == (False, True)  # created_at DESC alone can tie

    assert_same(v["limit"].sql, ISSUE_QUERY + " LIMIT 10")
    assert flags(v["limit"]) == (False, False)  # LIMIT without a total order: compare counts

    assert_same(v["filter"].sql,
                "SELECT o.id, o.total_amount FROM orders o WHERE (o.status = 'pending' AND o.user_id = 4242) "
                f"AND (o.created_at >= '{LO}' AND o.created_at < '{HI}') ORDER BY o.created_at DESC")
    assert flags(v["filter"]) == (False, True)
    assert "o.created_at" in v["filter"].note and "25%" in v["filter"].note

    assert_same(v["sort"].sql,
                "SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending' AND o.user_id = 4242 "
                "ORDER BY o.created_at DESC, o.id")
    assert flags(v["sort"]) == (True, True)  # the primary key breaks every tie
    assert "tie-breaker" in v["sort"].note


def test_baseline_keeps_the_text_but_drops_the_terminator() -> None:
    query = "  select *\n  from orders -- all of them\n  where status = 'paid' ;  -- trailing\n"
    v, _ = suite(query)
    assert v["baseline"].sql == "select *\n  from orders -- all of them\n  where status = 'paid'"


@pytest.mark.parametrize("query", ["DELETE FROM orders", "SELECT 1; SELECT 2", "SELEC * FRM orders", ""])
def test_only_one_select_is_accepted(query: str) -> None:
    """The suite takes the one Query, and there is none unless the text is one SELECT."""
    with pytest.raises(InputError):
        build_suite(Query.read(query), ORDERS, None)


# -- aggregation, joins, CTEs, set operations ---------------------------------------------------


def test_aggregation_filters_in_where_and_sorts_by_the_group_key() -> None:
    query = "SELECT status, count(*) FROM orders GROUP BY status"
    v, skipped = suite(query)
    assert skipped == ()
    assert flags(v["baseline"]) == (False, True)
    assert_same(v["limit"].sql, query + " LIMIT 10")
    assert flags(v["limit"]) == (False, False)
    assert_same(v["filter"].sql, "SELECT status, count(*) FROM orders WHERE orders.created_at >= "
                                 f"'{LO}' AND orders.created_at < '{HI}' GROUP BY status")
    assert "HAVING" not in v["filter"].sql.upper()
    assert_same(v["sort"].sql, query + " ORDER BY status")
    assert flags(v["sort"]) == (True, True)  # one row per group key


def test_aggregation_with_having_keeps_having_and_adds_to_where() -> None:
    v, _ = suite("SELECT user_id, sum(total_amount) AS spent FROM orders o GROUP BY user_id "
                 "HAVING sum(total_amount) > 1000 ORDER BY spent DESC", ORDERS, "o")
    assert_same(v["filter"].sql,
                f"SELECT user_id, sum(total_amount) AS spent FROM orders o WHERE o.created_at >= '{LO}' "
                f"AND o.created_at < '{HI}' GROUP BY user_id HAVING sum(total_amount) > 1000 "
                "ORDER BY spent DESC")
    assert_same(v["sort"].sql, "SELECT user_id, sum(total_amount) AS spent FROM orders o GROUP BY user_id "
                               "HAVING sum(total_amount) > 1000 ORDER BY spent DESC, user_id")
    assert flags(v["sort"]) == (True, True)


def test_single_row_aggregate_is_ordered_and_has_nothing_to_sort() -> None:
    v, skipped = suite("SELECT count(*), max(created_at) FROM orders WHERE status = 'paid'")
    assert flags(v["baseline"]) == (True, True)
    assert flags(v["limit"]) == (True, True)
    assert skipped == ("sort: the query aggregates to a single row: nothing to sort",)


def test_join_uses_the_alias_and_is_not_ordered_by_the_main_key_alone() -> None:
    query = ("SELECT o.id, u.email, o.total_amount FROM orders o JOIN users u ON u.id = o.user_id "
             "WHERE u.country = 'DE' ORDER BY o.total_amount DESC")
    v, skipped = suite(query, ORDERS, "o")
    assert skipped == ()
    assert_same(v["filter"].sql,
                "SELECT o.id, u.email, o.total_amount FROM orders o JOIN users u ON u.id = o.user_id "
                f"WHERE u.country = 'DE' AND (o.created_at >= '{LO}' AND o.created_at < '{HI}') "
                "ORDER BY o.total_amount DESC")
    assert_same(v["sort"].sql, query + ", o.id")
    # a join can repeat an order row: the main table's key alone is no total order (rule 5)
    assert flags(v["sort"]) == (False, True)
    assert flags(v["limit"]) == (False, False)


def test_join_ordered_by_every_output_column_is_ordered() -> None:
    v, skipped = suite("SELECT o.id, u.email FROM orders o JOIN users u ON u.id = o.user_id "
                       "ORDER BY 2, o.id LIMIT 5", ORDERS, "o")
    assert flags(v["baseline"]) == (True, True)  # rule 4: ties are identical rows
    assert flags(v["limit"]) == (True, True)
    assert skipped == ("sort: the query already orders by the primary key of orders: "
                       "the sort variant would repeat the baseline",)


def test_cte_gets_the_filter_inside_the_cte() -> None:
    query = ("WITH paid AS (SELECT * FROM orders WHERE status = 'paid') "
             "SELECT user_id, sum(total_amount) FROM paid GROUP BY user_id")
    v, skipped = suite(query)
    assert skipped == ()
    assert_same(v["filter"].sql,
                "WITH paid AS (SELECT * FROM orders WHERE status = 'paid' AND "
                f"(orders.created_at >= '{LO}' AND orders.created_at < '{HI}')) "
                "SELECT user_id, sum(total_amount) FROM paid GROUP BY user_id")
    assert_same(v["limit"].sql, query + " LIMIT 10")
    assert_same(v["sort"].sql, query + " ORDER BY user_id")
    assert flags(v["sort"]) == (True, True)


def test_union_is_wrapped_for_limit_and_has_no_filter() -> None:
    query = ("SELECT id, created_at FROM orders WHERE status = 'pending' "
             "UNION SELECT id, created_at FROM orders WHERE status = 'failed'")
    v, skipped = suite(query)
    assert skipped == ("filter: a set operation has no single scope for a date-range predicate",)
    assert_same(v["limit"].sql, f"SELECT * FROM ({query}) AS afs_q LIMIT 10")
    assert flags(v["limit"]) == (False, False)
    assert "set operation" in v["limit"].note
    assert_same(v["sort"].sql, query + " ORDER BY 1, 2")
    assert flags(v["sort"]) == (True, True)


# -- LIMIT ---------------------------------------------------------------------------------------------


def test_a_smaller_limit_is_kept() -> None:
    v, _ = suite("SELECT * FROM orders WHERE user_id = 7 ORDER BY created_at DESC LIMIT 5")
    assert_same(v["limit"].sql, "SELECT * FROM orders WHERE user_id = 7 ORDER BY created_at DESC LIMIT 5")
    assert "LIMIT 5 kept" in v["limit"].note
    assert flags(v["baseline"]) == (False, False)  # LIMIT 5 over created_at ties


def test_a_larger_limit_is_lowered_and_offset_kept() -> None:
    v, _ = suite("SELECT * FROM orders ORDER BY id LIMIT 50 OFFSET 20")
    assert_same(v["limit"].sql, "SELECT * FROM orders ORDER BY id LIMIT 10 OFFSET 20")
    assert flags(v["limit"]) == (True, True)  # ordered by the primary key: rows compare exactly


@pytest.mark.parametrize("tail", ["LIMIT $1", "FETCH FIRST 3 ROWS ONLY", "LIMIT ALL"])
def test_non_constant_limits_are_wrapped(tail: str) -> None:
    query = f"SELECT id, status FROM orders WHERE user_id = 7 ORDER BY id {tail}"
    v, _ = suite(query)
    assert_same(v["limit"].sql, f"SELECT * FROM ({query}) AS afs_q LIMIT 10")
    # the inner ORDER BY id is total; the outer SELECT * keeps its order
    assert flags(v["limit"]) == (True, True)
    assert "wrapped" in v["limit"].note


def test_nested_limit_without_order_makes_every_variant_inexact() -> None:
    query = ("SELECT o.id, i.product_id FROM orders o, LATERAL (SELECT * FROM order_items oi "
             "WHERE oi.order_id = o.id LIMIT 2) i")
    v, _ = suite(query, ORDERS, "o")
    assert all(not variant.exact for variant in v.values())


# -- the filter ------------------------------------------------------------------------------------------


def test_or_is_parenthesised_before_the_range() -> None:
    v, _ = suite("SELECT * FROM orders WHERE status = 'pending' OR shipping_country = 'DE'")
    assert_same(v["filter"].sql,
                "SELECT * FROM orders WHERE (status = 'pending' OR shipping_country = 'DE') "
                f"AND (orders.created_at >= '{LO}' AND orders.created_at < '{HI}')")
    assert "(status = 'pending' OR shipping_country = 'DE') AND" in v["filter"].sql


def test_table_without_timestamp_column_gives_three_queries() -> None:
    v, skipped = suite("SELECT category, avg(price) FROM products GROUP BY category", PRODUCTS)
    assert list(v) == ["baseline", "limit", "sort"]
    assert skipped == ("filter: no timestamp column on products: the suite has three queries",)


def test_missing_histogram_is_a_reason() -> None:
    v, skipped = suite("SELECT e.kind FROM events e WHERE e.user_id = 3", EVENTS_NO_STATS, "e")
    assert "filter" not in v
    assert len(skipped) == 1 and skipped[0].startswith("filter: ")
    assert "events.created_at: no histogram" in skipped[0]


def test_the_column_the_query_filters_on_is_preferred() -> None:
    v, _ = suite("SELECT id FROM orders WHERE updated_at > '2024-06-01'")
    assert f"orders.updated_at >= '{LO}'" in v["filter"].sql
    assert "created_at" not in v["filter"].sql


def test_first_timestamp_column_when_no_created_at_and_quoted_when_needed() -> None:
    stats = ColumnStats(histogram_bounds=("2024-01-01 00:00:00", "2024-01-03 12:00:00"))
    audit = table("audit", [("id", "bigint"), ("When", "timestamp without time zone"), ("at", "date")],
                  ["id"], {"When": stats})
    v, _ = suite("SELECT id FROM audit", audit)
    # two bounds: one bucket, lo = the first bound; hi = the last + 1 day; no zone for timestamp
    assert_same(v["filter"].sql, 'SELECT id FROM audit WHERE audit."When" >= \'2024-01-01 00:00:00\' '
                                 'AND audit."When" < \'2024-01-04 12:00:00\'')


def test_range_rule_on_a_full_histogram_of_dates() -> None:
    days = tuple(f"2024-01-{d:02d}" for d in range(1, 32)) + tuple(f"2024-02-{d:02d}" for d in range(1, 30))
    bounds = days + tuple(f"2024-03-{d:02d}" for d in range(1, 30)) + ("2024-03-30", "infinity")
    assert len(bounds) == 91  # 90 finite: 89 buckets; i = floor(0.75 * 89) = 66
    daily = table("daily", [("day", "date"), ("n", "integer")], ["day"],
                  {"day": ColumnStats(histogram_bounds=bounds)})
    v, _ = suite("SELECT * FROM daily", daily)
    finite = bounds[:-1]
    assert_same(v["filter"].sql,
                f"SELECT * FROM daily WHERE daily.day >= '{finite[66]}' AND daily.day < '2024-03-31'")
    assert finite[66] == "2024-03-07"
    assert "≈26%" in v["filter"].note  # 23 of 89 buckets


def test_share_counts_nulls_and_common_values() -> None:
    stats = ColumnStats(null_frac=0.2, most_common_vals=("2024-12-25 00:00:00+00", "2024-01-01 00:00:00+00"),
                        most_common_freqs=(0.1, 0.1), histogram_bounds=BOUNDS)
    v, _ = suite("SELECT id FROM orders", table("orders", [("id", "bigint"), ("created_at", TSTZ)], ["id"],
                                                   {"created_at": stats}))
    # 25 % of the 60 % in the histogram, plus the 10 % common value inside the range
    assert "≈25%" in v["filter"].note


def test_unknown_main_table_skips_the_filter_and_sorts_by_output() -> None:
    v, skipped = suite("SELECT id, status FROM orders", None)
    assert skipped == ("filter: the main table is unknown: no date-range predicate to add",)
    assert_same(v["sort"].sql, "SELECT id, status FROM orders ORDER BY 1, 2")
    assert flags(v["sort"]) == (True, True)


# -- the sort ------------------------------------------------------------------------------------------------


def test_sort_by_a_composite_primary_key() -> None:
    v, _ = suite("SELECT oi.* FROM order_items oi WHERE oi.product_id = 7", ORDER_ITEMS, "oi")
    assert_same(v["sort"].sql,
                "SELECT oi.* FROM order_items oi WHERE oi.product_id = 7 ORDER BY oi.order_id, oi.line_no")
    assert flags(v["sort"]) == (True, True)


def test_order_by_output_name_or_position_counts_as_the_key() -> None:
    for order in ("order_id", "1"):
        v, skipped = suite(f"SELECT id AS order_id, status FROM orders ORDER BY {order}")
        assert flags(v["baseline"]) == (True, True)
        assert len(skipped) == 1 and skipped[0].startswith("sort: the query already orders by")


def test_distinct_sorts_by_its_outputs_and_distinct_on_by_its_keys() -> None:
    v, _ = suite("SELECT DISTINCT status, shipping_country FROM orders")
    assert_same(v["sort"].sql, "SELECT DISTINCT status, shipping_country FROM orders ORDER BY 1, 2")
    assert flags(v["sort"]) == (True, True)
    v, _ = suite("SELECT DISTINCT ON (user_id) user_id, id FROM orders")
    assert_same(v["sort"].sql,
                "SELECT DISTINCT ON (user_id) user_id, id FROM orders ORDER BY user_id, orders.id")
    assert flags(v["sort"]) == (True, True)


def test_set_returning_function_is_never_ordered() -> None:
    v, _ = suite("SELECT id, jsonb_array_elements('[1,2]'::jsonb) FROM orders ORDER BY id LIMIT 3")
    assert flags(v["baseline"]) == (False, False)


def test_sqlglot_rewrites_are_noted() -> None:
    v, _ = suite("SELECT * FROM orders WHERE created_at > now() - interval '7 days'")
    assert "re-rendered" in v["limit"].note and "re-rendered" not in v["baseline"].note
    v, _ = suite(ISSUE_QUERY, ORDERS, "o")
    assert all("re-rendered" not in variant.note for variant in v.values())


# -- result checksums ----------------------------------------------------------------------------------------


def test_unordered_checksum_is_an_order_free_sum_of_hashes() -> None:
    sql = result_checksum_sql("SELECT id FROM orders WHERE status = 'paid';", ordered=False)
    assert_same(sql, "SELECT count(*) AS afs_rows, "
                     "coalesce(sum(hashtextextended(afs_q::text, 0)::numeric), 0)::text AS afs_checksum "
                     "FROM (SELECT id FROM orders WHERE status = 'paid') AS afs_q")


def test_ordered_checksum_follows_row_order() -> None:
    sql = result_checksum_sql("SELECT id FROM orders ORDER BY id -- by key", ordered=True)
    assert_same(sql, "SELECT count(*) AS afs_rows, coalesce(md5(string_agg(afs_s.afs_r::text, '|' "
                     "ORDER BY afs_s.afs_n)), '') AS afs_checksum FROM (SELECT afs_q AS afs_r, "
                     "row_number() OVER () AS afs_n FROM (SELECT id FROM orders ORDER BY id) AS afs_q) "
                     "AS afs_s")


def test_checksum_refuses_more_than_one_statement() -> None:
    with pytest.raises(ValueError):
        result_checksum_sql("SELECT 1; SELECT 2", ordered=False)


def test_suite_module_is_pure() -> None:
    source = (Path(__file__).resolve().parent.parent / "afs" / "suite.py").read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "functools", "json", "math", "re", "collections", "dataclasses",
                        "datetime", "typing", "pglast", "sqlglot", "afs"}
