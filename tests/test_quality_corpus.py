"""benchmarks/quality.py's pure parts: the measuring order and the corpus (no database)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import quality  # type: ignore[import-not-found]  # noqa: E402
from quality_cases import CASES  # type: ignore[import-not-found]  # noqa: E402


def test_every_configuration_follows_each_other_one() -> None:
    configs = [quality.Config(label, (), "SELECT 1") for label in ("baseline", "afs", "oracle")]
    order = [c.label for c in quality.rounds(configs, 6)]
    assert sorted(order) == sorted(["baseline", "afs", "oracle"] * 6)
    after = {(a, b) for a, b in itertools.pairwise(order) if a != b}
    # a fixed rotation puts afs after baseline every round (a slow scan cools its caches)
    assert {("baseline", "afs"), ("oracle", "afs"), ("afs", "oracle"), ("baseline", "oracle")} <= after


def test_case_names_are_unique_and_each_case_has_an_oracle_or_says_nothing_to_do() -> None:
    assert len({c.name for c in CASES}) == len(CASES)
    for case in CASES:
        assert case.oracle_ddl or case.oracle_query or case.oracle_settings or "nothing" in case.note


def test_a_close_call_between_afs_and_the_oracle_gets_more_runs() -> None:
    assert quality.close_call(5.1, 3.9) and quality.close_call(117.0, 87.0)
    assert not quality.close_call(20.6, 0.37)  # clearly apart
    assert not quality.close_call(0.10, 0.07)  # within the 0.3 ms slack either way
    assert not quality.close_call(None, 3.0)


def test_the_oracles_very_fix_is_recognised_whatever_the_names_and_spelling() -> None:
    def config(label: str, query: str, definitions: list[str], **settings: str) -> quality.Config:
        return quality.Config(label, (), query, settings, definitions=definitions)

    index = ["CREATE INDEX ON public.sales USING btree (subsidiary_id) INCLUDE (eur_value)"]
    afs = config("afs", "SELECT c.id FROM customers AS c WHERE NOT EXISTS(SELECT 1 FROM orders AS o"
                        " WHERE o.customer_id = c.id)", index)
    oracle = config("oracle", "SELECT c.id FROM customers c WHERE NOT EXISTS (SELECT 1 FROM orders o"
                              " WHERE o.customer_id = c.id)", index)
    assert quality.same_fix(afs, oracle)
    assert not quality.same_fix(afs, config("oracle", oracle.query, []))  # no index
    assert not quality.same_fix(afs, config("oracle", oracle.query + " LIMIT 10", index))
    assert not quality.same_fix(config("afs", "SELECT 1", [], work_mem="'16MB'"),
                                config("oracle", "SELECT 1", [], work_mem="'32MB'"))
    assert quality.same_fix(config("afs", "SELECT 1", [], work_mem="'32MB'"),
                            config("oracle", "select 1", [], work_mem="'32mb'"))


def test_a_statistics_target_runs_inside_each_run_and_is_part_of_the_fix() -> None:
    """A column's statistics target cannot be hidden by dropping an object: it and its ANALYZE run
    inside each of the configuration's runs (and roll back), the index is applied once."""
    ddl = ("CREATE EXTENSION IF NOT EXISTS pg_trgm",
           "CREATE INDEX i ON items USING gin (name gin_trgm_ops)",
           "ALTER TABLE items ALTER COLUMN name SET STATISTICS 1500", "ANALYZE items (name)")
    tuned = quality.Config("afs", ddl, "SELECT 1", definitions=["CREATE INDEX ON items (name)"])
    assert tuned.ddl == ddl[:2] and tuned.per_run == ddl[2:]
    plain = quality.Config("oracle", (*ddl[:2], "ANALYZE items"), "SELECT 1",
                           definitions=["CREATE INDEX ON items (name)"])
    assert plain.per_run == () and plain.ddl == (*ddl[:2], "ANALYZE items")
    assert not quality.same_fix(tuned, plain)
    assert quality.same_fix(tuned, quality.Config("oracle", ddl, "SELECT 1",
                                                  definitions=["CREATE INDEX ON items (name)"]))
