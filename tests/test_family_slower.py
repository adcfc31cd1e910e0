"""A design is called slower than the original for another parameter value (which disqualifies
it: the family gate) only when a second figure, all runs fresh and alternating, agrees: the first
rests on few runs a side or on baseline runs reused from earlier in the task, and on a busy
server drift alone separated them (partial_rare_status lost its winner that way, one run the
plain index, the next the partial one, for a value neither index can serve)."""

from __future__ import annotations

import pytest

from afs.bench import Earlier, Reuse, Sample, Suites, benchmark
from afs.config import Measuring
from afs.db import Connection
from afs.models import EstimatedImpact, FamilyQuery, OptimizationProposal, QueryVariant

QUERY = "SELECT id, total_amount FROM orders WHERE user_id = 42"
# another value of the query, and a scan the proposal's index cannot serve at all
OTHER = "SELECT count(*) FROM orders WHERE total_amount > 0 AND user_id > 0"


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_value_is_slower_only_when_fresh_alternating_runs_agree(fork_conn: Connection) -> None:
    # the task's record of that value's baseline runs says it took 1 µs: as if the server had
    # been idle then and is busy now, every run after the change is far beyond them
    reuse = Reuse(baselines={OTHER: tuple(Sample(0.001, 1) for _ in range(5))})
    proposal = OptimizationProposal(
        agent="gemini25flash", proposal_type="index",  # type: ignore[arg-type]  # a plain string
        sql_commands=("CREATE INDEX fam_slower_uid ON orders (user_id)",), rollback_commands=(),
        rationale="test", estimated_impact=EstimatedImpact(50, 1, "low", "low"))
    outcome = await benchmark(
        fork_conn,
        Suites((QueryVariant("baseline", QUERY, ordered=False, exact=True),), ("orders",),
               family=(FamilyQuery("another value", OTHER, OTHER),)),
        proposal, policy=Measuring(runs=5, min_runs=3), earlier=Earlier(reuse=reuse))
    (check,) = outcome.parameter_checks
    assert check.equivalent
    assert not check.slower, check
    assert outcome.family_problem is None
    # the figure it rests on is the fresh one: the reused 1 µs runs are not among its baseline runs
    assert check.baseline is not None and check.baseline.reused == 0 and check.baseline.min_ms is not None
    assert check.baseline.min_ms > 0.01
