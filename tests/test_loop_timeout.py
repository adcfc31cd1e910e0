"""A check of another parameter value that runs past the statement timeout (issue 25): it costs
that value instead of failing the design's measurement, and a rewrite whose rows could not be
read stays unproven. Pure: the rule (afs.bench.past_timeout_check) and what the outcome makes of it;
and which indexes a loop step keeps in place rather than building them again."""

from __future__ import annotations

from afs.agents import held_commands, remaining_time
from afs.bench import RowsCompared, past_timeout_check
from afs.models import (
    BenchmarkOutcome,
    EstimatedImpact,
    FamilyQuery,
    Measurement,
    OptimizationProposal,
    ParameterCheck,
    Timing,
)

TIMEOUT_MS = 5000


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, spread_ms=0.1, runs=5, buffers=10, min_ms=ms, max_ms=ms)


def _outcome(*checks: ParameterCheck) -> BenchmarkOutcome:
    suite = Measurement(name="baseline", baseline=_timing(800.0), optimized=_timing(10.0), rows=38,
                        equivalent=True, significant=True)
    return BenchmarkOutcome(measurements=(suite,), storage_before_mb=1.0, storage_after_mb=2.0,
                            parameter_checks=checks)


def test_an_index_past_the_timeout_for_one_value_costs_that_value_at_least_the_timeout() -> None:
    check = past_timeout_check(FamilyQuery("hired_on = 2020-01-01", "SELECT 1", "SELECT 1"),
                               statement_timeout_ms=TIMEOUT_MS, original_finished=True, rows=9000,
                               baseline=_timing(3000.0))
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
    check = past_timeout_check(FamilyQuery("hired_on = 2020-01-01", "SELECT 1", "SELECT 2"),
                               statement_timeout_ms=TIMEOUT_MS, original_finished=False)
    assert not check.equivalent and not check.slower  # the original ran past the timeout as well
    assert check.note.startswith("not proven")
    outcome = _outcome(check)
    assert not outcome.equivalent
    assert outcome.family_problem == "its rows for hired_on = 2020-01-01 are not proven the same"


def test_rows_compared_before_the_timing_timed_out_keep_their_verdict() -> None:
    same = past_timeout_check(FamilyQuery("v", "SELECT 1", "SELECT 2"), statement_timeout_ms=TIMEOUT_MS,
                              original_finished=True, compared=RowsCompared(True, ""))
    assert same.equivalent and same.slower and same.note.startswith("not timed")
    differ = past_timeout_check(FamilyQuery("v", "SELECT 1", "SELECT 1"), statement_timeout_ms=TIMEOUT_MS,
                                original_finished=True,
                                compared=RowsCompared(False, "; results differ: 3 rows before, 2 after"))
    assert not differ.equivalent and differ.note.endswith("2 after")


# -- a loop step that only adds indexes keeps the ones in place (afs.agents.held_commands) --------
def _design(*commands: str, rewrite: str | None = None,
            settings: tuple[tuple[str, str], ...] = ()) -> OptimizationProposal:
    return OptimizationProposal(agent="gemini25pro", proposal_type="index", sql_commands=commands,
                                rollback_commands=(), rationale="", rewritten_query=rewrite,
                                settings=settings,
                                estimated_impact=EstimatedImpact(0.0, 0.0, "low", "low"))


FIRST = "CREATE INDEX a_idx ON sales (shop_id)"
SECOND = "CREATE INDEX b_idx ON sale_lines (sale_id)"


def test_a_step_that_adds_an_index_holds_the_ones_in_place() -> None:
    current = _design(FIRST)
    assert held_commands(current, current, _design(FIRST, SECOND)) == (FIRST,)


def test_nothing_is_held_unless_the_step_only_adds_indexes_to_the_design_in_place() -> None:
    current = _design(FIRST)
    extended = _design(FIRST, SECOND)
    assert held_commands(current, None, extended) == ()  # the fork holds nothing
    assert held_commands(current, _design(SECOND), extended) == ()  # it holds another design
    # the step replaces the index in place (a wider key), rewrites the query or sets a setting
    wider = "CREATE INDEX c_idx ON sales (shop_id, day)"
    assert held_commands(current, current, _design(wider, SECOND)) == ()
    assert held_commands(current, current, _design(FIRST, SECOND, rewrite="SELECT 1")) == ()
    assert held_commands(current, current, _design(FIRST, SECOND, settings=(("work_mem", "64MB"),))) == ()
    # it builds something other than an index
    assert held_commands(current, current, _design(FIRST, "CREATE MATERIALIZED VIEW v AS SELECT 1")) == ()
    assert held_commands(current, current, current) == ()  # nothing new to build
