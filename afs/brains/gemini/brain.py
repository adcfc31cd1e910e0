"""`GeminiBrain`: an agent's brain made of a Gemini model (the `Brain` protocol of afs.brains).

    analyze: system prompt of the specialisation + analysis template filled with the
             context (query, trimmed EXPLAIN, DDL, indexes, sizes, pg_stats, suite)
             ─► generate_json (ANALYSIS_SCHEMA) ─► parse_analysis
    propose: the same conversation + the analysis + the proposal template (its
             specialisation, then the shared blocks: how to answer with ranked
             candidates, the query rewrites, the safety rules)
             ─► generate_json (PROPOSAL_SCHEMA) ─► parse_proposals: up to
             MAX_CANDIDATES designs, best first

Unusable output is sent back with the reason, at most `MAX_REPROMPTS` times; then
the agent fails with a `ModelOutputError`. For proposals that is an answer without
a single usable candidate: malformed candidates among good ones are dropped with a
warning. The candidates then go through the same safety check, screening and
benchmark as a strategist's: the model's estimate is never a measurement. Token usage
and estimated cost are kept per agent in `brain.usage`. The prompts are files in
`afs/brains/gemini/prompts/` (string.Template: `$query`, …); `allowed_sql`,
`candidates` and `rewrites` are the blocks every proposal prompt shares.
"""

from __future__ import annotations

import decimal
import functools
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from string import Template
from typing import Any, Final, TypeVar

import httpx
import structlog
import trio

from afs.brains import Squad
from afs.brains.gemini.client import (
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
from afs.brains.gemini.parsing import (
    ANALYSIS_SCHEMA,
    MAX_CANDIDATES,
    PROPOSAL_SCHEMA,
    parse_analysis,
    parse_proposals,
)
from afs.config import Settings
from afs.errors import ModelOutputError
from afs.models import AGENTS, AgentKey, AnalysisContext, AnalysisResult, OptimizationProposal, TableInfo
from afs.pg.plan import PLAN_TOKEN_BUDGET, trim_plan

log = structlog.get_logger("afs.gemini")

MAX_REPROMPTS: Final = 2  # the seed's "Re-prompt … Limit: 2 retry attempts"
DEFAULT_CALL_TIMEOUT_S: Final = 60.0  # one HTTP attempt; the model phase limit bounds them all
MAX_VALUES_SHOWN: Final = 10  # most common values per column
MAX_VALUE_CHARS: Final = 40

T = TypeVar("T")


# -- prompts -----------------------------------------------------------------------------------
@functools.cache
def prompt_template(name: str) -> Template:
    """A prompt file of afs/brains/gemini/prompts (`system_<agent>`, `analysis_<agent>`, …)."""
    prompts = resources.files("afs.brains.gemini").joinpath("prompts")
    return Template(prompts.joinpath(f"{name}.md").read_text("utf-8"))


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


def _sql_literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _keyset_note(ctx: AnalysisContext) -> str:
    """The last key before the page, for a keyset rewrite of an OFFSET page (else nothing)."""
    if ctx.keyset_last_key is None:
        return ""
    key = ", ".join(_sql_literal(v) for v in ctx.keyset_last_key)
    return f"\n  For this query, the ORDER BY key of the row just before the page is ({key})."


def proposal_prompt(agent: AgentKey, ctx: AnalysisContext, analysis: AnalysisResult,
                    plan_budget_tokens: int = PLAN_TOKEN_BUDGET) -> str:
    """The specialisation's proposal template, with the blocks every agent shares: ranked
    candidates and how they are judged, the query rewrites, the safety rules."""
    return prompt_template(f"proposal_{agent}").substitute(
        context_fields(ctx, plan_budget_tokens), insights=_bullets(analysis.insights),
        proposed_actions=_bullets(analysis.proposed_actions),
        candidates=prompt_template("candidates").substitute(max_candidates=MAX_CANDIDATES).strip(),
        rewrites=prompt_template("rewrites").substitute(keyset=_keyset_note(ctx)).strip(),
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
                      analysis: AnalysisResult) -> tuple[OptimizationProposal, ...]:
        turns: list[Turn] = [
            ("user", analysis_prompt(agent, ctx, self.plan_budget_tokens)),
            ("model", _analysis_json(analysis)),
            ("user", proposal_prompt(agent, ctx, analysis, self.plan_budget_tokens)),
        ]
        return await self._ask(agent, "propose", turns, PROPOSAL_SCHEMA,
                               functools.partial(parse_proposals, agent))

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
