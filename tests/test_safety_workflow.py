"""The safety gate in the workflow, in real forks: what the catalog refuses never runs, a
proposal that creates nothing new is rejected, and a migration that loses data fails."""

from __future__ import annotations

import os

import pytest

from afs.brains import Squad
from afs.catalog import Fingerprint, lost_rows, table_fingerprints
from afs.config import Settings
from afs.db import open_connection
from afs.errors import UnsafeSqlError
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.models import AgentKey, EstimatedImpact, OptimizationProposal, ProposalType, TaskResult
from afs.optimize import Crew, TaskRequest, optimize
from afs.router import load_rules
from afs.sandbox.server import SandboxServer
from afs.testing import ScriptedBrain

NO_LEAKS = pytest.mark.usefixtures("no_leaked_forks")


def proposal(agent: AgentKey, ptype: ProposalType, *sql: str) -> OptimizationProposal:
    return OptimizationProposal(agent=agent, proposal_type=ptype, sql_commands=sql, rollback_commands=(),
                                rationale="test", estimated_impact=EstimatedImpact(90, 1, "low", "low"),
                                validation_steps=("trust me",))


async def run(settings: Settings, sandbox: SandboxServer, forks: ForkClient, query: str,
              brain: ScriptedBrain) -> TaskResult:
    events = Emitter("s" + os.urandom(3).hex())
    squad = Squad(brain_for=lambda _: brain, provider="scripted", agents=("gemini25pro",))
    return await optimize(settings, TaskRequest(query=query, runs=3), source="afs_demo",
                          source_dsn=sandbox.dsn("afs_demo"),
                          crew=Crew(forks=forks, squad=squad, rules=load_rules(None)), events=events)


QUERY = "SELECT id, status FROM orders WHERE user_id = 42"


@NO_LEAKS
async def test_an_index_that_exists_already_is_rejected_not_measured(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    # IF NOT EXISTS builds nothing; the baseline would hide the user's own index, the rollback drop it
    brain = ScriptedBrain(lambda agent: (
        proposal(agent, "index", "CREATE INDEX IF NOT EXISTS orders_pkey ON orders (user_id)"),
        proposal(agent, "index", "CREATE INDEX s_user ON orders (user_id)"),
    ))
    result = await run(settings, sandbox, forks, QUERY, brain)
    (outcome,) = result.outcomes
    first, second = outcome.candidates
    assert first.status == "rejected" and first.benchmark is None
    assert "index public.orders_pkey already exists" in first.note
    assert first.validation is not None and not first.validation.is_valid
    assert second.status == "measured"


@NO_LEAKS
async def test_a_function_of_an_untrusted_extension_never_runs(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    # plpgsql's handler is in pg_catalog but belongs to an extension, not to PostgreSQL itself
    brain = ScriptedBrain(lambda agent: proposal(
        agent, "materialized_view", "CREATE MATERIALIZED VIEW s_mv AS SELECT plpgsql_call_handler() AS h"))
    result = await run(settings, sandbox, forks, QUERY, brain)
    (outcome,) = result.outcomes
    assert outcome.status == "rejected"
    assert outcome.error and "extension plpgsql" in outcome.error


@NO_LEAKS
async def test_the_users_query_is_judged_by_the_catalog_before_anything_runs(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    brain = ScriptedBrain(lambda agent: None)
    with pytest.raises(UnsafeSqlError, match=r"pg_catalog\.pg_authid, a system relation"):
        await run(settings, sandbox, forks, "SELECT rolname FROM pg_authid WHERE rolname = 'x'", brain)
    with pytest.raises(UnsafeSqlError, match="VOLATILE"):
        await run(settings, sandbox, forks, "SELECT id FROM orders WHERE id = currval('x')", brain)


NARROWED = ("CREATE TABLE s_orders (id bigint NOT NULL, user_id bigint NOT NULL, status text NOT NULL,"
            " total_amount numeric(12, {scale}) NOT NULL, shipping_country text NOT NULL,"
            " created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL) PARTITION BY HASH (user_id)")


def migration(agent: AgentKey, scale: int) -> OptimizationProposal:
    return proposal(agent, "partitioning",
                    NARROWED.format(scale=scale),
                    "CREATE TABLE s_orders_0 PARTITION OF s_orders FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
                    "CREATE TABLE s_orders_1 PARTITION OF s_orders FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
                    "INSERT INTO s_orders SELECT * FROM orders",
                    "ALTER TABLE orders RENAME TO s_orders_old",
                    "ALTER TABLE s_orders RENAME TO orders")


@NO_LEAKS
@pytest.mark.slow
async def test_a_migration_that_changes_values_fails(settings: Settings, sandbox: SandboxServer,
                                                     forks: ForkClient) -> None:
    # every row is copied, but numeric(12, 0) rounds the amounts: the query (which does not read
    # them) returns the same rows and would be faster; the checksum of the table says otherwise
    result = await run(settings, sandbox, forks, QUERY, ScriptedBrain(lambda agent: migration(agent, 0)))
    (outcome,) = result.outcomes
    (candidate,) = outcome.candidates
    assert candidate.status == "failed", candidate.note
    assert "does not keep every row and column of the original" in candidate.note
    assert "orders holds" in candidate.note and "values differ" in candidate.note
    assert result.status != "completed"


@NO_LEAKS
@pytest.mark.slow
async def test_a_migration_that_keeps_every_row_is_measured(settings: Settings, sandbox: SandboxServer,
                                                            forks: ForkClient) -> None:
    result = await run(settings, sandbox, forks, QUERY, ScriptedBrain(lambda agent: migration(agent, 2)))
    (outcome,) = result.outcomes
    (candidate,) = outcome.candidates
    assert candidate.status == "measured", candidate.note
    assert candidate.benchmark is not None


async def test_fingerprints_follow_the_name(sandbox: SandboxServer) -> None:
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        prints = await table_fingerprints(conn, ["products", "no_such_table"])
        again = await table_fingerprints(conn, ["products"], {"products": ("price", "id")})
    products = prints["products"]
    assert products is not None and products.rows > 0 and products.columns[0] == "id"
    assert prints["no_such_table"] is None
    reordered = again["products"]
    assert reordered is not None and reordered.rows == products.rows
    assert reordered.checksum != products.checksum


def test_lost_rows() -> None:
    before = {"t": Fingerprint(("a", "b"), 10, "99"), "u": Fingerprint(("a",), 1, "1")}
    assert lost_rows(before, dict(before)) == []
    assert lost_rows(before, {**before, "t": None}) == [
        "no table t after the migration: its rows must stay under its name"]
    assert lost_rows(before, {**before, "t": Fingerprint(("a",), -1, "")}) == ["t lost its column(s) b"]
    assert lost_rows(before, {**before, "t": Fingerprint(("a", "b"), 9, "98")}) == [
        "t holds 9 rows after the migration, 10 before"]
    assert lost_rows(before, {**before, "t": Fingerprint(("b", "a", "c"), 10, "98")}) == [
        "t holds 10 rows after the migration, 10 before (their values differ)"]
