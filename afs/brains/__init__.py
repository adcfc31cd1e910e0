"""The brains: what thinks for an agent, and who thinks for which agent.

    Brain           the protocol: analyze(agent, ctx), then propose(agent, ctx, analysis):
                    ranked candidate designs, best first
    RevisingBrain   a brain that can also correct a rewrite the result check failed (models)
    ReviewingBrain  a brain that can review the other agents' measured proposals (models)
    RefiningBrain   a brain that extends a measured design to remove the bottleneck the plan
                    with it in place shows (the agent's loop, afs.agents)
    VaryingBrain    a brain that offers other forms of a design of the squad (covering or
                    plain, another column order, partial or full): for a measuring slot a
                    shared measurement frees (afs.agents)
    StrategistBrain the offline strategists (`afs.brains.strategists`, pure rules over the
                    plan, the statistics and the query)
    SlowBrain       another brain behind a fixed latency per call (benchmarks, demos)
    MeteredBrain    a brain that counts its model calls per agent (`ModelUsage`: tokens, cost)
    Squad           the brains of one command, and what the report says about them
    strategists/    one module per specialisation, over shared evidence
    gemini/         Gemini models: client, parsing, prompts, GeminiBrain, open_gemini_squad

The workflow that calls a brain is `afs.agents`; the orchestrator is `afs.optimize`.
Neither is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import trio

from afs.brains import strategists
from afs.brains.strategists.refine import refine_design
from afs.brains.strategists.rewrites import rewrite_proposals
from afs.brains.strategists.variants import design_variants
from afs.models import (
    AgentKey,
    AgentOutcome,
    AnalysisContext,
    AnalysisResult,
    LoopStep,
    ModelUsage,
    OptimizationProposal,
    ReviewFlag,
)
from afs.pg.bottleneck import Bottleneck


class Brain(Protocol):
    """What thinks for an agent: a model or an offline strategist."""

    name: str

    async def analyze(self, agent: AgentKey, ctx: AnalysisContext) -> AnalysisResult: ...

    async def propose(self, agent: AgentKey, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> Sequence[OptimizationProposal]:
        """Candidate designs, best first (the agent screens and measures them); () for none."""
        ...


@runtime_checkable
class RevisingBrain(Protocol):
    """A brain that can be told a rewrite returned other rows, and try once more."""

    async def revise_rewrite(self, agent: AgentKey, ctx: AnalysisContext, analysis: AnalysisResult,
                             proposal: OptimizationProposal, reason: str) -> OptimizationProposal | None:
        """A corrected design for `proposal`, whose rewrite failed the result check for `reason`;
        None when the brain has none."""
        ...


@runtime_checkable
class ReviewingBrain(Protocol):
    """A brain that reviews the other agents' measured proposals before the consensus."""

    async def review(self, reviewer: AgentKey, query: str,
                     outcomes: Sequence[AgentOutcome]) -> Sequence[ReviewFlag]:
        """Flags on proposals of `outcomes` (another agent's each); () when nothing is wrong."""
        ...


@dataclass(frozen=True)
class StepSeen:
    """What a step of the agent's loop shows the brain (`RefiningBrain.refine`): the measured
    design in place (`current`), the query's plan with it in place, the plan node to remove
    (None: none found), and every step so far."""

    current: OptimizationProposal
    after_plan: Mapping[str, Any]
    bottleneck: Bottleneck | None
    steps: Sequence[LoopStep]


@runtime_checkable
class RefiningBrain(Protocol):
    """A brain that reads the plan of the query with its measured design in place, and extends
    the design to remove what it shows (the agent's loop, afs.agents)."""

    async def refine(self, agent: AgentKey, ctx: AnalysisContext, analysis: AnalysisResult,
                     seen: StepSeen) -> OptimizationProposal | None:
        """The next design: `seen.current` extended (its statements plus more) to remove what
        `seen.after_plan` (the query's plan with `current` in place) shows; None to stop."""
        ...


@runtime_checkable
class VaryingBrain(Protocol):
    """A brain that offers other forms of a design the squad has, for a measuring slot that
    another agent's measurement of the same design frees (afs.agents: the squad searches)."""

    async def variants(self, agent: AgentKey, ctx: AnalysisContext,
                       design: OptimizationProposal) -> Sequence[OptimizationProposal]:
        """Other forms of `design` the query motivates (each screened and measured like any
        candidate); () for none."""
        ...


class StrategistBrain:
    """The offline strategists: rules over the plan and the statistics."""

    name = "heuristic"

    # The rules read the query (CPU work, seconds for a large one): in a worker thread, so
    # the other agents' trio tasks go on meanwhile.
    async def analyze(self, agent: AgentKey, ctx: AnalysisContext) -> AnalysisResult:
        return await trio.to_thread.run_sync(strategists.analyze, agent, ctx)

    async def propose(self, agent: AgentKey, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> Sequence[OptimizationProposal]:
        return await trio.to_thread.run_sync(
            lambda: interleave(strategists.propose(agent, ctx, analysis), rewrite_proposals(agent, ctx)))

    async def refine(self, agent: AgentKey, ctx: AnalysisContext, analysis: AnalysisResult,
                     seen: StepSeen) -> OptimizationProposal | None:
        del analysis  # the strategists read the plan, the statistics and the query again
        return await trio.to_thread.run_sync(
            lambda: refine_design(agent, ctx, seen.current, seen.after_plan, seen.bottleneck, seen.steps))

    async def variants(self, agent: AgentKey, ctx: AnalysisContext,
                       design: OptimizationProposal) -> Sequence[OptimizationProposal]:
        return await trio.to_thread.run_sync(lambda: design_variants(agent, ctx, design))


def interleave(specialised: Sequence[OptimizationProposal],
               rewrites: Sequence[OptimizationProposal], lead: int = 2) -> tuple[OptimizationProposal, ...]:
    """An agent's candidates: its specialisation's first `lead` designs, then the rewrites the
    query admits, then the rest, so a capped candidate set still holds a rewrite when one exists
    (the router may send a simple query to one agent only)."""
    first, rest = list(specialised[:lead]), list(specialised[lead:])
    if rewrites:
        return (*first, rewrites[0], *rest[:1], *rewrites[1:], *rest[1:])
    return (*first, *rest)


@dataclass
class SlowBrain:
    """Another brain with a fixed latency per call: a stand-in for a model's think time."""

    inner: Brain
    latency_s: float
    name: str = "simulated"

    async def analyze(self, agent: AgentKey, ctx: AnalysisContext) -> AnalysisResult:
        await trio.sleep(self.latency_s)
        return await self.inner.analyze(agent, ctx)

    async def propose(self, agent: AgentKey, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> Sequence[OptimizationProposal]:
        await trio.sleep(self.latency_s)
        return await self.inner.propose(agent, ctx, analysis)


@runtime_checkable
class MeteredBrain(Protocol):
    """A brain that counts what its model calls take, per agent."""

    def usage_of(self, agent: AgentKey) -> ModelUsage | None:
        """What the agent's calls took so far; None before its first call."""
        ...


@dataclass(frozen=True)
class Squad:
    """Who thinks for which agent, and what the report should say about it."""

    brain_for: Callable[[AgentKey], Brain]
    provider: str  # "heuristic" | "gemini" | "simulated"
    note: str = ""
    agents: tuple[AgentKey, ...] | None = None  # fixed squad (benchmarks, tests); None = route
    # the agent whose brain reviews the others' measured proposals (a ReviewingBrain), if any
    reviewer: AgentKey | None = None

    def usage_of(self, agent: AgentKey) -> ModelUsage | None:
        """What the agent's model calls took so far (its brain's count); None for a brain
        without a model, or before its first call."""
        brain = self.brain_for(agent)
        return brain.usage_of(agent) if isinstance(brain, MeteredBrain) else None
