"""The execution monitor (`afs serve`'s pages) in a real headless Chromium, driven over the
DevTools protocol: the form's errors next to their fields, the README's query submitted, the
lanes filling live and surviving a reload, the charts drawn from the measured timings, the
batch and audit pages. Also the monitor's JSON over plain HTTP.

The browser test keeps screenshots (`monitor.png`: the finished task; `monitor-batch.png`,
`monitor-audit.png`) in the test's tmp dir, copied to $AFS_TEST_ARTIFACTS (default:
`artifacts/` at the repository root, ignored by git).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest
import trio
from psycopg.types.json import Jsonb
from trio_websocket import WebSocketConnection, open_websocket_url

from afs.apply import audit
from afs.batch.report import Entry, build_report, render_markdown
from afs.config import Settings
from afs.events import Event
from afs.forks.naming import fork_name
from afs.optimize import new_task_id
from afs.serve import run_service
from afs.store import TaskSubmission, open_store
from afs.web import OPENAPI_PATHS

README_QUERY = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending'"
                " AND o.user_id = 4242 ORDER BY o.created_at DESC")
ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

pytestmark = pytest.mark.usefixtures("no_leaked_forks")


async def start(nursery: trio.Nursery, settings: Settings, store_db: str, workers: int) -> str:
    urls: list[str] = await nursery.start(partial(run_service, settings.with_(store_url=store_db),
                                                  bind="127.0.0.1:0", workers=workers, lease_s=5))
    return next(u for u in urls if u.startswith("http://127.0.0.1"))


async def seed_batch(store_db: str, task_id: str, sql: str) -> str:
    """A finished batch in the store, its report built by the batch's own report code."""
    entry = Entry(4242, README_QUERY, calls=120, total_ms=9000.0, mean_ms=75.0, status="completed",
                  task_id=task_id, winner={"agent": "index_design", "proposal_type": "index",
                                           "sql_commands": [sql], "rewritten_query": None, "settings": []},
                  gain_pct=88.0, storage_mb=1.5, saved_ms_per_day=7000.0)
    doc = build_report({"id": "b-monitor", "created_at": "2026-11-23T12:00:00+00:00", "database": "afs_demo",
                        "period_s": 86400.0, "provider": "heuristic"}, [entry], [])
    with psycopg.connect(store_db, autocommit=True) as conn:
        conn.execute("INSERT INTO afs_store.batches (id, origin, options, report, markdown, finished_at)"
                     " VALUES (%s, %s, %s, %s, %s, now())",
                     (doc["id"], "local/afs_demo", Jsonb({}), Jsonb(doc), render_markdown(doc)))
    return str(doc["id"])


async def test_the_monitor_json_and_pages_over_http(nursery: trio.Nursery, settings: Settings,
                                                   store_db: str) -> None:
    url = await start(nursery, settings, store_db, workers=0)
    async with httpx.AsyncClient(base_url=url) as http:
        for page in ("/", "/tasks/abc", "/batches", "/batches/x", "/audit"):
            shell = await http.get(page)
            assert shell.status_code == 200 and '<main id="app">' in shell.text, page
        script = await http.get("/static/app.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert "drawChart" in script.text
        assert (await http.get("/static/nosuch.js")).status_code == 404
        paths = (await http.get("/v1/openapi.json")).json()["paths"]
        assert set(OPENAPI_PATHS) <= set(paths)

        assert (await http.get("/v1/board")).json() == {"tasks": []}
        task = (await http.post("/v1/tasks", json={"query": README_QUERY, "priority": "low"})).json()["task"]
        board = (await http.get("/v1/board")).json()["tasks"]
        assert [(t["id"], t["status"], t["winner"], t["gain_pct"]) for t in board] == [
            (task["id"], "queued", None, None)]
        log = (await http.get(f"/v1/tasks/{task['id']}/log")).json()
        assert [e["kind"] for e in log["events"]] == ["task_queued"] and not log["more"]
        first = log["events"][0]["id"]
        assert (await http.get(f"/v1/tasks/{task['id']}/log?after={first}")).json()["events"] == []
        assert (await http.get("/v1/tasks/nosuch/log")).status_code == 404
        assert (await http.get(f"/v1/tasks/{task['id']}/log?after=x")).json()["field"] == "after"
        assert (await http.get("/v1/board?limit=0")).json()["field"] == "limit"

        assert (await http.get("/v1/batches")).json() == {"batches": []}
        missing = await http.get("/v1/batches/nosuch")
        assert missing.status_code == 404 and missing.json()["field"] == "id"
        batch_id = await seed_batch(store_db, task["id"], "CREATE INDEX ON orders (user_id)")
        assert [b["id"] for b in (await http.get("/v1/batches")).json()["batches"]] == [batch_id]
        batch = (await http.get(f"/v1/batches/{batch_id}")).json()
        assert batch["status"] == "finished" and batch["report"]["statements"][0]["task_id"] == task["id"]
        assert batch["markdown"].startswith(f"# AFS batch {batch_id}")

        assert (await http.get("/v1/audit")).json() == {"entries": []}
        async with open_store(store_db) as store:
            row = await audit.record(store, audit.AuditEntry(
                task_id=task["id"], action="apply", approver="ann", target="postgresql://ann:pw@db/x",
                tier="online", sql=("CREATE INDEX ON orders (user_id)",), result="refused",
                detail="a test row"))
        entries = (await http.get(f"/v1/audit?task={task['id']}")).json()["entries"]
        assert [(e["id"], e["approver"], e["result"]) for e in entries] == [(row, "ann", "refused")]
        assert "pw" not in entries[0]["target"]
        assert (await http.get("/v1/audit?task=other")).json() == {"entries": []}
        await http.delete(f"/v1/tasks/{task['id']}")


# -- a real browser ----------------------------------------------------------------------------
def find_browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


class Page:
    """One page of a browser, over the DevTools protocol (flat sessions on the browser socket)."""

    def __init__(self, ws: WebSocketConnection, session: str) -> None:
        self.ws, self.session, self.next_id = ws, session, 0
        self.exceptions: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        await self.ws.send_message(json.dumps(message))
        while True:
            reply = json.loads(await self.ws.get_message())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result
            if reply.get("method") == "Runtime.exceptionThrown":
                details = reply["params"]["exceptionDetails"]
                self.exceptions.append(str(details.get("exception", {}).get("description") or details))

    async def js(self, expression: str) -> Any:
        reply = await self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                                awaitPromise=True)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, within: float = 30) -> Any:
        """The expression's value once truthy (errors while a page loads are retried)."""
        last = None
        with trio.move_on_after(within):
            while True:
                try:
                    if value := await self.js(expression):
                        return value
                except AssertionError as exc:
                    last = exc
                await trio.sleep(0.1)
        raise AssertionError(f"not true within {within} s: {expression} (last error: {last})")

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete' && !!document.querySelector('main')")


@asynccontextmanager
async def browser(binary: str, profile: Path) -> AsyncIterator[Page]:
    """Headless Chromium with a fresh profile; stopped by its own pid (and its children's)."""
    log_path = profile.parent / "chromium.log"
    await trio.Path(profile).mkdir()
    log = await trio.to_thread.run_sync(log_path.open, "wb")
    process = await trio.lowlevel.open_process(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--mute-audio", "--hide-scrollbars",
         "--window-size=1280,900", f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=log, stderr=log)
    try:
        port_file = trio.Path(profile / "DevToolsActivePort")
        with trio.fail_after(30):
            while not await port_file.exists() or len((await port_file.read_text()).splitlines()) < 2:
                assert process.poll() is None, f"chromium exited: {await trio.Path(log_path).read_text()}"
                await trio.sleep(0.05)
        port, path = (await port_file.read_text()).splitlines()[:2]
        async with open_websocket_url(f"ws://127.0.0.1:{port}{path}", max_message_size=64 * 2**20) as ws:
            root = Page(ws, "")
            target = await root.call("Target.createTarget", url="about:blank")
            attached = await root.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
            page = Page(ws, attached["sessionId"])
            await page.call("Page.enable")
            await page.call("Runtime.enable")
            await page.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                            deviceScaleFactor=1, mobile=False)
            yield page
    finally:
        children = []
        with suppress(psutil.NoSuchProcess):
            children = psutil.Process(process.pid).children(recursive=True)
        process.terminate()
        with trio.move_on_after(10) as waited:
            await process.wait()
        if waited.cancelled_caught:
            process.kill()
            await process.wait()
        for child in children:  # by their own pids, only if the browser left them
            with suppress(psutil.NoSuchProcess):
                child.kill()
        log.close()


async def screenshot(page: Page, to: Path) -> Path:
    metrics = await page.call("Page.getLayoutMetrics")
    size = metrics["cssContentSize"]
    shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                           clip={"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 6000),
                                 "scale": 1})
    await trio.to_thread.run_sync(keep_png, base64.b64decode(shot["data"]), to)
    return to


def keep_png(data: bytes, to: Path) -> None:
    to.write_bytes(data)
    keep = Path(os.environ.get("AFS_TEST_ARTIFACTS") or ROOT / "artifacts")
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy(to, keep / to.name)


async def set_form(page: Page, **values: str) -> None:
    await page.js(f"""(() => {{ const f = document.getElementById('submit');
        for (const [k, v] of Object.entries({json.dumps(values)})) f.elements[k].value = v; }})()""")


async def submit_and_read_error(page: Page, field: str) -> str:
    await page.js("document.getElementById('submit').requestSubmit()")
    text: str = await page.wait_for(f"document.querySelector('[data-error-for={field}]').textContent")
    return text


@pytest.mark.slow
async def test_a_browser_submits_the_readme_query_and_watches_the_squad(
        nursery: trio.Nursery, settings: Settings, store_db: str, tmp_path: Path) -> None:
    binary = find_browser()
    if binary is None:
        pytest.skip(f"no Chromium found (looked for {', '.join(BROWSERS)}): apt-get install chromium")
    url = await start(nursery, settings, store_db, workers=1)
    async with browser(binary, tmp_path / "profile") as page, httpx.AsyncClient(base_url=url) as http:
        await page.goto(url + "/")
        await page.wait_for("!!document.querySelector('#submit') && !!document.querySelector('#tasks')")
        await page.wait_for("document.getElementById('tasks').textContent.includes('No tasks yet')")

        # the API's validation, shown next to the field it names; nothing written
        await set_form(page, query="UPDATE orders SET status = 'x'")
        assert "SELECT" in await submit_and_read_error(page, "query")
        assert await page.js("document.querySelector('[data-field=query]').classList.contains('invalid')")
        await set_form(page, query=README_QUERY, runs="0")
        assert "1 to" in await submit_and_read_error(page, "runs")
        assert await page.js("document.querySelector('[data-error-for=query]').textContent") == ""
        assert (await http.get("/v1/tasks")).json() == {"tasks": []}

        await set_form(page, query=README_QUERY, runs="2", provider="heuristic")
        await page.js("document.getElementById('submit').requestSubmit()")
        path = await page.wait_for("location.pathname.startsWith('/tasks/') && location.pathname")
        task_id = path.rsplit("/", 1)[1]
        # live: lanes appear and a phase completes while the task runs; then a reload resumes
        await page.wait_for("document.querySelectorAll('.lane .phase.done').length > 0", within=90)
        assert await page.js("document.querySelector('#status').textContent") == "running"
        assert await page.js("document.querySelector('.lane .fork.live')?.textContent") is not None
        await page.call("Page.reload")
        await page.wait_for("document.readyState === 'complete' && !!document.querySelector('#lanes')")
        await page.wait_for("!!document.querySelector('#winner') || (!!document.querySelector('.notice.info')"
                            " && !!document.querySelector('.proposal'))",
                            within=120)

        doc = (await http.get(f"/v1/tasks/{task_id}")).json()
        report, result = doc["report"], doc["result"]
        assert doc["task"]["status"] == "completed" and report["winner"], doc["task"]
        agents = report["routing"]["agents"]
        lanes = await page.js("[...document.querySelectorAll('.lane')].map(l => [l.dataset.agent,"
                              " [...l.querySelectorAll('.phase')].map(p => p.dataset.state)])")
        assert sorted(a for a, _ in lanes) == sorted(agents)
        statuses = {p["agent"]: p["status"] for p in report["proposals"]}
        for agent, states in lanes:
            assert len(states) == 6 and "active" not in states, (agent, states)
            if statuses[agent] == "failed":
                assert "failed" in states, (agent, states)
            else:  # every phase done or (no candidate to validate or measure) skipped
                assert states[0] == states[-1] == "done" and set(states) <= {"done", "skipped"}, states
        # after the reload every event is shown once, in the store's order
        shown = await page.js("[...document.querySelectorAll('#events tr')]"
                              ".map(r => Number(r.dataset.event))")
        stored = [e["id"] for e in (await http.get(f"/v1/tasks/{task_id}/log")).json()["events"]]
        assert shown == stored and len(set(shown)) == len(shown)
        assert await page.js("document.querySelector('#status').textContent") == "completed"

        # the winner's chart: one optimized bar per timed suite query and parameter set, at the medians
        winner = report["winner"]["agent"]
        outcome = next(o for o in result["outcomes"] if o["agent"] == winner)
        bench = outcome["benchmark"]
        checks = [c for c in bench["parameter_checks"] if c["baseline"] and c["optimized"]]
        timed = [*bench["measurements"], *checks]
        expected = sorted(t["optimized"]["median_ms"] for t in timed)
        card = f".proposal[data-agent={winner}]"
        drawn = await page.js(f"[...document.querySelectorAll('{card} > .two svg.chart rect.bar.opt')]"
                              ".map(r => [Number(r.dataset.ms), r.getBBox().width])")
        assert sorted(ms for ms, _ in drawn) == pytest.approx(expected) and all(w > 0 for _, w in drawn)
        # whiskers from the fastest to the slowest run, as measured
        whiskers = f"{card} > .two svg.chart line.whisker.opt[data-from]"
        spans = await page.js(f"[...document.querySelectorAll('{whiskers}')]"
                              ".map(l => [Number(l.dataset.from), Number(l.dataset.to)])")
        runs = sorted((t["optimized"]["min_ms"], t["optimized"]["max_ms"]) for t in timed
                      if t["optimized"]["spread_ms"] > 0)
        assert spans and [v for pair in sorted(map(tuple, spans)) for v in pair] == \
            pytest.approx([v for pair in runs for v in pair])
        assert all(lo <= t["optimized"]["median_ms"] <= hi for t in timed
                   for lo, hi in [(t["optimized"]["min_ms"], t["optimized"]["max_ms"])])
        total = await page.js(f"Number(document.querySelector('{card} rect[data-score=total]')"
                              ".getAttribute('width'))")
        assert total > 0
        winner_sql = await page.js("document.querySelector('#winner pre.sql').textContent")
        assert report["winner"]["sql_commands"][0].strip().rstrip(";") in winner_sql
        assert await page.js("document.querySelectorAll('#winner button[data-copy]').length") == 2
        tried = sum(len(p["candidates"]) for p in report["proposals"])
        rows = await page.js("document.querySelectorAll('table.candidates tr[data-candidate]').length")
        assert rows == tried
        await screenshot(page, tmp_path / "monitor.png")

        # the lane reducer on an agent that waits, then fails (a real failure is slow to provoke);
        # its fork is one named for it (a lane shows no other agent's fork)
        f1 = fork_name("a", "t1", now=1)
        failed = await page.js("""(() => {
            const s = {lastId: 0, events: [], lanes: new Map(), notices: [], waiting: null};
            const at = '2026-01-01T00:00:00Z';
            applyEvent(s, {id: 1, kind: 'waiting_for_agents', at, data: {agents: ['a']}});
            const waiting = s.waiting;
            applyEvent(s, {id: 2, kind: 'agents_assigned', at, data: {agents: ['a']}});
            applyEvent(s, {id: 3, kind: 'agent_phase', agent: 'a', fork: 'F1', at, data: {phase: 'fork'}});
            applyEvent(s, {id: 4, kind: 'agent_failed', agent: 'a', fork: 'F1', at,
                           data: {phase: 'fork', error: 'timed out in the fork phase (limit 30 s)'}});
            const lane = s.lanes.get('a'), again = applyEvent(s, {id: 4});
            return [waiting, s.waiting, lane.phases.fork.state, lane.failed, lane.fork, again];
        })()""".replace("F1", f1))
        assert "a are busy" in failed[0] and failed[1] is None
        assert failed[2:] == ["failed", "timed out in the fork phase (limit 30 s)", f1, False]

        # the tasks list shows the winner and its measured gain
        await page.goto(url + "/")
        row = await page.wait_for(f"document.querySelector('tr[data-task=\"{task_id}\"]')?.textContent")
        assert winner in row and f"{report['winner']['improvement_pct']:.1f} %" in row and "completed" in row

        # a task that fails (no such source database) says so on its page
        await set_form(page, query=README_QUERY, source="no_such_db", provider="heuristic", runs="1")
        await page.js("document.getElementById('submit').requestSubmit()")
        await page.wait_for(f"location.pathname.startsWith('/tasks/') && location.pathname !== '{path}'")
        shown_error = await page.wait_for("document.querySelector('.notice.fail')?.textContent", within=60)
        failed_id = (await page.js("location.pathname")).rsplit("/", 1)[1]
        events = (await http.get(f"/v1/tasks/{failed_id}/log")).json()["events"]
        error = next(e["data"]["error"] for e in events if e["kind"] == "task_failed")
        assert "no_such_db" in error and error in shown_error
        await page.wait_for("document.querySelector('#status').textContent === 'failed'")

        # the batch report and the audit log as pages
        sql = report["winner"]["sql_commands"][0]
        batch_id = await seed_batch(store_db, task_id, sql)
        async with open_store(store_db) as store:
            await audit.record(store, audit.AuditEntry(
                task_id=task_id, action="apply", approver="ann", target="db", tier="online", sql=(sql,),
                result="applied", detail="in the browser test",
                rollback_sql=tuple(report["winner"]["rollback_commands"])))
        await page.goto(f"{url}/batches")
        assert batch_id in await page.wait_for("document.querySelector('table.batches')?.textContent")
        await page.goto(f"{url}/batches/{batch_id}")
        stmt = await page.wait_for("document.querySelector('table.statements tbody tr')?.textContent")
        assert task_id in stmt and "+88.0 %" in stmt
        assert sql in await page.js("document.querySelector('pre.sql').textContent")
        await screenshot(page, tmp_path / "monitor-batch.png")
        await page.goto(f"{url}/audit")
        audit_row = await page.wait_for("document.querySelector('table.audit tbody tr')?.textContent")
        assert "ann" in audit_row and "applied" in audit_row and task_id in audit_row
        await screenshot(page, tmp_path / "monitor-audit.png")
        assert page.exceptions == []


@pytest.mark.slow
async def test_a_browser_shows_every_event_whatever_its_kind(
        nursery: trio.Nursery, settings: Settings, store_db: str, tmp_path: Path) -> None:
    """The live page draws the store's log, not what its stream's listeners heard: an event of a
    kind the script has no listener for (a named server-sent event nobody listens for is dropped
    by the browser) is shown in its place, not skipped by the next event's id."""
    binary = find_browser()
    if binary is None:
        pytest.skip(f"no Chromium found (looked for {', '.join(BROWSERS)}): apt-get install chromium")
    task_id, agent = new_task_id(), "gemini25flash"
    async with open_store(store_db) as store:
        await store.submit(TaskSubmission(task_id=task_id, query=README_QUERY, source="afs_demo", dsn=None,
                                   task_type="query_optimization", priority="normal", provider="heuristic",
                                   weights=None, runs=1), worker="w", lease_s=600)
        await store.append_events([Event("agents_assigned", task_id, data={"agents": [agent]}),
                                   Event("agent_phase", task_id, agent, data={"phase": "fork"})], worker="w")
        url = await start(nursery, settings, store_db, workers=0)
        rows = "[...document.querySelectorAll('#events tr')]"

        async def shown_and_stored() -> tuple[list[int], list[int]]:
            shown = await page.js(f"{rows}.map(r => Number(r.dataset.event))")
            return shown, [e.id for e in await store.events(task_id)]

        async with browser(binary, tmp_path / "profile") as page:
            await page.goto(f"{url}/tasks/{task_id}")
            await page.wait_for("document.querySelectorAll('#events tr').length === 4")  # queued, started, 2
            await page.wait_for("window.afsStream && window.afsStream.readyState === 1")  # listening
            # a kind no listener hears, then one the lanes use: both shown, in the store's order
            await store.append_events([Event("a_kind_this_page_never_heard_of", task_id, agent,
                                             data={"note": "unheard"})], worker="w")
            await store.append_events([Event("agent_phase", task_id, agent, data={"phase": "analysis"})],
                                      worker="w")
            await page.wait_for("document.querySelector('.lane .phase.active')?.dataset.phase === 'analyse'")
            shown, stored = await shown_and_stored()
            assert len(stored) == 6 and shown == stored, (shown, stored)
            # an unheard kind just before the end: still shown, and the page finishes
            await store.append_events([Event("another_unheard_kind", task_id, agent)], worker="w")
            assert await store.finish(task_id, "w", status="failed", error="stopped by the test")
            await page.wait_for("document.querySelector('#status').textContent === 'failed'")
            await page.wait_for("document.querySelectorAll('#events tr').length === 8")
            shown, stored = await shown_and_stored()
            assert shown == stored, (shown, stored)
            kinds = await page.js(f"{rows}.map(r => r.children[2].textContent)")
            assert "a_kind_this_page_never_heard_of" in kinds and kinds[-2:] == ["another_unheard_kind",
                                                                               "task_finished"]
            assert page.exceptions == []


async def test_off_loopback_a_browser_signs_in_with_the_token_as_a_cookie(
        nursery: trio.Nursery, settings: Settings, store_db: str) -> None:
    url = await start(nursery, settings.with_(service_token="s3cret"), store_db, workers=0)
    html = {"Accept": "text/html,application/xhtml+xml"}
    async with httpx.AsyncClient(base_url=url) as http:
        sent = await http.get("/", headers=html)
        assert sent.status_code == 303 and sent.headers["location"] == "/login"
        assert (await http.get("/v1/board")).status_code == 401  # a script still gets JSON
        form = await http.get("/login")
        assert form.status_code == 200 and 'name="token"' in form.text
        wrong = await http.post("/login", data={"token": "nope"})
        assert wrong.status_code == 401 and "afs_token" not in wrong.headers.get("set-cookie", "")
        signed = await http.post("/login", data={"token": "s3cret"})
        cookie = signed.headers["set-cookie"].lower()
        assert signed.status_code == 303 and "httponly" in cookie and "samesite=strict" in cookie
    async with httpx.AsyncClient(base_url=url, cookies={"afs_token": "s3cret"}) as browser:
        assert (await browser.get("/", headers=html)).status_code == 200
        assert (await browser.get("/v1/board")).json() == {"tasks": []}
    async with httpx.AsyncClient(base_url=url, cookies={"afs_token": "s3cre"}) as guess:
        assert (await guess.get("/v1/board")).status_code == 401
