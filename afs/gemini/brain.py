"""`GeminiBrain`: an agent's brain made of a Gemini model (the `Brain` protocol of afs.agents).

    analyze: system prompt of the specialisation + analysis template filled with the
             context (query, trimmed EXPLAIN, DDL, indexes, sizes, pg_stats, suite)
             ─► generate_json (ANALYSIS_SCHEMA) ─► parse_analysis
    propose: the same conversation + the analysis + the proposal template
             ─► generate_json (PROPOSAL_SCHEMA) ─► parse_proposal

Unusable output is sent back with the reason, at most `MAX_REPROMPTS` times; then
the agent fails with a `ModelOutputError`. The proposal then goes through the same
safety check and benchmark as a strategist's: the model's estimate is never a
measurement. Token usage and estimated cost are kept per agent in `brain.usage`.
The prompts are files in `afs/gemini/prompts/` (string.Template: `$query`, …).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Any, Final, TypeVar

import httpx
import structlog
import trio

from afs.config import Settings
from afs.errors import ModelOutputError
from afs.gemini.client import (
    DEFAULT_RETRY,
    Credentials,
    GeminiClient,
    RetryPolicy,
    Turn,
    Usage,
    estimate_cost,
    gemini_models,
    open_gemini_client,
)
from afs.gemini.parsing import (
    ANALYSIS_SCHEMA,
    PROPOSAL_SCHEMA,
    parse_analysis,
    parse_proposal,
)
from afs.models import AGENTS, AgentKey, AnalysisContext, AnalysisResult, OptimizationProposal, TableInfo
from afs.optimize import Squad

log = structlog.get_logger("afs.gemini")

MAX_REPROMPTS: Final = 2  # the seed's "Re-prompt … Limit: 2 retry attempts"
DEFAULT_CALL_TIMEOUT_S: Final = 60.0  # one HTTP attempt; the model phase limit bounds them all
PLAN_TOKEN_BUDGET: Final = 4000  # the EXPLAIN JSON in a prompt, in tokens
CHARS_PER_TOKEN: Final = 4  # the usual estimate for English and JSON
MAX_VALUES_SHOWN: Final = 10  # most common values per column
MAX_VALUE_CHARS: Final = 40
MAX_PLAN_STRING_CHARS: Final = 300  # a plan's Filter or Index Cond, when even one node is too long

T = TypeVar("T")


# -- prompts -----------------------------------------------------------------------------------
@functools.cache
def prompt_template(name: str) -> Template:
    """A prompt file of afs/gemini/prompts (`system_<agent>`, `analysis_<agent>`, …)."""
    return Template(resources.files("afs.gemini").joinpath("prompts", f"{name}.md").read_text("utf-8"))


# EXPLAIN keys that say little about where time goes; dropped first when the plan is too long.
_QUIET_KEYS: Final = frozenset({
    "Parallel Aware", "Async Capable", "Plan Width", "Startup Cost", "Actual Startup Time",
    "Inner Unique", "Output", "Shared Dirtied Blocks", "Shared Written Blocks", "Local Hit Blocks",
    "Local Read Blocks", "Local Dirtied Blocks", "Local Written Blocks", "Temp Read Blocks",
    "Temp Written Blocks", "WAL Records", "WAL FPI", "WAL Bytes", "WAL Buffers Full",
    "Parent Relationship", "Scan Direction", "Single Copy", "Disabled", "Storage", "Maximum Storage",
    "Heap Fetches", "Presorted Key", "Full-sort Groups", "Hash Buckets", "Original Hash Buckets",
    "Hash Batches", "Original Hash Batches", "Peak Memory Usage", "Planned Partitions",
    "HashAgg Batches", "Disk Usage", "Schema", "Index Searches",
})


@dataclass
class _Node:
    raw: Mapping[str, Any]
    children: list[_Node]
    parent: _Node | None


def _tree(raw: Mapping[str, Any], parent: _Node | None = None) -> _Node:
    node = _Node(raw, [], parent)
    node.children = [_tree(c, node) for c in raw.get("Plans") or () if isinstance(c, Mapping)]
    return node


def _inclusive(raw: Mapping[str, Any]) -> float:
    """A node's time over all its loops (ms); its estimated cost when there is no ANALYZE."""
    try:
        if "Actual Total Time" in raw:
            return float(raw["Actual Total Time"]) * float(raw.get("Actual Loops") or 1)
        return float(raw.get("Total Cost") or 0.0)
    except (TypeError, ValueError):
        return 0.0


def _self_cost(node: _Node) -> float:
    return max(0.0, _inclusive(node.raw) - sum(_inclusive(c.raw) for c in node.children))


def _label(raw: Mapping[str, Any]) -> str:
    relation = raw.get("Relation Name")
    return f"{raw.get('Node Type', '?')}{f' on {relation}' if relation else ''}"


def _render(node: _Node, kept: set[int], quiet: bool, max_chars: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.raw.items():
        if key == "Plans" or (quiet and key in _QUIET_KEYS):
            continue
        if max_chars is not None and isinstance(value, str) and len(value) > max_chars:
            value = value[:max_chars] + "…"
        out[key] = value
    plans = [_render(c, kept, quiet, max_chars) for c in node.children if id(c) in kept]
    dropped = [c for c in node.children if id(c) not in kept]
    if dropped:
        names = ", ".join(_label(c.raw) for c in dropped[:5]) + (", …" if len(dropped) > 5 else "")
        hidden = sum(1 for c in dropped for _ in _walk(c))
        plans.append({"Omitted": f"{hidden} cheaper node{'s' if hidden != 1 else ''} under: {names}"})
    if plans:
        out["Plans"] = plans
    return out


def _walk(node: _Node) -> list[_Node]:
    return [node, *(n for c in node.children for n in _walk(c))]


def trim_plan(plan: Mapping[str, Any], budget_tokens: int = PLAN_TOKEN_BUDGET) -> tuple[str, str]:
    """The EXPLAIN JSON as text within `budget_tokens`, and a note on what was left out.

    Over budget, quiet keys go first; then only the nodes with the most time of their own
    (their ancestors kept for the shape) stay, as many as fit; cheaper subtrees become one
    "Omitted" line each. A last resort shortens long strings, then cuts the text.
    """
    budget = budget_tokens * CHARS_PER_TOKEN
    root = _tree(plan)
    nodes = _walk(root)
    full = json.dumps(plan, indent=1)
    if len(full) <= budget:
        return full, f"complete, {len(nodes)} nodes"
    every = {id(n) for n in nodes}
    quiet = json.dumps(_render(root, every, True, None), indent=1)
    if len(quiet) <= budget:
        return quiet, f"all {len(nodes)} nodes, minor fields left out"
    ranked = sorted(nodes, key=_self_cost, reverse=True)  # stable: ties keep the plan's order

    def keeping(count: int, max_chars: int | None) -> str:
        kept: set[int] = set()
        for node in ranked[:count]:
            walker: _Node | None = node
            while walker is not None and id(walker) not in kept:
                kept.add(id(walker))
                walker = walker.parent
        return json.dumps(_render(root, kept, True, max_chars), indent=1)

    for max_chars in (None, MAX_PLAN_STRING_CHARS):
        low, high = 0, len(ranked) - 1  # the largest count that fits, by bisection
        while low < high:
            middle = (low + high + 1) // 2
            if len(keeping(middle, max_chars)) <= budget:
                low = middle
            else:
                high = middle - 1
        if low:
            return keeping(low, max_chars), (f"trimmed to the {low} most expensive of {len(nodes)}"
                                             " nodes and their parents")
    text = json.dumps(_render(root, {id(root)}, True, MAX_PLAN_STRING_CHARS), indent=1)
    return text[:budget - 1] + "…", f"cut to {budget_tokens} tokens: only the top node, truncated"


def _value(text: str) -> str:
    return repr(text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…")


def _stats_lines(table: TableInfo) -> list[str]:
    lines = []
    for column, stats in sorted(table.column_stats.items()):
        if stats.n_distinct < 0:
            distinct = f"{-stats.n_distinct:.0%} of the rows distinct"
        else:
            distinct = f"{stats.n_distinct:g} distinct"
        parts = [distinct, f"null_frac {stats.null_frac:.3g}"]
        if stats.avg_width is not None:
            parts.append(f"avg_width {stats.avg_width} bytes")
        if stats.correlation is not None:
            parts.append(f"correlation {stats.correlation:.3f}")
        if stats.most_common_vals:
            pairs = list(zip(stats.most_common_vals, stats.most_common_freqs, strict=False))
            shown = ", ".join(f"{_value(v)} {f:.1%}" for v, f in pairs[:MAX_VALUES_SHOWN])
            more = f", … ({len(pairs)} in all)" if len(pairs) > MAX_VALUES_SHOWN else ""
            parts.append(f"most common values: {shown}{more}")
        if stats.histogram_bounds:
            bounds = stats.histogram_bounds
            parts.append(f"range {_value(bounds[0])} … {_value(bounds[-1])}")
        lines.append(f"- {table.name}.{column}: " + "; ".join(parts))
    return lines


def _bullets(items: Sequence[str]) -> str:
    return "\n".join(f"- {item}" for item in items) or "(none)"


def context_fields(ctx: AnalysisContext, plan_budget_tokens: int = PLAN_TOKEN_BUDGET) -> dict[str, str]:
    """The placeholders of the analysis and proposal templates, from the agent's context."""
    tables = list(ctx.tables.values())
    plan, plan_note = trim_plan(ctx.plan, plan_budget_tokens)
    indexes = [f"- {t.name}: {ix.name}: {ix.definition} ({ix.size_mb:g} MB)"
               for t in tables for ix in t.indexes]
    sizes = [f"- {t.name}: {t.rows:,} rows, {t.size_mb:g} MB with indexes, "
             f"{t.writes_per_read:.2f} rows written per scan"
             + (f", referenced by foreign keys of {', '.join(t.referenced_by)}" if t.referenced_by else "")
             for t in tables]
    suite = [f"- {v.name}: {v.sql}" + (f"  ({v.note})" if v.note else "") for v in ctx.suite]
    return {
        "task_type": ctx.task_type,
        "query": ctx.query,
        "execution_ms": f"{ctx.execution_ms:.1f}",
        "explain_plan": plan,
        "plan_note": plan_note,
        "schema": "\n\n".join(t.ddl for t in tables if t.ddl) or "(unknown)",
        "indexes": "\n".join(indexes) or "(none)",
        "table_sizes": "\n".join(sizes) or "(unknown)",
        "column_stats": "\n".join(line for t in tables for line in _stats_lines(t))
                        or "(no statistics: the tables may never have been analysed)",
        "suite": "\n".join(suite) or "(only the query itself)",
    }


def analysis_prompt(agent: AgentKey, ctx: AnalysisContext,
                    plan_budget_tokens: int = PLAN_TOKEN_BUDGET) -> str:
    return prompt_template(f"analysis_{agent}").substitute(context_fields(ctx, plan_budget_tokens))


def proposal_prompt(agent: AgentKey, ctx: AnalysisContext, analysis: AnalysisResult,
                    plan_budget_tokens: int = PLAN_TOKEN_BUDGET) -> str:
    return prompt_template(f"proposal_{agent}").substitute(
        context_fields(ctx, plan_budget_tokens), insights=_bullets(analysis.insights),
        proposed_actions=_bullets(analysis.proposed_actions),
        allowed_sql=prompt_template("allowed_sql").template.strip())


def _analysis_json(analysis: AnalysisResult) -> str:
    """The analysis as the model's own turn of the conversation."""
    return json.dumps({"insights": list(analysis.insights),
                       "proposed_actions": list(analysis.proposed_actions),
                       "confidence": analysis.confidence, "metadata": dict(analysis.metadata)},
                      default=str)


# -- the brain ------------------------------------------------------------------------------------
class GeminiBrain:
    """Gemini models as the agents' brains; `usage[agent]` sums tokens and estimated cost."""

    name = "gemini"

    def __init__(self, client: GeminiClient, models: Mapping[AgentKey, str], *,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, policy: RetryPolicy = DEFAULT_RETRY,
                 plan_budget_tokens: int = PLAN_TOKEN_BUDGET) -> None:
        self.client = client
        self.models = dict(models)
        self.call_timeout_s = call_timeout_s
        self.policy = policy
        self.plan_budget_tokens = plan_budget_tokens
        self.usage: dict[AgentKey, dict[str, Any]] = {}

    def model_of(self, agent: AgentKey) -> str:
        return self.models.get(agent) or AGENTS[agent].model

    async def analyze(self, agent: AgentKey, ctx: AnalysisContext) -> AnalysisResult:
        turns: list[Turn] = [("user", analysis_prompt(agent, ctx, self.plan_budget_tokens))]
        return await self._ask(agent, "analyze", turns, ANALYSIS_SCHEMA, parse_analysis)

    async def propose(self, agent: AgentKey, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> OptimizationProposal | None:
        turns: list[Turn] = [
            ("user", analysis_prompt(agent, ctx, self.plan_budget_tokens)),
            ("model", _analysis_json(analysis)),
            ("user", proposal_prompt(agent, ctx, analysis, self.plan_budget_tokens)),
        ]
        return await self._ask(agent, "propose", turns, PROPOSAL_SCHEMA,
                               functools.partial(parse_proposal, agent))

    async def _ask(self, agent: AgentKey, purpose: str, turns: list[Turn], schema: Mapping[str, Any],
                   parse: Callable[[str], tuple[T, list[str]]]) -> T:
        """One question; unusable answers go back with the reason, MAX_REPROMPTS times at most."""
        model = self.model_of(agent)
        system = prompt_template(f"system_{agent}").template
        for reprompts in range(MAX_REPROMPTS + 1):
            started = trio.current_time()
            reply = await self.client.generate_json(model=model, system=system, turns=turns,
                                                    schema=schema, call_timeout_s=self.call_timeout_s,
                                                    policy=self.policy)
            cost = self._record(agent, model, reply.usage, reply.attempts - 1, reprompts > 0)
            log.info("model_call", agent=agent, model=model, purpose=purpose, attempts=reply.attempts,
                     prompt_tokens=reply.usage.prompt_tokens, output_tokens=reply.usage.output_tokens,
                     total_tokens=reply.usage.total_tokens, estimated_cost_usd=cost,
                     duration_s=round(trio.current_time() - started, 3))
            try:
                value, warnings = parse(reply.text)
            except ModelOutputError as exc:
                log.warning("model_output_invalid", agent=agent, model=model, purpose=purpose,
                            reason=exc.reason, finish_reason=reply.finish_reason,
                            response=reply.text[:2000])
                if reprompts == MAX_REPROMPTS:
                    raise ModelOutputError(f"{model} ({purpose}): {exc.reason} "
                                           f"(still after {MAX_REPROMPTS} re-prompts)", reply.text) from None
                retry = prompt_template("reprompt").substitute(error=exc.reason)
                turns = [*turns, ("model", reply.text), ("user", retry)]
                continue
            for warning in warnings:
                log.warning("model_output_repaired", agent=agent, model=model, purpose=purpose,
                            warning=warning)
            return value
        raise AssertionError("unreachable: the last round returns or raises")  # pragma: no cover

    def _record(self, agent: AgentKey, model: str, usage: Usage, retries: int,
                reprompt: bool) -> float | None:
        """Add one answered call to `usage[agent]`; returns its estimated cost."""
        entry = self.usage.setdefault(agent, {
            "model": model, "prompt_tokens": 0, "output_tokens": 0, "total_tokens": 0,
            "estimated_cost_usd": 0.0, "calls": 0, "retries": 0, "reprompts": 0})
        entry["prompt_tokens"] += usage.prompt_tokens
        entry["output_tokens"] += usage.output_tokens
        entry["total_tokens"] += usage.total_tokens
        entry["calls"] += 1
        entry["retries"] += retries
        entry["reprompts"] += int(reprompt)
        cost = estimate_cost(model, usage)
        if cost is None or entry["estimated_cost_usd"] is None:
            entry["estimated_cost_usd"] = None  # a model without a known price
        else:
            entry["estimated_cost_usd"] = round(entry["estimated_cost_usd"] + cost, 6)
        return None if cost is None else round(cost, 6)


@asynccontextmanager
async def open_gemini_squad(settings: Settings, credentials: Credentials, env: Mapping[str, str], *,
                            transport: httpx.AsyncBaseTransport | None = None,
                            google_auth: Any = None) -> AsyncIterator[Squad]:
    """The squad of Gemini brains for one command; its HTTP client closes on exit.

    `squad.usage` is `brain.usage`: per agent, tokens and estimated cost.
    """
    async with open_gemini_client(credentials, transport=transport, google_auth=google_auth) as client:
        models = gemini_models(env)
        brain = GeminiBrain(client, models,
                            call_timeout_s=min(DEFAULT_CALL_TIMEOUT_S, settings.timeouts.model / 2))
        note = (f"Gemini models via {credentials.describe()}: "
                + ", ".join(f"{agent} = {model}" for agent, model in models.items()))
        yield Squad(brain_for=lambda _agent: brain, provider="gemini", note=note,
                    usage=brain.usage)
