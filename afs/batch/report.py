"""The batch report (pure): per statement, the indexes to create merged, what is unsolved.

    doc = build_report(header, entries)      # a JSON document
    text = render_markdown(doc)

A statement's estimated time saved per day is its total time over the period
pg_stat_statements has counted (since its last reset), scaled to a day, times the
winner's measured gain over the query family (the suite and the other parameter sets).
Indexes from different winners are merged when one serves the other: on the same
table, with the same method and predicate, one's key columns equal to or a prefix of
the other's (the longer is kept). A merged index is reported once, with every
statement it serves and their time saved together; its size (measured in the fork:
the storage the proposal added) is counted once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from afs.batch.budget import render as render_set
from afs.errors import InputError
from afs.models import ParameterSet, StatementParameters, Substitution, TaskResult
from afs.params.family import apply_parameters
from afs.params.fill import substitute
from afs.replay import DAY_S
from afs.report import model_spend
from afs.safety import NewIndex, validate_commands

SHORT_PERIOD_S = 3_600.0


@dataclass
class Entry:
    """One statement of the batch and what became of it."""

    queryid: int
    query: str
    calls: int
    total_ms: float
    mean_ms: float
    status: str  # completed, no_improvement, failed, skipped, reused
    task_id: str | None = None
    filled_query: str | None = None
    parameter_sets: list[str] = field(default_factory=list)
    reason: str | None = None  # skipped or failed: why
    reused_from: str | None = None  # an earlier batch's task (no schema change since)
    winner: dict[str, Any] | None = None  # agent, proposal_type, sql_commands, rewritten_query, settings
    gain_pct: float | None = None
    storage_mb: float = 0.0
    saved_ms_per_day: float | None = None
    # the winner's figures per parameter set: parameters, baseline_ms, optimized_ms, same_rows, note
    measured: list[dict[str, Any]] = field(default_factory=list)
    # its task's model calls (afs.report.model_spend: calls, tokens, estimated USD, who was
    # stopped); None when no model was called by this batch for it (a reused result included)
    model_spend: dict[str, Any] | None = None


def outcome(entry: Entry, result: TaskResult | None, period_s: float) -> Entry:
    """The entry with the task's winner, measured gain and time saved per day filled in."""
    if result is None:
        return entry
    entry.status = entry.status if entry.status == "reused" else result.status
    entry.model_spend = None if entry.status == "reused" else model_spend(result)  # spent in this batch
    entry.reason = entry.reason or result.error
    decision = result.decision
    if decision is None or not decision.winner:
        return entry
    chosen = next(o for o in result.outcomes if o.agent == decision.winner)
    if chosen.proposal is None or chosen.benchmark is None:
        return entry
    p, b = chosen.proposal, chosen.benchmark
    entry.winner = {"agent": chosen.agent, "proposal_type": p.proposal_type,
                    "sql_commands": list(p.sql_commands), "rewritten_query": p.rewritten_query,
                    "settings": [list(s) for s in p.settings],
                    # the saving needs the application's query rewritten: an index alone does not give it
                    "needs_rewrite": bool(p.rewritten_query),
                    # the rewrite with the statement's $n where the filled values were (None: no $n,
                    # or they cannot be put back with certainty)
                    "rewritten_statement": (with_placeholders(p.rewritten_query, result.parameters)
                                            if p.rewritten_query and result.parameters else None)}
    entry.gain_pct = round(b.family_improvement_pct, 1)
    first = next((m for m in b.measurements if m.name == "baseline"), None)
    given = result.parameters.measured_on if result.parameters else "the values of the query as given"
    if first is not None:
        entry.measured.append({"parameters": given, "suite": [m.name for m in b.measurements],
                               "baseline_ms": round(first.baseline.median_ms, 3),
                               "optimized_ms": round(first.optimized.median_ms, 3),
                               "same_rows": all(m.equivalent for m in b.measurements), "note": ""})
    for check in b.parameter_checks:
        before, after = check.baseline, check.optimized
        entry.measured.append({"parameters": check.label, "suite": [],
                               "baseline_ms": round(before.median_ms, 3) if before else None,
                               "optimized_ms": round(after.median_ms, 3) if after else None,
                               "same_rows": check.equivalent, "note": check.note})
    entry.storage_mb = round(b.storage_delta_mb, 2)
    per_day = entry.total_ms * DAY_S / max(period_s, 1.0)
    entry.saved_ms_per_day = round(per_day * max(0.0, b.family_improvement_pct) / 100.0, 1)
    return entry


def with_placeholders(rewritten: str, parameters: StatementParameters) -> str | None:
    """A rewrite of a filled statement with the statement's `$n` put back where the first set's
    values are, as the application would send it; None when the statement has no `$n`, two
    parameters share one value (which is which cannot be told), or the result, filled again,
    is not the rewrite measured. A value the rewrite has outside a filter (a LIMIT) stays."""
    if not parameters.sets or not parameters.sets[0].values:
        return None
    values = {n: _bare(v) for n, v in parameters.sets[0].values.items()}
    if len(set(values.values())) != len(values):
        return None
    columns = {n: sub.column for pset in parameters.sets[1:] for sub in pset.substitutions
               for n, v in values.items() if sub.old == v and sub.column}
    text, marks = rewritten, {}
    for n, value in sorted(values.items()):
        mark = f"'afs_parameter_{n}'"
        if mark in rewritten:
            return None
        try:
            swap = Substitution(columns.get(n), value, mark)
            placed = apply_parameters(text, ParameterSet(f"${n}", (swap,)))
        except InputError:
            return None
        if placed is not None:
            text, marks[n] = placed, mark
    if not marks:
        return None
    for n, mark in marks.items():
        text = text.replace(mark, f"${n}")
    if " ".join(substitute(text, {n: values[n] for n in marks}).split()) != " ".join(rewritten.split()):
        return None
    return text


def _bare(literal: str) -> str:
    """A filled value as the query reads it (a negative number is filled in parentheses)."""
    return literal[1:-1] if literal.startswith("(") and literal.endswith(")") else literal


@dataclass(frozen=True)
class IndexKey:
    table: str
    method: str
    columns: tuple[str, ...]
    where: str
    include: tuple[str, ...]


def index_key(sql: str) -> IndexKey | None:
    """What an index is, as the validator read its CREATE INDEX (None for any other command)."""
    created = validate_commands((sql,), "index").creates
    if len(created.commands) != 1 or not isinstance(created.commands[0], NewIndex):
        return None
    index = created.commands[0]
    return IndexKey(index.table.removeprefix("public."), index.method, index.keys, index.where, index.include)


def serves(big: IndexKey, small: IndexKey) -> bool:
    """`big` serves every lookup `small` would: same table, method and predicate, a prefix."""
    return (big.table == small.table and big.method == small.method and big.where == small.where
            and big.columns[:len(small.columns)] == small.columns
            and set(small.include) <= set(big.columns) | set(big.include))


def merge_indexes(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    """The winners' indexes, merged where one serves another (largest key first)."""
    found: list[tuple[IndexKey, str, Entry]] = []
    for e in entries:
        for sql in (e.winner or {}).get("sql_commands", []):
            key = index_key(sql)
            if key is not None:
                found.append((key, sql, e))
    found.sort(key=lambda f: (-len(f[0].columns), -len(f[0].include)))
    merged: list[dict[str, Any]] = []
    keys: list[IndexKey] = []
    for key, sql, e in found:
        into = next((i for i, k in enumerate(keys) if serves(k, key)), None)
        per_stmt = max(1, sum(1 for s in (e.winner or {}).get("sql_commands", []) if index_key(s)))
        size = e.storage_mb / per_stmt
        if into is None:
            keys.append(key)
            merged.append({"sql": sql, "table": key.table, "columns": list(key.columns),
                           "size_mb": round(size, 2), "statements": [e.queryid],
                           "saved_ms_per_day": e.saved_ms_per_day or 0.0, "replaces": [],
                           "needs_rewrite": [e.queryid] if (e.winner or {}).get("needs_rewrite") else []})
            continue
        target = merged[into]
        if (e.winner or {}).get("needs_rewrite") and e.queryid not in target["needs_rewrite"]:
            target["needs_rewrite"].append(e.queryid)
        target["size_mb"] = round(max(target["size_mb"], size), 2)
        if sql != target["sql"] and sql not in target["replaces"]:
            target["replaces"].append(sql)
        if e.queryid not in target["statements"]:
            target["statements"].append(e.queryid)
            target["saved_ms_per_day"] = round(target["saved_ms_per_day"] + (e.saved_ms_per_day or 0.0), 1)
    return merged


def build_report(header: Mapping[str, Any], entries: Sequence[Entry],
                 skipped: Sequence[Mapping[str, Any]],
                 writes: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The batch document: header, statements, merged indexes, totals, what is unsolved.

    `writes`: rows written to each table over the statistics period (the write cost an
    index adds is per table and per index, so a merged index counts it once)."""
    indexes = merge_indexes(entries)
    for index in indexes:
        index["table_writes"] = (writes or {}).get(index["table"])
    unsolved = [{"queryid": e.queryid, "query": e.query, "status": e.status,
                 "reason": e.reason or ("no proposal beat the original" if e.status == "no_improvement"
                                        else None)}
                for e in entries if e.winner is None]
    unsolved += [{"queryid": s.get("queryid"), "query": s["query"], "status": "skipped",
                  "reason": s["reason"]} for s in skipped]
    return {
        **header,
        "statements": [asdict(e) for e in entries],
        "indexes": indexes,
        "total_index_mb": round(sum(i["size_mb"] for i in indexes), 2),
        "saved_ms_per_day": round(sum(e.saved_ms_per_day or 0.0 for e in entries), 1),
        "unsolved": unsolved,
        "model_spend": batch_spend(entries, (header.get("options") or {}).get("max_spend_usd")),
    }


def batch_spend(entries: Sequence[Entry], cap_usd: float | None = None) -> dict[str, Any] | None:
    """The batch's model calls in all (an estimate at list prices, not a bill): USD (None when
    a model had no known price), calls, tokens, the cap and the statements whose agents it
    stopped; None when no model was called."""
    spent = [e.model_spend for e in entries if e.model_spend]
    if not spent:
        return None
    priced = [float(s["estimated_cost_usd"]) for s in spent if s["estimated_cost_usd"] is not None]
    return {"estimated_cost_usd": None if len(priced) < len(spent) else round(sum(priced), 6),
            "calls": sum(int(s["calls"]) for s in spent),
            "total_tokens": sum(int(s["total_tokens"]) for s in spent),
            "cap_usd": cap_usd,
            "capped": [e.queryid for e in entries if e.model_spend and any(
                str(why).startswith("the spending cap") for why in e.model_spend["stopped"].values())]}


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


def _rewrite_lines(e: Mapping[str, Any]) -> list[str]:
    """A winner's rewrite: what the application must send instead (an application change),
    with the statement's $n as pg_stat_statements shows them, next to the values measured."""
    w = e["winner"]
    lines = ["   - needs an application change: the saving comes from rewriting the query"
             + (" (with the index above)" if w["sql_commands"] else "")]
    if w.get("rewritten_statement"):
        lines.append("   - rewrite, with the statement's parameters: "
                     f"`{_short(w['rewritten_statement'], 400)}`")
        lines.append(f"   - measured filled in as: `{_short(w['rewritten_query'], 400)}`")
    elif "$" in e["query"]:
        lines.append(f"   - rewrite, measured with the values above (put the statement's $n back in their "
                     f"places): `{_short(w['rewritten_query'], 400)}`")
    else:
        lines.append(f"   - rewrite: `{_short(w['rewritten_query'], 400)}`")
    return lines


def render_markdown(doc: Mapping[str, Any]) -> str:
    out = [f"# AFS batch {doc['id']}: {doc['database']}", "",
           f"{doc['created_at']} · {len(doc['statements'])} statement(s) · window "
           f"{doc['period_s'] / 3600:.1f} h · brains: {doc['provider']}", ""]
    if doc.get("window"):
        out += [f"Window: {doc['window']['note']}.", ""]
    below = doc.get("below")
    if below and (below["mean_ms"] or below["calls"]):
        parts = []
        if below["mean_ms"]:
            parts.append(f"{below['mean_ms']} statement(s) faster than {below['min_mean_ms']:g} ms on "
                         "average (--min-ms, the setting batch_min_mean_ms): a fork each would cost more "
                         "than they can save")
        if below["calls"]:
            parts.append(f"{below['calls']} statement(s) called fewer than {below['min_calls']} times "
                         "(--min-calls)")
        out += [f"Not optimized: {'; '.join(parts)}. Together they took {_duration(below['total_ms'])} "
                "in the window.", ""]
    if doc["period_s"] < SHORT_PERIOD_S:
        out += ["Time saved per day is extrapolated from less than an hour of statistics: "
                "let the workload run longer for a steadier estimate.", ""]
    out += ["| # | queryid | calls | total | mean ms | status | winner | gain | saved/day | task |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for n, e in enumerate(doc["statements"], 1):
        w = e["winner"]
        winner = f"{w['agent']}: {w['proposal_type']}" if w else "-"
        if w and w.get("needs_rewrite"):
            winner += " (needs an application change)"
        gain = f"{e['gain_pct']:.0f} %" if e["gain_pct"] is not None else "-"
        task = e["task_id"] or "-"
        if e["reused_from"]:
            task += " (earlier)"
        out.append(f"| {n} | {e['queryid']} | {e['calls']} | {_duration(e['total_ms'])} | "
                   f"{e['mean_ms']:.2f} | {e['status']} | {winner} | {gain} | "
                   f"{_duration(e['saved_ms_per_day'])} | {task} |")
    out += ["", "## Statements", ""]
    for n, e in enumerate(doc["statements"], 1):
        out.append(f"{n}. `{_short(e['query'], 200)}`")
        if e["filled_query"] and e["filled_query"] != e["query"]:
            out.append(f"   - measured as: `{_short(e['filled_query'], 200)}`")
        measured = e.get("measured") or []
        for m in measured:  # the winner's figures, per parameter set
            times = (f"{m['baseline_ms']:.2f} → {m['optimized_ms']:.2f} ms"
                     if m["baseline_ms"] is not None and m["optimized_ms"] is not None else "not timed")
            where = (f" ({', '.join(m['suite'])})" if m["suite"] else "")
            rows = "same rows" if m["same_rows"] else "OTHER ROWS"
            out.append(f"   - measured on {m['parameters']}{where}: {times}, {rows}"
                       + (f" — {m['note']}" if m["note"] else ""))
        if not measured:
            for label in e["parameter_sets"][1:]:
                out.append(f"   - other values: {label}")
        if e["winner"]:
            for sql in e["winner"]["sql_commands"]:
                out.append(f"   - `{sql}`")
            if e["winner"]["rewritten_query"]:
                out += _rewrite_lines(e)
        if e["reason"]:
            out.append(f"   - {e['reason']}")
    out += ["", f"## Indexes to create ({doc['total_index_mb']:.1f} MB in all)", ""]
    if not doc["indexes"]:
        out.append("none")
    for i in doc["indexes"]:
        out.append(f"- `{i['sql']}` — {i['size_mb']:.1f} MB, serves {len(i['statements'])} statement(s) "
                   f"({', '.join(str(q) for q in i['statements'])}), saves {_duration(i['saved_ms_per_day'])}"
                   " a day" + (f"; {i['table_writes']} row writes to {i['table']} in the period"
                               " would maintain it" if i.get("table_writes") else ""))
        for other in i["replaces"]:
            out.append(f"  - instead of `{other}`")
        if i.get("write_cost"):
            words = _net_words(i.get("net_ms_saved_per_day"), i["write_cost"]).lstrip("; ")
            out.append(f"  - measured write cost: {i['write_cost']['ms_per_write']:.4f} ms per write"
                       + (f"; {words}" if words else ""))
        if i.get("needs_rewrite"):
            out.append(f"  - needs an application change: for {', '.join(str(q) for q in i['needs_rewrite'])}"
                       " the saving comes with the query's rewrite (see the statement), not from this "
                       "index alone")
    out += ["", f"Estimated time saved: {_duration(doc['saved_ms_per_day'])} a day.", ""]
    spend = doc.get("model_spend")
    if spend:
        cost = spend["estimated_cost_usd"]
        out += [f"Model calls: {spend['calls']}, {spend['total_tokens']} tokens, "
                + ("cost unknown (a model without a known price)" if cost is None
                   else f"about ${cost:.4f} (list-price estimate, not a bill)")
                + ("" if spend.get("cap_usd") is None else f"; spending cap {spend['cap_usd']:g} USD")
                + (f"; the cap stopped the model calls of statement(s) "
                   f"{', '.join(str(q) for q in spend['capped'])}" if spend.get("capped") else "") + ".", ""]
    out += workload_lines(doc)  # issue 28: the new indexes' write costs, the index review
    if doc.get("chosen_set"):  # `--max-storage` (afs.batch.budget)
        out += render_set(doc["chosen_set"])
    out += [
            "## Unsolved", ""]
    if not doc["unsolved"]:
        out.append("nothing")
    for u in doc["unsolved"]:
        out.append(f"- {u['queryid']}: `{_short(u['query'])}` — {u['status']}: {u['reason'] or '-'}")
    return "\n".join(out) + "\n"


def _net_words(net: float | None, write_cost: Mapping[str, Any]) -> str:
    if net is None:
        return ""
    if net < 0 and write_cost.get("significant"):
        return f"; the writes lose {_duration(-net)} a day more than the reads gain: not worth it"
    return f"; net {_duration(max(net, 0.0))} a day saved"


def consensus_weighed(in_task: Mapping[str, Any]) -> bool:
    """Whether the consensus weighed a task's measured write cost (`write_cost_in_task`, as
    afs.consensus.measured_write_cost does: a write replayed, and both rates a day known, the
    writes' and the read time saved); otherwise it weighed the source's writes per read."""
    return (bool(in_task.get("statements")) and in_task.get("ms_per_day") is not None
            and in_task.get("read_ms_saved_per_day") is not None)


def _small(ms: float) -> str:
    """A time a day that may be a few ms (the demo's): in ms below a second."""
    return f"{ms:.1f} ms" if abs(ms) < 1000 else _duration(ms)


def in_task_words(in_task: Mapping[str, Any]) -> str:
    """One line: the write cost a winner's task measured in its agent's fork, and whether the
    consensus used it (pure)."""
    if not in_task.get("statements"):
        return ("its task replayed no write: the consensus used the source's writes per read"
                + (f" ({in_task['note']})" if in_task.get("note") else ""))
    per_day = in_task.get("ms_per_day")
    words = (f"in its task's fork: {in_task['ms_per_write']:.4f} ms more per write"
             + ("" if per_day is None else f", {_small(per_day)} a day")
             + f" ({in_task['statements']} write statement(s)"
             + ("" if in_task.get("significant") else ", within the noise") + ")")
    if consensus_weighed(in_task):
        return words + (f"; the consensus weighed it against {_small(in_task['read_ms_saved_per_day'])}"
                        " a day saved on the reads")
    why = "no rate a day for the writes" if per_day is None else "no rate a day for the reads"
    return words + f"; the consensus used the source's writes per read instead ({why})"


def workload_lines(doc: Mapping[str, Any]) -> list[str]:
    """The report's lines of the new indexes' measured write costs and of the index review
    (afs.batch.indexes.batch_workload_review), as Markdown; none when the batch has neither."""
    out: list[str] = []
    costs = [(e["queryid"], e.get("write_cost"), e.get("net_ms_saved_per_day"),
              (e.get("winner") or {}).get("write_cost_in_task"))
             for e in doc.get("statements", ())
             if e.get("write_cost") or (e.get("winner") or {}).get("write_cost_in_task")]
    if costs:
        out += ["## What the new indexes cost the writes (measured in a fork)", ""]
        for queryid, cost, net, in_task in costs:
            if not cost:
                out.append(f"- winner of {queryid}: not replayed by the batch")
            else:
                per_day = cost.get("ms_per_day")
                out.append(f"- winner of {queryid}: {cost['ms_per_write']:.4f} ms more per write"
                           + ("" if per_day is None else f", {_duration(per_day)} a day at "
                              f"{cost['writes_per_day']:.0f} writes a day")
                           + ("" if cost.get("significant") else " (within the noise)")
                           + _net_words(net, cost)
                           + (" (as its task measured it: the same writes, not replayed again)"
                              if cost.get("source") == "task" else "")
                           + (f" — {cost['note']}" if cost.get("note") else ""))
            if in_task:
                out.append(f"  - {in_task_words(in_task)}")
        out.append("")
    review = doc.get("index_review")
    if review:
        out += ["## Indexes worth dropping (verified in a fork)", ""]
        if review.get("error"):
            out += [f"not reviewed: {review['error']}", ""]
            return out
        out.append(f"Window: {review['window']['note']}.")
        if not review["advice"]:
            out.append("No unused, duplicate or redundant index.")
        for a in review["advice"]:
            per_day = a.get("write_ms_saved_per_day")
            out.append(f"- {a['verdict'].upper()} {a['index']} on {a['table']} ({a['kind']}, "
                       f"{a['storage_mb']:.1f} MB"
                       + ("" if per_day is None else f", writes save {_duration(per_day)} a day"
                          + ("" if a.get("write_significant") else " (within the noise)"))
                       + f"): {a['reason']}")
            out += [f"  - slower without it: `{_short(s, 160)}`" for s in a["reads_slower"]]
            if a["verdict"] == "drop":
                out.append(f"  - `{a['sql']}` (rollback: `{a['rollback']}`)")
        out += ["", "What AFS cannot see: " + "; ".join(review.get("unseen", ())) + ".", ""]
    return out
