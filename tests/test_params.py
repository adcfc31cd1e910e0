"""Parameter sets drawn from pg_stats, and how they reach the queries of a family (pure)."""

from __future__ import annotations

import ast
from datetime import date, datetime
from pathlib import Path

import pglast
import pytest

from afs.errors import InputError
from afs.models import ColumnInfo, ColumnStats, TableInfo
from afs.params.family import (
    ParameterSet,
    Substitution,
    apply_parameters,
    baked_literals,
    parameter_sets,
    stored_rows,
)
from afs.query.query import Query

STATUSES = ("completed", "shipped", "paid", "cancelled", "pending", "refunded")
# 2024-01-15 … 2025-12-15, one bound a month, at odd times of day (as pg_stats prints timestamptz)
STAMPS = tuple(f"{2024 + i // 12}-{i % 12 + 1:02d}-15 0{i % 10}:17:42.5+00" for i in range(24))
ORDERS = TableInfo(
    name="orders", rows=50_000, size_mb=5.0, indexes=(), primary_key=("id",),
    columns=(ColumnInfo("id", "bigint"), ColumnInfo("user_id", "bigint"), ColumnInfo("status", "text"),
             ColumnInfo("total_amount", "numeric(12,2)"), ColumnInfo("shipping_country", "text"),
             ColumnInfo("created_at", "timestamp with time zone")),
    column_stats={
        "status": ColumnStats(n_distinct=6, most_common_vals=STATUSES,
                              most_common_freqs=(0.6, 0.15, 0.1, 0.07, 0.05, 0.03)),
        "created_at": ColumnStats(n_distinct=-1, histogram_bounds=STAMPS),
        "total_amount": ColumnStats(histogram_bounds=tuple(f"{i * 5}.25" for i in range(101))),
        "shipping_country": ColumnStats(most_common_vals=("US", "GB", "DE", "JP"),
                                        most_common_freqs=(0.3, 0.1, 0.09, 0.05)),
        "user_id": ColumnStats(most_common_vals=("7", "3"), most_common_freqs=(0.02, 0.01),
                               histogram_bounds=tuple(str(i * 20) for i in range(1, 101))),
    },
)
USERS = TableInfo(name="users", rows=2_000, size_mb=0.5, indexes=(), primary_key=("id",),
                  columns=(ColumnInfo("id", "bigint"), ColumnInfo("tier", "text")),
                  column_stats={"tier": ColumnStats(most_common_vals=("free", "pro", "enterprise"),
                                                    most_common_freqs=(0.8, 0.17, 0.03))})
TABLES = {"orders": ORDERS, "users": USERS}

MONTH = ("SELECT o.status, count(*) FROM orders o WHERE o.status = 'paid' "
         "AND o.created_at >= '2024-03-01' AND o.created_at < '2024-04-01' GROUP BY o.status")


def _news(pset: ParameterSet) -> dict[str, str]:
    return {sub.old: sub.new for sub in pset.substitutions}


def _one_select(sql: str | None) -> str:
    assert sql is not None
    (raw,) = pglast.parse_sql(sql)
    assert type(raw.stmt).__name__ == "SelectStmt"
    return sql


@pytest.mark.parametrize("module", ["family.py", "fill.py"])
def test_the_module_is_pure(module: str) -> None:
    source = (Path(__file__).parent.parent / "afs" / "params" / module).read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    roots = {name.split(".")[0] for name in imported}
    assert roots <= {"__future__", "functools", "re", "collections", "dataclasses", "datetime", "decimal",
                     "typing", "sqlglot", "pglast", "afs"}
    assert {name for name in imported if name.startswith("afs")} <= {
        "afs.errors", "afs.config", "afs.query.query", "afs.query.text", "afs.models", "afs.pg.names",
        "afs.pg.stats"}


def test_a_date_range_moves_with_its_width_and_stays_a_pair_of_dates() -> None:
    sets = parameter_sets(Query.read(MONTH), TABLES, 2)
    assert len(sets) == 2
    starts = set()
    for pset in sets:
        news = _news(pset)
        lo, hi = news["'2024-03-01'"], news["'2024-04-01'"]
        assert len(lo) == len(hi) == 12  # 'YYYY-MM-DD': a date stays a date
        width = date.fromisoformat(hi.strip("'")) - date.fromisoformat(lo.strip("'"))
        assert width.days == 31
        assert all(s.column == "orders.created_at" for s in pset.substitutions if s.old != "'paid'")
        starts.add(lo)
        assert "percentile" in pset.label
    assert len(starts) == 2 and "'2024-03-01'" not in starts
    # the 25th, then the 75th percentile of the histogram
    assert [_news(p)["'2024-03-01'"] for p in sets] == ["'2024-07-15'", "'2025-06-15'"]


def test_a_timestamp_range_keeps_its_format_zone_and_granularity() -> None:
    query = ("SELECT id FROM orders WHERE created_at BETWEEN '2024-03-01T00:00:00+00:00' "
             "AND '2024-03-08T00:00:00+00:00'")
    (pset, _) = parameter_sets(Query.read(query), TABLES, 2)
    lo, hi = (s.new for s in pset.substitutions)
    assert lo == "'2024-07-15T00:00:00+00:00'"  # the bound 07:17:42.5 down to midnight, as the original
    assert hi == "'2024-07-22T00:00:00+00:00'"
    assert datetime.fromisoformat(hi.strip("'")) - datetime.fromisoformat(lo.strip("'")) == (
        datetime(2024, 3, 8) - datetime(2024, 3, 1))


def test_a_single_bound_moves_to_another_histogram_bound() -> None:
    query = "SELECT id FROM orders WHERE total_amount > 100.00"
    sets = parameter_sets(Query.read(query), TABLES, 2)
    assert [p.substitutions[0].new for p in sets] == ["125.25", "375.25"]  # decimals keep two digits
    assert all(p.substitutions[0].column == "orders.total_amount" for p in sets)


def test_equality_draws_a_common_value_then_a_rarer_one() -> None:
    sets = parameter_sets(Query.read("SELECT id FROM orders WHERE status = 'completed'"), TABLES, 3)
    # the most common other value, the least common (no histogram for status), the next common
    assert [p.substitutions[0].new for p in sets] == ["'shipped'", "'refunded'", "'paid'"]
    assert "15% of rows" in sets[0].label
    # a column with a histogram: a rarer value comes from it
    ids = parameter_sets(Query.read("SELECT id FROM orders WHERE user_id = 7"), TABLES, 2)
    assert [p.substitutions[0].new for p in ids] == ["3", "1020"]


def test_in_lists_keep_their_length() -> None:
    query = "SELECT id FROM orders WHERE status IN ('paid', 'pending')"
    sets = parameter_sets(Query.read(query), TABLES, 2)
    assert len(sets) == 2
    for pset in sets:
        assert [s.old for s in pset.substitutions] == ["'paid'", "'pending'"]
        news = [s.new for s in pset.substitutions]
        assert len(set(news)) == 2 and not {"'paid'", "'pending'"} & set(news)
    assert _news(sets[0]) != _news(sets[1])
    applied = _one_select(apply_parameters(query, sets[0]))
    assert applied.count("'") == 4 and "'paid'" not in applied


def test_having_thresholds_are_scaled_and_integers_stay_integers() -> None:
    query = ("SELECT user_id, count(*) FROM orders GROUP BY user_id HAVING count(*) > 5 "
             "AND sum(total_amount) >= 1000.50")
    sets = parameter_sets(Query.read(query), TABLES, 2)
    assert [_news(p) for p in sets] == [{"5": "2", "1000.50": "500.25"}, {"5": "10", "1000.50": "2001.00"}]
    assert all(s.column is None for p in sets for s in p.substitutions)


def test_limit_select_list_and_function_arguments_are_left_alone() -> None:
    query = ("SELECT date_trunc('month', created_at) AS m, 'total' AS what, count(*) FROM orders "
             "WHERE status = 'paid' GROUP BY 1 ORDER BY 1 LIMIT 10 OFFSET 5")
    sets = parameter_sets(Query.read(query), TABLES, 2)
    assert len(sets) == 2
    assert all([s.old for s in p.substitutions] == ["'paid'"] for p in sets)
    applied = _one_select(apply_parameters(query, sets[0]))
    assert applied == query.replace("'paid'", "'completed'")  # the rest kept as written
    # no filter literal at all
    no_filter = "SELECT date_trunc('month', created_at), 1 FROM orders LIMIT 3"
    assert parameter_sets(Query.read(no_filter), TABLES, 2) == ()
    join_only = "SELECT count(*) FROM orders o JOIN users u ON u.id = o.user_id"
    assert parameter_sets(Query.read(join_only), TABLES, 2) == ()


def test_like_takes_the_start_of_another_value() -> None:
    sets = parameter_sets(Query.read("SELECT id FROM orders WHERE shipping_country LIKE 'J%'"), TABLES, 2)
    assert [p.substitutions[0].new for p in sets] == ["'U%'", "'G%'"]  # not 'J%' from 'JP'


def test_nested_filters_and_join_conditions_are_found_and_resolved() -> None:
    query = ("SELECT o.id FROM orders o JOIN users u ON u.id = o.user_id AND u.tier = 'pro' "
             "WHERE o.id IN (SELECT x.id FROM orders x WHERE x.status = 'paid')")
    (pset, _) = parameter_sets(Query.read(query), TABLES, 2)
    assert [(s.column, s.old, s.new) for s in pset.substitutions] == [
        ("users.tier", "'pro'", "'free'"), ("orders.status", "'paid'", "'completed'")]


def test_sets_are_deterministic_and_differ_from_the_original() -> None:
    first, second = parameter_sets(Query.read(MONTH), TABLES, 4), parameter_sets(Query.read(MONTH), TABLES, 4)
    assert first == second and len(first) == 4
    assert len({p.substitutions for p in first}) == 4
    assert all(s.new != s.old for p in first for s in p.substitutions)


def test_substitution_is_simultaneous() -> None:
    # the lower bound moves to the old upper bound: it must not be moved twice
    pset = ParameterSet("next week", (
        Substitution("orders.created_at", "'2024-03-01'", "'2024-03-08'"),
        Substitution("orders.created_at", "'2024-03-08'", "'2024-03-15'")))
    query = "SELECT id FROM orders WHERE created_at >= '2024-03-01' AND created_at < '2024-03-08'"
    assert apply_parameters(query, pset) == (
        "SELECT id FROM orders WHERE created_at >= '2024-03-08' AND created_at < '2024-03-15'")


def test_a_rewrite_reading_a_view_with_the_filter_takes_the_values() -> None:
    (pset, _) = parameter_sets(Query.read(MONTH), TABLES, 2)
    rewrite = ("SELECT mv.status, sum(mv.n) FROM afs_mv_orders mv WHERE mv.status = 'paid' "
               "AND mv.day >= '2024-03-01'::date AND mv.created_at < DATE '2024-04-01' GROUP BY mv.status")
    # `day` is not `created_at`: the lower bound has no place there
    assert apply_parameters(rewrite, pset) is None
    fixed = rewrite.replace("mv.day", "mv.created_at")
    applied = _one_select(apply_parameters(fixed, pset))
    paid, lo, hi = (_news(pset)[old] for old in ("'paid'", "'2024-03-01'", "'2024-04-01'"))
    assert f"mv.status = {paid}" in applied
    assert f"mv.created_at >= {lo}::date" in applied
    assert f"mv.created_at < DATE {hi}" in applied


def test_a_cache_of_todays_answer_has_no_place_for_the_values() -> None:
    (pset, _) = parameter_sets(Query.read(MONTH), TABLES, 2)
    assert apply_parameters("SELECT * FROM afs_mv_answer", pset) is None
    assert apply_parameters("SELECT * FROM afs_mv_answer WHERE status = 'paid'", pset) is None  # no dates


def test_a_union_all_rewrite_gets_the_values_in_every_branch() -> None:
    query = "SELECT id FROM orders WHERE status = 'paid' OR user_id = 7"
    sets = parameter_sets(Query.read(query), TABLES, 2)
    rewrite = ("SELECT id FROM orders WHERE status = 'paid' UNION ALL "
               "SELECT id FROM orders WHERE user_id = 7 AND status IS DISTINCT FROM 'paid';")
    for pset in sets:
        applied = _one_select(apply_parameters(rewrite, pset))
        paid, user = _news(pset)["'paid'"], _news(pset)["7"]
        assert applied.count(paid) == 2 and "'paid'" not in applied
        assert f"user_id = {user}" in applied
        assert not applied.endswith(";")


def test_baked_literals() -> None:
    baked = ("SELECT status, count(*) FROM orders WHERE status = 'paid' AND created_at >= '2024-03-01' "
             "GROUP BY 1")
    assert baked_literals(baked, MONTH) == ("'paid'", "'2024-03-01'")
    created = f"CREATE MATERIALIZED VIEW afs_mv AS {baked}"
    assert baked_literals(created, MONTH) == ("'paid'", "'2024-03-01'")
    grouped = ("SELECT status, date_trunc('day', created_at) AS day, count(*) AS n FROM orders "
               "GROUP BY 1, 2")
    assert baked_literals(grouped, MONTH) == ()
    # the same text compared with another column is not the query's literal
    assert baked_literals("SELECT * FROM orders WHERE shipping_country = 'paid'", MONTH) == ()
    having = "SELECT user_id FROM orders GROUP BY 1 HAVING count(*) > 5"
    assert baked_literals("SELECT user_id, count(*) FROM orders GROUP BY 1 HAVING count(*) > 5",
                          having) == ("5",)
    assert baked_literals("SELECT user_id FROM orders WHERE user_id > 5", having) == ()


def test_a_literal_not_tied_to_a_column_is_kept_apart_from_one_that_is() -> None:
    # 5 is both a HAVING threshold and compared with user_id: a substitution could not tell them apart
    query = "SELECT user_id FROM orders WHERE user_id > 5 GROUP BY 1 HAVING count(*) > 5"
    for pset in parameter_sets(Query.read(query), TABLES, 2):
        assert [s.column for s in pset.substitutions] == ["orders.user_id"]
        applied = _one_select(apply_parameters(query, pset))
        assert applied.endswith("count(*) > 5")


def test_a_number_without_statistics_is_scaled_a_string_is_not() -> None:
    sets = parameter_sets(Query.read("SELECT id FROM orders WHERE quantity >= 4 AND note = 'x'"), TABLES, 2)
    assert [_news(p) for p in sets] == [{"4": "2"}, {"4": "8"}]
    assert parameter_sets(Query.read("SELECT id FROM orders WHERE note = 'x'"), TABLES, 2) == ()


def test_bad_input() -> None:
    with pytest.raises(InputError):
        parameter_sets(Query.read("DELETE FROM orders WHERE status = 'paid'"), TABLES, 2)
    bad = ParameterSet("injection", (Substitution(None, "5", "5; DROP TABLE orders"),))
    with pytest.raises(InputError, match="not a literal"):
        apply_parameters("SELECT 1 FROM orders HAVING count(*) > 5", bad)
    assert parameter_sets(Query.read(MONTH), TABLES, 0) == ()


def test_a_bound_derived_from_the_literal_moves_with_it() -> None:
    from afs.params.family import ParameterSet, Substitution
    pset = ParameterSet("x", (Substitution("created_at", "'2024-06-01'", "'2024-12-28'"),))
    sargable = ("SELECT id FROM orders WHERE created_at >= CAST('2024-06-01' AS DATE)"
                " AND created_at < CAST('2024-06-01' AS DATE) + INTERVAL '1 day'")
    moved = apply_parameters(sargable, pset)
    assert moved is not None and moved.count("'2024-12-28'") == 2 and "'2024-06-01'" not in moved


@pytest.mark.parametrize(("rewrite", "stored"), [
    ("SELECT * FROM afs_mv_1", True),  # the view's rows as they are: today's answer
    ("SELECT city, zip, count FROM afs_mv_1 ORDER BY city", True),
    ("SELECT sum(count) FROM afs_mv_1", True),  # derived from the stored rows, no filter
    ("SELECT * FROM afs_mv_1 WHERE status = 'paid'", False),  # the query's filter on the view
    ("SELECT city FROM afs_mv_1 GROUP BY city HAVING sum(count) > 3", False),
    ("SELECT * FROM afs_mv_1 m JOIN orders o ON o.id = m.id", False),  # reads a table too
    ("SELECT * FROM orders", False),  # not a view of the proposal
])
def test_a_rewrite_reading_the_stored_rows_as_they_are_is_an_answer_cache(rewrite: str, stored: bool) -> None:
    assert stored_rows(rewrite, ["afs_mv_1"]) is stored
