"""Offline strategists: hand-built analysis contexts in, sensible and different proposals out.

Plans and statistics are shaped after the demo data set (EXPLAIN (ANALYZE, BUFFERS,
FORMAT JSON) on PostgreSQL 18 and pg_stats), scaled to 2 M orders. No database.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pglast
import pytest

from afs.brains import strategists
from afs.brains.strategists import STRATEGISTS, analyze, iter_proposal_sql, structure
from afs.brains.strategists import propose as candidates
from afs.brains.strategists.evidence import covering_index
from afs.brains.strategists.plan_fixes import RULES as PLAN_FIX_RULES
from afs.brains.strategists.plan_fixes import plan_fix_proposals, work_mem_mb
from afs.brains.strategists.precomputation import MaterializedView, materialize
from afs.errors import InputError
from afs.models import (
    AGENTS,
    PROPOSAL_TYPES,
    AnalysisContext,
    ColumnInfo,
    ColumnStats,
    ColumnUse,
    IndexInfo,
    OptimizationProposal,
    QueryFeatures,
    TableInfo,
)
from afs.pg.names import index_name
from afs.pg.plan import plan_nodes
from afs.pg.stats import equality_selectivity, like_prefix, prefix_fraction, range_fraction
from afs.query.query import Query
from afs.safety import check_settings, validate_candidate, validate_proposal

# -- the factory ------------------------------------------------------------------------------
ORDERS_ROWS = 2_000_000


def _months(first: datetime, count: int) -> tuple[str, ...]:
    step = timedelta(days=730 / (count - 1))
    return tuple(f"{first + i * step:%Y-%m-%d %H:%M:%S}.123456+00" for i in range(count))


ORDERS_STATS = {
    "id": ColumnStats(n_distinct=-1, correlation=1.0, histogram_bounds=("1", "1000000", "2000000")),
    "user_id": ColumnStats(
        n_distinct=48_000, correlation=0.16,
        most_common_vals=("1", "2", "3", "4", "5"),
        most_common_freqs=(0.0092, 0.0025, 0.0017, 0.0014, 0.0011)),
    "status": ColumnStats(
        n_distinct=6, correlation=0.40,
        most_common_vals=("completed", "shipped", "paid", "cancelled", "pending", "refunded"),
        most_common_freqs=(0.5953, 0.1503, 0.0992, 0.0707, 0.0523, 0.0321)),
    "total_amount": ColumnStats(n_distinct=-0.6, correlation=-0.02),
    "shipping_country": ColumnStats(
        n_distinct=14, correlation=0.17, most_common_vals=("US", "IN", "BR"),
        most_common_freqs=(0.363, 0.0888, 0.0827)),
    "created_at": ColumnStats(n_distinct=-1, correlation=1.0,
                              histogram_bounds=_months(datetime(2024, 1, 2, tzinfo=UTC), 101)),
}


def orders(rows: int = ORDERS_ROWS, indexes: Sequence[IndexInfo] = (),
           stats: Mapping[str, ColumnStats] = ORDERS_STATS, writes_per_read: float = 0.02) -> TableInfo:
    return TableInfo(
        name="orders", rows=rows, size_mb=round(rows * 150 / 1_048_576, 1),
        columns=(ColumnInfo("id", "bigint", False), ColumnInfo("user_id", "bigint", False),
                 ColumnInfo("status", "text", False), ColumnInfo("total_amount", "numeric(12,2)", False),
                 ColumnInfo("shipping_country", "text", False),
                 ColumnInfo("created_at", "timestamp with time zone", False),
                 ColumnInfo("updated_at", "timestamp with time zone", False)),
        indexes=(IndexInfo("orders_pkey", "CREATE UNIQUE INDEX orders_pkey ON public.orders USING btree (id)",
                           ("id",), unique=True, primary=True, size_mb=rows * 22 / 1_048_576),
                 *indexes),
        primary_key=("id",), column_stats=stats, writes_per_read=writes_per_read)


def users(rows: int = 80_000) -> TableInfo:
    return TableInfo(
        name="users", rows=rows, size_mb=rows * 120 / 1_048_576,
        columns=(ColumnInfo("id", "bigint", False), ColumnInfo("email", "text", False),
                 ColumnInfo("country", "text", False), ColumnInfo("tier", "text", False),
                 ColumnInfo("created_at", "timestamp with time zone", False)),
        indexes=(IndexInfo("users_pkey", "CREATE UNIQUE INDEX users_pkey ON public.users USING btree (id)",
                           ("id",), unique=True, primary=True),),
        primary_key=("id",),
        column_stats={"id": ColumnStats(n_distinct=-1, correlation=1.0),
                      "country": ColumnStats(n_distinct=14, most_common_vals=("US", "DE"),
                                             most_common_freqs=(0.36, 0.09))})


def use(table: str | None, column: str, role: str, operator: str | None = None,
        value: Any = None) -> ColumnUse:
    return ColumnUse(table=table, column=column, role=role, operator=operator, value=value)  # type: ignore[arg-type]


def features(tables: Sequence[str], columns: Iterable[ColumnUse],
             aliases: Mapping[str, str] | None = None, *, joins: int = 0, aggregations: int = 0,
             order_by: int = 0, limit: bool = False) -> QueryFeatures:
    score = joins * 2 + aggregations + order_by
    return QueryFeatures(
        join_count=joins, subquery_count=0, aggregation_count=aggregations, window_count=0,
        set_operation_count=0, order_by_count=order_by, has_limit=limit, tables=tuple(tables),
        aliases=dict(aliases or {}), columns=tuple(columns), main_table=tables[0],
        complexity_score=score, complexity="low" if score <= 2 else "medium" if score <= 5 else "high")


def node(node_type: str, *children: Mapping[str, Any], rows: float, ms: float, loops: float = 1,
         **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "Node Type": node_type, "Parallel Aware": False, "Async Capable": False,
        "Startup Cost": 0.0, "Total Cost": 1000.0, "Plan Rows": max(1, int(rows)), "Plan Width": 22,
        "Actual Startup Time": 0.01, "Actual Total Time": ms, "Actual Rows": float(rows),
        "Actual Loops": loops, "Disabled": False, "Shared Hit Blocks": 512, "Shared Read Blocks": 0,
        **{k.replace("_", " "): v for k, v in extra.items()},
    }
    if children:
        out["Plans"] = [dict(c, **{"Parent Relationship": "Outer" if i == 0 else "Inner"})
                        for i, c in enumerate(children)]
    return out


def seq_scan(relation: str, alias: str, rows: float, removed: float, ms: float,
             filter: str | None = None, loops: float = 1) -> dict[str, Any]:
    extra: dict[str, Any] = {"Relation_Name": relation, "Alias": alias}
    if filter:
        extra |= {"Filter": filter, "Rows_Removed_by_Filter": removed}
    return node("Seq Scan", rows=rows, ms=ms, loops=loops, **extra)


def context(query: str, feats: QueryFeatures, plan: Mapping[str, Any], tables: Iterable[TableInfo],
            execution_ms: float) -> AnalysisContext:
    return AnalysisContext(task_id="t-1", task_type="query_optimization", query=query, features=feats,
                           plan=plan, execution_ms=execution_ms, tables={t.name: t for t in tables})


def propose(agent: str, ctx: AnalysisContext, analysis: object = None) -> OptimizationProposal | None:
    """The agent's first choice: its specialisation's decision (None: it proposes nothing);
    `candidates` gives every design it measures, plan fixes included."""
    return STRATEGISTS[agent].decide(ctx, agent).proposal


# -- the scenarios --------------------------------------------------------------------------
USER_ID_INDEX_DEF = "CREATE INDEX orders_user_id_idx ON public.orders USING btree (user_id)"
ISSUE_QUERY = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending' AND o.user_id = 4242 "
               "ORDER BY o.created_at DESC")


def issue_ctx(table: TableInfo | None = None, plan: Mapping[str, Any] | None = None,
              execution_ms: float = 182.4) -> AnalysisContext:
    """The issue's example: a Seq Scan over 2 M orders for a user's pending orders."""
    feats = features(["orders"], [
        use("orders", "id", "select"), use("orders", "total_amount", "select"),
        use("orders", "status", "equality", "=", "pending"), use("orders", "user_id", "equality", "=", 4242),
        use("orders", "created_at", "sort")], {"o": "orders"}, order_by=1)
    plan = plan or node(
        "Sort", node("Gather", seq_scan("orders", "o", rows=2, removed=666_650, ms=171.0, loops=3,
                                        filter="((status = 'pending'::text) AND (user_id = 4242))"),
                     rows=6, ms=181.9, Workers_Launched=2),
        rows=6, ms=182.0, Sort_Key=["o.created_at DESC"], Sort_Method="quicksort",
        Sort_Space_Used=25, Sort_Space_Type="Memory")
    return context(ISSUE_QUERY, feats, plan, [table or orders()], execution_ms)


RANGE_QUERY = ("SELECT o.id, o.total_amount FROM orders o "
               "WHERE o.created_at >= '2025-06-01' AND o.created_at < '2025-07-01'")


def range_ctx(rows: int = ORDERS_ROWS) -> AnalysisContext:
    feats = features(["orders"], [
        use("orders", "id", "select"), use("orders", "total_amount", "select"),
        use("orders", "created_at", "range", ">=", "2025-06-01"),
        use("orders", "created_at", "range", "<", "2025-07-01")], {"o": "orders"})
    kept = rows * 30 / 730
    condition = ("((created_at >= '2025-06-01 00:00:00+00'::timestamp with time zone) "
                 "AND (created_at < '2025-07-01 00:00:00+00'::timestamp with time zone))")
    plan = node("Gather", seq_scan("orders", "o", rows=kept / 3, removed=(rows - kept) / 3, ms=160.0,
                                   loops=3, filter=condition),
                rows=kept, ms=205.0, Workers_Launched=2)
    return context(RANGE_QUERY, feats, plan, [orders(rows)], 205.3)


AGG_QUERY = ("SELECT o.status, count(*) AS n, sum(o.total_amount) AS revenue FROM orders o "
             "WHERE o.shipping_country = 'DE' GROUP BY o.status ORDER BY revenue DESC")
AGG_RANGE_QUERY = ("SELECT o.status, count(*) AS n, sum(o.total_amount) AS revenue FROM orders o "
                   "WHERE o.created_at >= '2025-01-01' GROUP BY o.status ORDER BY revenue DESC")


def agg_ctx(by_time: bool = False) -> AnalysisContext:
    """Revenue by status for one shipping country (or, `by_time`, since a date)."""
    if by_time:
        query, filtered = AGG_RANGE_QUERY, use("orders", "created_at", "range", ">=", "2025-01-01")
        condition = "(created_at >= '2025-01-01 00:00:00+00'::timestamp with time zone)"
    else:
        query, filtered = AGG_QUERY, use("orders", "shipping_country", "equality", "=", "DE")
        condition = "(shipping_country = 'DE'::text)"
    feats = features(["orders"], [
        use("orders", "status", "group"), use("orders", "status", "select"),
        use("orders", "total_amount", "select"), filtered,
    ], {"o": "orders"}, aggregations=2, order_by=1)
    plan = node("Sort", node(
        "Aggregate", seq_scan("orders", "o", rows=1_000_000, removed=1_000_000, ms=310.0, filter=condition),
        rows=6, ms=520.0, Strategy="Hashed", Group_Key=["o.status"]),
        rows=6, ms=520.2, Sort_Key=["(sum(o.total_amount)) DESC"], Sort_Method="quicksort")
    return context(query, feats, plan, [orders()], 520.6)


INDEXED_QUERY = "SELECT o.id, o.total_amount FROM orders o WHERE o.user_id = 4242"


def indexed_ctx() -> AnalysisContext:
    """user_id already has an index and the plan uses it: 0.09 ms."""
    table = orders(indexes=[IndexInfo("orders_user_id_idx", USER_ID_INDEX_DEF,
                                      ("user_id",), size_mb=42.0)])
    feats = features(["orders"], [use("orders", "id", "select"), use("orders", "total_amount", "select"),
                                  use("orders", "user_id", "equality", "=", 4242)], {"o": "orders"})
    plan = node("Index Scan", rows=41, ms=0.08, Index_Name="orders_user_id_idx", Relation_Name="orders",
                Alias="o", Scan_Direction="Forward", Index_Cond="(user_id = 4242)")
    return context(INDEXED_QUERY, feats, plan, [table], 0.09)


JOIN_QUERY = ("SELECT u.email, o.id, o.total_amount FROM users u JOIN orders o ON o.user_id = u.id "
              "WHERE u.country = 'DE' AND u.tier = 'gold'")


def join_ctx() -> AnalysisContext:
    """300 gold users in DE; orders (2 M) has no index on user_id: a hash join over everything."""
    feats = features(["users", "orders"], [
        use("users", "email", "select"), use("orders", "id", "select"),
        use("orders", "total_amount", "select"),
        use("orders", "user_id", "join", "="), use("users", "id", "join", "="),
        use("users", "country", "equality", "=", "DE"), use("users", "tier", "equality", "=", "gold")],
        {"u": "users", "o": "orders"}, joins=1)
    plan = node(
        "Hash Join",
        seq_scan("orders", "o", rows=ORDERS_ROWS, removed=0, ms=140.0),
        node("Hash", seq_scan("users", "u", rows=300, removed=79_700, ms=9.0,
                              filter="((country = 'DE'::text) AND (tier = 'gold'::text))"), rows=300, ms=9.1),
        rows=12_400, ms=395.0, Join_Type="Inner", Hash_Cond="(o.user_id = u.id)")
    return context(JOIN_QUERY, feats, plan, [users(), orders()], 395.4)


# -- text patterns, expressions and jsonb (features extracted from the query itself) ---------
USERS_ROWS = 100_000
EMAILS = sorted(f"user{i}@example.com" for i in range(1, USERS_ROWS + 1))
EMAIL_STATS = ColumnStats(n_distinct=-1, correlation=0.02, avg_width=19,
                          histogram_bounds=tuple(EMAILS[i * (USERS_ROWS - 1) // 100] for i in range(101)))


def users_table(rows: int = USERS_ROWS, email: ColumnStats = EMAIL_STATS, email_type: str = "text",
                indexes: Sequence[IndexInfo] = ()) -> TableInfo:
    base = users(rows)
    return TableInfo(
        name="users", rows=rows, size_mb=base.size_mb,
        columns=tuple(ColumnInfo(c.name, email_type if c.name == "email" else c.data_type, c.nullable)
                      for c in base.columns),
        indexes=(*base.indexes, *indexes), primary_key=("id",),
        column_stats={**base.column_stats, "email": email,
                      "tier": ColumnStats(n_distinct=3, avg_width=5,
                                          most_common_vals=("free", "pro", "enterprise"),
                                          most_common_freqs=(0.8, 0.17, 0.03))})


EVENTS_ROWS = 500_000


def events(indexes: Sequence[IndexInfo] = ()) -> TableInfo:
    return TableInfo(
        name="events", rows=EVENTS_ROWS, size_mb=EVENTS_ROWS * 110 / 1_048_576,
        columns=(ColumnInfo("id", "bigint", False), ColumnInfo("user_id", "bigint", False),
                 ColumnInfo("kind", "text", False), ColumnInfo("payload", "jsonb", False),
                 ColumnInfo("created_at", "timestamp with time zone", False)),
        indexes=(IndexInfo("events_pkey", "CREATE UNIQUE INDEX events_pkey ON public.events USING btree (id)",
                           ("id",), unique=True, primary=True), *indexes),
        primary_key=("id",),
        column_stats={"id": ColumnStats(n_distinct=-1, correlation=1.0, avg_width=8),
                      "payload": ColumnStats(n_distinct=836, correlation=0.01, avg_width=50),
                      "created_at": ColumnStats(n_distinct=-1, correlation=1.0, avg_width=8)})


def scan_ctx(query: str, table: TableInfo, kept: float, filter: str, ms: float = 40.0) -> AnalysisContext:
    """`query` over one table, whose plan is a Seq Scan keeping `kept` of its rows."""
    from afs.query.features import extract_features

    rows = table.rows * kept
    plan = seq_scan(table.name, table.name, rows=rows, removed=table.rows - rows, ms=ms, filter=filter)
    return context(query, extract_features(query), plan, [table], ms + 0.2)


LIKE_QUERY = "SELECT u.id FROM users u WHERE u.email LIKE 'user12%'"
LOWER_QUERY = "SELECT id, tier FROM users WHERE lower(email) = 'user4242@example.com'"
CONTAINS_QUERY = """SELECT id, created_at FROM events WHERE payload @> '{"device": "tablet"}'"""
JSON_KEY_QUERY = "SELECT e.id FROM events e WHERE e.payload ->> 'query' = 'lego'"


def like_ctx(table: TableInfo | None = None) -> AnalysisContext:
    return scan_ctx(LIKE_QUERY, table or users_table(), 1111 / USERS_ROWS, "(email ~~ 'user12%'::text)", 14.0)


def lower_ctx() -> AnalysisContext:
    return scan_ctx(LOWER_QUERY, users_table(), 1 / USERS_ROWS,
                    "(lower(email) = 'user4242@example.com'::text)", 21.0)


def contains_ctx(table: TableInfo | None = None) -> AnalysisContext:
    return scan_ctx(CONTAINS_QUERY, table or events(), 0.05, """(payload @> '{"device": "tablet"}'::jsonb)""",
                    95.0)


def json_key_ctx() -> AnalysisContext:
    return scan_ctx(JSON_KEY_QUERY, events(), 0.0125, "((payload ->> 'query'::text) = 'lego'::text)", 80.0)


SCENARIOS: dict[str, Callable[[], AnalysisContext]] = {
    "issue": issue_ctx, "range": range_ctx, "aggregate": agg_ctx, "indexed": indexed_ctx, "join": join_ctx,
    "like": like_ctx, "lower": lower_ctx, "contains": contains_ctx, "json_key": json_key_ctx}


def all_outputs() -> Iterable[tuple[str, str, OptimizationProposal | None]]:
    for name, make in SCENARIOS.items():
        ctx = make()
        for agent in STRATEGISTS:
            yield name, agent, propose(agent, ctx, analyze(agent, ctx))


# -- gemini-2.5-pro ---------------------------------------------------------------------------
def test_issue_query_gets_a_partial_composite_covering_index() -> None:
    ctx = issue_ctx()
    analysis = analyze("gemini25pro", ctx)
    proposal = propose("gemini25pro", ctx, analysis)
    assert proposal is not None
    assert proposal.proposal_type == "partial_index"
    assert proposal.sql_commands == (
        "CREATE INDEX afs_orders_user_id_created_at_idx ON orders (user_id, created_at DESC) "
        "INCLUDE (id, total_amount) WHERE status = 'pending'",)
    assert proposal.rollback_commands == ("DROP INDEX IF EXISTS afs_orders_user_id_created_at_idx",)
    assert "Index Only Scan using afs_orders_user_id_created_at_idx" in proposal.validation_steps[0]
    assert proposal.estimated_impact.risk == "low"
    # a partial index over 5 % of 2 M rows is small
    assert 0 < proposal.estimated_impact.storage_overhead_mb < 10
    assert proposal.estimated_impact.query_time_improvement >= 80
    insights = "\n".join(analysis.insights)
    assert "Seq Scan on orders removes 1,999,950 rows to return 6" in insights
    assert "status = 'pending' matches 5.2 % of rows (pg_stats MCV)" in insights
    assert analysis.proposed_actions == ("Create index on orders (user_id, created_at DESC) "
                                         "INCLUDE (id, total_amount) WHERE status = 'pending'",)
    assert analysis.metadata["target_table"] == "orders"
    assert "writes_per_read" not in analysis.metadata  # a measured fact: a typed field, not metadata
    assert analysis.metadata["query_complexity"] == "low"
    assert 0.8 <= analysis.confidence <= 0.95


def test_a_common_status_stays_in_the_key_not_in_a_partial_predicate() -> None:
    """status = 'completed' is 60 % of rows: a partial index would not be small; key it instead."""
    ctx = issue_ctx()
    query = ctx.query.replace("'pending'", "'completed'")
    cols = tuple(use(u.table, u.column, u.role, u.operator, "completed" if u.value == "pending" else u.value)
                 for u in ctx.features.columns)
    ctx = context(query, features(["orders"], cols, {"o": "orders"}, order_by=1), ctx.plan,
                  ctx.tables.values(), ctx.execution_ms)
    proposal = propose("gemini25pro", ctx, analyze("gemini25pro", ctx))
    assert proposal is not None and proposal.proposal_type == "composite_index"
    assert "(user_id, status, created_at DESC)" in proposal.sql_commands[0]
    assert "WHERE" not in proposal.sql_commands[0]


def test_already_indexed_query_gets_no_duplicate() -> None:
    ctx = indexed_ctx()
    analysis = analyze("gemini25pro", ctx)
    assert propose("gemini25pro", ctx, analysis) is None
    assert any("already" in line for line in analysis.insights)
    assert analysis.proposed_actions[0].startswith("No change proposed")


def test_an_existing_covering_index_is_not_proposed_again_even_when_the_plan_ignores_it() -> None:
    existing = IndexInfo("orders_uc", "CREATE INDEX orders_uc ON public.orders USING btree "
                                      "(status, user_id, created_at DESC)",
                         ("status", "user_id", "created_at"))
    ctx = issue_ctx(table=orders(indexes=[existing]))
    analysis = analyze("gemini25pro", ctx)
    assert propose("gemini25pro", ctx, analysis) is None
    assert any("orders_uc already covers" in line for line in analysis.insights)


def test_an_existing_single_column_index_used_by_the_plan_leaves_little_to_gain() -> None:
    table = orders(indexes=[IndexInfo("orders_user_id_idx", USER_ID_INDEX_DEF,
                                      ("user_id",))])
    plan = node("Sort", node("Bitmap Heap Scan",
                             node("Bitmap Index Scan", rows=41, ms=0.05, Index_Name="orders_user_id_idx",
                                  Index_Cond="(user_id = 4242)"),
                             rows=2, ms=0.4, Relation_Name="orders", Alias="o",
                             Recheck_Cond="(user_id = 4242)",
                             Filter="(status = 'pending'::text)", Rows_Removed_by_Filter=39),
                rows=2, ms=0.45, Sort_Key=["o.created_at DESC"])
    ctx = issue_ctx(table=table, plan=plan, execution_ms=0.5)
    analysis = analyze("gemini25pro", ctx)
    assert propose("gemini25pro", ctx, analysis) is None


def test_join_gets_an_index_on_the_join_key_of_the_large_side() -> None:
    ctx = join_ctx()
    analysis = analyze("gemini25pro", ctx)
    proposal = propose("gemini25pro", ctx, analysis)
    assert proposal is not None
    assert proposal.proposal_type == "index"
    assert proposal.sql_commands == ("CREATE INDEX afs_orders_user_id_idx ON orders (user_id)",)
    assert any("orders.user_id = users.id" in line and "no index" in line for line in analysis.insights)
    # users (80 k rows) is filtered but small enough: no index proposed for it
    assert analysis.metadata["target_table"] == "orders"


def test_join_key_already_indexed_gives_no_join_index() -> None:
    ctx = join_ctx()
    table = orders(indexes=[IndexInfo("orders_user_id_idx", "CREATE INDEX orders_user_id_idx ON "
                                      "public.orders USING btree (user_id)", ("user_id",))])
    ctx = context(ctx.query, ctx.features, ctx.plan, [users(), table], ctx.execution_ms)
    proposal = propose("gemini25pro", ctx, analyze("gemini25pro", ctx))
    assert proposal is None or "orders (user_id)" not in proposal.sql_commands[0]


def test_order_by_with_limit_gets_a_sort_index_and_without_limit_none() -> None:
    query = "SELECT * FROM orders ORDER BY created_at DESC LIMIT 10"
    feats = features(["orders"], [use("orders", "*", "select"), use("orders", "created_at", "sort")],
                     order_by=1, limit=True)
    plan = node("Limit", node("Sort", seq_scan("orders", "orders", rows=ORDERS_ROWS, removed=0, ms=240.0),
                              rows=10, ms=530.0, Sort_Key=["created_at DESC"], Sort_Method="top-N heapsort"),
                rows=10, ms=530.1)
    ctx = context(query, feats, plan, [orders()], 530.3)
    proposal = propose("gemini25pro", ctx, analyze("gemini25pro", ctx))
    assert proposal is not None
    assert proposal.sql_commands == ("CREATE INDEX afs_orders_created_at_idx ON orders (created_at DESC)",)
    assert "no Sort node" in " ".join(proposal.validation_steps)

    no_limit = context(query.replace(" LIMIT 10", ""), feats, plan, [orders()], 530.3)
    analysis = analyze("gemini25pro", no_limit)
    assert propose("gemini25pro", no_limit, analysis) is None
    assert any("without LIMIT" in line for line in analysis.insights)


def test_write_heavy_table_raises_the_risk() -> None:
    ctx = issue_ctx(table=orders(writes_per_read=4.0))
    analysis = analyze("gemini25pro", ctx)
    proposal = propose("gemini25pro", ctx, analysis)
    assert proposal is not None and proposal.estimated_impact.risk == "medium"
    assert "write-heavy" in proposal.rationale and "4.0 writes per read" in proposal.rationale


def test_long_names_are_cut_to_63_bytes_and_stay_distinct() -> None:
    table = "a_very_long_table_name_for_the_accounting_department_ledger"
    first = index_name(table, ["customer_identifier", "transaction_created_timestamp"])
    second = index_name(table, ["customer_identifier", "transaction_updated_timestamp"])
    assert len(first) <= 63 and len(second) <= 63 and first != second
    assert index_name("orders", ["user_id"]) == "afs_orders_user_id_idx"
    assert index_name("orders", ["user_id"], taken=["afs_orders_user_id_idx"]) \
        != "afs_orders_user_id_idx"


# -- gemini-2.5-pro: patterns, expressions and jsonb ------------------------------------------
def proposal_of(agent: str, ctx: AnalysisContext) -> OptimizationProposal:
    proposal = propose(agent, ctx, analyze(agent, ctx))
    assert proposal is not None, analyze(agent, ctx).insights
    validation = validate_proposal(proposal.sql_commands, proposal.proposal_type)
    assert validation.is_valid, validation.rejected
    if proposal.proposal_type != "partitioning":  # the migration's rollback is the strategist's own
        assert validation.rollback_commands == proposal.rollback_commands
    return proposal


def test_a_like_prefix_gets_a_btree_with_text_pattern_ops() -> None:
    ctx = like_ctx()
    analysis = analyze("gemini25pro", ctx)
    proposal = proposal_of("gemini25pro", ctx)
    assert proposal.sql_commands == (
        "CREATE INDEX afs_users_email_pattern_idx ON users (email text_pattern_ops) INCLUDE (id)",)
    assert proposal.rollback_commands == ("DROP INDEX IF EXISTS afs_users_email_pattern_idx",)
    # 'user12%' is 1,111 of the 100,000 sorted emails: about one histogram bucket
    assert any("email LIKE 'user12%' keeps ~1.0 % of rows (~1,000, pg_stats histogram)" in line
               and "text_pattern_ops" in line for line in analysis.insights)
    assert proposal.estimated_impact.query_time_improvement >= 80


@pytest.mark.parametrize(("data_type", "opclass"), [
    ("character varying(255)", "varchar_pattern_ops"), ("character(24)", "bpchar_pattern_ops")])
def test_the_pattern_operator_class_follows_the_column_type(data_type: str, opclass: str) -> None:
    proposal = proposal_of("gemini25pro", like_ctx(users_table(email_type=data_type)))
    assert f"(email {opclass})" in proposal.sql_commands[0]


def test_a_plain_index_does_not_serve_like_but_a_pattern_index_does() -> None:
    plain = IndexInfo("users_email_idx", "CREATE INDEX users_email_idx ON public.users USING btree (email)",
                      ("email",))
    proposal = proposal_of("gemini25pro", like_ctx(users_table(indexes=[plain])))
    assert "text_pattern_ops" in proposal.sql_commands[0]
    pattern = IndexInfo("users_email_like", "CREATE INDEX users_email_like ON public.users USING btree "
                                            "(email text_pattern_ops)", ("email",))
    ctx = like_ctx(users_table(indexes=[pattern]))
    analysis = analyze("gemini25pro", ctx)
    assert propose("gemini25pro", ctx, analysis) is None
    assert any("users_email_like already covers" in line for line in analysis.insights)


@pytest.mark.parametrize("condition", [
    "email NOT LIKE 'user12%'", "email LIKE '%12'", "email ILIKE 'user12%'",
    "(email LIKE 'user12%' OR tier = 'pro')", "NOT (email LIKE 'user12%')"])
def test_no_pattern_index_for_what_a_prefix_cannot_find(condition: str) -> None:
    ctx = scan_ctx(f"SELECT id FROM users WHERE {condition}", users_table(), 0.01, "(x)")
    for agent in STRATEGISTS:
        proposal = propose(agent, ctx, analyze(agent, ctx))
        assert proposal is None or "pattern_ops" not in proposal.sql_commands[0], (agent, proposal)


def test_a_like_prefix_with_order_by_on_the_same_column_keeps_the_sort() -> None:
    ctx = scan_ctx(LIKE_QUERY + " ORDER BY u.email", users_table(), 0.011, "(email ~~ 'user12%'::text)")
    analysis = analyze("gemini25pro", ctx)
    proposal = proposal_of("gemini25pro", ctx)
    assert "(email text_pattern_ops)" in proposal.sql_commands[0]
    assert "no Sort node" not in " ".join(proposal.validation_steps)
    assert any("byte by byte" in line for line in analysis.insights)


def test_lower_equality_gets_an_expression_index_and_analyze() -> None:
    ctx = lower_ctx()
    proposal = proposal_of("gemini25pro", ctx)
    assert proposal.proposal_type == "index"
    assert proposal.sql_commands == ("CREATE INDEX afs_users_lower_email_idx ON users ((lower(email)))",
                                     "ANALYZE users")
    assert proposal.rollback_commands == ("DROP INDEX IF EXISTS afs_users_lower_email_idx",)
    assert "a plain index on email cannot" in proposal.rationale
    assert "statistics on the indexed expression" in proposal.validation_steps[0]
    # an existing index on the expression serves it: nothing to add
    existing = IndexInfo("users_lower_email", "CREATE INDEX users_lower_email ON public.users USING btree "
                                              "(lower(email))", ("lower(email)",))
    again = context(ctx.query, ctx.features, ctx.plan, [users_table(indexes=[existing])], ctx.execution_ms)
    analysis = analyze("gemini25pro", again)
    assert propose("gemini25pro", again, analysis) is None
    assert any("users_lower_email already serves lower(email) = " in line for line in analysis.insights)


def test_lower_like_prefix_gets_an_expression_index_with_text_pattern_ops() -> None:
    ctx = scan_ctx("SELECT id FROM users WHERE lower(email) LIKE 'user12%'", users_table(), 0.011,
                   "(lower(email) ~~ 'user12%'::text)")
    assert proposal_of("gemini25pro", ctx).sql_commands[0] == (
        "CREATE INDEX afs_users_lower_email_pattern_idx ON users ((lower(email)) text_pattern_ops)")


def test_jsonb_containment_gets_a_gin_index_with_jsonb_path_ops() -> None:
    ctx = contains_ctx()
    analysis = analyze("gemini25pro", ctx)
    proposal = proposal_of("gemini25pro", ctx)
    assert proposal.sql_commands == (
        "CREATE INDEX afs_events_payload_gin ON events USING gin (payload jsonb_path_ops)",)
    assert proposal.rollback_commands == ("DROP INDEX IF EXISTS afs_events_payload_gin",)
    assert validate_proposal(proposal.sql_commands, proposal.proposal_type).risk_level == "medium"
    assert proposal.estimated_impact.risk == "medium"
    assert "GIN index costs more on writes" in proposal.rationale
    assert "Bitmap Index Scan using afs_events_payload_gin" in proposal.validation_steps[0]
    assert any("keeps ~5.0 % of rows (~25,000, observed in the plan)" in line for line in analysis.insights)
    # sized from the jsonb's real width: 500,000 rows of ~50 bytes
    assert 1 < proposal.estimated_impact.storage_overhead_mb < 10


def test_an_existing_gin_index_serves_containment_but_jsonb_path_ops_cannot_test_keys() -> None:
    path_ops = IndexInfo("events_payload_gin", "CREATE INDEX events_payload_gin ON public.events USING gin "
                                               "(payload jsonb_path_ops)", ("payload",))
    ctx = contains_ctx(events(indexes=[path_ops]))
    assert propose("gemini25pro", ctx, analyze("gemini25pro", ctx)) is None
    keys = scan_ctx("SELECT id FROM events WHERE payload ? 'method'", events(indexes=[path_ops]), 0.04,
                    "(payload ? 'method'::text)")
    assert proposal_of("gemini25pro", keys).sql_commands == (
        "CREATE INDEX afs_events_payload_gin ON events USING gin (payload)",)


def test_a_gin_index_for_array_containment() -> None:
    posts = TableInfo(name="posts", rows=300_000, size_mb=60.0,
                      columns=(ColumnInfo("id", "bigint", False), ColumnInfo("tags", "text[]")),
                      indexes=(), primary_key=("id",))
    ctx = scan_ctx("SELECT id FROM posts WHERE tags @> ARRAY['postgres']", posts, 0.002,
                   "(tags @> '{postgres}'::text[])")
    assert proposal_of("gemini25pro", ctx).sql_commands == (
        "CREATE INDEX afs_posts_tags_gin ON posts USING gin (tags)",)


def test_a_jsonb_key_equality_gets_an_expression_btree() -> None:
    proposal = proposal_of("gemini25pro", json_key_ctx())
    assert proposal.sql_commands == (
        "CREATE INDEX afs_events_payload_query_idx ON events ((payload ->> 'query'))", "ANALYZE events")


@pytest.mark.parametrize(("condition", "key"), [
    ("(payload ->> 'product_id')::int = 54", "(((payload ->> 'product_id')::int))"),
    ("payload -> 'a' ->> 'b' IN ('x', 'y')", "((payload -> 'a' ->> 'b'))"),
    ("'lego' = payload ->> 'query'", "((payload ->> 'query'))"),
])
def test_json_expressions_the_planner_can_match(condition: str, key: str) -> None:
    ctx = scan_ctx(f"SELECT id FROM events WHERE {condition}", events(), 0.001, "(x)")
    assert proposal_of("gemini25pro", ctx).sql_commands[0].endswith(f" ON events {key}")


@pytest.mark.parametrize("condition", [
    "(payload ->> 'at')::timestamptz = '2025-01-01'",  # not immutable: CREATE INDEX would fail
    "payload #>> '{a,b}' = 'x'", "lower(email) <> 'x'", "payload ->> 'query' = kind"])
def test_no_expression_index_where_none_can_serve(condition: str) -> None:
    table = users_table() if "email" in condition else events()
    ctx = scan_ctx(f"SELECT id FROM {table.name} WHERE {condition}", table, 0.001, "(x)")
    for agent in STRATEGISTS:
        assert propose(agent, ctx, analyze(agent, ctx)) is None, agent


def test_flash_falls_back_to_pattern_and_expression_btrees_and_to_gin_only_without_one() -> None:
    for make, sql in ((like_ctx, "CREATE INDEX afs_users_email_pattern_idx ON users "
                                 "(email text_pattern_ops)"),
                      (lower_ctx, "CREATE INDEX afs_users_lower_email_idx ON users ((lower(email)))"),
                      (contains_ctx, "CREATE INDEX afs_events_payload_gin ON events USING gin "
                                     "(payload jsonb_path_ops)")):
        for agent in ("gemini25flash", "gemini20flash"):
            assert proposal_of(agent, make()).sql_commands[0] == sql
    both = scan_ctx(CONTAINS_QUERY + " AND payload ->> 'device' = 'tablet'", events(), 0.05, "(x)")
    assert "USING gin" not in proposal_of("gemini25flash", both).sql_commands[0]


def test_a_narrow_text_column_rides_in_include_a_wide_one_does_not() -> None:
    query = "SELECT o.id, o.status FROM orders o WHERE o.user_id = 4242"
    plan = seq_scan("orders", "o", rows=41, removed=ORDERS_ROWS - 41, ms=150.0, filter="(user_id = 4242)")

    def sql(status: ColumnStats) -> str:
        from afs.query.features import extract_features

        table = orders(stats={**ORDERS_STATS, "status": status})
        ctx = context(query, extract_features(query), plan, [table], 150.2)
        return proposal_of("gemini25pro", ctx).sql_commands[0]

    narrow = dataclasses.replace(ORDERS_STATS["status"], avg_width=9)
    wide = dataclasses.replace(ORDERS_STATS["status"], avg_width=40)
    assert sql(narrow) == "CREATE INDEX afs_orders_user_id_idx ON orders (user_id) INCLUDE (id, status)"
    assert sql(wide) == "CREATE INDEX afs_orders_user_id_idx ON orders (user_id)"
    assert sql(ORDERS_STATS["status"]) == "CREATE INDEX afs_orders_user_id_idx ON orders (user_id)"  # unknown


def test_storage_estimates_use_the_real_average_width() -> None:
    def storage(width: int) -> float:
        email = dataclasses.replace(EMAIL_STATS, avg_width=width)
        proposal = proposal_of("gemini25pro", like_ctx(users_table(email=email)))
        return proposal.estimated_impact.storage_overhead_mb

    assert storage(60) > 1.5 * storage(19)


def test_like_prefix_and_prefix_fraction() -> None:
    assert like_prefix("user12%") == "user12"
    assert like_prefix("a_b%") == "a"
    assert like_prefix(r"50\%%") == "50%"
    assert like_prefix("%x") == ""
    assert prefix_fraction(EMAIL_STATS, "user12", USERS_ROWS) == pytest.approx(0.01)
    assert prefix_fraction(EMAIL_STATS, "zzz", USERS_ROWS) == pytest.approx(0.005)
    kinds = ColumnStats(n_distinct=3, most_common_vals=("page_view", "purchase", "click"),
                        most_common_freqs=(0.55, 0.05, 0.4))
    assert prefix_fraction(kinds, "pu", 1000) == pytest.approx(0.05)
    assert prefix_fraction(None, "x", 1000) is None


# -- gemini-2.5-flash -------------------------------------------------------------------------
def test_time_range_on_two_million_rows_gets_monthly_partitioning() -> None:
    ctx = range_ctx()
    analysis = analyze("gemini25flash", ctx)
    proposal = propose("gemini25flash", ctx, analysis)
    assert proposal is not None and proposal.proposal_type == "partitioning"
    sql = proposal.sql_commands
    assert sql[0] == ("CREATE TABLE orders_afs_part (LIKE orders INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
                      "PARTITION BY RANGE (created_at)")
    months = [s for s in sql if "FOR VALUES FROM" in s]
    assert len(months) == 25  # 2024-01 … 2026-01: the histogram spans 2024-01-02 … 2026-01-01
    assert months[0].endswith("FOR VALUES FROM ('2024-01-01 00:00:00+00') TO ('2024-02-01 00:00:00+00')")
    assert any(s.endswith("PARTITION OF orders_afs_part DEFAULT") for s in sql)
    assert "INSERT INTO orders_afs_part SELECT * FROM orders" in sql
    # the primary key comes back as a unique index that includes the partition key
    assert any(s.startswith("CREATE UNIQUE INDEX") and "(id, created_at)" in s for s in sql)
    assert sql[-3:] == ("ALTER TABLE orders RENAME TO orders_afs_old",
                        "ALTER TABLE orders_afs_part RENAME TO orders", "ANALYZE orders")
    assert proposal.rollback_commands == ("ALTER TABLE orders RENAME TO orders_afs_part",
                                          "ALTER TABLE orders_afs_old RENAME TO orders",
                                          "DROP TABLE IF EXISTS orders_afs_part")
    assert "No foreign key references orders" in proposal.rationale
    assert proposal.estimated_impact.risk == "medium"
    assert any("correlation with the physical row order is 1.00" in line for line in analysis.insights)
    assert any("keeps ~4.1 % of them (histogram)" in line for line in analysis.insights)


def test_a_table_referenced_by_foreign_keys_gets_brin_instead_of_partitioning() -> None:
    base = range_ctx()
    table = dataclasses.replace(orders(), referenced_by=("order_items",))
    ctx = context(base.query, base.features, base.plan, [table], base.execution_ms)
    analysis = analyze("gemini25flash", ctx)
    proposal = proposal_of("gemini25flash", ctx)
    assert proposal.sql_commands == (
        "CREATE INDEX afs_orders_created_at_brin ON orders USING brin (created_at)",)
    assert "leaves the foreign keys of order_items intact" in proposal.rationale
    assert any("referenced by foreign keys of order_items" in line and "BRIN" in line
               for line in analysis.insights)


def test_partitioning_a_referenced_table_names_the_foreign_keys_it_breaks() -> None:
    """Uncorrelated: BRIN would not prune, so partitioning stays, with the caveat spelled out."""
    stats = dict(ORDERS_STATS)
    stats["created_at"] = dataclasses.replace(ORDERS_STATS["created_at"], correlation=0.1)
    base = range_ctx()
    table = dataclasses.replace(orders(stats=stats), referenced_by=("invoices", "order_items"))
    ctx = context(base.query, base.features, base.plan, [table], base.execution_ms)
    proposal = proposal_of("gemini25flash", ctx)
    assert proposal.proposal_type == "partitioning"
    assert ("Foreign keys of invoices and order_items reference orders: after the swap they still point "
            "at the renamed old copy orders_afs_old") in proposal.rationale
    assert "unique keys must include created_at" in proposal.rationale
    assert proposal.estimated_impact.risk == "high"


def test_time_range_on_a_smaller_correlated_table_gets_brin() -> None:
    ctx = range_ctx(rows=400_000)
    proposal = propose("gemini25flash", ctx, analyze("gemini25flash", ctx))
    assert proposal is not None and proposal.proposal_type == "index"
    assert proposal.sql_commands == (
        "CREATE INDEX afs_orders_created_at_brin ON orders USING brin (created_at)",)
    assert proposal.rollback_commands == ("DROP INDEX IF EXISTS afs_orders_created_at_brin",)
    assert proposal.estimated_impact.storage_overhead_mb < 1
    assert "correlation 1.00" in proposal.rationale


def test_uncorrelated_time_column_gets_no_brin() -> None:
    stats = dict(ORDERS_STATS)
    stats["created_at"] = ColumnStats(n_distinct=-1, correlation=0.02,
                                      histogram_bounds=ORDERS_STATS["created_at"].histogram_bounds)
    base = range_ctx(rows=400_000)
    ctx = context(base.query, base.features, base.plan, [orders(400_000, stats=stats)], base.execution_ms)
    analysis = analyze("gemini25flash", ctx)
    proposal = propose("gemini25flash", ctx, analysis)
    assert proposal is None or "brin" not in proposal.sql_commands[0]
    assert any("BRIN would not prune" in line for line in analysis.insights)


def test_flash_on_equality_only_falls_back_to_a_plain_index() -> None:
    ctx = issue_ctx()
    analysis = analyze("gemini25flash", ctx)
    proposal = propose("gemini25flash", ctx, analysis)
    assert proposal is not None
    assert proposal.sql_commands == ("CREATE INDEX afs_orders_user_id_idx ON orders (user_id)",)
    assert any("structure changes" in line and "aren't warranted" in line for line in analysis.insights)


def test_a_range_relative_to_now_is_judged_from_the_plan() -> None:
    """`created_at >= now() - interval '7 days'` has no literal bound: the plan says 1 % is kept."""
    query = "SELECT o.id FROM orders o WHERE o.created_at >= now() - interval '7 days'"
    feats = features(["orders"], [use("orders", "id", "select"),
                                  use("orders", "created_at", "range", ">=", None)], {"o": "orders"})
    plan = node("Gather", seq_scan("orders", "o", rows=6_600, removed=660_000, ms=150.0, loops=3,
                                   filter="(created_at >= (now() - '7 days'::interval))"),
                rows=19_800, ms=190.0, Workers_Launched=2)
    ctx = context(query, feats, plan, [orders(400_000)], 190.2)
    analysis = analyze("gemini25flash", ctx)
    proposal = propose("gemini25flash", ctx, analysis)
    assert proposal is not None and "USING brin (created_at)" in proposal.sql_commands[0]
    assert any("keeps ~0.99 % of them (observed in the plan)" in line for line in analysis.insights)
    pro = propose("gemini25pro", ctx, analyze("gemini25pro", ctx))
    assert pro is not None and "(created_at) INCLUDE (id)" in pro.sql_commands[0]


def test_partitioning_gives_each_copied_index_its_own_name() -> None:
    """A B-tree and a BRIN on created_at both come back on the partitioned table."""
    table = orders(indexes=[
        IndexInfo("orders_created_at_idx", "CREATE INDEX orders_created_at_idx ON public.orders "
                  "USING btree (created_at)", ("created_at",)),
        IndexInfo("orders_created_at_brin", "CREATE INDEX orders_created_at_brin ON public.orders "
                  "USING brin (created_at) WITH (pages_per_range='32')", ("created_at",))])
    stats = dict(ORDERS_STATS)
    stats["created_at"] = dataclasses.replace(ORDERS_STATS["created_at"], correlation=0.1)
    base = range_ctx()
    ctx = context(base.query, base.features, base.plan, [dataclasses.replace(table, column_stats=stats)],
                  base.execution_ms)
    proposal = proposal_of("gemini25flash", ctx)
    assert proposal.proposal_type == "partitioning"
    copies = [s for s in proposal.sql_commands if s.startswith("CREATE INDEX")]
    assert len(copies) == 2 and len({s.split()[2] for s in copies}) == 2
    assert copies[1].endswith("ON orders_afs_part USING brin (created_at) WITH (pages_per_range='32')")


def test_object_names_stay_distinct_when_the_hashed_name_is_taken_too() -> None:
    first = index_name("orders", ["user_id"])
    second = index_name("orders", ["user_id"], taken=[first])
    third = index_name("orders", ["user_id"], taken=[first, second])
    assert len({first, second, third}) == 3 and all(len(n) <= 63 for n in (first, second, third))
    # the partitioned copy and the old table of a long-named table: PostgreSQL would cut both to one name
    table = "customer_transaction_ledger_entries_for_the_accounting_dept"
    part, old = (structure._migration_name(table, role) for role in ("part", "old"))
    assert part != old and len(part) <= 63 and len(old) <= 63
    assert structure._migration_name("orders", "old") == "orders_afs_old"


def test_partitioning_is_capped_at_36_partitions_plus_default() -> None:
    stats = dict(ORDERS_STATS)
    stats["created_at"] = ColumnStats(n_distinct=-1, correlation=0.99,
                                      histogram_bounds=("2019-03-04 10:00:00+00", "2022-01-01 00:00:00+00",
                                                        "2025-12-31 23:00:00+00"))
    base = range_ctx()
    ctx = context(base.query, base.features, base.plan, [orders(stats=stats)], base.execution_ms)
    proposal = propose("gemini25flash", ctx, analyze("gemini25flash", ctx))
    assert proposal is not None and proposal.proposal_type == "partitioning"
    parts = [s for s in proposal.sql_commands if "PARTITION OF" in s]
    assert len(parts) <= 37
    assert "by quarter" in proposal.rationale


# -- gemini-2.0-flash -------------------------------------------------------------------------
def test_aggregation_gets_a_materialized_view_and_the_rewrite_reading_it() -> None:
    ctx = agg_ctx()
    analysis = analyze("gemini20flash", ctx)
    proposal = propose("gemini20flash", ctx, analysis)
    assert proposal is not None and proposal.proposal_type == "materialized_view"
    assert proposal.needs_refresh
    mv = re.match(r"CREATE MATERIALIZED VIEW (afs_mv_[0-9a-f]{10}) AS (.*)$", proposal.sql_commands[0])
    assert mv is not None
    name, definition = mv.groups()
    # no 'DE' in the view: it keeps every country, and the rewrite sums up the one asked for
    assert definition == ("SELECT o.status, o.shipping_country, COUNT(*) AS n, "
                          "SUM(o.total_amount) AS revenue "
                          "FROM orders AS o GROUP BY o.status, o.shipping_country")
    assert proposal.rewritten_query == (
        f"SELECT status, CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n, SUM(revenue) AS revenue FROM {name} "
        "WHERE shipping_country = 'DE' GROUP BY status ORDER BY revenue DESC")
    # 6 statuses × 14 countries, looked up by country: a unique index, refreshed concurrently
    assert proposal.sql_commands[1:] == (
        f"CREATE UNIQUE INDEX {name}_shipping_country_status_key ON {name} (shipping_country, status)",
        f"ANALYZE {name}")
    assert proposal.rollback_commands == (f"DROP MATERIALIZED VIEW IF EXISTS {name}",)
    assert "REFRESH MATERIALIZED VIEW CONCURRENTLY" in proposal.rationale
    assert "stale between refreshes" in proposal.rationale and "re-aggregates" in proposal.rationale
    assert any("2,000,000 rows to produce ~84 view rows" in line for line in analysis.insights)
    assert proposal.estimated_impact.query_time_improvement >= 90


def test_a_view_without_filters_is_the_query_itself() -> None:
    query = ("SELECT o.status, count(*) AS n, sum(o.total_amount) AS revenue FROM orders o "
             "GROUP BY o.status ORDER BY revenue DESC")
    ctx = dataclasses.replace(agg_ctx(), query=query)
    proposal = propose("gemini20flash", ctx, analyze("gemini20flash", ctx))
    assert proposal is not None and proposal.rewritten_query is not None
    name = proposal.sql_commands[0].split()[3]
    assert proposal.sql_commands[0].endswith("FROM orders AS o GROUP BY o.status")
    assert proposal.rewritten_query == f"SELECT * FROM {name} ORDER BY revenue DESC"
    # six rows read whole: no index on the view, just statistics
    assert proposal.sql_commands[1:] == (f"ANALYZE {name}",)
    assert "a unique index on (status) would allow CONCURRENTLY" in proposal.rationale


LITERAL = re.compile(r"'[^']*'|\b\d+(?:\.\d+)?\b")


def literals_of(query: str) -> set[str]:
    """The literals of a query's WHERE and HAVING clauses."""
    from afs.query.shape import read_query

    tree = read_query(query)
    assert tree is not None
    found: set[str] = set()
    for clause in ("where", "having"):
        node = tree.args.get(clause)
        if node is not None:
            found |= set(LITERAL.findall(node.sql(dialect="postgres")))
    return found


def assert_no_baked_literal(query: str, view: MaterializedView) -> None:
    in_view = set(LITERAL.findall(view.definition))
    assert literals_of(query), query
    assert not literals_of(query) & in_view, view.definition


def test_a_literal_filter_becomes_a_group_key_and_the_rewrite_re_aggregates() -> None:
    query = ("SELECT o.status, count(*) AS n, sum(o.total_amount) AS revenue, min(o.created_at) AS first, "
             "avg(o.total_amount) AS mean FROM orders o WHERE o.shipping_country IN ('DE', 'FR') "
             "GROUP BY o.status HAVING count(*) > 10 ORDER BY revenue DESC LIMIT 3")
    view = materialize(Query.read(query))
    assert isinstance(view, MaterializedView) and view.regrouped
    assert_no_baked_literal(query, view)
    assert view.definition == (
        "SELECT o.status, o.shipping_country, COUNT(*) AS n, SUM(o.total_amount) AS revenue, "
        "MIN(o.created_at) AS first, SUM(o.total_amount) AS afs_a1, COUNT(o.total_amount) AS afs_a2 "
        "FROM orders AS o GROUP BY o.status, o.shipping_country")
    assert view.rewrite == (
        "SELECT status, CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n, SUM(revenue) AS revenue, "
        f"MIN(first) AS first, SUM(afs_a1) / NULLIF(SUM(afs_a2), 0) AS mean FROM {view.name} "
        "WHERE shipping_country IN ('DE', 'FR') GROUP BY status "
        "HAVING CAST(COALESCE(SUM(n), 0) AS BIGINT) > 10 ORDER BY revenue DESC LIMIT 3")
    assert view.filter_columns == ("shipping_country",)
    assert view.group_columns == ("status", "shipping_country")


def test_a_scalar_aggregate_with_a_filter_reads_the_view_by_the_filtered_column() -> None:
    query = "SELECT count(*) AS n, sum(total_amount) AS total FROM orders WHERE status = 'pending'"
    view = materialize(Query.read(query))
    assert isinstance(view, MaterializedView)
    assert_no_baked_literal(query, view)
    assert view.definition == ("SELECT status, COUNT(*) AS n, SUM(total_amount) AS total FROM orders "
                               "GROUP BY status")
    # no row matches: count 0 and sum NULL, as the query gives
    assert view.rewrite == ("SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n, SUM(total) AS total "
                            f"FROM {view.name} WHERE status = 'pending'")


def test_a_filter_on_the_group_key_moves_to_the_rewrite_and_gets_the_index() -> None:
    query = "SELECT o.user_id, count(*) FROM orders o WHERE o.user_id = 4242 GROUP BY o.user_id"
    view = materialize(Query.read(query))
    assert isinstance(view, MaterializedView) and not view.regrouped
    assert_no_baked_literal(query, view)
    assert view.definition == "SELECT o.user_id, COUNT(*) AS count FROM orders AS o GROUP BY o.user_id"
    assert view.rewrite == f"SELECT * FROM {view.name} WHERE user_id = 4242"
    assert view.filter_columns == ("user_id",) and view.group_columns == ("user_id",)


def test_a_filter_beside_the_group_key_is_grouped_too() -> None:
    query = ("SELECT o.user_id, count(*) FROM orders o WHERE o.user_id = 4242 AND o.status <> 'cancelled' "
             "GROUP BY o.user_id")
    view = materialize(Query.read(query))
    assert isinstance(view, MaterializedView) and view.regrouped
    assert_no_baked_literal(query, view)
    assert view.definition == ("SELECT o.user_id, o.status, COUNT(*) AS count FROM orders AS o "
                               "GROUP BY o.user_id, o.status")
    assert view.rewrite == ("SELECT user_id, CAST(COALESCE(SUM(count), 0) AS BIGINT) AS count "
                            f"FROM {view.name} WHERE user_id = 4242 AND status <> 'cancelled' "
                            "GROUP BY user_id")


def test_having_moves_to_the_rewrite() -> None:
    query = "SELECT status, count(*) AS n FROM orders GROUP BY status HAVING count(*) > 100 AND max(id) < 7"
    view = materialize(Query.read(query))
    assert isinstance(view, MaterializedView)
    assert_no_baked_literal(query, view)
    assert view.definition == "SELECT status, COUNT(*) AS n, MAX(id) AS afs_h3 FROM orders GROUP BY status"
    assert view.rewrite == f"SELECT status, n FROM {view.name} WHERE n > 100 AND afs_h3 < 7"


@pytest.mark.parametrize(("query", "reason"), [
    ("SELECT status, count(DISTINCT user_id) FROM orders WHERE shipping_country = 'DE' GROUP BY status",
     "distinct"),
    ("SELECT status, string_agg(shipping_country, ',') FROM orders WHERE user_id = 3 GROUP BY status",
     "cannot be re-aggregated"),
    ("SELECT a.id, count(*) FROM a JOIN b ON b.a_id = a.id AND b.kind = 'x' GROUP BY a.id", "JOIN condition"),
    ("SELECT DISTINCT status FROM orders WHERE user_id = 3", "DISTINCT"),
    ("SELECT status, count(*) FROM orders WHERE user_id IN (SELECT id FROM users WHERE tier = 'pro') "
     "GROUP BY status", "subquery"),
])
def test_a_literal_that_cannot_leave_the_view_means_no_view(query: str, reason: str) -> None:
    result = materialize(Query.read(query))
    assert isinstance(result, str) and reason in result, result


def test_a_float_sum_is_not_re_aggregated_when_the_type_is_known() -> None:
    query = "SELECT status, sum(score) FROM orders WHERE user_id = 3 GROUP BY status"
    assert isinstance(materialize(Query.read(query)), MaterializedView)
    result = materialize(Query.read(query), lambda c: "double precision" if c.name == "score" else "bigint")
    assert isinstance(result, str) and "floating-point" in result


def test_a_timestamp_range_would_make_the_view_as_large_as_the_table() -> None:
    """Grouped by created_at itself (exact, but one row per order): an index instead."""
    ctx = agg_ctx(by_time=True)
    view = materialize(Query.read(ctx.query))
    assert isinstance(view, MaterializedView) and "created_at" in view.group_columns
    assert_no_baked_literal(ctx.query, view)
    analysis = analyze("gemini20flash", ctx)
    proposal = propose("gemini20flash", ctx, analysis)
    assert proposal is None or proposal.proposal_type != "materialized_view"
    assert any("nearly the table itself" in line for line in analysis.insights)


def test_a_view_filtered_on_its_group_key_gets_a_unique_index_and_concurrent_refresh() -> None:
    query = ("SELECT o.user_id, count(*) AS orders, sum(o.total_amount) AS spent FROM orders o "
             "WHERE o.user_id = 4242 GROUP BY o.user_id")
    feats = features(["orders"], [use("orders", "user_id", "select"), use("orders", "total_amount", "select"),
                                  use("orders", "user_id", "equality", "=", 4242),
                                  use("orders", "user_id", "group")], {"o": "orders"}, aggregations=2)
    plan = node("Aggregate", seq_scan("orders", "o", rows=41, removed=1_999_959, ms=150.0,
                                      filter="(user_id = 4242)"), rows=1, ms=150.2, Strategy="Plain")
    ctx = context(query, feats, plan, [orders()], 150.4)
    proposal = propose("gemini20flash", ctx, analyze("gemini20flash", ctx))
    assert proposal is not None and proposal.proposal_type == "materialized_view"
    name = proposal.sql_commands[0].split()[3]
    assert proposal.sql_commands[1] == f"CREATE UNIQUE INDEX {name}_user_id_key ON {name} (user_id)"
    assert proposal.rewritten_query == f"SELECT * FROM {name} WHERE user_id = 4242"
    assert "REFRESH MATERIALIZED VIEW CONCURRENTLY" in proposal.rationale
    assert "moves from the view to the rewrite" in proposal.rationale
    # the view holds every user: sized from n_distinct, not from the plan's single group
    assert proposal.estimated_impact.storage_overhead_mb > 1


def test_materialize_keeps_names_order_and_limit() -> None:
    query = ("SELECT date_trunc('month', created_at), count(*), count(DISTINCT user_id) FROM orders "
             "GROUP BY 1 ORDER BY count(DISTINCT user_id) DESC, 1 LIMIT 5")
    view = materialize(Query.read(query))
    assert isinstance(view, MaterializedView)
    # two columns PostgreSQL would both call "count": the second gets a view name and is renamed back
    assert view.columns == ("date_trunc", "count", "afs_c3")
    assert view.rewrite == (f"SELECT date_trunc, count, afs_c3 AS count FROM {view.name} "
                            "ORDER BY afs_c3 DESC, 1 LIMIT 5")


def test_materialize_orders_by_a_hidden_column_when_the_sort_is_not_selected() -> None:
    view = materialize(Query.read(
        "SELECT status FROM orders GROUP BY status ORDER BY sum(total_amount) DESC"))
    assert isinstance(view, MaterializedView)
    assert view.definition == ("SELECT status, SUM(total_amount) AS afs_o2 FROM orders GROUP BY status")
    assert view.rewrite == f"SELECT status FROM {view.name} ORDER BY afs_o2 DESC"


def test_materialize_folds_unquoted_names_as_postgresql_does() -> None:
    """`N` names the view's column `n`: the rewrite must not quote it back into "N"."""
    view = materialize(Query.read(
        "SELECT Status, count(*) AS N FROM Orders WHERE Status = 'x' GROUP BY Status "
                       "ORDER BY N DESC"))
    assert isinstance(view, MaterializedView)
    assert view.definition == "SELECT status, COUNT(*) AS n FROM orders GROUP BY status"
    assert view.rewrite == f"SELECT * FROM {view.name} WHERE status = 'x' ORDER BY n DESC"
    quoted = materialize(Query.read('SELECT "Status", count(*) FROM t GROUP BY "Status" ORDER BY "Status"'))
    assert isinstance(quoted, MaterializedView)
    assert quoted.rewrite == f'SELECT * FROM {quoted.name} ORDER BY "Status"'


def test_materialize_in_a_join_keeps_apart_columns_of_the_same_name() -> None:
    """`b.id = 5` filters other rows than `a.id = 5`: b.id is a group key of its own, and
    `ORDER BY b.id` is not the output column a.id."""
    kept = materialize(Query.read(
        "SELECT a.id, count(*) FROM a JOIN b ON b.a_id = a.id WHERE b.id = 5 GROUP BY a.id"))
    assert isinstance(kept, MaterializedView)
    assert kept.definition == ("SELECT a.id, b.id AS afs_g1, COUNT(*) AS count "
                               "FROM a JOIN b ON b.a_id = a.id "
                               "GROUP BY a.id, b.id")
    assert kept.rewrite == (f"SELECT id, CAST(COALESCE(SUM(count), 0) AS BIGINT) AS count FROM {kept.name} "
                            "WHERE afs_g1 = 5 GROUP BY id")
    ordered = materialize(Query.read("SELECT a.id, count(*) FROM a JOIN b ON b.a_id = a.id "
                          "GROUP BY a.id, b.id ORDER BY b.id"))
    assert isinstance(ordered, MaterializedView)
    assert ordered.definition == ("SELECT a.id, COUNT(*) AS count, b.id AS afs_o3 FROM a "
                                  "JOIN b ON b.a_id = a.id GROUP BY a.id, b.id")
    assert ordered.group_columns == ("id", "afs_o3")
    assert ordered.rewrite == f"SELECT id, count FROM {ordered.name} ORDER BY afs_o3"


@pytest.mark.parametrize(("query", "reason"), [
    ("SELECT status, count(*) FROM orders WHERE created_at > now() - interval '1 day' GROUP BY status",
     "freeze"),
    ("SELECT status, count(*) FROM orders WHERE user_id = $1 GROUP BY status", "parameters"),
    ("SELECT id, total_amount FROM orders WHERE user_id = 1", "no aggregation"),
    ("SELECT DISTINCT ON (user_id) user_id, id FROM orders ORDER BY user_id, created_at DESC", "DISTINCT ON"),
])
def test_materialize_refuses_what_it_cannot_keep_equal(query: str, reason: str) -> None:
    result = materialize(Query.read(query))
    assert isinstance(result, str) and reason in result


def test_precomputation_on_a_non_aggregate_query_proposes_a_low_risk_index() -> None:
    ctx = issue_ctx()
    analysis = analyze("gemini20flash", ctx)
    proposal = propose("gemini20flash", ctx, analysis)
    assert proposal is not None and proposal.proposal_type == "index"
    assert proposal.estimated_impact.risk == "low" and proposal.rewritten_query is None
    assert any("no aggregation to precompute" in line for line in analysis.insights)


def test_precomputation_skips_a_small_aggregation() -> None:
    feats = features(["users"], [use("users", "country", "group")], aggregations=1)
    plan = node("Aggregate", seq_scan("users", "users", rows=2000, removed=0, ms=0.2), rows=14, ms=0.6,
                Strategy="Hashed", Group_Key=["country"])
    ctx = context("SELECT country, count(*) FROM users GROUP BY country", feats, plan, [users(2000)], 0.7)
    analysis = analyze("gemini20flash", ctx)
    assert propose("gemini20flash", ctx, analysis) is None
    assert any("would not pay" in line for line in analysis.insights)


# -- all of them ------------------------------------------------------------------------------
def test_different_queries_get_different_proposals() -> None:
    seen: dict[tuple[str, ...], str] = {}
    for name, make in SCENARIOS.items():
        if name == "indexed":
            continue
        ctx = make()
        best = next(p for p in (propose(a, ctx, analyze(a, ctx)) for a in STRATEGISTS) if p is not None)
        assert best.sql_commands not in seen, f"{name} got the same proposal as {seen.get(best.sql_commands)}"
        seen[best.sql_commands] = name
    kinds = {name: {a: (p.proposal_type if p else None) for n, a, p in all_outputs() if n == name}
             for name in SCENARIOS}
    assert kinds["issue"]["gemini25pro"] == "partial_index"
    assert kinds["like"]["gemini25pro"] == "composite_index"  # the pattern key INCLUDEs id
    assert kinds["lower"]["gemini25pro"] == kinds["contains"]["gemini25pro"] == "index"
    assert kinds["range"]["gemini25flash"] == "partitioning"
    assert kinds["aggregate"]["gemini20flash"] == "materialized_view"
    assert kinds["join"]["gemini25pro"] == "index"
    assert kinds["indexed"]["gemini25pro"] is None


@pytest.mark.parametrize(("scenario", "agent"), [(s, a) for s in SCENARIOS for a in AGENTS])
def test_every_output_is_well_formed(scenario: str, agent: str) -> None:
    ctx = SCENARIOS[scenario]()
    analysis = analyze(agent, ctx)
    assert analysis.insights and analysis.proposed_actions
    assert 0.0 <= analysis.confidence <= 1.0
    assert {"query_complexity", "estimated_improvement", "target_table"} <= set(analysis.metadata)
    proposal = propose(agent, ctx, analysis)
    if proposal is None:
        return
    assert proposal.agent == agent and proposal.proposal_type in PROPOSAL_TYPES
    assert proposal.sql_commands and proposal.rollback_commands and proposal.validation_steps
    assert proposal.rationale and re.search(r"\d", proposal.rationale)
    impact = proposal.estimated_impact
    assert 0 < impact.query_time_improvement <= 100 and impact.storage_overhead_mb >= 0
    validation = validate_proposal(proposal.sql_commands, proposal.proposal_type)
    assert validation.is_valid, validation.rejected
    for statement in iter_proposal_sql(proposal):
        assert not statement.rstrip().endswith(";")
        assert "CONCURRENTLY" not in statement
        assert len(pglast.parse_sql(statement)) == 1, statement
    for statement in proposal.sql_commands:
        for name in re.findall(r"CREATE (?:UNIQUE )?INDEX (\S+)|CREATE (?:MATERIALIZED VIEW|TABLE) (\S+)",
                               statement):
            assert all(len(n) <= 63 for n in name)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_features_extracted_from_the_query_give_the_same_proposals(scenario: str) -> None:
    """The hand-built features above say what afs.query.features says about these queries."""
    from afs.query.features import extract_features

    ctx = SCENARIOS[scenario]()
    real = context(ctx.query, extract_features(ctx.query), ctx.plan, ctx.tables.values(), ctx.execution_ms)
    for agent in STRATEGISTS:
        assert propose(agent, real, analyze(agent, real)) == propose(agent, ctx, analyze(agent, ctx))


def test_analysis_is_deterministic() -> None:
    for make in SCENARIOS.values():
        ctx = make()
        for agent in STRATEGISTS:
            assert analyze(agent, ctx) == analyze(agent, ctx)
            assert propose(agent, ctx, analyze(agent, ctx)) == propose(agent, ctx, analyze(agent, ctx))


def test_unknown_agent_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no offline strategist"):
        analyze("gpt-7", issue_ctx())


def test_one_strategist_per_agent() -> None:
    assert set(STRATEGISTS) == set(AGENTS)


def test_an_empty_plan_still_gives_a_proposal_from_the_statistics() -> None:
    ctx = issue_ctx(plan={}, execution_ms=0.0)
    proposal = propose("gemini25pro", ctx, analyze("gemini25pro", ctx))
    assert proposal is not None and "WHERE status = 'pending'" in proposal.sql_commands[0]


def test_the_modules_are_pure() -> None:
    for module in Path(strategists.__file__).parent.glob("*.py"):
        tree = ast.parse(module.read_text())
        imported = {alias.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for alias in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {"trio", "psycopg", "mcp", "httpx", "google", "anyio"}, module.name


# -- the shared evidence helpers ----------------------------------------------------------------
def test_equality_selectivity_from_pg_stats() -> None:
    status = ORDERS_STATS["status"]
    assert equality_selectivity(status, ORDERS_ROWS, "pending") == pytest.approx(0.0523)
    assert equality_selectivity(status, ORDERS_ROWS, ["pending", "paid"]) == pytest.approx(0.0523 + 0.0992)
    user = ORDERS_STATS["user_id"]
    rest = 1 - sum(user.most_common_freqs)
    assert equality_selectivity(user, ORDERS_ROWS, 4242) == pytest.approx(rest / (48_000 - 5))
    assert equality_selectivity(user, ORDERS_ROWS, 1) == pytest.approx(0.0092)
    # n_distinct < 0 is a fraction of the rows
    unique = ColumnStats(n_distinct=-1.0)
    assert equality_selectivity(unique, 1000, 7) == pytest.approx(1 / 1000)
    flags = ColumnStats(n_distinct=2, most_common_vals=("f", "t"), most_common_freqs=(0.9, 0.1))
    assert equality_selectivity(flags, 1000, True) == pytest.approx(0.1)
    assert equality_selectivity(None, 1000, 7) is None


def test_range_fraction_from_the_histogram() -> None:
    created = ORDERS_STATS["created_at"]
    june = range_fraction(created, "2025-06-01", "2025-07-01")
    assert june == pytest.approx(30 / 730, rel=0.05)
    assert range_fraction(created, "2030-01-01", None) == 0.0
    assert range_fraction(created, None, "2030-01-01") == pytest.approx(1.0)
    assert range_fraction(ColumnStats(), 1, 2) is None


def test_range_fraction_counts_the_most_common_values_apart() -> None:
    """The histogram describes the rows that are neither NULL nor a most common value."""
    stats = ColumnStats(null_frac=0.1, most_common_vals=("5", "50"), most_common_freqs=(0.3, 0.2),
                        histogram_bounds=("0", "10", "20", "30", "40"))
    assert range_fraction(stats, None, 20) == pytest.approx(0.3 + 0.5 * 0.4)
    assert range_fraction(stats, 45, None) == pytest.approx(0.2)
    assert range_fraction(stats, None, None) == pytest.approx(0.9)


def test_plan_nodes_multiply_loops_and_share_parallel_time() -> None:
    nodes = plan_nodes({"Plan": issue_ctx().plan})
    scan = next(n for n in nodes if n.node_type == "Seq Scan")
    assert scan.rows == 6 and scan.removed == 1_999_950 and scan.loops == 3
    assert scan.total_ms == pytest.approx(171.0)  # three processes, one wall-clock
    assert [n.node_type for n in nodes] == ["Sort", "Gather", "Seq Scan"]


def test_covering_index_matches_prefixes_only() -> None:
    table = orders(indexes=[
        IndexInfo("a", "CREATE INDEX a ON orders USING btree (user_id, created_at)",
                  ("user_id", "created_at")),
        IndexInfo("p", "CREATE INDEX p ON orders USING btree (user_id) WHERE (status = 'pending'::text)",
                  ("user_id",))])
    assert covering_index(table, ["user_id"]) is not None
    assert covering_index(table, ["user_id"], ["created_at"]) is not None
    assert covering_index(table, ["created_at"]) is None
    assert covering_index(table, ["user_id", "status"]) is None
    assert covering_index(table, [], ["user_id"], predicate="status = 'pending'") is not None
    assert covering_index(table, [], ["user_id"], predicate="status = 'paid'") is not None  # via `a`
    only_partial = orders(indexes=[table.indexes[2]])
    assert covering_index(only_partial, [], ["user_id"], predicate="status = 'paid'") is None
    assert covering_index(only_partial, [], ["user_id"], predicate="status = 'pending'") is not None


def test_flash_falls_back_to_a_summary_view_for_an_aggregation() -> None:
    """Routed a simple aggregation, gemini-2.5-flash proposes the rollup table of its seed role."""
    query = "SELECT o.status, count(*) AS n FROM orders o GROUP BY o.status"
    feats = features(["orders"], [use("orders", "status", "group"), use("orders", "status", "select")],
                     {"o": "orders"}, aggregations=1)
    plan = node("HashAggregate", seq_scan("orders", "o", rows=2_000_000, removed=0, ms=250.0),
                rows=6, ms=420.0, Group_Key=["o.status"])
    ctx = context(query, feats, plan, [orders()], 421.0)
    flash = STRATEGISTS["gemini25flash"].decide(ctx, "gemini25flash")
    assert flash.proposal is not None and flash.proposal.proposal_type == "materialized_view"
    assert flash.proposal.agent == "gemini25flash" and flash.proposal.rewritten_query
    # gemini-2.5-pro only does so for complex aggregations (complexity ≥ 5)
    pro = STRATEGISTS["gemini25pro"].decide(ctx, "gemini25pro")
    assert pro.proposal is None or pro.proposal.proposal_type != "materialized_view"


# -- plan fixes (every agent) -------------------------------------------------------------------
CORRELATED_QUERY = ("SELECT o.id, o.total_amount FROM orders o "
                    "WHERE o.status = 'pending' AND o.shipping_country = 'DE'")
CORRELATED_FILTER = "((status = 'pending'::text) AND (shipping_country = 'DE'::text))"


def correlated_ctx(planned: float, actual: float, filter: str = CORRELATED_FILTER,
                   query: str = CORRELATED_QUERY) -> AnalysisContext:
    from afs.query.features import extract_features

    plan = seq_scan("orders", "o", rows=actual, removed=ORDERS_ROWS - actual, ms=150.0, filter=filter)
    plan["Plan Rows"] = planned
    return context(query, extract_features(query), plan, [orders()], 180.0)


def test_a_tenfold_misestimate_on_two_filtered_columns_gets_extended_statistics() -> None:
    (fix,) = plan_fix_proposals(correlated_ctx(planned=870, actual=52_000), "gemini25pro")
    assert fix.proposal_type == "statistics" and fix.settings == ()
    assert fix.sql_commands == (
        "CREATE STATISTICS afs_orders_status_shipping_country_stats (dependencies, mcv) "
        "ON status, shipping_country FROM orders",
        "ANALYZE orders (status, shipping_country)")
    assert fix.rollback_commands == ("DROP STATISTICS IF EXISTS afs_orders_status_shipping_country_stats",)
    assert "underestimated 60×" in fix.rationale
    assert validate_candidate(fix).is_valid


def test_an_overestimate_counts_too_and_a_small_error_does_not() -> None:
    (over,) = plan_fix_proposals(correlated_ctx(planned=52_000, actual=900), "gemini25pro")
    assert "overestimated 58×" in over.rationale
    assert plan_fix_proposals(correlated_ctx(planned=6_000, actual=52_000), "gemini25pro") == ()
    # a plan without ANALYZE (the query ran past the statement timeout) has no actual rows
    slow = correlated_ctx(planned=870, actual=52_000)
    unanalyzed = {k: v for k, v in slow.plan.items() if not k.startswith("Actual")}
    assert plan_fix_proposals(dataclasses.replace(slow, plan=unanalyzed, slow=True), "x") == ()


def test_no_extended_statistics_for_one_column_or_for_join_clauses() -> None:
    one = "SELECT o.id FROM orders o WHERE o.status = 'pending'"
    assert plan_fix_proposals(correlated_ctx(10, 52_000, "(status = 'pending'::text)", one), "x") == ()
    # the inner side of a nested loop: user_id = u.id is a join clause, not a constant
    joined = ("SELECT o.id FROM users u JOIN orders o ON o.user_id = u.id "
              "WHERE u.country = 'DE' AND o.status = 'pending'")
    from afs.query.features import extract_features

    inner = node("Index Scan", rows=40, ms=0.2, loops=300, Relation_Name="orders", Alias="o",
                 Index_Name="orders_user_id_idx", Index_Cond="(user_id = u.id)",
                 Filter="(status = 'pending'::text)", Rows_Removed_by_Filter=2)
    inner["Plan Rows"] = 1
    plan = node("Nested Loop", seq_scan("users", "u", rows=300, removed=79_700, ms=9.0,
                                        filter="(country = 'DE'::text)"), inner, rows=12_000, ms=80.0)
    ctx = context(joined, extract_features(joined), plan, [users(), orders()], 81.0)
    assert not [p for p in plan_fix_proposals(ctx, "x") if p.proposal_type == "statistics"]


GROUPED_QUERY = ("SELECT o.status, o.shipping_country, count(*) FROM orders o "
                 "GROUP BY o.status, o.shipping_country")


def grouped_ctx(planned_groups: float, groups: float, input_planned: float = ORDERS_ROWS,
                query: str = GROUPED_QUERY, keys: Sequence[str] = ("o.status", "o.shipping_country"),
                ) -> AnalysisContext:
    from afs.query.features import extract_features

    scan = seq_scan("orders", "o", rows=ORDERS_ROWS, removed=0, ms=140.0)
    scan["Plan Rows"] = input_planned
    plan = node("Aggregate", scan, rows=groups, ms=600.0, Strategy="Hashed", Group_Key=list(keys))
    plan["Plan Rows"] = planned_groups
    return context(query, extract_features(query), plan, [orders()], 610.0)


def test_a_group_count_misestimated_on_two_columns_gets_ndistinct_statistics() -> None:
    """GROUP BY over correlated columns: the planner multiplies their distinct counts (docs
    14.2.2, city and zip); ndistinct statistics count the combinations that occur."""
    (fix,) = [p for p in plan_fix_proposals(grouped_ctx(planned_groups=100_000, groups=3_000), "x")
              if p.proposal_type == "statistics"]
    assert fix.sql_commands == (
        "CREATE STATISTICS afs_orders_status_shipping_country_stats (ndistinct) "
        "ON status, shipping_country FROM orders",
        "ANALYZE orders (status, shipping_country)")
    assert "overestimated 33×" in fix.rationale and "groups orders by status and shipping_country" \
        in fix.rationale
    assert validate_candidate(fix).is_valid
    # an underestimate counts too
    (under,) = plan_fix_proposals(grouped_ctx(planned_groups=200, groups=9_000), "x")
    assert "underestimated 45×" in under.rationale


def test_no_group_statistics_for_a_good_estimate_one_column_or_an_inherited_error() -> None:
    assert plan_fix_proposals(grouped_ctx(planned_groups=20_000, groups=3_000), "x") == ()
    one = "SELECT o.status, count(*) FROM orders o GROUP BY o.status"
    assert plan_fix_proposals(grouped_ctx(100_000, 3_000, query=one, keys=["o.status"]), "x") == ()
    # the input was already misestimated 40×: the error started below the aggregate
    assert plan_fix_proposals(grouped_ctx(100_000, 3_000, input_planned=50_000), "x") == ()
    # a key the planner added (the primary key), which the query does not group by, is no column
    # of the statistics: one grouped column is left
    pk = "SELECT o.id, o.status, count(*) FROM orders o GROUP BY o.id, o.status"
    assert plan_fix_proposals(grouped_ctx(100_000, 3_000, query=one, keys=["o.id", "o.status"]), "x") == ()
    assert [p.proposal_type for p in plan_fix_proposals(
        grouped_ctx(100_000, 3_000, query=pk, keys=["o.id", "o.status"]), "x")] == ["statistics"]


def test_a_group_count_off_because_its_filter_was_gets_the_filters_statistics_only() -> None:
    from afs.query.features import extract_features

    query = ("SELECT o.status, o.shipping_country, count(*) FROM orders o WHERE o.status = 'pending' "
             "AND o.shipping_country = 'DE' GROUP BY o.status, o.shipping_country")
    scan = seq_scan("orders", "o", rows=52_000, removed=ORDERS_ROWS - 52_000, ms=150.0,
                    filter=CORRELATED_FILTER)
    scan["Plan Rows"] = 870
    plan = node("Aggregate", scan, rows=1, ms=160.0, Group_Key=["o.status", "o.shipping_country"])
    plan["Plan Rows"] = 40  # off 40× too, but because its input was
    ctx = context(query, extract_features(query), plan, [orders()], 161.0)
    (fix,) = plan_fix_proposals(ctx, "x")
    assert fix.sql_commands[0].startswith(
        "CREATE STATISTICS afs_orders_status_shipping_country_stats (dependencies, mcv) ")


def sort_node(method: str, space_kb: float, space_type: str, **extra: Any) -> dict[str, Any]:
    return node("Sort", seq_scan("orders", "o", rows=ORDERS_ROWS, removed=0, ms=140.0),
                rows=ORDERS_ROWS, ms=900.0, Sort_Key=["o.total_amount DESC"], Sort_Method=method,
                Sort_Space_Used=space_kb, Sort_Space_Type=space_type, **extra)


def spill_ctx(plan: Mapping[str, Any]) -> AnalysisContext:
    from afs.query.features import extract_features

    query = "SELECT o.id, o.total_amount FROM orders o ORDER BY o.total_amount DESC"
    return context(query, extract_features(query), plan, [orders()], 1000.0)


def test_a_sort_that_spilled_gets_work_mem_for_this_query_only() -> None:
    (fix,) = plan_fix_proposals(spill_ctx(sort_node("external merge", 30_000, "Disk")), "gemini25flash")
    assert fix.proposal_type == "settings" and fix.sql_commands == () and fix.rollback_commands == ()
    assert fix.settings == (("work_mem", "128MB"),)  # 2.5 × 29.3 MB → the next power of two
    assert all(words in fix.rationale for words in ("ALTER ROLE", "SET LOCAL", "never globally"))
    assert "external merge, 30,000 kB on disk" in fix.rationale
    assert fix.estimated_impact.risk == "low"
    assert validate_candidate(fix).is_valid and check_settings(fix.settings) == []


def test_a_sort_in_memory_gets_no_setting() -> None:
    assert plan_fix_proposals(spill_ctx(sort_node("quicksort", 3_000, "Memory")), "x") == ()


def test_a_parallel_worker_that_spilled_counts() -> None:
    sort = sort_node("quicksort", 900, "Memory", Workers=[
        {"Worker Number": 0, "Sort Method": "external merge", "Sort Space Used": 20_000,
         "Sort Space Type": "Disk"}])
    (fix,) = plan_fix_proposals(spill_ctx(node("Gather Merge", sort, rows=ORDERS_ROWS, ms=950.0,
                                               Workers_Launched=1)), "x")
    assert fix.settings == (("work_mem", "64MB"),)  # 2.5 × 19.5 MB


def test_a_hash_in_batches_and_a_hash_aggregate_on_disk_get_work_mem() -> None:
    hashed = node("Hash Join", seq_scan("orders", "o", rows=ORDERS_ROWS, removed=0, ms=140.0),
                  node("Hash", seq_scan("users", "u", rows=80_000, removed=0, ms=9.0), rows=80_000, ms=30.0,
                       Hash_Buckets=65536, Hash_Batches=8, Original_Hash_Batches=8, Peak_Memory_Usage=4_000),
                  rows=ORDERS_ROWS, ms=700.0, Hash_Cond="(o.user_id = u.id)")
    (fix,) = plan_fix_proposals(spill_ctx(hashed), "x")
    # 8 batches of 4,000 kB under a hash_mem_multiplier of 2: 16,000 kB of work_mem, × 2.5
    assert fix.settings == (("work_mem", "64MB"),) and "8 batches" in fix.rationale
    aggregated = node("HashAggregate", seq_scan("orders", "o", rows=ORDERS_ROWS, removed=0, ms=140.0),
                      rows=48_000, ms=600.0, HashAgg_Batches=5, Peak_Memory_Usage=4_100, Disk_Usage=50_000)
    (fix,) = plan_fix_proposals(spill_ctx(aggregated), "x")
    assert fix.settings == (("work_mem", "128MB"),) and "50,000 kB to disk" in fix.rationale
    in_memory = node("HashAggregate", seq_scan("orders", "o", rows=ORDERS_ROWS, removed=0, ms=140.0),
                     rows=6, ms=300.0, HashAgg_Batches=1, Peak_Memory_Usage=24)
    assert plan_fix_proposals(spill_ctx(in_memory), "x") == ()


def test_work_mem_is_a_power_of_two_within_bounds() -> None:
    assert work_mem_mb(100) == 8  # never below the default it just spilled from, doubled
    assert work_mem_mb(3_000) == 8
    assert work_mem_mb(6_208) == 16  # 15.2 MB: a sort 12.6 MB large in memory fits
    assert work_mem_mb(26_215) == 128  # 2.5 × 25.6 MB = 64 MB: the next power of two above it
    assert work_mem_mb(5_000_000) == 2048
    (huge,) = plan_fix_proposals(spill_ctx(sort_node("external merge", 5_000_000, "Disk")), "x")
    assert huge.settings == (("work_mem", "2048MB"),) and huge.estimated_impact.risk == "medium"
    assert check_settings(huge.settings) == []


def test_every_agent_measures_the_plan_fixes_after_its_own_candidates() -> None:
    ctx = spill_ctx(sort_node("external merge", 30_000, "Disk"))
    for agent, strategist in STRATEGISTS.items():
        own = strategist.decide(ctx, agent).candidates
        found = candidates(agent, ctx, analyze(agent, ctx))
        assert found[:len(own)] == own
        assert [p.settings for p in found[len(own):]] == [(("work_mem", "128MB"),)]
        assert all(p.agent == agent for p in found)


def test_plan_fix_rules_are_a_tuple_of_small_functions() -> None:
    assert [rule.__name__ for rule in PLAN_FIX_RULES] == ["extended_statistics", "work_mem"]


def test_a_not_in_subquery_too_big_to_hash_gets_the_work_mem_that_hashes_it() -> None:
    from afs.query.features import extract_features

    query = "SELECT u.id FROM users u WHERE u.id NOT IN (SELECT o.user_id FROM orders o)"
    rescanned = node("Materialize", seq_scan("orders", "o", rows=400_000, removed=0, ms=60.0),
                     rows=150_000_000, ms=2_600.0, loops=1_000, Subplan_Name="SubPlan 1")
    rescanned["Plan Rows"], rescanned["Plan Width"] = 400_000, 4
    plan = node("Seq Scan", rescanned, rows=10, ms=2_700.0, Relation_Name="users", Alias="u",
                Filter="(NOT (ANY (id = (SubPlan 1).col1)))", Rows_Removed_by_Filter=990)
    plan["Plans"][0]["Parent Relationship"] = "SubPlan"
    ctx = context(query, extract_features(query), plan, [users(), orders()], 2_700.0)
    (fix,) = [p for p in plan_fix_proposals(ctx, "x") if p.proposal_type == "settings"]
    # 400,000 rows × (8 + 24) bytes = 12,500 kB over a hash_mem_multiplier of 2: 6,250 kB of
    # work_mem, × 2.5 = 15.3 MB → 16MB (and 4MB, the default, did not hash it)
    assert fix.settings == (("work_mem", "16MB"),)
    assert "not hashed" in fix.rationale and "SubPlan 1" in fix.rationale
    assert validate_candidate(fix).is_valid and check_settings(fix.settings) == []
    # hashed already, or run once: nothing to fix
    plan["Plans"][0]["Subplan Name"] = "hashed SubPlan 1"
    assert not plan_fix_proposals(context(query, extract_features(query), plan, [users(), orders()],
                                          2_700.0), "x")
