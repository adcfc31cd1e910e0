"""The analysis step against the real demo database (small scale): read-only on afs_demo."""

from __future__ import annotations

from afs.analysis import gather_context, source_table_stats, table_info
from afs.brains.strategists import analyze, propose
from afs.db import open_connection
from afs.query.features import extract_features
from afs.safety import validate_proposal
from afs.sandbox.server import SandboxServer


async def test_table_info_has_widths_and_the_tables_that_reference_it(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        info = await table_info(conn, "orders", {"status", "user_id", "total_amount"}, 0.5)
    assert info is not None
    assert info.name == "orders" and 45_000 <= info.rows <= 55_000 and info.size_mb > 0
    assert [c.name for c in info.columns] == ["id", "user_id", "status", "total_amount", "shipping_country",
                                              "created_at", "updated_at"]
    assert info.primary_key == ("id",)
    assert any(ix.primary and ix.columns == ("id",) for ix in info.indexes)
    assert info.writes_per_read == 0.5
    assert info.ddl.startswith("CREATE TABLE orders (\n  id bigint NOT NULL,")
    # the referenced columns and the timestamps, each with its average width from pg_stats
    assert {"status", "user_id", "total_amount", "created_at", "updated_at"} <= set(info.column_stats)
    assert "shipping_country" not in info.column_stats
    widths = {name: stats.avg_width for name, stats in info.column_stats.items()}
    assert widths["user_id"] == widths["created_at"] == 8
    assert widths["status"] is not None and 4 <= widths["status"] <= 12  # 'completed', 'paid', …
    status = info.column_stats["status"]
    assert status.n_distinct == 6 and "completed" in status.most_common_vals
    # order_items.order_id → orders.id
    assert info.referenced_by == ("order_items",)


async def test_referenced_by_for_every_demo_table(sandbox: SandboxServer) -> None:
    expected = {"users": ("orders",), "products": ("order_items",), "orders": ("order_items",),
                "order_items": (), "events": ()}
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        for name, referencing in expected.items():
            info = await table_info(conn, name, set())
            assert info is not None, name
            assert info.referenced_by == referencing, name
        events = await table_info(conn, "events", {"payload"})
        assert await table_info(conn, "no_such_table", set()) is None
    assert events is not None
    payload = events.column_stats["payload"].avg_width
    assert payload is not None and payload > 20  # jsonb documents, not 8-byte scalars


async def test_gather_context_then_a_strategist_proposes_gin_for_jsonb(sandbox: SandboxServer) -> None:
    query = """SELECT id, created_at FROM events WHERE payload @> '{"method": "sso"}'"""
    features = extract_features(query)
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        source = await source_table_stats(conn, features.tables)
        ctx = await gather_context(conn, task_id="t-analysis", task_type="query_optimization", query=query,
                                   features=features, source_stats=source)
    assert ctx.query == query and ctx.features == features
    assert ctx.plan["Node Type"] and ctx.execution_ms > 0
    assert set(ctx.tables) == {"events"}
    events = ctx.tables["events"]
    assert events.rows == source["events"].rows and events.referenced_by == ()
    assert events.column_stats["payload"].avg_width
    proposal = next(iter(propose("gemini25pro", ctx, analyze("gemini25pro", ctx))), None)  # the first choice
    assert proposal is not None
    assert proposal.sql_commands == (
        "CREATE INDEX afs_events_payload_gin ON events USING gin (payload jsonb_path_ops)",)
    assert validate_proposal(proposal.sql_commands, proposal.proposal_type).is_valid


async def test_gather_context_for_a_join_and_a_like_prefix(sandbox: SandboxServer) -> None:
    query = ("SELECT o.id, u.email FROM orders o JOIN users u ON u.id = o.user_id "
             "WHERE o.shipping_country LIKE 'J%'")
    features = extract_features(query)
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        ctx = await gather_context(conn, task_id="t-analysis", task_type="query_optimization", query=query,
                                   features=features, source_stats={})
    assert set(ctx.tables) == {"orders", "users"}
    orders, users = ctx.tables["orders"], ctx.tables["users"]
    assert orders.referenced_by == ("order_items",) and users.referenced_by == ("orders",)
    assert orders.column_stats["shipping_country"].avg_width == 3
    email = users.column_stats["email"].avg_width
    assert email is not None and email > 16  # 'user1234@example.com'
    proposal = next(iter(propose("gemini25pro", ctx, analyze("gemini25pro", ctx))), None)  # the first choice
    assert proposal is not None
    assert "(shipping_country text_pattern_ops)" in proposal.sql_commands[0]
    assert validate_proposal(proposal.sql_commands, proposal.proposal_type).is_valid


async def test_columns_carry_their_collation_the_database_default_included(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        row = await conn.fetchone("SELECT datlocprovider, datcollate, datlocale FROM pg_database"
                                  " WHERE datname = current_database()")
        assert row is not None
        provider, collate, locale = row
        default = {"b": "C", "c": collate}.get(provider, locale)
        # a session's temporary table: nothing of afs_demo changes
        await conn.execute('CREATE TEMP TABLE collations (id int, plain text, c text COLLATE "C",'
                           ' posix varchar(9) COLLATE "POSIX", basic text COLLATE ucs_basic)')
        info = await table_info(conn, "collations", set())
    assert info is not None
    assert {c.name: c.collation for c in info.columns} == {
        "id": None, "plain": default, "c": "C", "posix": "POSIX", "basic": "C"}
