"""The task report: a JSON document for scripts, text for people (pure)."""

from __future__ import annotations

from typing import Any

from afs.models import AGENTS, AgentOutcome, Measurement, TaskResult

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
        "runs": m.baseline.runs,
        "significant": m.significant,
        "equivalent": m.equivalent,
        "note": m.note,
    }


def _proposal(o: AgentOutcome, result: TaskResult) -> dict[str, Any]:
    p, b = o.proposal, o.benchmark
    scores = result.decision.scores.get(o.agent) if result.decision else None
    return {
        "agent": o.agent,
        "model": o.usage.get("model") or (AGENTS[o.agent].model if o.agent in AGENTS else o.agent),
        "status": o.status,
        "error": o.error,
        "fork": o.fork,
        "duration_s": round(o.duration_s, 2),
        "waited_for_benchmark_s": round(o.waited_s, 2),
        "measured_by": o.measured_by,
        "insights": list(o.analysis.insights) if o.analysis else [],
        "proposal_type": p.proposal_type if p else None,
        "sql_commands": list(p.sql_commands) if p else [],
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
        "storage_mb": round(b.storage_delta_mb, 2) if b else None,
        "storage_before_mb": b.storage_before_mb if b else None,
        "storage_after_mb": b.storage_after_mb if b else None,
        "scores": (
            {"performance": scores.performance, "storage": scores.storage,
             "complexity": scores.complexity, "risk": scores.risk, "total": scores.total,
             "disqualified": list(scores.disqualified)}
            if scores else None),
        "usage": dict(o.usage),
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
            "rollback_commands": list(outcome.proposal.rollback_commands),
            "rewritten_query": outcome.proposal.rewritten_query,
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
        "applied": False,
    }


def _row(cells: list[str], widths: list[int]) -> str:
    pairs = enumerate(zip(cells, widths, strict=True))
    return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)


def render_text(result: TaskResult) -> str:
    doc = to_json(result)
    out = [f"AFS task {result.task_id}: {result.status.replace('_', ' ')}"
           f" in {result.duration_s:.1f} s on {result.source}"]
    out.append(f"brains: {result.provider}" + (f" ({result.provider_note})" if result.provider_note else ""))
    out.append(f"routing: {', '.join(result.routing.agents)} — {doc['routing']['rationale']}")
    if result.error:
        out.append(f"error: {result.error}")
    for p in doc["proposals"]:
        out.append("")
        title = f"[{p['agent']} / {p['model']}] {p['status']}"
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
            out.append(f"  model: {usage.get('calls')} calls{retries},"
                       f" {usage.get('prompt_tokens', 0)} prompt + {usage.get('output_tokens', 0)}"
                       f" output tokens, {price}")
        if not p["proposal_type"] and p["insights"] and not p["error"]:
            out.append(f"  no proposal: {p['insights'][-1]}")
        for sql in p["sql_commands"]:
            out.append(f"  SQL: {sql}")
        if p["rewritten_query"]:
            out.append(f"  rewrite: {p['rewritten_query']}")
        if p["measured_by"]:
            out.append(f"  the same proposal as {p['measured_by']}'s: measured once, in its fork")
        if p["benchmarks"]:
            widths = [9, 16, 16, 9, 9, 17]
            out.append("  " + _row(["query", "baseline ms", "optimized ms", "speedup", "rows",
                                    "buffers b→o"], widths))
            for m in p["benchmarks"]:
                speed = (f"{m['baseline_ms'] / m['optimized_ms']:.1f}x" if m["optimized_ms"] > 0
                         else "-")
                flag = "" if m["significant"] else " ~"
                out.append("  " + _row([
                    m["name"],
                    f"{m['baseline_ms']:.2f}±{m['baseline_spread_ms']:.2f}",
                    f"{m['optimized_ms']:.2f}±{m['optimized_spread_ms']:.2f}",
                    speed + flag, str(m["rows"]),
                    f"{m['baseline_buffers']}→{m['optimized_buffers']}"], widths))
            out.append(f"  (median of {p['benchmarks'][0]['runs']} runs ± half the range;"
                       " ~ = within the noise)")
            for reason in p["skipped_benchmarks"]:
                out.append(f"  skipped: {reason}")
        if p["storage_mb"] is not None:
            out.append(f"  storage: +{p['storage_mb']} MB (touched tables {p['storage_before_mb']} MB"
                       f" → {p['storage_after_mb']} MB)")
        if p["scores"]:
            s = p["scores"]
            out.append(f"  scores: performance {s['performance']:g}, storage {s['storage']:g}, "
                       f"complexity {s['complexity']:g}, risk {s['risk']:g} → total {s['total']:g}")
            for reason in s["disqualified"]:
                out.append(f"  cannot win: {reason}")
    out.append("")
    if doc["consensus"]:
        out.extend(f"consensus: {line}" for line in doc["consensus"]["rationale"])
    winner = doc["winner"]
    if winner:
        out.append("")
        out.append(f"winner: {winner['agent']} ({winner['proposal_type']}), "
                   f"{winner['improvement_pct']:.1f} % faster on average over the suite")
        out.extend(f"  apply:    {sql};" for sql in winner["sql_commands"])
        if winner["rewritten_query"]:
            out.append(f"  and run:  {winner['rewritten_query']}")
        out.extend(f"  rollback: {sql};" for sql in winner["rollback_commands"])
    elif result.status == "no_improvement":
        out.append("no proposal beat the noise: the query is fine as it is, or needs more than "
                   "these agents tried.")
    out.append(NOT_APPLIED)
    return "\n".join(out)
