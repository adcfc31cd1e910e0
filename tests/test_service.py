"""`afs serve` over real HTTP on loopback, with the real store and real workers:
submit, watch live events (SSE, resumable), look up, cancel, tokens, bad requests,
`afs optimize --server`, and a worker killed with SIGKILL whose task another worker finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import httpx
import psutil
import pytest
import trio

from afs.asgi import check_bind
from afs.config import Leasing, Settings
from afs.errors import AfsError, ConfigError
from afs.forks.provider import LocalForkProvider
from afs.models import TaskResult
from afs.optimize import new_task_id
from afs.report import to_json
from afs.sandbox.server import SandboxServer
from afs.serve import run_service
from afs.service.api import EventStreamResponse
from afs.service.client import parse_sse
from afs.service.worker import open_runtime, run_worker
from afs.store import TaskSubmission, open_store
from afs.store.codec import decode
from afs.testing import run_afs_async
from afs.web import OPENAPI_PATHS as WEB_PATHS

QUERY = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending'"
         " AND o.user_id = 42 ORDER BY o.created_at DESC")

pytestmark = pytest.mark.usefixtures("no_leaked_forks")


async def start(nursery: trio.Nursery, settings: Settings, store_db: str, workers: int = 1,
                token: str | None = None) -> str:
    configured = settings.with_(store_url=store_db, service_token=token)
    urls: list[str] = await nursery.start(partial(run_service, configured, bind="127.0.0.1:0",
                                                  workers=workers, lease_s=5))
    return next(u for u in urls if u.startswith("http://127.0.0.1"))


async def read_events(http: httpx.AsyncClient, task_id: str, last_id: int | None = None,
                      seen: Callable[[dict[str, Any]], None] = lambda e: None) -> list[dict[str, Any]]:
    """The task's SSE events, read to the end of the stream (`seen` is told of each at once)."""
    headers = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
    events = []
    async with http.stream("GET", f"/v1/tasks/{task_id}/events", headers=headers,
                           timeout=httpx.Timeout(10, read=120)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for kind, data in parse_sse(response.aiter_lines()):
            if kind == "end":
                continue  # the server closes the stream next
            event = json.loads(data)
            assert event["kind"] == kind
            events.append(event)
            seen(event)
    return events


@pytest.fixture
async def http_service(nursery: trio.Nursery, settings: Settings,
                       store_db: str) -> AsyncIterator[httpx.AsyncClient]:
    url = await start(nursery, settings, store_db, workers=1)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        yield http


async def test_submit_watch_live_events_and_look_the_result_up(http_service: httpx.AsyncClient,
                                                               sandbox: SandboxServer) -> None:
    http = http_service
    first = await http.post("/v1/tasks", json={"query": QUERY, "provider": "heuristic", "runs": 2})
    assert first.status_code == 201, first.text
    task = first.json()["task"]
    assert first.headers["location"] == f"/v1/tasks/{task['id']}" and task["status"] == "queued"
    second = await http.post("/v1/tasks", json={"query": "SELECT id FROM users WHERE id = 7",
                                                "provider": "heuristic", "runs": 1, "priority": "low"})
    assert second.status_code == 201

    events = await read_events(http, task["id"])
    kinds = [e["kind"] for e in events]
    for kind in ("task_queued", "task_started", "agents_assigned", "fork_created", "benchmark_completed",
                 "consensus_reached", "task_finished"):
        assert kind in kinds, kinds
    assert kinds[-1] == "task_finished"
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # resumable: after a reconnect with Last-Event-ID, the stream goes on from there
    again = await read_events(http, task["id"], last_id=ids[2])
    assert [e["id"] for e in again] == ids[3:]

    doc = (await http.get(f"/v1/tasks/{task['id']}")).json()
    assert doc["task"]["status"] == "completed" and doc["report"]["winner"] is not None
    result = decode(TaskResult, doc["result"])
    assert json.loads(json.dumps(to_json(result), default=str)) == doc["report"]

    second_id = second.json()["task"]["id"]
    with trio.fail_after(120):
        assert (await read_events(http, second_id))[-1]["kind"] == "task_finished"
    listed = (await http.get("/v1/tasks")).json()["tasks"]
    assert {t["id"] for t in listed} == {task["id"], second.json()["task"]["id"]}
    assert [t["id"] for t in (await http.get("/v1/tasks?status=completed&limit=1")).json()["tasks"]]
    assert (await http.get("/v1/forks")).json() == {"forks": []}
    health = (await http.get("/healthz")).json()
    assert health["ok"] and sum(health["tasks"].values()) == 2


@pytest.mark.parametrize(("body", "field"), [
    ({}, "query"),
    ({"query": "UPDATE orders SET status = 'x'"}, "query"),
    ({"query": QUERY, "priority": "urgent"}, "priority"),
    ({"query": QUERY, "provider": "oracle"}, "provider"),
    ({"query": QUERY, "type": "magic"}, "type"),
    ({"query": QUERY, "weights": {"performance": 0.9, "storage": 0.9}}, "weights"),
    ({"query": QUERY, "weights": {"performance": "a lot"}}, "weights"),
    ({"query": QUERY, "runs": 0}, "runs"),
    ({"query": QUERY, "colour": "blue"}, "colour"),
    ({"query": QUERY, "source": "Bad-Name;"}, "source"),
    ({"query": QUERY, "source": "afs_demo", "dsn": "postgresql:///x"}, "dsn"),
    ([QUERY], "body"),
])
async def test_bad_requests_get_4xx_naming_the_field_and_write_nothing(
        nursery: trio.Nursery, settings: Settings, store_db: str, body: Any, field: str) -> None:
    url = await start(nursery, settings, store_db, workers=0)
    async with httpx.AsyncClient(base_url=url) as http:
        response = await http.post("/v1/tasks", json=body)
        assert 400 <= response.status_code < 500
        assert response.json()["field"] == field and response.json()["error"]
        not_json = await http.post("/v1/tasks", content=b"{not json",
                                   headers={"Content-Type": "application/json"})
        assert not_json.status_code == 400 and not_json.json()["field"] == "body"
        assert (await http.get("/v1/tasks")).json() == {"tasks": []}
        missing = await http.get("/v1/tasks/nosuch")
        assert missing.status_code == 404 and missing.json()["field"] == "id"
        assert (await http.get("/v1/tasks/nosuch/events")).status_code == 404
        assert (await http.get("/v1/tasks?status=weird")).json()["field"] == "status"


async def test_cancel_a_queued_and_a_running_task(nursery: trio.Nursery, settings: Settings,
                                                  store_db: str, provider: LocalForkProvider) -> None:
    idle = await start(nursery, settings, store_db, workers=0)
    async with httpx.AsyncClient(base_url=idle) as http:
        task = (await http.post("/v1/tasks", json={"query": QUERY})).json()["task"]
        cancelled = await http.delete(f"/v1/tasks/{task['id']}")
        assert cancelled.status_code == 200 and cancelled.json()["task"]["status"] == "cancelled"

    busy = await start(nursery, settings, store_db, workers=1)
    async with httpx.AsyncClient(base_url=busy, timeout=60) as http:
        task = (await http.post("/v1/tasks", json={"query": QUERY, "priority": "high",
                                                   "provider": "heuristic"})).json()["task"]
        forked = trio.Event()
        events: list[dict[str, Any]] = []

        async def watch() -> None:
            events.extend(await read_events(
                http, task["id"], seen=lambda e: forked.set() if e["kind"] == "fork_created" else None))

        async with trio.open_nursery() as watching:
            watching.start_soon(watch)
            with trio.fail_after(60):
                await forked.wait()
            live = (await http.get("/v1/forks")).json()["forks"]
            assert any(f["task_id"] == task["id"] for f in live)
            cancelling = await http.delete(f"/v1/tasks/{task['id']}")
            assert cancelling.status_code == 202 and cancelling.json()["task"]["cancel_requested"]
        assert events[-1]["kind"] == "task_finished" and events[-1]["data"]["status"] == "cancelled"
        assert "cancel_requested" in [e["kind"] for e in events]
        assert (await http.get(f"/v1/tasks/{task['id']}")).json()["task"]["status"] == "cancelled"
        assert (await http.get("/v1/forks")).json() == {"forks": []}
    left = [f["name"] for f in (await provider.list_services())["forks"] if task["id"] in f["name"]]
    assert left == []


async def test_a_token_is_required_when_configured_and_off_loopback(
        nursery: trio.Nursery, settings: Settings, store_db: str) -> None:
    url = await start(nursery, settings, store_db, workers=0, token="s3cret")
    async with httpx.AsyncClient(base_url=url) as http:
        refused = await http.get("/v1/tasks")
        assert refused.status_code == 401 and refused.json()["field"] == "Authorization"
        wrong = await http.get("/v1/tasks", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert (await http.post("/v1/tasks", json={"query": QUERY})).status_code == 401
        assert (await http.get("/v1/tasks")).status_code == 401
        assert (await http.get("/v1/tasks", headers={"Authorization": "Bearer s3cret"})).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
    with pytest.raises(ConfigError, match="token"):
        check_bind("0.0.0.0:8470", None)
    assert check_bind("0.0.0.0:8470", "s3cret") == ("0.0.0.0", 8470)
    assert check_bind("127.0.0.1:8470", None) == ("127.0.0.1", 8470)
    assert check_bind("[::1]:8470", None) == ("::1", 8470)
    refused_start = await trio.run_process(
        [sys.executable, "-m", "afs", "serve", "--bind", "0.0.0.0:0"], capture_stdout=True,
        capture_stderr=True, check=False, env={**os.environ, "AFS_SERVICE_TOKEN": ""})
    assert refused_start.returncode == 2 and b"without a token" in refused_start.stderr


async def test_the_openapi_document_names_every_route(nursery: trio.Nursery, settings: Settings,
                                                      store_db: str) -> None:
    url = await start(nursery, settings, store_db, workers=0)
    async with httpx.AsyncClient(base_url=url) as http:
        doc = (await http.get("/v1/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {"/v1/tasks", "/v1/tasks/{id}", "/v1/tasks/{id}/events", "/v1/forks",
                                 "/healthz", "/v1/tasks/{id}/apply", *WEB_PATHS}
    assert set(doc["paths"]["/v1/tasks"]) == {"get", "post"}


async def afs(*args: str, store_db: str) -> subprocess.CompletedProcess[bytes]:
    return await run_afs_async(*args, AFS_STORE_URL=store_db)


async def test_optimize_with_server_and_show_give_the_same_report(
        nursery: trio.Nursery, settings: Settings, store_db: str, sandbox: SandboxServer) -> None:
    url = await start(nursery, settings, store_db, workers=1)
    remote = await afs("optimize", "--server", url, "--query", QUERY, "--provider", "heuristic",
                       "--runs", "2", "--json", store_db=store_db)
    assert remote.returncode == 0, remote.stderr.decode()
    doc = json.loads(remote.stdout)
    assert doc["status"] == "completed"
    shown = await afs("show", doc["task_id"], "--json", store_db=store_db)
    assert shown.returncode == 0 and json.loads(shown.stdout) == doc
    history = await afs("history", "--json", "--status", "completed", store_db=store_db)
    assert [t["id"] for t in json.loads(history.stdout)] == [doc["task_id"]]
    [row] = json.loads(history.stdout)  # the winner and its gain, in the list and as text
    assert doc["winner"] is not None and row["winner"]["improvement_pct"] == doc["winner"]["improvement_pct"]
    listed = await afs("history", "--status", "completed", store_db=store_db)
    header, line = listed.stdout.decode().splitlines()
    assert "winner" in header and "gain" in header
    assert line.startswith(doc["task_id"]) and doc["winner"]["proposal_type"] in line
    assert f"{doc['winner']['improvement_pct']:.1f} %" in line
    events = await afs("events", doc["task_id"], "--json", store_db=store_db)
    kinds = [json.loads(line)["kind"] for line in events.stdout.decode().splitlines()]
    assert kinds[0] == "task_queued" and kinds[-1] == "task_finished"
    followed = await afs("events", doc["task_id"], "--follow", store_db=store_db)  # ended: returns
    assert followed.returncode == 0 and len(followed.stdout.decode().splitlines()) == len(kinds)
    text = await afs("show", doc["task_id"], store_db=store_db)
    assert text.stdout.decode().startswith(f"AFS task {doc['task_id']}: completed")
    bad = await afs("optimize", "--server", url, "--query", QUERY, "--weights", "performance=1",
                    "--priority", "high", "--runs", "0", store_db=store_db)
    assert bad.returncode == 2
    unknown = await afs("show", "nosuch", store_db=store_db)
    assert unknown.returncode == 2 and b"no task" in unknown.stderr


async def test_a_worker_killed_mid_task_is_recovered_and_another_finishes_it(
        settings: Settings, store_db: str, sandbox: SandboxServer, provider: LocalForkProvider) -> None:
    async with open_store(store_db) as store:
        task = await store.submit(TaskSubmission(task_id=new_task_id(), query=QUERY, source="afs_demo",
                                                 dsn=None, task_type="query_optimization", priority="high",
                                                 provider="heuristic", weights=None, runs=2))
        worker = await trio.lowlevel.open_process(
            [sys.executable, "-m", "afs", "worker", "--name", "doomed", "--lease", "2", "--poll", "0.1"],
            env={**os.environ, "AFS_STORE_URL": store_db}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        children: list[psutil.Process] = []
        try:
            with trio.fail_after(60):
                # polling the store: the worker is another process
                while not any(e.kind == "fork_created" for e in await store.events(task.id)):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            children = psutil.Process(worker.pid).children(recursive=True)
            os.kill(worker.pid, signal.SIGKILL)  # mid-task: no cleanup runs in that process
            with trio.fail_after(5):
                await worker.wait()
            held = await store.get(task.id)
            assert held.status == "running" and held.worker == "doomed"
            left = [f["name"] for f in (await provider.list_services())["forks"] if task.id in f["name"]]
            assert left, "the killed worker's forks should still exist before recovery"

            async with open_runtime(settings, store_db, leasing=Leasing(lease_s=2)) as rt:
                with trio.fail_after(180):
                    assert await run_worker(rt, "rescuer", poll_s=0.1, max_tasks=1) == 1
        finally:
            if worker.returncode is None:
                worker.kill()
                with trio.move_on_after(5):
                    await worker.wait()
            for child in children:  # the killed worker's fork server exits when its stdin closes
                try:
                    child.wait(10)
                except psutil.TimeoutExpired:
                    child.kill()
        done = await store.get(task.id)
        assert done.status == "completed" and done.attempts == 2
        events = await store.events(task.id)
        kinds = [e.kind for e in events]
        expired = next(e for e in events if e.kind == "lease_expired")
        assert expired.data["worker"] == "doomed" and expired.data["recovered_by"] == "rescuer"
        assert kinds.index("lease_expired") < kinds.index("task_requeued") < len(kinds) - 1
        assert [e.data["worker"] for e in events if e.kind == "task_started"] == ["doomed", "rescuer"]
        result = await store.result(task.id)
        assert result is not None and result.status == "completed"
        assert await store.forks(live=True) == []
    names = {f["name"] for f in (await provider.list_services())["forks"]}
    assert not names & set(left)


async def test_resume_runs_a_cancelled_task_again(settings: Settings, store_db: str,
                                                  sandbox: SandboxServer) -> None:
    async with open_store(store_db) as store:
        task = await store.submit(TaskSubmission(task_id=new_task_id(), query=QUERY, source="afs_demo",
                                                 dsn=None, task_type="query_optimization", priority="normal",
                                                 provider="heuristic", weights=None, runs=1))
        await store.cancel(task.id)
        resumed = await afs("resume", task.id, "--json", store_db=store_db)
        assert resumed.returncode == 0, resumed.stderr.decode()
        assert json.loads(resumed.stdout)["status"] == "completed"
        assert (await store.get(task.id)).status == "completed"
        again = await afs("resume", task.id, store_db=store_db)  # completed: nothing to resume
        assert again.returncode == 2 and b"only a failed" in again.stderr and b"task resumes" in again.stderr


async def test_ctrl_c_on_a_worker_gives_its_task_back(store_db: str, sandbox: SandboxServer,
                                                      provider: LocalForkProvider) -> None:
    async with open_store(store_db) as store:
        task = await store.submit(TaskSubmission(task_id=new_task_id(), query=QUERY, source="afs_demo",
                                                 dsn=None, task_type="query_optimization", priority="high",
                                                 provider="heuristic", weights=None, runs=2))
        worker = await trio.lowlevel.open_process(
            [sys.executable, "-m", "afs", "worker", "--name", "polite", "--poll", "0.1"],
            env={**os.environ, "AFS_STORE_URL": store_db}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)
        try:
            with trio.fail_after(60):
                # polling the store: the worker is another process
                while not any(e.kind == "fork_created" for e in await store.events(task.id)):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            worker.send_signal(signal.SIGINT)
            with trio.fail_after(60):
                code = await worker.wait()
            assert worker.stderr is not None
            stderr = b""
            while chunk := await worker.stderr.receive_some():
                stderr += chunk
            assert code == 130, stderr.decode()[-3000:]
        finally:
            if worker.returncode is None:
                worker.kill()
                with trio.move_on_after(5):
                    await worker.wait()
        back = await store.get(task.id)
        assert back.status == "queued" and back.worker is None and back.attempts == 0
        assert (await store.events(task.id))[-1].kind == "task_requeued"
    assert not [f for f in (await provider.list_services())["forks"] if task.id in f["name"]]


async def test_a_worker_reaches_forks_over_streamable_http_with_a_token(
        nursery: trio.Nursery, settings: Settings, store_db: str, sandbox: SandboxServer,
        provider: LocalForkProvider) -> None:
    from afs.errors import ForkServerError
    from afs.forks.client import open_fork_client
    from afs.forks.server import serve_http

    served = settings.with_(fork_ttl_seconds=600)  # the fork server's own settings
    (url,) = [u for u in await nursery.start(serve_http, provider, served, "127.0.0.1:0", "f0rks")
              if u.startswith("http://127.0.0.1")]
    remote = settings.with_(fork_server_url=url, fork_server_token="f0rks",
                            fork_server_command=("false",),  # no local fork server to fall back on
                            source_server_url=sandbox.dsn("postgres"))  # the sources, by URL
    async with open_fork_client(remote) as client:
        assert "afs_demo" in {s["name"] for s in (await client.list_services())["sources"]}
    with pytest.raises(ForkServerError, match="refused"):
        async with open_fork_client(settings.with_(fork_server_url=url, fork_server_token="wrong")) as c:
            await c.list_services()
    async with open_store(store_db) as store:
        task = await store.submit(TaskSubmission(task_id=new_task_id(), query=QUERY, source="afs_demo",
                                                 dsn=None, task_type="query_optimization", priority="normal",
                                                 provider="heuristic", weights=None, runs=1))
        async with open_runtime(remote, store_db, leasing=Leasing(lease_s=10)) as rt:
            with trio.fail_after(120):
                assert await run_worker(rt, "remote", poll_s=0.1, max_tasks=1) == 1
        done = await store.get(task.id)
        assert done.status == "completed", done.error
        forks = await store.forks(live=False, task_id=task.id)
        assert forks and all(f["destroyed_at"] for f in forks)


async def submitted(store: Any, priority: str = "normal") -> Any:
    return await store.submit(TaskSubmission(task_id=new_task_id(), query=QUERY, source="afs_demo", dsn=None,
                                             task_type="query_optimization", priority=priority,
                                             provider="heuristic", weights=None, runs=1))


async def test_an_appended_event_wakes_the_listeners_of_its_task_only(store_db: str) -> None:
    from afs.events import Event

    async with open_store(store_db) as store, open_store(store_db) as writer:
        mine, other = await submitted(store), await submitted(store)
        async with store.listen() as listener:
            await writer.append_events([Event("note", other.id)])  # another process's write, another task
            with trio.move_on_after(0.5) as quiet:
                await listener.wait_for(mine.id)
            assert quiet.cancelled_caught, "an event of another task woke the listener"
            await writer.append_events([Event("note", mine.id)])
            with trio.fail_after(30):  # the notification, not a poll: wait_for never reads the table
                await listener.wait_for(mine.id)
            await writer.cancel(mine.id)  # a status change appends its event in the same transaction
            with trio.fail_after(30):
                await listener.wait_for(mine.id)
            await writer.conn.execute("SELECT pg_terminate_backend(%s)", (listener.raw.info.backend_pid,))
            with trio.fail_after(30), pytest.raises(AfsError):  # lost: said at once (the stream polls)
                await listener.wait_for(mine.id)


async def test_sse_streams_events_written_by_another_process_and_resumes_after_one(
        nursery: trio.Nursery, settings: Settings, store_db: str) -> None:
    from afs.events import Event

    url = await start(nursery, settings, store_db, workers=0)  # nobody runs the task: we write its events
    async with open_store(store_db) as writer, httpx.AsyncClient(base_url=url, timeout=60) as http:
        task = await submitted(writer)
        opened, arrived = trio.Event(), trio.Event()

        def note(event: dict[str, Any]) -> None:
            opened.set()
            if event["kind"] == "note":
                arrived.set()

        async with trio.open_nursery() as watchers:
            events: list[list[dict[str, Any]]] = []

            async def watch() -> None:
                events.append(await read_events(http, task.id, seen=note))

            watchers.start_soon(watch)
            with trio.fail_after(30):
                await opened.wait()  # the stream is open: task_queued came through
            await writer.append_events([Event("note", task.id, data={"n": 1})])
            with trio.fail_after(30):
                await arrived.wait()
            await writer.cancel(task.id)  # queued: cancelled at once, the stream ends
        kinds = [e["kind"] for e in events[0]]
        assert kinds == ["task_queued", "note", "task_finished"]
        resumed = await read_events(http, task.id, last_id=events[0][0]["id"])
        assert [e["kind"] for e in resumed] == ["note", "task_finished"]


async def test_serve_without_workers_still_recovers_the_tasks_of_dead_workers(
        nursery: trio.Nursery, settings: Settings, store_db: str, provider: LocalForkProvider) -> None:
    from afs.forks.naming import fork_name

    async with open_store(store_db) as store:
        task = await submitted(store)
        claimed = await store.claim("remote-worker-gone", lease_s=1, task_id=task.id)
        assert claimed is not None
        fork = await provider.fork("afs_demo", fork_name("strategist", task.id))  # left by the dead worker
        configured = settings.with_(store_url=store_db)
        await nursery.start(partial(run_service, configured, bind="127.0.0.1:0", workers=0, lease_s=2))
        with trio.fail_after(90):
            while (await store.get(task.id)).status != "queued":  # noqa: ASYNC110 - another task writes it
                await trio.sleep(0.1)
        expired = next(e for e in await store.events(task.id) if e.kind == "lease_expired")
        assert expired.data["worker"] == "remote-worker-gone"
        assert expired.data["recovered_by"].startswith("serve-recovery-")
        requeued = next(e for e in await store.events(task.id) if e.kind == "task_requeued")
        assert "1 fork(s) collected" in requeued.data["reason"]
    assert fork.name not in {f["name"] for f in (await provider.list_services())["forks"]}


async def test_a_client_that_leaves_mid_stream_leaves_no_listening_connection(
        nursery: trio.Nursery, settings: Settings, store_db: str) -> None:
    url = await start(nursery, settings, store_db, workers=0)
    listening = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                 " AND query = 'LISTEN afs_events'")
    async with open_store(store_db) as store, httpx.AsyncClient(base_url=url, timeout=60) as http:
        task = await submitted(store)
        for _ in range(3):
            with trio.CancelScope() as leave:
                async with http.stream("GET", f"/v1/tasks/{task.id}/events") as response:
                    async for line in response.aiter_lines():
                        if line.startswith("id:"):  # the first event came: the stream listens
                            assert await store.conn.fetchval(listening) >= 1
                            leave.cancel()  # and the client goes away
        with trio.fail_after(30):
            while await store.conn.fetchval(listening):  # noqa: ASYNC110 - the server closes it
                await trio.sleep(0.05)
        await store.cancel(task.id)


@pytest.mark.parametrize("leaves", ["cancelled", "disconnected"])
async def test_an_event_stream_left_at_a_yield_is_closed_at_once(leaves: str) -> None:
    # the client goes away while the response sends an event, i.e. while the generator waits at a
    # `yield` (the race a browser that closes its page can win): the generator is closed then and
    # there (its `finally` ran), not left to the garbage collector with its listening connection
    closed: list[str] = []

    async def events() -> Any:
        try:
            while True:
                yield "data: {}\n\n"
        finally:
            closed.append("closed")

    stream = events()
    messages: list[object] = []

    with trio.CancelScope() as scope:
        async def send(message: object) -> None:
            messages.append(message)
            if len(messages) == 3:  # the start, one event, and during the next one the client goes
                if leaves == "disconnected":
                    raise OSError("the client went away")
                scope.cancel()
                await trio.lowlevel.checkpoint()

        response = EventStreamResponse(stream, media_type="text/event-stream")
        try:
            await response.stream_response(send)
        except OSError:
            assert leaves == "disconnected"
    assert len(messages) == 3 and closed == ["closed"]


def test_a_reader_that_leaves_early_ends_the_command_quietly(store_db: str) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `afs history | head` once head has gone: every write fails (EPIPE)
    try:
        done = subprocess.run([sys.executable, "-m", "afs", "history", "--limit", "5"], stdout=write_end,
                              stderr=subprocess.PIPE, check=False, timeout=120,
                              env={**os.environ, "AFS_STORE_URL": store_db})
    finally:
        os.close(write_end)
    assert done.returncode == 128 + signal.SIGPIPE
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr, done.stderr.decode()
