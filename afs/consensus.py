"""Consensus: rank the measured proposals and pick at most one winner (pure: no I/O).

    outcomes ─► candidates        status "ok" with a proposal, a validation and a benchmark;
                                  the others are only listed in the rationale, with their error
             ─► SCORERS           one 0–100 score per criterion (the original AFS rules)
             ─► ADJUSTMENTS       ours: corrections to a score (the write cost of an index)
             ─► total             weighted sum (WEIGHTS, overridable), rounded to 0.01
             ─► GATES             reasons one proposal cannot win, judged on its own
             ─► SURVIVOR_GATES    reasons that depend on who else survived (the lone survivor)
             ─► ranking           qualified first; then measured clearly faster (`clearly_faster`:
                                  ranks above whoever it is clearly faster than); then total, then
                                  the tie-breaks: the simpler change (higher complexity score), less
                                  measured storage, AGENT_PREFERENCE
             ─► confidence, rationale

A new criterion is one function and one line: a gate `(candidate, breakdown) -> reason | None`
goes into GATES; a correction `(candidate) -> Adjustment | None` into ADJUSTMENTS. A new scored
criterion `score_<name>(candidate) -> float` goes into SCORERS; its name is the weight key and
the ScoreBreakdown field (afs/models.py) it fills.

Scores use what was measured (BenchmarkOutcome), never the agent's EstimatedImpact.

Ours on top of the original rules:

* no score rewards what is not executed: the +5 risk bonus for a proposal's "validation
  steps" (text a model writes, which nothing runs) is dropped;
* a proposal whose suite queries return other rows than the original (not
  BenchmarkOutcome.equivalent) cannot win;
* a statistically inconclusive proposal cannot win. A measurement *beats the noise* when it is
  `significant` and its improvement is positive. The proposal is conclusive when the suite's
  "baseline" query (the query as the user wrote it) beats the noise, or when more than half of
  all its measurements do; otherwise it is inconclusive;
* the write cost of a new index, measured where it can be: when the task was given the
  workload's writes of the indexed tables and their rates (the batch's, afs.replay), the fork
  replayed them with and without the new indexes (`BenchmarkOutcome.write_cost`), and the risk
  score loses min(15, 15 × the writes' extra ms a day ÷ the read ms saved a day: the query as
  given, before − after, × its calls a day; the replay's estimate, said to be within the noise
  when no write's runs were apart), nothing when the cost is not above zero. Else,
  on a write-heavy table: for index types (index, partial_index, composite_index) the risk
  score loses min(15, 10 × writes_per_read), where writes_per_read is
  the largest `outcome.writes_per_read` (measured on the source) of the tables the proposal
  indexes, as the validator read them (`afs.safety.creates`; 0 when unknown). It is applied
  after the original risk clamp and clamped to 0–100 again, so it counts in the risk gate too;
  the rationale says which of the two was used, with its figures;
* a materialized view is stale until refreshed and each refresh costs its build time, measured
  in the fork (`BenchmarkOutcome.apply_s`): complexity −min(20, 2 per second);
* performance is scored on the average improvement over the suite AND the other parameter
  sets that were timed (`BenchmarkOutcome.family_improvement_pct`), so a design that serves
  the whole query family beats one that serves only today's literals;
* a fix must serve the query family: a proposal that is an answer cache (the query's literals
  baked into what it reads), returns other rows for another parameter set, or is slower than
  the original for one (`BenchmarkOutcome.family_problem`) cannot win;
* measured clearly faster ranks first (a dominance rule over the seed's score): the seed's
  performance bands saturate (87.6 % and 88.8 % faster score alike, and so do 90 % and
  99.9 %), so a few points of complexity or storage could outweigh a measured difference of
  several times. Among the qualified proposals, A ranks above B when A is *clearly faster*
  on the query as given (the suite's "baseline" figure, both with the same rows): its
  speed-up over its own baseline runs, read from the runs themselves (`speedup_range`:
  slowest baseline run over fastest optimized run and the reverse, so the noise of both
  samples counts), lies entirely above B's, and its median speed-up is at least
  DOMINANCE_MIN_RATIO (1.1) times B's. Ratios to each one's own baseline, because two
  proposals are measured in different forks, possibly minutes apart: drift divides out when
  each baseline was measured with its candidate. When either baseline stands on runs reused
  from earlier in the task (`Timing.reused`, afs.bench.Reuse: both candidates may then be
  compared with the very same runs, made minutes before either), nothing divides the drift
  between the two candidates' runs out, and the medians must be DRIFT_RATIO (2.2, the worst
  drift afs.bench saw between two measurements of one task) apart instead; complete
  separation, because it is the significance rule of the measurements themselves
  (afs.bench.significant). A is not clearly faster when it serves the query's other
  parameter values worse (`serves_family_as_well`: B's speed-up on a value timed for both is
  DOMINANCE_MIN_RATIO times A's, or A's family average trails B's by more than
  FAMILY_SLACK_PCT points): a partial index on today's constant must not outrank an index
  that speeds up every value. And B ranks above A whatever their speed on the query as
  given when B serves the other values clearly better (`serves_family_clearly_better`: on
  some value B's speed-up is DRIFT_RATIO times A's, on none the reverse). A candidate
  ranks by the number of qualified proposals that beat it either way; among proposals
  none beats, the seed's total decides as before. Gates are unchanged: a proposal
  disqualified by one never ranks above a qualified one, however fast. Runs without their
  extremes recorded (results stored before Timing.min_ms) never count as clearly faster.
  The rationale says why in numbers: the query's time before and after, the ratio, and
  the rival's time;
* before an agent hands its best design to consensus, two of its designs that only the score
  would tell apart (as fast as each other by their own measurements, each against its own
  baseline runs, possibly minutes and a fork apart) were measured head to head in one fork
  (afs.agents.tie_to_settle, afs.bench.contest: paired runs, every pair won and the medians
  5 % apart); the slower one is no longer as fast, so the seed's complexity points decide only
  where the head-to-head found no difference either (the candidates' notes say which);
* agreement between agents on equivalent DDL raises the confidence. DDL is compared as the set
  of statements the validator read (`ddl_signature`, ANALYZE left out), so `CREATE INDEX a ON
  orders (user_id)` ≡ `create index concurrently b on orders(user_id)`. Any other outcome with
  a proposal counts, whatever became of it later (an independent proposal of the same change is
  evidence).

Confidence is 0 without a winner; otherwise, clamped to 0–1,

    0.30 + 0.30 · clamp((winner total − runner-up total) / 20, 0, 1)
         + 0.25 · (share of the winner's measurements that beat the noise)
         + 0.15 if another agent proposed equivalent DDL

where the runner-up is the best other *qualified* proposal; a lone winner is measured against
the bar it had to clear (60); a winner clearly faster than the runner-up has the full margin
term (its lead is measured, whatever the totals say). The rationale ends with the numbers that went into it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from afs.models import (
    AGENT_PREFERENCE,
    AGENTS,
    AgentKey,
    AgentOutcome,
    BenchmarkOutcome,
    ConsensusDecision,
    Measurement,
    OptimizationProposal,
    ScoreBreakdown,
    ValidationResult,
    WriteCost,
)
from afs.safety import Change, creates

# -- the rules, as named constants ------------------------------------------------------
# (threshold, score): the first tier whose threshold the value reaches wins.
PERFORMANCE_TIERS: tuple[tuple[float, float], ...] = (
    (90.0, 100.0), (80.0, 95.0), (70.0, 85.0), (50.0, 70.0), (30.0, 50.0), (10.0, 30.0),
)
PERFORMANCE_FLOOR = 10.0  # below the last tier, but not slower
STORAGE_TIERS: tuple[tuple[float, float], ...] = ((10.0, 100.0), (25.0, 90.0), (50.0, 75.0), (100.0, 50.0))
STORAGE_MIN = 20.0  # beyond the last tier: max(STORAGE_MIN, 100 − MB/2)
COMPLEXITY_BY_TYPE: Mapping[str, float] = MappingProxyType({
    "index": 90.0,
    "partial_index": 85.0,
    "composite_index": 85.0,
    "query_rewrite": 85.0,
    "materialized_view": 70.0,
    "partitioning": 50.0,
    "denormalization": 40.0,
    # ours: extended statistics and a per-query setting change no data or access path and
    # are undone with one statement (or none): as easy to apply as a plain index
    "statistics": 90.0,
    "settings": 90.0,
})
COMPLEXITY_PER_EXTRA_COMMAND = 5.0
COMPLEXITY_REFRESH_PENALTY = 10.0
COMPLEXITY_RANGE = (20.0, 100.0)
RISK_BY_LEVEL: Mapping[str, float] = MappingProxyType({"low": 95.0, "medium": 70.0, "high": 40.0})
RISK_PER_WARNING = 5.0
RISK_ROLLBACK_BONUS = 5.0
RISK_RANGE = (0.0, 100.0)
INDEX_TYPES = frozenset({"index", "partial_index", "composite_index"})
WRITE_COST_PER_WRITE_PER_READ = 10.0
WRITE_COST_MAX = 15.0
REFRESH_COST_PER_S = 2.0
REFRESH_COST_MAX = 20.0

MIN_IMPROVEMENT_PCT = 10.0
# clearly faster: speed-up intervals apart and medians at least this ratio apart (two
# measurements' noise adds up: twice afs.bench.MIN_EFFECT's 5 %)
DOMINANCE_MIN_RATIO = 1.1
# ... or this ratio when a baseline was reused from earlier in the task: drift between the
# candidates' measurements does not divide out then (afs.bench: 2.2x at most seen on a loaded
# two-core machine)
DRIFT_RATIO = 2.2
# ... and never by serving today's literals only: its average over the suite and the other
# parameter values may trail the rival's by at most this many points (serves_family_as_well)
FAMILY_SLACK_PCT = 5.0
_MIN_MS = 0.001  # EXPLAIN reports times in µs: a time of 0 counts as 1 µs
MIN_RISK_SCORE = 40.0
LONE_SURVIVOR_MIN_TOTAL = 60.0  # a lone survivor needs a total strictly above this

# confidence = CONFIDENCE_BASE + CONFIDENCE_MARGIN·margin_term + CONFIDENCE_SIGNIFICANCE·significance_term
#              (+ CONFIDENCE_AGREEMENT when another agent proposed equivalent DDL), clamped to 0–1
CONFIDENCE_BASE = 0.30
CONFIDENCE_MARGIN = 0.30
CONFIDENCE_SIGNIFICANCE = 0.25
CONFIDENCE_AGREEMENT = 0.15
MARGIN_FOR_FULL_CONFIDENCE = 20.0  # points of total


# -- what is scored ----------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """An outcome that can be scored: status "ok", with everything the scorers read."""

    outcome: AgentOutcome
    proposal: OptimizationProposal
    validation: ValidationResult
    benchmark: BenchmarkOutcome

    @property
    def agent(self) -> AgentKey:
        return self.outcome.agent

    @property
    def writes_per_read(self) -> float:
        """Measured on the source: the most written table that gets a new index (0 if none)."""
        tables = _indexed_tables(self.proposal)
        rates = [rate for table, rate in self.outcome.writes_per_read.items()
                 if table.lower().rsplit(".", 1)[-1] in tables and math.isfinite(rate) and rate > 0]
        return max(rates, default=0.0)


def _indexed_tables(proposal: OptimizationProposal) -> set[str]:
    """The tables the proposal's new indexes are on (lower case, without schema), as the
    validator read them (`afs.safety.creates`)."""
    return {table.rpartition(".")[2].lower() for table in creates(proposal).indexed_tables}


@dataclass(frozen=True)
class Adjustment:
    """A correction of one criterion's score, with the sentence that explains it."""

    criterion: str
    delta: float
    reason: str


# -- scorers: (candidate) -> 0–100 --------------------------------------------------------
def score_performance(candidate: Candidate) -> float:
    """Average measured improvement over the suite queries and the other parameter sets (the
    query family), in tiers; slower scores 0."""
    pct = candidate.benchmark.family_improvement_pct
    if pct < 0:
        return 0.0
    for threshold, score in PERFORMANCE_TIERS:
        if pct >= threshold:
            return score
    return PERFORMANCE_FLOOR


def score_storage(candidate: Candidate) -> float:
    """Measured extra storage in MB, in tiers; beyond them max(20, 100 − MB/2)."""
    mb = candidate.benchmark.storage_delta_mb
    for limit, score in STORAGE_TIERS:
        if mb <= limit:
            return score
    return max(STORAGE_MIN, 100.0 - mb / 2.0)


def score_complexity(candidate: Candidate) -> float:
    """By proposal type; −5 per command beyond the first, −10 when it needs refreshing; 20–100.

    An unknown type scores as the most complex known one.
    """
    proposal = candidate.proposal
    score = COMPLEXITY_BY_TYPE.get(proposal.proposal_type, min(COMPLEXITY_BY_TYPE.values()))
    score -= COMPLEXITY_PER_EXTRA_COMMAND * max(0, len(proposal.sql_commands) - 1)
    if proposal.needs_refresh:
        score -= COMPLEXITY_REFRESH_PENALTY
    return _clamp(score, *COMPLEXITY_RANGE)


def score_risk(candidate: Candidate) -> float:
    """By validated risk level; −5 per warning, +5 with rollback SQL; 0–100.

    The original rules also gave +5 for "validation steps": those are the brain's prose and
    nothing runs them, so they earn nothing (what is checked, the rows a migration keeps and
    the results a proposal returns, is checked by the workflow and gates the proposal).
    """
    validation, proposal = candidate.validation, candidate.proposal
    score = RISK_BY_LEVEL[validation.risk_level] - RISK_PER_WARNING * len(validation.warnings)
    if proposal.rollback_commands or validation.rollback_commands:
        score += RISK_ROLLBACK_BONUS
    return _clamp(score, *RISK_RANGE)


Scorer = Callable[[Candidate], float]
SCORERS: tuple[Scorer, ...] = (score_performance, score_storage, score_complexity, score_risk)
CRITERIA: tuple[str, ...] = tuple(scorer.__name__.removeprefix("score_") for scorer in SCORERS)
WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"performance": 0.5, "storage": 0.2, "complexity": 0.2, "risk": 0.1}
)
RANGES: Mapping[str, tuple[float, float]] = MappingProxyType(
    {"complexity": COMPLEXITY_RANGE, "risk": RISK_RANGE}
)  # after adjustments; others 0–100


# -- adjustments: (candidate) -> Adjustment | None ------------------------------------------
def index_write_cost(candidate: Candidate) -> Adjustment | None:
    """A new index slows every write. Measured where it can be (`measured_write_cost`: the
    workload's writes replayed in the fork, per day, against the read time saved per day);
    otherwise by the source's ratio: risk −min(15, 10 × writes_per_read) for index types."""
    measured = measured_write_cost(candidate)
    if measured is not None:
        return measured
    writes = candidate.writes_per_read
    if candidate.proposal.proposal_type not in INDEX_TYPES or writes <= 0:
        return None
    penalty = min(WRITE_COST_MAX, WRITE_COST_PER_WRITE_PER_READ * writes)
    return Adjustment(
        "risk", -penalty,
        f"risk −{_num(penalty)} for the write cost of a new index ({_num(writes)} writes per read,"
        f" the source's ratio: {_unmeasured(candidate.benchmark.write_cost)})",
    )


def _unmeasured(cost: WriteCost | None) -> str:
    """Why a measured write cost was not used (the ratio was)."""
    if cost is None:
        return "no write cost measured in the fork"
    if cost.statements == 0:
        return "no write replayed in the fork" + (f": {cost.note}" if cost.note else "")
    return ("the write cost measured in the fork has no rate a day "
            f"({cost.ms_per_write:.4f} ms a write; the statistics' window is unknown)")


def read_ms_saved_per_day(candidate: Candidate) -> float | None:
    """The query as given, measured before and after, times its observed calls a day (the
    task's WriteWorkload.reads_per_day); None when either is unknown."""
    return read_ms_saved_per_day_of(candidate.benchmark)


def read_ms_saved_per_day_of(benchmark: BenchmarkOutcome) -> float | None:
    cost, m = benchmark.write_cost, query_as_given(benchmark)
    if cost is None or cost.reads_per_day is None or m is None:
        return None
    return (m.baseline.median_ms - m.optimized.median_ms) * cost.reads_per_day


def measured_write_cost(candidate: Candidate) -> Adjustment | None:
    """The write cost measured in the fork, per day at the observed rate, against the read time
    the proposal saves per day: risk −min(15, 15 × cost ÷ saving) (an index whose writes cost
    as much as its reads save loses all 15). The cost is the replay's estimate (the median of
    paired runs' differences) even when no write's runs were apart (the rationale then says it
    is within the noise): as the batch nets it. A cost not above zero deducts nothing. None when
    there is no such measurement with both rates (the ratio decides: `index_write_cost`)."""
    cost = candidate.benchmark.write_cost
    saved = read_ms_saved_per_day(candidate)
    if cost is None or cost.ms_per_day is None or saved is None or cost.statements == 0:
        return None
    noise = "" if cost.significant else "; an estimate within the noise"
    figures = (f"measured in the fork: {cost.ms_per_write:.4f} ms more per write × "
               f"{_num(cost.writes_per_day or 0.0)} writes a day = {_num(cost.ms_per_day)} ms a day, against "
               f"{_num(saved)} ms a day saved on the reads ({_num(cost.reads_per_day or 0.0)} calls a day)")
    if cost.ms_per_day <= 0:
        return Adjustment("risk", 0.0,
                          f"no risk deducted for the write cost of a new index ({figures}{noise})")
    share = cost.ms_per_day / saved if saved > 0 else math.inf
    penalty = min(WRITE_COST_MAX, WRITE_COST_MAX * share)
    part = f"{_num(100 * share)} % of the reads' saving" if saved > 0 else "more than the reads save"
    return Adjustment("risk", -penalty,
                      f"risk −{_num(penalty)} for the write cost of a new index ({figures}: {part}{noise})")


def refresh_cost(candidate: Candidate) -> Adjustment | None:
    """A view is stale until refreshed, and each refresh costs its measured build time:
    complexity −min(20, 2 per second of build)."""
    if not candidate.proposal.needs_refresh and candidate.proposal.proposal_type != "materialized_view":
        return None
    seconds = candidate.benchmark.apply_s
    penalty = min(REFRESH_COST_MAX, REFRESH_COST_PER_S * seconds)
    if penalty <= 0:
        return None
    return Adjustment(
        "complexity", -penalty,
        f"complexity −{_num(penalty)}: stale until refreshed, each refresh takes about "
        f"{_num(seconds)} s (its build time in the fork)",
    )


ADJUSTMENTS: tuple[Callable[[Candidate], Adjustment | None], ...] = (index_write_cost, refresh_cost)


# -- gates: (candidate, breakdown) -> reason | None -----------------------------------------
def gate_slower(candidate: Candidate, breakdown: ScoreBreakdown) -> str | None:
    pct = candidate.benchmark.average_improvement_pct
    return f"slower on average ({_num(pct)} %)" if pct < 0 else None


def gate_min_improvement(candidate: Candidate, breakdown: ScoreBreakdown) -> str | None:
    pct = candidate.benchmark.average_improvement_pct
    if 0 <= pct < MIN_IMPROVEMENT_PCT:
        return f"improves only {_num(pct)} % on average (needs at least {_num(MIN_IMPROVEMENT_PCT)} %)"
    return None


def gate_risk(candidate: Candidate, breakdown: ScoreBreakdown) -> str | None:
    if breakdown.risk < MIN_RISK_SCORE:
        return f"risk score {_num(breakdown.risk)} is below {_num(MIN_RISK_SCORE)}"
    return None


def gate_valid(candidate: Candidate, breakdown: ScoreBreakdown) -> str | None:
    return None if candidate.validation.is_valid else "its SQL did not pass validation"


def gate_same_results(candidate: Candidate, breakdown: ScoreBreakdown) -> str | None:
    changed = [m.name for m in candidate.benchmark.measurements if not m.equivalent]
    return f"changes query results ({', '.join(changed)})" if changed else None


def gate_conclusive(candidate: Candidate, breakdown: ScoreBreakdown) -> str | None:
    measurements = candidate.benchmark.measurements
    if is_conclusive(measurements):
        return None
    wins = sum(beats_noise(m) for m in measurements)
    return (f"statistically inconclusive: {wins} of {len(measurements)} suite queries beat the noise"
            " and the baseline query did not")


def gate_family(candidate: Candidate, breakdown: ScoreBreakdown) -> str | None:
    """A fix serves the query with other values too: no answer cache, same rows, not slower."""
    problem = candidate.benchmark.family_problem
    return f"does not serve the query family: {problem}" if problem else None


Gate = Callable[[Candidate, ScoreBreakdown], str | None]
GATES: tuple[Gate, ...] = (
    gate_slower, gate_min_improvement, gate_risk, gate_valid, gate_same_results, gate_conclusive,
    gate_family,
)


# -- survivor gates: (candidate, breakdown, survivors) -> reason | None -----------------------
def gate_lone_survivor(candidate: Candidate, breakdown: ScoreBreakdown,
                       survivors: Sequence[Candidate]) -> str | None:
    if len(survivors) == 1 and breakdown.total <= LONE_SURVIVOR_MIN_TOTAL:
        return (f"as the lone surviving proposal it needs a total above {_num(LONE_SURVIVOR_MIN_TOTAL)}"
                f" (has {_num(breakdown.total)})")
    return None


SurvivorGate = Callable[[Candidate, ScoreBreakdown, Sequence[Candidate]], str | None]
SURVIVOR_GATES: tuple[SurvivorGate, ...] = (gate_lone_survivor,)


# -- statistics and DDL ------------------------------------------------------------------
def beats_noise(measurement: Measurement) -> bool:
    """Significant and faster."""
    return measurement.significant and measurement.improvement_pct > 0


def is_conclusive(measurements: Sequence[Measurement]) -> bool:
    """The "baseline" query beats the noise, or more than half of the measurements do."""
    if any(m.name == "baseline" and beats_noise(m) for m in measurements):
        return True
    return 2 * sum(beats_noise(m) for m in measurements) > len(measurements)


def query_as_given(benchmark: BenchmarkOutcome) -> Measurement | None:
    """The figure of the query as the user wrote it: the suite's "baseline" query."""
    return next((m for m in benchmark.measurements if m.name == "baseline"), None)


def speedup_range(measurement: Measurement) -> tuple[float, float, float] | None:
    """The figure's speed-up (baseline time over optimized time) read from its runs: (lowest,
    median, highest), the lowest being the fastest baseline run over the slowest optimized
    run. None when the runs' extremes were not recorded."""
    b, o = measurement.baseline, measurement.optimized
    if b.min_ms is None or b.max_ms is None or o.min_ms is None or o.max_ms is None:
        return None
    return (max(b.min_ms, _MIN_MS) / max(o.max_ms, _MIN_MS),
            max(b.median_ms, _MIN_MS) / max(o.median_ms, _MIN_MS),
            max(b.max_ms, _MIN_MS) / max(o.min_ms, _MIN_MS))


def clearly_faster(a: Candidate, b: Candidate) -> bool:
    """Whether `a` was measured clearly faster than `b` on the query as given: both return
    its rows, `a`'s speed-up interval lies above `b`'s and its median speed-up is at least
    DOMINANCE_MIN_RATIO times `b`'s, DRIFT_RATIO times when either baseline reused runs made
    earlier in the task (see the module's notes)."""
    ma, mb = query_as_given(a.benchmark), query_as_given(b.benchmark)
    if ma is None or mb is None or not (ma.equivalent and mb.equivalent):
        return False
    ra, rb = speedup_range(ma), speedup_range(mb)
    if ra is None or rb is None:
        return False
    needed = DRIFT_RATIO if ma.baseline.reused or mb.baseline.reused else DOMINANCE_MIN_RATIO
    return ra[0] > rb[2] and ra[1] >= needed * rb[1] and serves_family_as_well(a, b)


def family_speedups(benchmark: BenchmarkOutcome) -> dict[str, float]:
    """The median speed-up of each other parameter value timed on both sides, by its label."""
    return {check.label: max(check.baseline.median_ms, _MIN_MS) / max(check.optimized.median_ms, _MIN_MS)
            for check in benchmark.parameter_checks
            if check.baseline is not None and check.optimized is not None}


def serves_family_clearly_better(b: Candidate, a: Candidate) -> bool:
    """Whether `b` serves the query's other parameter values clearly better than `a`: on some
    value timed for both, `b`'s median speed-up is DRIFT_RATIO times `a`'s or more (the two
    were measured in different forks, possibly minutes apart), and on none is `a`'s that far
    above `b`'s. It ranks `b` above `a` however fast `a` is on the query as given: a design
    that holds only for today's literals (a partial index on the query's constant, where `b`
    speeds up every value) never wins over one that serves the family."""
    mine, theirs = family_speedups(a.benchmark), family_speedups(b.benchmark)
    common = mine.keys() & theirs.keys()
    return (any(theirs[label] >= DRIFT_RATIO * mine[label] for label in common)
            and not any(mine[label] >= DRIFT_RATIO * theirs[label] for label in common))


def serves_family_as_well(a: Candidate, b: Candidate) -> bool:
    """Whether `a` serves the query's other parameter values about as well as `b`: on no value
    timed for both is `b`'s median speed-up DOMINANCE_MIN_RATIO times `a`'s or more, and `a`'s
    average over the suite and the family (`family_improvement_pct`) is at most
    FAMILY_SLACK_PCT points below `b`'s. A design that is faster only for the query's own
    literals (a partial index on today's constant, where another design speeds up every value)
    is then not *clearly faster*: the seed's total, which scores the whole family, decides."""
    mine, theirs = family_speedups(a.benchmark), family_speedups(b.benchmark)
    if any(theirs[label] >= DOMINANCE_MIN_RATIO * mine[label] for label in mine.keys() & theirs.keys()):
        return False
    return (a.benchmark.family_improvement_pct
            >= b.benchmark.family_improvement_pct - FAMILY_SLACK_PCT)


_QUOTED = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*")""")  # literals and quoted names keep their case
_SPACE = re.compile(r"\s+")
_AROUND_PUNCT = re.compile(r"\s*([(),=<>])\s*")
_DROPPED_WORDS = re.compile(r"\b(?:concurrently|if not exists)\b\s*")
_INDEX_NAME = re.compile(r'^create (unique )?index (?:(?!on\b)(?:"(?:[^"]|"")*"|\S+) )?on\b')
_NOT_DDL = re.compile(r"^(?:analyze|vacuum)\b")


def normalize_ddl(statement: str) -> str:
    """Lower-case, one space, no index name, no IF NOT EXISTS / CONCURRENTLY / USING btree.

    `CREATE INDEX a ON orders (user_id)` and `create index concurrently b on orders(user_id)`
    both become `create index on orders(user_id)`. String literals and quoted names are kept
    as written; spaces around ( ) , = < > are dropped.
    """
    parts = _QUOTED.split(statement.strip().rstrip(";").strip())
    for i in range(0, len(parts), 2):  # the even parts are outside quotes
        text = _DROPPED_WORDS.sub("", _SPACE.sub(" ", parts[i].lower()))
        parts[i] = _AROUND_PUNCT.sub(r"\1", text)
    text = "".join(parts).strip().replace(" using btree(", "(")
    return _INDEX_NAME.sub(r"create \1index on", text)


def ddl_signature(proposal: OptimizationProposal) -> frozenset[str]:
    """The statements of a proposal as the validator read them (`Fact.canonical`: no index name,
    CONCURRENTLY or IF NOT EXISTS, comments, case or spacing); ANALYZE changes no schema and is
    left out. A command the validator refused counts as written (`normalize_ddl`; VACUUM left out)."""
    created = creates(proposal)
    read = {fact.statement for fact in created.commands}
    signature = {fact.canonical for fact in created.commands
                 if not (isinstance(fact, Change) and fact.kind == "analyze")}
    refused = (normalize_ddl(s) for s in proposal.sql_commands if s not in read)
    return frozenset(s for s in (*signature, *refused) if s and not _NOT_DDL.match(s))


# -- the decision ------------------------------------------------------------------------
def decide(outcomes: Sequence[AgentOutcome], weights: Mapping[str, float] | None = None) -> ConsensusDecision:
    """Score every measured proposal, apply the gates, rank, and explain the result.

    Raises ValueError for weights without exactly the keys of CRITERIA, with a negative or
    non-finite weight, or not summing to 1; and for two outcomes of the same agent.
    """
    used = check_weights(weights)
    agents = [o.agent for o in outcomes]
    duplicates = sorted({a for a in agents if agents.count(a) > 1})
    if duplicates:
        raise ValueError(f"more than one outcome for agent(s): {', '.join(duplicates)}")

    candidates = [c for c in map(_candidate, outcomes) if c is not None]
    adjustments = {c.agent: [a for a in (adjust(c) for adjust in ADJUSTMENTS) if a is not None]
                   for c in candidates}
    scores = {c.agent: _breakdown(c, used, adjustments[c.agent]) for c in candidates}
    for c in candidates:
        reasons = tuple(r for r in (gate(c, scores[c.agent]) for gate in GATES) if r is not None)
        scores[c.agent] = _disqualify(scores[c.agent], reasons)
    survivors = [c for c in candidates if not scores[c.agent].disqualified]
    for c in survivors:
        b = scores[c.agent]
        reasons = tuple(r for r in (gate(c, b, survivors) for gate in SURVIVOR_GATES) if r is not None)
        scores[c.agent] = _disqualify(b, reasons)

    qualified = [c for c in candidates if not scores[c.agent].disqualified]
    beaten = {c.agent: sum(clearly_faster(other, c) or serves_family_clearly_better(other, c)
                           for other in qualified if other is not c)
              for c in candidates}
    ranked = sorted(candidates, key=lambda c: _rank_key(c, scores[c.agent], beaten[c.agent]))
    winner = ranked[0] if ranked and not scores[ranked[0].agent].disqualified else None
    agreeing = _agreeing(winner, outcomes)
    confidence, why_confident = _confidence(winner, ranked, scores, agreeing)
    rationale = _rationale(outcomes, winner, _Ranked(ranked, scores, used, adjustments), why_confident)
    return ConsensusDecision(
        winner=winner.agent if winner else None,
        scores=MappingProxyType(scores),
        ranking=tuple(c.agent for c in ranked),
        rationale=rationale,
        confidence=confidence,
    )


def score(outcome: AgentOutcome, weights: Mapping[str, float] | None = None) -> ScoreBreakdown | None:
    """One measured outcome judged on its own (scores, adjustments, gates); None if unscored.

    An agent uses it to keep the best of the candidates it measured.
    """
    candidate = _candidate(outcome)
    if candidate is None:
        return None
    adjustments = [a for a in (adjust(candidate) for adjust in ADJUSTMENTS) if a is not None]
    breakdown = _breakdown(candidate, check_weights(weights), adjustments)
    reasons = tuple(r for r in (gate(candidate, breakdown) for gate in GATES) if r is not None)
    return _disqualify(breakdown, reasons)


def check_weights(weights: Mapping[str, float] | None) -> Mapping[str, float]:
    """The weights to use: WEIGHTS, or an override with exactly the same keys summing to 1."""
    if weights is None:
        return WEIGHTS
    if set(weights) != set(CRITERIA):
        raise ValueError(f"weights need exactly the keys {', '.join(CRITERIA)};"
                         f" got {', '.join(sorted(weights))}")
    values = {k: float(weights[k]) for k in CRITERIA}
    bad = [k for k, v in values.items() if not math.isfinite(v) or v < 0]
    if bad:
        raise ValueError(f"weights must be finite and not negative: {', '.join(bad)}")
    total = sum(values.values())
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise ValueError(f"weights must sum to 1, not {total:g}")
    return MappingProxyType(values)


def _candidate(outcome: AgentOutcome) -> Candidate | None:
    if outcome.status != "ok" or not (outcome.proposal and outcome.validation and outcome.benchmark):
        return None
    return Candidate(outcome, outcome.proposal, outcome.validation, outcome.benchmark)


def _breakdown(candidate: Candidate, weights: Mapping[str, float],
               adjustments: Sequence[Adjustment]) -> ScoreBreakdown:
    values = {name: scorer(candidate) for name, scorer in zip(CRITERIA, SCORERS, strict=True)}
    for adjustment in adjustments:
        low, high = RANGES.get(adjustment.criterion, (0.0, 100.0))
        values[adjustment.criterion] = _clamp(values[adjustment.criterion] + adjustment.delta, low, high)
    total = round(sum(weights[name] * value for name, value in values.items()), 2)
    fields: dict[str, Any] = dict(values)
    return ScoreBreakdown(**fields, total=total)


def _disqualify(breakdown: ScoreBreakdown, reasons: tuple[str, ...]) -> ScoreBreakdown:
    return replace(breakdown, disqualified=breakdown.disqualified + reasons) if reasons else breakdown


def _preference(agent: AgentKey) -> int:
    return AGENT_PREFERENCE.index(agent) if agent in AGENT_PREFERENCE else len(AGENT_PREFERENCE)


def _rank_key(candidate: Candidate, b: ScoreBreakdown, beaten: int
              ) -> tuple[bool, int, float, float, float, int, str]:
    """Qualified first; fewer qualified proposals clearly faster than it (`beaten`); higher
    total; simpler change; less storage; AGENT_PREFERENCE; name."""
    return (bool(b.disqualified), beaten, -b.total, -b.complexity,
            round(candidate.benchmark.storage_delta_mb, 2), _preference(candidate.agent), candidate.agent)


def _runner_up(winner: Candidate, ranked: Sequence[Candidate],
               scores: Mapping[AgentKey, ScoreBreakdown]) -> Candidate | None:
    """The best qualified proposal after the winner (who ranks first)."""
    return next((c for c in ranked if c is not winner and not scores[c.agent].disqualified), None)


def _agreeing(winner: Candidate | None, outcomes: Sequence[AgentOutcome]) -> tuple[AgentKey, ...]:
    """Other agents whose proposal (whatever became of it) has the winner's DDL, normalized."""
    if winner is None:
        return ()
    signature = ddl_signature(winner.proposal)
    if not signature:
        return ()
    return tuple(o.agent for o in outcomes
                 if o.agent != winner.agent and o.proposal and ddl_signature(o.proposal) == signature)


def _confidence(winner: Candidate | None, ranked: Sequence[Candidate],
                scores: Mapping[AgentKey, ScoreBreakdown], agreeing: Sequence[AgentKey]) -> tuple[float, str]:
    """0 without a winner; else

        0.30 + 0.30 · margin_term + 0.25 · significance_term (+ 0.15 with agreement), clamped to 0–1

    margin_term = clamp((winner total − runner-up total) / 20, 0, 1), the runner-up being the
    best other qualified proposal; without one, the bar a lone survivor had to clear (60); 1
    when the winner is clearly faster than the runner-up (its lead is measured).
    significance_term = the share of the winner's measurements that beat the noise.
    """
    if winner is None:
        return 0.0, ""
    total = scores[winner.agent].total
    rival = _runner_up(winner, ranked, scores)
    bar = scores[rival.agent].total if rival else LONE_SURVIVOR_MIN_TOTAL
    faster = rival is not None and clearly_faster(winner, rival)
    margin_term = 1.0 if faster else _clamp((total - bar) / MARGIN_FOR_FULL_CONFIDENCE, 0.0, 1.0)
    measurements = winner.benchmark.measurements
    wins = sum(beats_noise(m) for m in measurements)
    significance_term = wins / len(measurements) if measurements else 0.0
    value = CONFIDENCE_BASE + CONFIDENCE_MARGIN * margin_term + CONFIDENCE_SIGNIFICANCE * significance_term
    if agreeing:
        value += CONFIDENCE_AGREEMENT
    value = round(_clamp(value, 0.0, 1.0), 4)
    over = rival.agent if rival else f"the lone-survivor bar of {_num(LONE_SURVIVOR_MIN_TOTAL)}"
    lead = "measured clearly faster than" if faster else f"margin {_num(total - bar)} over"
    why = (f"Confidence {_num(value)}: {lead} {over},"
           f" {wins} of {len(measurements)} suite queries beat the noise"
           + (f", {' and '.join(agreeing)} proposed equivalent DDL" if agreeing else "") + ".")
    return value, why


# -- the rationale -----------------------------------------------------------------------
_TYPE_WORDS: Mapping[str, str] = MappingProxyType({
    "index": "index", "partial_index": "partial index", "composite_index": "composite index",
    "query_rewrite": "query rewrite", "materialized_view": "materialized view",
    "partitioning": "partitioning", "denormalization": "denormalization",
    "statistics": "extended statistics", "settings": "per-query setting",
})


@dataclass(frozen=True)
class _Ranked:
    """What the rationale explains, passed whole: the measured candidates in rank order, their
    score breakdowns, the weights they were scored with and each one's adjustments."""

    candidates: Sequence[Candidate]
    scores: Mapping[AgentKey, ScoreBreakdown]
    weights: Mapping[str, float]
    adjustments: Mapping[AgentKey, Sequence[Adjustment]]


def _rationale(outcomes: Sequence[AgentOutcome], winner: Candidate | None, judged: _Ranked,
               why_confident: str) -> tuple[str, ...]:
    ranked, scores, weights = judged.candidates, judged.scores, judged.weights
    lines: list[str] = []
    if winner is not None:
        lines.append(_winner_sentence(winner, ranked, scores, weights))
    elif not outcomes:
        lines.append("No winner: no agent returned an outcome.")
    elif not ranked:
        lines.append("No winner: no proposal was measured.")
    else:
        lines.append("No winner: every measured proposal was disqualified.")
    for c in ranked:
        if c is not winner:
            lines.append(_loser_sentence(c, winner, ranked, scores, weights))
    for c in ranked:
        lines.extend(f"{c.agent}: {a.reason}." for a in judged.adjustments[c.agent])
    scored = {c.agent for c in ranked}
    lines.extend(_unscored_sentence(o) for o in outcomes if o.agent not in scored)
    if why_confident:
        lines.append(why_confident)
    return tuple(lines)


def _summary(c: Candidate, b: ScoreBreakdown) -> str:
    pct = c.benchmark.average_improvement_pct
    speed = f"{_num(pct)} % faster on average" if pct >= 0 else f"{_num(-pct)} % slower on average"
    kind = _TYPE_WORDS.get(c.proposal.proposal_type, c.proposal.proposal_type)
    commands = len(c.proposal.sql_commands)
    return (f"{speed}, {_num(c.benchmark.storage_delta_mb)} MB of storage, {kind}"
            f" ({commands} command{'s' if commands != 1 else ''}, complexity {_num(b.complexity)})")


def _winner_sentence(winner: Candidate, ranked: Sequence[Candidate],
                     scores: Mapping[AgentKey, ScoreBreakdown], weights: Mapping[str, float]) -> str:
    b = scores[winner.agent]
    times = _times(winner)
    head = (f"{winner.agent} wins with {_num(b.total)}: {times + ', ' if times else ''}"
            f"{_summary(winner, b)}")
    rival = _runner_up(winner, ranked, scores)
    if rival is None:
        return f"{head}; it is the only proposal that passed every gate."
    r = scores[rival.agent]
    if clearly_faster(winner, rival):
        outweighs = (f", which outweighs {rival.agent}'s higher total ({_num(r.total)} vs {_num(b.total)})"
                     if r.total > b.total else "")
        return (f"{head}; it is measured clearly faster than {rival.agent}"
                f" ({_versus(winner, rival)}){outweighs}.")
    if serves_family_clearly_better(winner, rival):
        outweighs = (f", which outweighs {rival.agent}'s higher total ({_num(r.total)} vs {_num(b.total)})"
                     if r.total > b.total else "")
        return (f"{head}; it serves the query's other parameter values clearly better than"
                f" {rival.agent} ({_family_versus(winner, rival)}){outweighs}.")
    if b.total == r.total:
        return (f"{head}; it ties with {rival.agent} and wins the tie-break on"
                f" {_tie_break(winner, rival, scores)}.")
    criterion = _deciding(b, r, weights)
    return (f"{head}; it leads {rival.agent} by {_num(b.total - r.total)}, most on {criterion}"
            f" ({_num(getattr(b, criterion))} vs {_num(getattr(r, criterion))}).")


def _loser_sentence(c: Candidate, winner: Candidate | None, ranked: Sequence[Candidate],
                    scores: Mapping[AgentKey, ScoreBreakdown], weights: Mapping[str, float]) -> str:
    b = scores[c.agent]
    if b.disqualified:
        return f"{c.agent} cannot win ({_num(b.total)}; {_summary(c, b)}): {'; '.join(b.disqualified)}."
    assert winner is not None  # a qualified proposal ranks below the winner only
    w = scores[winner.agent]
    faster = next((o for o in ranked if o is not c and not scores[o.agent].disqualified
                   and clearly_faster(o, c)), None)
    if faster is not None and (faster is winner or b.total >= w.total):
        though = ""
        if b.total >= w.total:
            though = (f", though its total is {'higher' if b.total > w.total else 'no lower'}"
                      f" ({_num(b.total)} vs {_num(w.total)} for {winner.agent})")
        return (f"{c.agent} loses with {_num(b.total)} ({_summary(c, b)}): {faster.agent} is measured"
                f" clearly faster ({_versus(faster, c)}){though}.")
    if serves_family_clearly_better(winner, c):
        return (f"{c.agent} loses with {_num(b.total)} ({_summary(c, b)}): {winner.agent} serves the"
                f" query's other parameter values clearly better ({_family_versus(winner, c)}).")
    if b.total == w.total:
        return (f"{c.agent} ties with {winner.agent} at {_num(b.total)} and loses the tie-break on"
                f" {_tie_break(winner, c, scores)}.")
    criterion = _deciding(w, b, weights)
    return (f"{c.agent} loses with {_num(b.total)}, {_num(w.total - b.total)} below {winner.agent}"
            f" ({_summary(c, b)}); the largest gap is {criterion}"
            f" ({_num(getattr(b, criterion))} vs {_num(getattr(w, criterion))}).")


def _times(c: Candidate) -> str:
    """The query as given before and after, and the ratio: "256 ms → 0.07 ms (3,657×)"; a
    baseline that hit its time cap is a lower bound: "≥ 60 s (lower bound) → 8.2 ms (≥ 7,317×)"."""
    m = query_as_given(c.benchmark)
    if m is None:
        return ""
    before, after = m.baseline.median_ms, m.optimized.median_ms
    at_least = "≥ " if m.baseline.lower_bound else ""
    note = " (lower bound)" if m.baseline.lower_bound else ""
    ratio = max(before, _MIN_MS) / max(after, _MIN_MS)
    return (f"the query as given {at_least}{_duration(before)}{note} → {_duration(after)}"
            f" ({at_least}{_ratio(ratio)})")


def _versus(faster: Candidate, slower: Candidate) -> str:
    """Two proposals' times of the query as given, with their runs' range and speed-ups:
    "0.03 ms vs 0.07 ms (runs 0.028–0.032 ms vs 0.061–0.08 ms; 8,533× vs 3,657×)"."""
    mf, ms = query_as_given(faster.benchmark), query_as_given(slower.benchmark)
    assert mf is not None and ms is not None  # clearly_faster needs both
    rf, rs = speedup_range(mf), speedup_range(ms)
    assert rf is not None and rs is not None
    return (f"{_duration(mf.optimized.median_ms)} vs {_duration(ms.optimized.median_ms)} on the query as"
            f" given, runs {_span(mf)} vs {_span(ms)}; {_ratio(rf[1])} vs {_ratio(rs[1])} faster than before")


def _family_versus(better: Candidate, worse: Candidate) -> str:
    """The other parameter value where `better` leads `worse` most, in their speed-ups:
    "status = 'completed': 75× vs 1.0× faster than before"."""
    mine, theirs = family_speedups(better.benchmark), family_speedups(worse.benchmark)
    label = max(sorted(mine.keys() & theirs.keys()), key=lambda k: mine[k] / theirs[k])
    return f"{label}: {_ratio(mine[label])} vs {_ratio(theirs[label])} faster than before"


def _span(m: Measurement) -> str:
    o = m.optimized
    assert o.min_ms is not None and o.max_ms is not None
    return f"{_duration(o.min_ms)}–{_duration(o.max_ms)}"


def _duration(ms: float) -> str:
    """Three significant digits: 0.0312 ms, 0.07 ms, 256 ms, 1.23 s, 60 s, 1,234 s."""
    if ms >= 1_000_000:
        return f"{ms / 1000:,.0f} s"
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms"


def _ratio(ratio: float) -> str:
    return f"{ratio:,.0f}×" if ratio >= 100 else f"{ratio:.3g}×"


def _deciding(better: ScoreBreakdown, worse: ScoreBreakdown, weights: Mapping[str, float]) -> str:
    """The criterion that contributes most, weighted, to `better` leading `worse`."""
    return max(CRITERIA, key=lambda k: weights[k] * (getattr(better, k) - getattr(worse, k)))


def _tie_break(first: Candidate, second: Candidate, scores: Mapping[AgentKey, ScoreBreakdown]) -> str:
    a, b = scores[first.agent], scores[second.agent]
    if a.complexity != b.complexity:
        return f"complexity (the simpler change: {_num(a.complexity)} vs {_num(b.complexity)})"
    sa, sb = round(first.benchmark.storage_delta_mb, 2), round(second.benchmark.storage_delta_mb, 2)
    if sa != sb:
        return f"storage ({_num(sa)} MB vs {_num(sb)} MB)"
    model = AGENTS[first.agent].model if first.agent in AGENTS else first.agent
    return f"agent preference ({model} first)"


def _unscored_sentence(outcome: AgentOutcome) -> str:
    error = outcome.error or "no error recorded"
    if outcome.status == "failed":
        return f"{outcome.agent} failed: {error}."
    if outcome.status == "rejected":
        return f"{outcome.agent} was rejected: {error}."
    missing = [name for name, value in (("proposal", outcome.proposal), ("validation", outcome.validation),
                                        ("benchmark", outcome.benchmark)) if value is None]
    return f"{outcome.agent} was not scored: no {', no '.join(missing)}."


# -- small helpers -----------------------------------------------------------------------
def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def _num(value: float) -> str:
    """At most two decimals, no trailing zeros: 88.5, 3.1, 97, -0.01."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text
