"""The squad searches, it does not repeat (issue 25 item 3): a measuring slot that a shared
measurement frees goes to a design of the squad nobody measures — another agent's candidate
from the task's pool, else a variant of the squad's designs (covering or plain, another column
order, partial or full) — and only where the planner expects a gain. Pure checks over synthetic
contexts, then one task in the embedded PostgreSQL whose three agents propose the same design."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from afs.agents import expects_gain, offer, pooled, squad_options
from afs.bench import TaskMeasurements
from afs.brains import StrategistBrain, VaryingBrain
from afs.brains.strategists.variants import MAX_VARIANTS, design_variants
from afs.config import Settings
from afs.forks.client import ForkClient
from afs.models import (
    AgentKey,
    AnalysisContext,
    AnalysisResult,
    EstimatedImpact,
    OptimizationProposal,
)
from afs.report import to_json
from afs.safety import validate_candidate
from afs.sandbox.server import SandboxServer
from tests.test_index_design import ctx_of, docs_ctx, orders, plan_node, seq, support, with_catalog
from tests.test_loop_squad import distinct_measured, run


def design(*commands: str, agent: AgentKey = "gemini25pro",
           rewrite: str | None = None) -> OptimizationProposal:
    return OptimizationProposal(agent=agent, proposal_type="index", sql_commands=commands,
                                rollback_commands=(), rationale="",
                                estimated_impact=EstimatedImpact(50.0, 1.0, "low", "low"),
                                rewritten_query=rewrite)


def made(proposals: Sequence[OptimizationProposal]) -> set[str]:
    """What each proposal creates, the index's name aside (`afs_…_idx ON` → `ON`)."""
    return {" ".join(c.split()[:2] + c.split()[3:]) for p in proposals for c in p.sql_commands}


# -- variants of a design: the forms the query motivates -----------------------------------------
PENDING_PAGE = "SELECT id, amount FROM orders WHERE status = 'pending' ORDER BY created_at LIMIT 20"


def pending_ctx() -> AnalysisContext:
    plan = plan_node("Limit", plan_node(
        "Sort", seq("orders", 40_000, 1_960_000, 150.0, filter="(status = 'pending')"),
        rows=20, ms=170.0, Sort_Key=["created_at"]), rows=20, ms=170.1)
    return ctx_of(PENDING_PAGE, plan, [orders()], 170.3)


def test_a_partial_index_varies_to_its_covering_and_full_forms() -> None:
    partial = design("CREATE INDEX afs_orders_created_at_idx ON orders (created_at) WHERE status = 'pending'")
    found = design_variants("gemini25flash", pending_ctx(), partial)
    assert made(found) == {
        "CREATE INDEX ON orders (created_at) INCLUDE (id, amount) WHERE status = 'pending'",
        "CREATE INDEX ON orders (status, created_at)"}, found
    for variant in found:
        assert variant.agent == "gemini25flash"
        assert validate_candidate(variant).is_valid, variant.sql_commands
        assert len(variant.rollback_commands) == 1 and variant.rollback_commands[0].startswith("DROP INDEX")
        assert "A variant of a design of the squad" in variant.rationale


def test_a_key_with_a_constant_varies_to_its_partial_form_and_the_covering_one_to_the_plain() -> None:
    query = "SELECT id FROM orders WHERE country = 'IS' AND user_id = 7 ORDER BY created_at"
    ctx = ctx_of(query, seq("orders", 30, 1_999_970, 150.0, filter="((country = 'IS') AND (user_id = 7))"),
                 [orders()], 150.2)
    covering = design("CREATE INDEX i ON orders (user_id, country, created_at) INCLUDE (id)")
    assert made(design_variants("gemini25pro", ctx, covering)) == {
        "CREATE INDEX ON orders (user_id, country, created_at)",  # plain
        "CREATE INDEX ON orders (user_id, country, created_at, id)",  # INCLUDE as key columns
        "CREATE INDEX ON orders (country, user_id, created_at) INCLUDE (id)",  # the other equality first
        # the partial form for the rare value of an enum-like column (14 values), not for user_id
        # (50,000 values: an index for the query's literal only)
        "CREATE INDEX ON orders (user_id, created_at) INCLUDE (id) WHERE country = 'IS'"}
    # never more than MAX_VARIANTS, never the design itself
    assert len(design_variants("gemini25pro", ctx, covering)) <= MAX_VARIANTS
    assert covering.sql_commands[0] not in {c for v in design_variants("gemini25pro", ctx, covering)
                                            for c in v.sql_commands}


def test_a_set_varies_one_index_at_a_time_and_keeps_the_others() -> None:
    both = design("CREATE INDEX a ON orders (created_at) WHERE status = 'pending'",
                  "CREATE INDEX b ON orders (user_id)")
    found = design_variants("gemini25pro", pending_ctx(), both)
    assert found and all(len(v.sql_commands) == 2 and len(v.rollback_commands) == 2 for v in found)
    assert all(any("(user_id)" in c for c in v.sql_commands) for v in found)


def test_an_index_of_another_kind_varies_to_the_other_kinds_the_catalog_has_for_its_operator() -> None:
    trigram = design("CREATE INDEX i ON docs USING gin (title gin_trgm_ops)")
    ctx = with_catalog(docs_ctx("title LIKE '%beef42%'"),
                       support("~~", "text", "gin", "gin_trgm_ops", extension="pg_trgm"),
                       support("~~", "text", "gist", "gist_trgm_ops", extension="pg_trgm"),
                       support("=", "text", "btree", "text_ops", default=True))
    found = design_variants("gemini25pro", ctx, trigram)
    assert made(found) == {"CREATE INDEX ON docs USING gist (title gist_trgm_ops)"}
    assert "gist (gist_trgm_ops) instead of gin (gin_trgm_ops)" in found[0].rationale
    # without the catalog, or when nothing else serves the operator: nothing
    assert design_variants("gemini25pro", docs_ctx("title LIKE '%beef42%'"), trigram) == ()
    only = with_catalog(docs_ctx("title LIKE '%beef42%'"),
                        support("~~", "text", "gin", "gin_trgm_ops", extension="pg_trgm"))
    assert design_variants("gemini25pro", only, trigram) == ()


@pytest.mark.parametrize("proposal", [
    design("CREATE INDEX i ON orders (lower(country))"),  # an expression
    design("CREATE INDEX i ON orders (country text_pattern_ops)"),  # an operator class
    design("CREATE INDEX i ON orders USING gin (payload)"),  # no catalog says what serves the query
    design("CREATE INDEX i ON orders (created_at)", rewrite="SELECT 1"),  # a rewrite
    design("CREATE INDEX i ON orders (created_at)", "ANALYZE orders"),  # not only index builds
], ids=["expression", "opclass", "gin-without-catalog", "rewrite", "analyze"])
def test_what_cannot_be_rebuilt_from_its_parts_is_not_varied(proposal: OptimizationProposal) -> None:
    assert design_variants("gemini25pro", pending_ctx(), proposal) == ()


# -- the pool: every agent's candidates, each design once ------------------------------------------
def test_the_pool_offers_every_agent_s_first_choice_first_and_each_design_once() -> None:
    shared = TaskMeasurements()
    common = design("CREATE INDEX i ON orders (status)")
    offer(shared.offered, [common, design("CREATE INDEX j ON orders (user_id)")])
    offer(shared.offered, [dataclasses.replace(common, agent="gemini25flash"),
                           design("CREATE INDEX k ON orders (country)", agent="gemini25flash")])
    offer(shared.offered, [design("CREATE INDEX v ON orders (amount)", agent="gemini20flash")])
    order = [p.sql_commands[0].split()[2] for p in pooled(shared.offered)]
    assert order == ["i", "v", "j", "k"]  # the first choices (the common one once), then the second ones
    taken = {TaskMeasurements.key(common)}
    options = squad_options(pooled(shared.offered), lambda p: TaskMeasurements.key(p) not in taken, 2)
    assert [p.sql_commands[0].split()[2] for p in options] == ["v", "j"]


def test_a_spare_slot_goes_only_where_the_planner_expects_a_gain() -> None:
    assert expects_gain(80.0, 100.0)
    assert not expects_gain(95.0, 100.0)  # less than 10 % better: nothing to expect
    assert not expects_gain(None, 100.0) and not expects_gain(80.0, None)  # cannot judge


# -- one task: three agents whose candidates coincide ----------------------------------------------
@dataclasses.dataclass
class SameFirstChoice:
    """Every agent proposes the index designer's first choice only (the strategists'
    analysis and variants): three agents whose candidates coincide."""

    inner: StrategistBrain = dataclasses.field(default_factory=StrategistBrain)
    name: str = "heuristic"

    async def analyze(self, agent: AgentKey, ctx: AnalysisContext) -> AnalysisResult:
        return await self.inner.analyze("gemini25pro", ctx)

    async def propose(self, agent: AgentKey, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> Sequence[OptimizationProposal]:
        found = await self.inner.propose("gemini25pro", ctx, analysis)
        return [dataclasses.replace(p, agent=agent) for p in found[:1]]

    async def variants(self, agent: AgentKey, ctx: AnalysisContext,
                       design: OptimizationProposal) -> Sequence[OptimizationProposal]:
        return await self.inner.variants(agent, ctx, design)


@pytest.mark.usefixtures("no_leaked_forks")
async def test_three_agents_whose_candidates_coincide_measure_more_distinct_designs_than_one(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    brain = SameFirstChoice()
    assert isinstance(brain, VaryingBrain)
    alone = await run(settings, sandbox, forks, ("gemini25pro",), brain)
    squad = await run(settings, sandbox, forks, ("gemini25pro", "gemini25flash", "gemini20flash"), brain)
    assert len(distinct_measured(alone)) == 1, to_json(alone)
    assert len(distinct_measured(squad)) > len(distinct_measured(alone)), to_json(squad)
    for outcome in squad.outcomes:
        own = [c for c in outcome.candidates
               if c.status == "measured" and not c.note.startswith("measured by")]
        assert len(own) <= 1, [(c.rank, c.note) for c in outcome.candidates]  # the budget stays one
        for c in own:  # a design of the squad went through the same validation and screening
            assert c.validation is not None and c.validation.is_valid
            if c.rank > 1:
                assert c.planner_cost is not None and c.baseline_cost is not None
                assert c.planner_cost < 0.9 * c.baseline_cost


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_slot_an_agent_s_own_designs_leave_unused_goes_to_the_squad_and_a_lone_agent_s_stays_unused(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    """Two measuring slots each and one design each: in a squad, the agent that measures the
    shared design fills its second slot with a design of the squad nobody measures (the others
    theirs with the slots the shared measurement freed); a lone agent has no squad to search
    with, and measures its one design."""
    brain = SameFirstChoice()
    alone = await run(settings, sandbox, forks, ("gemini25pro",), brain, measured=2)
    squad = await run(settings, sandbox, forks, ("gemini25pro", "gemini25flash", "gemini20flash"), brain,
                      measured=2)
    assert len(distinct_measured(alone)) == 1, to_json(alone)
    measured_by: dict[object, set[AgentKey]] = {}
    owners = []
    for outcome in squad.outcomes:
        own = [c for c in outcome.candidates
               if c.status == "measured" and not c.note.startswith("measured by")]
        assert len(own) <= 2, [(c.rank, c.note) for c in outcome.candidates]  # the budget stays two
        if any(c.rank == 1 for c in own):
            owners.append((outcome.agent, len(own)))
        for c in own:
            measured_by.setdefault(TaskMeasurements.key(c.proposal), set()).add(outcome.agent)
    # the agent that measured the shared first choice went on with the squad's designs
    assert owners and all(n == 2 for _, n in owners), owners
    assert all(len(agents) == 1 for agents in measured_by.values()), measured_by
    assert len(distinct_measured(squad)) >= 4, to_json(squad)
