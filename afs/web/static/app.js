// The AFS monitor: draws each page from the JSON API of `afs serve` (no build step, no
// network beyond this server). Pages: / (tasks + submit), /tasks/ID (live lanes, charts),
// /batches, /batches/ID, /audit.
"use strict";

const PHASES = ["fork", "analyse", "propose", "validate", "benchmark", "close"];
// agent_phase names (afs/agents.py) → the lane's phase
const PHASE_OF = {
  "fork": "fork", "analysis": "analyse", "propose": "propose", "screen": "validate",
  "waiting for the benchmark slot": "benchmark", "benchmark": "benchmark",
  "waiting for a shared measurement": "benchmark", "done": "close",
};
const EVENT_KINDS = [
  "task_queued", "task_started", "agents_assigned", "waiting_for_agents", "agent_phase", "fork_created",
  "analysis_completed", "proposal_submitted", "proposal_rejected", "candidates_screened",
  "measurement_shared", "benchmark_completed", "agent_failed", "consensus_reached", "task_failed",
  "task_finished", "cancel_requested", "task_cancelling", "lease_expired", "task_requeued",
  "review_failed", "proposal_flagged", "rewrite_revision_asked", "rewrite_revision_failed",
  "baseline_measuring", "baseline_measured", "measurement_pooled", "plan_compared", "loop_step", "loop_stopped",
];
const TERMINAL = ["completed", "no_improvement", "failed", "cancelled", "interrupted"];

// -- small helpers ------------------------------------------------------------------------
function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
}
function short(text, n) {
  const t = String(text ?? "").replace(/\s+/g, " ").trim();
  return t.length <= n ? t : t.slice(0, n - 1) + "…";
}
function age(iso) {
  if (!iso) return "-";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${Math.round(s / 86400)} d`;
}
function secs(a, b) { return (Date.parse(b) - Date.parse(a)) / 1000; }
function ms(v) {
  if (v == null) return "-";
  if (v >= 1000) return `${(v / 1000).toFixed(2)} s`;
  if (v >= 10) return `${v.toFixed(1)} ms`;
  return `${v.toFixed(v >= 1 ? 2 : 3)} ms`;
}
function pct(v) {
  if (v == null) return "-";
  const cls = v > 0 ? "gain-pos" : v < 0 ? "gain-neg" : "";
  return `<span class="${cls}">${v > 0 ? "+" : ""}${v.toFixed(1)} %</span>`;
}
function badge(status) { return `<span class="badge ${esc(status)}">${esc(String(status).replace("_", " "))}</span>`; }
function num(v) { return v == null ? "-" : Number(v).toLocaleString("en"); }

async function api(path, options) {
  const response = await fetch(path, options);
  let body = null;
  try { body = await response.json(); } catch (e) { body = {error: `HTTP ${response.status}`}; }
  return {ok: response.ok, status: response.status, body};
}

function app() { return document.getElementById("app"); }

function fail(message) {
  app().innerHTML = `<div class="notice fail">${esc(message)}</div>`;
}

// copy buttons: any <button data-copy="ID"> copies the text of element ID
document.addEventListener("click", event => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const text = document.getElementById(button.dataset.copy).textContent;
  const done = () => { button.textContent = "copied"; setTimeout(() => { button.textContent = "copy"; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text, done));
  } else {
    fallbackCopy(text, done);
  }
});
function fallbackCopy(text, done) {
  const area = document.createElement("textarea");
  area.value = text;
  document.body.appendChild(area);
  area.select();
  document.execCommand("copy");
  area.remove();
  done();
}
let codeBlocks = 0;
function codeBlock(title, lines) {
  if (!lines || !lines.length) return "";
  const id = `code-${++codeBlocks}`;
  return `<div class="codehead"><span>${esc(title)}</span><button class="light" data-copy="${id}">copy</button></div>`
    + `<pre id="${id}" class="sql">${esc(lines.join("\n"))}</pre>`;
}

// -- the tasks list and the submit form --------------------------------------------------
const FORM = `
<div class="card">
  <h2 style="margin-top:0">Submit a slow query</h2>
  <form class="submit" id="submit" novalidate>
    <div class="field wide" data-field="query"><label for="f-query">Query (one read-only SELECT)</label>
      <textarea id="f-query" name="query" spellcheck="false" placeholder="SELECT …"></textarea>
      <div class="err" data-error-for="query"></div></div>
    <div class="field" data-field="source"><label for="f-source">Source database</label>
      <input id="f-source" name="source" placeholder="afs_demo">
      <div class="err" data-error-for="source"></div></div>
    <div class="field" data-field="provider"><label for="f-provider">Brains</label>
      <select id="f-provider" name="provider"><option>auto</option><option>heuristic</option><option>gemini</option></select>
      <div class="err" data-error-for="provider"></div></div>
    <div class="field" data-field="priority"><label for="f-priority">Priority</label>
      <select id="f-priority" name="priority"><option>normal</option><option>high</option><option>low</option></select>
      <div class="err" data-error-for="priority"></div></div>
    <div class="field" data-field="runs"><label for="f-runs">Runs per query</label>
      <input id="f-runs" name="runs" inputmode="numeric" placeholder="default">
      <div class="err" data-error-for="runs"></div></div>
    <div class="field" data-field="type"><label for="f-type">Task type</label>
      <select id="f-type" name="type"><option>query_optimization</option><option>index_recommendation</option><option>schema_improvement</option></select>
      <div class="err" data-error-for="type"></div></div>
    <div class="field" data-field="weights" style="grid-column: span 3"><label for="f-weights">Consensus weights (JSON, optional)</label>
      <input id="f-weights" name="weights" class="mono" placeholder='{"performance": 0.5, "storage": 0.2, "complexity": 0.2, "risk": 0.1}'>
      <div class="err" data-error-for="weights"></div></div>
    <div class="actions"><button type="submit" id="f-go">Optimize</button>
      <span class="err" data-error-for="_form"></span></div>
  </form>
</div>
<div class="card"><h2 style="margin-top:0">Tasks</h2><div id="tasks"><p class="muted">Loading…</p></div></div>`;

function formBody(form) {
  const body = {};
  for (const name of ["query", "source", "provider", "priority", "runs", "type", "weights"]) {
    const value = form.elements[name].value;
    if (value.trim() === "") continue;
    if (name === "runs") body.runs = /^-?\d+$/.test(value.trim()) ? Number(value.trim()) : value;
    else if (name === "weights") { try { body.weights = JSON.parse(value); } catch (e) { body.weights = value; } }
    else body[name] = value;
  }
  return body;
}

function showFieldError(form, field, message) {
  for (const el of form.querySelectorAll(".err")) el.textContent = "";
  for (const el of form.querySelectorAll(".invalid")) el.classList.remove("invalid");
  if (!field) return;
  const slot = form.querySelector(`[data-error-for="${CSS.escape(field)}"]`);
  if (slot) {
    slot.textContent = message;
    const wrap = form.querySelector(`[data-field="${CSS.escape(field)}"]`);
    if (wrap) wrap.classList.add("invalid");
  } else {
    form.querySelector('[data-error-for="_form"]').textContent = `${field}: ${message}`;
  }
}

async function tasksPage() {
  app().innerHTML = FORM;
  const form = document.getElementById("submit");
  form.addEventListener("submit", async event => {
    event.preventDefault();
    const go = document.getElementById("f-go");
    go.disabled = true;
    try {
      const r = await api("/v1/tasks", {method: "POST", headers: {"content-type": "application/json"},
                                        body: JSON.stringify(formBody(form))});
      if (r.ok) {
        location.assign(`/tasks/${encodeURIComponent(r.body.task.id)}`);
        return;
      }
      showFieldError(form, r.body.field || "_form", r.body.error || `HTTP ${r.status}`);
    } catch (e) {
      showFieldError(form, "_form", `the server did not answer: ${e}`);
    } finally {
      go.disabled = false;
    }
  });
  const refresh = async () => {
    const r = await api("/v1/board?limit=50");
    const box = document.getElementById("tasks");
    if (!r.ok) { box.innerHTML = `<div class="notice fail">${esc(r.body.error)}</div>`; return; }
    box.innerHTML = tasksTable(r.body.tasks);
  };
  await refresh();
  setInterval(() => { if (!document.hidden) refresh(); }, 3000);
}

function tasksTable(tasks) {
  if (!tasks.length) return `<p class="muted">No tasks yet: submit one above.</p>`;
  const rows = tasks.map(t => `<tr data-task="${esc(t.id)}">
    <td>${badge(t.status)}</td>
    <td><a href="/tasks/${encodeURIComponent(t.id)}" class="mono">${esc(short(t.query, 90))}</a>
        ${t.error ? `<div class="small gain-neg">${esc(short(t.error, 140))}</div>` : ""}</td>
    <td>${t.winner ? `${esc(t.winner.agent)}: ${esc(t.winner.proposal_type)}` : '<span class="muted">-</span>'}</td>
    <td class="num">${pct(t.gain_pct)}</td>
    <td class="num" title="${esc(t.created_at)}">${age(t.created_at)}</td>
    <td class="mono small">${esc(t.id)}</td></tr>`).join("");
  return `<table class="tasks"><thead><tr><th>status</th><th>query</th><th>winner</th>
    <th class="num">measured gain</th><th class="num">age</th><th>id</th></tr></thead><tbody>${rows}</tbody></table>`;
}

// -- one task, live -------------------------------------------------------------------------
function newLane(agent) {
  const phases = {};
  for (const p of PHASES) phases[p] = {state: "pending", start: null, end: null, note: ""};
  return {agent, fork: null, forkClosed: false, phases, current: null, details: [], failed: null};
}

// a lane shows only its agent's own fork, the one named for it (afs.forks.naming.fork_name;
// afs/web/pages.py own_fork): an event carrying another agent's fork never puts it in this lane
function ownFork(agent, fork) {
  if (!fork) return null;
  const part = String(agent).toLowerCase().replace(/[^a-z0-9]/g, "") || "agent";
  return fork.startsWith(`afs-fork-${part}-task`) ? fork : null;
}

function laneOf(state, agent) {
  if (!state.lanes.has(agent)) state.lanes.set(agent, newLane(agent));
  return state.lanes.get(agent);
}

function enterPhase(lane, name, at, note) {
  if (lane.current === name) { lane.phases[name].note = note || ""; return; }
  if (lane.current) Object.assign(lane.phases[lane.current], {state: "done", end: at, note: ""});
  const idx = PHASES.indexOf(name);
  for (const p of PHASES.slice(0, idx)) if (lane.phases[p].state === "pending") lane.phases[p].state = "skipped";
  lane.current = name;
  Object.assign(lane.phases[name], {state: "active", start: at, end: null, note: note || ""});
}

function applyEvent(state, e) {
  if (e.id <= state.lastId) return false;
  state.lastId = e.id;
  state.events.push(e);
  const d = e.data || {};
  const lane = e.agent ? laneOf(state, e.agent) : null;
  switch (e.kind) {
    case "task_started":
      state.status = "running";
      if ((d.attempt || 1) > 1) { state.lanes = new Map(); state.notices.push({cls: "info", text: `attempt ${d.attempt} started on ${d.worker}`}); }
      break;
    case "waiting_for_agents":
      state.waiting = `Waiting for agents: ${(d.agents || []).join(", ")} are busy with other tasks (the router's per-agent capacity); this task starts when they are free.`;
      break;
    case "agents_assigned":
      state.waiting = null;
      state.routing = (d.rationale || []).join("; ");
      for (const agent of d.agents || []) laneOf(state, agent);
      break;
    case "fork_created": {
      const mine = ownFork(lane.agent, e.fork);
      if (mine) { lane.fork = mine; lane.forkClosed = false; }
      break;
    }
    case "agent_phase": {
      const phase = d.phase;
      if (phase === "done") {
        if (lane.current) Object.assign(lane.phases[lane.current], {state: "done", end: e.at, note: ""});
        for (const p of PHASES) if (lane.phases[p].state === "pending") lane.phases[p].state = "skipped";
        Object.assign(lane.phases.close, {state: "done", end: e.at, start: lane.phases.close.start || e.at});
        lane.current = null;
        lane.forkClosed = true;
      } else if (PHASE_OF[phase]) {
        enterPhase(lane, PHASE_OF[phase], e.at, phase.startsWith("waiting") ? phase : "");
      } else {
        lane.details.push({text: phase, err: true});
      }
      if (ownFork(lane.agent, e.fork)) lane.fork = e.fork;
      break;
    }
    case "analysis_completed":
      if ((d.insights || []).length) lane.details.push({text: `analysis: ${d.insights[0]}`});
      break;
    case "proposal_submitted":
      lane.details.push({text: d.proposal_type ? `proposed ${d.proposal_type}${d.candidates > 1 ? ` (+${d.candidates - 1} more candidates)` : ""}` : "no proposal for this query"});
      break;
    case "proposal_rejected": lane.details.push({text: `candidate #${d.rank} rejected: ${d.reason}`, err: true}); break;
    case "measurement_shared": lane.details.push({text: `measured by ${d.measured_by} (the same proposal)`}); break;
    case "benchmark_completed":
      lane.details.push({text: `candidate #${d.rank} measured: ${d.average_improvement_pct > 0 ? "+" : ""}${d.average_improvement_pct} % on average, `
        + `${(d.storage_delta_mb || 0).toFixed(2)} MB added${d.equivalent === false ? ", OTHER ROWS than the original" : ""}`});
      break;
    case "agent_failed":
      lane.failed = d.error || "failed";
      if (lane.current) { lane.phases[lane.current].state = "failed"; lane.phases[lane.current].end = e.at; }
      lane.current = null;
      lane.forkClosed = true;
      break;
    case "rewrite_revision_asked": lane.details.push({text: `rewrite sent back: ${d.reason}`}); break;
    case "rewrite_revision_failed": lane.details.push({text: `rewrite revision failed: ${d.error}`, err: true}); break;
    case "review_failed": state.notices.push({cls: "wait", text: `review by ${e.agent} failed: ${d.error}`}); break;
    case "proposal_flagged": state.notices.push({cls: "wait", text: `${d.reviewer} flagged ${d.agent}'s proposal: ${d.concern}`}); break;
    case "consensus_reached":
      state.notices.push(d.winner ? {cls: "good", text: `Consensus: ${d.winner} wins.`} : {cls: "info", text: "Consensus: no proposal beat the original query."});
      break;
    case "task_failed": state.notices.push({cls: "fail", text: `Task failed: ${d.error}`}); break;
    case "cancel_requested": state.notices.push({cls: "wait", text: "Cancel requested: the agents are closing their forks."}); break;
    case "lease_expired": state.notices.push({cls: "fail", text: `Worker ${d.worker} stopped renewing its lease; ${d.recovered_by} recovers the task.`}); break;
    case "task_requeued": state.notices.push({cls: "info", text: `Back in the queue (${d.reason || d.status}).`}); break;
    case "task_finished":
      state.status = d.status || state.status;
      state.waiting = null;
      if (d.error && d.status !== "failed") state.notices.push({cls: "info", text: d.error});
      break;
    default: break;
  }
  return true;
}

function phaseCell(name, p, now) {
  let t = "";
  if (name === "close" && p.state === "done") t = "fork closed";
  else if (p.state === "done" && p.start && p.end) t = `${secs(p.start, p.end).toFixed(1)} s`;
  else if (p.state === "active" && p.start) t = `${Math.max(0, (now - Date.parse(p.start)) / 1000).toFixed(1)} s`;
  else if (p.state === "skipped") t = "skipped";
  else if (p.state === "failed") t = "failed";
  return `<div class="phase ${p.state}" data-phase="${name}" data-state="${p.state}"><b>${name}</b>`
    + `<span class="t">${esc(t)}${p.note ? ` · ${esc(p.note)}` : ""}</span></div>`;
}

function renderLive(state) {
  const now = Date.now();
  const notices = [];
  if (state.offline) notices.push(`<div class="notice wait" id="offline">The event stream was interrupted: reconnecting (it resumes after the last event shown).</div>`);
  if (state.waiting) notices.push(`<div class="notice wait" id="waiting">${esc(state.waiting)}</div>`);
  for (const n of state.notices) notices.push(`<div class="notice ${n.cls}">${esc(n.text)}</div>`);
  for (const lane of state.lanes.values()) {
    if (lane.failed) notices.push(`<div class="notice fail">${esc(lane.agent)} failed: ${esc(lane.failed)}</div>`);
  }
  document.getElementById("notices").innerHTML = notices.join("");
  document.getElementById("status").innerHTML = badge(state.status);
  document.getElementById("age").textContent = age(state.created);
  const lanes = [...state.lanes.values()].map(lane => {
    const fork = lane.fork
      ? `<div class="fork ${lane.forkClosed ? "closed" : "live"}" title="${lane.forkClosed ? "closed" : "held now"}">${lane.forkClosed ? "held" : "holds"} fork <span class="mono">${esc(lane.fork)}</span></div>`
      : `<div class="fork">no fork yet</div>`;
    const details = lane.details.slice(-3).map(x => `<div class="detail ${x.err ? "err" : ""}">${esc(x.text)}</div>`).join("");
    return `<div class="lane ${lane.failed ? "failed" : ""}" data-agent="${esc(lane.agent)}">
      <div><div class="who">${esc(lane.agent)}</div>${fork}</div>
      <div class="phases">${PHASES.map(p => phaseCell(p, lane.phases[p], now)).join("")}</div>
      ${details}</div>`;
  }).join("");
  document.getElementById("lanes").innerHTML = lanes || (TERMINAL.includes(state.status)
    ? `<p class="muted">No agent worked on this task.</p>`
    : `<p class="muted">No agents assigned yet: the task waits for a worker.</p>`);
  document.getElementById("routing").textContent = state.routing ? `routing: ${state.routing}` : "";
  document.getElementById("eventcount").textContent = `${state.events.length} events`;
  document.getElementById("events").innerHTML = state.events.slice(-400).map(e => `<tr data-event="${e.id}">
    <td class="num">${e.id}</td><td class="small">${esc(e.at.slice(11, 23))}</td><td>${esc(e.kind)}</td>
    <td>${esc(e.agent || "")}</td><td class="small mono">${esc(short(JSON.stringify(e.data), 160))}</td></tr>`).join("");
}

async function taskPage(id) {
  const head = await api(`/v1/tasks/${encodeURIComponent(id)}`);
  if (!head.ok) { fail(head.body.error || `no task ${id}`); return; }
  const task = head.body.task;
  app().innerHTML = `
    <div class="taskhead"><h1>Task <span class="mono">${esc(task.id)}</span></h1><span id="status">${badge(task.status)}</span>
      <span class="muted">${esc(task.source || task.dsn || "")} · brains ${esc(task.provider)} · priority ${esc(task.priority)}
      · submitted <span id="age">${age(task.created_at)}</span> ago</span>
      <button class="danger" id="cancel" ${TERMINAL.includes(task.status) ? "hidden" : ""}>Cancel</button></div>
    <pre class="query">${esc(task.query)}</pre>
    <div id="notices" class="notices"></div>
    <h2>Agents</h2><div class="muted small" id="routing"></div>
    <div class="lanes" id="lanes"></div>
    <div id="result"></div>
    <details class="card"><summary>Event log (<span id="eventcount">0 events</span>)</summary>
      <table class="events"><tbody id="events"></tbody></table></details>`;
  document.getElementById("cancel").addEventListener("click", async () => {
    const r = await api(`/v1/tasks/${encodeURIComponent(id)}`, {method: "DELETE"});
    if (!r.ok) alert(r.body.error);
  });
  const state = {lastId: 0, events: [], lanes: new Map(), notices: [], waiting: null, routing: "",
                 status: task.status, created: task.created_at, finished: false};
  // The log is what the page draws: every event after the last one shown, in the store's order,
  // whatever its kind. The live stream only wakes the page to read it: an event whose kind has
  // no listener here (EventSource drops a named event nobody listens for) is read with the next
  // one, never skipped by an id past it. One read at a time, at most one more queued; a read
  // that fails (the server away for a moment) is made again by the next wake.
  const readLog = async () => {
    for (;;) {
      const r = await api(`/v1/tasks/${encodeURIComponent(id)}/log?after=${state.lastId}`);
      if (!r.ok) return r;
      for (const e of r.body.events) applyEvent(state, e);
      if (!r.body.more) return r;
    }
  };
  let reading = Promise.resolve(), queued = null;
  const wake = () => {
    if (!queued) {
      queued = reading.then(async () => {
        queued = null;
        try { await readLog(); } catch (err) { state.offline = true; }  // the next wake reads it again
        renderLive(state);
      });
      reading = queued;
    }
    return queued;
  };
  // a reload: the events so far first, then the live stream from the last one
  const first = await readLog();
  if (!first.ok) { fail(first.body.error); return; }
  renderLive(state);
  const finish = async () => {
    if (state.finished) return;
    state.finished = true;
    document.getElementById("cancel").hidden = true;
    const r = await api(`/v1/tasks/${encodeURIComponent(id)}`);
    if (r.ok) {
      state.status = r.body.task.status;
      renderLive(state);
      renderResult(r.body);
    }
  };
  if (TERMINAL.includes(task.status) && state.events.some(e => e.kind === "task_finished")) { await finish(); return; }
  const source = new EventSource(`/v1/tasks/${encodeURIComponent(id)}/events?after=${state.lastId}`);
  window.afsStream = source;
  const onEvent = message => {
    let e;
    try { e = JSON.parse(message.data); } catch (err) { return; }
    state.offline = false;
    if (!e || typeof e.id !== "number" || e.id <= state.lastId) return;  // read already
    wake().then(() => { if (state.events.some(x => x.kind === "task_finished")) { source.close(); finish(); } });
  };
  for (const kind of EVENT_KINDS) source.addEventListener(kind, onEvent);
  source.addEventListener("message", onEvent);
  source.addEventListener("end", () => { source.close(); wake().then(finish); });
  source.addEventListener("open", () => { state.offline = false; });
  source.addEventListener("error", () => { if (!state.finished) { state.offline = true; renderLive(state); } });
  const tick = setInterval(() => {
    if (state.finished) { clearInterval(tick); return; }
    if (!document.hidden) renderLive(state);
  }, 500);
}

// -- results: charts, scores, the winner, every candidate --------------------------------
function timingRows(bench) {
  // one row per suite query and per other parameter set, both sides, from the typed result
  const rows = [];
  if (!bench) return rows;
  for (const m of bench.measurements || []) {
    rows.push({label: m.name, kind: "suite", base: m.baseline, opt: m.optimized, rows: m.rows,
               equivalent: m.equivalent, significant: m.significant, note: m.note});
  }
  for (const c of bench.parameter_checks || []) {
    rows.push({label: c.label, kind: "parameters", base: c.baseline, opt: c.optimized, rows: c.rows,
               equivalent: c.equivalent, slower: c.slower, note: c.note});
  }
  return rows;
}

// the whiskers: the fastest and the slowest run (results stored before they were kept: median ± half the range)
const fastest = t => t.min_ms ?? t.median_ms - t.spread_ms;
const slowest = t => t.max_ms ?? t.median_ms + t.spread_ms;

function drawChart(rows) {
  const timed = rows.filter(r => r.base && r.opt);
  if (!timed.length) return `<p class="muted">Nothing was timed.</p>`;
  const W = 780, labelW = 200, plotW = 320, rowH = 40, top = 22, textX = labelW + plotW + 14;
  const H = top + timed.length * rowH + 8;
  const values = [];
  for (const r of timed) for (const t of [r.base, r.opt]) {
    values.push(Math.max(slowest(t), 1e-3), Math.max(fastest(t), 1e-3), Math.max(t.median_ms, 1e-3));
  }
  const lo = Math.min(...values), hi = Math.max(...values);
  const log = hi / lo > 20;
  let x, ticks;
  if (log) {
    const d0 = Math.floor(Math.log10(lo)), d1 = Math.max(Math.ceil(Math.log10(hi)), d0 + 1);
    x = v => labelW + plotW * (Math.log10(Math.max(v, 10 ** d0)) - d0) / (d1 - d0);
    ticks = [];
    for (let k = d0; k <= d1; k++) ticks.push(10 ** k);
  } else {
    const step = niceStep(hi / 4);
    const top_ = Math.ceil(hi / step) * step;
    x = v => labelW + plotW * Math.max(v, 0) / top_;
    ticks = [];
    for (let v = 0; v <= top_ + 1e-9; v += step) ticks.push(v);
  }
  const parts = [`<svg class="chart" viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="baseline and optimized times">`];
  for (const t of ticks) {
    parts.push(`<line class="grid" x1="${x(t)}" x2="${x(t)}" y1="${top - 4}" y2="${H - 6}"/>`,
               `<text x="${x(t)}" y="${top - 8}" text-anchor="middle">${esc(ms(t))}</text>`);
  }
  parts.push(`<line class="axis" x1="${labelW}" x2="${labelW}" y1="${top - 4}" y2="${H - 6}"/>`);
  timed.forEach((r, i) => {
    const y = top + i * rowH + 4;
    const gain = r.base.median_ms > 0 ? 100 * (r.base.median_ms - r.opt.median_ms) / r.base.median_ms : 0;
    parts.push(`<text x="${labelW - 8}" y="${y + 12}" text-anchor="end">${esc(short(r.label, 32))}<title>${esc(r.label)}</title></text>`,
               `<text x="${labelW - 8}" y="${y + 26}" text-anchor="end" class="muted">${r.kind === "suite" ? "suite query" : "other values"}${r.equivalent === false ? " · OTHER ROWS" : ""}</text>`);
    [[r.base, "base", y], [r.opt, `opt${r.opt.median_ms > r.base.median_ms ? " worse" : ""}`, y + 16]].forEach(([t, cls, yy]) => {
      const x0 = labelW, x1 = x(t.median_ms);
      parts.push(`<rect class="bar ${cls}" x="${x0}" y="${yy}" width="${Math.max(x1 - x0, 1.5).toFixed(1)}" height="12" rx="2"`
        + ` data-ms="${t.median_ms}"><title>median ${esc(ms(t.median_ms))}, runs from ${esc(ms(Math.max(fastest(t), 0)))} to ${esc(ms(slowest(t)))} (${t.runs}); ${num(t.buffers)} buffers</title></rect>`);
      if (t.spread_ms > 0) {
        const a = x(Math.max(fastest(t), 1e-3)), b = x(slowest(t)), c = yy + 6;
        parts.push(`<line class="whisker ${cls.split(" ")[0]}" x1="${a}" x2="${b}" y1="${c}" y2="${c}" data-from="${fastest(t)}" data-to="${slowest(t)}"/>`,
                   `<line class="whisker" x1="${a}" x2="${a}" y1="${c - 4}" y2="${c + 4}"/>`,
                   `<line class="whisker" x1="${b}" x2="${b}" y1="${c - 4}" y2="${c + 4}"/>`);
      }
    });
    parts.push(`<text x="${textX}" y="${y + 11}">${esc(ms(r.base.median_ms))} → ${esc(ms(r.opt.median_ms))}`
      + `  <tspan class="${gain >= 0 ? "gain-pos" : "gain-neg"}" style="fill:${gain >= 0 ? "#1f9d55" : "#d64545"}">${gain >= 0 ? "−" : "+"}${Math.abs(gain).toFixed(1)} %</tspan>${r.significant === false ? " (within noise)" : ""}</text>`,
      `<text x="${textX}" y="${y + 26}" style="fill:#6b7280">buffers ${num(r.base.buffers)} → ${num(r.opt.buffers)} · ${r.base.runs}/${r.opt.runs} runs · ${num(r.rows)} rows${r.base.lower_bound ? " · baseline capped (≥)" : ""}</text>`);
  });
  parts.push("</svg>");
  return `<div class="legend"><span><span class="swatch" style="background:var(--base)"></span>original (baseline)</span>
    <span><span class="swatch" style="background:var(--opt)"></span>with the proposal</span>
    <span>whiskers: the fastest and the slowest run</span><span>${log ? "log scale" : "linear scale"}</span></div>`
    + parts.join("");
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(Math.max(raw, 1e-6)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

function drawScores(scores) {
  if (!scores) return `<p class="muted small">Not scored (not measured, or failed).</p>`;
  const names = ["performance", "storage", "complexity", "risk", "total"];
  const W = 300, rowH = 22, labelW = 88, barW = 160;
  const parts = [`<svg class="scores" viewBox="0 0 ${W} ${names.length * rowH + 4}" width="100%">`];
  names.forEach((n, i) => {
    const v = Number(scores[n] || 0), y = i * rowH + 4;
    parts.push(`<text x="${labelW - 6}" y="${y + 11}" text-anchor="end">${n}</text>`,
               `<rect class="track" x="${labelW}" y="${y}" width="${barW}" height="14" rx="3"/>`,
               `<rect class="val ${n === "total" ? "total" : ""}" data-score="${n}" x="${labelW}" y="${y}" width="${(barW * Math.min(Math.max(v, 0), 100) / 100).toFixed(1)}" height="14" rx="3"/>`,
               `<text x="${labelW + barW + 6}" y="${y + 11}">${v.toFixed(1)}</text>`);
  });
  parts.push("</svg>");
  const out = (scores.disqualified || []).map(d => `<div class="small gain-neg">cannot win: ${esc(d)}</div>`).join("");
  return parts.join("") + out;
}

function proposalSql(p) {
  const lines = [...(p.sql_commands || []).map(s => s.trim().replace(/;?$/, ";"))];
  for (const [k, v] of Object.entries(p.settings || {})) lines.push(`SET ${k} = ${v};`);
  if (p.rewritten_query) lines.push(`-- rewritten query:\n${p.rewritten_query}`);
  return lines;
}

function candidatesTable(p, outcome) {
  const cands = p.candidates || [];
  if (!cands.length) return "";
  const typed = new Map(((outcome && outcome.candidates) || []).map(c => [c.rank, c]));
  const rows = cands.map(c => {
    const sql = proposalSql(c);
    const bench = typed.get(c.rank) && typed.get(c.rank).benchmark;
    const chart = bench && c.rank !== undefined ? `<details><summary>chart</summary>${drawChart(timingRows(bench))}</details>` : "";
    return `<tr data-candidate="${c.rank}"><td class="num">#${c.rank}</td><td>${badge(c.status)}</td><td>${esc(c.proposal_type)}</td>
      <td><pre>${esc(sql.join("\n") || "-")}</pre>${chart}</td><td class="num">${pct(c.improvement_pct)}</td>
      <td class="num">${c.storage_mb == null ? "-" : `${c.storage_mb.toFixed(2)} MB`}</td><td class="small">${esc(c.note || "")}</td></tr>`;
  }).join("");
  return `<h3>Every candidate tried (${cands.length})</h3><table class="candidates"><thead><tr><th class="num">rank</th><th>status</th><th>type</th>
    <th>SQL</th><th class="num">gain</th><th class="num">storage</th><th>note</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function renderResult(doc) {
  const report = doc.report, result = doc.result;
  const box = document.getElementById("result");
  if (!report) {
    box.innerHTML = doc.task.error ? `<div class="notice fail">${esc(doc.task.error)}</div>` : "";
    return;
  }
  const outcomes = new Map(((result && result.outcomes) || []).map(o => [o.agent, o]));
  const w = report.winner;
  const parts = [];
  if (w) {
    parts.push(`<div class="card winner" id="winner"><h2 style="margin-top:0">Winner: ${esc(w.agent)} — ${esc(w.proposal_type)} ${pct(w.improvement_pct)}</h2>
      <div class="muted small">average improvement over the suite${w.baseline_lower_bound ? " (the original hit its time cap: a lower bound)" : ""}; nothing was applied to your database</div>
      ${codeBlock("SQL to apply", proposalSql(w))}${codeBlock("Rollback", (w.rollback_commands || []).map(s => s.trim().replace(/;?$/, ";")))}</div>`);
  } else {
    parts.push(`<div class="notice info">No winner: ${esc(report.error || "no proposal beat the original query")}.</div>`);
  }
  if (report.consensus) {
    parts.push(`<div class="card"><h3 style="margin-top:0">Consensus (confidence ${report.consensus.confidence})</h3>
      <ol>${report.consensus.rationale.map(r => `<li>${esc(r)}</li>`).join("")}</ol></div>`);
  }
  parts.push(`<h2>Proposals</h2>`);
  const spend = report.model_spend;
  if (spend) {
    parts.push(`<div class="small muted" id="model-spend">model calls in all: ${spend.calls} calls, ${spend.total_tokens} tokens, ${spend.estimated_cost_usd == null ? "cost unknown" : `about $${Number(spend.estimated_cost_usd).toFixed(4)} (list-price estimate)`}</div>`);
  }
  for (const p of report.proposals) {
    const o = outcomes.get(p.agent);
    const bench = o && o.benchmark;
    parts.push(`<div class="card proposal" data-agent="${esc(p.agent)}">
      <h3 style="margin-top:0">${esc(p.agent)} <span class="muted small">${esc(p.label || p.model || "")}</span> ${badge(p.status)}
        ${p.proposal_type ? `<span>${esc(p.proposal_type)}</span>` : ""} ${w && w.agent === p.agent ? '<span class="badge completed">winner</span>' : ""}</h3>
      ${p.error ? `<div class="notice fail">${esc(p.error)}</div>` : ""}
      ${modelUsage(p.usage)}
      ${p.rationale ? `<div class="small">${esc(p.rationale)}</div>` : ""}
      <div class="facts"><span>storage added <b>${p.storage_mb == null ? "-" : `${p.storage_mb.toFixed(2)} MB`}</b>${p.storage_before_mb != null ? ` (${p.storage_before_mb.toFixed(1)} → ${p.storage_after_mb.toFixed(1)} MB)` : ""}</span>
        <span>apply <b>${p.apply_s == null ? "-" : `${p.apply_s.toFixed(2)} s`}</b></span>
        <span>agent time <b>${p.duration_s} s</b></span><span>fork <span class="mono">${esc(p.fork || "-")}</span></span>
        ${p.measured_by ? `<span>measured by <b>${esc(p.measured_by)}</b></span>` : ""}</div>
      <div class="two"><div>${bench ? drawChart(timingRows(bench)) : '<p class="muted">Nothing measured.</p>'}
        ${(p.skipped_benchmarks || []).map(s => `<div class="small muted">not measured: ${esc(s)}</div>`).join("")}
        ${p.family_problem ? `<div class="small gain-neg">${esc(p.family_problem)}</div>` : ""}</div>
        <div><h3 style="margin-top:0">Score</h3>${drawScores(p.scores)}</div></div>
      ${codeBlock("SQL", proposalSql(p))}${codeBlock("Rollback", (p.rollback_commands || []).map(s => s.trim().replace(/;?$/, ";")))}
      ${(p.warnings || []).map(x => `<div class="small" style="color:var(--warn)">${esc(x)}</div>`).join("")}
      ${candidatesTable(p, o)}</div>`);
  }
  box.innerHTML = parts.join("");
}

// The model calls of one agent (issue 26): the version and stage that answered, tokens, the
// estimated cost, and why its calls stopped (its model budget or the spending cap).
function modelUsage(u) {
  if (!u || !u.calls) return "";
  const cost = u.estimated_cost_usd == null ? "cost unknown" : `about $${Number(u.estimated_cost_usd).toFixed(4)} (list-price estimate)`;
  const stage = u.model_stage ? `, stage ${u.model_stage}` : "";
  return `<div class="small muted model-usage">answered by <span class="mono">${esc(u.model_version || u.model)}</span>${esc(stage)}: ${u.calls} calls, ${u.prompt_tokens} prompt + ${u.output_tokens} output tokens, ${esc(cost)}</div>`
    + (u.stopped ? `<div class="small" style="color:var(--warn)">model calls stopped: ${esc(u.stopped)}</div>` : "");
}

// -- batches and the audit log ---------------------------------------------------------------
async function batchesPage() {
  const r = await api("/v1/batches?limit=100");
  if (!r.ok) { fail(r.body.error); return; }
  const rows = r.body.batches.map(b => `<tr><td><a class="mono" href="/batches/${encodeURIComponent(b.id)}">${esc(b.id)}</a></td>
    <td>${esc(b.origin)}</td><td title="${esc(b.created_at)}">${age(b.created_at)} ago</td>
    <td>${b.finished_at ? `finished after ${secs(b.created_at, b.finished_at).toFixed(0)} s` : badge("running")}</td></tr>`).join("");
  app().innerHTML = `<h1>Batches</h1><div class="card">${rows ? `<table class="batches"><thead><tr><th>batch</th><th>database</th><th>started</th><th>state</th></tr></thead><tbody>${rows}</tbody></table>`
    : `<p class="muted">No batches yet: <code>afs batch --dsn …</code> optimizes a database's costliest statements.</p>`}</div>`;
}

function dur(msValue) {
  if (msValue == null) return "-";
  const s = msValue / 1000;
  return s >= 120 ? `${(s / 60).toFixed(1)} min` : `${s.toFixed(1)} s`;
}

async function batchPage(id) {
  const r = await api(`/v1/batches/${encodeURIComponent(id)}`);
  if (!r.ok) { fail(r.body.error); return; }
  const doc = r.body.report;
  if (!doc) { app().innerHTML = `<h1>Batch ${esc(id)}</h1><div class="notice info">This batch is still running.</div>`; return; }
  const stmts = doc.statements.map((e, i) => `<tr><td class="num">${i + 1}</td><td class="mono small">${esc(short(e.query, 110))}</td>
    <td class="num">${num(e.calls)}</td><td class="num">${dur(e.total_ms)}</td><td class="num">${e.mean_ms.toFixed(2)}</td><td>${badge(e.status)}</td>
    <td>${e.winner ? `${esc(e.winner.agent)}: ${esc(e.winner.proposal_type)}` : "-"}</td><td class="num">${pct(e.gain_pct)}</td>
    <td class="num">${dur(e.saved_ms_per_day)}</td><td>${e.task_id ? `<a class="mono" href="/tasks/${encodeURIComponent(e.task_id)}">${esc(e.task_id)}</a>` : "-"}${e.reused_from ? " (earlier)" : ""}</td></tr>`).join("");
  const indexes = doc.indexes.map(x => `<li>${codeBlock(`${x.size_mb.toFixed(1)} MB · serves ${x.statements.length} statement(s) · saves ${dur(x.saved_ms_per_day)} a day`, [x.sql + ";"])}
    ${(x.replaces || []).map(o => `<div class="small muted">instead of <code>${esc(o)}</code></div>`).join("")}</li>`).join("");
  const unsolved = doc.unsolved.map(u => `<li><span class="mono small">${esc(short(u.query, 120))}</span> — ${esc(u.status)}: ${esc(u.reason || "-")}</li>`).join("");
  app().innerHTML = `<h1>Batch <span class="mono">${esc(doc.id)}</span>: ${esc(doc.database)}</h1>
    <div class="facts"><span>${esc(doc.created_at)}</span><span>${doc.statements.length} statement(s)</span>
      <span>statistics period <b>${(doc.period_s / 3600).toFixed(1)} h</b></span><span>brains <b>${esc(doc.provider)}</b></span>
      <span>estimated time saved <b>${dur(doc.saved_ms_per_day)} a day</b></span><span>indexes <b>${doc.total_index_mb.toFixed(1)} MB</b></span></div>
    <div class="card"><h2 style="margin-top:0">Statements</h2><table class="statements"><thead><tr><th class="num">#</th><th>query</th><th class="num">calls</th><th class="num">total</th>
      <th class="num">mean ms</th><th>status</th><th>winner</th><th class="num">gain</th><th class="num">saved/day</th><th>task</th></tr></thead><tbody>${stmts}</tbody></table></div>
    <div class="card"><h2 style="margin-top:0">Indexes to create</h2>${indexes ? `<ul>${indexes}</ul>` : '<p class="muted">none</p>'}</div>
    <div class="card"><h2 style="margin-top:0">Unsolved</h2>${unsolved ? `<ul>${unsolved}</ul>` : '<p class="muted">nothing</p>'}</div>
    <details class="card"><summary>The report as Markdown</summary><pre>${esc(r.body.markdown || "")}</pre></details>`;
}

// the last `afs audit --check` of an apply (afs.apply.verdict): did it keep its promise?
function promiseCheck(a) {
  const c = (a.verification || {}).check;
  if (!c) return "";
  const rows = (c.statements || []).map(s => `<li class="small">${s.own ? "<b>its statement</b> " : ""}${badge(s.verdict)}
    <span class="mono">${esc(short(s.query, 90))}</span>: ${s.before ? `${s.before.mean_ms.toFixed(3)} ms ×${s.before.calls} before` : ""}
    ${s.recent ? ` → ${s.recent.mean_ms.toFixed(3)} ms ×${s.recent.calls} recently` : ""}</li>`).join("");
  const undo = c.rollback ? `<div class="small">offer: <code>${esc(c.rollback.command)}</code></div>` : "";
  return `<div class="promise" data-verdict="${esc(c.verdict)}">promise: ${badge(c.verdict)} <span class="small">${esc(c.reason)}</span>
    <div class="small muted">${esc(c.window || "")}</div>${rows ? `<ul>${rows}</ul>` : ""}${undo}</div>`;
}

async function auditPage() {
  const r = await api("/v1/audit?limit=200");
  if (!r.ok) { fail(r.body.error); return; }
  const rows = r.body.entries.map(a => `<tr data-audit="${a.id}"><td class="num">#${a.id}</td><td title="${esc(a.at)}">${esc(a.at.slice(0, 19).replace("T", " "))}</td>
    <td>${esc(a.action)}</td><td>${a.task_id ? `<a class="mono" href="/tasks/${encodeURIComponent(a.task_id)}">${esc(a.task_id)}</a>` : `drop index <span class="mono">${esc(a.subject)}</span>`}</td>
    <td>${badge(a.result)}</td><td>${esc(a.tier)}</td><td>${esc(a.approver)}</td><td class="small">${esc(a.target)}</td>
    <td class="num">${Number(a.duration_s).toFixed(2)} s</td>
    <td>${codeBlock("SQL", (a.sql_commands || []).map(s => s + ";"))}${codeBlock("undo", (a.rollback_sql || []).map(s => s + ";"))}
      ${a.detail ? `<div class="small">${esc(a.detail)}</div>` : ""}${promiseCheck(a)}</td></tr>`).join("");
  app().innerHTML = `<h1>Audit log</h1><div class="card">${rows ? `<table class="audit"><thead><tr><th class="num">#</th><th>at</th><th>action</th><th>task</th><th>result</th><th>tier</th>
    <th>approver</th><th>target</th><th class="num">took</th><th>SQL</th></tr></thead><tbody>${rows}</tbody></table>`
    : `<p class="muted">No applies or rollbacks recorded yet (<code>afs apply TASK</code>).</p>`}</div>`;
}

// -- routing by path ------------------------------------------------------------------------
function route() {
  const path = location.pathname;
  const nav = path.startsWith("/batches") ? "batches" : path.startsWith("/audit") ? "audit" : "tasks";
  for (const a of document.querySelectorAll("nav a[data-nav]")) a.classList.toggle("here", a.dataset.nav === nav);
  let m;
  const run = (m = path.match(/^\/tasks\/([^/]+)$/)) ? taskPage(decodeURIComponent(m[1]))
    : (m = path.match(/^\/batches\/([^/]+)$/)) ? batchPage(decodeURIComponent(m[1]))
    : path === "/batches" ? batchesPage()
    : path === "/audit" ? auditPage()
    : tasksPage();
  run.catch(err => fail(`the page could not be drawn: ${err}`));
}
route();
