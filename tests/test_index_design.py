"""gemini-2.5-pro's ranked candidate designs: each kind fires where the query admits it, and
not where it does not. Synthetic contexts (the query read by afs.query, a hand-built
EXPLAIN ANALYZE plan, pg_stats-like statistics); no database."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from afs.brains.strategists.evidence import Decision
from afs.brains.strategists.index_design import MAX_CANDIDATES, decide_index_design
from afs.models import (
    AnalysisContext,
    ColumnInfo,
    ColumnStats,
    IndexInfo,
    OperatorSupport,
    OptimizationProposal,
    TableInfo,
)
from afs.query.features import extract_features
from afs.safety import validate_candidate


# -- building blocks ---------------------------------------------------------------------------
def table(name: str, rows: int, columns: Mapping[str, str], stats: Mapping[str, ColumnStats] | None = None,
          indexes: Sequence[tuple[str, str, tuple[str, ...]]] = (),
          collations: Mapping[str, str] | None = None) -> TableInfo:
    """A table with a primary key on `id`, plus `indexes` as (name, definition, key columns)."""
    pkey = IndexInfo(f"{name}_pkey", f"CREATE UNIQUE INDEX {name}_pkey ON public.{name} USING btree (id)",
                     ("id",), unique=True, primary=True)
    return TableInfo(
        name=name, rows=rows, size_mb=rows * 100 / 1_048_576,
        columns=tuple(ColumnInfo(c, t, False, (collations or {}).get(c)) for c, t in columns.items()),
        indexes=(pkey, *(IndexInfo(n, d, k) for n, d, k in indexes)), primary_key=("id",),
        column_stats=dict(stats or {}))


def plan_node(node_type: str, *children: Mapping[str, Any], rows: float, ms: float, loops: float = 1,
              **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"Node Type": node_type, "Actual Total Time": ms, "Actual Rows": rows,
                           "Actual Loops": loops, "Total Cost": 1000.0,
                           **{k.replace("_", " "): v for k, v in extra.items()}}
    if children:
        out["Plans"] = list(children)
    return out


def seq(relation: str, rows: float, removed: float, ms: float, filter: str | None = None,
        loops: float = 1) -> dict[str, Any]:
    extra: dict[str, Any] = {"Relation_Name": relation, "Alias": relation}
    if filter:
        extra |= {"Filter": filter, "Rows_Removed_by_Filter": removed / loops}
    return plan_node("Seq Scan", rows=rows / loops, ms=ms / loops, loops=loops, **extra)


def ctx_of(query: str, plan: Mapping[str, Any], tables: Iterable[TableInfo], ms: float) -> AnalysisContext:
    return AnalysisContext(task_id="t", task_type="query_optimization", query=query,
                           features=extract_features(query), plan=plan, execution_ms=ms,
                           tables={t.name: t for t in tables})


def decide(ctx: AnalysisContext) -> Decision:
    decision = decide_index_design(ctx)
    candidates = decision.candidates
    assert len(candidates) <= MAX_CANDIDATES
    assert len({c.sql_commands for c in candidates}) == len(candidates), "candidates differ in DDL"
    for candidate in candidates:
        assert validate_candidate(candidate).is_valid, candidate.sql_commands
        assert candidate.rationale and len(candidate.rollback_commands) == sum(
            c.startswith("CREATE INDEX") for c in candidate.sql_commands) + 2 * sum(
            "SET STATISTICS" in c for c in candidate.sql_commands)
    return decision


def creates(proposal: OptimizationProposal) -> list[str]:
    return [c for c in proposal.sql_commands if c.startswith("CREATE INDEX")]


def with_ddl(decision: Decision, *fragments: str) -> OptimizationProposal | None:
    """The candidate whose CREATE INDEX statements contain every fragment, one each."""
    for candidate in decision.candidates:
        made = creates(candidate)
        if len(made) == len(fragments) and all(any(f in c for c in made) for f in fragments):
            return candidate
    return None


# -- the schema: a shop ------------------------------------------------------------------------
def users(rows: int = 100_000) -> TableInfo:
    return table("users", rows, {"id": "bigint", "email": "text", "country": "text", "tier": "text"},
                 {"id": ColumnStats(n_distinct=-1),
                  "country": ColumnStats(n_distinct=14, most_common_vals=("US", "DE"),
                                         most_common_freqs=(0.36, 0.09))})


def orders(rows: int = 2_000_000, indexes: Sequence[tuple[str, str, tuple[str, ...]]] = ()) -> TableInfo:
    return table("orders", rows, {"id": "bigint", "user_id": "bigint", "status": "text",
                                  "amount": "numeric(12,2)", "country": "text", "payload": "jsonb",
                                  "created_at": "timestamp with time zone"},
                 {"id": ColumnStats(n_distinct=-1),
                  "user_id": ColumnStats(n_distinct=50_000),
                  "status": ColumnStats(n_distinct=5, most_common_vals=("completed", "shipped", "pending"),
                                        most_common_freqs=(0.7, 0.2, 0.02)),
                  "country": ColumnStats(n_distinct=14)}, indexes)


def items(rows: int = 6_000_000) -> TableInfo:
    return table("items", rows, {"id": "bigint", "order_id": "bigint", "product_id": "bigint",
                                 "qty": "integer"},
                 {"order_id": ColumnStats(n_distinct=-0.33), "product_id": ColumnStats(n_distinct=20_000)})


def products(rows: int = 20_000) -> TableInfo:
    return table("products", rows, {"id": "bigint", "name": "text"}, {"id": ColumnStats(n_distinct=-1)})


# -- 1. multi-table designs: a join walked from its filtered tables ------------------------------
CHAIN = ("SELECT count(*), sum(i.qty) FROM users u JOIN orders o ON o.user_id = u.id "
         "JOIN items i ON i.order_id = o.id WHERE u.id = 42")


def chain_ctx() -> AnalysisContext:
    plan = plan_node(
        "Aggregate", plan_node(
            "Hash Join", seq("items", 6_000_000, 0, 420.0),
            plan_node("Hash", plan_node(
                "Nested Loop",
                plan_node("Index Scan", rows=1, ms=0.02, Relation_Name="users", Index_Name="users_pkey"),
                seq("orders", 40, 1_999_960, 160.0, filter="(user_id = 42)"), rows=40, ms=160.1),
                rows=40, ms=160.2),
            rows=120, ms=700.0), rows=1, ms=700.1)
    return ctx_of(CHAIN, plan, [users(), orders(), items()], 700.3)


def test_a_join_chain_gets_an_index_on_every_foreign_key_it_walks_together() -> None:
    decision = decide(chain_ctx())
    first = decision.proposal
    assert first is not None
    made = creates(first)
    assert len(made) == 2
    assert any("ON orders (user_id)" in c for c in made) and any("ON items (order_id)" in c for c in made)
    assert "users (~1 rows)" in first.rationale and "Seq Scan on items visits" in first.rationale
    assert first.rollback_commands == ("DROP INDEX IF EXISTS afs_orders_user_id_idx",
                                       "DROP INDEX IF EXISTS afs_items_order_id_idx")
    # each index alone stays a candidate
    assert with_ddl(decision, "ON items (order_id)") is not None
    assert with_ddl(decision, "ON orders (user_id)") is not None
    assert decision.actions[0].startswith("Create indexes items (order_id); orders (user_id) together")


def test_the_issue_s_four_table_join_gets_three_indexes_on_two_tables() -> None:
    query = ("SELECT count(*) FROM users u JOIN orders o ON o.user_id = u.id "
             "JOIN items i ON i.order_id = o.id JOIN products p ON p.id = i.product_id "
             "WHERE u.id = 42 AND p.id = 7")
    plan = plan_node("Aggregate", plan_node(
        "Hash Join", seq("items", 300, 5_999_700, 480.0, filter="(product_id = 7)"),
        plan_node("Hash", seq("orders", 40, 1_999_960, 150.0, filter="(user_id = 42)"), rows=40, ms=150.0),
        rows=2, ms=640.0), rows=1, ms=640.1)
    decision = decide(ctx_of(query, plan, [users(), orders(), items(), products()], 640.3))
    assert decision.proposal is not None
    made = creates(decision.proposal)
    assert len(made) == 3
    assert {m.split(" ON ")[1] for m in made} == {
        "items (product_id)", "items (order_id)", "orders (user_id)"}


def test_a_cheap_dimension_scan_leaves_the_single_join_index_first() -> None:
    """Gold users in DE (9 ms of 395): the fact table's join key is the first choice; the set
    with the dimension's filter index is an alternative."""
    query = ("SELECT u.email, o.id FROM users u JOIN orders o ON o.user_id = u.id "
             "WHERE u.country = 'DE' AND u.tier = 'gold'")
    plan = plan_node("Hash Join", seq("orders", 2_000_000, 0, 140.0),
                     plan_node("Hash", seq("users", 300, 99_700, 9.0, filter="(country = 'DE')"),
                               rows=300, ms=9.1), rows=12_000, ms=395.0)
    decision = decide(ctx_of(query, plan, [users(), orders()], 395.4))
    assert decision.proposal is not None
    assert creates(decision.proposal) == ["CREATE INDEX afs_orders_user_id_idx ON orders (user_id)"]
    together = next(c for c in decision.alternatives if len(creates(c)) == 2)
    assert any("ON users (" in c for c in creates(together))


def test_an_in_subquery_on_a_rare_value_is_walked_like_a_join() -> None:
    """`user_id IN (SELECT id FROM users WHERE country = 'IS')`: a semi-join on a few users needs
    the foreign key indexed, and the users' filter too (two indexes, one proposal)."""
    query = ("SELECT o.id, o.amount FROM orders o"
             " WHERE o.user_id IN (SELECT u.id FROM users u WHERE u.country = 'IS')")
    rare = table("users", 100_000, {"id": "bigint", "email": "text", "country": "text"},
                 {"id": ColumnStats(n_distinct=-1),
                  "country": ColumnStats(n_distinct=200, most_common_vals=("US", "DE"),
                                         most_common_freqs=(0.36, 0.09))})
    plan = plan_node("Hash Semi Join", seq("orders", 2_000_000, 0, 150.0),
                     plan_node("Hash", seq("users", 20, 99_980, 12.0, filter="(country = 'IS')"),
                               rows=20, ms=12.1), rows=800, ms=330.0)
    decision = decide(ctx_of(query, plan, [rare, orders()], 330.2))
    together = with_ddl(decision, "ON orders (user_id)", "ON users (country)")
    assert together is not None and together in decision.candidates[:2]


def test_an_unfiltered_join_gets_no_index_set() -> None:
    query = "SELECT count(*) FROM orders o JOIN items i ON i.order_id = o.id"
    plan = plan_node("Hash Join", seq("items", 6_000_000, 0, 400.0),
                     plan_node("Hash", seq("orders", 2_000_000, 0, 150.0), rows=2_000_000, ms=300.0),
                     rows=6_000_000, ms=900.0)
    decision = decide(ctx_of(query, plan, [orders(), items()], 900.0))
    assert all(len(creates(c)) < 2 for c in decision.candidates)


def test_the_inner_side_of_a_nested_loop_gets_its_join_key_indexed() -> None:
    query = ("SELECT count(*) FROM orders o JOIN items i ON i.order_id = o.id "
             "WHERE o.created_at > now() - interval '1 hour'")
    plan = plan_node("Nested Loop", seq("orders", 50, 1_999_950, 120.0, filter="(created_at > ...)"),
                     seq("items", 150, 299_999_850, 9000.0, filter="(order_id = o.id)", loops=50),
                     rows=150, ms=9120.0)
    decision = decide(ctx_of(query, plan, [orders(), items()], 9120.0))
    assert decision.proposal is not None
    assert creates(decision.proposal) == ["CREATE INDEX afs_items_order_id_idx ON items (order_id)"]
    assert "Seq Scan on items visits 300,000,000 rows to return 150" in decision.proposal.rationale


# -- 2. covering and partial -----------------------------------------------------------------
def test_narrow_aggregated_columns_get_a_covering_index_and_the_plain_one_as_alternative() -> None:
    query = "SELECT count(*), sum(amount) FROM orders WHERE status = 'pending'"
    plan = plan_node("Aggregate", seq("orders", 40_000, 1_960_000, 150.0, filter="(status = 'pending')"),
                     rows=1, ms=160.0)
    decision = decide(ctx_of(query, plan, [orders()], 160.2))
    assert decision.proposal is not None
    assert creates(decision.proposal) == [
        "CREATE INDEX afs_orders_status_idx ON orders (status) INCLUDE (amount)"]
    assert "Index Only Scan" in decision.proposal.validation_steps[0]
    assert ("CREATE INDEX afs_orders_status_idx ON orders (status)",) in {
        c.sql_commands for c in decision.alternatives}


def test_the_group_key_follows_the_equality_filter_in_the_index_key() -> None:
    query = ("SELECT user_id, count(*) AS n FROM orders WHERE status = 'shipped'"
             " GROUP BY user_id HAVING count(*) >= 3 ORDER BY user_id")
    plan = plan_node("GroupAggregate", plan_node("Sort", seq(
        "orders", 400_000, 1_600_000, 150.0, filter="(status = 'shipped')"), rows=400_000, ms=220.0),
        rows=900, ms=240.0)
    decision = decide(ctx_of(query, plan, [orders()], 240.3))
    assert decision.proposal is not None
    assert creates(decision.proposal) == [
        "CREATE INDEX afs_orders_status_user_id_idx ON orders (status, user_id)"]
    assert "GROUP BY user_id follows the filter" in decision.proposal.rationale
    # a range on the grouped column: that column alone leads, the aggregated one is carried
    query = ("SELECT created_at, sum(amount) FROM orders WHERE created_at >= '2024-05-01'"
             " AND created_at < '2024-05-08' GROUP BY created_at")
    plan = plan_node("HashAggregate", seq("orders", 20_000, 1_980_000, 150.0, filter="(created_at >= …)"),
                     rows=20_000, ms=170.0)
    decision = decide(ctx_of(query, plan, [orders()], 170.3))
    assert decision.proposal is not None
    assert creates(decision.proposal) == [
        "CREATE INDEX afs_orders_created_at_idx ON orders (created_at) INCLUDE (amount)"]


def test_a_wide_selected_column_is_not_carried_in_include() -> None:
    query = "SELECT payload FROM orders WHERE status = 'pending'"
    plan = seq("orders", 40_000, 1_960_000, 150.0, filter="(status = 'pending')")
    decision = decide(ctx_of(query, plan, [orders()], 150.2))
    assert all("INCLUDE" not in c for p in decision.candidates for c in p.sql_commands)


def test_a_rare_constant_gets_a_partial_index_carrying_the_sort_key() -> None:
    query = "SELECT id, amount FROM orders WHERE status = 'pending' ORDER BY created_at LIMIT 20"
    plan = plan_node("Limit", plan_node(
        "Sort", seq("orders", 40_000, 1_960_000, 150.0, filter="(status = 'pending')"),
        rows=20, ms=170.0, Sort_Key=["created_at"]), rows=20, ms=170.1)
    decision = decide(ctx_of(query, plan, [orders()], 170.3))
    partial = next(c for c in decision.candidates if c.proposal_type == "partial_index")
    assert "(created_at)" in partial.sql_commands[0]
    assert partial.sql_commands[0].endswith("WHERE status = 'pending'")
    # and its full form, for every status: measured too, the family decides between them
    full = [c for c in decision.candidates if c.proposal_type != "partial_index"
            and any("(status, created_at)" in s and "WHERE" not in s for s in c.sql_commands)]
    assert full, [c.sql_commands for c in decision.candidates]


def test_a_common_constant_gets_no_partial_index() -> None:
    query = "SELECT id FROM orders WHERE status = 'completed' AND user_id = 7 ORDER BY created_at"
    plan = seq("orders", 30, 1_999_970, 150.0, filter="((status = 'completed') AND (user_id = 7))")
    decision = decide(ctx_of(query, plan, [orders()], 150.2))
    assert decision.candidates and all(c.proposal_type != "partial_index" for c in decision.candidates)


# -- 3. OR across columns ----------------------------------------------------------------------
OR_QUERY = "SELECT id FROM orders WHERE user_id = 42 OR country = 'IS'"


def or_ctx(table: TableInfo) -> AnalysisContext:
    plan = seq("orders", 2_000, 1_998_000, 180.0, filter="((user_id = 42) OR (country = 'IS'))")
    return ctx_of(OR_QUERY, plan, [table], 180.2)


def test_an_or_across_columns_gets_one_index_per_arm_together() -> None:
    decision = decide(or_ctx(orders()))
    assert decision.proposal is not None
    assert creates(decision.proposal) == ["CREATE INDEX afs_orders_user_id_idx ON orders (user_id)",
                                          "CREATE INDEX afs_orders_country_idx ON orders (country)"]
    assert "BitmapOr" in decision.proposal.rationale
    assert "Seq Scan on orders visits 2,000,000 rows" in decision.proposal.rationale


def test_an_or_gets_only_the_missing_arm_and_nothing_when_every_arm_is_indexed() -> None:
    one = orders(indexes=[("orders_user_id_idx", "CREATE INDEX orders_user_id_idx ON public.orders "
                                                 "USING btree (user_id)", ("user_id",))])
    decision = decide(or_ctx(one))
    assert decision.proposal is not None
    assert creates(decision.proposal) == ["CREATE INDEX afs_orders_country_idx ON orders (country)"]
    both = orders(indexes=[
        ("orders_user_id_idx", "CREATE INDEX orders_user_id_idx ON public.orders USING btree (user_id)",
         ("user_id",)),
        ("orders_country_idx", "CREATE INDEX orders_country_idx ON public.orders USING btree (country)",
         ("country",))])
    decision = decide(or_ctx(both))
    assert decision.proposal is None
    assert any("every arm" in i for i in decision.analysis(or_ctx(both)).insights)


def test_an_or_with_an_arm_no_index_serves_gets_nothing() -> None:
    query = "SELECT id FROM orders WHERE user_id = 42 OR country <> 'IS'"
    plan = seq("orders", 2_000, 1_998_000, 180.0, filter="x")
    decision = decide(ctx_of(query, plan, [orders()], 180.2))
    assert decision.proposal is None


# -- 4. operator classes ---------------------------------------------------------------------------
def docs(indexes: Sequence[tuple[str, str, tuple[str, ...]]] = (), collation: str | None = None,
         title_type: str = "text") -> TableInfo:
    return table("docs", 500_000, {"id": "bigint", "title": title_type, "body": "jsonb"},
                 {"title": ColumnStats(n_distinct=-1, avg_width=32)}, indexes,
                 {"title": collation} if collation else None)


def docs_ctx(where: str, table: TableInfo | None = None, kept: float = 50) -> AnalysisContext:
    query = f"SELECT id FROM docs WHERE {where}"
    return ctx_of(query, seq("docs", kept, 500_000 - kept, 90.0, filter="(x)"), [table or docs()], 90.2)


@pytest.mark.parametrize("where", ["title LIKE '%beef42%'", "title ILIKE '%Beef%'", "title ILIKE 'beef%'"])
def test_a_pattern_no_btree_serves_gets_a_trigram_gin_index(where: str) -> None:
    decision = decide(docs_ctx(where))
    first = decision.proposal
    assert first is not None
    assert first.sql_commands == (
        "CREATE EXTENSION IF NOT EXISTS pg_trgm",
        "CREATE INDEX afs_docs_title_trgm_gin ON docs USING gin (title gin_trgm_ops)")
    assert first.rollback_commands == ("DROP INDEX IF EXISTS afs_docs_title_trgm_gin",)
    assert "needs the pg_trgm extension" in first.rationale and "Seq Scan on docs visits" in first.rationale
    assert first.estimated_impact.risk == "medium"


def misestimated_docs_ctx(planned: float, kept: float = 3_300) -> AnalysisContext:
    """LIKE '%…%' on 500k rows, kept rows 0.66 %: the default histogram (101 bounds) matched none
    and the planner estimated `planned` rows."""
    query = "SELECT id, title FROM docs WHERE title LIKE '%titanium kettle%'"
    plan = seq("docs", kept, 500_000 - kept, 90.0, filter="(title ~~ '%titanium kettle%'::text)")
    plan["Plan Rows"] = planned
    return ctx_of(query, plan, [docs()], 90.2)


def test_a_pattern_the_planner_cannot_estimate_gets_the_index_with_a_finer_histogram_too() -> None:
    decision = decide(misestimated_docs_ctx(planned=50))
    plain, tuned = [c for c in decision.candidates if any("gin_trgm_ops" in s for s in c.sql_commands)]
    assert not any("STATISTICS" in s for s in plain.sql_commands)  # the plain index first
    assert tuned.sql_commands == (
        "CREATE EXTENSION IF NOT EXISTS pg_trgm",
        "CREATE INDEX afs_docs_title_trgm_gin ON docs USING gin (title gin_trgm_ops)",
        "ALTER TABLE docs ALTER COLUMN title SET STATISTICS 500",  # 3 bounds of 0.66 % → 455 → 500
        "ANALYZE docs (title)")
    assert tuned.rollback_commands == ("ALTER TABLE IF EXISTS docs ALTER COLUMN title SET STATISTICS -1",
                                       "ANALYZE docs (title)", "DROP INDEX IF EXISTS afs_docs_title_trgm_gin")
    assert "estimated at 50 rows" in tuned.rationale and "histogram bounds" in tuned.rationale
    # a rarer pattern needs more bounds: 0.05 % → 6,000
    rare = decide(misestimated_docs_ctx(planned=5_000, kept=250))
    assert any("SET STATISTICS 6000" in s for c in rare.candidates for s in c.sql_commands)


def test_no_finer_histogram_when_the_pattern_was_estimated_well() -> None:
    decision = decide(misestimated_docs_ctx(planned=1_000))  # off 3.3×
    assert not any("STATISTICS" in s for c in decision.candidates for s in c.sql_commands)


@pytest.mark.parametrize("where", ["title LIKE '%ab%'", "title NOT LIKE '%beef42%'"])
def test_no_trigram_index_where_it_cannot_narrow(where: str) -> None:
    decision = decide(docs_ctx(where))
    assert all("gin_trgm_ops" not in c for p in decision.candidates for c in p.sql_commands)


def test_no_second_trigram_index() -> None:
    existing = ("docs_title_trgm",
                "CREATE INDEX docs_title_trgm ON public.docs USING gin (title gin_trgm_ops)", ("title",))
    decision = decide(docs_ctx("title LIKE '%beef42%'", docs([existing])))
    assert decision.proposal is None
    assert any("docs_title_trgm already serves" in i
               for i in decision.analysis(docs_ctx("title LIKE '%beef42%'", docs([existing]))).insights)


@pytest.mark.parametrize(("collation", "title_type", "key"), [
    (None, "text", "(title text_pattern_ops)"),
    ("en_US.UTF-8", "text", "(title text_pattern_ops)"),
    ("en_US.UTF-8", "character varying(80)", "(title varchar_pattern_ops)"),
    ("C", "text", "(title)"),
    ("POSIX", "character varying(80)", "(title)"),
])
def test_a_like_prefix_gets_a_pattern_opclass_unless_the_collation_is_c(
        collation: str | None, title_type: str, key: str) -> None:
    decision = decide(docs_ctx("title LIKE 'beef4%'", docs(collation=collation, title_type=title_type)))
    assert decision.proposal is not None
    assert f"ON docs {key}" in decision.proposal.sql_commands[0]
    assert all("gin_trgm_ops" not in c for p in decision.candidates for c in p.sql_commands)


def test_jsonb_containment_gets_jsonb_path_ops() -> None:
    decision = decide(docs_ctx("""body @> '{"lang": "is"}'""", kept=500))
    assert decision.proposal is not None
    assert decision.proposal.sql_commands == ("CREATE INDEX afs_docs_body_gin ON docs USING gin "
                                              "(body jsonb_path_ops)",)


# -- 5. the ORDER BY … LIMIT trap -------------------------------------------------------------
TRAP = "SELECT id, amount FROM orders WHERE user_id = 42 ORDER BY created_at DESC LIMIT 10"
CREATED = ("orders_created_at_idx", "CREATE INDEX orders_created_at_idx ON public.orders USING btree "
                                    "(created_at)", ("created_at",))


def test_an_index_walk_in_sort_order_that_filters_most_rows_gets_the_composite() -> None:
    walk = plan_node("Index Scan", rows=10, ms=610.0, Relation_Name="orders",
                     Index_Name="orders_created_at_idx", Scan_Direction="Backward",
                     Filter="(user_id = 42)", Rows_Removed_by_Filter=1_500_000)
    decision = decide(ctx_of(TRAP, plan_node("Limit", walk, rows=10, ms=610.1), [orders(indexes=[CREATED])],
                             610.3))
    assert decision.proposal is not None
    assert creates(decision.proposal)[0].startswith(
        "CREATE INDEX afs_orders_user_id_created_at_idx ON orders (user_id, created_at DESC)")
    assert "walks orders in created_at DESC order for LIMIT 10" in decision.proposal.rationale
    assert "removes 1,500,000 rows to return 10" in decision.proposal.rationale


def test_no_trap_design_without_limit_or_with_the_composite_in_place() -> None:
    no_limit = TRAP.removesuffix(" LIMIT 10")
    plan = seq("orders", 40, 1_999_960, 150.0, filter="(user_id = 42)")
    decision = decide(ctx_of(no_limit, plan, [orders(indexes=[CREATED])], 150.2))
    assert not any("for LIMIT" in c.rationale for c in decision.candidates)
    composite = ("orders_uc", "CREATE INDEX orders_uc ON public.orders USING btree (user_id, created_at)",
                 ("user_id", "created_at"))
    walk = plan_node("Index Scan", rows=10, ms=0.1, Relation_Name="orders", Index_Name="orders_uc")
    decision = decide(ctx_of(TRAP, plan_node("Limit", walk, rows=10, ms=0.2),
                             [orders(indexes=[CREATED, composite])], 0.3))
    assert decision.proposal is None


# -- the set as a whole -----------------------------------------------------------------------
def test_alternatives_are_distinct_ranked_and_capped() -> None:
    decision = decide(chain_ctx())
    assert decision.candidates[0] is decision.proposal
    assert 2 <= len(decision.candidates) <= MAX_CANDIDATES
    improvements = [c.estimated_impact.query_time_improvement for c in decision.candidates]
    assert all(i >= 1 for i in improvements)


# -- the index kind from the catalog (issue 25 item 7) -----------------------------------------
def support(op: str, left: str, method: str, opclass: str, default: bool = False, family: int = 5,
            extension: str | None = None, installed: bool = True) -> OperatorSupport:
    return OperatorSupport(op, left, left, method, opclass, default, "search", family, extension, installed)


def with_catalog(ctx: AnalysisContext, *supports: OperatorSupport) -> AnalysisContext:
    catalog: dict[str, tuple[OperatorSupport, ...]] = {}
    for s in supports:
        catalog[f"{s.operator} {s.left_type}"] = (*catalog.get(f"{s.operator} {s.left_type}", ()), s)
    return dataclasses.replace(ctx, operator_classes=catalog)


def test_the_catalog_decides_the_trigram_kind_and_whether_its_extension_is_created() -> None:
    ctx = docs_ctx("title LIKE '%beef42%'")
    # pg_trgm installed: its GIN class, without CREATE EXTENSION
    installed = decide(with_catalog(ctx, support("~~", "text", "gin", "gin_trgm_ops", extension="pg_trgm"),
                                    support("~~", "text", "gist", "gist_trgm_ops", extension="pg_trgm")))
    assert installed.proposal is not None
    assert installed.proposal.sql_commands == (
        "CREATE INDEX afs_docs_title_trgm_gin ON docs USING gin (title gin_trgm_ops)",)
    # not installed yet (the analysis marks so only what afs.safety lets a proposal create)
    created = decide(with_catalog(ctx, support("~~", "text", "gin", "gin_trgm_ops", extension="pg_trgm",
                                               installed=False)))
    assert created.proposal is not None
    assert created.proposal.sql_commands[0] == "CREATE EXTENSION IF NOT EXISTS pg_trgm"
    # a catalog whose only class for `~~` is another installed extension's GiST class: that one
    other = decide(with_catalog(ctx, support("~~", "text", "gist", "other_trgm_ops", extension="other")))
    assert other.proposal is not None
    assert other.proposal.sql_commands == (
        "CREATE INDEX afs_docs_title_trgm_gist ON docs USING gist (title other_trgm_ops)",)
    # nothing serves `~~`: no proposal for it, and the reason
    none = decide(with_catalog(ctx, support("=", "text", "btree", "text_ops", default=True)))
    assert none.proposal is None
    assert any("no operator class in the catalog serves LIKE on title" in i for i in none.insights)


def test_the_catalog_decides_the_like_prefix_class_by_the_collation() -> None:
    pattern = (support("~>=~", "text", "btree", "text_pattern_ops"),
               support("~<~", "text", "btree", "text_pattern_ops"))
    plain = (support(">=", "text", "btree", "text_ops", default=True),
             support("<", "text", "btree", "text_ops", default=True))
    non_c = docs_ctx("title LIKE 'beef%'", docs(collation="en_US.UTF-8"))
    found = decide(with_catalog(non_c, *pattern, *plain)).proposal
    assert found is not None and "(title text_pattern_ops)" in found.sql_commands[0]
    c = docs_ctx("title LIKE 'beef%'", docs(collation="C"))
    found = decide(with_catalog(c, *pattern, *plain)).proposal
    assert found is not None and "ON docs (title)" in found.sql_commands[0]
    # a catalog without a pattern class: no B-tree serves the prefix under a non-C collation
    assert all("pattern" not in cmd for p in decide(with_catalog(non_c, *plain)).candidates
               for cmd in p.sql_commands)
