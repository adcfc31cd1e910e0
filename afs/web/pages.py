"""The monitor's first render, on the server: a page's HTML carries its data before any script
runs (a headless screenshot, a reader without JavaScript, a slow link see the task, not
"Loading…"); static/app.js then draws over it and keeps it live.

    html = shell(task_page(task, events, report))     # /tasks/{id}
    html = shell(board_page(rows))                     # /

`lanes(events)` reads the event log as the script does (afs/web/static/app.js applyEvent): a
lane per agent with its phases, its fork and its failure. A lane shows only the agent's own
fork, the one named for it (afs.forks.naming.fork_name): an event of one agent that carries
another agent's fork never puts that name in its lane.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from afs.forks.naming import fork_name

STATIC = Path(__file__).parent / "static"
PHASES = ("fork", "analyse", "propose", "validate", "benchmark", "close")
PHASE_OF = {"fork": "fork", "analysis": "analyse", "propose": "propose", "screen": "validate",
            "waiting for the benchmark slot": "benchmark", "benchmark": "benchmark",
            "waiting for a shared measurement": "benchmark", "done": "close"}
LOADING = '<main id="app"><p class="muted">Loading…</p></main>'
TERMINAL = ("completed", "no_improvement", "failed", "cancelled", "interrupted")


@dataclass
class Lane:
    agent: str
    fork: str | None = None
    fork_closed: bool = False
    phases: dict[str, str] = field(default_factory=lambda: dict.fromkeys(PHASES, "pending"))
    current: str | None = None
    failed: str | None = None


def own_fork(agent: str, fork: str | None) -> str | None:
    """`fork` when it is the agent's own (named for it by fork_name), else None."""
    if not fork:
        return None
    prefix = fork_name(agent, "x", now=0).removesuffix("-taskx-0") + "-task"
    return fork if fork.startswith(prefix) else None


def lanes(events: Sequence[Mapping[str, Any]]) -> list[Lane]:
    """The agents' lanes as the event log leaves them (a new attempt starts them again)."""
    found: dict[str, Lane] = {}

    def lane(agent: str) -> Lane:
        return found.setdefault(agent, Lane(agent))

    for e in events:
        kind, agent, data = e.get("kind"), e.get("agent"), e.get("data") or {}
        if kind == "task_started" and int(data.get("attempt") or 1) > 1:
            found.clear()
        elif kind == "agents_assigned":
            for name in data.get("agents") or []:
                lane(str(name))
        if not agent:
            continue
        one = lane(str(agent))
        mine = own_fork(one.agent, e.get("fork"))
        if kind == "fork_created" and mine:
            one.fork, one.fork_closed = mine, False
        elif kind == "agent_phase":
            phase = str(data.get("phase") or "")
            if mine:
                one.fork = mine
            if phase == "done":
                _enter(one, "close")
                one.phases["close"], one.current, one.fork_closed = "done", None, True
            elif phase in PHASE_OF:
                _enter(one, PHASE_OF[phase])
        elif kind == "agent_failed":
            one.failed = str(data.get("error") or "failed")
            if one.current:
                one.phases[one.current] = "failed"
            one.current, one.fork_closed = None, True
    return list(found.values())


def _enter(lane: Lane, name: str) -> None:
    if lane.current == name:
        return
    if lane.current:
        lane.phases[lane.current] = "done"
    for earlier in PHASES[:PHASES.index(name)]:
        if lane.phases[earlier] == "pending":
            lane.phases[earlier] = "skipped"
    lane.current = name
    lane.phases[name] = "active"


def _lane_html(lane: Lane) -> str:
    if lane.fork:
        state = "closed" if lane.fork_closed else "live"
        fork = (f'<div class="fork {state}">{"held" if lane.fork_closed else "holds"} fork '
                f'<span class="mono">{escape(lane.fork)}</span></div>')
    else:
        fork = '<div class="fork">no fork yet</div>'
    phases = "".join(f'<div class="phase {s}" data-phase="{p}" data-state="{s}"><b>{p}</b>'
                     f'<span class="t">{"fork closed" if p == "close" and s == "done" else s}</span></div>'
                     for p, s in lane.phases.items())
    failed = f'<div class="detail err">failed: {escape(lane.failed)}</div>' if lane.failed else ""
    return (f'<div class="lane{" failed" if lane.failed else ""}" data-agent="{escape(lane.agent)}">'
            f'<div><div class="who">{escape(lane.agent)}</div>{fork}</div>'
            f'<div class="phases">{phases}</div>{failed}</div>')


def _badge(status: str) -> str:
    return f'<span class="badge {escape(status)}">{escape(status.replace("_", " "))}</span>'


def task_page(task: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
              report: Mapping[str, Any] | None) -> str:
    """The task page's first state: its head, query, lanes, and the winner once it finished."""
    drawn = lanes(events)
    routing = next((" ; ".join(e["data"].get("rationale") or []) for e in reversed(events)
                    if e.get("kind") == "agents_assigned" and e.get("data")), "")
    waiting = "the task waits for a worker" if task["status"] == "queued" else "no agent worked on this task"
    out = [f'<div class="taskhead"><h1>Task <span class="mono">{escape(str(task["id"]))}</span></h1>'
           f'<span id="status">{_badge(str(task["status"]))}</span>'
           f'<span class="muted">{escape(str(task.get("source") or ""))} · brains '
           f'{escape(str(task.get("provider") or ""))} · priority {escape(str(task.get("priority") or ""))}'
           f' · submitted {escape(str(task.get("created_at") or ""))}</span></div>',
           f'<pre class="query">{escape(str(task.get("query") or ""))}</pre>']
    if task.get("error"):
        out.append(f'<div class="notice fail">{escape(str(task["error"]))}</div>')
    out.append('<h2>Agents</h2>'
               + (f'<div class="muted small">routing: {escape(routing)}</div>' if routing else ""))
    out.append('<div class="lanes">' + ("".join(_lane_html(lane) for lane in drawn)
                                        or f'<p class="muted">No agents: {waiting}.</p>') + "</div>")
    winner = (report or {}).get("winner")
    if winner:
        gain, kind = winner.get("improvement_pct"), escape(str(winner.get("proposal_type") or ""))
        out.append('<div class="card" id="winner-first"><h2>Winner</h2>'
                   f'<p><b>{escape(str(winner["agent"]))}</b>: {kind}'
                   + (f", {float(gain):.1f} % faster on average over the suite" if gain is not None else "")
                   + "</p>" + "".join(f'<pre class="sql">{escape(str(sql))}</pre>'
                                      for sql in winner.get("sql_commands") or []) + "</div>")
    elif task["status"] in TERMINAL:
        out.append('<div class="notice info">No winner: no proposal beat the query as given.</div>')
    out.append(f'<p class="muted small" id="first-render">{len(events)} events as the server read them'
               " (the page's script keeps it live).</p>")
    return "".join(out)


def board_page(rows: Sequence[Mapping[str, Any]]) -> str:
    """The task list's first state (the newest tasks, their winner and measured gain)."""
    if not rows:
        return '<h1>Tasks</h1><p class="muted">No tasks yet.</p>'
    body = []
    for t in rows:
        task_id, winner, gain = escape(str(t["id"])), t.get("winner"), t.get("gain_pct")
        won = escape(f"{winner['agent']}: {winner['proposal_type']}") if winner else "-"
        measured = "-" if gain is None else f"{float(gain):+.1f} %"
        query = escape(_short(str(t["query"])))
        body.append(f'<tr data-task="{task_id}"><td>{_badge(str(t["status"]))}</td>'
                    f'<td class="mono small"><a href="/tasks/{task_id}">{query}</a></td><td>{won}</td>'
                    f'<td class="num">{measured}</td><td class="mono small">{task_id}</td></tr>')
    head = ('<thead><tr><th>status</th><th>query</th><th>winner</th><th class="num">measured gain</th>'
            '<th>id</th></tr></thead>')
    return f'<h1>Tasks</h1><table class="tasks">{head}<tbody>{"".join(body)}</tbody></table>'


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def shell(content: str) -> str:
    """The monitor's HTML shell with `content` in its main element instead of "Loading…"."""
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    return page.replace(LOADING, f'<main id="app">{content}</main>', 1)
