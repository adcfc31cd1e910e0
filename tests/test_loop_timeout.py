"""A check of another parameter value that runs past the statement timeout (issue 25): it costs
that value instead of failing the design's measurement, and a rewrite whose rows could not be
read stays unproven. Pure: the rule (afs.bench.past_timeout_check) and what the outcome makes of it."""

from __future__ import annotations

from afs.agents import remaining_time
from afs.bench import past_timeout_check
from afs.models import BenchmarkOutcome, Measurement, ParameterCheck, Timing

TIMEOUT_MS = 5000


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, spread_ms=0.1, runs=5, buffers=10, min_ms=ms, max_ms=ms)


def _outcome(*checks: ParameterCheck) -> BenchmarkOutcome:
    suite = Measurement(name="baseline", baseline=_timing(800.0), optimized=_timing(10.0), rows=38,
                        equivalent=True, significant=True)
    return BenchmarkOutcome(measurements=(suite,), storage_before_mb=1.0, storage_after_mb=2.0,
                            parameter_checks=checks)


def test_an_index_past_the_timeout_for_one_value_costs_that_value_at_least_the_timeout() -> None:
    check = past_timeout_check("hired_on = 2020-01-01", rewrite=False, statement_timeout_ms=TIMEOUT_MS,
                               original_finished=True, rows=9000, baseline=_timing(3000.0))
    assert check.optimized is not None and check.optimized.lower_bound
    assert check.optimized.median_ms == TIMEOUT_MS
    # the same query: its rows do not depend on the plan; slower than the original that finished
    assert check.equivalent and check.slower
    outcome = _outcome(check)
    assert outcome.equivalent
    assert outcome.family_problem == "slower than the original for hired_on = 2020-01-01"
    # the value's cost enters the design's remaining time (geometric mean with the suite's 10/800)
    ratio, _ = remaining_time(outcome)
    assert ratio > (10.0 / 800.0)


def test_a_rewrite_whose_rows_could_not_be_read_stays_unproven() -> None:
    check = past_timeout_check("hired_on = 2020-01-01", rewrite=True, statement_timeout_ms=TIMEOUT_MS,
                               original_finished=False)
    assert not check.equivalent and not check.slower  # the original ran past the timeout as well
    assert check.note.startswith("not proven")
    outcome = _outcome(check)
    assert not outcome.equivalent
    assert outcome.family_problem == "its rows for hired_on = 2020-01-01 are not proven the same"


def test_rows_compared_before_the_timing_timed_out_keep_their_verdict() -> None:
    same = past_timeout_check("v", rewrite=True, statement_timeout_ms=TIMEOUT_MS, original_finished=True,
                              equivalent=True)
    assert same.equivalent and same.slower and same.note.startswith("not timed")
    differ = past_timeout_check("v", rewrite=False, statement_timeout_ms=TIMEOUT_MS, original_finished=True,
                                equivalent=False, differ="; results differ: 3 rows before, 2 after")
    assert not differ.equivalent and differ.note.endswith("2 after")
