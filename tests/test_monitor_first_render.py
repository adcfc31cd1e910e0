"""The monitor's first render is the server's (issue 27 item 12): a task page's HTML has the task,
its lanes and its winner before any script runs (a headless screenshot sees them, not
"Loading…"), the task list too; and a lane never shows another agent's fork."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import trio
from test_apply import result_with
from test_monitor import ROOT, start

from afs.config import Settings
from afs.events import Event
from afs.forks.naming import fork_name
from afs.optimize import new_task_id
from afs.store import TaskSubmission, open_store
from afs.web.pages import lanes, own_fork

PRO, FLASH = "gemini25pro", "gemini25flash"


def events_of(task_id: str) -> list[Event]:
    """Two agents at work; one event of FLASH carries PRO's fork (what a lane must not show)."""
    pro, flash = fork_name(PRO, task_id, now=1), fork_name(FLASH, task_id, now=1)
    return [Event("agents_assigned", task_id, data={"agents": [PRO, FLASH], "rationale": ["two agents"]}),
            Event("agent_phase", task_id, PRO, None, data={"phase": "fork"}),
            Event("fork_created", task_id, PRO, pro),
            Event("agent_phase", task_id, PRO, pro, data={"phase": "analysis"}),
            Event("agent_phase", task_id, FLASH, None, data={"phase": "fork"}),
            Event("agent_phase", task_id, FLASH, pro, data={"phase": "waiting for a shared measurement"}),
            Event("fork_created", task_id, FLASH, flash),
            Event("agent_phase", task_id, PRO, pro, data={"phase": "done"})]


def test_a_lane_shows_only_its_own_agents_fork() -> None:
    found = {lane.agent: lane for lane in lanes([e.__dict__ for e in events_of("t1")])}
    assert found[PRO].fork == fork_name(PRO, "t1", now=1) and found[PRO].fork_closed
    assert found[FLASH].fork == fork_name(FLASH, "t1", now=1)
    assert found[PRO].phases["close"] == "done" and found[FLASH].phases["benchmark"] == "active"
    no_fork_yet = lanes([e.__dict__ for e in events_of("t1")[:6]])
    assert [lane.fork for lane in no_fork_yet if lane.agent == FLASH] == [None]  # not PRO's, shown as its
    assert own_fork(FLASH, fork_name(PRO, "t1")) is None and own_fork(PRO, fork_name(PRO, "t1"))


async def test_the_task_page_and_the_list_carry_their_data_without_javascript(
        nursery: trio.Nursery, settings: Settings, store_db: str) -> None:
    task_id = new_task_id()
    async with open_store(store_db) as store:
        await store.submit(TaskSubmission(task_id=task_id, query="SELECT id FROM orders WHERE user_id = 42",
                                   source="afs_demo", dsn=None, task_type="query_optimization",
                                   priority="normal", provider="heuristic", weights=None, runs=1),
                           worker="w", lease_s=30)
        await store.append_events(events_of(task_id), worker="w")
        assert await store.finish(task_id, "w", status="completed", result=result_with(
            task_id, ("CREATE INDEX ix_first ON orders (user_id)",)))
    url = await start(nursery, settings, store_db, workers=0)
    async with httpx.AsyncClient(base_url=url) as http:
        page = await http.get(f"/tasks/{task_id}")
        assert page.status_code == 200
        html = page.text
        assert "Loading…" not in html and '<script src="/static/app.js" defer>' in html  # then kept live
        assert task_id in html and "SELECT id FROM orders WHERE user_id = 42" in html
        assert 'data-agent="gemini25pro"' in html and 'data-agent="gemini25flash"' in html
        assert html.count(fork_name(PRO, task_id, now=1)) == 1  # in PRO's lane only
        assert fork_name(FLASH, task_id, now=1) in html
        assert 'id="winner-first"' in html and "CREATE INDEX ix_first ON orders (user_id)" in html
        board = (await http.get("/")).text
        assert "Loading…" not in board and f'data-task="{task_id}"' in board and "gemini25pro: index" in board
        missing = await http.get("/tasks/nosuch")
        assert missing.status_code == 200 and "nosuch" in missing.text and "Loading…" not in missing.text


NODE_CHECK = """
const fs = require("fs"), vm = require("vm");
const element = () => ({innerHTML: "", textContent: "", hidden: false, classList: {toggle() {}},
                        addEventListener() {}});
const context = vm.createContext({
  location: {pathname: "/audit"}, console, setInterval, clearInterval, Date, JSON, Map,
  fetch: () => Promise.reject(new Error("no server here")),
  document: {getElementById: element, querySelector: () => null, querySelectorAll: () => [],
             addEventListener() {}, hidden: false},
  window: {},
});
vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), context);
const events = JSON.parse(process.argv[3]);
const out = vm.runInContext(`(events => {
  const state = {lastId: 0, events: [], lanes: new Map(), notices: [], status: "running"};
  const seen = [];
  for (const e of events) {
    applyEvent(state, e);
    seen.push([...state.lanes.values()].map(l => [l.agent, l.fork]));
  }
  return seen;
})`, context)(events);
process.stdout.write(JSON.stringify(out));
"""


def test_the_pages_script_keeps_each_lane_to_its_own_fork(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the page's script with (the server-side lanes are tested above)")
    events = [{**e.__dict__, "id": n, "at": f"2026-11-27T12:00:0{n}+00:00", "duration_s": None}
              for n, e in enumerate(events_of("t1"), 1)]
    script = tmp_path / "check.js"
    script.write_text(NODE_CHECK)
    done = subprocess.run([node, str(script), str(ROOT / "afs/web/static/app.js"), json.dumps(events)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    pro, flash = fork_name(PRO, "t1", now=1), fork_name(FLASH, "t1", now=1)
    assert dict(seen[5])[FLASH] is None  # PRO's fork on FLASH's event: not in FLASH's lane
    assert dict(seen[-1]) == {PRO: pro, FLASH: flash}
