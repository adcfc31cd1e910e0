"""Parameter sets drawn from the demo database's pg_stats run there, and really differ."""

from __future__ import annotations

from afs.analysis import gather_context
from afs.db import open_connection
from afs.params.family import apply_parameters, baked_literals, parameter_sets
from afs.query.features import extract_features
from afs.query.query import Query
from afs.sandbox.server import SandboxServer

QUERY = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'shipped' "
         "AND o.created_at >= '2025-03-01' AND o.created_at < '2025-04-01'")
COUNT = ("SELECT count(*) FROM orders WHERE status = 'shipped' "
         "AND created_at >= '2025-03-01' AND created_at < '2025-04-01'")
# a pre-aggregate that keeps the literals out, and the rewrite that filters it
AGGREGATE = ("CREATE TEMP TABLE afs_t_params_daily AS SELECT status, created_at::date AS created_at, "
             "count(*) AS n FROM orders GROUP BY 1, 2")
REWRITE = ("SELECT coalesce(sum(n), 0)::bigint FROM afs_t_params_daily WHERE status = 'shipped' "
           "AND created_at >= '2025-03-01' AND created_at < '2025-04-01'")
CACHE = f"CREATE TEMP TABLE afs_t_params_cache AS {COUNT}"


async def test_sets_from_the_demo_statistics_run_and_change_the_rows(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        ctx = await gather_context(conn, task_id="t-params", task_type="query_optimization", query=QUERY,
                                   features=extract_features(QUERY), source_stats={})
        sets = parameter_sets(Query.read(QUERY), ctx.tables, 2)
        assert len(sets) == 2
        original = len(await conn.fetchall(QUERY))
        assert original > 0
        counts = []
        for pset in sets:
            assert {s.column for s in pset.substitutions} == {"orders.status", "orders.created_at"}
            sql = apply_parameters(QUERY, pset)
            assert sql is not None
            counts.append(len(await conn.fetchall(sql)))  # runs: the literals are valid for the types
        assert any(n != original for n in counts), (original, counts, [p.label for p in sets])

        # the family check an honest pre-aggregate passes and a cache of today's answer fails
        try:
            await conn.execute(AGGREGATE)
            await conn.execute(CACHE)
            assert await conn.fetchval(REWRITE) == await conn.fetchval(COUNT)
            for pset in parameter_sets(Query.read(COUNT), ctx.tables, 2):
                baseline, rewrite = apply_parameters(COUNT, pset), apply_parameters(REWRITE, pset)
                assert baseline is not None and rewrite is not None
                assert await conn.fetchval(rewrite) == await conn.fetchval(baseline), pset.label
                assert apply_parameters("SELECT * FROM afs_t_params_cache", pset) is None
            assert baked_literals(COUNT, COUNT) != ()
            assert baked_literals(AGGREGATE.split(" AS ", 1)[1], COUNT) == ()
        finally:
            await conn.execute("DROP TABLE IF EXISTS afs_t_params_daily, afs_t_params_cache")
