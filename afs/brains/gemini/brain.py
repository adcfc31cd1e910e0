"""`GeminiBrain`: an agent's brain made of a Gemini model (the `Brain` protocol of afs.brains).

    analyze: system prompt of the specialisation (+ the data rule) + analysis template
             filled with the context (query, the plan as one line per node, server
             settings, tables, indexes, sizes, pg_stats, suite; every value from the
             database a labelled JSON `data` block)
             ─► generate_json (ANALYSIS_SCHEMA) ─► parse_analysis
    propose: the same conversation + the analysis + the proposal template (its
             specialisation, then the shared blocks: how to answer with ranked
             candidates, the query rewrites, the safety rules)
             ─► generate_json (proposal_schema) ─► parse_proposals: up to
             settings.candidates designs, best first ─► refusals (afs.safety)
    revise_rewrite: the same conversation + its rewrite + why the result check failed
             it in the fork (afs.agents asks, once per agent)
    refine:  the agent's loop (afs.agents) as the same conversation going on: the proposal's
             turns as the model saw them, then per step the measured result of the design
             in place (the plan with it, in the compact form above; the times of every step;
             the costliest node; its indexes the planner did not use; refusals, apply errors
             and steps not kept) ─► generate_json (one candidate) ─► parse_proposals: the
             whole next design, or none to stop; within the agent's model budget

Everything that came from the database or from a model (the model's own insights and
actions, its refused statements, the parser's complaint quoting its text, the result
check's reason) goes into the prompt as a `data` block, never as prompt text: a second
answer cannot be steered by text the first one planted. The proposal prompt names the
PostgreSQL version of the source server (where a fix is applied) and of the server the
plans were measured on; a candidate whose SQL the source server cannot run (afs.brains.gemini.
syntax, from the parse tree) is refused with the reason like an unsafe one, and one still
kept after the re-prompts says so first in its rationale.

Unusable output is sent back with the reason, and so are candidates the safety check
refuses (all of them: one acceptable candidate is enough), at most `MAX_REPROMPTS` times
in all; then unusable output fails the agent with a `ModelOutputError`, and refused
candidates are returned for the agent to report as refused. Malformed candidates among
good ones are dropped with a warning. The candidates then go through the same safety
check, screening and benchmark as a strategist's: the model's estimate is never a
measurement. Tokens (thinking included), attempts and estimated cost are kept per agent
in `brain.usage`, with the model version and stage the API said answered; `brain.calls`
holds one record per call (agent, purpose, configured model, the version that answered,
its stage and retirement time, tokens, estimated cost, outcome). A spending cap
(`gemini.max_spend_usd`, per squad, or one shared by a batch) is checked before every attempt,
and the agent's model budget (`gemini.budget`: turns, tokens, seconds) before every call; what
stopped an agent's calls is in its usage (`stopped`) for the report. With `gemini.stream`
answers are streamed: the model's `call_timeout_s` bounds the wait for the first chunk and
`STREAM_STALL_S` each wait for the next, inside the question's budget (the model phase). `check_models`,
before any fork, refuses a thinking level the model does not accept and warns of a model
in preview, deprecated, past or near its shutdown date, or without an entry in the
settings table (timeout, output cap and price then fall back to defaults). The prompts
are files in `afs/brains/gemini/prompts/` (string.Template: `$query`, …); `allowed_sql`,
`candidates` and `rewrites` are the blocks every proposal prompt shares; `data_rule` ends
every system prompt.
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Any, Final, Generic, TypeVar

import httpx
import structlog
import trio

from afs.brains import Squad, StepSeen
from afs.brains.gemini.client import (
    SPEND_CAP,
    CallStats,
    Credentials,
    GeminiClient,
    ModelRequest,
    SpendMeter,
    Turn,
    open_gemini_client,
    today,
)
from afs.brains.gemini.parsing import (
    ANALYSIS_SCHEMA,
    MAX_CANDIDATES,
    parse_analysis,
    parse_proposals,
    parse_review,
    proposal_schema,
    review_schema,
)
from afs.brains.gemini.syntax import major_of, too_new
from afs.brains.gemini.withheld import Withheld, withhold
from afs.config import (
    ASKING,
    DEFAULT_GEMINI_MODELS,
    GEMINI_DEFAULTS_CHOSEN,
    PLAN_TOKEN_BUDGET,
    Asking,
    GeminiSettings,
    ModelSettings,
    Settings,
)
from afs.errors import ConfigError, ModelError, ModelOutputError, UnsafeSqlError
from afs.models import (
    AGENTS,
    AgentKey,
    AgentOutcome,
    AnalysisContext,
    AnalysisResult,
    LoopStep,
    ModelUsage,
    OptimizationProposal,
    ReviewFlag,
    TableInfo,
)
from afs.pg.bottleneck import Bottleneck
from afs.pg.plan import plan_text
from afs.safety import check_query, creates, settings_sql, validate_candidate

log = structlog.get_logger("afs.gemini")

REVIEWER: Final = "gemini25pro"  # the seed gives gemini-2.5-pro's agent the review role
MAX_REPROMPTS: Final = 2  # the seed's "Re-prompt … Limit: 2 retry attempts" (repairs and refusals)
PHASE_MARGIN_S: Final = 1.0  # a question ends this much before the agent's model-phase limit
MODEL_BUDGET: Final = "MODEL_BUDGET"  # ModelError.code of a call the agent's model budget stopped
STREAM_STALL_S: Final = 30.0  # with gemini.stream: the longest wait for the next chunk
MAX_VALUES_SHOWN: Final = 10  # most common values per column
MAX_VALUE_CHARS: Final = 40

T = TypeVar("T")


# -- prompts -----------------------------------------------------------------------------------
@functools.cache
def prompt_template(name: str) -> Template:
    """A prompt file of afs/brains/gemini/prompts (`system_<agent>`, `analysis_<agent>`, …)."""
    prompts = resources.files("afs.brains.gemini").joinpath("prompts")
    return Template(prompts.joinpath(f"{name}.md").read_text("utf-8"))


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str).replace("</", "<\\/")


def data(label: str, value: object) -> str:
    """A value from the user's database, as data: JSON inside labelled delimiters.

    `label` is AFS's own word for what it is (never text from the database). Every "</" of the
    JSON is written "<\\/" (the same string to a JSON reader), so no value can close the block
    early; the system prompt says text inside a block is never an instruction.
    """
    encoded = _json(value)
    return f'<data label="{label}">{encoded}</data>'


def data_lines(label: str, lines: Sequence[str]) -> str:
    """Several lines (a plan, a definition) as one data block: a JSON list, one string a line."""
    encoded = ",\n".join(_json(line) for line in lines)
    return f'<data label="{label}">[\n{encoded}\n]</data>'


def _value(value: str) -> str:
    return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "…"


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
        if stats.most_common_freqs and not stats.most_common_vals:  # values withheld
            share = sum(stats.most_common_freqs)
            parts.append(f"{len(stats.most_common_freqs)} most common values (withheld) cover {share:.1%} "
                         f"of the rows, the commonest {max(stats.most_common_freqs):.1%}")
        if stats.most_common_vals:
            pairs = list(zip(stats.most_common_vals, stats.most_common_freqs, strict=False))
            shown = [[_value(v), f"{f:.1%}"] for v, f in pairs[:MAX_VALUES_SHOWN]]
            more = f" ({len(pairs)} in all)" if len(pairs) > MAX_VALUES_SHOWN else ""
            parts.append(f"most common values and their share: {data('values', shown)}{more}")
        if stats.histogram_bounds:
            bounds = stats.histogram_bounds
            parts.append(f"range {data('values', [_value(bounds[0]), _value(bounds[-1])])}")
        lines.append(f"- {data('column', f'{table.name}.{column}')}: " + "; ".join(parts))
    return lines


def _definition(table: TableInfo) -> dict[str, object]:
    """What the table is, each fact once (its indexes and sizes have their own sections)."""
    definition: dict[str, object] = {
        "table": table.name,
        "columns": [f"{c.name} {c.data_type}{'' if c.nullable else ' NOT NULL'}" for c in table.columns]}
    if table.primary_key:
        definition["primary_key"] = list(table.primary_key)
    if table.constraints:
        definition["foreign_keys_and_checks"] = list(table.constraints)
    if table.partitioning:
        definition["partitioning"] = table.partitioning
    if table.referenced_by:
        definition["referenced_by_foreign_keys_of"] = list(table.referenced_by)
    return definition


def pg_version(server: Mapping[str, str]) -> str:
    """"PostgreSQL 15.4" from a server_version such as "15.4 (Debian 15.4-1)": its number only
    (it is written outside a data block)."""
    number = re.match(r"\d+(?:\.\d+)*", server.get("server_version", ""))
    return f"PostgreSQL {number.group()}" if number else "an unknown PostgreSQL version"


def server_text(ctx: AnalysisContext) -> str:
    """The source server (the one the advice is for; an import's is often older) and the
    server the plans were measured on, with its planner settings."""
    measured = data("server", dict(ctx.server)) if ctx.server else "(unknown)"
    if not ctx.source_server:
        return measured
    line = (f"source server: {pg_version(ctx.source_server)}"
            f"{' (imported)' if ctx.source_imported else ''}; "
            f"plans measured on {pg_version(ctx.server)}")
    settings = {k: v for k, v in ctx.source_server.items() if k != "server_version"}
    if settings and any(ctx.server.get(k) != v for k, v in settings.items()):
        line += "\nthe source server's planner settings: " + data("source server", settings)
    return f"{line}\n{measured}"


def pg_syntax(ctx: AnalysisContext) -> str:
    """Which PostgreSQL the proposals must run on: the source server's version (a fix is
    applied there), and the one the plans were measured on when it differs."""
    measured = pg_version(ctx.server)
    if not ctx.source_server:
        return f"{measured} (the fixes are applied on this server; the plans were measured on it)"
    source = pg_version(ctx.source_server)
    if source == measured:
        return f"{source}, the source server's version (the fixes are applied there)"
    return (f"{source}, the source server's version (the fixes are applied there; the plans were "
            f"measured on {measured}): use no syntax, function or option newer than {source}")


def context_fields(ctx: AnalysisContext, plan_budget_tokens: int = PLAN_TOKEN_BUDGET,
                   withheld: Withheld | None = None) -> dict[str, str]:
    """The placeholders of the analysis and proposal templates, from the agent's context.

    Everything read from the user's database (the query, names, definitions, values, the plan
    with its conditions) is a `data` block. With `withheld` (the context is `withhold`'s copy)
    the query says which placeholders stand for withheld values.
    """
    tables = list(ctx.tables.values())
    plan, plan_note = plan_text(ctx.plan, plan_budget_tokens)
    indexes = [f"- {data('index', ix.definition)} ({ix.size_mb:g} MB)" for t in tables for ix in t.indexes]
    sizes = [f"- {data('table', t.name)}: {t.rows:,} rows, {t.size_mb:g} MB with indexes, "
             f"{t.writes_per_read:.2f} rows written per scan" for t in tables]
    suite = [f"- {v.name}: {data('query', v.sql)}" + (f" {data('note', v.note)}" if v.note else "")
             for v in ctx.suite]
    return {
        "task_type": ctx.task_type,
        "query": data("query", ctx.query) + (
            f"\n(The literal values are withheld: {withheld.legend()}. Write them as these "
            f"placeholders in any SQL you propose; AFS puts the values back.)"
            if withheld is not None and withheld.values else ""),
        "execution_ms": f"{ctx.execution_ms:.1f}" + (" (at least: it ran past the statement timeout)"
                                                    if ctx.slow else ""),
        "explain_plan": data_lines("plan", plan),
        "plan_note": plan_note,
        "server": server_text(ctx),
        "schema": "\n".join(data("table definition", _definition(t)) for t in tables) or "(unknown)",
        "indexes": "\n".join(indexes) or "(none)",
        "table_sizes": "\n".join(sizes) or "(unknown)",
        "column_stats": "\n".join(line for t in tables for line in _stats_lines(t))
                        or "(no statistics: the tables may never have been analysed)",
        "suite": "\n".join(suite) or "(only the query itself)",
    }


def analysis_prompt(agent: AgentKey, ctx: AnalysisContext,
                    plan_budget_tokens: int = PLAN_TOKEN_BUDGET, withheld: Withheld | None = None) -> str:
    return prompt_template(f"analysis_{agent}").substitute(context_fields(ctx, plan_budget_tokens, withheld))


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
    shown = data("values", f"({key})")
    return f"\n  For this query, the ORDER BY key of the row just before the page is {shown}."


def proposal_prompt(agent: AgentKey, ctx: AnalysisContext, analysis: AnalysisResult,
                    plan_budget_tokens: int = PLAN_TOKEN_BUDGET, max_candidates: int = MAX_CANDIDATES,
                    withheld: Withheld | None = None) -> str:
    """The specialisation's proposal template, with the blocks every agent shares: ranked
    candidates and how they are judged, the query rewrites, the safety rules."""
    return prompt_template(f"proposal_{agent}").substitute(
        context_fields(ctx, plan_budget_tokens, withheld), pg_syntax=pg_syntax(ctx),
        insights=data_lines("insights", analysis.insights) if analysis.insights else "(none)",
        proposed_actions=(data_lines("proposed actions", analysis.proposed_actions)
                          if analysis.proposed_actions else "(none)"),
        candidates=prompt_template("candidates").substitute(max_candidates=max_candidates).strip(),
        rewrites=prompt_template("rewrites").substitute(keyset=_keyset_note(ctx)).strip(),
        allowed_sql=prompt_template("allowed_sql").template.strip())


def candidate_json(proposal: OptimizationProposal) -> dict[str, Any]:
    """A proposal as a candidate object of the proposal schema (the model's own turn)."""
    out: dict[str, Any] = {
        "proposal_type": proposal.proposal_type, "rationale": proposal.rationale,
        "sql_commands": list(proposal.sql_commands), "rollback_commands": list(proposal.rollback_commands),
        "estimated_impact": dataclasses.asdict(proposal.estimated_impact)}
    if proposal.rewritten_query is not None:
        out["rewritten_query"] = proposal.rewritten_query
    if proposal.settings:
        out["settings"] = dict(proposal.settings)
    if proposal.needs_application_change:
        out["needs_application_change"] = True
    return out


def _measured(outcome: AgentOutcome, withheld: Withheld | None = None) -> dict[str, Any]:
    """One agent's best proposal and what was measured of it, for the reviewer."""
    proposal, bench = outcome.proposal, outcome.benchmark
    assert bench is not None
    out: dict[str, Any] = {"status": outcome.status}
    if proposal is not None:
        shown = proposal if withheld is None else withheld.withhold_proposal(proposal)
        out["proposal"] = candidate_json(shown)
    out["measured"] = {
        "average_improvement_pct": round(bench.average_improvement_pct, 1),
        "same_rows": bench.equivalent,
        "storage_added_mb": round(bench.storage_delta_mb, 2),
        "apply_s": round(bench.apply_s, 2),
        "suite": {m.name: {"baseline_ms": round(m.baseline.median_ms, 3),
                           "optimized_ms": round(m.optimized.median_ms, 3), "rows": m.rows,
                           "significant": m.significant} for m in bench.measurements},
        "other_parameter_values": [{"values": "(withheld)" if withheld is not None else c.label,
                                    "same_rows": c.equivalent, "slower": c.slower}
                                   for c in bench.parameter_checks],
    }
    if outcome.writes_per_read:
        out["rows_written_per_scan"] = dict(outcome.writes_per_read)
    if outcome.error:
        out["note"] = outcome.error if withheld is None else withheld.mask(outcome.error)
    return out


def review_prompt(query: str, outcomes: Sequence[AgentOutcome], send_values: bool = True) -> str:
    withheld = None if send_values else Withheld(query)
    shown = query if withheld is None else withheld.withhold(query)
    proposals = "\n".join(f"- agent {o.agent}: {data('measured proposal', _measured(o, withheld))}"
                          for o in outcomes)
    return prompt_template("review").substitute(query=data("query", shown), proposals=proposals)


def _index_names(plan: Any) -> set[str]:
    """The names of the indexes a plan uses (its "Index Name"s, unqualified)."""
    names: set[str] = set()
    if isinstance(plan, Mapping):
        if isinstance(plan.get("Index Name"), str):
            names.add(plan["Index Name"].rpartition(".")[2])
        for value in plan.values():
            names |= _index_names(value)
    elif isinstance(plan, list):
        for value in plan:
            names |= _index_names(value)
    return names


def unused_indexes(proposal: OptimizationProposal, plan: Mapping[str, Any]) -> list[str]:
    """The CREATE INDEX statements of `proposal` whose index the plan does not use."""
    used = _index_names(plan)
    return [ix.statement for ix in creates(proposal).indexes
            if ix.name is not None and ix.name.rpartition(".")[2] not in used]


def _step_line(step: LoopStep) -> dict[str, Any]:
    """One step of the loop as the refine prompt shows it (data)."""
    design = [*step.proposal.sql_commands, *settings_sql(tuple(step.proposal.settings))]
    if step.proposal.rewritten_query:
        design.append(f"rewrite: {step.proposal.rewritten_query}")
    return {"step": step.step, "design": design, "motivated_by": step.motivated_by,
            "median_ms": None if step.median_ms is None else round(step.median_ms, 3),
            "kept": step.kept, "note": step.note}


@dataclass(frozen=True)
class Measured:
    """What the agent's loop measured of the design in place, for its next turn (refine): the
    design (`current`, step `step`), the query's plan with it in place, its costliest node, and
    every step so far."""

    current: OptimizationProposal
    after_plan: Mapping[str, Any]
    bottleneck: Bottleneck | None
    steps: Sequence[LoopStep]
    step: int


def refine_prompt(ctx: AnalysisContext, measured: Measured, plan_budget_tokens: int = PLAN_TOKEN_BUDGET,
                  withheld: Withheld | None = None) -> str:
    """The loop's next user turn: what the design in place measured, as data."""
    def hide(text: str) -> str:
        return text if withheld is None else withheld.mask(text)

    current, after_plan, bottleneck = measured.current, measured.after_plan, measured.bottleneck
    steps, step = measured.steps, measured.step
    shown = current if withheld is None else withheld.withhold_proposal(current)
    plan, note = plan_text(after_plan, plan_budget_tokens)
    timed = [{"step": s.step, "median_ms": round(s.median_ms, 3), "kept": s.kept}
             for s in steps if s.median_ms is not None]
    times = data("times", {"original_query_ms": round(ctx.execution_ms, 3),
                           "original_is_a_lower_bound": ctx.slow, "steps": timed})
    notes = [hide(json.dumps(_step_line(s), ensure_ascii=False, default=str))
             for s in steps if s.note or not s.kept]
    ignored = unused_indexes(current, after_plan)
    return prompt_template("refine").substitute(
        step=step, current=data("design in place", candidate_json(shown)), times=times,
        plan_kind=("EXPLAIN ANALYZE, measured" if _analysed(after_plan)
                   else "estimated: EXPLAIN without running it"),
        plan_note=note, after_plan=data_lines("plan", [hide(line) for line in plan]),
        bottleneck=data("bottleneck", hide(bottleneck.detail)) if bottleneck is not None else "(none found)",
        ignored=data_lines("unused indexes", [hide(s) for s in ignored]) if ignored else "(none)",
        notes=data_lines("earlier steps", notes) if notes else "(none)",
        pg_syntax=pg_syntax(ctx))


def _analysed(plan: Any) -> bool:
    """Whether the plan was run (EXPLAIN ANALYZE: actual times) rather than estimated."""
    if isinstance(plan, Mapping):
        if "Actual Total Time" in plan or "Actual Rows" in plan:
            return True
        return any(_analysed(v) for v in plan.values() if isinstance(v, Mapping | list))
    if isinstance(plan, list):
        return any(_analysed(v) for v in plan)
    return False


def _analysis_json(analysis: AnalysisResult) -> str:
    """The analysis as the model's own turn of the conversation."""
    return json.dumps({"insights": list(analysis.insights),
                       "proposed_actions": list(analysis.proposed_actions),
                       "confidence": analysis.confidence, "metadata": dict(analysis.metadata)},
                      default=str)


# -- the brain ------------------------------------------------------------------------------------
def refusal(proposal: OptimizationProposal) -> str | None:
    """Why the safety check refuses `proposal` (the agent's own check, afs.safety), or None."""
    validation = validate_candidate(proposal)
    if not validation.is_valid:
        return "; ".join(f"{r.reason}" + (f" ({_short(r.statement)})" if r.statement else "")
                         for r in validation.rejected)
    if proposal.rewritten_query is not None:
        try:
            check_query(proposal.rewritten_query)
        except UnsafeSqlError as exc:
            return f"the rewritten query is refused: {exc.reason}"
    return None


def _short(sql: str, limit: int = 160) -> str:
    sql = " ".join(sql.split())
    return sql if len(sql) <= limit else sql[:limit] + "…"


def refusals(proposals: Sequence[OptimizationProposal], source: str | None = None) -> str | None:
    """The reasons to send back when every candidate is refused; None when one can be measured
    (the refused ones are reported as such) or there is none. With `source` (the source
    server's version), a candidate whose SQL that server cannot run is refused too."""
    reasons = []
    for number, proposal in enumerate(proposals, 1):
        reason = refusal(proposal) or (None if source is None else newer_than(proposal, source))
        if reason is None:
            return None
        reasons.append(f"- candidate {number} ({proposal.proposal_type}): {reason}")
    return "\n".join(reasons) or None


def _statements(proposal: OptimizationProposal) -> list[str]:
    return [*proposal.sql_commands, *([proposal.rewritten_query] if proposal.rewritten_query else [])]


def newer_than(proposal: OptimizationProposal, source: str) -> str | None:
    """Why the source server (version `source`) cannot run `proposal`, or None."""
    major = major_of(source)
    needs = too_new(_statements(proposal), major) if major is not None else []
    if not needs:
        return None
    return f"the source server runs PostgreSQL {source}, which has no {', '.join(needs)}"


def source_version(ctx: AnalysisContext) -> str | None:
    """The version of the server a fix is applied on: the source's, else the measuring one's."""
    server = ctx.source_server or ctx.server
    number = re.match(r"\d+(?:\.\d+)*", server.get("server_version", ""))
    return number.group() if number else None


def flag_new_syntax(proposals: Sequence[OptimizationProposal],
                    source: str | None) -> tuple[OptimizationProposal, ...]:
    """The candidates, a too-new one's rationale saying so first (it is measured in the fork,
    whose server may be newer, but it cannot be applied as it is)."""
    if source is None:
        return tuple(proposals)
    flagged = []
    for proposal in proposals:
        reason = newer_than(proposal, source)
        flagged.append(proposal if reason is None else dataclasses.replace(
            proposal, rationale=f"Cannot be applied as it is: {reason}. {proposal.rationale}"))
    return tuple(flagged)


@dataclass(frozen=True)
class Question(Generic[T]):
    """What one question of `GeminiBrain._ask` expects back: its purpose (the call records'),
    the JSON schema of the answer, the parser of its text, the judge of a parsed answer (why it
    is refused, or None), and what masks withheld values in the reasons sent back."""

    purpose: str
    schema: Mapping[str, Any]
    parse: Callable[[str], tuple[T, list[str]]]
    judge: Callable[[T], str | None] | None = None
    hide: Callable[[str], str] | None = None


@dataclass(frozen=True)
class Call:
    """Who asks and which model answers, for the usage and the call records: the agent, the
    question's purpose, the model configured for the agent and its settings."""

    agent: AgentKey
    purpose: str
    model: str
    settings: ModelSettings


class GeminiBrain:
    """Gemini models as the agents' brains; `usage[agent]` sums tokens and estimated cost.

    The model of each agent and its generation settings come from `GeminiSettings` (afs.config).
    Each call's timeout is the model's `call_timeout_s`, within the model phase
    (`asking.model_phase_s`); `asking.call_timeout_s` overrides it (tests).
    """

    name = "gemini"

    def __init__(self, client: GeminiClient, gemini: GeminiSettings | None = None,
                 asking: Asking | None = None, meter: SpendMeter | None = None) -> None:
        asking = asking if asking is not None else ASKING
        self.client = client
        self.max_candidates = asking.max_candidates
        self.gemini = gemini or GeminiSettings()
        self.model_phase_s = asking.model_phase_s
        self.call_timeout_s = asking.call_timeout_s
        self.policy = asking.policy
        self.plan_budget_tokens = asking.plan_budget_tokens
        self.usage: dict[AgentKey, dict[str, Any]] = {}
        # each agent's conversation as the model last saw it (its last answer included): the
        # proposal's, then the loop's turns (refine)
        self.conversations: dict[AgentKey, list[Turn]] = {}
        self.calls: list[dict[str, Any]] = []  # one record per call, answered or not
        # the cap's count: this squad's own, or one shared by several (a batch, a schedule)
        self.meter = meter if meter is not None else SpendMeter(self.gemini.max_spend_usd)

    def model_of(self, agent: AgentKey) -> str:
        return self.gemini.model_of(agent)

    def usage_of(self, agent: AgentKey) -> ModelUsage | None:
        """`usage[agent]` as a typed record (a `MeteredBrain`); None before its first call."""
        entry = self.usage.get(agent)
        return ModelUsage(**entry) if entry is not None else None

    def shown(self, ctx: AnalysisContext) -> tuple[AnalysisContext, Withheld | None]:
        """The context as the model sees it: whole, or without its values (`send_values` off)."""
        if self.gemini.send_values:
            return ctx, None
        return withhold(ctx)

    async def analyze(self, agent: AgentKey, ctx: AnalysisContext) -> AnalysisResult:
        ctx, withheld = self.shown(ctx)
        turns: list[Turn] = [("user", analysis_prompt(agent, ctx, self.plan_budget_tokens, withheld))]
        return await self._ask(agent, Question("analyze", ANALYSIS_SCHEMA, parse_analysis), turns)

    async def propose(self, agent: AgentKey, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> tuple[OptimizationProposal, ...]:
        """The candidates, best first. When the safety check refuses every one of them, the
        reasons go back to the model (within the re-prompt bound); after that the refused
        candidates are returned as they are, and the agent reports them as refused."""
        ctx, withheld = self.shown(ctx)
        turns: list[Turn] = [
            ("user", analysis_prompt(agent, ctx, self.plan_budget_tokens, withheld)),
            ("model", _analysis_json(analysis)),
            ("user", proposal_prompt(agent, ctx, analysis, self.plan_budget_tokens, self.max_candidates,
                                     withheld)),
        ]
        parse = functools.partial(parse_proposals, agent, max_candidates=self.max_candidates)
        source = source_version(ctx)
        conversation: list[Turn] = []
        question = Question("propose", proposal_schema(self.max_candidates), _filled(parse, withheld),
                            judge=functools.partial(refusals, source=source),
                            hide=None if withheld is None else withheld.mask)
        proposals = await self._ask(agent, question, turns, transcript=conversation)
        if conversation:  # the loop (refine) goes on with this conversation
            self.conversations[agent] = conversation
        return flag_new_syntax(proposals, source)

    async def refine(self, agent: AgentKey, ctx: AnalysisContext, analysis: AnalysisResult,
                     seen: StepSeen) -> OptimizationProposal | None:
        """The loop's next design as the next turn of the agent's conversation (a
        `RefiningBrain`): the measured result of `current` (the plan with it in place in the
        compact form of the prompts, the times of every step, refusals, apply errors, the
        design's indexes the planner did not use, the costliest node) goes back to the model
        after the turns before it (the analysis, the proposal, the earlier steps), and its
        answer is parsed like a proposal (the agent validates and measures it). None when the
        model sees nothing more to remove, or when the agent's model budget, the spending cap
        or an unusable answer ends the conversation (said in the usage and the log)."""
        current, after_plan, bottleneck, steps = seen.current, seen.after_plan, seen.bottleneck, seen.steps
        shown, withheld = self.shown(ctx)
        hide = withheld.mask if withheld is not None else None
        turns = list(self.conversations.get(agent) or ())
        if not turns:  # no proposal of ours in this task: the conversation as it would have been
            said = current if withheld is None else withheld.withhold_proposal(current)
            turns = [
                ("user", analysis_prompt(agent, shown, self.plan_budget_tokens, withheld)),
                ("model", _analysis_json(analysis)),
                ("user", proposal_prompt(agent, shown, analysis, self.plan_budget_tokens,
                                         self.max_candidates, withheld)),
                ("model", json.dumps({"candidates": [candidate_json(said)]}))]
        step = max((s.step for s in steps if s.kept), default=len(steps) or 1)
        turns.append(("user", refine_prompt(shown, Measured(current, after_plan, bottleneck, steps, step),
                                            self.plan_budget_tokens, withheld)))
        source = source_version(shown)
        conversation: list[Turn] = []
        question = Question("refine", proposal_schema(1),
                            _filled(functools.partial(parse_proposals, agent, max_candidates=1), withheld),
                            judge=functools.partial(refusals, source=source), hide=hide)
        try:
            answer = await self._ask(agent, question, turns, transcript=conversation)
        except ModelError as exc:  # the conversation ends; the measured steps stand
            log.warning("model_refine_stopped", agent=agent, step=step + 1, error=str(exc), code=exc.code)
            return None
        self.conversations[agent] = conversation
        if not answer:
            return None
        extended = flag_new_syntax(answer, source)[0]
        if bottleneck is not None and bottleneck.detail not in extended.rationale:
            extended = dataclasses.replace(
                extended, rationale=f"Step {step + 1}, for {bottleneck.detail}: {extended.rationale}")
        return extended

    async def revise_rewrite(self, agent: AgentKey, ctx: AnalysisContext, analysis: AnalysisResult,
                             proposal: OptimizationProposal, reason: str) -> OptimizationProposal | None:
        """The model's correction of a rewrite that returned other rows in the fork (the
        `RevisingBrain` hook of afs.agents): the same conversation, its rewrite, the result
        check's reason. None when it gives up or gives no rewrite."""
        ctx, withheld = self.shown(ctx)
        said, why = (proposal, reason) if withheld is None else (withheld.withhold_proposal(proposal),
                                                                 withheld.mask(reason))
        turns: list[Turn] = [
            ("user", analysis_prompt(agent, ctx, self.plan_budget_tokens, withheld)),
            ("model", _analysis_json(analysis)),
            ("user", proposal_prompt(agent, ctx, analysis, self.plan_budget_tokens, self.max_candidates,
                                     withheld)),
            ("model", json.dumps({"candidates": [candidate_json(said)]})),
            ("user", prompt_template("revise").substitute(reason=data("result check", why))),
        ]
        source = source_version(ctx)
        question = Question("revise", proposal_schema(self.max_candidates),
                            _filled(functools.partial(parse_proposals, agent), withheld),
                            judge=functools.partial(refusals, source=source),
                            hide=None if withheld is None else withheld.mask)
        revised = flag_new_syntax(await self._ask(agent, question, turns), source)
        rewrite = next((p for p in revised if p.rewritten_query is not None), None)
        if rewrite is None:
            return None
        return dataclasses.replace(rewrite, rationale=f"Revised after the result check ({reason}): "
                                                      f"{rewrite.rationale}")

    async def review(self, reviewer: AgentKey, query: str,
                     outcomes: Sequence[AgentOutcome]) -> tuple[ReviewFlag, ...]:
        """The seed's review role: flags on the other agents' measured proposals (shown in the
        report next to the proposal; never a change to a measurement or a score)."""
        agents = [o.agent for o in outcomes]
        turns: list[Turn] = [("user", review_prompt(query, outcomes, self.gemini.send_values))]
        return await self._ask(reviewer, Question("review", review_schema(agents),
                                                  functools.partial(parse_review, reviewer, agents)), turns)

    async def _ask(self, agent: AgentKey, question: Question[T], turns: list[Turn],
                   transcript: list[Turn] | None = None) -> T:
        """One question; unusable answers (and, with the question's `judge`, refused ones) go
        back with the reason, MAX_REPROMPTS times at most in all.

        Each call has its model's own limit (`call_timeout_s`), and all of them the question's
        budget (the model phase, less a second so that this returns before the agent's limit
        fires): a re-prompt that the budget, a timeout or the spending cap cuts short returns
        the refused candidates already in hand (the agent reports them) instead of losing them.
        `transcript`, when given, receives the conversation as the model saw it, its last
        answer included (the loop's next turn goes on from there)."""
        purpose, parse, judge, hide = question.purpose, question.parse, question.judge, question.hide
        model = self.model_of(agent)
        settings = self.gemini.settings_of(model)
        call = Call(agent, purpose, model, settings)
        deadline = trio.current_time() + max(self.model_phase_s - PHASE_MARGIN_S, self.model_phase_s / 2)
        system = prompt_template(f"system_{agent}").template + "\n" + prompt_template("data_rule").template
        kept: list[T] = []  # the refused answer of the round before, to return if time runs out
        for reprompts in range(MAX_REPROMPTS + 1):
            spent = self.budget_spent(agent)
            if spent is not None:
                self._stopped(call, f"its model budget is spent: {spent}")
                if kept:
                    log.warning("model_reprompt_cut", agent=agent, model=model, purpose=purpose,
                                error=f"model budget spent: {spent}", kept="the refused candidates")
                    return kept[0]
                raise ModelError(f"{model} ({purpose}): the agent's model budget is spent: {spent}",
                                 code=MODEL_BUDGET)
            started = trio.current_time()
            left = deadline - started
            timeout = self.call_timeout_s or min(settings.call_timeout_s, max(left, 0.0))
            stats = CallStats()
            outcome = "answered"
            with trio.move_on_after(max(left, 0.0)) as budget:
                try:
                    request = ModelRequest(model, system, turns, question.schema, settings, timeout,
                                           STREAM_STALL_S if self.gemini.stream else None)
                    reply = await self.client.generate_json(request, policy=self.policy, stats=stats,
                                                            meter=self.meter)
                except ModelError as exc:
                    outcome = exc.code or ("error" if exc.status is None else str(exc.status))
                    if exc.code == SPEND_CAP:
                        self._stopped(call, f"the spending cap: {exc}")
                    if kept and (exc.retryable or exc.code == SPEND_CAP):
                        log.warning("model_reprompt_cut", agent=agent, model=model, purpose=purpose,
                                    error=str(exc), kept="the refused candidates")
                        return kept[0]
                    raise
                except BaseException:
                    outcome = "cancelled"
                    raise
                finally:
                    cost = self._record(call, stats, reprompts > 0, trio.current_time() - started)
                    self._call_record(call, stats, cost, outcome)
            if budget.cancelled_caught:
                if kept:
                    log.warning("model_reprompt_cut", agent=agent, model=model, purpose=purpose,
                                error="the model phase's time ran out", kept="the refused candidates")
                    return kept[0]
                raise ModelError(f"{model} ({purpose}): no usable answer within the model phase "
                                 f"({self.model_phase_s:g} s)", retryable=True)
            log.info("model_call", agent=agent, model=model, purpose=purpose, attempts=stats.attempts,
                     model_version=stats.model_version, model_stage=stats.model_stage,
                     prompt_tokens=stats.usage.prompt_tokens, output_tokens=stats.usage.output_tokens,
                     thinking_tokens=stats.usage.thinking_tokens, total_tokens=stats.usage.total_tokens,
                     estimated_cost_usd=cost, duration_s=round(trio.current_time() - started, 3))
            last = reprompts == MAX_REPROMPTS
            try:
                value, warnings = parse(reply.text)
            except ModelOutputError as exc:
                log.warning("model_output_invalid", agent=agent, model=model, purpose=purpose,
                            reason=exc.reason, finish_reason=reply.finish_reason,
                            response=reply.text[:2000])
                if last:
                    raise ModelOutputError(f"{model} ({purpose}): {exc.reason} "
                                           f"(still after {MAX_REPROMPTS} re-prompts)", reply.text) from None
                retry = prompt_template("reprompt").substitute(
                    error=data("parser", hide(exc.reason) if hide else exc.reason))
                turns = [*turns, ("model", reply.text), ("user", retry)]
                continue
            for warning in warnings:
                log.warning("model_output_repaired", agent=agent, model=model, purpose=purpose,
                            warning=warning)
            refused = judge(value) if judge is not None else None
            if refused is not None:
                log.warning("model_proposal_refused", agent=agent, model=model, reasons=refused,
                            reprompt=not last)
                if not last:
                    kept[:] = [value]
                    self.usage[agent]["refusals_reprompted"] += 1
                    retry = prompt_template("refused").substitute(reasons=data_lines(
                        "refusals", [hide(line) if hide else line for line in refused.splitlines()]))
                    turns = [*turns, ("model", reply.text), ("user", retry)]
                    continue
            if transcript is not None:
                transcript[:] = [*turns, ("model", reply.text)]
            return value
        raise AssertionError("unreachable: the last round returns or raises")  # pragma: no cover

    def budget_spent(self, agent: AgentKey) -> str | None:
        """Which part of the agent's model budget (`gemini.budget`: turns, tokens, seconds) is
        spent, said for the report; None while it may make another call."""
        entry = self.usage.get(agent)
        if entry is None:
            return None
        return self.gemini.budget.spent(entry["calls"], entry["total_tokens"], entry["seconds"])

    def _entry(self, call: Call) -> dict[str, Any]:
        """`usage[agent]`, made at the agent's first call (the fields of `ModelUsage`)."""
        return self.usage.setdefault(call.agent, {
            "model": call.model, "model_version": None, "model_stage": call.settings.stage,
            "retirement": None, "prompt_tokens": 0, "output_tokens": 0, "thinking_tokens": 0,
            "cached_tokens": 0, "total_tokens": 0, "estimated_cost_usd": 0.0, "calls": 0, "attempts": 0,
            "retries": 0,
            "failed_attempts": 0, "timeouts": 0, "reprompts": 0, "refusals_reprompted": 0,
            "seconds": 0.0, "stopped": None})

    def _stopped(self, call: Call, why: str) -> None:
        """Record why the agent's model calls stop (the budget or the spending cap): the report
        states it."""
        entry = self._entry(call)
        if entry["stopped"] is None:
            entry["stopped"] = why
            log.warning("model_calls_stopped", agent=call.agent, model=call.model, reason=why)

    def _record(self, call: Call, stats: CallStats, reprompt: bool, seconds: float = 0.0) -> float | None:
        """Add one call (answered or not) to `usage[agent]`; returns its estimated cost."""
        entry = self._entry(call)
        entry["seconds"] = round(entry["seconds"] + max(seconds, 0.0), 3)
        if stats.model_version:
            entry["model_version"] = stats.model_version  # what answered, as the API says
        if stats.model_stage:
            entry["model_stage"] = stats.model_stage
        if stats.retirement:
            entry["retirement"] = stats.retirement
        usage = stats.usage
        entry["prompt_tokens"] += usage.prompt_tokens
        entry["output_tokens"] += usage.output_tokens
        entry["thinking_tokens"] += usage.thinking_tokens
        entry["cached_tokens"] += usage.cached_tokens
        entry["total_tokens"] += usage.total_tokens
        entry["calls"] += int(stats.attempts > 0)  # a call the cap or the budget stopped sent nothing
        entry["attempts"] += stats.attempts
        entry["retries"] += max(0, stats.attempts - 1)
        entry["failed_attempts"] += stats.failed
        entry["timeouts"] += stats.timeouts
        entry["reprompts"] += int(reprompt)
        cost = stats.cost_usd
        if cost is None or entry["estimated_cost_usd"] is None:
            entry["estimated_cost_usd"] = None  # a model without a known price
        else:
            entry["estimated_cost_usd"] = round(entry["estimated_cost_usd"] + cost, 6)
        return None if cost is None else round(cost, 6)

    def _call_record(self, call: Call, stats: CallStats, cost: float | None, outcome: str) -> None:
        """One call in `calls`: who asked, which model was configured and which answered."""
        agent, model, purpose, settings = call.agent, call.model, call.purpose, call.settings
        answered = stats.model_version
        rerouted = bool(answered) and not _same_model(model, answered or "")
        if rerouted:
            log.warning("model_rerouted", agent=agent, model=model, model_version=answered,
                        note="the API answered with another model (billed at its rate)")
        self.calls.append({
            "agent": agent, "purpose": purpose, "model": model, "model_version": answered,
            "rerouted": rerouted, "model_stage": stats.model_stage or settings.stage,
            "retirement": stats.retirement or settings.shutdown, "status_message": stats.status_message,
            "attempts": stats.attempts, "prompt_tokens": stats.usage.prompt_tokens,
            "cached_tokens": stats.usage.cached_tokens, "output_tokens": stats.usage.output_tokens,
            "thinking_tokens": stats.usage.thinking_tokens, "estimated_cost_usd": cost,
            "priced_on": today(), "outcome": outcome})

    @property
    def spent_usd(self) -> float:
        """The estimated spend of every call so far (the cap's count)."""
        return round(self.meter.spent_usd, 6)


def _filled(parse: Callable[[str], tuple[tuple[OptimizationProposal, ...], list[str]]],
            withheld: Withheld | None) -> Callable[[str], tuple[tuple[OptimizationProposal, ...], list[str]]]:
    """`parse`, then the withheld literals put back into the proposals' SQL."""
    if withheld is None:
        return parse

    def filled(text: str) -> tuple[tuple[OptimizationProposal, ...], list[str]]:
        proposals, warnings = parse(text)
        return tuple(withheld.fill_proposal(p) for p in proposals), warnings

    return filled


def _same_model(configured: str, version: str) -> bool:
    """Whether `version` (a response's modelVersion) is `configured` or one of its versions."""
    configured, version = configured.removeprefix("models/"), version.removeprefix("models/")
    return version == configured or version.startswith(configured + "-") or configured.startswith(version)


TYPICAL_PROMPT_TOKENS: Final = 12_000  # an analysis prompt of a few tables with their statistics


def spend_bound(gemini: GeminiSettings, agents: Sequence[AgentKey], day: str,
                prompt_tokens: int = TYPICAL_PROMPT_TOKENS, *, loop_steps: int = 0,
                revise: bool = False) -> float | None:
    """The most one task's model calls can cost, in USD at the list prices of `day`: every
    agent's analysis and proposal (and the reviewer's review; with `revise`, a rewrite's
    revision; with `loop_steps`, that many turns of its loop, each resending the conversation
    before it) with every re-prompt, each prompt `prompt_tokens` long plus the turns before
    it, each answer at its model's `max_output_tokens`; and per agent no more than its model
    budget lets through (`gemini.budget`: its most costly `turns` calls, and its `tokens` plus
    the one call that may cross them). A bound for `afs batch --dry-run`, not an estimate;
    None when a model has no price."""
    total = 0.0
    budget = gemini.budget
    rounds = MAX_REPROMPTS + 1
    for agent in agents:
        settings = gemini.settings_of(gemini.model_of(agent))
        price = settings.price_on(day)
        if price is None:
            return None
        answer = settings.max_output_tokens
        # each question: the turns before it (`before` tokens) and its prompt; round r also
        # resends the r answers and re-prompts before it
        questions = [0] * ((3 if agent == REVIEWER else 2) + int(revise))
        questions += [(k + 1) * (prompt_tokens + answer) for k in range(1, loop_steps + 1)]
        calls = [(before + prompt_tokens + r * (answer + 200), answer)
                 for before in questions for r in range(rounds)]
        costs = sorted(((sent * price.input_usd_per_mtok + answered * price.output_usd_per_mtok) / 1e6
                        for sent, answered in calls), reverse=True)
        by_turns = sum(costs[:budget.turns])
        largest = max(sent + answered for sent, answered in calls)
        by_tokens = (budget.tokens + largest) * max(price.input_usd_per_mtok, price.output_usd_per_mtok) / 1e6
        total += min(by_turns, by_tokens)
    return round(total, 4)


def model_warnings(gemini: GeminiSettings, models: Sequence[str], day: str) -> list[str]:
    """What a person should know about the configured models before any fork: no entry in the
    settings table, a preview or deprecated stage, a shutdown date passed or announced."""
    warnings = []
    for model in models:
        entry = gemini.entry_of(model)
        if entry is None:
            defaults = gemini.settings_of(model)
            warnings.append(f"{model} has no entry in the model settings table: it runs with a "
                            f"{defaults.call_timeout_s:g} s call timeout, a {defaults.max_output_tokens} "
                            f"token output cap, no thinking setting and no price (cost unknown, the "
                            f"spending cap cannot count it); add gemini.model_settings.{model} in "
                            f"settings.yaml")
            continue
        if entry.stage == "preview":
            warnings.append(f"{model} is a Preview model: Google's terms exclude Preview models from "
                            f"production use, it may change or be shut down at short notice, and the free "
                            f"tier may have no quota for it")
        elif entry.stage == "deprecated":
            warnings.append(f"{model} is deprecated" + (f" (shutdown {entry.shutdown})" if entry.shutdown
                                                        else "") + ": Google may answer with another model")
        if entry.shutdown and entry.stage != "deprecated":
            passed = entry.shutdown <= day
            warnings.append(f"{model} {'was shut down on' if passed else 'shuts down on'} {entry.shutdown}")
    return warnings


def thinking_problems(gemini: GeminiSettings, models: Sequence[str]) -> list[str]:
    """Thinking settings a model does not accept (its entry's `thinking_levels`)."""
    problems = []
    for model in models:
        settings = gemini.settings_of(model)
        accepted = settings.thinking_levels
        if settings.thinking_level is not None and accepted and settings.thinking_level not in accepted:
            problems.append(f"{model} does not accept thinking_level {settings.thinking_level} (it accepts "
                            f"{', '.join(accepted)}): set gemini.model_settings.{model}.thinking_level")
        if settings.thinking_budget is not None and accepted:
            problems.append(f"{model} takes a thinking_level ({', '.join(accepted)}), not a "
                            f"thinking_budget: set gemini.model_settings.{model}.thinking_level")
    return problems


async def check_models(client: GeminiClient, gemini: GeminiSettings,
                       agents: Sequence[AgentKey] = tuple(AGENTS)) -> list[str]:
    """Every configured model exists, can generate (`models.get`) and accepts its thinking
    setting; raises ConfigError naming the model and the setting to change. Returns the
    warnings of `model_warnings`, each logged. Run before any fork is made."""
    by_model: dict[str, list[AgentKey]] = {}
    for agent in agents:
        by_model.setdefault(gemini.model_of(agent), []).append(agent)
    problems = thinking_problems(gemini, list(by_model))
    if problems:
        raise ConfigError("Gemini: " + ". ".join(problems))
    for model, owners in by_model.items():
        found = await client.check_model(model)
        settings = gemini.settings_of(model)
        if found is None:
            why = "the API has no such model (retired, or misspelt)"
        elif found.supported_actions and "generateContent" not in found.supported_actions:
            why = "it cannot generate content (supported: " + ", ".join(found.supported_actions) + ")"
        elif found.thinking is False and (settings.thinking_level or settings.thinking_budget):
            why = ("it does not think, and its settings ask for thinking (remove thinking_level or "
                   "thinking_budget)")
        else:
            continue
        where = "; ".join(GeminiSettings.setting_names(agent) for agent in owners)
        problems.append(f"model {model} of agent {', '.join(owners)}: {why}; set another model in {where}")
    if problems:
        raise ConfigError("Gemini: " + ". ".join(problems) + f" (defaults chosen on {GEMINI_DEFAULTS_CHOSEN}:"
                          f" {', '.join(DEFAULT_GEMINI_MODELS.values())})")
    warnings = model_warnings(gemini, list(by_model), today())
    for warning in warnings:
        log.warning("model_warning", warning=warning)
    return warnings


@asynccontextmanager
async def open_gemini_squad(settings: Settings, credentials: Credentials, env: Mapping[str, str], *,
                            transport: httpx.AsyncBaseTransport | None = None,
                            google_auth: Any = None, meter: SpendMeter | None = None) -> AsyncIterator[Squad]:
    """The squad of Gemini brains for one command; its HTTP client closes on exit.

    Every configured model is checked first (`check_models`): a retired model fails here, before
    any fork exists. `squad.usage_of(agent)` is `brain.usage_of(agent)`: tokens and estimated cost.
    `meter` (a `SpendMeter` made by the caller) shares one spending cap among several
    squads, e.g. the tasks of a batch; without it the cap is this squad's own.
    """
    async with open_gemini_client(credentials, transport=transport, google_auth=google_auth) as client:
        gemini = settings.gemini
        warnings = await check_models(client, gemini)
        brain = GeminiBrain(client, gemini, Asking(model_phase_s=settings.timeouts.model,
                                                   max_candidates=settings.candidates), meter=meter)
        note = (f"Gemini models via {credentials.describe()}: "
                + ", ".join(f"{agent} = {gemini.model_of(agent)}" for agent in AGENTS))
        note += ("; values from your database are sent (send_values)" if gemini.send_values else
                 "; values from your database are withheld: literals as placeholders, no most common "
                 "values or histogram bounds (send_values false)")
        note += ("; requests go to your Google Cloud project (its logging settings apply)"
                 if credentials.vertexai else "; requests ask not to be stored (store=false)")
        if credentials.note:
            note += f"; {credentials.note}"
        if gemini.max_spend_usd is not None:
            note += f"; spending cap {gemini.max_spend_usd:g} USD (estimated at list prices)"
        if warnings:
            note += "; warning: " + "; ".join(warnings)
        yield Squad(brain_for=lambda _agent: brain, provider="gemini", note=note,
                    reviewer=REVIEWER)
