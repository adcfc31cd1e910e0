"""The task report: a JSON document for scripts, text for people (pure).

Before any number, the report says how far the forks were from the user's server
(afs.conditions): a fork that planned the query otherwise than the source, the settings no fork
could take (both values), tables whose copy is stale or whose visibility map differs, and when
the copy was imported. A speedup measured in a fork whose plan differs from the source's
carries the warning wherever it is shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream

from afs.consensus import query_as_given, read_ms_saved_per_day_of
from afs.models import (
    AGENTS,
    AgentOutcome,
    CandidateResult,
    LoopStep,
    Measurement,
    ModelUsage,
    ParameterCheck,
    PlanCheck,
    SettingGap,
    TaskResult,
    UserConditions,
    WriteCost,
)
from afs.safety import creates, settings_sql

NOT_APPLIED = ("Nothing was applied to your database: every change ran in a disposable fork, "
               "now destroyed.")


def _benchmarks(m: Measurement) -> dict[str, Any]:
    return {
        "name": m.name,
        "baseline_ms": round(m.baseline.median_ms, 3),
        "optimized_ms": round(m.optimized.median_ms, 3),
        "improvement_pct": round(m.improvement_pct, 1),
        "rows": m.rows,
        "baseline_buffers": m.baseline.buffers,
        "optimized_buffers": m.optimized.buffers,
        "baseline_spread_ms": round(m.baseline.spread_ms, 3),
        "optimized_spread_ms": round(m.optimized.spread_ms, 3),
        "runs": m.optimized.runs,
        "baseline_runs": m.baseline.runs,
        "baseline_reused_runs": m.baseline.reused,
        "stopped": m.stopped,
        "baseline_lower_bound": m.baseline.lower_bound,
        "significant": m.significant,
        "equivalent": m.equivalent,
        "note": m.note,
    }


def _check(c: ParameterCheck) -> dict[str, Any]:
    return {
        "parameters": c.label,
        "equivalent": c.equivalent,
        "slower": c.slower,
        "rows": c.rows,
        "baseline_ms": round(c.baseline.median_ms, 3) if c.baseline else None,
        "optimized_ms": round(c.optimized.median_ms, 3) if c.optimized else None,
        "baseline_runs": c.baseline.runs if c.baseline else 0,
        "baseline_reused_runs": c.baseline.reused if c.baseline else 0,
        "runs": c.optimized.runs if c.optimized else 0,
        "note": c.note,
    }


def _candidate(c: CandidateResult) -> dict[str, Any]:
    b = c.benchmark
    return {
        "rank": c.rank,
        "status": c.status,
        "proposal_type": c.proposal.proposal_type,
        "sql_commands": list(c.proposal.sql_commands),
        "settings": dict(c.proposal.settings),
        "rewritten_query": c.proposal.rewritten_query,
        "rationale": c.proposal.rationale,
        "planner_cost": c.planner_cost,
        "baseline_planner_cost": c.baseline_cost,
        "improvement_pct": round(b.average_improvement_pct, 1) if b else None,
        "benchmarks": [_benchmarks(m) for m in b.measurements] if b else [],
        "parameter_checks": [_check(x) for x in b.parameter_checks] if b else [],
        "family_problem": b.family_problem if b else None,
        "storage_mb": round(b.storage_delta_mb, 2) if b else None,
        "apply_s": b.apply_s if b else None,
        "note": c.note,
        "chain": _chain(c.chain),
    }


def _chain(steps: Sequence[LoopStep]) -> list[dict[str, Any]]:
    """The loop's steps that led to a design (afs.agents): each step's design, the plan node
    that motivated it, its measured time, whether it was kept and why not."""
    return [{"step": s.step, "motivated_by": s.motivated_by, "proposal_type": s.proposal.proposal_type,
             "sql_commands": list(s.proposal.sql_commands), "settings": dict(s.proposal.settings),
             "rewritten_query": s.proposal.rewritten_query, "median_ms": s.median_ms, "kept": s.kept,
             "note": s.note} for s in steps]


def chain_text(chain: Sequence[Mapping[str, Any]], indent: str = "  ") -> list[str]:
    """The loop's chain as lines (the JSON of `_chain`): each step's time, what it added to the
    step before (its new statements) and the plan node that led to it."""
    if not chain:
        return []
    out = [f"{indent}chain (the agent's loop: each step reads the plan with the step before in place):"]
    before: list[str] = []
    for s in chain:
        time = f"{_ms(s['median_ms'])}" if s["median_ms"] is not None else "not measured"
        verdict = "kept" if s["kept"] else "not kept" + (f" ({s['note']})" if s["note"] else "")
        added = [c for c in s["sql_commands"] if c not in before] or s["sql_commands"]
        what = "; ".join([*added, *(f"SET {k} = {v}" for k, v in s["settings"].items())])
        if s["rewritten_query"]:
            what += ("; " if what else "") + "rewrite: " + s["rewritten_query"]
        out.append(f"{indent}  step {s['step']}: {time}, {verdict} — "
                   + ("+ " if s["step"] > 1 else "") + _short(what))
        if s["motivated_by"]:
            out.append(f"{indent}    led by: {_short(s['motivated_by'])}")
        if s["kept"]:
            before = list(s["sql_commands"])
    return out


def agent_label(agent: str, usage: ModelUsage | None = None) -> str:
    """"index design — gemini-3.8-flash, version gemini-3.8-flash-002" for an agent a model
    answered for (`usage`: its outcome's usage, with the version the API named),
    "index design — offline strategist" for one without: the agent's role and the brain that
    answered, never the seed's model name (the agent keys stay the stable identifiers in
    routing files and JSON)."""
    spec = AGENTS.get(agent)
    role = spec.specialization.split(":", 1)[0] if spec is not None else agent
    if usage is None or not usage.model:
        return f"{role} — offline strategist"
    model, version = usage.model, usage.model_version
    answered = f"{model}, version {version}" if version and version != model else model
    return f"{role} — {answered}"


def model_spend(result: TaskResult) -> dict[str, Any] | None:
    """What the task's model calls took, summed over its agents (an estimate at list prices,
    not a bill): USD (None when a model had no known price), tokens, calls, and the agents a
    budget or the spending cap stopped; None when no model was called."""
    used = {o.agent: o.usage for o in result.outcomes
            if o.usage is not None and (o.usage.calls or o.usage.stopped)}
    if not used:
        return None
    costs = [u.estimated_cost_usd for u in used.values()]
    priced = [c for c in costs if c is not None]
    return {
        "estimated_cost_usd": None if len(priced) < len(costs) else round(sum(priced), 6),
        "prompt_tokens": sum(u.prompt_tokens for u in used.values()),
        "output_tokens": sum(u.output_tokens for u in used.values()),
        "total_tokens": sum(u.total_tokens for u in used.values()),
        "calls": sum(u.calls for u in used.values()),
        "stopped": {agent: u.stopped for agent, u in used.items() if u.stopped},
    }


def _proposal(o: AgentOutcome, result: TaskResult) -> dict[str, Any]:
    p, b = o.proposal, o.benchmark
    scores = result.decision.scores.get(o.agent) if result.decision else None
    return {
        "agent": o.agent,
        "model": o.usage.model if o.usage else None,  # the model configured; None when none answered
        "label": agent_label(o.agent, o.usage),  # its role and the brain that answered
        "status": o.status,
        "error": o.error,
        "fork": o.fork,
        "duration_s": round(o.duration_s, 2),
        "waited_for_benchmark_s": round(o.waited_s, 2),
        "measured_by": o.measured_by,
        "insights": list(o.analysis.insights) if o.analysis else [],
        "proposal_type": p.proposal_type if p else None,
        "sql_commands": list(p.sql_commands) if p else [],
        "settings": dict(p.settings) if p else {},
        "rollback_commands": list(p.rollback_commands) if p else [],
        "rewritten_query": p.rewritten_query if p else None,
        "rationale": p.rationale if p else None,
        "estimated_impact": (
            {"query_time_improvement": p.estimated_impact.query_time_improvement,
             "storage_overhead_mb": p.estimated_impact.storage_overhead_mb,
             "complexity": p.estimated_impact.complexity, "risk": p.estimated_impact.risk}
            if p else None),
        "risk_level": o.validation.risk_level if o.validation else None,
        "warnings": list(o.validation.warnings) if o.validation else [],
        "benchmarks": [_benchmarks(m) for m in b.measurements] if b else [],
        "skipped_benchmarks": list(b.skipped) if b else [],
        "parameter_checks": [_check(x) for x in b.parameter_checks] if b else [],
        "family_problem": b.family_problem if b else None,
        "baseline_lower_bound": b.baseline_lower_bound if b else False,
        "apply_s": b.apply_s if b else None,
        "write_cost": write_cost_record(b.write_cost, read_ms_saved_per_day_of(b)) if b else None,
        "candidates": [_candidate(c) for c in o.candidates],
        # the loop's chain that led to the agent's proposal (empty: no step after the first)
        "chain": next((_chain(c.chain) for c in o.candidates if c.proposal == p and c.chain), []),
        "storage_mb": round(b.storage_delta_mb, 2) if b else None,
        "storage_before_mb": b.storage_before_mb if b else None,
        "storage_after_mb": b.storage_after_mb if b else None,
        "scores": (
            {"performance": scores.performance, "storage": scores.storage,
             "complexity": scores.complexity, "risk": scores.risk, "total": scores.total,
             "disqualified": list(scores.disqualified)}
            if scores else None),
        "usage": o.usage.record() if o.usage else {},
        "plan_check": _plan_check(o.plan_check),
    }


def write_cost_record(cost: WriteCost | None, saved_ms_per_day: float | None) -> dict[str, Any] | None:
    """A proposal's measured write cost as the JSON keeps it (None when none was measured)."""
    if cost is None:
        return None
    return {"ms_per_write": cost.ms_per_write, "writes_per_day": cost.writes_per_day,
            "ms_per_day": cost.ms_per_day, "reads_per_day": cost.reads_per_day,
            "read_ms_saved_per_day": None if saved_ms_per_day is None else round(saved_ms_per_day, 2),
            "significant": cost.significant, "statements": cost.statements, "note": cost.note}


def write_cost_text(w: Mapping[str, Any]) -> str:
    """One line: what the new indexes cost the writes, per write and per day, against the reads."""
    if not w["statements"]:
        return "  write cost: no write replayed in the fork" + (f" ({w['note']})" if w["note"] else "")
    per_day = (f" × {w['writes_per_day']:g} writes a day = {w['ms_per_day']:g} ms a day"
               if w["ms_per_day"] is not None else " (no rate a day: the statistics' window is unknown)")
    against = (f", against {w['read_ms_saved_per_day']:g} ms a day saved on the reads"
               if w["read_ms_saved_per_day"] is not None else "")
    return (f"  write cost (measured in the fork, {w['statements']} write statement(s) replayed):"
            f" {w['ms_per_write']:.4f} ms more per write{per_day}{against}"
            + ("" if w["significant"] else "; within the noise")
            + (f" ({w['note']})" if w["note"] else ""))


def _gap(g: SettingGap) -> dict[str, Any]:
    return {"name": g.name, "source": g.source, "sandbox": g.sandbox, "reason": g.reason}


def _plan_check(c: PlanCheck | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"matches": c.matches, "source_shape": list(c.source_shape), "fork_shape": list(c.fork_shape),
            "differences": list(c.differences), "carried_settings": dict(c.carried),
            "not_carried": [_gap(g) for g in c.gaps]}


def plan_matches_source(result: TaskResult) -> bool | None:
    """False when any fork planned the query otherwise than the source; None when no fork's
    plan was compared (no source plan, or no fork)."""
    checks = [o.plan_check for o in result.outcomes if o.plan_check is not None]
    return None if not checks else all(c.matches for c in checks)


def _mismatch(result: TaskResult) -> PlanCheck | None:
    return next((o.plan_check for o in result.outcomes
                 if o.plan_check is not None and not o.plan_check.matches), None)


def _gaps(result: TaskResult) -> list[SettingGap]:
    """The settings no fork could take, once each (every fork reports the same ones)."""
    seen: dict[str, SettingGap] = {}
    for o in result.outcomes:
        for g in o.plan_check.gaps if o.plan_check else ():
            seen.setdefault(g.name, g)
    return [seen[k] for k in sorted(seen)]


def _conditions(c: UserConditions | None, result: TaskResult) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "source_settings": dict(c.carried),
        "source_server": dict(c.server),
        "not_carried": [_gap(g) for g in _gaps(result)],
        "source_plan": list(c.source_plan),
        "imported_at": c.imported_at,
        "tables": [{"name": t.name, "source_bytes": t.source_bytes, "copy_bytes": t.copy_bytes,
                    "source_all_visible": t.source_all_visible, "copy_all_visible": t.copy_all_visible}
                   for t in c.tables],
        "stale": list(c.stale),
        "visibility_differs": list(c.unsettled),
        "notes": list(c.notes),
    }


def to_json(result: TaskResult) -> dict[str, Any]:
    winner = None
    if result.decision and result.decision.winner:
        outcome = next(o for o in result.outcomes if o.agent == result.decision.winner)
        assert outcome.proposal is not None and outcome.benchmark is not None
        winner = {
            "agent": outcome.agent,
            "proposal_type": outcome.proposal.proposal_type,
            "improvement_pct": round(outcome.benchmark.average_improvement_pct, 1),
            "sql_commands": list(outcome.proposal.sql_commands),
            "settings": dict(outcome.proposal.settings),
            "rollback_commands": list(outcome.proposal.rollback_commands),
            "rewritten_query": outcome.proposal.rewritten_query,
            "baseline_lower_bound": outcome.benchmark.baseline_lower_bound,
        }
    return {
        "task_id": result.task_id,
        "status": result.status,
        "error": result.error,
        "query": result.query,
        "source": result.source,
        "provider": result.provider,
        "provider_note": result.provider_note,
        "duration_s": round(result.duration_s, 2),
        "routing": {"agents": list(result.routing.agents),
                    "rationale": "; ".join(result.routing.rationale)},
        "proposals": [_proposal(o, result) for o in result.outcomes],
        "winner": winner,
        "consensus": (
            {"ranking": list(result.decision.ranking), "rationale": list(result.decision.rationale),
             "confidence": round(result.decision.confidence, 2)}
            if result.decision else None),
        "review": [{"agent": f.agent, "reviewer": f.reviewer, "concern": f.concern} for f in result.review],
        "applied": False,
        # the task's own parameter sets (a batch task's): the suite ran the first, checks the others
        "parameter_sets": ([{"label": p.label, "query": p.query} for p in result.parameters.sets]
                           if result.parameters else None),
        # the forks against the user's server (afs.conditions): False = a fork planned otherwise
        "plan_matches_source": plan_matches_source(result),
        "plan_differences": list(mismatch.differences) if (mismatch := _mismatch(result)) else [],
        "conditions": _conditions(result.conditions, result),
        "model_spend": model_spend(result),  # the task's model calls in all (None: no model)
    }


PLAN_WARNING = ("measured in a fork that planned the query otherwise than your server: this speedup"
                " may not hold there")


def conditions_text(result: TaskResult) -> list[str]:
    """The lines on the user's conditions, for the top of the report (empty when there is
    nothing to say)."""
    c = result.conditions
    out: list[str] = []
    mismatch = _mismatch(result)
    if mismatch is not None:
        out.append("WARNING: the forks planned this query otherwise than your server: every speedup"
                   " below may not hold there (marked !)")
        out.append("  plan on your server:")
        out.extend(f"    {line}" for line in mismatch.source_shape)
        out.append("  plan in the fork:")
        out.extend(f"    {line}" for line in mismatch.fork_shape)
        out.append("  differences: " + "; ".join(mismatch.differences))
    gaps = _gaps(result)
    if gaps:
        out.append("not carried over to the forks (your server / the sandbox):")
        out.extend(f"  {g.name}: {g.source} / {g.sandbox if g.sandbox is not None else '-'} ({g.reason})"
                   for g in gaps)
    if c is None:
        return out
    if c.imported_at:
        out.append(f"copy: imported {c.imported_at}")
    if c.stale:
        out.append("the copy is stale: its tables' sizes are no longer your server's (bring it up"
                   f" to date: `afs sandbox import --from DSN --refresh {result.source}`):")
        out.extend(f"  {line}" for line in c.stale)
    if c.unsettled:
        out.append("visibility differs from your server's (index-only scans measure otherwise):")
        out.extend(f"  {line}" for line in c.unsettled)
    out.extend(f"note: {line}" for line in c.notes if out or "could not" in line)
    return out


def _reused(figure: dict[str, Any]) -> str:
    """"*" after a baseline run count that includes reused runs."""
    return "*" if figure.get("baseline_reused_runs") else ""


_STOPPED = {  # why measuring stopped (afs.bench.stop_reason), as the report says it
    "separated": "clear",
    "large": "clear (large effect)",
    "overlap": "noise",
    "max_runs": "",
    "budget": "budget spent",
}


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _row(cells: list[str], widths: list[int]) -> str:
    pairs = enumerate(zip(cells, widths, strict=True))
    return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)


def live_sql(sql: str) -> str:
    """`sql` as a person runs it on a busy database: an index built and dropped CONCURRENTLY
    (reads and writes go on; no IF NOT EXISTS, which would keep an invalid leftover). Other
    statements, and text that does not parse, stay as they are."""
    try:
        [raw] = parse_sql(sql)
    except (ParseError, ValueError):
        return sql
    stmt = raw.stmt
    if isinstance(stmt, ast.IndexStmt):
        stmt.concurrent, stmt.if_not_exists = True, False
    elif isinstance(stmt, ast.DropStmt) and stmt.removeType == enums.ObjectType.OBJECT_INDEX:
        stmt.concurrent = True
    else:
        return sql
    return str(RawStream()(stmt))


def _winner(result: TaskResult) -> AgentOutcome | None:
    return next((o for o in result.outcomes
                 if result.decision is not None and o.agent == result.decision.winner), None)


def _refresh_lines(outcome: AgentOutcome) -> list[str]:
    """A materialized view's refresh command (CONCURRENTLY where the proposal gives the view a
    unique index) and what its schedule depends on."""
    if outcome.proposal is None:
        return []
    facts = creates(outcome.proposal)
    # by the last part of the name, as `afs apply`'s plan does: a schema-qualified view and its
    # index on the unqualified name are the same relation
    unique = {ix.table.rpartition(".")[2] for ix in facts.indexes if ix.unique}
    lines = []
    for view in facts.views:
        concurrently = "CONCURRENTLY " if view.name.rpartition(".")[2] in unique else ""
        lines.append(f"  refresh:  REFRESH MATERIALIZED VIEW {concurrently}{view.name};"
                     "  (the view is a snapshot, stale until refreshed)")
    if lines and outcome.benchmark is not None:
        every = max(300.0, outcome.benchmark.apply_s * 100)  # at most 1 % of the time refreshing
        lines.append(f"  schedule: at most every {every / 60:.0f} minutes (a refresh takes about"
                     f" {outcome.benchmark.apply_s:.2f} s, as the build did in the fork); `afs apply`"
                     " sets it from how fast the tables it reads change")
    return lines


def _times_line(result: TaskResult) -> list[str]:
    """The winner's query as given, before and after, in ms and as a ratio: a person reads
    "256 ms → 0.07 ms (3,657×)", which "100.0 % faster" hides."""
    outcome = _winner(result)
    bench = outcome.benchmark if outcome else None
    base = next((m for m in bench.measurements if m.name == "baseline"), None) if bench else None
    if base is None or base.optimized.median_ms <= 0:
        return []
    before, after = base.baseline.median_ms, base.optimized.median_ms
    bound = "over " if bench is not None and bench.baseline_lower_bound else ""
    return [f"  the query as given: {bound}{_ms(before)} → {_ms(after)} ({before / after:,.1f}× faster)"]


def _why_it_won(result: TaskResult) -> list[str]:
    """Why the winner beat the others, in the numbers that decided it: consensus's sentence on
    the winner (afs.consensus writes it, with the times), then the sentence on each proposal
    that ran the query as given faster than the winner and still lost (a partial index that
    does not serve other values of the filter: its line says so). Empty without a winner."""
    decision, chosen = result.decision, _winner(result)
    if decision is None or chosen is None:
        return []
    lines = decision.rationale
    why = [line for line in lines[:1] if line.startswith(f"{chosen.agent} ")]
    mine = query_as_given(chosen.benchmark) if chosen.benchmark else None
    for other in result.outcomes:
        theirs = query_as_given(other.benchmark) if other.benchmark else None
        if other.agent == chosen.agent or theirs is None or mine is None:
            continue
        if theirs.optimized.median_ms < mine.optimized.median_ms:
            why.extend(line for line in lines[1:] if line.startswith(f"{other.agent} ") and line not in why)
    return why


def _answered(usage: Mapping[str, Any]) -> str:
    """The model that answered as the API named it: version, stage and retirement, and the
    configured name when another model answered."""
    version = usage.get("model_version") or usage.get("model")
    facts = [f"stage {usage['model_stage']}"] if usage.get("model_stage") else []
    if usage.get("retirement"):
        facts.append(f"retires {str(usage['retirement'])[:10]}")
    configured = usage.get("model")
    if configured and version and not str(version).startswith(str(configured)):
        facts.append(f"configured {configured}")
    return f"{version}" + (f" ({', '.join(facts)})" if facts else "")


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.2f} ms"


def render_text(result: TaskResult) -> str:
    doc = to_json(result)
    out = [f"AFS task {result.task_id}: {result.status.replace('_', ' ')}"
           f" in {result.duration_s:.1f} s on {result.source}"]
    out.append(f"brains: {result.provider}" + (f" ({result.provider_note})" if result.provider_note else ""))
    out.append(f"routing: {', '.join(result.routing.agents)} — {doc['routing']['rationale']}")
    if result.error:
        out.append(f"error: {result.error}")
    out.extend(conditions_text(result))
    if result.parameters:
        out.append(f"parameters: the suite ran {result.parameters.measured_on}; each proposal was also"
                   f" measured on the task's {len(result.parameters.others)} other set(s) ('other values')")
    for p in doc["proposals"]:
        out.append("")
        title = f"[{p['agent']}: {p['label']}] {p['status']}"
        if p["proposal_type"]:
            title += f": {p['proposal_type']}"
        out.append(title + f"  ({p['duration_s']} s, fork {p['fork'] or '-'})")
        if p["error"]:
            out.append(f"  {p['error']}")
        usage = p["usage"]
        if usage.get("calls"):
            cost = usage.get("estimated_cost_usd")
            price = "cost unknown" if cost is None else f"about ${float(cost):.4f} (list-price estimate)"
            retries = f" ({usage['retries']} retried)" if usage.get("retries") else ""
            thinking = f" ({usage['thinking_tokens']} thinking)" if usage.get("thinking_tokens") else ""
            out.append(f"  model: {usage.get('calls')} calls{retries},"
                       f" {usage.get('prompt_tokens', 0)} prompt + {usage.get('output_tokens', 0)}"
                       f" output tokens{thinking}, {price}")
            out.append(f"  answered by: {_answered(usage)}")
        if usage.get("stopped"):
            out.append(f"  model calls stopped: {usage['stopped']}")
        if not p["proposal_type"] and p["insights"] and not p["error"]:
            out.append(f"  no proposal: {p['insights'][-1]}")
        for sql in p["sql_commands"]:
            out.append(f"  SQL: {sql}")
        for sql in settings_sql(tuple(p["settings"].items())):
            out.append(f"  setting (this query only): {sql}")
        if p["rewritten_query"]:
            out.append(f"  rewrite: {p['rewritten_query']}")
        if p["measured_by"]:
            out.append(f"  the same proposal as {p['measured_by']}'s: measured once, in its fork")
        if p["benchmarks"]:
            differs = bool(p["plan_check"] and not p["plan_check"]["matches"])
            widths = [9, 16, 16, 9, 9, 17, 6, 0]
            out.append("  " + _row(["query", "baseline ms", "optimized ms", "speedup", "rows",
                                    "buffers b→o", "runs", ""], widths).rstrip())
            for m in p["benchmarks"]:
                speed = (f"{m['baseline_ms'] / m['optimized_ms']:.1f}x" if m["optimized_ms"] > 0
                         else "-")
                flag = ("" if m["significant"] else " ~") + (" !" if differs else "")
                bound = ">" if m["baseline_lower_bound"] else ""
                out.append("  " + _row([
                    m["name"],
                    f"{bound}{m['baseline_ms']:.2f}±{m['baseline_spread_ms']:.2f}",
                    f"{m['optimized_ms']:.2f}±{m['optimized_spread_ms']:.2f}",
                    speed + flag, str(m["rows"]),
                    f"{m['baseline_buffers']}→{m['optimized_buffers']}",
                    f"{m['baseline_runs']}{_reused(m)}/{m['runs']}", _STOPPED.get(m["stopped"], "")],
                    widths).rstrip())
            out.append("  (median ± half the range of the runs b/o, baseline/optimized; ~ = within"
                       " the noise; measuring stops once the verdict is certain)")
            if differs:
                out.append(f"  ! {PLAN_WARNING}")
            if any(m["baseline_reused_runs"] for m in p["benchmarks"]) or any(
                    c["baseline_reused_runs"] for c in p["parameter_checks"]):
                out.append("  (* the baseline runs of an earlier measurement in this task, reused: the"
                           " candidate is far from them, or a fresh run agreed with them)")
            if p["baseline_lower_bound"]:
                out.append("  the query as given ran past the statement timeout: its baseline is one run"
                           " under a longer cap, a lower bound (> means at least)")
            for reason in p["skipped_benchmarks"]:
                out.append(f"  skipped: {reason}")
            for c in p["parameter_checks"]:
                verdict = ("other rows" if not c["equivalent"] else "slower" if c["slower"]
                           else "no faster (within the noise)"
                           if c["baseline_ms"] is not None and c["optimized_ms"] is not None
                           and c["optimized_ms"] >= c["baseline_ms"] else "ok")
                times = (f"{c['baseline_ms']:.2f} → {c['optimized_ms']:.2f} ms"
                         f" ({c['baseline_runs']}{_reused(c)}/{c['runs']} runs)"
                         if c["baseline_ms"] is not None and c["optimized_ms"] is not None else "not timed")
                out.append(f"  other values: {c['parameters']}: {times}, {verdict}"
                           + (f" ({c['note']})" if c["note"] else ""))
        if p["storage_mb"] is not None:
            out.append(f"  storage: +{p['storage_mb']} MB (touched tables {p['storage_before_mb']} MB"
                       f" → {p['storage_after_mb']} MB)")
        if p["write_cost"]:
            out.append(write_cost_text(p["write_cost"]))
        if len(p["candidates"]) > 1 or any(c["status"] != "measured" for c in p["candidates"]):
            out.append(f"  candidates tried ({len(p['candidates'])}):")
            for c in p["candidates"]:
                what = "; ".join([*c["sql_commands"], *settings_sql(tuple(c["settings"].items()))])
                if c["rewritten_query"]:
                    what += ("; " if what else "") + "rewrite: " + c["rewritten_query"]
                cost = (f", planner cost {c['planner_cost']:.0f} vs {c['baseline_planner_cost']:.0f}"
                        if c["planner_cost"] is not None and c["baseline_planner_cost"] is not None else "")
                measured = (f", measured {c['improvement_pct']:+.1f} %"
                            if c["improvement_pct"] is not None else "")
                problem = f", {c['family_problem']}" if c["family_problem"] else ""
                out.append(f"    #{c['rank']} {c['status']}: {c['proposal_type']}{cost}{measured}{problem}"
                           f" — {_short(what)}" + (f" ({c['note']})" if c["note"] else ""))
        out.extend(chain_text(p["chain"]))
        if p["scores"]:
            s = p["scores"]
            out.append(f"  scores: performance {s['performance']:g}, storage {s['storage']:g}, "
                       f"complexity {s['complexity']:g}, risk {s['risk']:g} → total {s['total']:g}")
            for reason in s["disqualified"]:
                out.append(f"  cannot win: {reason}")
    out.append("")
    spend = doc["model_spend"]
    if spend:
        cost = spend["estimated_cost_usd"]
        out.append(f"model calls in all: {spend['calls']} calls, {spend['total_tokens']} tokens, "
                   + ("cost unknown (a model without a known price)" if cost is None
                      else f"about ${float(cost):.4f} (list-price estimate, not a bill)"))
    for flag in doc["review"]:
        out.append(f"review: {flag['reviewer']} flags {flag['agent']}'s proposal: {flag['concern']}"
                   " (a flag, not a measurement: the scores stand)")
    why = _why_it_won(result)  # said once, under the winner: not again among the consensus lines
    if doc["consensus"]:
        out.extend(f"consensus: {line}" for line in doc["consensus"]["rationale"] if line not in why)
    winner = doc["winner"]
    if winner:
        out.append("")
        out.append(f"winner: {winner['agent']} ({winner['proposal_type']}), "
                   f"{winner['improvement_pct']:.1f} % faster on average over the suite"
                   + (f" ! {PLAN_WARNING}" if doc["plan_matches_source"] is False else ""))
        if not any("the query as given" in line for line in why[:1]):  # the times, once
            out.extend(_times_line(result))
        out.extend(f"  why: {line}" for line in why)
        if winner["sql_commands"]:
            # what a person runs on a busy database, not the fork's SQL (that stays in --json)
            out.append("  on your database, one statement at a time and outside a transaction"
                       f" (or `afs apply {result.task_id}`: the same, verified, audited):")
        out.extend(f"  apply:    {live_sql(sql)};" for sql in winner["sql_commands"])
        out.extend(f"  rollback: {live_sql(sql)};" for sql in winner["rollback_commands"])
        outcome = _winner(result)
        if outcome is not None:
            out.extend(_refresh_lines(outcome))
        out.extend(f"  setting:  {sql};  (for this query, or per role with ALTER ROLE … SET; never globally)"
                   for sql in settings_sql(tuple(winner["settings"].items()), "SET"))
        if winner["rewritten_query"]:
            out.append(f"  and run:  {winner['rewritten_query']}")
    elif result.status == "no_improvement":
        out.append("no proposal beat the noise: the query is fine as it is, or needs more than "
                   "these agents tried.")
    out.append(NOT_APPLIED)
    return "\n".join(out)
