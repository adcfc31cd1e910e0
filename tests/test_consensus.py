"""Consensus: every tier of every scorer, every gate, the tie-breaks, confidence, rationale (pure)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from afs.consensus import (
    CRITERIA,
    DOMINANCE_MIN_RATIO,
    DRIFT_RATIO,
    GATES,
    SCORERS,
    SURVIVOR_GATES,
    WEIGHTS,
    WRITE_COST_MAX,
    Candidate,
    check_weights,
    clearly_faster,
    ddl_signature,
    decide,
    index_write_cost,
    is_conclusive,
    normalize_ddl,
    read_ms_saved_per_day,
    refresh_cost,
    score,
    score_complexity,
    score_performance,
    score_risk,
    score_storage,
    serves_family_as_well,
    serves_family_clearly_better,
    speedup_range,
)
from afs.models import (
    AgentOutcome,
    AnalysisResult,
    BenchmarkOutcome,
    EstimatedImpact,
    Measurement,
    OptimizationProposal,
    ParameterCheck,
    SuiteName,
    Timing,
    ValidationResult,
    WriteCost,
)

SUITE: tuple[SuiteName, ...] = ("baseline", "limit", "filter", "sort")
BASE_MS = 1000.0


# -- factories ---------------------------------------------------------------------------
def measurement(name: SuiteName = "baseline", pct: float = 95.0, *, equivalent: bool = True,
                significant: bool = True) -> Measurement:
    """A suite query that got `pct` % faster (1000 ms before, so whole percents are exact)."""
    return Measurement(
        name=name,
        baseline=Timing(median_ms=BASE_MS, spread_ms=10.0, runs=7, buffers=5000),
        optimized=Timing(median_ms=BASE_MS - 10.0 * pct, spread_ms=1.0, runs=7, buffers=40),
        rows=25, equivalent=equivalent, significant=significant,
    )


def outcome(agent: str = "gemini25pro", *, pct: float = 95.0, mb: float = 3.0, ptype: str = "index",
            commands: int = 1, sql: tuple[str, ...] | None = None, needs_refresh: bool = False,
            risk: str = "low", warnings: int = 0, rollback: bool = True, validation_rollback: bool = False,
            steps: bool = False, is_valid: bool = True, equivalent: bool = True, significant: bool = True,
            measurements: tuple[Measurement, ...] | None = None,
            writes_per_read: Any = None) -> AgentOutcome:
    if sql is None:
        extra = (f"CREATE INDEX idx_{agent}_{i} ON orders (col_{i})" for i in range(1, commands))
        sql = (f"CREATE INDEX idx_{agent} ON orders (user_id)", *extra)
    if measurements is None:
        measurements = tuple(measurement(name, pct, equivalent=equivalent, significant=significant)
                             for name in SUITE)
    rates = {} if writes_per_read is None else {"orders": writes_per_read, "users": 9.0}
    proposal = OptimizationProposal(
        agent=agent,
        proposal_type=ptype,  # type: ignore[arg-type]  # tests pass plain strings
        sql_commands=sql,
        rollback_commands=("DROP INDEX IF EXISTS idx",) if rollback else (),
        rationale="because",
        estimated_impact=EstimatedImpact(99.0, 0.5, "low", "low"),  # never used for scoring
        needs_refresh=needs_refresh,
        validation_steps=("EXPLAIN the query",) if steps else (),
    )
    validation = ValidationResult(
        is_valid=is_valid, risk_level=risk,  # type: ignore[arg-type]
        reversibility=1.0, warnings=tuple(f"warning {i}" for i in range(warnings)),
        rollback_commands=("DROP INDEX idx",) if validation_rollback else (),
    )
    return AgentOutcome(
        agent=agent, status="ok", fork=f"afs-fork-{agent}",
        analysis=AnalysisResult(insights=(), proposed_actions=(), confidence=0.8),
        proposal=proposal, validation=validation,
        benchmark=BenchmarkOutcome(measurements=measurements, storage_before_mb=0.0, storage_after_mb=mb),
        writes_per_read=rates,
    )


def candidate(**kwargs: Any) -> Candidate:
    o = outcome(**kwargs)
    assert o.proposal and o.validation and o.benchmark
    return Candidate(o, o.proposal, o.validation, o.benchmark)


def failed(agent: str, error: str | None, status: str = "failed") -> AgentOutcome:
    return AgentOutcome(agent=agent, status=status, error=error)  # type: ignore[arg-type]


# -- scorers -----------------------------------------------------------------------------
def test_the_scorers_are_the_four_criteria_and_the_default_weights_sum_to_one() -> None:
    assert CRITERIA == ("performance", "storage", "complexity", "risk")
    assert len(SCORERS) == 4 and len(GATES) >= 5 and len(SURVIVOR_GATES) == 1
    assert dict(WEIGHTS) == {"performance": 0.5, "storage": 0.2, "complexity": 0.2, "risk": 0.1}


@pytest.mark.parametrize(("pct", "score"), [
    (100, 100), (90, 100), (89.99, 95), (80, 95), (79.99, 85), (70, 85), (69.99, 70), (50, 70),
    (49.99, 50), (30, 50), (29.99, 30), (10, 30), (9.99, 10), (0, 10), (-0.01, 0), (-50, 0),
])
def test_performance_tiers(pct: float, score: float) -> None:
    assert score_performance(candidate(pct=pct)) == score


def test_performance_is_the_average_over_the_suite() -> None:
    suite = tuple(measurement(name, pct) for name, pct in zip(SUITE, (100, 90, 80, 50), strict=True))
    assert score_performance(candidate(measurements=suite)) == 95  # average 80


@pytest.mark.parametrize(("mb", "score"), [
    (0, 100), (10, 100), (10.01, 90), (25, 90), (25.01, 75), (50, 75), (50.01, 50), (100, 50),
    (100.01, 49.995), (120, 40), (159, 20.5), (160, 20), (300, 20),
])
def test_storage_tiers_from_measured_mb(mb: float, score: float) -> None:
    assert score_storage(candidate(mb=mb)) == pytest.approx(score)


def test_storage_ignores_the_agents_estimate_and_a_shrink_counts_as_zero() -> None:
    o = outcome(mb=0.0)
    assert o.benchmark is not None and o.proposal is not None
    shrunk = BenchmarkOutcome(o.benchmark.measurements, storage_before_mb=50.0, storage_after_mb=20.0)
    assert score_storage(Candidate(o, o.proposal, o.validation, shrunk)) == 100  # type: ignore[arg-type]


@pytest.mark.parametrize(("ptype", "score"), [
    ("index", 90), ("partial_index", 85), ("composite_index", 85), ("query_rewrite", 85),
    ("materialized_view", 70), ("partitioning", 50), ("denormalization", 40),
])
def test_complexity_by_type(ptype: str, score: float) -> None:
    assert score_complexity(candidate(ptype=ptype)) == score


@pytest.mark.parametrize(("ptype", "commands", "refresh", "score"), [
    ("index", 2, False, 85), ("index", 3, False, 80), ("materialized_view", 1, True, 60),
    ("materialized_view", 3, True, 50), ("partitioning", 7, False, 20), ("denormalization", 2, True, 25),
    ("denormalization", 3, True, 20), ("denormalization", 9, True, 20),
])
def test_complexity_extra_commands_refresh_and_clamp(ptype: str, commands: int, refresh: bool,
                                                      score: float) -> None:
    assert score_complexity(candidate(ptype=ptype, commands=commands, needs_refresh=refresh)) == score


@pytest.mark.parametrize(("kwargs", "score"), [
    ({"risk": "low", "rollback": False}, 95),
    ({"risk": "medium", "rollback": False}, 70),
    ({"risk": "high", "rollback": False}, 40),
    ({"risk": "medium", "rollback": False, "warnings": 1}, 65),
    ({"risk": "medium", "rollback": False, "warnings": 3}, 55),
    ({"risk": "medium", "rollback": True}, 75),
    ({"risk": "medium", "rollback": False, "validation_rollback": True}, 75),
    ({"risk": "medium", "rollback": True, "validation_rollback": True}, 75),  # one bonus, not two
    # validation steps are a model's prose that nothing runs: no bonus (the original rules gave +5)
    ({"risk": "medium", "rollback": False, "steps": True}, 70),
    ({"risk": "medium", "rollback": True, "steps": True}, 75),
    ({"risk": "low", "rollback": True, "steps": True}, 100),
    ({"risk": "high", "rollback": False, "warnings": 9}, 0),  # -5 clamped
])
def test_risk(kwargs: dict[str, Any], score: float) -> None:
    assert score_risk(candidate(**kwargs)) == score


# -- our adjustment: the write cost of a new index -----------------------------------------
@pytest.mark.parametrize(("ptype", "writes", "delta"), [
    ("index", 0.5, -5), ("partial_index", 1.0, -10), ("composite_index", 1.5, -15), ("index", 4.0, -15),
    ("index", 0.0, None), ("index", None, None), ("index", float("nan"), None), ("index", -1.0, None),
    ("materialized_view", 2.0, None), ("query_rewrite", 2.0, None),
])
def test_index_write_cost(ptype: str, writes: Any, delta: float | None) -> None:
    adjustment = index_write_cost(candidate(ptype=ptype, writes_per_read=writes))
    if delta is None:
        assert adjustment is None
    else:
        assert adjustment is not None and adjustment.criterion == "risk" and adjustment.delta == delta


def test_write_cost_comes_from_the_measured_rate_of_the_indexed_table_only() -> None:
    # users is written 9 times per read but gets no index; a brain's metadata is never read
    o = outcome(writes_per_read=0.5)
    o = dataclasses.replace(o, analysis=AnalysisResult((), (), 0.8, metadata={"writes_per_read": 5.0}))
    plain = decide([outcome()]).scores["gemini25pro"].risk
    assert decide([o]).scores["gemini25pro"].risk == plain - 5
    adjustment = index_write_cost(candidate(sql=("CREATE INDEX u ON public.users (email)",),
                                            writes_per_read=0.5))
    assert adjustment is not None and adjustment.delta == -15


def test_write_cost_reads_the_indexed_table_as_the_validator_does() -> None:
    # a comment naming another table, an index named like a keyword, ON ONLY: the table is the
    # one the parser reads, not the first word after "on" in the text
    for sql in ("CREATE INDEX /* on users */ ix ON orders (user_id)",
                'CREATE INDEX "on users" ON ONLY public.orders (user_id)',
                "CREATE INDEX ix ON orders ((CASE WHEN x THEN 1 END)) WHERE note <> ' on users'"):
        adjustment = index_write_cost(candidate(sql=(sql,), writes_per_read=0.5))
        assert adjustment is not None and adjustment.delta == -5, sql


def test_write_cost_lowers_the_risk_score_and_is_explained() -> None:
    decision = decide([outcome(writes_per_read=0.8, risk="low", rollback=False)])
    assert decision.scores["gemini25pro"].risk == 87
    assert any("risk −8 for the write cost of a new index (0.8 writes per read, the source's ratio:"
               " no write cost measured in the fork)" in line for line in decision.rationale)


def test_write_cost_counts_in_the_risk_gate() -> None:
    # high 40 + rollback 5 = 45 passes alone; minus 10 for one write per read fails
    assert not decide([outcome(risk="high", writes_per_read=0.0)]).scores["gemini25pro"].disqualified
    decision = decide([outcome(risk="high", writes_per_read=1.0)])
    assert decision.winner is None
    assert decision.scores["gemini25pro"].disqualified == ("risk score 35 is below 40",)


# -- gates -------------------------------------------------------------------------------
def test_improvement_below_ten_percent_cannot_win() -> None:
    decision = decide([outcome("gemini25pro", pct=9.99), outcome("gemini25flash", pct=10)])
    assert decision.winner == "gemini25flash"
    reasons = decision.scores["gemini25pro"].disqualified
    assert reasons == ("improves only 9.99 % on average (needs at least 10 %)",)


def test_a_slower_proposal_scores_zero_and_is_disqualified() -> None:
    decision = decide([outcome(pct=-0.01, significant=True)])
    b = decision.scores["gemini25pro"]
    assert b.performance == 0 and decision.winner is None
    assert b.disqualified[0] == "slower on average (-0.01 %)"
    assert not any("improves only" in r for r in b.disqualified)
    # a slowdown within the noise is none: it cannot win either, but as too small a gain
    noise = decide([outcome(pct=-0.01, significant=False)]).scores["gemini25pro"]
    assert noise.disqualified[0] == "improves only 0 % on average (needs at least 10 %)"


def test_a_suite_query_slower_by_noise_does_not_sink_a_large_gain() -> None:
    # the query as given 250 -> 17 ms; its LIMIT variant 0.05 -> 0.3 ms, within the noise
    gain = measurement("baseline", 93.2)
    noisy_limit = dataclasses.replace(measurement("limit", -500.0), significant=False)
    decision = decide([outcome(measurements=(gain, noisy_limit, measurement("filter", 90.0),
                                             measurement("sort", 90.0)))])
    assert decision.winner == "gemini25pro", decision.scores["gemini25pro"].disqualified
    # the same slowdown beyond the noise counts
    real_limit = dataclasses.replace(noisy_limit, significant=True)
    slower = decide([outcome(measurements=(gain, real_limit, measurement("filter", 90.0),
                                           measurement("sort", 90.0)))])
    assert slower.winner is None


def test_risk_below_forty_cannot_win() -> None:
    decision = decide([outcome("gemini25pro", risk="high", rollback=False, warnings=1),
                       outcome("gemini25flash", risk="high", rollback=False)])
    assert decision.scores["gemini25pro"].disqualified == ("risk score 35 is below 40",)
    assert decision.scores["gemini25flash"].risk == 40 and not decision.scores["gemini25flash"].disqualified


def test_lone_survivor_needs_a_total_above_sixty() -> None:
    # performance 30 (·0.5=15) + storage 90 (18) + complexity 85 (17) + risk 100 (10) = 60
    exactly_sixty = outcome(pct=10, mb=20, ptype="partial_index", steps=True)
    decision = decide([exactly_sixty, failed("gemini25flash", "model timed out")])
    assert decision.scores["gemini25pro"].total == 60
    assert decision.winner is None and decision.confidence == 0
    assert decision.scores["gemini25pro"].disqualified == (
        "as the lone surviving proposal it needs a total above 60 (has 60)",)
    above = decide([outcome(pct=10, mb=10, ptype="partial_index", steps=True)])  # storage 100 → 62
    assert above.scores["gemini25pro"].total == 62 and above.winner == "gemini25pro"


def test_two_survivors_need_no_sixty() -> None:
    low: dict[str, Any] = {"pct": 10, "mb": 20, "ptype": "partial_index", "steps": True}  # total 60 each
    decision = decide([outcome("gemini25pro", **low), outcome("gemini25flash", **low)])
    assert decision.winner == "gemini25pro"
    assert not decision.scores["gemini25flash"].disqualified


def test_lone_survivor_is_counted_after_the_other_gates() -> None:
    decision = decide([outcome("gemini25pro", pct=10, mb=20, ptype="partial_index", steps=True),
                       outcome("gemini25flash", pct=5)])
    assert decision.winner is None
    assert "lone surviving" in decision.scores["gemini25pro"].disqualified[0]


def test_a_result_changing_proposal_cannot_win() -> None:
    suite = tuple(measurement(name, 99, equivalent=name != "filter") for name in SUITE)
    decision = decide([outcome("gemini25pro", measurements=suite), outcome("gemini25flash", pct=60)])
    assert decision.winner == "gemini25flash"
    assert decision.scores["gemini25pro"].total > decision.scores["gemini25flash"].total
    assert decision.scores["gemini25pro"].disqualified == ("changes query results (filter)",)
    assert decision.ranking == ("gemini25flash", "gemini25pro")  # qualified first


def test_an_invalid_proposal_cannot_win() -> None:
    decision = decide([outcome(is_valid=False)])
    assert decision.winner is None
    assert "its SQL did not pass validation" in decision.scores["gemini25pro"].disqualified


def test_an_inconclusive_proposal_cannot_win() -> None:
    decision = decide([outcome("gemini25pro", significant=False), outcome("gemini25flash", pct=60)])
    assert decision.winner == "gemini25flash"
    assert decision.scores["gemini25pro"].disqualified == (
        "statistically inconclusive: 0 of 4 suite queries beat the noise and the baseline query did not",)


def _suite(significant: tuple[bool, ...], pcts: tuple[float, ...]) -> tuple[Measurement, ...]:
    return tuple(measurement(name, pct, significant=sig)
                 for name, pct, sig in zip(SUITE, pcts, significant, strict=True))


@pytest.mark.parametrize(("significant", "pcts", "conclusive"), [
    ((True, False, False, False), (50, 50, 50, 50), True),  # the baseline query beats the noise
    ((False, True, True, True), (50, 50, 50, 50), True),  # three of four do
    ((False, True, True, False), (50, 50, 50, 50), False),  # half is not a majority
    ((True, False, False, False), (-5, 50, 50, 50), False),  # baseline significant but slower
    ((True, True, True, True), (-5, -5, 50, 50), False),  # two of four faster: no majority
    ((True, True, True, True), (-5, 50, 50, 50), True),
    ((False, False, False, False), (50, 50, 50, 50), False),
])
def test_is_conclusive(significant: tuple[bool, ...], pcts: tuple[float, ...], conclusive: bool) -> None:
    assert is_conclusive(_suite(significant, pcts)) is conclusive


def test_no_measurements_is_inconclusive_and_too_small() -> None:
    decision = decide([outcome(measurements=())])
    assert is_conclusive(()) is False
    reasons = decision.scores["gemini25pro"].disqualified
    assert any("improves only 0 %" in r for r in reasons) and any("inconclusive" in r for r in reasons)


def test_a_proposal_without_the_baseline_query_can_win_by_majority() -> None:
    suite = tuple(measurement(name, 80) for name in ("limit", "filter", "sort"))
    assert decide([outcome(measurements=suite)]).winner == "gemini25pro"


# -- ranking and tie-breaks ----------------------------------------------------------------
def test_the_higher_total_wins() -> None:
    decision = decide([outcome("gemini25pro", pct=60), outcome("gemini20flash", pct=95)])
    assert decision.winner == "gemini20flash"
    assert decision.ranking == ("gemini20flash", "gemini25pro")


def test_tie_goes_first_to_the_simpler_change() -> None:
    # composite (85) with risk 75 ties index (90) with risk 65: 0.2·(−5) + 0.1·10 = 0
    composite = outcome("gemini25pro", ptype="composite_index", risk="medium", rollback=True)
    plain = outcome("gemini20flash", ptype="index", risk="medium", rollback=False, warnings=1)
    decision = decide([composite, plain])
    assert decision.scores["gemini25pro"].total == decision.scores["gemini20flash"].total
    assert decision.winner == "gemini20flash"
    assert "wins the tie-break on complexity (the simpler change: 90 vs 85)" in decision.rationale[0]
    assert any(line.startswith("gemini25pro ties with gemini20flash") for line in decision.rationale)


def test_tie_then_goes_to_less_measured_storage() -> None:
    decision = decide([outcome("gemini25pro", mb=5.0), outcome("gemini20flash", mb=3.0)])
    assert decision.scores["gemini25pro"].total == decision.scores["gemini20flash"].total
    assert decision.winner == "gemini20flash"
    assert "storage (3 MB vs 5 MB)" in decision.rationale[0]


def test_tie_then_goes_to_agent_preference() -> None:
    agents = ("gemini20flash", "gemini25flash", "gemini25pro")
    decision = decide([outcome(agent) for agent in agents])
    assert decision.ranking == ("gemini25pro", "gemini25flash", "gemini20flash")
    assert "agent preference (gemini-2.5-pro first)" in decision.rationale[0]


def test_unknown_agents_rank_after_the_preferred_ones() -> None:
    decision = decide([outcome("zeta"), outcome("alpha"), outcome("gemini20flash")])
    assert decision.ranking == ("gemini20flash", "alpha", "zeta")


def test_totals_tie_when_equal_to_the_cent() -> None:
    # 120 MB → storage 40, 120.004 MB → 39.998: the exact totals differ by 0.0004 only
    decision = decide([outcome("gemini25flash", mb=120.0), outcome("gemini25pro", mb=120.004)])
    assert decision.scores["gemini25pro"].total == decision.scores["gemini25flash"].total == 86
    assert decision.winner == "gemini25pro"


# -- weights -----------------------------------------------------------------------------
def test_weights_override() -> None:
    fast_big = outcome("gemini25pro", pct=95, mb=300)
    slow_small = outcome("gemini25flash", pct=40, mb=1)
    assert decide([fast_big, slow_small]).winner == "gemini25pro"
    storage_first = {"performance": 0.2, "storage": 0.6, "complexity": 0.1, "risk": 0.1}
    decision = decide([fast_big, slow_small], storage_first)
    assert decision.winner == "gemini25flash"
    assert decision.scores["gemini25flash"].total == 0.2 * 50 + 0.6 * 100 + 0.1 * 90 + 0.1 * 100
    only_speed = decide([fast_big], {"performance": 1, "storage": 0, "complexity": 0, "risk": 0})
    assert only_speed.scores["gemini25pro"].total == 100


@pytest.mark.parametrize("weights", [
    {"performance": 0.5, "storage": 0.2, "complexity": 0.2},
    {"performance": 0.5, "storage": 0.2, "complexity": 0.2, "risk": 0.1, "speed": 0.0},
    {"performance": 0.5, "storage": 0.2, "complexity": 0.2, "risk": 0.2},
    {"performance": 0.5, "storage": 0.2, "complexity": 0.2, "risk": 0.0},
    {"performance": 1.2, "storage": -0.2, "complexity": 0.0, "risk": 0.0},
    {"performance": float("nan"), "storage": 0.2, "complexity": 0.2, "risk": 0.1},
    {},
])
def test_bad_weights(weights: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="weights"):
        decide([outcome()], weights)


def test_check_weights_defaults() -> None:
    assert check_weights(None) is WEIGHTS
    assert sum(check_weights({"performance": 0.7, "storage": 0.1, "complexity": 0.1, "risk": 0.1}).values()) \
        == pytest.approx(1)


# -- agreement and confidence -------------------------------------------------------------
def test_normalized_ddl_ignores_names_case_spacing_and_options() -> None:
    a = normalize_ddl("CREATE INDEX a ON orders (user_id)")
    assert a == "create index on orders(user_id)"
    assert a == normalize_ddl("create index concurrently b on orders(user_id);")
    assert a == normalize_ddl("CREATE  INDEX IF NOT EXISTS \"Idx B\"\n  ON orders USING btree ( user_id )")
    assert a == normalize_ddl("create index on orders (user_id)")
    assert a != normalize_ddl("CREATE INDEX a ON orders USING brin (user_id)")
    assert a != normalize_ddl("CREATE UNIQUE INDEX a ON orders (user_id)")
    assert normalize_ddl("CREATE INDEX x ON t (a) WHERE s = 'Open'") != normalize_ddl(
        "CREATE INDEX x ON t (a) WHERE s = 'open'")  # literals keep their case
    assert normalize_ddl("CREATE INDEX x ON t (a) WHERE s = 'Open'") == normalize_ddl(
        "create index y on t(a) where s='Open'")


def test_ddl_signature_is_a_set_without_analyze() -> None:
    one = outcome("gemini25pro", sql=("CREATE INDEX a ON orders (user_id)", "ANALYZE orders",
                                      "CREATE INDEX b ON orders (status)"))
    two = outcome("gemini25flash", sql=("create index concurrently y on orders(status)",
                                        "create index concurrently x on orders(user_id)"))
    assert one.proposal and two.proposal
    assert ddl_signature(one.proposal) == ddl_signature(two.proposal)


def test_ddl_signature_is_what_the_validator_read() -> None:
    # a comment, case, CONCURRENTLY, IF NOT EXISTS, USING btree said or not: the same index
    one = outcome("gemini25pro", sql=("/* by the squad */ CREATE INDEX a ON orders USING btree (user_id)",
                                      "-- statistics\nANALYZE orders"))
    two = outcome("gemini25flash", sql=("create index concurrently if not exists b on orders(user_id)",))
    three = outcome("gemini20flash", sql=('CREATE INDEX a ON "Orders" (user_id)',))
    assert one.proposal and two.proposal and three.proposal
    assert ddl_signature(one.proposal) == ddl_signature(two.proposal)
    assert ddl_signature(one.proposal) != ddl_signature(three.proposal)  # another table


def test_agreement_on_equivalent_ddl_raises_confidence() -> None:
    winner = outcome("gemini25pro", sql=("CREATE INDEX a ON orders (user_id)",))
    same = outcome("gemini25flash", pct=60, sql=("create index concurrently b on orders(user_id)",))
    other = outcome("gemini25flash", pct=60, sql=("CREATE INDEX b ON orders (status)",))
    agreed, alone = decide([winner, same]), decide([winner, other])
    assert agreed.winner == alone.winner == "gemini25pro"
    assert agreed.confidence == pytest.approx(alone.confidence + 0.15)
    assert "gemini25flash proposed equivalent DDL" in agreed.rationale[-1]


def test_agreement_counts_a_proposal_that_failed_later() -> None:
    winner = outcome("gemini25pro", sql=("CREATE INDEX a ON orders (user_id)",))
    base = decide([winner]).confidence
    same = outcome("gemini20flash", sql=("CREATE INDEX b ON orders (user_id)",), significant=False)
    assert decide([winner, same]).confidence == pytest.approx(base + 0.15)


def test_confidence_formula() -> None:
    # winner: 0.5·100 + 0.2·100 + 0.2·90 + 0.1·100 = 98 (95 %, 3 MB, index, low risk with rollback);
    # runner-up: 0.5·70 + 0.2·75 + 0.2·50 + 0.1·100 = 70; margin 28 → term 1; all significant → 1
    rival = outcome("gemini25flash", pct=55, mb=30, ptype="partitioning", sql=("CREATE INDEX b ON t (a)",))
    clear = decide([outcome("gemini25pro"), rival])
    assert clear.scores["gemini25pro"].total == 98 and clear.scores["gemini25flash"].total == 70
    assert clear.confidence == pytest.approx(0.30 + 0.30 + 0.25)
    # lone winner at 70 (60 %: performance 70): margin over the bar of 60 is 10 → term 0.5;
    # two of four queries significant → 0.5
    half = _suite((True, True, False, False), (60, 60, 60, 60))
    lone = decide([outcome(measurements=half, mb=30, ptype="partitioning")])
    assert lone.scores["gemini25pro"].total == 70
    assert lone.confidence == pytest.approx(0.30 + 0.30 * 0.5 + 0.25 * 0.5)
    # a tie leaves no margin
    tie = decide([outcome("gemini25pro"), outcome("gemini25flash")])
    assert tie.confidence == pytest.approx(0.30 + 0.25 + 0.15)  # same DDL: they agree too
    assert 0 <= tie.confidence <= 1


def test_confidence_is_capped_at_one() -> None:
    decision = decide([outcome("gemini25pro"), outcome("gemini25flash", pct=-20),
                       outcome("gemini20flash", pct=-30)])
    assert decision.confidence == 1.0  # lone at 98: margin term 1, all significant, agreement


# -- rationale and the unscored ------------------------------------------------------------
def test_rationale_explains_the_winner_and_each_loser() -> None:
    decision = decide([
        outcome("gemini25pro", pct=97, mb=3.1, sql=("CREATE INDEX a ON orders (user_id)",)),
        outcome("gemini25flash", pct=60, mb=3.1, sql=("CREATE INDEX b ON orders (status)",)),
        outcome("gemini20flash", pct=5, sql=("CREATE INDEX c ON orders (created_at)",)),
    ])
    first, *rest = decision.rationale
    assert first == ("gemini25pro wins with 98: the query as given 1 s → 30 ms (33.3×), 97 % faster"
                     " on average, 3.1 MB of storage, index"
                     " (1 command, complexity 90); it leads gemini25flash by 15, most on performance"
                     " (100 vs 70).")
    assert rest[0] == ("gemini25flash loses with 83, 15 below gemini25pro (60 % faster on average, 3.1 MB"
                       " of storage, index (1 command, complexity 90)); the largest gap is performance"
                       " (70 vs 100).")
    assert rest[1].startswith("gemini20flash cannot win (")
    assert rest[1].endswith("improves only 5 % on average (needs at least 10 %).")
    assert decision.confidence == pytest.approx(0.30 + 0.30 * 15 / 20 + 0.25)
    assert rest[-1] == "Confidence 0.78: margin 15 over gemini25flash, 4 of 4 suite queries beat the noise."


def test_lone_winner_is_explained() -> None:
    decision = decide([outcome(), failed("gemini25flash", "model timed out after 120 s")])
    assert decision.rationale[0].endswith("it is the only proposal that passed every gate.")


def test_failed_and_rejected_agents_are_listed_with_their_error() -> None:
    decision = decide([
        outcome("gemini25pro"),
        failed("gemini25flash", "model timed out after 120 s"),
        failed("gemini20flash", "DROP TABLE is not allowed", status="rejected"),
        failed("other", None),
    ])
    assert decision.winner == "gemini25pro"
    assert set(decision.scores) == {"gemini25pro"} and decision.ranking == ("gemini25pro",)
    assert "gemini25flash failed: model timed out after 120 s." in decision.rationale
    assert "gemini20flash was rejected: DROP TABLE is not allowed." in decision.rationale
    assert "other failed: no error recorded." in decision.rationale


def test_an_ok_outcome_without_a_benchmark_is_not_scored() -> None:
    measured = outcome()
    unmeasured = AgentOutcome(agent="gemini25flash", status="ok", proposal=measured.proposal,
                              validation=measured.validation)
    decision = decide([unmeasured])
    assert decision.winner is None and not decision.scores
    assert decision.rationale == ("No winner: no proposal was measured.",
                                  "gemini25flash was not scored: no benchmark.")


def test_no_outcomes_no_winner() -> None:
    decision = decide([])
    assert decision.winner is None and decision.confidence == 0
    assert decision.scores == {} and decision.ranking == ()
    assert decision.rationale == ("No winner: no agent returned an outcome.",)


def test_everyone_disqualified_no_winner() -> None:
    decision = decide([outcome("gemini25pro", pct=5), outcome("gemini25flash", pct=-3)])
    assert decision.winner is None and decision.confidence == 0
    assert decision.rationale[0] == "No winner: every measured proposal was disqualified."
    assert len(decision.rationale) == 3
    assert decision.ranking == ("gemini25pro", "gemini25flash")


def test_duplicate_agents_are_a_bug() -> None:
    with pytest.raises(ValueError, match="gemini25pro"):
        decide([outcome(), outcome()])


def test_consensus_is_pure() -> None:
    source = Path(__file__).resolve().parent.parent / "afs" / "consensus.py"
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"trio", "psycopg", "mcp", "httpx", "google", "anyio", "structlog"}


# -- ours: the query family and the refresh cost of a view ---------------------------------
def _with_family(o: AgentOutcome, **changes: Any) -> AgentOutcome:
    assert o.benchmark is not None
    return dataclasses.replace(o, benchmark=dataclasses.replace(o.benchmark, **changes))


def test_an_answer_cache_cannot_win_however_fast() -> None:
    cache = _with_family(outcome(pct=99.9, ptype="materialized_view"),
                         answer_cache="its query has no place for other values")
    decision = decide([cache, outcome("gemini25flash", pct=60.0)])
    assert decision.winner == "gemini25flash"
    assert any("query family" in r for r in decision.scores["gemini25pro"].disqualified)


@pytest.mark.parametrize(("check", "reason"), [
    (ParameterCheck("status = 'shipped'", equivalent=False, slower=False), "other rows"),
    (ParameterCheck("status = 'shipped'", equivalent=True, slower=True), "slower than the original"),
])
def test_a_proposal_that_fails_another_parameter_set_cannot_win(check: ParameterCheck, reason: str) -> None:
    o = _with_family(outcome(), parameter_checks=(check,))
    decision = decide([o])
    assert decision.winner is None
    assert any(reason in r for r in decision.scores["gemini25pro"].disqualified)
    fine = _with_family(outcome(), parameter_checks=(ParameterCheck("x", True, False),))
    assert decide([fine]).winner == "gemini25pro"


def test_a_view_pays_for_its_measured_refresh_time() -> None:
    quick = _with_family(outcome(ptype="materialized_view", needs_refresh=True), apply_s=0.5)
    slow = _with_family(outcome(ptype="materialized_view", needs_refresh=True), apply_s=30.0)
    assert score(quick) is not None and score(slow) is not None
    assert score(slow).complexity == score(quick).complexity - 19  # type: ignore[union-attr]
    assert any("each refresh takes about 30 s" in line for line in decide([slow]).rationale)
    assert refresh_cost(candidate(ptype="index")) is None


def test_the_design_that_serves_the_whole_family_scores_higher() -> None:
    def timed(before: float, after: float) -> ParameterCheck:
        return ParameterCheck("status = 'completed'", True, False,
                              Timing(before, 1.0, 3, 100), Timing(after, 1.0, 3, 10))
    narrow = _with_family(outcome("gemini25pro", pct=99.0), parameter_checks=(timed(100.0, 100.0),) * 2)
    broad = _with_family(outcome("gemini25flash", pct=95.0), parameter_checks=(timed(100.0, 5.0),) * 2)
    decision = decide([narrow, broad])
    assert decision.winner == "gemini25flash"
    assert decision.scores["gemini25pro"].performance < decision.scores["gemini25flash"].performance


# -- measured clearly faster ranks first (issue 25 item 4) -----------------------------------
def timed(runs: tuple[float, ...]) -> Timing:
    """A Timing as afs.bench.timing makes it from these runs (ms)."""
    ordered = sorted(runs)
    median = ordered[len(ordered) // 2]
    return Timing(median_ms=median, spread_ms=(ordered[-1] - ordered[0]) / 2, runs=len(runs),
                  buffers=40, min_ms=ordered[0], max_ms=ordered[-1])


BEFORE_256 = (251.2, 256.0, 262.9, 254.4, 258.1)  # ms, the query as given before any change


def sampled(optimized: tuple[float, ...], before: tuple[float, ...] = BEFORE_256,
            lower_bound: bool = False) -> tuple[Measurement, ...]:
    base = dataclasses.replace(timed(before), lower_bound=lower_bound, buffers=5000)
    return tuple(Measurement(name=name, baseline=base, optimized=timed(optimized), rows=1,
                             equivalent=True, significant=True) for name in SUITE)


PLAIN = ("CREATE INDEX p ON order_items (product_id)",)
COVERING = ("CREATE INDEX c ON order_items (product_id) INCLUDE (quantity)",)


def test_a_candidate_measured_clearly_faster_wins_over_saturated_bands() -> None:
    # both > 99 % faster: one performance band. The plain index is the simpler change (90 vs
    # 85) and smaller, so the seed's total prefers it; the covering index is measured ~2.3×
    # faster, every run of it faster than every run of the plain one
    plain = outcome("gemini25pro", ptype="index", sql=PLAIN, mb=2.0,
                    measurements=sampled((0.071, 0.069, 0.074, 0.066, 0.078)))
    covering = outcome("gemini25flash", ptype="composite_index", sql=COVERING, mb=4.0,
                       measurements=sampled((0.031, 0.029, 0.034, 0.030, 0.028)))
    decision = decide([plain, covering])
    assert decision.scores["gemini25pro"].total > decision.scores["gemini25flash"].total
    assert decision.winner == "gemini25flash"
    assert decision.ranking == ("gemini25flash", "gemini25pro")
    first, loser, *_ = decision.rationale
    assert "the query as given 256 ms → 0.03 ms (8,533×)" in first, first
    assert "measured clearly faster than gemini25pro" in first and "0.03 ms vs 0.071 ms" in first
    assert "outweighs gemini25pro's higher total (98 vs 97)" in first, first
    assert loser.startswith("gemini25pro loses with 98")
    assert "gemini25flash is measured clearly faster" in loser
    assert decision.rationale[-1].startswith("Confidence 0.85: measured clearly faster than gemini25pro")


def test_a_candidate_faster_only_by_noise_does_not_win_by_speed() -> None:
    # the covering index's median is lower, but its runs overlap the plain one's: the seed's
    # total decides, and the simpler change wins
    plain = outcome("gemini25pro", ptype="index", sql=PLAIN, mb=2.0,
                    measurements=sampled((0.071, 0.069, 0.074, 0.066, 0.078)))
    noisy = outcome("gemini25flash", ptype="composite_index", sql=COVERING, mb=4.0,
                    measurements=sampled((0.060, 0.064, 0.070, 0.058, 0.067)))
    decision = decide([plain, noisy])
    assert decision.winner == "gemini25pro"
    assert noisy.proposal and noisy.validation and noisy.benchmark
    assert plain.proposal and plain.validation and plain.benchmark
    assert not clearly_faster(Candidate(noisy, noisy.proposal, noisy.validation, noisy.benchmark),
                              Candidate(plain, plain.proposal, plain.validation, plain.benchmark))
    assert "clearly" not in " ".join(decision.rationale)


def test_separated_runs_need_a_tenth_more_speed_to_count() -> None:
    # tight runs, completely apart, but only 5 % faster: within what two forks' drift may do
    plain = outcome("gemini25pro", ptype="index", sql=PLAIN, mb=2.0,
                    measurements=sampled((10.0, 10.02, 10.04)))
    close = outcome("gemini25flash", ptype="composite_index", sql=COVERING, mb=4.0,
                    measurements=sampled((9.5, 9.52, 9.54)))
    assert decide([plain, close]).winner == "gemini25pro"
    assert DOMINANCE_MIN_RATIO > 1.05


def test_against_reused_baseline_runs_only_a_factor_beyond_drift_counts() -> None:
    # both measured against the task's baseline runs made ahead (afs.bench.Reuse): the 1.6x
    # between them may be the machine's drift between the two measurements, not the designs
    def reused(optimized: tuple[float, ...]) -> tuple[Measurement, ...]:
        return tuple(dataclasses.replace(m, baseline=dataclasses.replace(m.baseline, reused=5))
                     for m in sampled(optimized))

    plain = outcome("gemini25pro", ptype="index", sql=PLAIN, mb=2.0,
                    measurements=reused((0.071, 0.069, 0.074, 0.066, 0.078)))
    drifted = outcome("gemini25flash", ptype="composite_index", sql=COVERING, mb=4.0,
                      measurements=reused((0.045, 0.043, 0.047, 0.044, 0.046)))
    assert decide([plain, drifted]).winner == "gemini25pro"
    covering = outcome("gemini25flash", ptype="composite_index", sql=COVERING, mb=4.0,
                       measurements=reused((0.031, 0.029, 0.034, 0.030, 0.028)))  # 2.4x: beyond drift
    assert decide([plain, covering]).winner == "gemini25flash"
    assert DRIFT_RATIO > DOMINANCE_MIN_RATIO


# a partial index on the query's own constant (status = 'pending') and other values of the
# query's family, each 152 ms before any change
FAMILY = ("status = 'completed'", "status = 'refunded'")
PLAIN_USER_ID = ("CREATE INDEX i ON orders (user_id)",)


def other_values(after: float) -> tuple[ParameterCheck, ...]:
    return tuple(ParameterCheck(label, True, False, timed((150.0, 152.0, 155.0)),
                                timed((after, after + 0.1, after + 0.2))) for label in FAMILY)


def served(o: AgentOutcome, after: float) -> AgentOutcome:
    return _with_family(o, parameter_checks=other_values(after))


def partial_on_todays_literal() -> AgentOutcome:
    """The query as given 256 ms → 0.03 ms; the other values unchanged."""
    return served(outcome("gemini25pro", ptype="partial_index", mb=0.5,
                          sql=("CREATE INDEX p ON orders (user_id, created_at) WHERE status = 'pending'",),
                          measurements=sampled((0.031, 0.029, 0.034, 0.030, 0.028))), 149.0)


def as_candidate(o: AgentOutcome) -> Candidate:
    assert o.proposal and o.validation and o.benchmark
    return Candidate(o, o.proposal, o.validation, o.benchmark)


def test_faster_for_todays_literal_only_is_not_clearly_faster() -> None:
    # the partial index runs the query as given ~2× faster than a plain index, every run apart,
    # but does nothing for the other values the plain index serves: the family decides
    partial = partial_on_todays_literal()
    plain = served(outcome("gemini25flash", ptype="index", mb=3.0, sql=PLAIN_USER_ID,
                           measurements=sampled((0.071, 0.069, 0.074, 0.066, 0.078))), 2.0)
    assert not clearly_faster(as_candidate(partial), as_candidate(plain))
    assert not serves_family_as_well(as_candidate(partial), as_candidate(plain))
    assert serves_family_as_well(as_candidate(plain), as_candidate(partial))
    decision = decide([partial, plain])
    assert decision.winner == "gemini25flash", decision.rationale
    # the same partial index, where it serves the other values as well, is clearly faster
    assert clearly_faster(as_candidate(served(partial, 2.0)), as_candidate(plain))


def test_a_design_for_todays_literal_never_wins_over_one_that_serves_the_family() -> None:
    # the plain index: the query as given only 40 % faster, every other value 72×. The partial
    # one has the higher total (its suite saturates the bands), yet the plain one must win
    partial = partial_on_todays_literal()
    plain = served(outcome("gemini25flash", ptype="index", mb=40.0, sql=PLAIN_USER_ID,
                           measurements=sampled((150.0, 152.0, 155.0))), 2.0)
    one, other = as_candidate(partial), as_candidate(plain)
    assert serves_family_clearly_better(other, one) and not serves_family_clearly_better(one, other)
    decision = decide([partial, plain])
    assert decision.scores["gemini25pro"].total > decision.scores["gemini25flash"].total
    assert decision.winner == "gemini25flash", decision.rationale
    first, loser, *_ = decision.rationale
    assert "serves the query's other parameter values clearly better than gemini25pro" in first, first
    assert "status = 'completed': 72.4× vs 1.02× faster than before" in first, first
    assert "outweighs gemini25pro's higher total" in first
    assert loser.startswith("gemini25pro loses") and "serves the query's other parameter values" in loser
    # values neither design serves differently decide nothing: the seed's total does
    assert decide([partial, served(plain, 149.0)]).winner == "gemini25pro"


def test_the_speedup_range_reads_both_samples() -> None:
    (m, *_) = sampled((2.0, 2.5, 4.0), before=(100.0, 120.0, 110.0))
    low, median, high = speedup_range(m) or (0, 0, 0)
    assert (low, median, high) == (25.0, 110.0 / 2.5, 60.0)
    assert speedup_range(measurement()) is None  # runs' extremes not recorded: never clearly faster


def test_a_disqualified_candidate_never_ranks_first_however_fast() -> None:
    plain = outcome("gemini25pro", ptype="index", sql=PLAIN, mb=2.0,
                    measurements=sampled((0.071, 0.069, 0.074, 0.066, 0.078)))
    wrong = dataclasses.replace(sampled((0.001, 0.001, 0.002))[0], equivalent=False)
    other_rows = outcome("gemini25flash", ptype="composite_index", sql=COVERING,
                         measurements=(wrong, *sampled((0.001, 0.001, 0.002))[1:]))
    decision = decide([plain, other_rows])
    assert decision.winner == "gemini25pro"
    assert decision.ranking == ("gemini25pro", "gemini25flash")


def test_clearly_faster_orders_three_candidates_and_totals_decide_the_rest() -> None:
    slow = outcome("gemini25pro", ptype="index", sql=PLAIN, mb=1.0,
                   measurements=sampled((8.0, 8.4, 8.9)))
    fast = outcome("gemini25flash", ptype="composite_index", sql=COVERING, mb=60.0,
                   measurements=sampled((0.5, 0.52, 0.55)))
    # as fast as `fast` within the noise, and the simpler change: the total decides between them
    twin = outcome("gemini20flash", ptype="index", mb=3.0,
                   sql=("CREATE INDEX t ON order_items (product_id, quantity)",),
                   measurements=sampled((0.49, 0.53, 0.56)))
    decision = decide([slow, fast, twin])
    assert decision.ranking == ("gemini20flash", "gemini25flash", "gemini25pro")
    last = decision.rationale[2]
    assert last.startswith("gemini25pro loses") and "is measured clearly faster" in last


def test_a_capped_baseline_is_said_to_be_a_lower_bound_in_numbers() -> None:
    capped = outcome(measurements=sampled((8.1, 8.2, 8.4), before=(60_000.0,), lower_bound=True))
    first = decide([capped]).rationale[0]
    assert "the query as given ≥ 60 s (lower bound) → 8.2 ms (≥ 7,317×)" in first, first


# -- the write cost measured in the fork (BenchmarkOutcome.write_cost), else the ratio ------------
# the factory's query as given: 1000 ms → 50 ms (95 % faster), so 950 ms saved per call
SAVED_MS = 950.0


def cost(ms_per_day: float | None, *, reads_per_day: float | None = 100.0, significant: bool = True,
         statements: int = 2, writes_per_day: float | None = 5000.0) -> WriteCost:
    per_write = 0.0 if ms_per_day is None or not writes_per_day else ms_per_day / writes_per_day
    return WriteCost(ms_per_write=per_write, writes_per_day=writes_per_day, ms_per_day=ms_per_day,
                     reads_per_day=reads_per_day, significant=significant, statements=statements)


def with_cost(write_cost: WriteCost | None, **kwargs: object) -> AgentOutcome:
    o = outcome(**kwargs)  # type: ignore[arg-type]
    assert o.benchmark is not None
    return dataclasses.replace(o, benchmark=dataclasses.replace(o.benchmark, write_cost=write_cost))


def candidate_of(o: AgentOutcome) -> Candidate:
    assert o.proposal and o.validation and o.benchmark
    return Candidate(o, o.proposal, o.validation, o.benchmark)


@pytest.mark.parametrize(("share", "delta"), [(0.5, -7.5), (0.2, -3.0), (1.0, -15.0), (4.0, -15.0)])
def test_the_measured_cost_is_weighed_against_the_reads_saved_a_day(share: float, delta: float) -> None:
    saved_a_day = SAVED_MS * 100.0
    c = candidate_of(with_cost(cost(share * saved_a_day), writes_per_read=0.8))
    assert read_ms_saved_per_day(c) == pytest.approx(saved_a_day)
    adjustment = index_write_cost(c)
    assert adjustment is not None and adjustment.criterion == "risk"
    assert adjustment.delta == pytest.approx(delta)
    # the measured figures, not the ratio (0.8 writes per read would have cost 8)
    assert "measured in the fork" in adjustment.reason and "writes per read" not in adjustment.reason
    assert f"{share * saved_a_day:g} ms a day" in adjustment.reason.replace(",", "")
    assert "95000 ms a day saved on the reads (100 calls a day)" in adjustment.reason


def test_a_cost_within_the_noise_is_still_the_estimate_and_one_not_above_zero_deducts_nothing() -> None:
    noisy = index_write_cost(candidate_of(with_cost(cost(0.5 * SAVED_MS * 100.0, significant=False),
                                                    writes_per_read=4.0)))
    assert noisy is not None and noisy.delta == pytest.approx(-7.5) and "within the noise" in noisy.reason
    for ms_per_day in (0.0, -10.0):
        adjustment = index_write_cost(candidate_of(with_cost(cost(ms_per_day), writes_per_read=4.0)))
        assert adjustment is not None and adjustment.delta == 0.0
        assert "no risk deducted" in adjustment.reason and "measured in the fork" in adjustment.reason


def test_the_ratio_decides_without_a_measurement_with_both_rates_and_says_why() -> None:
    cases = {
        "no write cost measured in the fork": None,
        "has no rate a day": cost(None, writes_per_day=None),
        "no write replayed in the fork": dataclasses.replace(cost(10.0), statements=0),
    }
    for why, write_cost in cases.items():
        adjustment = index_write_cost(candidate_of(with_cost(write_cost, writes_per_read=0.5)))
        assert adjustment is not None and adjustment.delta == -5, why
        assert "0.5 writes per read, the source's ratio" in adjustment.reason and why in adjustment.reason
    # no observed rate of the reads: the saving a day is unknown, the ratio decides
    unrated = candidate_of(with_cost(cost(10.0, reads_per_day=None), writes_per_read=0.5))
    assert read_ms_saved_per_day(unrated) is None
    adjustment = index_write_cost(unrated)
    assert adjustment is not None and adjustment.delta == -5


def test_the_measured_cost_counts_in_the_risk_score_and_the_rationale() -> None:
    plain = decide([outcome()]).scores["gemini25pro"].risk
    heavy = decide([with_cost(cost(10 * SAVED_MS * 100.0), writes_per_read=0.1)])
    assert heavy.scores["gemini25pro"].risk == plain - WRITE_COST_MAX
    assert any("gemini25pro: risk −15 for the write cost of a new index (measured in the fork" in line
               for line in heavy.rationale)
    light = decide([with_cost(cost(0.1 * SAVED_MS * 100.0), writes_per_read=4.0)])
    assert light.scores["gemini25pro"].risk == plain - 1.5  # not the ratio's −15
