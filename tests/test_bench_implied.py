"""The suite's variants a benchmark measures (afs.bench.measured_suite, afs.suite.implied_limit):
pure, no server. A "limit" variant that keeps or lowers a little the query's own LIMIT repeats
the query as given and is not measured; one the query needs (no LIMIT of its own, a LIMIT much
larger, a LIMIT that is not a constant) still is."""

from __future__ import annotations

import pytest

from afs.bench import measured_suite
from afs.models import ColumnInfo, ColumnStats, QueryVariant, TableInfo
from afs.query.query import Query
from afs.suite import SUITE_LIMIT, build_suite, implied_limit

TSTZ = "timestamp with time zone"
BOUNDS = (*(f"2024-{m:02d}-01 00:00:00+00" for m in range(1, 13)), "2024-12-31 18:30:00+00")
USERS = TableInfo(name="users", rows=100_000, size_mb=10.0,
                  columns=tuple(ColumnInfo(c, t) for c, t in (("id", "bigint"), ("email", "text"),
                                                             ("country", "text"), ("created_at", TSTZ))),
                  indexes=(), primary_key=("id",),
                  column_stats={"created_at": ColumnStats(null_frac=0.0, n_distinct=-1.0, correlation=0.9,
                                                          histogram_bounds=BOUNDS)})
CORRELATED = ("SELECT u.id, u.email, (SELECT count(*) FROM orders o WHERE o.user_id = u.id) AS orders"
              " FROM users u WHERE u.country = 'DE' ORDER BY u.id")


def variants(query: str) -> tuple[QueryVariant, ...]:
    built, _ = build_suite(Query.read(query), USERS, "u")
    return built


def names(suite: tuple[QueryVariant, ...]) -> list[str]:
    return [v.name for v in suite]


@pytest.mark.parametrize("own", [5, SUITE_LIMIT, 15, 2 * SUITE_LIMIT])
def test_the_querys_own_limit_kept_or_lowered_a_little_is_not_measured_again(own: int) -> None:
    suite = variants(f"{CORRELATED} LIMIT {own}")
    assert "limit" in names(suite)  # the suite still builds it (afs.suite)
    kept, left = measured_suite(suite)
    assert names(kept) == [n for n in names(suite) if n != "limit"]
    assert kept[0].name == "baseline"
    assert len(left) == 1 and left[0].startswith("limit: not measured") and f"LIMIT {own}" in left[0]
    assert ("the same query" in left[0]) == (own <= SUITE_LIMIT)


@pytest.mark.parametrize("query", [
    CORRELATED,  # no LIMIT of its own: the variant asks for a fast start the query does not
    f"{CORRELATED} LIMIT {2 * SUITE_LIMIT + 1}",  # lowered to less than half: maybe another plan
    f"{CORRELATED} LIMIT 1000",
    f"{CORRELATED} FETCH FIRST 15 ROWS ONLY",  # wrapped from outside: not the query's own limit
])
def test_a_limit_the_query_does_not_have_is_measured(query: str) -> None:
    suite = variants(query)
    assert "limit" in names(suite)
    kept, left = measured_suite(suite)
    assert names(kept) == names(suite) and left == ()
    assert implied_limit(next(v for v in suite if v.name == "limit")) is None


def test_only_the_limit_variant_can_be_implied() -> None:
    note = "the query's LIMIT 15 lowered to 10"
    other = QueryVariant("sort", "SELECT 1", ordered=True, exact=True, note=note, own_limit=15)
    assert implied_limit(other) is None
    assert implied_limit(QueryVariant("limit", "SELECT 1", ordered=True, exact=True, note=note,
                                      own_limit=15)) is not None
