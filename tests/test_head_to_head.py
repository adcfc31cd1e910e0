"""Two designs as fast as each other by their own measurements are measured head to head before
complexity points decide (issue 25, item 5: where the effect is small, keep measuring); extended
statistics are measured interleaved, hidden for the baseline runs, not before and after."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from afs.agents import (
    AgentJob,
    _InFork,
    _InPlace,
    _Progress,
    best_candidate,
    contest_note,
    step_contest,
    tie_to_settle,
)
from afs.bench import (
    CONTEST_P,
    CONTEST_PAIRS,
    Contest,
    Figure,
    Sample,
    StopRule,
    Suites,
    TaskMeasurements,
    _pairs,
    _rank_sum_p,
    benchmark,
    contest_verdict,
    figure_significant,
    hideable_statistics,
    hiding,
    keep_pairing,
    paired_significant,
    signed_rank,
    timing,
)
from afs.config import Measuring, Timeouts
from afs.db import Connection
from afs.errors import ProposalFailedError
from afs.events import Emitter
from afs.models import (
    BenchmarkOutcome,
    CandidateResult,
    EstimatedImpact,
    Measurement,
    OptimizationProposal,
    ProposalType,
    QueryVariant,
    Timing,
    ValidationResult,
)
from afs.query.features import extract_features

RULE = StopRule(min_runs=3, max_runs=10)
QUERY = "SELECT c.id FROM customers c WHERE c.id NOT IN (SELECT o.customer_id FROM orders o)"
REWRITE = "SELECT c.id FROM customers c WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id)"


def proposal(ptype: ProposalType, *sql: str, rewrite: str | None = None,
             settings: tuple[tuple[str, str], ...] = ()) -> OptimizationProposal:
    return OptimizationProposal(agent="gemini25pro", proposal_type=ptype, sql_commands=sql,
                                rollback_commands=(), rationale="test",
                                estimated_impact=EstimatedImpact(50, 1, "low", "low"),
                                rewritten_query=rewrite, settings=settings)


def measured(rank: int, design: OptimizationProposal, runs_ms: tuple[float, float, float]) -> CandidateResult:
    """A design measured on three suite queries, 3000 ms before; `runs_ms` after (min, median, max)."""
    low, mid, high = runs_ms
    figures = tuple(Measurement(name, Timing(3000.0, 100.0, 3, 9000, min_ms=2900.0, max_ms=3100.0),
                                Timing(mid, (high - low) / 2, 3, 9000, min_ms=low, max_ms=high), 10,
                                equivalent=True, significant=True) for name in ("baseline", "limit", "sort"))
    return CandidateResult(design, "measured", rank, ValidationResult(True, "low", 1.0),
                           benchmark=BenchmarkOutcome(figures, 100.0, 100.0))


SETTING = proposal("settings", settings=(("work_mem", "64MB"),))
REWRITTEN = proposal("query_rewrite", rewrite=REWRITE)


# -- which two designs are settled head to head (pure) ----------------------------------------
def test_two_designs_as_fast_as_each_other_are_settled_head_to_head_not_by_complexity() -> None:
    # a setting (complexity 90) and a rewrite (85), 289 and 285 ms against the same baseline:
    # as fast as each other, so the score alone would pick the setting
    setting = measured(1, SETTING, (250.0, 289.0, 330.0))
    rewrite = measured(2, REWRITTEN, (240.0, 285.0, 320.0))
    assert best_candidate("gemini25pro", [setting, rewrite], {}).rank == 1
    pair = tie_to_settle("gemini25pro", [setting, rewrite], {})
    assert pair is not None and {c.rank for c in pair} == {1, 2} and pair[0].rank == 1
    # measured slower head to head: the other one is kept, whatever the points
    assert best_candidate("gemini25pro", [setting, rewrite], {}, slower={1}).rank == 2


def test_nothing_to_settle_when_the_measurements_already_tell_the_designs_apart() -> None:
    setting = measured(1, SETTING, (280.0, 289.0, 300.0))
    # many times faster: not as fast as each other, speed decides already
    assert tie_to_settle("gemini25pro", [setting, measured(2, REWRITTEN, (20.0, 25.0, 30.0))], {}) is None
    # the score's choice measured faster beyond the noise (every run, 5 %): nothing to settle
    assert tie_to_settle("gemini25pro", [setting, measured(2, REWRITTEN, (305.0, 310.0, 315.0))], {}) is None
    # one design alone, twice (another agent's measurement of the same design)
    assert tie_to_settle("gemini25pro", [setting, measured(2, SETTING, (250.0, 280.0, 300.0))], {}) is None
    # sub-millisecond times are noise (as `as_fast` says)
    fast = proposal("index", "CREATE INDEX a ON orders (customer_id)")
    assert tie_to_settle("gemini25pro", [measured(1, fast, (0.02, 0.03, 0.04)),
                                         measured(2, REWRITTEN, (0.02, 0.03, 0.05))], {}) is None
    # a design that cannot be hidden in a transaction (a materialized view) is not contested
    view = proposal("materialized_view", "CREATE MATERIALIZED VIEW v AS SELECT 1 AS x",
                    rewrite="SELECT x FROM v")
    assert tie_to_settle("gemini25pro", [measured(1, view, (250.0, 289.0, 330.0)),
                                         measured(2, REWRITTEN, (240.0, 285.0, 320.0))], {}) is None


def test_what_hides_a_design_inside_a_transaction() -> None:
    assert hiding(SETTING) == () and hiding(REWRITTEN) == ()
    assert hiding(proposal("index", "CREATE INDEX a ON orders (customer_id)")) == ('DROP INDEX "a"',)
    stats = proposal("statistics", "CREATE STATISTICS s1 (ndistinct) ON city, zip FROM addresses",
                     "ANALYZE addresses")
    assert hideable_statistics(stats) == ("s1",)
    assert hiding(stats) == ('DROP STATISTICS "s1"',)
    assert hiding(proposal("materialized_view", "CREATE MATERIALIZED VIEW v AS SELECT 1 AS x")) is None
    mixed = proposal("statistics", "CREATE STATISTICS s1 ON city, zip FROM addresses",
                     "CREATE INDEX a ON addresses (city)")
    assert hideable_statistics(mixed) is None


# -- the verdict of a head-to-head (pure) -------------------------------------------------------
def test_every_pair_won_by_one_design_settles_it_after_seven_pairs() -> None:
    # paired runs drift together (a busy server): 425 vs 210 ms with runs from 200 to 800 ms
    slow = [425.0, 800.0, 430.0, 610.0, 390.0, 700.0, 455.0]
    fast = [210.0, 760.0, 200.0, 330.0, 250.0, 520.0, 300.0]
    for n in range(1, CONTEST_PAIRS):
        assert contest_verdict(slow[:n], fast[:n], RULE) == (None, None)
    assert contest_verdict(slow, fast, RULE) == ("separated", "second")
    assert contest_verdict(fast, slow, RULE) == ("separated", "first")


def test_one_pair_the_other_way_does_not_end_the_contest_but_a_lost_cause_does() -> None:
    # a burst in the second pair: the contest goes on
    assert contest_verdict([430.0, 460.0], [480.0, 420.0], RULE) == (None, None)
    # 10 pairs, the second design won 9, and the one it lost by little (460 vs 450): faster
    slow = [460.0, 800.0, 700.0, 650.0, 520.0, 610.0, 480.0, 690.0, 560.0, 600.0]
    fast = [470.0, 420.0, 400.0, 420.0, 410.0, 380.0, 430.0, 440.0, 390.0, 405.0]
    assert contest_verdict(slow[:7], fast[:7], RULE) == (None, None)
    assert contest_verdict(slow, fast, RULE)[1] == "second"
    # pairs won by each design alike: neither can reach a verdict within the maximum of pairs
    a, b = [300.0, 280.0, 310.0, 270.0, 305.0], [280.0, 300.0, 290.0, 290.0, 285.0]
    assert contest_verdict(a[:4], b[:4], RULE) == (None, None)
    assert contest_verdict(a, b, RULE) == ("overlap", None)
    # won pairs but the medians within 5 %: no verdict, up to the maximum of pairs
    a, b = [100.0 + i for i in range(10)], [101.0 + i for i in range(10)]
    assert contest_verdict(a[:9], b[:9], RULE) == (None, None)
    assert contest_verdict(a, b, RULE) == ("max_runs", None)
    assert contest_verdict(a[:4], b[:4], RULE, out_of_time=True) == ("budget", None)


def test_the_signed_rank_test_counts_how_often_and_by_how_much() -> None:
    assert _rank_sum_p(0, 7) == 1 / 128 and _rank_sum_p(5, 10) < CONTEST_P < _rank_sum_p(6, 10)
    side, p, lost = signed_rank([400.0, 420.0, 410.0], [200.0, 430.0, 210.0])
    assert side == "second" and lost == (5, 1) and p == 2 / 8


def test_a_clear_margin_settles_it_at_the_minimum() -> None:
    assert contest_verdict([100.0, 101.0, 99.0], [50.0, 51.0, 49.0], RULE) == ("separated", "second")


def test_the_note_says_which_design_won_and_by_how_much() -> None:
    found = Contest(tuple(Sample(ms, 1) for ms in (425.0, 430.0, 420.0)),
                    tuple(Sample(ms, 1) for ms in (210.0, 200.0, 220.0)), "second", "separated")
    assert contest_note(found, True, 2) == ("slower than #2 head to head in one fork: 425.0 ms against"
                                            " 210.0 ms (3 pairs of runs)")
    assert contest_note(found, False, 1).startswith("faster than #1 head to head")


async def test_a_contest_runs_once_per_task_and_each_agent_reads_it_in_its_own_order() -> None:
    shared, runs = TaskMeasurements(), []

    async def run(a: OptimizationProposal, b: OptimizationProposal) -> Contest:
        runs.append((a, b))
        await trio.sleep(0.01)
        faster = "first" if a is REWRITTEN else "second"
        mine, theirs = (Sample(200.0, 1),), (Sample(400.0, 1),)
        return Contest(mine if a is REWRITTEN else theirs, theirs if a is REWRITTEN else mine,
                       faster, "separated")  # type: ignore[arg-type]

    found: dict[str, Contest] = {}

    async def ask(name: str, first: OptimizationProposal, second: OptimizationProposal) -> None:
        found[name] = await shared.settle(first, second, run)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "one", SETTING, REWRITTEN)
        nursery.start_soon(ask, "two", REWRITTEN, SETTING)
    assert len(runs) == 1
    assert found["one"].faster == "second" and found["one"].second[0].ms == 200.0
    assert found["two"].faster == "first" and found["two"].first[0].ms == 200.0


# -- where the effect is small, keep measuring (interleaved figures) ---------------------------
# a busy server: the runs swing between 60 and 110 ms, and each candidate run is ~20 % faster
# than the baseline run next to it; the two samples overlap from the third pair on
BUSY_BASELINE = [100.0, 60.0, 110.0, 70.0, 105.0, 65.0, 100.0]
BUSY_CANDIDATE = [80.0, 50.0, 90.0, 55.0, 85.0, 52.0, 80.0]


def test_overlapping_samples_whose_every_pair_goes_one_way_are_measured_on() -> None:
    rule = StopRule(min_runs=3, max_runs=5)
    assert keep_pairing(BUSY_BASELINE[:3], BUSY_CANDIDATE[:3], rule)
    assert keep_pairing(BUSY_BASELINE[:6], BUSY_CANDIDATE[:6], rule)  # beyond max_runs
    assert not keep_pairing(BUSY_BASELINE, BUSY_CANDIDATE, rule)  # CONTEST_PAIRS reached
    assert paired_significant(BUSY_BASELINE, BUSY_CANDIDATE)
    assert not paired_significant(BUSY_BASELINE[:6], BUSY_CANDIDATE[:6])
    # a pair the other way, medians within 5 %, or a fixed count: no more runs
    assert not keep_pairing([100.0, 60.0, 50.0], [80.0, 50.0, 55.0], rule)
    assert not keep_pairing([100.0, 101.0, 102.0], [99.0, 100.0, 101.0], rule)
    assert not keep_pairing(BUSY_BASELINE[:3], BUSY_CANDIDATE[:3], StopRule(min_runs=4, max_runs=4))
    # only interleaved pairs count as pairs
    samples = [Sample(ms, 1) for ms in BUSY_BASELINE], [Sample(ms, 1) for ms in BUSY_CANDIDATE]
    assert figure_significant(Figure(*samples, "separated", paired=True))
    assert not figure_significant(Figure(*samples, "overlap"))


async def test_an_interleaved_figure_with_a_small_effect_on_a_busy_server_gets_its_verdict() -> None:
    base, cand = list(BUSY_BASELINE), list(BUSY_CANDIDATE)

    async def run_baseline() -> Sample:
        return Sample(base.pop(0), 100)

    async def run_candidate() -> Sample:
        return Sample(cand.pop(0), 100)

    figure = await _pairs(run_baseline, run_candidate, StopRule(min_runs=3, max_runs=5), lambda: False)
    assert len(figure.candidate) == CONTEST_PAIRS and figure.stopped == "separated"
    assert figure.paired and figure_significant(figure)


# -- extended statistics measured interleaved, in a real fork --------------------------------------
@pytest.mark.usefixtures("no_leaked_forks")
async def test_extended_statistics_are_measured_interleaved_with_the_baseline(fork_conn: Connection) -> None:
    sql = "SELECT status, shipping_country, count(*) FROM orders GROUP BY status, shipping_country"
    stats = proposal("statistics", "CREATE STATISTICS h2h_orders_status_country (ndistinct)"
                                   " ON status, shipping_country FROM orders", "ANALYZE orders")
    outcome = await benchmark(fork_conn, Suites((QueryVariant("baseline", sql, ordered=False, exact=True),),
                                                ("orders",)),
                              stats, policy=Measuring(runs=3, min_runs=3))
    (m,) = outcome.measurements
    assert m.equivalent and m.baseline.runs == m.optimized.runs
    assert m.note.startswith("interleaved; baseline with the new statistics hidden"), m.note
    # the statistics stay in place after the measurement (the rolled-back drops hid them only)
    assert await fork_conn.fetchval(
        "SELECT count(*) FROM pg_statistic_ext WHERE stxname = 'h2h_orders_status_country'") == 1


# -- a loop step and its step before, head to head in a real fork ----------------------------------
@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_loop_step_is_run_head_to_head_with_its_step_before_hidden_from_its_new_index(
        fork_conn: Connection) -> None:
    sql = "SELECT o.id FROM orders o WHERE o.status = 'pending' AND o.user_id = 42"
    before = dataclasses.replace(proposal("index", "CREATE INDEX h2h_status ON orders (status)"),
                                 rollback_commands=("DROP INDEX IF EXISTS h2h_status",))
    step = dataclasses.replace(
        proposal("composite_index", *before.sql_commands, "CREATE INDEX h2h_user ON orders (user_id)"),
        rollback_commands=("DROP INDEX IF EXISTS h2h_user", "DROP INDEX IF EXISTS h2h_status"))
    in_place = _InPlace(fork_conn)
    assert await in_place.put(before)
    job = AgentJob(task_id="h2h", task_type="query_optimization", query=sql, features=extract_features(sql),
                   source="afs_demo", source_stats={}, timeouts=Timeouts(),
                   measuring=Measuring(runs=3, min_runs=3))
    fork = _InFork(fork_conn, job, _Progress("gemini25pro", 0.0), trio.CapacityLimiter(1), Emitter("h2h"))
    found = await step_contest(fork, TaskMeasurements(), in_place, before, step)
    # the step before ran without the new index (hidden in each of its runs' transactions): the
    # user's few orders against every pending one
    assert found.faster == "second", found
    assert timing(found.second).median_ms < timing(found.first).median_ms
    assert in_place.proposal == step  # the step stays in place, both indexes built
    assert await fork_conn.fetchval(
        "SELECT count(*) FROM pg_indexes WHERE indexname IN ('h2h_status', 'h2h_user')") == 2
    # only a step that adds indexes to its step before is settled this way
    other = proposal("index", "CREATE INDEX h2h_amount ON orders (total_amount)")
    with pytest.raises(ProposalFailedError, match="only adds indexes"):
        await step_contest(fork, TaskMeasurements(), in_place, before, other)
