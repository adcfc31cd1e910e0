"""Adaptive measurement: when a measuring loop stops (pure), what it reuses, and the loop in a real fork."""

from __future__ import annotations

import random

import pytest

from afs.bench import (
    CONTEST_PAIRS,
    Budget,
    Drift,
    Earlier,
    Result,
    Reuse,
    Runners,
    Sample,
    StopRule,
    Suites,
    Warm,
    _agrees,
    _far_apart,
    _measure,
    _reuse_note,
    _significant,
    benchmark,
    large_effect,
    long_run_cap_ms,
    measure_before,
    result_of,
    results_of,
    stop_reason,
)
from afs.config import Measuring
from afs.db import Connection
from afs.models import EstimatedImpact, Measurement, OptimizationProposal, QueryVariant

RULE = StopRule(min_runs=3, max_runs=5)
ADAPTIVE = Measuring(runs=5, min_runs=3)  # the default policy, spelled out: measuring may stop early


# -- the decision (pure) -----------------------------------------------------------------------
def test_no_verdict_before_the_minimum() -> None:
    assert stop_reason([], [], RULE) is None
    assert stop_reason([1000.0, 1001.0], [1.0, 1.1], RULE) is None  # obvious, but only 2 pairs


def test_a_clear_difference_stops_at_the_minimum() -> None:
    assert stop_reason([1000.0, 1010.0, 990.0], [1.0, 1.2, 1.1], RULE) == "separated"
    # the candidate slower, just as clearly: a verdict too
    assert stop_reason([10.0, 10.5, 10.2], [30.0, 31.0, 29.0], RULE) == "separated"


def test_the_margin_is_a_ratio_so_one_noisy_run_on_a_small_baseline_does_not_hide_a_clear_verdict() -> None:
    # a ~10 ms baseline with one 10 ms burst; the candidate 200x faster. In milliseconds the
    # gap (9.95 ms) is below the burst's range (10 ms); as ratios it is 200x against 2x.
    noisy, fast = [10.0, 10.2, 20.0], [0.05, 0.048, 0.05]
    assert stop_reason(noisy, fast, RULE) == "separated"
    assert stop_reason(fast, noisy, RULE) == "separated"  # symmetric: the candidate slower
    # the same shapes at any scale give the same answer
    for scale in (0.01, 1.0, 1000.0):
        assert stop_reason([t * scale for t in noisy], [t * scale for t in fast], RULE) == "separated"


def test_a_ten_percent_difference_with_ten_percent_noise_is_not_separated() -> None:
    base, cand = [100.0, 105.0, 110.0], [90.0, 94.5, 99.0]  # 10 % faster, each sample 10 % wide
    assert stop_reason(base, cand, RULE) is None
    assert stop_reason(cand, base, RULE) is None
    small = [t / 100 for t in base], [t / 100 for t in cand]  # the same at 1 ms: still no margin
    assert stop_reason(*small, RULE) is None
    # one more pair each, still separated but no wider: the loop runs on to the maximum
    assert stop_reason([*base, 104.0, 106.0], [*cand, 95.0, 93.0], RULE) == "max_runs"


def test_times_of_zero_do_not_break_the_ratio() -> None:
    assert stop_reason([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], RULE) == "overlap"
    assert stop_reason([5.0, 5.1, 5.2], [0.0, 0.001, 0.0], RULE) == "separated"


def test_overlap_stops_the_loop_for_good() -> None:
    # once the samples overlap, complete separation cannot come back: within the noise
    assert stop_reason([100.0, 92.0, 108.0], [95.0, 110.0, 101.0], RULE) == "overlap"


def test_separated_without_a_margin_goes_on_until_the_maximum() -> None:
    base, cand = [100.0, 104.0, 108.0], [90.0, 94.0, 98.0]  # gap 2 < range 8
    assert stop_reason(base, cand, RULE) is None
    assert stop_reason([*base, 103.0], [*cand, 95.0], RULE) is None
    assert stop_reason([*base, 103.0, 105.0], [*cand, 95.0, 93.0], RULE) == "max_runs"
    assert _significant([*base, 103.0, 105.0], [*cand, 95.0, 93.0])  # the verdict is the old rule's


def test_a_separated_but_tiny_difference_is_not_a_verdict() -> None:
    # completely separated with a margin, but medians only 2 % apart: below MIN_EFFECT
    base, cand = [100.0, 100.1, 100.2], [98.0, 98.1, 98.2]
    assert stop_reason(base, cand, RULE) is None
    assert not _significant(base, cand)


def test_the_budget_stops_after_one_pair_but_not_before() -> None:
    assert stop_reason([4000.0], [3900.0], RULE, out_of_time=True) == "budget"
    assert stop_reason([], [], RULE, out_of_time=True) is None  # never without a run
    # a verdict reached within the budget says so, rather than "budget"
    assert stop_reason([1000.0] * 3, [1.0] * 3, RULE, out_of_time=True) == "separated"


def test_one_side_alone_runs_to_the_maximum() -> None:
    assert stop_reason([], [5.0, 5.1, 5.2, 5.0], RULE) is None
    assert stop_reason([], [5.0, 5.1, 5.2, 5.0, 5.3], RULE) == "max_runs"


def test_against_a_single_long_baseline() -> None:
    # the baseline past the statement timeout is one capped run; the rewrite is far faster
    assert stop_reason([60_000.0], [12.0, 11.0, 13.0], RULE) == "separated"


def test_a_fixed_count_when_the_minimum_is_the_maximum() -> None:
    fixed = StopRule(min_runs=5, max_runs=5)
    assert stop_reason([1000.0] * 4, [1.0] * 4, fixed) is None
    assert stop_reason([1000.0] * 5, [1.0] * 5, fixed) == "separated"
    assert stop_reason([1000.0], [1.0], StopRule(min_runs=3, max_runs=1)) == "separated"


def test_early_stops_agree_with_the_verdict_and_keep_its_false_alarm_rate() -> None:
    rng = random.Random(7)
    false_alarms = trials = 0
    for _ in range(20_000):
        same = rng.random() < 0.5  # half the pairs: no difference at all
        shift = 1.0 if same else rng.choice((0.3, 0.6, 0.9, 1.5))
        base: list[float] = []
        cand: list[float] = []
        reason = None
        while reason is None:
            base.append(rng.gauss(100, 9))
            cand.append(rng.gauss(100 * shift, 9 * shift))
            reason = stop_reason(base, cand, RULE)
        if reason == "separated":
            assert _significant(base, cand)
        if reason == "overlap":
            assert not _significant(base, cand)
        if same:
            trials += 1
            false_alarms += _significant(base, cand)
    # the fixed rule (5 against 5) calls 2/252 = 0.8 % of equal pairs different; early stops add little
    assert false_alarms / trials < 0.02


def test_early_stops_keep_their_false_alarm_rate_with_heavy_noise_on_a_small_baseline() -> None:
    # a ~2 ms query on a loaded machine: multiplicative noise (log-normal) and now and then
    # (1 run in 10) a burst of a few ms on either side. Equal pairs must rarely be called
    # different; a 20x faster candidate whose samples stay apart must be called at the
    # minimum (a margin in milliseconds ran 23 % of them on: a burst is wider than the gap)
    rng = random.Random(11)

    def run(ms: float) -> float:
        return ms * rng.lognormvariate(0.0, 0.15) + (rng.uniform(2.0, 10.0) if rng.random() < 0.1 else 0.0)

    false_alarms = trials = quick = obvious = 0
    for _ in range(20_000):
        same = rng.random() < 0.5
        base: list[float] = []
        cand: list[float] = []
        reason = None
        while reason is None:
            base.append(run(2.0))
            cand.append(run(2.0 if same else 0.1))
            reason = stop_reason(base, cand, RULE)
        if same:
            trials += 1
            false_alarms += reason == "separated" or _significant(base, cand)
        elif reason != "overlap":  # a burst on the candidate's side may still make them overlap
            obvious += 1
            quick += reason == "separated" and len(cand) == RULE.min_runs
    assert false_alarms / trials < 0.02
    assert quick / obvious > 0.99


def test_the_long_run_leaves_the_candidate_its_share_of_the_agents_time() -> None:
    policy = Measuring(statement_timeout_ms=60_000, slow_cap_s=400.0)  # the defaults' values
    assert long_run_cap_ms(policy, float("inf"), 2) == 400_000  # no deadline: the configured cap
    # 540 s left after the analysis; two queries with other values may take a timeout each
    assert long_run_cap_ms(policy, 540.0, 2) == 0.5 * (540 - 120) * 1000
    assert long_run_cap_ms(policy, 2000.0, 2) == 400_000  # plenty left: the cap
    assert long_run_cap_ms(policy, 30.0, 2) == 60_000  # never below the statement timeout


def test_the_budget_is_shared_by_the_loops_still_to_come() -> None:
    budget = Budget(60.0, loops=4)
    assert budget.allowance() == 15.0
    budget.charge(3.0)  # a fast loop: the rest goes to the others
    assert budget.allowance() == 19.0
    budget.charge(40.0)
    budget.charge(17.0)
    assert budget.allowance() == 0.0
    budget.charge(1.0)  # more loops than announced: never negative
    assert budget.allowance() == 0.0


def samples(*ms: float) -> tuple[Sample, ...]:
    return tuple(Sample(ms=m, buffers=0) for m in ms)


def test_a_reused_baseline_stands_alone_only_far_from_the_candidate() -> None:
    prior = samples(900.0, 1000.0, 1100.0)
    assert _far_apart(prior, 1.0) and _far_apart(prior, 300.0) and _far_apart(prior, 3300.0)
    assert not _far_apart(prior, 301.0) and not _far_apart(prior, 1000.0) and not _far_apart(prior, 3299.0)
    assert not _far_apart(samples(0.0, 1.0, 2.0), 100.0)  # nothing is a factor away from zero


def test_a_fresh_baseline_run_agrees_within_the_reused_spread() -> None:
    prior = samples(900.0, 1000.0, 1100.0)  # width 200 ms
    assert _agrees(prior, 700.0) and _agrees(prior, 1300.0) and _agrees(prior, 1000.0)
    assert not _agrees(prior, 699.0) and not _agrees(prior, 1301.0)
    tight = samples(1000.0, 1000.0, 1000.0)  # no spread: 5 % of the median
    assert _agrees(tight, 1050.0) and not _agrees(tight, 1051.0)


async def test_after_drift_the_runs_that_found_it_are_the_first_pair() -> None:
    # reused baseline runs at ~1000 ms; the machine has slowed down since: the fresh baseline
    # run (1500 ms) disagrees, a second one (1490 ms) too, and the figure is measured afresh,
    # interleaved, starting with the candidate run and the second fresh baseline run
    order: list[str] = []
    baseline_ms = iter([1500.0, 1490.0, 1510.0, 1505.0])
    candidate_ms = iter([1400.0, 1460.0, 1560.0, 1450.0, 1455.0])

    async def run_baseline() -> Sample:
        order.append("b")
        return Sample(next(baseline_ms), 0)

    async def run_candidate() -> Sample:
        order.append("c")
        return Sample(next(candidate_ms), 0)

    figure = await _measure(Runners(run_baseline, run_candidate), RULE, Budget(60.0, 1),
                            prior=samples(990.0, 1000.0, 1010.0), warm=Warm(True, True))
    assert [s.ms for s in figure.baseline] == [1490.0, 1510.0, 1505.0]
    assert [s.ms for s in figure.candidate] == [1400.0, 1460.0, 1560.0]
    assert figure.stopped == "overlap" and figure.reused == 0
    # pairs alternate: the first pair ran the candidate first, the next the baseline first
    assert order == ["c", "b", "b", "b", "c", "c", "b"]


class Runs:
    """Runs of a figure from given times, in the order they were asked for."""

    def __init__(self, baseline: list[float], candidate: list[float]) -> None:
        self.order: list[str] = []
        self._b, self._c = iter(baseline), iter(candidate)

    async def baseline(self) -> Sample:
        self.order.append("b")
        return Sample(next(self._b), 0)

    async def candidate(self) -> Sample:
        self.order.append("c")
        return Sample(next(self._c), 0)


async def test_one_fresh_baseline_run_vouches_for_the_candidates_other_figures() -> None:
    drift, prior = Drift(), samples(990.0, 1000.0, 1010.0)
    first = Runs([1005.0], [400.0, 410.0, 405.0])  # close (2.5x): one fresh run, which agrees
    one = await _measure(Runners(first.baseline, first.candidate), RULE, Budget(60.0, 2), prior=prior,
                         drift=drift, warm=Warm(True, True))
    assert drift.held is True and first.order == ["c", "b", "c", "c"]
    assert one.reused == 3 and len(one.baseline) == 4 and one.stopped == "separated"
    second = Runs([], [395.0, 400.0, 402.0])  # the next close figure: no baseline run at all
    two = await _measure(Runners(second.baseline, second.candidate), RULE, Budget(60.0, 1), prior=prior,
                         drift=drift, warm=Warm(True, True))
    assert second.order == ["c", "c", "c"] and two.reused == 3 and two.stopped == "separated"
    # without the shared check, the second figure would have made its own fresh run
    alone = Runs([1000.0], [395.0, 400.0, 402.0])
    await _measure(Runners(alone.baseline, alone.candidate), RULE, Budget(60.0, 1), prior=prior,
                   warm=Warm(True, True))
    assert alone.order.count("b") == 1


async def test_one_noisy_fresh_run_is_not_drift() -> None:
    drift, prior = Drift(), samples(990.0, 1000.0, 1010.0)
    # the first fresh run is off (1300 ms), the second agrees: noise, not drift
    first = Runs([1300.0, 1002.0], [400.0, 410.0, 405.0])
    one = await _measure(Runners(first.baseline, first.candidate), RULE, Budget(60.0, 2), prior=prior,
                         drift=drift, warm=Warm(True, True))
    assert drift.held is True and first.order == ["c", "b", "b", "c", "c"]
    assert one.reused == 3 and [s.ms for s in one.baseline[3:]] == [1300.0, 1002.0]
    assert one.stopped == "separated"
    assert "2 fresh runs, the last of which agreed" in _reuse_note(one)
    second = Runs([], [395.0, 400.0, 402.0])  # the candidate's next close figure stands on the reused runs
    two = await _measure(Runners(second.baseline, second.candidate), RULE, Budget(60.0, 1), prior=prior,
                         drift=drift, warm=Warm(True, True))
    assert second.order == ["c", "c", "c"] and two.reused == 3


# -- a large effect settles on fewer baseline runs (issue 25 item 5) ---------------------------
def test_a_large_effect_is_many_times_faster_than_every_baseline_run_and_reads_fewer_buffers() -> None:
    base = [Sample(2700.0, 250_000)]
    assert large_effect(base, [Sample(1.0, 40), Sample(1.2, 40)], RULE)
    assert large_effect(base, [Sample(900.0, 125_000)], RULE)  # 3x and half the buffers: just
    assert not large_effect(base, [Sample(901.0, 100)], RULE)  # less than 3x faster
    assert not large_effect(base, [Sample(1.0, 125_001)], RULE)  # the buffers do not agree
    assert not large_effect(base, [Sample(1.0, 40), Sample(1000.0, 40)], RULE)  # every run, not the median
    assert not large_effect([Sample(2700.0, 0)], [Sample(1.0, 0)], RULE)  # no buffers (a long run)
    assert not large_effect([], [Sample(1.0, 40)], RULE)
    off = StopRule(min_runs=3, max_runs=5, large_effect=0)
    assert not large_effect(base, [Sample(1.0, 40)], off)
    two = StopRule(min_runs=3, max_runs=5, large_runs=2)
    assert not large_effect(base, [Sample(1.0, 40)], two)
    assert large_effect([*base, Sample(2800.0, 250_000)], [Sample(1.0, 40)], two)


def test_a_large_effect_stops_once_the_candidate_has_its_minimum() -> None:
    assert stop_reason([2700.0], [1.0, 1.1], RULE, large=True) is None
    assert stop_reason([2700.0], [1.0, 1.1, 1.2], RULE, large=True) == "large"


def runs_with_buffers(baseline: list[tuple[float, int]], candidate: list[tuple[float, int]]) -> Runs:
    runs = Runs([], [])
    b, c = iter(baseline), iter(candidate)

    async def base() -> Sample:
        runs.order.append("b")
        return Sample(*next(b))

    async def cand() -> Sample:
        runs.order.append("c")
        return Sample(*next(c))

    runs.baseline, runs.candidate = base, cand  # type: ignore[method-assign]
    return runs


async def test_one_baseline_run_ahead_settles_a_large_effect() -> None:
    prior = (Sample(2700.0, 250_000),)  # Measuring.runs_ahead: one run before any candidate
    runs = runs_with_buffers([], [(1.0, 40), (1.1, 40), (0.9, 40)])
    figure = await _measure(Runners(runs.baseline, runs.candidate), RULE, Budget(60.0, 1), prior=prior,
                            warm=Warm(False, True))
    assert runs.order == ["c", "c", "c"]  # no baseline run: not even a warm-up
    assert figure.stopped == "large" and figure.reused == 1 and len(figure.baseline) == 1


async def test_a_small_effect_tops_the_baseline_up_to_the_minimum() -> None:
    # 2.5x faster: not a large effect. The one run ahead gets a warm-up and two fresh runs, and
    # the verdict rests on three baseline runs, as without the run ahead
    prior = (Sample(1000.0, 5000),)
    runs = runs_with_buffers([(1000.0, 5000), (990.0, 5000), (1010.0, 5000)],
                             [(400.0, 100), (410.0, 100), (405.0, 100)])
    figure = await _measure(Runners(runs.baseline, runs.candidate), RULE, Budget(60.0, 1), prior=prior,
                            warm=Warm(False, True))
    assert runs.order == ["c", "b", "b", "b", "c", "c"]
    assert len(figure.baseline) == 3 and figure.reused == 1 and figure.stopped == "separated"
    # a large effect whose buffers do not agree (the same pages, read faster) is measured as a small one
    same_pages = runs_with_buffers([(1000.0, 5000), (990.0, 5000), (1010.0, 5000)],
                                   [(10.0, 5000), (11.0, 5000), (10.5, 5000)])
    figure = await _measure(Runners(same_pages.baseline, same_pages.candidate), RULE, Budget(60.0, 1),
                            prior=prior, warm=Warm(True, True))
    assert len(figure.baseline) == 3 and figure.stopped == "separated"


async def test_a_large_effect_that_does_not_last_is_topped_up() -> None:
    prior = (Sample(1000.0, 5000),)
    # the first candidate run is 100x faster, the second only 2x: the baseline is topped up
    runs = runs_with_buffers([(1000.0, 5000), (1005.0, 5000)],
                             [(10.0, 100), (500.0, 100), (11.0, 100), (12.0, 100), (10.0, 100)])
    figure = await _measure(Runners(runs.baseline, runs.candidate), RULE, Budget(60.0, 1), prior=prior,
                            warm=Warm(True, True))
    assert runs.order[:4] == ["c", "c", "b", "b"]
    assert len(figure.baseline) == 3 and figure.stopped != "large"


async def test_after_drift_every_later_figure_of_the_candidate_is_measured_afresh() -> None:
    drift, prior = Drift(), samples(990.0, 1000.0, 1010.0)
    # both fresh runs disagree: the machine has drifted
    first = Runs([1500.0, 1490.0, 1510.0, 1505.0], [400.0, 410.0, 405.0])
    measured = await _measure(Runners(first.baseline, first.candidate), RULE, Budget(60.0, 2), prior=prior,
                              drift=drift, warm=Warm(True, True))
    assert drift.held is False and measured.reused == 0
    assert [s.ms for s in measured.baseline] == [1490.0, 1510.0, 1505.0]
    second = Runs([1500.0, 1495.0, 1505.0], [1.0, 1.1, 1.2])  # far apart, yet the reused runs are stale
    two = await _measure(Runners(second.baseline, second.candidate), RULE, Budget(60.0, 1), prior=prior,
                         drift=drift, warm=Warm(True, True))
    assert two.reused == 0 and [s.ms for s in two.baseline] == [1500.0, 1495.0, 1505.0]
    assert second.order == ["b", "c", "c", "b", "b", "c"]


# -- the loop in a real fork -------------------------------------------------------------------
QUERY = "SELECT id, total_amount FROM orders WHERE user_id = 42"
SLOW_SCAN = "SELECT count(*) FROM orders o1 WHERE o1.total_amount > (SELECT avg(total_amount) FROM orders)"


def index_proposal(*sql: str) -> OptimizationProposal:
    return OptimizationProposal(agent="gemini25flash", proposal_type="index", sql_commands=sql,
                                rollback_commands=(), rationale="test",
                                estimated_impact=EstimatedImpact(50, 1, "low", "low"))


def suite(sql: str) -> tuple[QueryVariant, ...]:
    return (QueryVariant("baseline", sql, ordered=False, exact=True),)


async def measure_index(conn: Connection, sql: str, index_sql: str, name: str,
                        policy: Measuring) -> Measurement:
    """One benchmark of one index proposal, the index dropped afterwards (the next attempt starts clean)."""
    try:
        outcome = await benchmark(conn, Suites(suite(sql), ("orders",)),
                                  index_proposal(index_sql.format(name=name)), policy=policy)
    finally:
        await conn.execute(f"DROP INDEX IF EXISTS {name}")
    (m,) = outcome.measurements
    return m


# The two tests below are about when measuring stops. Timings on a loaded machine have
# bursts a run or two long, so each gets three attempts and asserts what every attempt
# must show (the verdict) and what at least one must show (the stop): a broken stopping
# rule fails all three; a burst that hides the margin in one attempt does not.

@pytest.mark.usefixtures("no_leaked_forks")
async def test_an_obvious_index_is_measured_the_minimum_number_of_times(fork_conn: Connection) -> None:
    attempts = []
    for n in range(3):
        m = await measure_index(fork_conn, QUERY, "CREATE INDEX {name} ON orders (user_id)",
                                f"bench_orders_user_{n}", policy=ADAPTIVE)
        assert m.equivalent and m.significant and m.optimized.median_ms < m.baseline.median_ms
        assert m.baseline.runs == m.optimized.runs
        attempts.append((m.stopped, m.baseline.runs))
        if m.stopped in ("separated", "large"):  # interleaved: a large effect stops at the minimum too
            break
    assert ("separated", 3) in attempts or ("large", 3) in attempts, attempts


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_useless_index_stops_within_the_noise_or_at_the_maximum(fork_conn: Connection) -> None:
    attempts = []
    for n in range(3):
        m = await measure_index(fork_conn, SLOW_SCAN, "CREATE INDEX {name} ON orders (shipping_country)",
                                f"bench_country_{n}", policy=Measuring(runs=6, min_runs=3))
        # at most the maximum, or CONTEST_PAIRS while every pair went one way (keep_pairing)
        assert 3 <= m.optimized.runs <= max(6, CONTEST_PAIRS) and m.baseline.runs == m.optimized.runs
        attempts.append(m.stopped)
        if m.stopped in ("overlap", "max_runs"):
            break
    assert attempts[-1] in ("overlap", "max_runs"), attempts


@pytest.mark.usefixtures("no_leaked_forks")
async def test_the_budget_and_the_fixed_count(fork_conn: Connection) -> None:
    tiny = await benchmark(fork_conn, Suites(suite(SLOW_SCAN), ("orders",)),
                           index_proposal("CREATE INDEX bench_o1 ON orders (status)"),
                           policy=Measuring(runs=5, min_runs=3, budget_s=0.001))
    (m,) = tiny.measurements
    assert m.stopped == "budget" and m.baseline.runs == m.optimized.runs == 1
    fixed = await benchmark(fork_conn, Suites(suite(QUERY), ("orders",)),
                            index_proposal("CREATE INDEX bench_o2 ON orders (user_id)"),
                            policy=Measuring(runs=4, min_runs=4))
    (m,) = fixed.measurements
    assert m.baseline.runs == m.optimized.runs == 4 and m.significant


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_later_candidate_reuses_the_baseline_runs_of_the_task(fork_conn: Connection) -> None:
    reuse = Reuse()
    first = await benchmark(fork_conn, Suites(suite(SLOW_SCAN), ("orders",)),
                            index_proposal("CREATE INDEX bench_r1 ON orders (status)"),
                            policy=ADAPTIVE, earlier=Earlier(reuse=reuse.for_fork()))
    (m,) = first.measurements
    assert m.baseline.reused == 0 and SLOW_SCAN in reuse.baselines
    # the figure's fresh runs are kept, its last `runs` of them where a close verdict ran on
    # (d088756: to 7 pairs when the samples overlap but every pair went one way)
    assert len(reuse.baselines[SLOW_SCAN]) == min(m.baseline.runs, ADAPTIVE.runs)
    kept = [s.ms for s in reuse.baselines[SLOW_SCAN]]
    # an index that makes the scan 3x faster or more: reused runs, no fresh baseline run
    faster = "CREATE INDEX bench_r2 ON orders (total_amount)"
    second = await benchmark(fork_conn, Suites(suite(SLOW_SCAN), ("orders",)), index_proposal(faster),
                             policy=ADAPTIVE, earlier=Earlier(reuse=reuse.for_fork()))
    (m,) = second.measurements
    if m.baseline.reused:
        assert m.baseline.runs >= m.baseline.reused and "reused from an earlier measurement" in m.note
        assert m.optimized.runs >= 3
        # the fastest and the slowest baseline run count the reused runs too (the monitor's whiskers)
        assert m.baseline.min_ms is not None and m.baseline.max_ms is not None
        assert m.baseline.min_ms <= round(min(kept), 3) and m.baseline.max_ms >= round(max(kept), 3)
        assert m.baseline.min_ms <= m.baseline.median_ms <= m.baseline.max_ms
    else:  # the index was not 3x faster on this machine: a close verdict is measured afresh
        assert "reused" not in m.note


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_close_candidate_gets_a_fresh_baseline_run(fork_conn: Connection) -> None:
    reuse = Reuse()
    useless = "CREATE INDEX bench_c1 ON orders (shipping_country)"
    await benchmark(fork_conn, Suites(suite(SLOW_SCAN), ("orders",)), index_proposal(useless),
                    policy=ADAPTIVE, earlier=Earlier(reuse=reuse))
    kept = reuse.baselines[SLOW_SCAN]
    second = await benchmark(fork_conn, Suites(suite(SLOW_SCAN), ("orders",)),
                             index_proposal("CREATE INDEX bench_c2 ON orders (shipping_country)"),
                             policy=ADAPTIVE, earlier=Earlier(reuse=reuse))
    (m,) = second.measurements
    if m.baseline.reused:  # a fresh run (the first, or a second) agreed and they joined the reused ones
        fresh = m.baseline.runs - m.baseline.reused
        assert m.baseline.reused == len(kept) and fresh in (1, 2)
        assert ("1 fresh run that agreed" if fresh == 1 else "2 fresh runs, the last of which") in m.note
    else:  # it did not: drift, measured afresh and interleaved
        assert m.baseline.runs == m.optimized.runs >= 3
    assert reuse.baselines[SLOW_SCAN] != kept  # the fresh runs are kept for the next candidate


@pytest.mark.usefixtures("no_leaked_forks")
async def test_results_before_the_change_are_taken_from_the_task(fork_conn: Connection) -> None:
    reuse = Reuse()
    proposal = index_proposal("CREATE INDEX bench_k1 ON orders (user_id)")
    await benchmark(fork_conn, Suites(suite(QUERY), ("orders",)), proposal, policy=ADAPTIVE,
                    earlier=Earlier(reuse=reuse))
    (key,) = [k for k in reuse.results if k.endswith(QUERY)]
    assert QUERY in reuse.warm
    # what the task knows is what counts: a different record shows up as different rows
    reuse.results[key] = Result(rows=reuse.results[key].rows + 1, checksum="x")
    second = await benchmark(fork_conn, Suites(suite(QUERY), ("orders",)),
                             index_proposal("CREATE INDEX bench_k2 ON orders (user_id)"),
                             policy=ADAPTIVE, earlier=Earlier(reuse=reuse))
    assert not second.measurements[0].equivalent
    # a fixed run count measures everything afresh, as before adaptive measurement
    fixed = await benchmark(fork_conn, Suites(suite(QUERY), ("orders",)),
                            index_proposal("CREATE INDEX bench_k3 ON orders (user_id)"),
                            policy=Measuring(runs=3, min_runs=3), earlier=Earlier(reuse=reuse))
    (m,) = fixed.measurements
    assert m.equivalent and m.baseline.reused == 0 and m.baseline.runs == 3


@pytest.mark.usefixtures("no_leaked_forks")
async def test_both_checksums_from_one_run_equal_each_form_alone(fork_conn: Connection) -> None:
    for sql in ("SELECT id, total_amount, status FROM orders WHERE user_id = 42 ORDER BY id",
                "SELECT user_id FROM orders WHERE user_id < 30 ORDER BY user_id DESC, id",
                "SELECT id FROM orders WHERE false ORDER BY id"):
        variant = QueryVariant("baseline", sql, ordered=True, exact=True)
        in_turn, as_set = await results_of(fork_conn, variant)
        assert in_turn == await result_of(fork_conn, variant, True)
        assert as_set == await result_of(fork_conn, variant, False)
        assert in_turn.checksum != as_set.checksum or in_turn.rows == 0


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_rewrite_after_an_index_takes_the_multiset_result_of_the_task(fork_conn: Connection) -> None:
    reuse = Reuse()
    ordered_query = "SELECT id, total_amount FROM orders WHERE user_id = 42 ORDER BY id"
    variant = QueryVariant("baseline", ordered_query, ordered=True, exact=True)
    await benchmark(fork_conn, Suites((variant,), ("orders",)),
                    index_proposal("CREATE INDEX bench_m1 ON orders (user_id)"),
                    policy=ADAPTIVE, earlier=Earlier(reuse=reuse.for_fork()))
    keys = [k for k in reuse.results if k.endswith(ordered_query)]
    assert len(keys) == 2  # in order and as a multiset, from the one run before the change
    # what the task holds is what a rewrite's rows are compared with (as a multiset)
    (as_set,) = [k for k in keys if k.startswith("False:")]
    reuse.results[as_set] = Result(rows=reuse.results[as_set].rows, checksum="x")
    rewrite = OptimizationProposal(
        agent="gemini25flash", proposal_type="query_rewrite", sql_commands=(), rollback_commands=(),
        rationale="test", estimated_impact=EstimatedImpact(50, 1, "low", "low"),
        rewritten_query="SELECT id, total_amount FROM orders WHERE user_id = 42 ORDER BY id + 0")
    candidate = QueryVariant("baseline", rewrite.rewritten_query or "", ordered=True, exact=True)
    outcome = await benchmark(fork_conn, Suites((variant,), ("orders",), candidate_suite=(candidate,)),
                              rewrite, policy=ADAPTIVE, earlier=Earlier(reuse=reuse.for_fork()))
    assert not outcome.measurements[0].equivalent


@pytest.mark.usefixtures("no_leaked_forks")
async def test_the_queries_before_any_change_are_measured_ahead_for_the_task(fork_conn: Connection) -> None:
    query = QueryVariant("baseline", "SELECT id FROM orders WHERE user_id = 42 ORDER BY id", True, True)
    other = "SELECT id FROM orders WHERE user_id = 43 ORDER BY id"
    # how many runs the candidate gets is the stopping rule's: three attempts, as above (a burst
    # in one of its ~0.03 ms runs hides the 100x margin and costs a fresh baseline run)
    attempts = []
    for _attempt in range(3):
        reuse = Reuse()
        assert await measure_before(fork_conn, (query,), (other,), reuse, runs=3) == 2
        assert len(reuse.baselines[query.sql]) == len(reuse.baselines[other]) == 3
        assert set(reuse.results) == {f"{o}:{sql}" for o in (True, False) for sql in (query.sql, other)}
        assert {query.sql, other} <= reuse.warm
        assert await measure_before(fork_conn, (query,), (other,), reuse, runs=3) == 0  # measured already
        kept = reuse.baselines[query.sql]
        # the first candidate stands on those runs (an index 100x faster needs no fresh one) ...
        index = index_proposal("CREATE INDEX bench_b1 ON orders (user_id)")
        outcome = await benchmark(fork_conn, Suites((query,), ("orders",)), index, policy=ADAPTIVE,
                                  earlier=Earlier(reuse=reuse))
        (m,) = outcome.measurements
        assert m.equivalent
        attempts.append((m.significant, m.baseline.reused, m.baseline.runs, m.optimized.runs))
        if attempts[-1] == (True, 3, 3, 3):
            break
        await fork_conn.execute("DROP INDEX bench_b1")  # the next attempt measures before it again
    assert attempts[-1] == (True, 3, 3, 3), attempts
    assert m.baseline.min_ms == round(min(s.ms for s in kept), 3)
    # ... and on the rows found ahead: a different record shows as different rows
    key = f"True:{query.sql}"
    reuse.results[key] = Result(rows=reuse.results[key].rows + 1, checksum="x")
    index = index_proposal("CREATE INDEX bench_b2 ON orders (user_id)")
    again = await benchmark(fork_conn, Suites((query,), ("orders",)), index, policy=ADAPTIVE,
                            earlier=Earlier(reuse=reuse))
    assert not again.measurements[0].equivalent


@pytest.mark.usefixtures("no_leaked_forks")
async def test_measuring_ahead_stops_at_a_query_past_the_statement_timeout(fork_conn: Connection) -> None:
    reuse = Reuse()
    fast = QueryVariant("baseline", "SELECT id FROM orders WHERE user_id = 42", False, True)
    slow = QueryVariant("limit", "SELECT pg_sleep(0.5), id FROM orders WHERE user_id = 42", False, True)
    later = QueryVariant("filter", "SELECT id FROM orders WHERE user_id = 44", False, True)
    # pg_sleep(0.5) exceeds it on any machine; the lookups before it (a few ms, their checksums
    # and runs) must not, on a loaded one too: 400 ms, not 100
    await fork_conn.execute("SET statement_timeout = 400")
    try:
        assert await measure_before(fork_conn, (fast, slow, later), (), reuse, runs=3) == 1
    finally:
        await fork_conn.execute("RESET statement_timeout")
    assert set(reuse.baselines) == {fast.sql}  # nothing of the slow one, nothing after it


@pytest.mark.usefixtures("no_leaked_forks")
async def test_one_run_ahead_settles_an_obvious_index(fork_conn: Connection) -> None:
    # the default policy measures one run ahead; an index ~100x faster that reads a few pages
    # instead of the table stands on it, with the candidate's three runs
    assert ADAPTIVE.runs_ahead == 1 and Measuring(runs=5, min_runs=5).runs_ahead == 5
    query = QueryVariant("baseline", "SELECT id FROM orders WHERE user_id = 42 ORDER BY id", True, True)
    # three attempts, as above: a burst in one candidate run hides the margin of that attempt
    attempts = []
    for _attempt in range(3):
        reuse = Reuse()
        assert await measure_before(fork_conn, (query,), (), reuse, runs=ADAPTIVE.runs_ahead) == 1
        index = index_proposal("CREATE INDEX bench_ahead ON orders (user_id)")
        outcome = await benchmark(fork_conn, Suites((query,), ("orders",)), index, policy=ADAPTIVE,
                                  earlier=Earlier(reuse=reuse))
        (m,) = outcome.measurements
        assert m.equivalent
        attempts.append((m.significant, m.stopped, m.baseline.runs, m.baseline.reused, m.optimized.runs))
        if attempts[-1] == (True, "large", 1, 1, 3):
            break
        await fork_conn.execute("DROP INDEX bench_ahead")  # the next attempt measures before it again
    assert attempts[-1] == (True, "large", 1, 1, 3), attempts
    assert m.optimized.buffers * 2 <= m.baseline.buffers
