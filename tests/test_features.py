"""Query features over the demo schema: counts, tables, aliases, column roles (pure)."""

from __future__ import annotations

import pytest

from afs.errors import InputError
from afs.models import ColumnUse, QueryFeatures
from afs.query.features import extract_features
from afs.query.text import parse_query, select_text


def counts(features: QueryFeatures) -> dict[str, object]:
    return {
        "joins": features.join_count, "subqueries": features.subquery_count,
        "aggregations": features.aggregation_count, "windows": features.window_count,
        "set_operations": features.set_operation_count, "order_by": features.order_by_count,
        "limit": features.has_limit, "score": features.complexity_score,
    }


def uses(features: QueryFeatures, role: str) -> list[tuple[str | None, str, str | None, object]]:
    return [(u.table, u.column, u.operator, u.value) for u in features.columns if u.role == role]


def test_simple_filter() -> None:
    features = extract_features("SELECT * FROM orders WHERE status = 'completed'")
    assert counts(features) == {"joins": 0, "subqueries": 0, "aggregations": 0, "windows": 0,
                                "set_operations": 0, "order_by": 0, "limit": False, "score": 0}
    assert features.complexity == "low"
    assert features.tables == ("orders",) and features.main_table == "orders" and features.aliases == {}
    assert features.columns == (
        ColumnUse("orders", "status", "equality", "=", "completed"),
        ColumnUse("orders", "*", "select"),
    )


def test_join_with_aliases_group_by_having_order_desc_limit() -> None:
    features = extract_features("""
        SELECT u.country, count(o.id) AS n, sum(o.total_amount) AS revenue
        FROM users u
        JOIN orders o ON o.user_id = u.id AND o.status = 'paid'
        WHERE u.tier IN ('gold', 'platinum') AND o.created_at >= '2024-01-01'
        GROUP BY u.country
        HAVING count(o.id) > 10
        ORDER BY revenue DESC, 1
        LIMIT 20
    """)
    # 1 join + 3 aggregates (two in the select list, one in HAVING) + 1 GROUP BY
    assert counts(features) == {"joins": 1, "subqueries": 0, "aggregations": 3, "windows": 0,
                                "set_operations": 0, "order_by": 1, "limit": True, "score": 5}
    assert features.complexity == "medium"
    assert features.tables == ("users", "orders") and features.main_table == "users"
    assert features.aliases == {"u": "users", "o": "orders"}
    assert uses(features, "join") == [("orders", "user_id", "=", None), ("users", "id", "=", None)]
    assert uses(features, "equality") == [("orders", "status", "=", "paid"),
                                          ("users", "tier", "IN", ("gold", "platinum"))]
    assert uses(features, "range") == [("orders", "created_at", ">=", "2024-01-01")]
    assert uses(features, "group") == [("users", "country", None, None)]
    # `revenue` is an aggregate (no sort key column); `1` is u.country
    assert uses(features, "sort") == [("users", "country", "ASC", None)]
    assert set(uses(features, "select")) == {("users", "country", None, None), ("orders", "id", None, None),
                                             ("orders", "total_amount", None, None)}
    assert ColumnUse("orders", "id", "other") in features.columns  # inside count() in HAVING


def test_in_subquery_and_correlated_exists() -> None:
    features = extract_features("""
        SELECT u.id, u.email FROM users u
        WHERE u.id IN (SELECT user_id FROM events WHERE kind = 'login')
          AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.user_id = u.id AND o.status IS NULL)
    """)
    assert counts(features) == {"joins": 0, "subqueries": 2, "aggregations": 0, "windows": 0,
                                "set_operations": 0, "order_by": 0, "limit": False, "score": 2}
    assert features.tables == ("users", "events", "orders")
    assert features.aliases == {"u": "users", "o": "orders"}
    assert features.main_table == "users"
    # unqualified columns of the subquery belong to its single table
    assert ("events", "kind", "=", "login") in uses(features, "equality")
    assert ("events", "user_id", None, None) in uses(features, "select")
    assert ("users", "id", "IN", None) in uses(features, "join")
    # the correlated reference u.id resolves through the enclosing block
    assert ("orders", "user_id", "=", None) in uses(features, "join")
    assert ("users", "id", "=", None) in uses(features, "join")
    assert ("orders", "status", "IS NULL", None) in uses(features, "equality")


def test_cte_with_between_dates_and_using() -> None:
    features = extract_features("""
        WITH spend AS (
            SELECT user_id, sum(total_amount) AS spent FROM orders
            WHERE created_at BETWEEN '2024-01-01' AND '2024-03-31'
            GROUP BY 1
        )
        SELECT u.email, s.spent FROM spend s JOIN users u USING (user_id) ORDER BY 2 DESC
    """)
    # the CTE body is a subquery; 1 join, 1 aggregate, 1 GROUP BY
    assert counts(features) == {"joins": 1, "subqueries": 1, "aggregations": 1, "windows": 0,
                                "set_operations": 0, "order_by": 1, "limit": False, "score": 4}
    assert features.tables == ("orders", "users")  # not the CTE name
    assert features.aliases == {"u": "users"}
    assert features.main_table == "orders"  # the outermost FROM reads the CTE, which reads orders
    assert uses(features, "range") == [("orders", "created_at", "BETWEEN", ("2024-01-01", "2024-03-31"))]
    assert uses(features, "group") == [("orders", "user_id", None, None)]
    assert uses(features, "join") == [(None, "user_id", "USING", None), ("users", "user_id", "USING", None)]
    assert uses(features, "sort") == [(None, "spent", "DESC", None)]  # a CTE column: no base table


def test_window_functions_are_not_aggregations() -> None:
    features = extract_features("""
        SELECT user_id, created_at,
               sum(total_amount) OVER (PARTITION BY user_id ORDER BY created_at DESC) AS running,
               row_number() OVER w AS n
        FROM orders
        WINDOW w AS (PARTITION BY shipping_country ORDER BY total_amount)
    """)
    assert counts(features) == {"joins": 0, "subqueries": 0, "aggregations": 0, "windows": 2,
                                "set_operations": 0, "order_by": 0, "limit": False, "score": 2}
    assert uses(features, "group") == [("orders", "user_id", None, None),
                                       ("orders", "shipping_country", None, None)]
    assert uses(features, "sort") == [("orders", "created_at", "DESC", None),
                                      ("orders", "total_amount", "ASC", None)]


def test_aggregate_with_filter_counts_once() -> None:
    features = extract_features(
        "SELECT count(*) FILTER (WHERE status = 'paid'), max(created_at) FROM orders")
    assert features.aggregation_count == 2 and features.window_count == 0


def test_union_counts_twice_and_main_table_is_the_first_branch() -> None:
    features = extract_features("""
        SELECT id, email FROM users WHERE tier = 'gold'
        UNION
        SELECT user_id, kind FROM events WHERE created_at > now() - interval '7 days'
        ORDER BY 1 LIMIT 50
    """)
    assert counts(features) == {"joins": 0, "subqueries": 0, "aggregations": 0, "windows": 0,
                                "set_operations": 1, "order_by": 1, "limit": True, "score": 2}
    assert features.tables == ("users", "events") and features.main_table == "users"
    # a range against a constant expression: no Python value
    assert uses(features, "range") == [("events", "created_at", ">", None)]


def test_parenthesised_union_branches_are_not_subqueries() -> None:
    features = extract_features(
        "(SELECT id FROM users) EXCEPT (SELECT user_id FROM orders) INTERSECT (SELECT user_id FROM events)")
    assert features.set_operation_count == 2 and features.subquery_count == 0
    assert features.complexity_score == 4


def test_the_seeds_complex_query_scores_seven() -> None:
    features = extract_features("""
        SELECT u.email, o.id, p.name, oi.quantity,
               rank() OVER (PARTITION BY u.country ORDER BY o.total_amount DESC) AS rnk
        FROM users u
        JOIN orders o ON o.user_id = u.id
        JOIN order_items oi ON oi.order_id = o.id
        JOIN products p ON p.id = oi.product_id
        WHERE o.total_amount > (SELECT avg(total_amount) FROM orders)
          AND u.id IN (SELECT user_id FROM events WHERE kind = 'purchase')
    """)
    # 3 joins, 2 subqueries, 1 window, plus the avg() inside the scalar subquery
    assert counts(features) == {"joins": 3, "subqueries": 2, "aggregations": 1, "windows": 1,
                                "set_operations": 0, "order_by": 0, "limit": False, "score": 7}
    assert features.complexity == "high"
    assert features.tables == ("users", "orders", "order_items", "products", "events")
    assert features.aliases == {"u": "users", "o": "orders", "oi": "order_items", "p": "products"}
    assert ("orders", "total_amount", ">", None) in uses(features, "range")  # scalar subquery


def test_comma_join_and_other_roles() -> None:
    features = extract_features("""
        SELECT o.id FROM users u, orders o
        WHERE o.user_id = u.id
          AND lower(u.email) = 'a@example.com'
          AND u.email LIKE 'bob%' AND u.email LIKE '%@example.com'
          AND o.status <> 'cancelled' AND o.id NOT IN (1, 2) AND o.updated_at IS NOT NULL
          AND 100 < o.total_amount AND o.total_amount <= -0.5
        FETCH FIRST 10 ROWS ONLY
    """)
    assert features.join_count == 1 and features.has_limit
    assert uses(features, "join") == [("orders", "user_id", "=", None), ("users", "id", "=", None)]
    assert uses(features, "range") == [("users", "email", "LIKE", "bob%"),
                                       ("orders", "total_amount", ">", 100),
                                       ("orders", "total_amount", "<=", -0.5)]
    others = {(u.table, u.column) for u in features.columns if u.role == "other"}
    assert others == {("users", "email"), ("orders", "status"), ("orders", "id"), ("orders", "updated_at")}


def test_unqualified_columns_with_two_tables_have_no_table() -> None:
    features = extract_features(
        "SELECT email FROM users JOIN orders ON orders.user_id = users.id WHERE status = 'paid'")
    assert ColumnUse(None, "status", "equality", "=", "paid") in features.columns
    assert ColumnUse(None, "email", "select") in features.columns


def test_derived_table_and_identifier_folding() -> None:
    features = extract_features("""
        SELECT t.Total_Amount FROM (SELECT * FROM Orders WHERE Shipping_Country = 'ES') AS t
        WHERE t.total_amount > 5 ORDER BY t.created_at DESC
    """)
    assert features.subquery_count == 1 and features.order_by_count == 1
    assert features.tables == ("orders",) and features.main_table == "orders"
    assert features.aliases == {}  # t names a derived table, not a table
    assert ("orders", "shipping_country", "=", "ES") in uses(features, "equality")
    assert (None, "total_amount", ">", 5) in uses(features, "range")


def test_limit_only_counts_on_the_outermost_query() -> None:
    assert not extract_features("SELECT * FROM (SELECT * FROM orders LIMIT 5) t").has_limit
    assert extract_features("SELECT * FROM orders ORDER BY id LIMIT 5; -- trailing comment").has_limit


def test_casts_keep_the_literal_value() -> None:
    features = extract_features(
        "SELECT id FROM events WHERE created_at >= DATE '2024-02-01' AND user_id = '42'::bigint"
        " AND kind = $1")
    assert uses(features, "range") == [("events", "created_at", ">=", "2024-02-01")]
    assert uses(features, "equality") == [("events", "user_id", "=", "42"), ("events", "kind", "=", None)]


@pytest.mark.parametrize(("sql", "reason"), [
    ("SELEC * FRM orders", "invalid SQL: syntax error"),
    ("SELECT * FROM orders WHERE status = 'paid", "unterminated quoted string"),
    ("", "no SQL statement"),
    ("-- just a comment", "no SQL statement"),
    ("SELECT 1; SELECT 2", "expected one query, got 2 statements"),
    ("UPDATE orders SET status = 'x'", "expected a query"),
    ("SELECT * FROM orders o JOIN users o ON true", "cannot analyse the query"),
])
def test_invalid_input_raises_input_error(sql: str, reason: str) -> None:
    with pytest.raises(InputError, match=reason) as caught:
        extract_features(sql)
    assert "\n" not in str(caught.value)


def test_negated_and_alternative_conditions_filter_nothing_alone() -> None:
    def roles(sql: str) -> dict[str, str]:
        return {c.column: c.role for c in extract_features(sql).columns if c.role != "select"}

    assert roles("SELECT id FROM users WHERE email NOT LIKE 'x%'") == {"email": "other"}
    assert roles("SELECT id FROM users WHERE NOT (email LIKE 'x%')") == {"email": "other"}
    assert roles("SELECT id FROM users WHERE email LIKE 'x%'") == {"email": "range"}
    assert roles("SELECT id FROM users WHERE tier = 'a' OR country = 'b'") == {
        "tier": "other", "country": "other"}
    assert roles("SELECT id FROM users WHERE tier = 'a' AND (country = 'b' OR country = 'c')") == {
        "tier": "equality", "country": "other"}


def test_shared_parsing_steps() -> None:
    assert select_text("  -- the report\n  SELECT 1 ;  -- done\n") == "SELECT 1"
    with pytest.raises(InputError, match="expected a query"):
        select_text("DELETE FROM orders")
    assert parse_query('SELECT Id FROM "Orders"').sql(dialect="postgres") == 'SELECT id FROM "Orders"'
