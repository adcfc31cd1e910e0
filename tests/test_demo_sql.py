"""The demo data set's SQL, checked without a database."""

import re

import pglast
import pytest

from afs.sandbox.demo import SCALES, seed_statements

TABLES = ("users", "products", "orders", "order_items", "events")


@pytest.mark.parametrize("scale", sorted(SCALES))
def test_every_statement_is_one_parseable_statement(scale: str) -> None:
    statements = seed_statements(scale)
    assert statements
    for statement in statements:
        assert isinstance(statement, str)
        assert statement.strip()
        assert not statement.rstrip().endswith(";")
        assert len(pglast.parse_sql(statement)) == 1


@pytest.mark.parametrize("scale", sorted(SCALES))
def test_every_table_is_created_keyed_and_analyzed_last(scale: str) -> None:
    sql = seed_statements(scale)
    created = [m.group(1) for s in sql if (m := re.match(r"\s*CREATE TABLE (\w+)", s))]
    keyed = [m.group(1) for s in sql if (m := re.match(r"ALTER TABLE (\w+) ADD PRIMARY KEY", s))]
    assert sorted(created) == sorted(TABLES)
    assert sorted(keyed) == sorted(TABLES)
    assert sql[-1] == "VACUUM (ANALYZE)"


def test_no_secondary_indexes_and_no_clock() -> None:
    sql = "\n".join(seed_statements("demo")).lower()
    assert "create index" not in sql
    assert "now()" not in sql
    assert "random()" not in sql


def test_scales_grow_and_demo_has_two_million_orders() -> None:
    small, demo, large = SCALES["small"], SCALES["demo"], SCALES["large"]
    assert demo.orders >= 2_000_000
    assert (small.users, demo.users, large.users) == (2_000, 100_000, 500_000)
    assert small.orders < demo.orders < large.orders
    assert all(scale.name == name for name, scale in SCALES.items())
    assert f"generate_series(1, {demo.orders})" in "\n".join(seed_statements("demo"))


def test_same_seed_same_sql_other_seed_other_sql() -> None:
    assert seed_statements("small", seed=7) == seed_statements("small", seed=7)
    assert seed_statements("small", seed=7) != seed_statements("small", seed=8)
    assert seed_statements("small") == seed_statements("small", seed=42)


def test_unknown_scale_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="huge") as raised:
        seed_statements("huge")
    for name in SCALES:
        assert name in str(raised.value)
