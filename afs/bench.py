"""The benchmark step: the suite before and after a proposal, in the same fork.

For every suite query: the result's row count and checksum, one warm-up run,
then N measured runs of server-side execution time and shared buffers
(hit + read), from `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON)`.

Where it can, baseline and candidate alternate run by run so drift hits both
alike: a proposal made only of named CREATE INDEX statements is hidden for a
baseline run inside a rolled-back transaction (`BEGIN; DROP INDEX …; <query>;
ROLLBACK`); a rewrite alternates with the original query. Otherwise (e.g.
partitioning) the baseline runs before the change and the candidate after.

Significance: with N runs per side, a difference is called real only when the
two samples do not overlap at all (every candidate run faster than every
baseline run, or the reverse: an exact Mann–Whitney test with U = 0, one-sided
p = 1/C(2N, N), 0.004 for N = 5) and the medians differ by at least 5 %.
Everything else is reported as inconclusive.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import pglast
import trio
from pglast import ast

from afs.db import Connection
from afs.errors import AfsError, DatabaseError
from afs.models import BenchmarkOutcome, Measurement, OptimizationProposal, QueryVariant, Timing
from afs.pg.names import quote_qualified
from afs.pg.plan import explained, shared_buffers
from afs.suite import result_checksum_sql

MB = 1048576.0
MIN_EFFECT = 0.05  # medians must differ by at least 5 % to count

_USER_RELATIONS_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_%%'
"""
_TABLES_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0) FROM unnest(%s::text[]) AS t
"""


class ApplyError(AfsError):
    """The proposal's SQL failed in the fork."""


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


def timing(samples: Sequence[Sample]) -> Timing:
    times = sorted(s.ms for s in samples)
    median = statistics.median(times)
    middle = min(samples, key=lambda s: abs(s.ms - median))
    return Timing(median_ms=round(median, 3), spread_ms=round((times[-1] - times[0]) / 2, 3),
                  runs=len(times), buffers=middle.buffers)


def significant(baseline: Sequence[Sample], optimized: Sequence[Sample]) -> bool:
    """Complete separation of the two samples and at least MIN_EFFECT between medians."""
    b = [s.ms for s in baseline]
    o = [s.ms for s in optimized]
    separated = max(o) < min(b) or max(b) < min(o)
    mb, mo = statistics.median(b), statistics.median(o)
    return separated and abs(mb - mo) >= MIN_EFFECT * max(mb, mo)


def hideable_indexes(proposal: OptimizationProposal) -> tuple[str, ...] | None:
    """Names of the indexes the proposal creates, if it creates nothing else."""
    names: list[str] = []
    for command in proposal.sql_commands:
        try:
            (raw,) = pglast.parse_sql(command)
        except Exception:
            return None
        stmt = raw.stmt
        if isinstance(stmt, ast.VacuumStmt) and not stmt.is_vacuumcmd:
            continue  # ANALYZE
        if not isinstance(stmt, ast.IndexStmt) or not stmt.idxname or stmt.relation is None:
            return None
        schema = stmt.relation.schemaname
        names.append(f"{schema}.{stmt.idxname}" if schema else stmt.idxname)
    return tuple(names) or None


async def _measure_pairs(
    run_baseline: Callable[[], Awaitable[Sample]],
    run_candidate: Callable[[], Awaitable[Sample]],
    runs: int,
) -> tuple[list[Sample], list[Sample]]:
    await run_baseline()  # warm-up, both sides
    await run_candidate()
    baseline: list[Sample] = []
    candidate: list[Sample] = []
    for i in range(runs):
        first, second = (run_baseline, run_candidate) if i % 2 == 0 else (run_candidate, run_baseline)
        a, b = await first(), await second()
        baseline.append(a if first is run_baseline else b)
        candidate.append(b if first is run_baseline else a)
    return baseline, candidate


async def _measure_alone(run: Callable[[], Awaitable[Sample]], runs: int) -> list[Sample]:
    await run()  # warm-up
    return [await run() for _ in range(runs)]


async def apply(conn: Connection, proposal: OptimizationProposal) -> None:
    for command in proposal.sql_commands:
        try:
            await conn.execute(command)
        except DatabaseError as exc:
            raise ApplyError(f"applying the proposal failed: {exc}") from exc


async def benchmark(
    conn: Connection,
    suite: Sequence[QueryVariant],
    proposal: OptimizationProposal,
    *,
    candidate_suite: Sequence[QueryVariant] | None = None,
    tables: Sequence[str],
    runs: int = 5,
    skipped: Sequence[str] = (),
) -> BenchmarkOutcome:
    """Measure `suite` before and `candidate_suite` (default: the same) after the proposal."""
    candidates = {v.name: v for v in (candidate_suite or suite)}
    pairs = [(v, candidates[v.name]) for v in suite if v.name in candidates]
    missing = [f"{v.name}: no equivalent query on the proposal's objects" for v in suite
               if v.name not in candidates]
    storage_before = float(await conn.fetchval(_TABLES_SIZE, (list(tables),)))
    relations_before = float(await conn.fetchval(_USER_RELATIONS_SIZE))

    hidden = hideable_indexes(proposal)
    rewrite = proposal.rewritten_query is not None
    # A rewrite may order ties differently: compare its results as multisets.
    ordered = {v.name: v.ordered and c.ordered and not rewrite for v, c in pairs}
    before_results = {v.name: await result_of(conn, v, ordered[v.name]) for v, _ in pairs}
    sequential_baseline: dict[str, list[Sample]] = {}
    if hidden is None and not rewrite:
        for variant, _ in pairs:
            async def run_before(v: QueryVariant = variant) -> Sample:
                return await run_once(conn, v.sql)
            sequential_baseline[variant.name] = await _measure_alone(run_before, runs)

    await apply(conn, proposal)
    relations_after = float(await conn.fetchval(_USER_RELATIONS_SIZE))

    measurements: list[Measurement] = []
    for variant, candidate in pairs:
        after = await result_of(conn, candidate, ordered[variant.name])
        before = before_results[variant.name]
        # a rewrite may cut a LIMIT at other rows (its order differs): compare counts there
        exact = variant.exact and candidate.exact and not (rewrite and variant.name == "limit")
        equivalent = before.rows == after.rows and (not exact or before.checksum == after.checksum)

        async def run_candidate(c: QueryVariant = candidate) -> Sample:
            return await run_once(conn, c.sql)

        if hidden is not None:
            async def run_hidden(v: QueryVariant = variant) -> Sample:
                return await _run_without(conn, hidden, v.sql)
            base, cand = await _measure_pairs(run_hidden, run_candidate, runs)
            note = "interleaved; baseline with the new indexes hidden in a rolled-back transaction"
        elif rewrite:
            async def run_original(v: QueryVariant = variant) -> Sample:
                return await run_once(conn, v.sql)
            base, cand = await _measure_pairs(run_original, run_candidate, runs)
            note = "interleaved; original query against the rewrite"
        else:
            base = sequential_baseline[variant.name]
            cand = await _measure_alone(run_candidate, runs)
            note = "baseline before the change, candidate after it"
        if not equivalent:
            note = (f"results differ: {before.rows} rows before, {after.rows} after"
                    + ("" if before.rows != after.rows else " (checksum differs)"))
        measurements.append(Measurement(
            name=variant.name, baseline=timing(base), optimized=timing(cand), rows=before.rows,
            equivalent=equivalent, significant=significant(base, cand), note=note))

    delta = max(0.0, relations_after - relations_before)
    return BenchmarkOutcome(
        measurements=tuple(measurements),
        storage_before_mb=round(storage_before / MB, 2),
        storage_after_mb=round((storage_before + delta) / MB, 2),
        skipped=(*skipped, *missing),
    )


async def _run_without(conn: Connection, indexes: Sequence[str], sql: str) -> Sample:
    """One run with `indexes` dropped inside a transaction that is rolled back."""
    await conn.execute("BEGIN")
    try:
        for name in indexes:
            await conn.execute(f"DROP INDEX {quote_qualified(name)}")
        return await run_once(conn, sql)
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")
