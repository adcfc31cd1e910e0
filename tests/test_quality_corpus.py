"""benchmarks/quality.py's parts: the measuring order, the corpus (its oracles checked at a small
scale in the sandbox, rolled back), the design count."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

from afs.db import Connection, open_connection
from afs.models import OptimizationProposal
from afs.sandbox.server import SandboxServer
from afs.suite import result_checksum_sql

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import quality  # type: ignore[import-not-found]  # noqa: E402
from quality_cases import CASES, render, scaled  # type: ignore[import-not-found]  # noqa: E402


def test_every_configuration_follows_each_other_one() -> None:
    configs = [quality.Config(label, (), "SELECT 1") for label in ("baseline", "afs", "oracle")]
    order = [c.label for c in quality.rounds(configs, 6)]
    assert sorted(order) == sorted(["baseline", "afs", "oracle"] * 6)
    after = {(a, b) for a, b in itertools.pairwise(order) if a != b}
    # a fixed rotation puts afs after baseline every round (a slow scan cools its caches)
    assert {("baseline", "afs"), ("oracle", "afs"), ("afs", "oracle"), ("baseline", "oracle")} <= after


def test_case_names_are_unique_and_each_case_has_an_oracle_or_says_nothing_to_do() -> None:
    assert len({c.name for c in CASES}) == len(CASES)
    for case in CASES:
        assert case.oracle_ddl or case.oracle_query or case.oracle_settings or "nothing" in case.note


def test_a_close_call_between_afs_and_the_oracle_gets_more_runs() -> None:
    assert quality.close_call(5.1, 3.9) and quality.close_call(117.0, 87.0)
    assert not quality.close_call(20.6, 0.37)  # clearly apart
    assert not quality.close_call(0.10, 0.07)  # within the 0.3 ms slack either way
    assert not quality.close_call(None, 3.0)


def test_the_oracles_very_fix_is_recognised_whatever_the_names_and_spelling() -> None:
    def config(label: str, query: str, definitions: list[str], **settings: str) -> quality.Config:
        return quality.Config(label, (), query, settings, definitions=definitions)

    index = ["CREATE INDEX ON public.sales USING btree (subsidiary_id) INCLUDE (eur_value)"]
    afs = config("afs", "SELECT c.id FROM customers AS c WHERE NOT EXISTS(SELECT 1 FROM orders AS o"
                        " WHERE o.customer_id = c.id)", index)
    oracle = config("oracle", "SELECT c.id FROM customers c WHERE NOT EXISTS (SELECT 1 FROM orders o"
                              " WHERE o.customer_id = c.id)", index)
    assert quality.same_fix(afs, oracle)
    assert not quality.same_fix(afs, config("oracle", oracle.query, []))  # no index
    assert not quality.same_fix(afs, config("oracle", oracle.query + " LIMIT 10", index))
    assert not quality.same_fix(config("afs", "SELECT 1", [], work_mem="'16MB'"),
                                config("oracle", "SELECT 1", [], work_mem="'32MB'"))
    assert quality.same_fix(config("afs", "SELECT 1", [], work_mem="'32MB'"),
                            config("oracle", "select 1", [], work_mem="'32mb'"))


def test_a_statistics_target_runs_inside_each_run_and_is_part_of_the_fix() -> None:
    """A column's statistics target cannot be hidden by dropping an object: it and its ANALYZE run
    inside each of the configuration's runs (and roll back), the index is applied once."""
    ddl = ("CREATE EXTENSION IF NOT EXISTS pg_trgm",
           "CREATE INDEX i ON items USING gin (name gin_trgm_ops)",
           "ALTER TABLE items ALTER COLUMN name SET STATISTICS 1500", "ANALYZE items (name)")
    tuned = quality.Config("afs", ddl, "SELECT 1", definitions=["CREATE INDEX ON items (name)"])
    assert tuned.ddl == ddl[:2] and tuned.per_run == ddl[2:]
    plain = quality.Config("oracle", (*ddl[:2], "ANALYZE items"), "SELECT 1",
                           definitions=["CREATE INDEX ON items (name)"])
    assert plain.per_run == () and plain.ddl == (*ddl[:2], "ANALYZE items")
    assert not quality.same_fix(tuned, plain)
    assert quality.same_fix(tuned, quality.Config("oracle", ddl, "SELECT 1",
                                                  definitions=["CREATE INDEX ON items (name)"]))


def test_every_case_names_its_source_and_a_quick_subset_covers_the_new_shapes() -> None:
    for case in CASES:
        assert len(case.source) > 20, f"{case.name}: the source must name the document and the shape"
        assert "{" not in case.name and case.name.isidentifier()
        if case.statement_timeout_ms is not None:  # a slow baseline: AFS's task reads its plan
            assert 0 < case.statement_timeout_ms < 60_000
    assert len(CASES) >= 36
    assert 4 <= sum(c.quick for c in CASES) <= 8  # --quick stays CI-sized


def test_designs_are_counted_once_whatever_the_index_is_called() -> None:
    def proposal(*sql: str, rewrite: str | None = None) -> OptimizationProposal:
        return OptimizationProposal(agent="gemini25pro", proposal_type="index", sql_commands=sql,
                                    rollback_commands=(), rationale="", estimated_impact="high",
                                    rewritten_query=rewrite)

    a = proposal("CREATE INDEX afs_a ON t (x)", "CREATE INDEX afs_b ON u (y)")
    b = proposal("create index  other_name on t (x)", "CREATE INDEX IF NOT EXISTS z ON u (y)")
    assert quality.design_key(a) != quality.design_key(proposal("CREATE INDEX afs_a ON t (x, y)"))
    assert quality.design_key(proposal("CREATE INDEX afs_a ON t (x)")) == \
        quality.design_key(proposal("CREATE INDEX q ON t (x)"))
    assert quality.design_key(a) == quality.design_key(b)
    assert quality.design_key(proposal(rewrite="SELECT 1 FROM t AS x")) == \
        quality.design_key(proposal(rewrite="select 1 from t x"))


def test_a_partial_index_on_the_querys_literal_is_shown_not_judged() -> None:
    def proposal(sql: str) -> OptimizationProposal:
        return OptimizationProposal(agent="gemini25pro", proposal_type="index", sql_commands=(sql,),
                                    rollback_commands=(), rationale="", estimated_impact="high")

    query = "SELECT player FROM leaderboard WHERE game_id = 7 ORDER BY level DESC LIMIT 10"

    def bound(index: str) -> str | None:
        return quality.literal_bound(query, proposal(index))  # type: ignore[no-any-return]

    shown = bound("CREATE INDEX i ON leaderboard (level DESC) WHERE game_id = 7")
    assert shown is not None and "7" in shown
    assert bound("CREATE INDEX i ON leaderboard (game_id, level DESC)") is None
    assert bound("CREATE INDEX i ON leaderboard (level) WHERE game_id > 100") is None


SMALL_SCALE = 0.05


async def test_every_oracle_returns_the_querys_rows_and_the_planner_expects_it_faster(
        sandbox: SandboxServer) -> None:
    """Each case at a small scale, in one transaction that is rolled back: the oracle (its DDL,
    rewrite and settings) returns the rows of the query, and where it creates something the
    planner expects the query faster with it. (A rewrite or a setting of a NOT IN pays off only
    once the subquery is too big to hash: at scale 1, where quality.py measures every oracle.)"""
    facts = await quality.server_facts(sandbox.dsn())
    name = "afs_qc_corpus_t_" + os.urandom(4).hex()
    async with open_connection(sandbox.dsn()) as admin:
        await admin.execute(f"CREATE DATABASE {name}")
    slower = []
    try:
        async with open_connection(sandbox.dsn(name), 120_000) as conn:
            for case in CASES:
                values = {**scaled(case.sizes, SMALL_SCALE), **facts.values}
                await conn.execute("BEGIN")
                try:
                    for statement in (*case.schema, *case.data):
                        sql = render(statement, values)
                        await conn.execute("ANALYZE" if sql == "VACUUM ANALYZE" else sql)
                    query = render(case.query, values)
                    before = await cost(conn, query)
                    rows = await conn.fetchone(result_checksum_sql(query, False))
                    if not (case.oracle_ddl or case.oracle_query or case.oracle_settings):
                        continue
                    oracle = await quality.oracle_query(conn, case, values)
                    for statement in case.oracle_ddl:
                        await conn.execute(render(statement, values))
                    for setting, value in case.oracle_settings.items():
                        await conn.execute(f"SET LOCAL {setting} = {value}")
                    after = await cost(conn, oracle)
                    assert await conn.fetchone(result_checksum_sql(oracle, False)) == rows, case.name
                    if case.oracle_ddl and after >= before:
                        slower.append(f"{case.name}: {before:.0f} -> {after:.0f}")
                finally:
                    await conn.execute("ROLLBACK")
    finally:
        async with open_connection(sandbox.dsn()) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    assert not slower, slower


async def cost(conn: Connection, query: str) -> float:
    plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}")
    data = json.loads(plan) if isinstance(plan, str) else plan
    return float(data[0]["Plan"]["Total Cost"])
