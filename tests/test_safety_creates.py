"""What a proposal creates, read once by the validator (`afs.safety.creates`), and its readers:
the benchmark (indexes it may hide), the query family (views), consensus (indexed tables), the
apply plan and the batch report. Pure: no database."""

from __future__ import annotations

from afs.agents import _views
from afs.batch.report import IndexKey, index_key
from afs.bench import hideable_indexes
from afs.consensus import _indexed_tables
from afs.models import EstimatedImpact, OptimizationProposal
from afs.safety import (
    Change,
    NewIndex,
    NewStatistics,
    NewView,
    creates,
    proposal_references,
    validate,
    validate_candidate,
)


def proposal(*commands: str, ptype: str = "index", rewrite: str | None = None) -> OptimizationProposal:
    return OptimizationProposal("a", ptype, commands, (), "because",  # type: ignore[arg-type]
                                EstimatedImpact(1.0, 1.0, "low", "low"), rewritten_query=rewrite)


def test_creates_lists_each_accepted_command_in_order() -> None:
    p = proposal(
        'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "Ix" ON shop."Orders" USING BTREE '
        "(user_id, (lower(email)) DESC) INCLUDE (total) WHERE status = 'open'",
        "CREATE MATERIALIZED VIEW mv AS WITH recent AS (SELECT * FROM orders) "
        "SELECT u.id, count(*) FROM recent r JOIN public.users u ON u.id = r.user_id GROUP BY u.id",
        "CREATE STATISTICS s1 (dependencies) ON a, b FROM orders",
        "ANALYZE orders",
        "ALTER TABLE orders ALTER COLUMN a SET STATISTICS 500",
        ptype="materialized_view")
    created = creates(p)
    assert created.complete
    index, view, stats, analyze, target = created.commands
    assert isinstance(index, NewIndex)
    assert (index.table, index.name, index.columns, index.method, index.include, index.unique) == (
        "shop.Orders", "shop.Ix", ("user_id",), "btree", ("total",), True)
    assert index.keys == ("user_id", "(lower(email)) DESC")
    assert index.where == "status = 'open'"
    assert "CONCURRENTLY" in index.concurrently and "IF NOT EXISTS" not in index.concurrently
    assert isinstance(view, NewView) and view.name == "mv"
    assert set(view.reads) == {"orders", "public.users"}  # the CTE is not a relation
    assert view.query.startswith("WITH recent AS")
    assert isinstance(stats, NewStatistics) and (stats.name, stats.table, stats.columns) == (
        "s1", "orders", ("a", "b"))
    assert isinstance(analyze, Change) and (analyze.kind, analyze.statement) == ("analyze", "ANALYZE orders")
    assert isinstance(target, Change) and (target.kind, target.table, target.columns) == (
        "statistics_target", "orders", ("a",))
    assert created.indexes == (index,) and created.views == (view,) and created.statistics == (stats,)
    assert created.reads == view.reads
    assert created.indexed_tables == ("shop.Orders",)


def test_a_refused_command_creates_nothing_and_marks_the_list_incomplete() -> None:
    created = creates(proposal("CREATE INDEX i ON orders (a)", "DROP TABLE orders"))
    assert not created.complete
    assert [type(f) for f in created.commands] == [NewIndex]


def test_a_partitioning_recipe_lists_its_tables_and_steps() -> None:
    created = creates(proposal(
        "CREATE TABLE orders_new (LIKE orders INCLUDING ALL) PARTITION BY RANGE (created_at)",
        "CREATE TABLE orders_2024 PARTITION OF orders_new FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
        "INSERT INTO orders_new SELECT * FROM orders",
        "ALTER TABLE orders RENAME TO orders_old",
        "ALTER TABLE orders_new RENAME TO orders",
        ptype="partitioning"))
    assert [t.name for t in created.tables] == ["orders_new", "orders_2024"]
    assert [f.kind for f in created.commands if isinstance(f, Change)] == ["insert", "rename", "rename"]


def test_a_proposal_is_validated_once_for_all_its_readers() -> None:
    p = proposal("CREATE INDEX once_ix ON orders (user_id)", "ANALYZE orders",
                 rewrite="SELECT * FROM orders WHERE user_id = 1")
    first = validate(p)
    validate_candidate(p)
    proposal_references(p)
    hideable_indexes(p)
    _indexed_tables(p)
    _views(p)
    assert validate(p) is first  # the same validation, not another one
    assert validate_candidate(p) is first.result
    assert proposal_references(p).refs[:len(first.references.refs)] == first.references.refs


def test_the_benchmark_hides_only_named_indexes_of_a_proposal_that_creates_nothing_else() -> None:
    assert hideable_indexes(proposal('CREATE INDEX CONCURRENTLY "Ix" ON s."T" (a)', "ANALYZE s.\"T\"")) == (
        "s.Ix",)
    assert hideable_indexes(proposal("CREATE INDEX ON orders (a)")) is None  # PostgreSQL names it
    assert hideable_indexes(proposal("CREATE INDEX i ON orders (a)",
                                     "CREATE STATISTICS s ON a, b FROM orders")) is None
    assert hideable_indexes(proposal("CREATE INDEX i ON orders (a)", "VACUUM orders")) is None


def test_the_query_family_reads_the_views_the_validator_read() -> None:
    p = proposal("CREATE MATERIALIZED VIEW app.mv AS SELECT user_id, sum(total) FROM orders "
                 "WHERE status = 'open' GROUP BY user_id", ptype="materialized_view")
    query = "SELECT user_id, sum(total) FROM orders WHERE status = 'open' GROUP BY user_id"
    assert _views(p) == [("mv", query)]


def test_the_batch_report_merges_indexes_as_the_validator_read_them() -> None:
    assert index_key("CREATE INDEX i ON public.orders USING btree (user_id, created_at DESC) "
                     "INCLUDE (total) WHERE status = 'open'") == IndexKey(
        "orders", "btree", ("user_id", "created_at DESC"), "status = 'open'", ("total",))
    assert index_key("ANALYZE orders") is None
    assert index_key("CREATE INDEX i ON orders (a); DROP TABLE orders") is None
