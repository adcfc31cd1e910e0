"""The benchmark step: the suite before and after a proposal, in the same fork.

For every suite query: the result's row count and checksum, one warm-up run,
then measured runs of server-side execution time and shared buffers
(hit + read), from `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON)`.

Where it can, baseline and candidate alternate run by run so drift hits both
alike: a proposal made only of named CREATE INDEX statements is hidden for a
baseline run inside a rolled-back transaction (`BEGIN; DROP INDEX …; <query>;
ROLLBACK`), and so is one made of CREATE STATISTICS and ANALYZE
(`hideable_statistics`: `DROP STATISTICS …`; the planner then plans without them,
on the column statistics the ANALYZE left, which both sides share); a rewrite
alternates with the original query. Otherwise (e.g. partitioning) the baseline runs
before the change and the candidate after: minutes of drift on a busy server lie
between the two, enough to hide a 20 % effect or fake one.

Significance: with N runs per side, a difference is called real only when the
two samples do not overlap at all (every candidate run faster than every
baseline run, or the reverse: an exact Mann–Whitney test with U = 0, one-sided
p = 1/C(2N, N), 0.004 for N = 5) and the medians differ by at least 5 %.
Everything else is reported as inconclusive.

How many runs (`stop_reason`, pure): runs go on only while the verdict is
uncertain. After `min_runs` (`Measuring.min_runs`) pairs a loop stops as soon as

- the samples overlap ("overlap"): within the noise, and for good, since
  complete separation never comes back once lost;
- they are completely separated with a margin ("separated"): the verdict is
  significant and the gap between the samples is at least as wide as the wider
  sample's range, both measured as ratios (on the logarithms of the times): the
  slower sample's fastest run over the faster sample's slowest run at least the
  wider sample's slowest over fastest run. Ratios make the margin scale-free:
  a 10 ms burst in a ~10 ms baseline doubles its range in ratio terms (2x) and
  still lets a 200x faster candidate be called at the minimum, where a margin in
  milliseconds (gap 10 ms < range 10 ms) ran it to `max_runs`; a candidate 10 %
  faster with 10 % noise is not separated either way. For two samples of 3 from
  one distribution whose logarithm is normal (timing noise is multiplicative)
  the margin happens with probability 0.008, the same false-alarm rate as
  complete separation of 5 against 5;

- every candidate run is at least `large_effect` (`Measuring.large_effect`, 3) times faster
  than every baseline run and reads at most half the shared buffers (hit + read) of any
  baseline run ("large"): the plan does less work, and the times say so by a factor no drift
  explains (2.2x at most between two measurements of one task, see below: REUSE_FACTOR, the
  factor at which a candidate already needed no fresh baseline run). Such a verdict
  needs only `large_effect_runs` (1) baseline runs; the candidate, the fast side, still runs
  `min_runs` times (its runs are cheap, and they tell two fast candidates apart: afs.consensus).
  The queries before any change are measured `runs_ahead` (1) times ahead (`measure_before`);
  a candidate that is not a large effect tops its baseline up to `min_runs` runs, fresh
  (`_measure`): where the effect is small, the verdict rests on as many runs as before;

and in any case after `max_runs` pairs ("max_runs", the configured run count)
or when its share of the candidate's time budget is spent ("budget", after at
least one pair). The budget is the query time one candidate's measurement may
take (warm-ups and runs of every suite query and parameter set), shared fairly
by the loops still to come, so the unused part of a fast loop goes to the next.

What is not measured at all (`measured_suite`): a suite variant that repeats the query as
given, the "limit" variant that keeps the query's own constant LIMIT or lowers it to no less
than half (`afs.suite.implied_limit`): its rows are the query's first, read by the same plan;
measuring it again cost every design a figure (two runs of a slow original before any change,
and a rewrite's runs and result check). The skipped list says so.

What measuring reuses (`Reuse`, adaptive measurement only: with `min_runs` equal to
`runs` every figure is measured afresh, warm-ups and checksums included, as before):

- the result (rows, checksum) of a query as it runs before any change, once per task (for a
  query whose order counts, its ordered and its multiset checksum from the same run: a rewrite
  compares its rows as a multiset, an index in order);
- a figure's baseline samples, once per task, when its baseline runs as before any change
  (the suite before the change, an index hidden in a rolled-back transaction, the original
  query against a rewrite or settings that create nothing). Later candidates are measured
  against those samples (`_measure`): a candidate whose every run is `REUSE_FACTOR` times
  faster (or slower) than every reused run gets its verdict without a fresh baseline run
  (drift between two measurements of one task is far smaller than that: 2.2x at most on a
  loaded two-core machine). A close candidate gets a fresh baseline run, once per
  candidate (`Drift`: the check is whether the machine has drifted since the reused runs,
  which tells for all the figures measured in the next seconds): if it agrees with the
  reused samples (within their range widened by their width, at least 5 %) it joins them,
  and the candidate's other close figures stand on their reused runs. If it does not, a
  second fresh run tells drift from one noisy run (a shared two-core machine has single runs
  15-30 % off, while three reused runs may happen to lie close together): if the second
  agrees, both join the reused runs as above; if it does not either, the machine has drifted
  and the figure, and every later one of the candidate, is measured afresh, interleaved
  (that second fresh run and the candidate run before it are the first pair);
- warm-ups: none for a query that already ran in this fork (its checksum, an earlier run).

`measure_before` fills the same records before any candidate exists (the agents call it
while the model writes the proposals), so the first candidate is measured like a later one.

The policy (runs, when a loop may stop, the budget, the long baseline run, the statement
timeout) is `afs.config.Measuring`, passed whole; the rules over it are pure (`StopRule`,
`stop_reason`, `significant`, `Budget`). What a task's measurements share across its
candidates and agents is one `TaskMeasurements` per task: identical proposals measured once,
screening and the analysis before any change run once, and the `Reuse` records above.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import trio

from afs.config import LARGE_EFFECT, LARGE_EFFECT_RUNS, Measuring
from afs.consensus import ddl_signature
from afs.db import Connection
from afs.errors import DatabaseError, ProposalFailedError, StatementTimeout
from afs.forks.limits import check_growth
from afs.models import (
    AgentKey,
    AnalysisContext,
    BenchmarkOutcome,
    FamilyQuery,
    Measurement,
    OptimizationProposal,
    ParameterCheck,
    QueryVariant,
    Timing,
)
from afs.pg.names import quote_qualified
from afs.pg.plan import explained, plan_of, shared_buffers
from afs.safety import Change, NewIndex, NewStatistics, creates
from afs.suite import implied_limit, result_checksum_sql, result_checksums_sql

MB = 1048576.0
MIN_EFFECT = 0.05  # medians must differ by at least 5 % to count

REUSE_FACTOR = 3.0  # a candidate this many times apart from reused baseline runs needs no fresh one

StopReason = Literal["separated", "large", "overlap", "max_runs", "budget"]
BUFFERS_AGREE = 2.0  # a large effect's candidate reads at most 1/2 the shared buffers of the baseline

_USER_RELATIONS_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_%%'
"""
_TABLES_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0) FROM unnest(%s::text[]) AS t
"""


@dataclass(frozen=True)
class Sample:
    ms: float
    buffers: int


@dataclass(frozen=True)
class Result:
    rows: int
    checksum: str


async def run_once(conn: Connection, sql: str) -> Sample:
    raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {sql}")
    plan, ms = explained(raw)
    return Sample(ms=ms, buffers=shared_buffers(plan))


async def result_of(conn: Connection, variant: QueryVariant, ordered: bool) -> Result:
    row = await conn.fetchone(result_checksum_sql(variant.sql, ordered))
    assert row is not None
    return Result(rows=int(row[0]), checksum=str(row[1]))


async def results_of(conn: Connection, variant: QueryVariant) -> tuple[Result, Result]:
    """The variant's result compared in order and as a multiset, from one run of it."""
    row = await conn.fetchone(result_checksums_sql(variant.sql))
    assert row is not None
    return Result(rows=int(row[0]), checksum=str(row[1])), Result(rows=int(row[0]), checksum=str(row[2]))


def timing(samples: Sequence[Sample]) -> Timing:
    times = sorted(s.ms for s in samples)
    median = statistics.median(times)
    middle = min(samples, key=lambda s: abs(s.ms - median))
    return Timing(median_ms=round(median, 3), spread_ms=round((times[-1] - times[0]) / 2, 3),
                  runs=len(times), buffers=middle.buffers, min_ms=round(times[0], 3),
                  max_ms=round(times[-1], 3))


def significant(baseline: Sequence[Sample], optimized: Sequence[Sample]) -> bool:
    """Complete separation of the two samples and at least MIN_EFFECT between medians."""
    return _significant([s.ms for s in baseline], [s.ms for s in optimized])


def _significant(b: Sequence[float], o: Sequence[float]) -> bool:
    separated = max(o) < min(b) or max(b) < min(o)
    mb, mo = statistics.median(b), statistics.median(o)
    return separated and abs(mb - mo) >= MIN_EFFECT * max(mb, mo)


@dataclass(frozen=True)
class StopRule:
    """How many pairs a measuring loop runs: at least `min_runs`, at most `max_runs`; a large
    effect (`large_effect` times faster, 0: never) on `large_runs` baseline runs. `cut_short`:
    a spent budget also ends a loop against reused runs before its fresh baseline runs (a
    drift check, a top-up to `min_runs`): the query with other values, whose figure only gates
    a design (`settled`); the suite's figures get their baseline runs whatever the budget."""

    min_runs: int
    max_runs: int
    large_effect: float = LARGE_EFFECT
    large_runs: int = LARGE_EFFECT_RUNS
    cut_short: bool = False

    @classmethod
    def of(cls, policy: Measuring, max_runs: int | None = None) -> StopRule:
        """The policy's rule, or its rule for loops of at most `max_runs` pairs."""
        most = policy.runs if max_runs is None else max_runs
        return cls(min_runs=min(policy.min_runs, most), max_runs=most, large_effect=policy.large_effect,
                   large_runs=policy.large_effect_runs)


def large_effect(baseline: Sequence[Sample], candidate: Sequence[Sample], rule: StopRule) -> bool:
    """Every candidate run `rule.large_effect` times faster than every one of at least
    `rule.large_runs` baseline runs, and reading at most 1/BUFFERS_AGREE of their shared
    buffers (pure; a baseline without buffers, the long run of a slow query, never is)."""
    if rule.large_effect <= 0 or not candidate or len(baseline) < max(1, rule.large_runs):
        return False
    fastest_base = min(s.ms for s in baseline)
    fewest_base = min(s.buffers for s in baseline)
    return (fewest_base > 0 and max(s.ms for s in candidate) * rule.large_effect <= fastest_base
            and max(s.buffers for s in candidate) * BUFFERS_AGREE <= fewest_base)


def stop_reason(baseline: Sequence[float], candidate: Sequence[float], rule: StopRule,
                out_of_time: bool = False, large: bool = False) -> StopReason | None:
    """Why a measuring loop stops now, or None to run another pair (pure; times in ms).

    "overlap" and "separated" as in the module's notes: the margin compares the gap
    between the samples with the wider sample's range as ratios (log times), so it
    means the same for a 10 ms query as for a 10 s one, whichever side is faster.
    `candidate` counts the runs made; `baseline` is the other side's sample (the same
    length when interleaved; fixed when the baseline ran before; empty when the loop
    measures one side alone, which then stops only at `max_runs` or out of time). `large`:
    the samples are a large effect (`large_effect`, which reads their buffers too): "large"
    once the candidate has its `min_runs`.
    """
    n = len(candidate)
    if n == 0:
        return None
    if large and n >= min(rule.min_runs, rule.max_runs):
        return "large"
    if baseline and n >= min(rule.min_runs, rule.max_runs):
        b_lo, b_hi, c_lo, c_hi = (_log(min(baseline)), _log(max(baseline)),
                                  _log(min(candidate)), _log(max(candidate)))
        gap = max(b_lo - c_hi, c_lo - b_hi)  # log of the ratio between the samples (symmetric)
        if gap <= 0:
            return "overlap"
        wider = max(b_hi - b_lo, c_hi - c_lo)  # log of the wider sample's slowest over fastest run
        if gap >= wider and _significant(baseline, candidate):
            return "separated"
    if n >= rule.max_runs:
        return "max_runs"
    if out_of_time:
        return "budget"
    return None


_MIN_MS = 0.001  # EXPLAIN reports times in µs: a time of 0 counts as 1 µs on the log scale


def _log(ms: float) -> float:
    return math.log(max(ms, _MIN_MS))


def long_run_cap_ms(policy: Measuring, left_s: float, probes: int) -> int:
    """The cap of the one baseline run of a query past the statement timeout (pure): the
    policy's `slow_cap_s`, but at most `slow_cap_share` of the time left before the deadline
    (`left_s`, inf without one) once the `probes` queries with other values still to run have
    had a statement timeout each, and never below the statement timeout. A query slower than
    the agent's time then gets a baseline that is a lower bound and the candidate is still
    measured against it, where a cap near the agent's limit timed the whole agent out."""
    cap_s = policy.slow_cap_s
    if math.isfinite(left_s):
        spare = left_s - probes * policy.statement_timeout_ms / 1000
        cap_s = min(cap_s, policy.slow_cap_share * spare)
    return int(max(cap_s * 1000, policy.statement_timeout_ms))


class Budget:
    """The query time one candidate's measurement may take, shared by its loops."""

    def __init__(self, seconds: float, loops: int) -> None:
        self.left = seconds
        self.loops = max(1, loops)

    def allowance(self) -> float:
        """The share of the next loop: what is left, over the loops still to come."""
        return self.left / self.loops

    def charge(self, seconds: float) -> None:
        self.left = max(0.0, self.left - seconds)
        self.loops = max(1, self.loops - 1)


@dataclass
class Reuse:
    """What a measurement may take from earlier measurements of the same task.

    `results` and `baselines` hold what the queries give and take before any change (every
    fork of a task starts with the same data); `warm` the queries that already ran in this
    fork. `for_fork()`: the same task's records with a fork's own `warm` set.
    """

    results: dict[str, Result] = field(default_factory=dict)  # by _result_key
    baselines: dict[str, tuple[Sample, ...]] = field(default_factory=dict)  # by SQL text
    warm: set[str] = field(default_factory=set)
    # the one run of a query past the statement timeout under the long cap (by _result_key), for
    # every proposal of the task, measuring adaptive or not: it is paid once per task
    slow_runs: dict[str, tuple[Result | None, Sample]] = field(default_factory=dict)
    # the queries with other values whose original runs past its cap (`family_cap_ms`) before
    # any change (sql -> whether its rows could still be read): each later proposal would wait
    # for the cap again for nothing (TaskMeasurements.slow_family is this record)
    slow_family: dict[str, bool] = field(default_factory=dict)

    def for_fork(self) -> Reuse:
        return Reuse(self.results, self.baselines, set(), self.slow_runs, self.slow_family)

    def result_before(self, sql: str, ordered: bool) -> Result | None:
        """The query's rows and checksum before any change, if they were read in this task."""
        return self.results.get(_result_key(sql, ordered))


def _result_key(sql: str, ordered: bool) -> str:
    return f"{ordered}:{sql}"


def _far_apart(prior: Sequence[Sample], ms: float) -> bool:
    """A run too far from the reused baseline runs for drift to explain (REUSE_FACTOR)."""
    if min(s.ms for s in prior) <= 0.0:
        return False
    return ms * REUSE_FACTOR <= min(s.ms for s in prior) or ms >= REUSE_FACTOR * max(s.ms for s in prior)


def _agrees(prior: Sequence[Sample], ms: float) -> bool:
    """A fresh baseline run within the reused runs' range, widened by its width (at least 5 %)."""
    times = [s.ms for s in prior]
    tolerance = max(max(times) - min(times), MIN_EFFECT * statistics.median(times))
    return min(times) - tolerance <= ms <= max(times) + tolerance


def measured_suite(suite: Sequence[QueryVariant]) -> tuple[tuple[QueryVariant, ...], tuple[str, ...]]:
    """The suite's variants worth measuring, and why the others are not (pure): a variant whose
    rows and plan the query as given already has (`afs.suite.implied_limit`: its own LIMIT,
    kept or lowered a little) would only repeat its figure, at the cost of a figure's runs for
    every design and its result check."""
    kept: list[QueryVariant] = []
    left: list[str] = []
    for variant in suite:
        reason = implied_limit(variant)
        if reason is None:
            kept.append(variant)
        else:
            left.append(reason)
    return tuple(kept), tuple(left)


async def measure_before(conn: Connection, suite: Sequence[QueryVariant], family: Sequence[str],
                         reuse: Reuse, runs: int, *, family_cap: int | None = None) -> int:
    """The task's queries as they run before any change, measured while the brains still
    think (adaptive measurement): each suite query's and each other-values query's (`family`)
    result, with both checksums where the order counts, and `runs` runs of it
    (`Measuring.runs_ahead`), into `reuse`.
    The candidates' benchmarks then find them there as their reused baseline runs (see the
    module's notes: a close candidate still gets its fresh baseline run). A query measured
    already in the task is skipped; the first suite query past the statement timeout ends it
    (the benchmark runs such a query once under its longer cap). A query with other values
    runs under `family_cap` ms (`family_cap_ms`; None: the statement timeout alone): one past
    it goes to `reuse.slow_family`, once per task, and the next value is measured. Returns how
    many were measured."""
    suite, _ = measured_suite(suite)
    ordered, exact = (suite[0].ordered, suite[0].exact) if suite else (False, True)
    queries = [*suite, *(QueryVariant("baseline", sql, ordered, exact) for sql in family)]
    members = set(family) - {v.sql for v in suite}
    measured = 0
    for variant in queries:
        if variant.sql in reuse.baselines or variant.sql in reuse.slow_family:
            continue
        member = variant.sql in members
        read = False
        try:
            async with capped(conn, family_cap if member else None):
                await _results_before(conn, variant, reuse)  # its run warms the query up
                read = True
                samples = [await run_once(conn, variant.sql) for _ in range(runs)]
        except StatementTimeout:
            if not member:
                return measured
            reuse.slow_family[variant.sql] = read
            continue
        reuse.baselines[variant.sql] = tuple(samples)
        measured += 1
    return measured


def family_cap_ms(policy: Measuring, figures: int) -> int | None:
    """The statement timeout of a run of the query with other values before any change (pure):
    the share of the measuring budget one of a candidate's `figures` has (`policy.budget_s`
    over them), below the statement timeout; None where that is no less. A value whose
    original alone takes longer cannot be measured within the budget: every proposal of the
    task would pay for its runs (one proposal spent minutes on two such values) to learn
    nothing it can keep, so it is left unchecked like one past the statement timeout."""
    share = int(policy.budget_s * 1000 / max(1, figures))
    if policy.statement_timeout_ms and share >= policy.statement_timeout_ms:
        return None
    return max(1, share)


@contextlib.asynccontextmanager
async def capped(conn: Connection, cap_ms: int | None) -> AsyncIterator[None]:
    """The statements inside under a statement timeout of `cap_ms` (None: as they are), in a
    transaction rolled back afterwards (they only read)."""
    if cap_ms is None:
        yield
        return
    await conn.execute("BEGIN")
    try:
        await conn.execute(f"SET LOCAL statement_timeout = {int(cap_ms)}")
        yield
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")


async def _results_before(conn: Connection, variant: QueryVariant, reuse: Reuse) -> None:
    """The variant's rows and checksum before any change, into `reuse`: as a multiset, and in
    order too when its order counts (a later candidate may compare these rows either way: a
    rewrite as a multiset, an index in order), both from one run, which warms the query up."""
    if variant.ordered:
        in_turn, as_set = await results_of(conn, variant)
        reuse.results[_result_key(variant.sql, True)] = in_turn
        reuse.results[_result_key(variant.sql, False)] = as_set
    else:
        reuse.results[_result_key(variant.sql, False)] = await result_of(conn, variant, False)
    reuse.warm.add(variant.sql)


def hideable_indexes(proposal: OptimizationProposal) -> tuple[str, ...] | None:
    """Names of the indexes the proposal creates, if it creates nothing else."""
    created = creates(proposal)
    names: list[str] = []
    for fact in created.commands if created.complete else (None,):
        if isinstance(fact, Change) and fact.kind == "analyze":
            continue
        if not isinstance(fact, NewIndex) or fact.name is None:
            return None
        names.append(fact.name)
    return tuple(names) or None


def hideable_statistics(proposal: OptimizationProposal) -> tuple[str, ...] | None:
    """Names of the extended statistics the proposal creates, if it creates nothing else (its
    other commands ANALYZE): a baseline run drops them in a rolled-back transaction (pure)."""
    created = creates(proposal)
    if not created.complete:
        return None
    names: list[str] = []
    for fact in created.commands:
        if isinstance(fact, NewStatistics):
            names.append(fact.name)
        elif not (isinstance(fact, Change) and fact.kind == "analyze"):
            return None
    return tuple(names) or None


@dataclass
class Drift:
    """What the fresh baseline runs of a close candidate found, once per candidate's measurement:
    None before any is made, True when one agreed with the reused runs (the first, or the second
    after a first one that did not: the machine has not drifted since they were made, and the
    candidate's other close figures stand on them alone), False when neither did (every later
    figure of the measurement is measured afresh, interleaved)."""

    held: bool | None = None


@dataclass(frozen=True)
class Figure:
    """How one figure was measured: both samples, why it stopped, baseline runs reused."""

    baseline: list[Sample]
    candidate: list[Sample]
    stopped: StopReason
    reused: int = 0
    paired: bool = False  # baseline[i] and candidate[i] ran one after the other (`_pairs`)


def settled(figure: Figure, rule: StopRule) -> bool:
    """Whether a figure's samples carry a verdict (pure): always, unless the budget stopped it
    before both sides had `rule.min_runs` runs (one run of a slow query may spend its share);
    then only when every candidate run is REUSE_FACTOR times apart from every baseline run
    (`_far_apart`: further than drift and one noisy run go), not on one run 5 % off."""
    least = min(rule.min_runs, rule.max_runs)
    if figure.stopped != "budget" or min(len(figure.baseline), len(figure.candidate)) >= least:
        return True
    return all(_far_apart(figure.baseline, s.ms) for s in figure.candidate)


@dataclass(frozen=True)
class Runners:
    """One run of each side of a figure (`_measure`): the query before the change, the query after it."""

    baseline: Callable[[], Awaitable[Sample]]
    candidate: Callable[[], Awaitable[Sample]]


@dataclass(frozen=True)
class Warm:
    """Which sides of a figure ran already in this fork (a side that did not gets a warm-up run)."""

    baseline: bool
    candidate: bool


async def _measure(
    runners: Runners,
    rule: StopRule,
    budget: Budget,
    *,
    prior: Sequence[Sample] = (),
    drift: Drift | None = None,
    warm: Warm,
) -> Figure:
    """One figure: against `prior` (baseline runs reused, see the module's notes) when given,
    else baseline and candidate alternately until `stop_reason` says stop. A side that is
    not warm gets a warm-up run first. `drift`: the candidate's one drift check (`Drift`),
    made against a prior of at least `min_runs` runs. A shorter prior (`runs_ahead`) stands
    alone only for a large effect (`large_effect`); otherwise it is topped up with fresh runs
    to `min_runs` before any other verdict."""
    run_baseline, run_candidate = runners.baseline, runners.candidate
    warm_baseline, warm_candidate = warm.baseline, warm.candidate
    started, allowance = trio.current_time(), budget.allowance()
    drift = drift if drift is not None else Drift()

    def out_of_time() -> bool:
        return trio.current_time() - started >= allowance

    try:
        if not warm_candidate:
            await run_candidate()
        if prior and drift.held is not False:
            candidate: list[Sample] = []
            fresh: list[Sample] = []
            warmed = warm_baseline
            least = min(rule.min_runs, rule.max_runs)
            while True:
                candidate.append(await run_candidate())
                if rule.cut_short and out_of_time():
                    # its share of the budget is spent (one run of a slow query can take it
                    # all): no fresh baseline run more, for a drift check or a top-up; the
                    # verdict rests on the runs made (`settled` says whether it is one)
                    baseline = [*prior, *fresh]
                    reason = stop_reason([s.ms for s in baseline], [s.ms for s in candidate], rule,
                                         True, large_effect(baseline, candidate, rule))
                    return Figure(baseline, candidate, reason or "budget", len(prior))
                if (drift.held is None and len(prior) >= least
                        and not _far_apart(prior, candidate[-1].ms)):
                    if not warmed:
                        await run_baseline()
                        warmed = True
                    fresh.append(await run_baseline())
                    if not _agrees(prior, fresh[-1].ms):  # drift, or one noisy run: a second tells
                        fresh.append(await run_baseline())
                    drift.held = _agrees(prior, fresh[-1].ms)
                    if not drift.held:
                        # drift: afresh, interleaved; the candidate run and the last fresh
                        # baseline run are its first pair (the runs before them warmed up)
                        return await _pairs(run_baseline, run_candidate, rule, out_of_time,
                                            first=(fresh[-1], candidate[-1]))
                baseline = [*prior, *fresh]
                large = large_effect(baseline, candidate, rule)
                if not large and len(baseline) < least:
                    # not a large effect (or no longer): as many baseline runs as ever, fresh
                    if not warmed:
                        await run_baseline()
                        warmed = True
                    while len(baseline) < least:
                        fresh.append(await run_baseline())
                        baseline.append(fresh[-1])
                reason = stop_reason([s.ms for s in baseline], [s.ms for s in candidate], rule,
                                     out_of_time(), large)
                if reason is not None:
                    return Figure(baseline, candidate, reason, len(prior))
        if not warm_baseline:
            await run_baseline()
        return await _pairs(run_baseline, run_candidate, rule, out_of_time)
    finally:
        budget.charge(trio.current_time() - started)


async def _pairs(run_baseline: Callable[[], Awaitable[Sample]],
                 run_candidate: Callable[[], Awaitable[Sample]], rule: StopRule,
                 out_of_time: Callable[[], bool],
                 first: tuple[Sample, Sample] | None = None) -> Figure:
    """Baseline and candidate alternately (the order flips every pair) until `stop_reason`;
    `first`: a pair (baseline, candidate) made already, the candidate's run first."""
    baseline: list[Sample] = [first[0]] if first else []
    candidate: list[Sample] = [first[1]] if first else []
    flip = 1 if first else 0  # the pair made already ran the candidate first
    if first:
        reason = stop_reason([first[0].ms], [first[1].ms], rule, out_of_time(),
                             large_effect([first[0]], [first[1]], rule))
        if reason is not None:
            return Figure(baseline, candidate, reason, paired=True)
    while True:
        first_run, second_run = ((run_baseline, run_candidate) if (len(baseline) + flip) % 2 == 0
                                 else (run_candidate, run_baseline))
        a, b = await first_run(), await second_run()
        baseline.append(a if first_run is run_baseline else b)
        candidate.append(b if first_run is run_baseline else a)
        b_ms, c_ms = [s.ms for s in baseline], [s.ms for s in candidate]
        reason = stop_reason(b_ms, c_ms, rule, out_of_time(), large_effect(baseline, candidate, rule))
        if reason == "overlap" and keep_pairing(b_ms, c_ms, rule) and not out_of_time():
            continue  # the samples overlap, but every pair went one way: a small effect, keep measuring
        if reason is not None:
            if reason == "overlap" and paired_significant(b_ms, c_ms):
                reason = "separated"
            return Figure(baseline, candidate, reason, paired=True)


async def _measure_alone(run: Callable[[], Awaitable[Sample]], rule: StopRule, budget: Budget,
                         against: Sequence[Sample] = (), warm: bool = False
                         ) -> tuple[list[Sample], StopReason]:
    """Warm-up (unless `warm`), then runs of one side; measured `against` a baseline made
    before, if given."""
    started, allowance = trio.current_time(), budget.allowance()
    try:
        if not warm:
            await run()  # warm-up
        samples: list[Sample] = []
        while True:
            samples.append(await run())
            reason = stop_reason([s.ms for s in against], [s.ms for s in samples], rule,
                                 trio.current_time() - started >= allowance,
                                 large_effect(against, samples, rule))
            if reason is not None:
                return samples, reason
    finally:
        budget.charge(trio.current_time() - started)


# -- what a task's measurements share ------------------------------------------------------
T = TypeVar("T")
ProposalKey = tuple[frozenset[str], str | None, tuple[tuple[str, str], ...]]


@dataclass
class _Once(Generic[T]):
    """Work one agent does for the whole task (see `_once`)."""

    owner: AgentKey | None
    done: trio.Event = field(default_factory=trio.Event)
    value: T | None = None
    error: ProposalFailedError | None = None  # a failure every agent would meet the same way


async def _once(entries: dict[Any, _Once[T]], key: Any, run: Callable[[], Awaitable[T]], *,
                owner: AgentKey | None = None, errors_shared: bool = False,
                waiting: Callable[[AgentKey], None] | None = None) -> tuple[T, AgentKey | None]:
    """`run` once per `key` for every agent of a task: the first agent runs it, the others wait
    (`waiting` is told who runs it) and take its value; if the one running it fails before it
    is done, the next one runs it itself, unless it ran out of its time (trio.TooSlowError from
    inside `run`): then every agent gets that failure (a ProposalFailedError) at once. With
    `errors_shared`, an ProposalFailedError is raised to every agent instead (applying the same
    design fails the same way in every fork). Returns the value and the agent it was taken from
    (None: this one ran it)."""
    while True:
        entry = entries.get(key)
        if entry is None or (entry.done.is_set() and entry.value is None and entry.error is None):
            entry = entries[key] = _Once(owner=owner)
            try:
                entry.value = await run()
                return entry.value, None
            except ProposalFailedError as exc:
                if errors_shared:
                    entry.error = exc
                raise
            except trio.TooSlowError:
                # it ran out of its time (a limit inside `run`): the others, no richer in time,
                # are told so instead of waiting for it again
                by = f" (by {owner})" if owner is not None else ""
                entry.error = ProposalFailedError(f"it did not finish within its time limit{by}")
                raise
            finally:
                entry.done.set()
        if waiting is not None and entry.owner is not None:
            waiting(entry.owner)
        await entry.done.wait()
        if entry.error is not None:
            raise ProposalFailedError(str(entry.error))
        if entry.value is not None:
            return entry.value, entry.owner


class TaskMeasurements:
    """What the measurements of one task share, across its candidates and its agents (one per
    task, made by afs.optimize; every fork of a task starts with the same data and statistics).

    Identical proposals (same normalized DDL and rewrite) are measured once per task: the first
    agent to propose it measures it in its own fork; the others wait and take that measurement.
    If the measuring agent fails, the next one measures it itself. The analysis of the query
    before any change (`analysis`) and screening (`screen`) are shared the same way. `reuse`
    holds the results, baseline runs and long baseline runs of the queries before any change
    (`Reuse`; each fork takes `reuse.for_fork()`), `slow_family` the queries with other values
    known to exceed the statement timeout.
    """

    def __init__(self) -> None:
        self._measurements: dict[ProposalKey, _Once[BenchmarkOutcome]] = {}
        self._screenings: dict[ProposalKey, _Once[float]] = {}
        self._analysis: dict[None, _Once[tuple[AnalysisContext, tuple[str, ...]]]] = {}
        self._contests: dict[frozenset[ProposalKey], _Once[Contest]] = {}  # `settle`
        # results, baseline runs and long runs of the queries before any change, for every fork
        self.reuse = Reuse()
        # the query with other values (a family member's original) known to exceed the
        # statement timeout (sql -> whether its rows could still be read): each later proposal
        # would wait for that timeout again for nothing
        self.slow_family: dict[str, bool] = self.reuse.slow_family  # measure_before adds to it
        self._before_claimed = False
        # every agent's candidate designs as it proposed them, by design: (its rank in that
        # agent's list, the design). A measuring slot that a shared measurement frees goes to
        # one of them nobody measures, or to a variant of them (afs.agents: the squad searches)
        self.offered: dict[ProposalKey, tuple[int, OptimizationProposal]] = {}

    def claim_before(self) -> bool:
        """True for the first agent to ask: it measures the queries before any change
        (`afs.bench.measure_before`) while its model thinks; the others go on."""
        claimed, self._before_claimed = self._before_claimed, True
        return not claimed

    async def screen(self, proposal: OptimizationProposal, run: Callable[[], Awaitable[float]]) -> float:
        """The planner's cost of the task's query with `proposal` in place (`run`: a rolled-back
        build in the caller's fork), once per task: screening runs before anything is applied
        in a fork, and every fork of a task starts with the same data and statistics. A proposal
        that fails to apply (ProposalFailedError) fails the same way for every agent. If the agent that
        screens it fails otherwise, the next one screens it itself."""
        cost, _ = await _once(self._screenings, self.key(proposal), run, errors_shared=True)
        return cost

    async def analysis(self, run: Callable[[], Awaitable[tuple[AnalysisContext, tuple[str, ...]]]]
                       ) -> tuple[AnalysisContext, tuple[str, ...]]:
        """The analysis of the query before any change (`run`, in the caller's fork: EXPLAIN
        ANALYZE, statistics, the suite), once per task: every fork of a task starts with the same
        data and statistics. The first agent runs it, the others take it; if that agent fails
        before it is done, the next one runs it itself."""
        value, _ = await _once(self._analysis, None, run)
        return value

    def screened(self, proposal: OptimizationProposal) -> float | None:
        """The planner cost found for `proposal` in this task, if any."""
        entry = self._screenings.get(self.key(proposal))
        return entry.value if entry is not None else None

    @staticmethod
    def key(proposal: OptimizationProposal) -> ProposalKey:
        rewrite = " ".join(proposal.rewritten_query.split()) if proposal.rewritten_query else None
        # settings count: two settings-only proposals have the same (empty) DDL and no rewrite
        return ddl_signature(proposal), rewrite, tuple(sorted(proposal.settings))

    async def measure(self, agent: AgentKey, proposal: OptimizationProposal,
                      run: Callable[[], Awaitable[BenchmarkOutcome]],
                      waiting: Callable[[AgentKey], None]) -> tuple[BenchmarkOutcome, AgentKey | None]:
        """The measurement and, when it was taken over from another agent, that agent."""
        return await _once(self._measurements, self.key(proposal), run, owner=agent, waiting=waiting)

    def finished(self, proposal: OptimizationProposal) -> BenchmarkOutcome | None:
        """The design's measurement in this task if it is done already (without waiting)."""
        entry = self._measurements.get(self.key(proposal))
        return entry.value if entry is not None and entry.done.is_set() else None

    def taken(self, agent: AgentKey, proposal: OptimizationProposal) -> AgentKey | None:
        """The other agent that measures (or measured) this design in this task, if any: an
        agent then spends its own measuring slot on a design nobody measures (afs.agents) and
        takes that measurement afterwards. None when nobody else has it, or when its
        measurement failed (the next agent to ask measures it)."""
        entry = self._measurements.get(self.key(proposal))
        if entry is None or entry.owner in (None, agent):
            return None
        if entry.done.is_set() and entry.value is None:
            return None
        return entry.owner

    async def settle(self, first: OptimizationProposal, second: OptimizationProposal,
                     run: Callable[[OptimizationProposal, OptimizationProposal], Awaitable[Contest]]
                     ) -> Contest:
        """Two designs measured head to head (`run`: `contest` in the caller's fork), once per
        task: the first agent to ask runs it, the others take its verdict (every fork of a task
        starts with the same data). If that agent fails before it is done, the next one runs it.
        Every agent runs the two in the same order; the contest returned is in the caller's."""
        swap = repr(self.key(second)) < repr(self.key(first))
        a, b = (second, first) if swap else (first, second)
        key = frozenset((self.key(first), self.key(second)))
        value, _ = await _once(self._contests, key, functools.partial(run, a, b))
        if not swap:
            return value
        faster: ContestSide | None = {"first": "second", "second": "first", None: None}[value.faster]
        return Contest(value.second, value.first, faster, value.stopped)



async def apply(conn: Connection, proposal: OptimizationProposal) -> float:
    """Run the proposal's commands in the fork; the seconds it took (an index or view build)."""
    started = trio.current_time()
    for command in proposal.sql_commands:
        try:
            await check_growth(conn, command)  # a runaway build is refused before it runs
            await conn.execute(command)
        except DatabaseError as exc:
            raise ProposalFailedError(f"applying the proposal failed: {exc}") from exc
    return trio.current_time() - started


async def undo(conn: Connection, rollback: Sequence[str]) -> None:
    """Take a measured proposal out of the fork again (its validated rollback commands)."""
    for command in rollback:
        try:
            await conn.execute(command)
        except DatabaseError as exc:
            raise ProposalFailedError(f"undoing the proposal failed: {exc}") from exc


async def planner_cost(conn: Connection, sql: str, proposal: OptimizationProposal | None = None,
                       *, applied: bool = False) -> float:
    """EXPLAIN's total cost of `sql`, with the proposal applied inside a rolled-back transaction
    (or, `applied`, with the proposal already in place in the fork: its settings only)."""
    await conn.execute("BEGIN")
    try:
        if proposal is not None:
            for command in () if applied else proposal.sql_commands:
                await conn.execute(command)
            for name, value in proposal.settings:
                await conn.execute(f"SET LOCAL {name} = {_setting_literal(value)}")
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}")
    except DatabaseError as exc:
        raise ProposalFailedError(f"screening the proposal failed: {exc}") from exc
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")
    return float(plan_of(raw)["Total Cost"])


def _setting_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def _run_with_settings(conn: Connection, settings: Sequence[tuple[str, str]], sql: str) -> Sample:
    """One run with planner settings set for this transaction only (SET LOCAL, rolled back)."""
    await conn.execute("BEGIN")
    try:
        for name, value in settings:
            await conn.execute(f"SET LOCAL {name} = {_setting_literal(value)}")
        return await run_once(conn, sql)
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")


async def _long_run(conn: Connection, variant: QueryVariant, ordered: bool,
                    cap_ms: int, normal_ms: int) -> tuple[Result | None, Sample]:
    """The query run once under a longer cap: its result (None past the cap) and its time."""
    await conn.execute(f"SET statement_timeout = {int(cap_ms)}")
    started = trio.current_time()
    try:
        result: Result | None = await result_of(conn, variant, ordered)
    except StatementTimeout:
        result = None
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute(f"SET statement_timeout = {int(normal_ms)}")
    elapsed = (trio.current_time() - started) * 1000.0
    return result, Sample(ms=cap_ms if result is None else elapsed, buffers=0)


@dataclass(frozen=True)
class _Sides:
    """How a baseline run and a candidate run of one pair of queries are made."""

    baseline: Callable[[str], Awaitable[Sample]]
    candidate: Callable[[str], Awaitable[Sample]]
    interleaved: bool
    note: str
    pristine: bool = False  # the baseline runs as before any change (its samples may be reused)


def _pristine_baseline(proposal: OptimizationProposal, hidden: tuple[str, ...] | None) -> bool:
    """Whether the interleaved baseline runs as before any change: every object the proposal
    makes is an index hidden for the run (no ANALYZE: new statistics change plans), or it makes
    nothing (a rewrite, settings)."""
    if hidden is not None:
        return len(hidden) == len(proposal.sql_commands)
    return not proposal.sql_commands


NOT_FURTHER = "the other queries and values: not measured (the query as given was not fast enough)"
PAST_TIMEOUT = "the proposal's query exceeds the statement timeout for these values"


@dataclass(frozen=True)
class RowsCompared:
    """The proposal's rows for one other value, compared with the original's before its timing
    ran past the statement timeout (`past_timeout_check`)."""

    equivalent: bool
    differ: str  # "" when equivalent, else how the results differ ("; results differ: …")


def past_timeout_check(member: FamilyQuery, *, statement_timeout_ms: int, original_finished: bool,
                       rows: int = 0, baseline: Timing | None = None,
                       compared: RowsCompared | None = None) -> ParameterCheck:
    """The check of one other parameter value (`member`) where the proposal's query (its rows or
    its timing) ran past the statement timeout: the value costs the design, the step does not fail.

    Its time counts as at least the timeout (a lower bound); it is slower than the original
    when the original finished within the timeout (`original_finished`), else not proven
    faster. Its rows: as `compared` when they were; else (None) a rewrite (the member's query
    changed) stays unproven (not equivalent: it can never win), while an index or a setting runs
    the same query, whose rows do not depend on the plan.
    """
    label, rewrite = member.label, member.candidate_sql != member.baseline_sql
    equivalent = None if compared is None else compared.equivalent
    differ = "" if compared is None else compared.differ
    ms = float(statement_timeout_ms)
    cost = Timing(median_ms=ms, spread_ms=0.0, runs=1, buffers=0, lower_bound=True, min_ms=ms, max_ms=ms)
    if equivalent is not None:
        note = f"not timed: {PAST_TIMEOUT}" + differ
    elif rewrite:
        equivalent = False
        note = f"not proven: {PAST_TIMEOUT}, so its rows cannot be compared with the original's"
    else:
        equivalent = True
        note = f"rows not read: {PAST_TIMEOUT} (the same query: its rows do not depend on the plan)"
    return ParameterCheck(label=label, equivalent=equivalent, slower=original_finished, baseline=baseline,
                          optimized=cost, rows=rows, note=note)


def _slow_note(sample: Sample, finished: bool, statement_timeout_ms: int) -> str:
    """How the baseline of a query past the statement timeout was measured."""
    seconds = f"{sample.ms / 1000:.3g}"
    timeout = f"the query exceeds the statement timeout ({statement_timeout_ms / 1000:g} s) before the change"
    if finished:
        return f"{timeout}: baseline is one run of {seconds} s under a longer cap"
    return f"baseline ≥ {seconds} s (lower bound): {timeout} and did not finish within a {seconds} s cap"


def _reuse_note(figure: Figure) -> str:
    if not figure.reused:
        return ""
    note = f"; baseline: {figure.reused} runs reused from an earlier measurement in this task"
    fresh = len(figure.baseline) - figure.reused
    if fresh == 1:
        note += " and 1 fresh run that agreed with them"
    elif fresh:
        note += f" and {fresh} fresh runs, the last of which agreed with them (one noisy run)"
    return note


def _timings(figure: Figure) -> tuple[Timing, Timing]:
    base = timing(figure.baseline)
    if figure.reused:
        base = dataclasses.replace(base, reused=figure.reused)
    return base, timing(figure.candidate)


@dataclass(frozen=True)
class Suites:
    """What one benchmark measures (`benchmark`): the suite before the change, the candidate's
    suite after it (None: the same), the tables whose size counts, what is known skipped
    already, and the query with other parameter values."""

    suite: Sequence[QueryVariant]
    tables: Sequence[str]
    candidate_suite: Sequence[QueryVariant] | None = None
    skipped: Sequence[str] = ()
    family: Sequence[FamilyQuery] = ()


@dataclass(frozen=True)
class Earlier:
    """What a task's earlier measurements lend one benchmark (`benchmark`): the query as given
    known past the statement timeout, the runs and results to reuse, and a loop step's own:
    when to stop (`enough`) and the index builds its step before holds in place (`held`, built
    in `held_s`)."""

    known_slow: bool = False
    reuse: Reuse | None = None
    enough: Callable[[Timing], bool] | None = None
    held: Sequence[str] = ()
    held_s: float = 0.0


NOTHING_EARLIER = Earlier()  # a benchmark on its own


async def benchmark(
    conn: Connection,
    suites: Suites,
    proposal: OptimizationProposal,
    *,
    policy: Measuring,
    earlier: Earlier = NOTHING_EARLIER,
) -> BenchmarkOutcome:
    """Measure `suite` before and `candidate_suite` (default: the same) after the proposal
    (`suites`, with `tables`, `skipped` and `family`; what `earlier` lends: `known_slow`, `reuse`,
    `enough`, `held`, `held_s`).

    Each suite query runs at least `policy.min_runs` and at most `policy.runs` times a side
    (see `stop_reason`), all of them within `policy.budget_s` seconds of query time.
    `family` holds the query with other parameter values: each is result-checked and
    timed too (at most `policy.family_runs` runs a side). When the query as given exceeds the
    statement timeout (`policy.statement_timeout_ms`) before the change, it is run once under
    `policy.slow_cap_s` (0: never) and that single run is its baseline (a lower bound when it
    hit the cap); other variants that exceed the timeout are left out. `reuse.slow_runs` keeps
    that run for the next proposal measured on the same data (by the query's text), so it is
    paid once per task. Once the query as given is known to be that slow (`known_slow`: its
    analysis timed out too), it goes to the long run at once and the other variants are left
    out. `reuse`: what earlier measurements of the task found (see the module's notes; its
    results and baseline runs only when measuring is adaptive, `policy.adaptive`), updated with
    what this one finds. `enough`: asked with the proposal's time on the query as given, once
    measured; False ends the measurement there (the other queries and values are not
    measured, `skipped` says so): an agent's loop step that cannot be kept, whatever they show.
    `held`: the proposal's leading commands, index builds already applied in the fork (the
    design a loop step extends, left in place; `held_s` their build time): not built again,
    their size and build time still count; the baseline hides them with the new indexes.
    """
    suite, candidate_suite, tables, skipped, family = (
        suites.suite, suites.candidate_suite, suites.tables, suites.skipped, suites.family)
    known_slow, reuse, enough, held, held_s = (
        earlier.known_slow, earlier.reuse, earlier.enough, earlier.held, earlier.held_s)
    rule = StopRule.of(policy)
    family_rule = dataclasses.replace(StopRule.of(policy, policy.family_runs), cut_short=True)
    memo = reuse if rule.min_runs < rule.max_runs else None
    slow_cache = reuse.slow_runs if reuse is not None else None
    statement_timeout_ms, slow_cap_ms = policy.statement_timeout_ms, int(policy.slow_cap_s * 1000)
    suite, implied = measured_suite(suite)
    candidates = {v.name: v for v in (candidate_suite or suite)}
    pairs = [(v, candidates[v.name]) for v in suite if v.name in candidates]
    missing = [*implied, *(f"{v.name}: no equivalent query on the proposal's objects" for v in suite
                           if v.name not in candidates)]
    hidden = hideable_indexes(proposal)
    held_names = hideable_indexes(dataclasses.replace(proposal, sql_commands=tuple(held))) if held else ()
    if held and (hidden is None or held_names is None or proposal.rewritten_query is not None
                 or tuple(proposal.sql_commands[:len(held)]) != tuple(held)):
        raise ProposalFailedError("only leading index builds of the proposal can be held in place")
    storage_before = float(await conn.fetchval(_TABLES_SIZE, (list(tables),)))
    relations_before = float(await conn.fetchval(_USER_RELATIONS_SIZE))
    if held_names:  # as if the held indexes were not built yet
        held_size = float(await conn.fetchval(_TABLES_SIZE, (list(held_names),)))
        storage_before, relations_before = storage_before - held_size, relations_before - held_size

    rewrite = proposal.rewritten_query is not None
    settings = proposal.settings
    # A rewrite may order ties differently: compare its results as multisets.
    ordered = {v.name: v.ordered and c.ordered and not rewrite for v, c in pairs}

    async def checked(variant: QueryVariant, in_order: bool, unchanged: bool) -> Result:
        """The query's rows and checksum; taken from `memo` when the fork is `unchanged`."""
        key = _result_key(variant.sql, in_order)
        if memo is not None and unchanged:
            if key not in memo.results:
                await _results_before(conn, dataclasses.replace(variant, ordered=variant.ordered or in_order),
                                      memo)
            return memo.results[key]
        result = await result_of(conn, variant, in_order)
        if memo is not None:
            memo.warm.add(variant.sql)
        return result

    def warm(sql: str) -> bool:
        return memo is not None and sql in memo.warm

    before_results: dict[str, Result] = {}
    slow_baseline: dict[str, Sample] = {}
    kept: list[tuple[QueryVariant, QueryVariant]] = []
    too_slow = known_slow
    for variant, candidate in pairs:
        long_run = bool(slow_cap_ms and statement_timeout_ms) and variant.name == "baseline"
        if too_slow and not long_run:
            missing.append(f"{variant.name}: the query exceeds the statement timeout before the change;"
                           " only the query as given is measured")
            continue
        if not (too_slow and long_run):
            try:
                before_results[variant.name] = await checked(variant, ordered[variant.name], True)
                kept.append((variant, candidate))
                continue
            except StatementTimeout:
                too_slow = True
                if not long_run:
                    missing.append(f"{variant.name}: exceeds the statement timeout before the change")
                    continue
        key = _result_key(variant.sql, ordered[variant.name])
        cached = slow_cache.get(key) if slow_cache is not None else None
        if cached is None:
            # bounded by the time left (the agent's deadline): the candidate must still run
            left = trio.current_effective_deadline() - trio.current_time()
            cap_ms = long_run_cap_ms(policy, left, len(family))
            cached = await _long_run(conn, variant, ordered[variant.name], cap_ms,
                                     statement_timeout_ms)
            if slow_cache is not None:
                slow_cache[key] = cached
        result, sample = cached
        slow_baseline[variant.name] = sample
        if result is not None:
            before_results[variant.name] = result
        kept.append((variant, candidate))
    pairs = kept

    # the query with other values: its rows before the change (None: past the statement timeout)
    family_ordered = bool(pairs) and ordered.get(pairs[0][0].name, False)
    family_exact = bool(pairs) and pairs[0][0].exact and pairs[0][1].exact
    family_before_results: dict[str, Result | None] = {}
    # a value's original runs under its share of the budget (`family_cap_ms`); one known past
    # it in this task (`measure_before`, an earlier proposal) is not run again
    family_cap = family_cap_ms(policy, len(pairs) + sum(m.candidate_sql is not None for m in family))
    for member in family:
        if member.candidate_sql is None:
            continue
        probe = QueryVariant("baseline", member.baseline_sql, family_ordered, family_exact)
        if reuse is not None and member.baseline_sql in reuse.slow_family:
            family_before_results[member.label] = None
            continue
        try:
            async with capped(conn, family_cap):
                family_before_results[member.label] = await checked(probe, family_ordered, True)
        except StatementTimeout:
            family_before_results[member.label] = None
            if reuse is not None:
                reuse.slow_family[member.baseline_sql] = False

    hidden_statistics = hideable_statistics(proposal) if hidden is None else None
    sequential = hidden is None and hidden_statistics is None and not rewrite and not settings
    timed_family = [m for m in family if m.candidate_sql is not None]
    budget = Budget(policy.budget_s, (len(pairs) + len(timed_family)) * (2 if sequential else 1))
    sequential_baseline: dict[str, list[Sample]] = {}
    family_before: dict[str, list[Sample]] = {}
    if sequential:
        for variant, _ in pairs:
            if variant.name not in slow_baseline:
                sequential_baseline[variant.name], _ = await _measure_alone(
                    functools.partial(run_once, conn, variant.sql), rule, budget, warm=warm(variant.sql))
        for member in timed_family:
            if family_before_results.get(member.label) is not None:
                family_before[member.label], _ = await _measure_alone(
                    functools.partial(run_once, conn, member.baseline_sql), family_rule, budget,
                    warm=warm(member.baseline_sql))
        if memo is not None:
            memo.warm.update(v.sql for v, _ in pairs)
            memo.warm.update(m.baseline_sql for m in timed_family)
            for variant, _ in pairs:
                if variant.name in sequential_baseline:
                    memo.baselines[variant.sql] = tuple(sequential_baseline[variant.name])
            for member in timed_family:
                if member.label in family_before:
                    memo.baselines[member.baseline_sql] = tuple(family_before[member.label])

    building = dataclasses.replace(proposal, sql_commands=proposal.sql_commands[len(held):])
    apply_s = held_s + await apply(conn, building)
    relations_after = float(await conn.fetchval(_USER_RELATIONS_SIZE))

    async def plain(sql: str) -> Sample:
        return await run_once(conn, sql)

    async def with_settings(sql: str) -> Sample:
        return await _run_with_settings(conn, settings, sql)

    async def without_new_indexes(sql: str) -> Sample:
        assert hidden is not None
        return await _run_without(conn, "INDEX", hidden, sql)

    async def without_new_statistics(sql: str) -> Sample:
        assert hidden_statistics is not None
        return await _run_without(conn, "STATISTICS", hidden_statistics, sql)

    run_candidate = with_settings if settings else plain
    pristine = _pristine_baseline(proposal, hidden)
    if hidden is not None:
        sides = _Sides(without_new_indexes, run_candidate, True,
                       "interleaved; baseline with the new indexes hidden in a rolled-back transaction",
                       pristine)
    elif hidden_statistics is not None:
        # not pristine: the proposal's ANALYZE drew new column statistics for both sides
        sides = _Sides(without_new_statistics, run_candidate, True,
                       "interleaved; baseline with the new statistics hidden in a rolled-back transaction")
    elif rewrite or settings:
        sides = _Sides(plain, run_candidate, True,
                       "interleaved; original query against the "
                       + ("rewrite" if rewrite else "query with the proposed settings"), pristine)
    else:
        sides = _Sides(plain, run_candidate, False, "baseline before the change, candidate after it")

    drift = Drift()  # one drift check for the candidate's figures

    async def figure(baseline_sql: str, candidate_sql: str, stop: StopRule) -> Figure:
        """One interleaved figure, reusing the task's baseline runs where they hold."""
        prior = (memo.baselines.get(baseline_sql, ()) if memo is not None and sides.pristine else ())
        measured = await _measure(
            Runners(functools.partial(sides.baseline, baseline_sql),
                    functools.partial(sides.candidate, candidate_sql)),
            stop, budget, prior=prior, drift=drift,
            # settings change the plan: the checksum run (without them) warmed other pages
            warm=Warm(baseline=warm(baseline_sql), candidate=warm(candidate_sql) and not settings))
        if memo is not None:
            memo.warm.update((baseline_sql, candidate_sql))
            if sides.pristine and len(measured.baseline) > measured.reused:  # fresh runs to keep
                memo.baselines[baseline_sql] = tuple(measured.baseline[-stop.max_runs:])
        return measured

    # a query's rows after the change are as before it only when the proposal makes nothing
    unchanged_after = not proposal.sql_commands
    measurements: list[Measurement] = []
    for variant, candidate in pairs:
        after = await checked(candidate, ordered[variant.name], unchanged_after)
        before = before_results.get(variant.name)
        # a rewrite may cut a LIMIT at other rows (its order differs): compare counts there
        exact = variant.exact and candidate.exact and not (rewrite and variant.name == "limit")
        unproven = before is None and rewrite
        if before is None:  # the baseline ran past the long cap: only the same query can be trusted
            equivalent = not rewrite
            before = Result(rows=after.rows, checksum=after.checksum)
        else:
            equivalent = before.rows == after.rows and (not exact or before.checksum == after.checksum)
        note = sides.note
        if variant.name in slow_baseline:
            cand, stopped = await _measure_alone(functools.partial(run_candidate, candidate.sql),
                                                 rule, budget, against=[slow_baseline[variant.name]],
                                                 warm=warm(candidate.sql) and not settings)
            measured = Figure([slow_baseline[variant.name]], cand, stopped)
            note = _slow_note(slow_baseline[variant.name], variant.name in before_results,
                              statement_timeout_ms)
        elif sides.interleaved:
            measured = await figure(variant.sql, candidate.sql, rule)
            note += _reuse_note(measured)
        else:
            cand, stopped = await _measure_alone(functools.partial(sides.candidate, candidate.sql),
                                                 rule, budget, against=sequential_baseline[variant.name],
                                                 warm=warm(candidate.sql))
            measured = Figure(sequential_baseline[variant.name], cand, stopped)
        if unproven:
            note = (f"not proven: the query as given did not finish within the"
                    f" {slow_baseline[variant.name].ms / 1000:g} s cap, so the rewrite's rows cannot be"
                    " compared with its rows")
        elif not equivalent:
            note = (f"results differ: {before.rows} rows before, {after.rows} after"
                    + ("" if before.rows != after.rows else " (checksum differs)"))
        base_timing, cand_timing = _timings(measured)
        if variant.name in slow_baseline:
            base_timing = dataclasses.replace(base_timing, lower_bound=True)
        measurements.append(Measurement(
            name=variant.name, baseline=base_timing, optimized=cand_timing, rows=before.rows,
            equivalent=equivalent, significant=figure_significant(measured),
            note=note, stopped=measured.stopped))
        if enough is not None and variant.name == "baseline" and not enough(cand_timing):
            delta = max(0.0, relations_after - relations_before)
            return BenchmarkOutcome(
                measurements=tuple(measurements), storage_before_mb=round(storage_before / MB, 2),
                storage_after_mb=round((storage_before + delta) / MB, 2),
                skipped=(*skipped, *missing, NOT_FURTHER), apply_s=round(apply_s, 3),
                baseline_lower_bound=bool(slow_baseline))

    checks: list[ParameterCheck] = []
    answer_cache: str | None = None
    slower_past_timeout: str | None = None  # a value where the proposal ran past the timeout
    for member in family:
        if slower_past_timeout is not None and member.candidate_sql is not None:
            # slower than the original for one value already: it cannot win (the family gate),
            # and each more value could wait for the statement timeout again
            missing.append(f"{member.label}: not measured: the proposal is slower than the original"
                           f" past the statement timeout for {slower_past_timeout} already")
            continue
        if member.candidate_sql is None:
            answer_cache = answer_cache or (
                f"it cannot answer the query for {member.label}: what it reads is a cache of "
                "today's answer, not a way to compute it")
            checks.append(ParameterCheck(label=member.label, equivalent=False, slower=False,
                                         note="the proposal cannot answer the query with these values"))
            continue
        member_before = family_before_results[member.label]
        if member_before is None:
            cap_note = ("" if family_cap is None
                        else f" (here {family_cap / 1000:g} s: a value's share of the budget)")
            checks.append(ParameterCheck(label=member.label, equivalent=True, slower=False,
                                         note="not checked: the original exceeds the statement timeout"
                                              " for these values" + cap_note))
            continue
        other = QueryVariant("baseline", member.candidate_sql, family_ordered, family_exact)
        known_before = family_before.get(member.label) or (
            memo.baselines.get(member.baseline_sql) if memo is not None else None)
        try:
            after = await checked(other, family_ordered, unchanged_after)
        except StatementTimeout:  # costs this value; the design's other figures stand
            checks.append(past_timeout_check(
                member, statement_timeout_ms=statement_timeout_ms, original_finished=True,
                rows=member_before.rows, baseline=timing(known_before) if known_before else None))
            slower_past_timeout = member.label
            continue
        equivalent = (member_before.rows == after.rows
                      and (not family_exact or member_before.checksum == after.checksum))
        try:
            if member.label in family_before:
                cand, stopped = await _measure_alone(
                    functools.partial(sides.candidate, member.candidate_sql), family_rule, budget,
                    against=family_before[member.label], warm=warm(member.candidate_sql))
                measured = Figure(family_before[member.label], cand, stopped)
            else:
                measured = await figure(member.baseline_sql, member.candidate_sql, family_rule)
        except StatementTimeout:
            # which side ran past the timeout? the proposal's query alone tells
            try:
                await sides.candidate(member.candidate_sql)
                slow_side, slower = "the original", False
            except StatementTimeout:
                differ = ("" if equivalent else f"; results differ: {member_before.rows} rows before, "
                          f"{after.rows} after")
                checks.append(past_timeout_check(
                    member, statement_timeout_ms=statement_timeout_ms, original_finished=True,
                    rows=member_before.rows, baseline=timing(known_before) if known_before else None,
                    compared=RowsCompared(equivalent, differ)))
                slower_past_timeout = member.label
                continue
            checks.append(ParameterCheck(
                label=member.label, equivalent=equivalent, slower=slower, rows=member_before.rows,
                note=f"not timed: {slow_side} exceeds the statement timeout for these values"
                     + ("" if equivalent else f"; results differ: {member_before.rows} rows before, "
                        f"{after.rows} after")))
            continue
        # a value the budget cut short is called slower only far beyond the noise (`settled`)
        slower = _slower(measured, family_rule)
        if slower and sides.interleaved:
            # "slower" for another value disqualifies the design (the family gate), but rests on
            # few runs a side (Measuring.family_runs: three against three are completely apart
            # by chance one time in ten) or on baseline runs reused from minutes ago (drift on
            # a busy server). It stands only if a second figure, all runs fresh and alternating
            # (what the proposal creates hidden for the baseline), agrees
            measured = await _measure(
                Runners(functools.partial(sides.baseline, member.baseline_sql),
                        functools.partial(sides.candidate, member.candidate_sql)),
                family_rule, budget, warm=Warm(baseline=True, candidate=True))
            slower = _slower(measured, family_rule)
        b, c = _timings(measured)
        checks.append(ParameterCheck(
            label=member.label, equivalent=equivalent, slower=slower, baseline=b, optimized=c,
            rows=member_before.rows,
            note="" if equivalent else (f"results differ: {member_before.rows} rows before,"
                                        f" {after.rows} after")))

    delta = max(0.0, relations_after - relations_before)
    return BenchmarkOutcome(
        measurements=tuple(measurements),
        storage_before_mb=round(storage_before / MB, 2),
        storage_after_mb=round((storage_before + delta) / MB, 2),
        skipped=(*skipped, *missing),
        parameter_checks=tuple(checks),
        answer_cache=answer_cache,
        apply_s=round(apply_s, 3),
        baseline_lower_bound=bool(slow_baseline),
    )


async def _run_without(conn: Connection, kind: str, names: Sequence[str], sql: str) -> Sample:
    """One run with the objects `names` of `kind` (INDEX, STATISTICS) dropped inside a
    transaction that is rolled back."""
    await conn.execute("BEGIN")
    try:
        for name in names:
            await conn.execute(f"DROP {kind} {quote_qualified(name)}")
        return await run_once(conn, sql)
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")


# -- two designs head to head --------------------------------------------------------------
# pairs of runs, every one won by the same design, that settle a contest: by chance 2^-7 =
# 0.008, the false-alarm rate of the margin rule (`stop_reason`)
CONTEST_PAIRS = 7

ContestSide = Literal["first", "second"]


@dataclass(frozen=True)
class Contest:
    """Two designs measured head to head in one fork (`contest`): their runs of the query as
    given, pair by pair (each pair's order alternating), which one is faster (None: neither
    beyond the noise), and why the runs stopped."""

    first: tuple[Sample, ...]
    second: tuple[Sample, ...]
    faster: ContestSide | None
    stopped: StopReason


def contest_verdict(first: Sequence[float], second: Sequence[float], rule: StopRule,
                    out_of_time: bool = False) -> tuple[StopReason | None, ContestSide | None]:
    """Whether a head-to-head stops now, and which design is faster (pure; times in ms, pair
    by pair). Paired, because the two runs of a pair are adjacent in time: drift between pairs
    (a busy two-core server) does not count against the verdict as it does for two samples.

    A design is faster when the medians are at least MIN_EFFECT apart and a one-sided Wilcoxon
    signed-rank test on the pairs' log ratios (`signed_rank`: how often and by how much each
    design won its pairs) gives at most CONTEST_P (7 of 7 pairs won: 0.008), or, after
    `rule.min_runs` pairs, when the samples are separated with the margin of `stop_reason`. A
    pair the other way (a burst on a busy server) does not end it: it ends without a verdict
    ("overlap") once neither design can reach one within `rule.max_runs` pairs, and at
    `rule.max_runs` pairs or the budget."""
    n = min(len(first), len(second))
    if n == 0:
        return None, None
    a, b = list(first[:n]), list(second[:n])
    ma, mb = statistics.median(a), statistics.median(b)
    if n >= min(rule.min_runs, rule.max_runs) and stop_reason(b, a, rule) == "separated":
        return "separated", "first" if ma < mb else "second"
    side, p, _ = signed_rank(a, b)
    apart = abs(ma - mb) >= MIN_EFFECT * max(ma, mb) and (ma < mb) == (side == "first")
    if side is not None and apart and p <= CONTEST_P:
        return "separated", side
    if n >= rule.max_runs:
        return "max_runs", None
    # the best either design can still do: every pair left won by it, by more than any so far
    left = rule.max_runs - n
    lost = signed_rank(a, b)[2]
    if all(_rank_sum_p(w, len(_log_ratios(a, b)) + left) > CONTEST_P for w in lost):
        return "overlap", None
    if out_of_time:
        return "budget", None
    return None, None


CONTEST_P = 0.01  # a head-to-head's false-alarm rate (one-sided): 7 of 7 pairs won is 0.008


def _log_ratios(first: Sequence[float], second: Sequence[float]) -> list[float]:
    """log(first / second) pair by pair, ties left out (pure)."""
    return [_log(x) - _log(y) for x, y in zip(first, second, strict=False) if _log(x) != _log(y)]


def signed_rank(first: Sequence[float], second: Sequence[float]
                ) -> tuple[ContestSide | None, float, tuple[int, int]]:
    """A one-sided Wilcoxon signed-rank test of paired times (pure): the side whose pairs'
    ranks (by the size of the log ratio) sum higher, the chance of the other's rank sum or less
    by coin flips, and the rank sums of the pairs each side lost (first's, second's)."""
    d = _log_ratios(first, second)
    ranked = sorted(range(len(d)), key=lambda i: abs(d[i]))
    lost_first = sum(r + 1 for r, i in enumerate(ranked) if d[i] > 0)  # first slower in pair i
    lost_second = sum(r + 1 for r, i in enumerate(ranked) if d[i] < 0)
    if not d or lost_first == lost_second:
        return None, 1.0, (lost_first, lost_second)
    side: ContestSide = "first" if lost_first < lost_second else "second"
    return side, _rank_sum_p(min(lost_first, lost_second), len(d)), (lost_first, lost_second)


def _rank_sum_p(w: int, n: int) -> float:
    """The chance that the ranks 1..n a coin assigns to one side sum to at most `w` (pure)."""
    if n <= 0:
        return 1.0
    counts = [1] + [0] * w  # subsets of the ranks so far by their sum, up to w
    for rank in range(1, n + 1):
        for total in range(w, rank - 1, -1):
            counts[total] += counts[total - rank]
    return math.ldexp(sum(counts), -n)  # their count over 2^n


def one_way(first: Sequence[float], second: Sequence[float]) -> bool:
    """Every pair (first[i], second[i]) won by the same side (pure; a tie is no win)."""
    pairs = list(zip(first, second, strict=False))
    return bool(pairs) and (all(a < b for a, b in pairs) or all(b < a for a, b in pairs))


def paired_significant(baseline: Sequence[float], candidate: Sequence[float]) -> bool:
    """A paired verdict on interleaved runs (pure): at least CONTEST_PAIRS pairs, every one won
    by the same side, and the medians MIN_EFFECT apart. By chance 2^-7 = 0.008 (a sign test),
    the false-alarm rate of the margin rule; the two runs of a pair are adjacent in time, so
    drift between pairs (a busy server) does not hide an effect as it does for two samples."""
    n = min(len(baseline), len(candidate))
    if n < CONTEST_PAIRS or not one_way(baseline[:n], candidate[:n]):
        return False
    mb, mc = statistics.median(baseline[:n]), statistics.median(candidate[:n])
    return abs(mb - mc) >= MIN_EFFECT * max(mb, mc)


def keep_pairing(baseline: Sequence[float], candidate: Sequence[float], rule: StopRule) -> bool:
    """Whether an interleaved loop whose samples overlap goes on (pure): where the effect is
    small, keep measuring. Only when measuring is adaptive (`rule.min_runs` < `rule.max_runs`;
    a fixed count stays fixed), while every pair went one way with the medians MIN_EFFECT apart,
    and up to CONTEST_PAIRS pairs (`paired_significant` then judges), beyond `rule.max_runs`."""
    n = min(len(baseline), len(candidate))
    if rule.min_runs >= rule.max_runs or n >= CONTEST_PAIRS or not one_way(baseline, candidate):
        return False
    mb, mc = statistics.median(baseline), statistics.median(candidate)
    return abs(mb - mc) >= MIN_EFFECT * max(mb, mc)


def _slower(figure: Figure, rule: StopRule) -> bool:
    """Whether a figure shows the candidate slower: the samples completely separated with the
    candidate's median above, and settled (`settled`: a figure the budget cut short only far
    beyond the noise)."""
    before, after = _timings(figure)
    return (significant(figure.baseline, figure.candidate) and after.median_ms > before.median_ms
            and settled(figure, rule))


def figure_significant(figure: Figure) -> bool:
    """A figure's verdict: the two samples completely separated (`significant`), or, for
    interleaved pairs, every one of at least CONTEST_PAIRS won by one side (`paired_significant`)."""
    if significant(figure.baseline, figure.candidate):
        return True
    return figure.paired and paired_significant([s.ms for s in figure.baseline],
                                                [s.ms for s in figure.candidate])


def hiding(proposal: OptimizationProposal) -> tuple[str, ...] | None:
    """The statements that hide what the proposal creates inside a transaction (pure): none for
    a rewrite or settings (it creates nothing), DROP INDEX for indexes, DROP STATISTICS for
    extended statistics; None when something else is created (it cannot be hidden)."""
    if not proposal.sql_commands:
        return ()
    indexes = hideable_indexes(proposal)
    if indexes is not None:
        return tuple(f"DROP INDEX {quote_qualified(name)}" for name in indexes)
    stats = hideable_statistics(proposal)
    if stats is not None:
        return tuple(f"DROP STATISTICS {quote_qualified(name)}" for name in stats)
    return None


async def run_design(conn: Connection, proposal: OptimizationProposal, hide: Sequence[str],
                     sql: str) -> Sample:
    """One run of `sql` as the proposal would run it, in a transaction that is rolled back: the
    other design's objects hidden (`hide`, from `hiding`) and its settings SET LOCAL."""
    await conn.execute("BEGIN")
    try:
        for statement in hide:
            await conn.execute(statement)
        for name, value in proposal.settings:
            await conn.execute(f"SET LOCAL {name} = {_setting_literal(value)}")
        return await run_once(conn, sql)
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")


async def contest(runners: Runners, policy: Measuring) -> Contest:
    """Two designs in place in one fork, head to head: a warm-up each, then pairs of runs (the
    order alternating pair by pair) until `contest_verdict` stops: at most twice the policy's
    runs (and at least CONTEST_PAIRS), within the policy's budget of query time.
    `runners.baseline` runs the first design, `runners.candidate` the second."""
    rule = StopRule(min_runs=policy.min_runs, max_runs=max(CONTEST_PAIRS, 2 * policy.runs))
    started = trio.current_time()
    await runners.baseline()
    await runners.candidate()
    first: list[Sample] = []
    second: list[Sample] = []
    while True:
        if len(first) % 2 == 0:
            first.append(await runners.baseline())
            second.append(await runners.candidate())
        else:
            second.append(await runners.candidate())
            first.append(await runners.baseline())
        reason, faster = contest_verdict([s.ms for s in first], [s.ms for s in second], rule,
                                         trio.current_time() - started >= policy.budget_s)
        if reason is not None:
            return Contest(tuple(first), tuple(second), faster, reason)
