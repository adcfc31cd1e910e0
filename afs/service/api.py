"""The HTTP API of `afs serve` (assembled by afs.serve): the task routes, on Starlette.

    POST   /v1/tasks              submit {query, source | dsn, priority, type, provider, weights, runs}
    GET    /v1/tasks              the newest tasks (?status=…&limit=…)
    GET    /v1/tasks/{id}         one task, its report and its result
    GET    /v1/tasks/{id}/events  Server-Sent Events, live; resumable with Last-Event-ID
    DELETE /v1/tasks/{id}         cancel (a running task's agents destroy their forks)
    POST   /v1/tasks/{id}/apply   apply the winner (afs.apply.api, added by afs.serve)
    GET    /v1/forks              forks the store knows to be alive, with their task and agent
    GET    /healthz               liveness, tasks by status, running tasks per agent (no token)
    GET    /v1/openapi.json       this API, described

Bad requests get a 4xx JSON body {"error": …, "field": …}; a task is written
whole or not at all. On loopback no token is needed (but for an apply); on any
other address the server refuses to start without AFS_SERVICE_TOKEN, and requests
without `Authorization: Bearer <token>` get 401.

What a page in the user's browser could make it do is refused first, on every route
(afs.asgi.guard_requests): a Host that is neither loopback, the address it listens on nor
in AFS_SERVICE_HOSTS (421: DNS rebinding), a state-changing request from another origin
(403), a body that is not `application/json` (415) or larger than AFS_SERVICE_MAX_BODY
(413, counted as it arrives). A task request is read by afs.task.read_query, the check
the command line uses, in a worker thread of its own: a slow one never holds up /healthz.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import structlog
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Send

from afs.asgi import BodyError, guard_requests, parse_json, require_token
from afs.config import Settings
from afs.errors import AfsError, InputError, UnknownTaskError
from afs.models import StatementParameters
from afs.optimize import new_task_id
from afs.store import Store, TaskSubmission
from afs.store.store import STATUSES
from afs.task import (
    MAX_RUNS,
    PRIORITIES,
    PROVIDERS,
    TASK_TYPES,
    check_choice,
    check_runs,
    check_workload,
    read_query,
    read_weights,
)

log = structlog.get_logger(__name__)

_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
EVENT_FALLBACK_S = 1.0  # the SSE stream reads the store this often even without a notification
KEEPALIVE_S = 15.0
PARSING_THREADS = 1  # task requests read at once: each holds the GIL for up to a second or two


class FieldError(Exception):
    def __init__(self, field: str, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


def _error(status: int, message: str, field: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status)


def read_submission(raw: bytes, default_runs: int) -> dict[str, Any]:
    """A POST /v1/tasks body, read and checked (CPU-bound: called in a worker thread);
    FieldError naming the first bad field (400 for a body that is not JSON text)."""
    try:
        body = parse_json(raw)
    except BodyError as exc:
        raise FieldError(exc.field, str(exc), status=400) from None
    return parse_submission(body, default_runs)


def parse_submission(body: Any, default_runs: int) -> dict[str, Any]:
    """Check a POST /v1/tasks body; raises FieldError naming the first bad field."""
    if not isinstance(body, dict):
        raise FieldError("body", "expected a JSON object")
    known = {"query", "source", "dsn", "priority", "type", "provider", "weights", "runs", "parameters"}
    for key in body:
        if key not in known:
            raise FieldError(key, f"unknown field (known: {', '.join(sorted(known))})")
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise FieldError("query", "required: one read-only SELECT, as a string")
    try:
        read_query(query)  # the command line's check: text, size, depth, safety, tables
    except InputError as exc:
        raise FieldError("query", str(exc)) from None
    source, dsn = body.get("source"), body.get("dsn")
    if source is not None and dsn is not None:
        raise FieldError("dsn", "give a source (a sandbox database) or a dsn, not both")
    if source is not None and (not isinstance(source, str) or not _DB_NAME.match(source)):
        raise FieldError("source", "a database name in the sandbox, e.g. afs_demo")
    if dsn is not None and (not isinstance(dsn, str) or not dsn.strip()):
        raise FieldError("dsn", "a libpq connection string or URL of a database imported in the sandbox")
    choices = {"priority": (PRIORITIES, "normal"), "type": (TASK_TYPES, "query_optimization"),
               "provider": (PROVIDERS, "auto")}
    picked: dict[str, str] = {}
    field = "runs"
    try:  # afs.task: the checks `afs optimize` makes of its options
        for field, (allowed, default) in choices.items():
            picked[field] = check_choice(body.get(field, default), allowed, field)
        field = "weights"
        weights = read_weights(body.get("weights"), field)
        field = "runs"
        runs = check_runs(body.get("runs", default_runs), field)
    except InputError as exc:
        raise FieldError(field, str(exc)) from None
    return {"query": query, "source": source if source or dsn else None, "dsn": dsn,
            "task_type": picked["type"], "priority": picked["priority"],
            "provider": picked["provider"], "weights": weights, "runs": runs,
            "parameters": None if body.get("parameters") is None
            else parse_parameters(body["parameters"], query)}


def parse_parameters(data: Any, query: str) -> StatementParameters:
    """The `parameters` of a submission (afs.models.StatementParameters as JSON: the batch
    job's filled sets): the first set's query is the task's query, and every set's
    substitutions must be literals that find their place in it (afs.params)."""
    from afs.params.family import apply_parameters
    from afs.store.codec import decode

    try:
        parsed = decode(StatementParameters, data)
    except (ValueError, TypeError) as exc:
        raise FieldError("parameters", f"expected {{statement, sets: [{{label, substitutions,"
                         f" values, query}}]}}: {exc}") from None
    if not parsed.sets:
        raise FieldError("parameters", "at least one parameter set (the first is the query's own)")
    if parsed.sets[0].query and parsed.sets[0].query != query:
        raise FieldError("parameters", "the first set's query must be the task's query")
    for n, pset in enumerate(parsed.sets):
        try:
            placed = apply_parameters(query, pset)
        except InputError as exc:
            raise FieldError("parameters", f"set {n + 1}: {exc}") from None
        if placed is None:
            raise FieldError("parameters", f"set {n + 1}: a substitution's literal is not in the query")
    if parsed.workload is not None:  # the writes a new index's cost is measured on (afs.task)
        try:
            check_workload(parsed.workload, read_query(query)[1].tables)
        except InputError as exc:
            raise FieldError("parameters", str(exc)) from None
    return parsed


def build_app(store: Store, settings: Settings, token: str | None, hosts: tuple[str, ...] = (),
              routes: Sequence[BaseRoute] = (), paths: Mapping[str, Any] | None = None) -> Any:
    """The ASGI application: Starlette, behind the token check when there is a token, behind
    the request guard (afs.asgi.guard_requests: Host, Origin, JSON, body size) always.
    `hosts`: names it answers to besides loopback and settings.service_hosts. `routes` and
    their OpenAPI `paths`: what the assembly adds (afs.serve: the apply route, the monitor)."""
    described = {**OPENAPI, "paths": {**OPENAPI["paths"], **(paths or {})}}
    parsing = trio.CapacityLimiter(PARSING_THREADS)  # its own: the store's threads stay free

    async def submit(request: Request) -> Response:
        raw = await request.body()  # bounded by the guard
        try:
            fields = await trio.to_thread.run_sync(read_submission, raw, settings.runs, limiter=parsing)
        except FieldError as exc:
            return _error(exc.status, str(exc), exc.field)
        if fields["source"] is None and fields["dsn"] is None:
            fields["source"] = settings.demo_database
        task = await store.submit(TaskSubmission(task_id=new_task_id(), **fields))
        return JSONResponse({"task": task.public(), "events": f"/v1/tasks/{task.id}/events"},
                            status_code=201, headers={"Location": f"/v1/tasks/{task.id}"})

    async def list_tasks(request: Request) -> Response:
        statuses = request.query_params.getlist("status")
        bad = [s for s in statuses if s not in STATUSES]
        if bad:
            return _error(400, f"unknown status {', '.join(bad)}", "status")
        try:
            limit = int(request.query_params.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 1000:
            return _error(400, "an integer from 1 to 1000", "limit")
        tasks = await store.tasks(limit=limit, statuses=statuses)
        return JSONResponse({"tasks": [t.public() for t in tasks]})

    async def get_task(request: Request) -> Response:
        task = await store.get(request.path_params["id"])
        report, result = await store.documents(task.id)
        return JSONResponse({"task": task.public(), "report": report, "result": result})

    async def cancel_task(request: Request) -> Response:
        task = await store.cancel(request.path_params["id"])
        return JSONResponse({"task": task.public()}, status_code=200 if task.finished else 202)

    async def task_events(request: Request) -> Response:
        task_id = request.path_params["id"]
        await store.get(task_id)  # 404 before the stream starts
        raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        try:
            after = int(raw)
        except ValueError:
            return _error(400, "an event id (an integer)", "Last-Event-ID")
        return EventStreamResponse(_event_stream(store, task_id, after), media_type="text/event-stream",
                                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def list_forks(request: Request) -> Response:
        live = request.query_params.get("all") is None
        return JSONResponse({"forks": await store.forks(live=live)})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True, "tasks": await store.counts(), "agents": await store.agent_load(),
                             "store": await store.identity()})  # which store (afs batch --server)

    async def openapi(request: Request) -> Response:
        return JSONResponse(described)

    async def unknown_task(request: Request, exc: Exception) -> Response:
        return _error(404, str(exc), "id")

    async def bad_input(request: Request, exc: Exception) -> Response:
        return _error(409, str(exc))

    app = Starlette(routes=[
        Route("/v1/tasks", submit, methods=["POST"]),
        Route("/v1/tasks", list_tasks, methods=["GET"]),
        Route("/v1/tasks/{id}", get_task, methods=["GET"]),
        Route("/v1/tasks/{id}", cancel_task, methods=["DELETE"]),
        Route("/v1/tasks/{id}/events", task_events, methods=["GET"]),
        Route("/v1/forks", list_forks, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/v1/openapi.json", openapi, methods=["GET"]),
        *routes,
    ], exception_handlers={UnknownTaskError: unknown_task, InputError: bad_input})
    guarded = app if token is None else require_token(app, token, browser_login=True)
    return guard_requests(guarded, hosts=(*settings.service_hosts, *hosts),
                          max_body=settings.service_max_body_bytes)


class EventStreamResponse(StreamingResponse):
    """A StreamingResponse that closes its generator however the stream ends. Starlette's
    leaves a generator that a departed client (or a shutdown) interrupted at a `yield` to the
    garbage collector: its listening connection stays open until then, and trio warns."""

    def __init__(self, events: AsyncGenerator[str, None], **kwargs: Any) -> None:
        super().__init__(events, **kwargs)
        self._events = events

    async def stream_response(self, send: Send) -> None:
        async with aclosing(self._events):
            await super().stream_response(send)


async def _event_stream(store: Store, task_id: str, after: int) -> AsyncGenerator[str, None]:
    """The task's events after `after`, then live until it ends: woken by the store's NOTIFY
    of each appended event (`Store.listen`), and reading anyway every EVENT_FALLBACK_S, so a
    lost notification (or a listener that broke) costs at most that."""
    last, quiet = after, 0.0
    async with store.listen() as listener:  # listening before the first read: nothing is missed
        while True:
            events = await store.events(task_id, after=last)
            for e in events:
                last = e.id
                yield f"id: {e.id}\nevent: {e.kind}\ndata: {json.dumps(e.public(), default=str)}\n\n"
            if events:
                quiet = 0.0
                continue
            if (await store.get(task_id)).finished and not await store.events(task_id, after=last):
                yield "event: end\ndata: {}\n\n"
                return
            started = trio.current_time()
            try:
                with trio.move_on_after(EVENT_FALLBACK_S):
                    await listener.wait_for(task_id)
            except AfsError as exc:  # the listening connection broke: read on the fallback's clock
                log.warning("event_listener_failed", task_id=task_id, error=str(exc))
                await trio.sleep(EVENT_FALLBACK_S)
            quiet += trio.current_time() - started
            if quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield ": keep-alive\n\n"


_TASK_BODY = {
    "type": "object", "required": ["query"], "additionalProperties": False,
    "properties": {
        "query": {"type": "string", "description": "one read-only SELECT"},
        "source": {"type": "string", "description": "a database in the sandbox (default afs_demo)"},
        "dsn": {"type": "string", "description": "a database imported with `afs sandbox import`"},
        "priority": {"enum": list(PRIORITIES)}, "type": {"enum": list(TASK_TYPES)},
        "provider": {"enum": list(PROVIDERS)},
        "weights": {"type": "object", "additionalProperties": {"type": "number"},
                    "description": "consensus weights: performance, storage, complexity, risk (sum 1)"},
        "runs": {"type": "integer", "minimum": 1, "maximum": MAX_RUNS},
    },
}
_ERROR = {"description": "bad request", "content": {"application/json": {"schema": {
    "type": "object", "properties": {"error": {"type": "string"}, "field": {"type": "string"}}}}}}
_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "AFS service", "version": "1",
             "description": "Submit slow queries, watch the agents work, look results up."},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "security": [{"bearer": []}],
    "paths": {
        "/v1/tasks": {
            "post": {"summary": "submit a task", "requestBody": {"required": True, "content": {
                "application/json": {"schema": _TASK_BODY}}},
                "responses": {"201": {"description": "queued"}, "400": _ERROR, "413": _ERROR,
                              "415": _ERROR, "422": _ERROR}},
            "get": {"summary": "the newest tasks", "parameters": [
                {"name": "status", "in": "query", "schema": {"enum": list(STATUSES)}},
                {"name": "limit", "in": "query", "schema": {"type": "integer"}}],
                "responses": {"200": {"description": "tasks"}, "400": _ERROR}},
        },
        "/v1/tasks/{id}": {
            "parameters": _ID,
            "get": {"summary": "a task, its report and result", "responses": {
                "200": {"description": "the task"}, "404": _ERROR}},
            "delete": {"summary": "cancel a task; its forks are destroyed", "responses": {
                "200": {"description": "cancelled"}, "202": {"description": "cancelling"},
                "404": _ERROR}},
        },
        "/v1/tasks/{id}/events": {
            "parameters": _ID,
            "get": {"summary": "the task's events as Server-Sent Events (Last-Event-ID resumes)",
                    "responses": {"200": {"description": "text/event-stream"}, "404": _ERROR}},
        },
        "/v1/forks": {"get": {"summary": "live forks, with their task and agent",
                              "responses": {"200": {"description": "forks"}}}},
        "/healthz": {"get": {"summary": "liveness", "security": [],
                             "responses": {"200": {"description": "ok"}}}},
    },
}
