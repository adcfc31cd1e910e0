"""The query read once (afs/query): one pglast walker that a deep query cannot overflow, one
column resolver that keys a quoted mixed-case table as the catalog does, and a task that
reads its query with sqlglot a handful of times, not once per agent, candidate and rule."""

from __future__ import annotations

import inspect
import os
import sys

import pglast
from sqlglot import exp

from afs.batch.statements import relations
from afs.brains import Squad, StrategistBrain
from afs.config import Settings
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.models import AnalysisContext, ColumnInfo, ColumnStats, TableInfo
from afs.optimize import Crew, TaskRequest, optimize
from afs.params import family
from afs.params.family import apply_parameters, parameter_sets
from afs.params.fill import fill, slots
from afs.query.features import extract_features
from afs.query.query import Query
from afs.query.shape import Resolver, query_shape
from afs.query.text import PARSES, parse_query, walk
from afs.router import load_rules
from afs.sandbox.server import SandboxServer


def test_the_pglast_walker_is_iterative() -> None:
    """A walker that recursed would need several frames per level: with the stack kept short,
    relations() of a deeply nested statement still answers."""
    statement = "SELECT id FROM orders WHERE id IN (SELECT user_id FROM payments UNION SELECT 1)"
    deep = "SELECT 1 FROM orders WHERE " + "NOT " * 400 + "true"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 2000))  # pglast's own parse_sql builds the tree recursively
    try:
        tree = pglast.parse_sql(deep)
    finally:
        sys.setrecursionlimit(limit)
    sys.setrecursionlimit(len(inspect.stack(0)) + 60)  # 60 frames to spare, not 400 levels
    try:
        assert sum(1 for _ in walk(tree)) > 400
        assert relations(deep) == ["orders"]
    finally:
        sys.setrecursionlimit(limit)
    assert relations(statement) == ["orders", "payments"]


def test_a_quoted_mixed_case_table_has_one_key() -> None:
    """`"Orders"` is the catalog's key (afs.pg.names.relation_key) for every reader: the
    parameter sets find its statistics (params keyed it `Orders` and found none)."""
    stats = ColumnStats(null_frac=0.0, n_distinct=50, most_common_vals=("7", "8", "9"),
                        most_common_freqs=(0.2, 0.1, 0.05), histogram_bounds=("1", "20", "40", "60"))
    info = TableInfo(name='"Orders"', rows=1000, size_mb=1.0, columns=(ColumnInfo("Total", "integer"),),
                     indexes=(), column_stats={"Total": stats})
    query = Query.read('SELECT id FROM "Orders" o WHERE o."Total" = 3')
    assert query.tree is not None
    column = next(c for c in query.tree.find_all(exp.Column) if c.name == "Total")
    assert column.name == "Total" and query.table_of(column, {'"Orders"': info}) == '"Orders"'
    sets = parameter_sets(query, {'"Orders"': info}, 2)
    assert sets and all(sub.column == '"Orders".Total' for s in sets for sub in s.substitutions)


async def test_a_three_agent_task_reads_its_query_a_handful_of_times(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    """Three strategist agents, each with its suite, parameter sets, every strategist and
    every candidate: sqlglot reads the query's text once (Query.read remembers it), not once
    per reader (about 40 times before afs/query)."""
    marker = os.urandom(4).hex()  # a text no other test has read
    query = (f"SELECT o.id, o.total_amount /* {marker} */ FROM orders o WHERE o.status = 'pending'"
             " AND o.user_id = 42 ORDER BY o.created_at DESC")
    squad = Squad(brain_for=lambda agent: StrategistBrain(), provider="heuristic",
                  agents=("gemini25pro", "gemini25flash", "gemini20flash"))
    before = sum(PARSES.values())
    result = await optimize(settings, TaskRequest(query=query, runs=3), source="afs_demo",
                            source_dsn=sandbox.dsn("afs_demo"),
                            crew=Crew(forks=forks, squad=squad, rules=load_rules(None)),
                            events=Emitter("t" + marker))
    assert len(result.outcomes) == 3 and result.status == "completed", result.error
    assert 1 <= PARSES[query] <= 3, PARSES[query]
    shared = Query.read(query).tree  # the one reading: every reader left it as it was
    assert shared is not None and shared.sql(dialect="postgres") == parse_query(query).sql(dialect="postgres")
    print(f"parses: the query {PARSES[query]}, all texts {sum(PARSES.values()) - before}")


def test_a_statement_with_parameters_resolves_its_columns_per_block() -> None:
    """The `$n` filling asks the same resolver: `o` is "Orders" in the outer block and orders
    in the subquery (one global alias map let the last alias win), and the quoted mixed-case
    table is found under its catalog key."""
    info = _info('"Orders"', "Total", ("7", "8", "9"))
    lower = _info("orders", "total", ("70", "80", "90"))
    statement = ('SELECT id FROM "Orders" o WHERE o."Total" = $1 AND id IN '
                 '(SELECT o.id FROM orders o WHERE o.total > $2)')
    found = {slot.number: slot for slot in slots(statement, {'"Orders"': info, "orders": lower})}
    assert (found[1].table, found[1].column, found[1].problem) == ('"Orders"', "Total", None)
    assert (found[2].table, found[2].column, found[2].problem) == ("orders", "total", None)
    filled = fill(statement, {'"Orders"': info, "orders": lower}, 2)
    assert filled.reason is None and len(filled.sets) == 2, filled
    assert relations(statement) == ['"Orders"', "orders"]


def _info(name: str, column: str, common: tuple[str, ...]) -> TableInfo:
    stats = ColumnStats(n_distinct=50, most_common_vals=common, most_common_freqs=(0.2, 0.1, 0.05),
                        histogram_bounds=tuple(str(v) for v in range(1, 100, 10)))
    return TableInfo(name=name, rows=1000, size_mb=1.0,
                     columns=(ColumnInfo("id", "integer"), ColumnInfo(column, "integer")),
                     indexes=(), column_stats={column: stats})


def test_the_strategists_resolve_an_alias_in_its_own_block() -> None:
    """`o` is orders outside and users inside: the semi-join pairs orders.user_id with
    users.id (the strategists' resolver had one alias map for the whole query, where the
    first `o` won, and saw no join at all)."""
    sql = "SELECT o.id FROM orders o WHERE o.user_id IN (SELECT o.id FROM users o WHERE o.id < 5)"
    tables = {"orders": _info("orders", "user_id", ("1", "2")), "users": _info("users", "name", ("a",))}
    ctx = AnalysisContext(task_id="t", task_type="query_optimization", query=sql,
                          features=extract_features(sql), plan={}, execution_ms=1.0, tables=tables)
    query = Query.read(sql)
    shape = query_shape(query, Resolver(ctx, query))
    assert shape.join_pairs == ((("orders", "user_id"), ("users", "id")),)
    # a name EXPLAIN prints (`o.id` in a filter) is one table only when every block agrees
    assert Resolver(ctx, query).table_key("o") is None
    assert Resolver(ctx, query).table_of("o", "id") is None


def test_a_parameter_set_is_written_into_a_query_once() -> None:
    """Every agent and candidate of a task asks for the original with each set: the answer is
    remembered (the same string, no new reading of either text)."""
    tables = {"orders": _info("orders", "user_id", ("7", "8", "9"))}
    sql = f"SELECT id FROM orders WHERE user_id = 3 /* {os.urandom(4).hex()} */"
    (first, *_) = parameter_sets(Query.read(sql), tables, 2)
    written = apply_parameters(sql, first)
    hits = family._applied.cache_info().hits
    assert written is not None and apply_parameters(sql, first) is written
    assert family._applied.cache_info().hits == hits + 1
