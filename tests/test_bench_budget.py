"""Issue 25 (corpus time): a measurement whose share of the budget is spent makes no more runs, and
a value of the query whose original alone takes more than its share of the budget is paid for
once per task, not once per proposal (lateral_top_n spent minutes on two such values)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import trio
import trio.testing

from afs.bench import (
    Budget,
    Drift,
    Earlier,
    Reuse,
    Runners,
    Sample,
    StopRule,
    Suites,
    TaskMeasurements,
    Warm,
    _measure,
    benchmark,
    family_cap_ms,
    measure_before,
    settled,
)
from afs.config import Measuring
from afs.db import Connection, open_connection
from afs.errors import ProposalFailedError
from afs.models import BenchmarkOutcome, EstimatedImpact, FamilyQuery, OptimizationProposal, QueryVariant

RULE = StopRule(min_runs=3, max_runs=5, cut_short=True)  # the rule of the query with other values
SUITE_RULE = StopRule(min_runs=3, max_runs=5)


class SlowRuns:
    """Runs of a figure that take their time on trio's (mock) clock, in the order asked for."""

    def __init__(self, baseline: Sequence[float], candidate: Sequence[float]) -> None:
        self.order: list[str] = []
        self._b, self._c = iter(baseline), iter(candidate)

    async def _run(self, ms: float, side: str) -> Sample:
        self.order.append(side)
        await trio.sleep(ms / 1000)
        return Sample(ms, 1000)

    async def baseline(self) -> Sample:
        return await self._run(next(self._b), "b")

    async def candidate(self) -> Sample:
        return await self._run(next(self._c), "c")


async def test_a_figure_whose_share_of_the_budget_is_spent_makes_no_more_runs(
        autojump_clock: trio.testing.MockClock) -> None:
    # a value of ~50 s, one run of it made ahead; 60 s of budget for 4 figures (15 s each): the
    # candidate's first run spends the share, and no fresh baseline run tops the prior up
    prior = (Sample(50_000.0, 1000),)
    close = SlowRuns([51_000.0] * 5, [49_000.0] * 5)
    figure = await _measure(Runners(close.baseline, close.candidate), RULE, Budget(60.0, 4),
                            prior=prior, drift=Drift(), warm=Warm(True, True))
    assert close.order == ["c"]
    assert figure.stopped == "budget" and figure.reused == 1
    assert [s.ms for s in figure.baseline] == [50_000.0] and [s.ms for s in figure.candidate] == [49_000.0]
    assert not settled(figure, RULE)  # one run a side, 2 % apart: no verdict either way
    # a candidate 3x slower than the prior is far beyond the noise: its verdict stands
    far = SlowRuns([], [150_000.0])
    figure = await _measure(Runners(far.baseline, far.candidate), RULE, Budget(60.0, 4),
                            prior=prior, drift=Drift(), warm=Warm(True, True))
    assert far.order == ["c"] and figure.stopped == "budget" and settled(figure, RULE)
    # the suite's figure still tops its baseline up to the minimum, spent budget or not
    suite = SlowRuns([51_000.0] * 5, [49_000.0] * 5)
    figure = await _measure(Runners(suite.baseline, suite.candidate), SUITE_RULE, Budget(60.0, 4),
                            prior=prior, drift=Drift(), warm=Warm(True, True))
    assert suite.order == ["c", "b", "b"] and len(figure.baseline) == 3


async def test_within_its_share_a_close_figure_still_gets_its_baseline_runs(
        autojump_clock: trio.testing.MockClock) -> None:
    prior = (Sample(50.0, 1000),)  # runs of 50 ms: the budget's share (15 s) is never spent
    close = SlowRuns([51.0, 49.5], [50.2, 50.0, 50.4])
    figure = await _measure(Runners(close.baseline, close.candidate), RULE, Budget(60.0, 4),
                            prior=prior, drift=Drift(), warm=Warm(True, True))
    assert close.order == ["c", "b", "b", "c", "c"] and len(figure.baseline) == 3
    assert figure.stopped == "overlap" and settled(figure, RULE)


def test_a_values_cap_is_its_share_of_the_budget_below_the_statement_timeout() -> None:
    policy = Measuring(budget_s=60.0, statement_timeout_ms=60_000)
    assert family_cap_ms(policy, 4) == 15_000
    assert family_cap_ms(policy, 1) is None  # the whole budget: the statement timeout is shorter
    assert family_cap_ms(Measuring(budget_s=60.0, statement_timeout_ms=0), 1) == 60_000


SCHEMA = ("CREATE TABLE t (id integer PRIMARY KEY, k integer NOT NULL);"
          " INSERT INTO t SELECT i, i % 10 FROM generate_series(1, 1000) i;"
          " CREATE SEQUENCE probe_runs")
# counts its calls (a sequence is not rolled back), then takes far longer than any cap here
PROBE = ("CREATE FUNCTION slow_probe() RETURNS integer LANGUAGE plpgsql VOLATILE AS"
         " $$ BEGIN PERFORM nextval('probe_runs'); PERFORM pg_sleep(30); RETURN 1; END $$")
QUERY = "SELECT count(*) FROM t WHERE k = 1"
SLOW_VALUE = "SELECT slow_probe()"
POLICY = Measuring(budget_s=0.4)  # 0.2 s a figure for a query and one value: far below 30 s


def index(sql: str) -> OptimizationProposal:
    return OptimizationProposal(agent="gemini25flash", proposal_type="index", sql_commands=(sql,),
                                rollback_commands=(), rationale="test",
                                estimated_impact=EstimatedImpact(50, 1, "low", "low"))


async def probe_runs(conn: Connection) -> int:
    return int(await conn.fetchval("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM probe_runs"))


async def test_a_value_past_its_share_of_the_budget_is_run_once_per_task(
        scratch_database: Callable[[str, str], str]) -> None:
    dsn = scratch_database("afs_budget_", SCHEMA)
    suite = (QueryVariant("baseline", QUERY, ordered=False, exact=True),)
    member = FamilyQuery("slow value", SLOW_VALUE, SLOW_VALUE)
    cap = family_cap_ms(POLICY, 2)
    assert cap == 200
    async with open_connection(dsn) as conn:
        await conn.execute(PROBE)
        # measured ahead: the value's original stops at its cap, is recorded, and the query is measured
        reuse = Reuse()
        assert await measure_before(conn, suite, (SLOW_VALUE,), reuse, runs=1, family_cap=cap) == 1
        assert reuse.slow_family == {SLOW_VALUE: False} and QUERY in reuse.baselines
        assert await probe_runs(conn) == 1
        assert await measure_before(conn, suite, (SLOW_VALUE,), reuse, runs=1, family_cap=cap) == 0
        # a proposal's benchmark takes that from the task: the value is not run again
        outcome = await benchmark(conn, Suites(suite, ("t",), family=(member,)),
                                  index("CREATE INDEX t_k1 ON t (k)"), policy=POLICY,
                                  earlier=Earlier(reuse=reuse.for_fork()))
        (check,) = outcome.parameter_checks
        assert check.note.startswith("not checked: the original exceeds") and not check.slower
        assert await probe_runs(conn) == 1
        await conn.execute("DROP INDEX t_k1")
        # without a run ahead, the first benchmark finds it (under the cap) and the next does not
        fresh = Reuse()
        for name in ("t_k2", "t_k3"):
            outcome = await benchmark(conn, Suites(suite, ("t",), family=(member,)),
                                      index(f"CREATE INDEX {name} ON t (k)"), policy=POLICY,
                                      earlier=Earlier(reuse=fresh.for_fork()))
            (check,) = outcome.parameter_checks
            assert "share of the budget" in check.note
            await conn.execute(f"DROP INDEX {name}")
        assert fresh.slow_family == {SLOW_VALUE: False} and await probe_runs(conn) == 2


async def test_a_measurement_that_runs_out_of_its_time_fails_its_waiters_at_once() -> None:
    # the owner's run stops at its own limit (trio.TooSlowError from inside it): the agent waiting
    # for it is told so at once instead of measuring the same design again in its own time
    shared = TaskMeasurements()
    design = index("CREATE INDEX t_k ON t (k)")
    started, waited = trio.Event(), trio.Event()
    runs: list[str] = []

    async def owners_run() -> BenchmarkOutcome:
        runs.append("owner")
        started.set()
        await waited.wait()
        with trio.fail_after(0):
            await trio.sleep(1)
        raise AssertionError("the limit stops it")

    async def waiters_run() -> BenchmarkOutcome:
        runs.append("waiter")
        raise AssertionError("the waiter must not measure it again")

    failures: dict[str, str] = {}

    async def owner() -> None:
        with pytest.raises(trio.TooSlowError):
            await shared.measure("gemini25pro", design, owners_run, lambda _: None)

    async def waiter() -> None:
        await started.wait()
        try:
            await shared.measure("gemini25flash", design, waiters_run, lambda _: waited.set())
        except ProposalFailedError as exc:
            failures["gemini25flash"] = str(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(owner)
        nursery.start_soon(waiter)
    assert runs == ["owner"]
    assert "did not finish within its time limit (by gemini25pro)" in failures["gemini25flash"]
    assert shared.taken("gemini20flash", design) is None  # nobody measures it; asking fails at once
    with pytest.raises(ProposalFailedError):
        await shared.measure("gemini20flash", design, waiters_run, lambda _: None)
