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
