"""Offline strategists: the agents' brains when no model is configured (pure).

One strategist per specialisation of the seed (`AGENTS` in models.py), one module each::

    gemini25pro    index_design.py     a ranked set: composite, partial, covering, expression,
                                       GIN (jsonb, trigram) indexes; join-key indexes and
                                       sets of them (a join's foreign keys, an OR's arms)
    gemini25flash  structure.py        BRIN on time-correlated columns; monthly range
                                       partitioning with its migration, done in the fork
    gemini20flash  precomputation.py   a materialized view of an aggregation plus the
                                       rewrite that reads it; otherwise one low-risk index
    (every agent)  plan_fixes.py       for a wrong plan rather than a missing structure:
                                       extended statistics behind a row misestimate,
                                       work_mem for a sort or hash that spilled to disk
    (every agent)  refine.py           the loop's next step: the measured design plus the
                                       index that removes the bottleneck of its after-plan
    (every agent)  variants.py         other forms of a design of the squad (covering or
                                       plain, another column order, partial or full), for
                                       a measuring slot a shared measurement frees
    (shared)       evidence.py         Evidence (the plan, the statistics and the query,
                                       by table), Decision, covering_index, estimates

An agent's candidates are those of `CANDIDATE_SOURCES`, in order: its specialisation's
decision first, then the plan fixes every agent measures too.

When the specialty of gemini25flash (or of gemini25pro on a complex query) finds
nothing for an aggregation, it proposes the summary view too (`with_rollup`), as
the seed's router and specialisations ask of them.

Every strategist is a pure function of the `AnalysisContext`: the query (read once by
afs.query: `Evidence` takes the one `Query`, shared by every strategist), its EXPLAIN
(ANALYZE, BUFFERS) plan (afs.pg.plan) and the table statistics (afs.pg.stats). It
decides once (`Decision`) and that decision yields both
the seed's `AnalysisResult` and the `OptimizationProposal` (or None: nothing worth
proposing). A new strategist is one decide-function and one `STRATEGISTS` entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from afs.brains.strategists.evidence import Decision
from afs.brains.strategists.index_design import decide_index_design
from afs.brains.strategists.plan_fixes import plan_fix_proposals
from afs.brains.strategists.precomputation import decide_precomputation
from afs.brains.strategists.structure import decide_structure
from afs.errors import InputError
from afs.models import AgentKey, AnalysisContext, AnalysisResult, OptimizationProposal

__all__ = ["CANDIDATE_SOURCES", "STRATEGISTS", "Strategist", "analyze", "iter_proposal_sql", "propose",
           "with_rollup"]


# -- secondary expertise ---------------------------------------------------------------------
# The seed's router sends aggregations to gemini-2.5-flash ("simple aggregation") and to
# gemini-2.5-pro ("complex aggregation - include gemini-2.5-pro for mat views"), and lists
# summary/rollup tables among gemini-2.5-flash's schema modifications. So when their own
# specialty finds nothing for an aggregating query, they fall back to pre-computation.
ROLLUP_MIN_COMPLEXITY: Final = {"gemini25flash": 0, "gemini25pro": 5}


def with_rollup(primary: Callable[[AnalysisContext, AgentKey], Decision]
                ) -> Callable[[AnalysisContext, AgentKey], Decision]:
    """`primary`, falling back to a materialized view when it proposes nothing for an aggregation."""

    def decide(ctx: AnalysisContext, agent: AgentKey) -> Decision:
        decision = primary(ctx, agent)
        if (decision.proposal is not None
                or ctx.features.complexity_score < ROLLUP_MIN_COMPLEXITY.get(agent, 0)):
            return decision
        rollup = decide_precomputation(ctx, agent)  # a view only for an aggregation, else an index
        if rollup.proposal is None or rollup.proposal.proposal_type != "materialized_view":
            return decision
        why = (f"{decision.actions[0]}; as a summary table instead (secondary expertise), "
               if decision.actions else "")
        extra = tuple(i for i in rollup.insights if i not in decision.insights)
        return Decision(insights=(*decision.insights, *extra),
                        actions=(why + rollup.actions[0],) if why else rollup.actions,
                        confidence=rollup.confidence - 0.05, target_table=rollup.target_table,
                        estimated_improvement=rollup.estimated_improvement, proposal=rollup.proposal)

    return decide


# -- where an agent's candidates come from ---------------------------------------------------
Candidates = tuple[OptimizationProposal, ...]
CandidateSource = Callable[[Decision, AnalysisContext, AgentKey], Candidates]


def specialisation(decision: Decision, ctx: AnalysisContext, agent: AgentKey) -> Candidates:
    """The agent's own designs: its decision's first choice and alternatives."""
    return decision.candidates


def index_designs(decision: Decision, ctx: AnalysisContext, agent: AgentKey) -> Candidates:
    """The index designer's candidates, for every agent: the router sends simple queries to one
    agent only, and a missing index is the most common fix of all."""
    return decide_index_design(ctx, agent).candidates


def plan_fixes(decision: Decision, ctx: AnalysisContext, agent: AgentKey) -> Candidates:
    """Fixes for a wrong plan (afs.brains.strategists.plan_fixes), whatever the specialisation."""
    return plan_fix_proposals(ctx, agent)


# In this order: an agent's own specialisation first (rewrites are added by the brain).
CANDIDATE_SOURCES: tuple[CandidateSource, ...] = (specialisation, index_designs, plan_fixes)


# -- the registry ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Strategist:
    """An offline brain: one decide-function gives both the analysis and the proposal."""

    agent: AgentKey
    decide: Callable[[AnalysisContext, AgentKey], Decision]

    def analyze(self, ctx: AnalysisContext) -> AnalysisResult:
        return self.decide(ctx, self.agent).analysis(ctx)

    def propose(self, ctx: AnalysisContext, analysis: AnalysisResult) -> tuple[OptimizationProposal, ...]:
        # The strategist's analysis is a pure function of ctx: decide again rather than parse
        # its own prose back. (`analysis` matters to model brains; it is accepted for symmetry.)
        del analysis
        decision = self.decide(ctx, self.agent)
        found = [p for source in CANDIDATE_SOURCES for p in source(decision, ctx, self.agent)]
        unique: dict[tuple[object, ...], OptimizationProposal] = {}
        for p in found:  # the same design twice (by its SQL) is measured once
            unique.setdefault((p.sql_commands, p.rewritten_query, p.settings), p)
        return tuple(unique.values())


STRATEGISTS: Mapping[AgentKey, Strategist] = {
    "gemini25pro": Strategist("gemini25pro", with_rollup(decide_index_design)),
    "gemini25flash": Strategist("gemini25flash", with_rollup(decide_structure)),
    "gemini20flash": Strategist("gemini20flash", decide_precomputation),
}


def _strategist(agent: str) -> Strategist:
    try:
        return STRATEGISTS[agent]
    except KeyError:
        raise InputError(f"no offline strategist for agent {agent!r} "
                         f"(known: {', '.join(STRATEGISTS)})") from None


def analyze(agent: str, ctx: AnalysisContext) -> AnalysisResult:
    """The agent's analysis of the query: insights with numbers, actions, confidence, metadata."""
    return _strategist(agent).analyze(ctx)


def propose(agent: str, ctx: AnalysisContext, analysis: AnalysisResult) -> tuple[OptimizationProposal, ...]:
    """The agent's candidate designs, best first; () when nothing is worth proposing (its
    analysis says why)."""
    return _strategist(agent).propose(ctx, analysis)


def iter_proposal_sql(proposal: OptimizationProposal) -> Iterator[str]:
    """Every statement of a proposal: its commands, its rollback and its rewrite."""
    yield from proposal.sql_commands
    yield from proposal.rollback_commands
    if proposal.rewritten_query:
        yield proposal.rewritten_query
