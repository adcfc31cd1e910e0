"""Parameter sets: other values for the query's literals, put into any query of the family (pure)."""

from __future__ import annotations

import pglast

from afs.models import ColumnStats, TableInfo
from afs.params import apply_parameters, baked_literals, parameter_sets

STATS = {
    "status": ColumnStats(most_common_vals=("completed", "shipped", "paid", "cancelled", "pending"),
                          most_common_freqs=(0.6, 0.15, 0.1, 0.07, 0.05)),
    "created_at": ColumnStats(histogram_bounds=tuple(f"2024-{m:02d}-01 00:00:00+00" for m in range(1, 13))),
    "user_id": ColumnStats(histogram_bounds=tuple(str(i * 100) for i in range(50))),
    "email": ColumnStats(histogram_bounds=("alice@x.org", "bob@y.org", "carol@z.org", "dave@w.org")),
}
TABLES = {"orders": TableInfo("orders", 10_000, 1.0, (), (), column_stats=STATS)}
QUERY = ("SELECT o.id FROM orders o WHERE o.status = 'pending' AND o.created_at >= '2024-03-01'"
         " AND o.created_at < '2024-04-01' ORDER BY o.id LIMIT 10")


def _one_select(sql: str) -> None:
    (raw,) = pglast.parse_sql(sql)
    assert type(raw.stmt).__name__ == "SelectStmt"


def test_two_sets_with_other_values_of_every_filter() -> None:
    sets = parameter_sets(QUERY, TABLES, 2)
    assert len(sets) == 2
    for pset in sets:
        sql = apply_parameters(QUERY, pset)
        assert sql is not None and "'pending'" not in sql and "LIMIT 10" in sql
        _one_select(sql)
    first = apply_parameters(QUERY, sets[0])
    assert first is not None and "'completed'" in first  # the most common other value first


def test_a_range_moves_with_its_width_and_keeps_the_date_shape() -> None:
    (pset, *_) = parameter_sets(QUERY, TABLES, 2)
    news = {s.old: s.new for s in pset.substitutions if s.column == "created_at"}
    assert set(news) == {"2024-03-01", "2024-04-01"}
    assert all(len(v) == 10 for v in news.values())
    from datetime import date
    lo, hi = (date.fromisoformat(news[k]) for k in ("2024-03-01", "2024-04-01"))
    assert (hi - lo).days == 31


def test_in_lists_keep_their_length_and_thresholds_are_scaled() -> None:
    query = ("SELECT user_id, count(*) FROM orders WHERE status IN ('pending', 'paid')"
             " GROUP BY user_id HAVING count(*) > 5")
    sets = parameter_sets(query, TABLES, 2)
    assert len(sets) == 2
    thresholds = {s.new for p in sets for s in p.substitutions if s.column is None}
    assert thresholds == {"10", "2"}
    counts = [len([s for s in p.substitutions if s.column == "status"]) for p in sets]
    assert counts[0] == 2 and set(counts) <= {0, 2}  # a whole list or none (too few other values)


def test_limit_and_select_list_literals_are_left_alone() -> None:
    query = "SELECT id, 'x' AS tag FROM orders ORDER BY id LIMIT 5 OFFSET 10"
    assert parameter_sets(query, TABLES, 2) == ()


def test_like_prefixes_are_drawn_from_values() -> None:
    query = "SELECT id FROM orders WHERE email LIKE 'al%'"
    sets = parameter_sets(query, TABLES, 2)
    assert sets and all(s.new.endswith("%") and len(s.new) == 3 for p in sets for s in p.substitutions)


def test_a_view_read_with_the_filter_takes_the_values_a_cache_does_not() -> None:
    query = "SELECT count(*) FROM orders WHERE status = 'pending'"
    (pset, *_) = parameter_sets(query, TABLES, 2)
    family = apply_parameters("SELECT sum(n) FROM mv_by_status WHERE status = 'pending'", pset)
    assert family is not None and "'completed'" in family
    assert apply_parameters("SELECT * FROM mv_cache", pset) is None
    union = apply_parameters("SELECT id FROM orders WHERE status = 'pending' UNION ALL "
                             "SELECT id FROM orders WHERE user_id = 1 AND (status = 'pending') IS NOT TRUE",
                             pset)
    assert union is not None and union.count("'completed'") == 2


def test_baked_literals() -> None:
    query = "SELECT count(*) FROM orders WHERE status = 'pending'"
    assert baked_literals("SELECT count(*) FROM orders WHERE status = 'pending'", query) == ("'pending'",)
    assert baked_literals("SELECT status, count(*) FROM orders GROUP BY status", query) == ()


def test_a_query_without_statistics_or_literals_gets_no_sets() -> None:
    assert parameter_sets("SELECT id FROM orders WHERE unknown_col = 3", TABLES, 2) == ()
    assert parameter_sets("SELECT count(*) FROM orders", TABLES, 2) == ()
