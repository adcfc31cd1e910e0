"""The monitor's routes: the page shell, its static files and the JSON the API lacked.

Mounted by afs.serve (into afs.service.api.build_app) next to the API, behind the same guards:
the token check and afs.asgi.guard_requests (Host, Origin, JSON bodies). The pages' script
(static/app.js) sends its one POST as `application/json` from the page's own origin, so the
guards let it through.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from afs.apply import audit
from afs.batch.job import batches, stored_batch
from afs.config import Settings
from afs.errors import InputError
from afs.store import Store
from afs.web import pages
from afs.web.queries import board, task_report

STATIC = Path(__file__).parent / "static"
PAGES = ("/", "/tasks/{id}", "/batches", "/batches/{id}", "/audit")
MAX_EVENTS = 5000


def _error(status: int, message: str, field: str) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


def _limit(request: Request, default: int) -> int | None:
    try:
        limit = int(request.query_params.get("limit", str(default)))
    except ValueError:
        return None
    return limit if 1 <= limit <= 1000 else None


def web_routes(store: Store, settings: Settings) -> list[BaseRoute]:
    """The pages (one HTML shell; static/app.js draws each from the JSON API) and their JSON."""
    del settings  # the pages read everything through the store

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def board_page(request: Request) -> Response:  # the first render, on the server (pages)
        return HTMLResponse(pages.shell(pages.board_page(await board(store, 50))),
                            headers={"Cache-Control": "no-cache"})

    async def task_page(request: Request) -> Response:
        try:
            task = await store.get(request.path_params["id"])
        except InputError as exc:  # unknown: the shell says so (the script says it again)
            return HTMLResponse(pages.shell(f'<div class="notice fail">{escape(str(exc))}</div>'),
                                headers={"Cache-Control": "no-cache"})
        events = [e.public() for e in await store.events(task.id, limit=MAX_EVENTS)]
        html = pages.task_page(task.public(), events, await task_report(store, task.id))
        return HTMLResponse(pages.shell(html), headers={"Cache-Control": "no-cache"})

    async def board_json(request: Request) -> Response:
        limit = _limit(request, 50)
        if limit is None:
            return _error(400, "an integer from 1 to 1000", "limit")
        return JSONResponse({"tasks": await board(store, limit)})

    async def log_json(request: Request) -> Response:
        task = await store.get(request.path_params["id"])  # 404 (UnknownTaskError) first
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            return _error(400, "an event id (an integer)", "after")
        events = await store.events(task.id, after=after, limit=MAX_EVENTS)
        return JSONResponse({"task": task.public(), "events": [e.public() for e in events],
                             "more": len(events) == MAX_EVENTS}, headers={"Cache-Control": "no-cache"})

    async def batches_json(request: Request) -> Response:
        limit = _limit(request, 50)
        if limit is None:
            return _error(400, "an integer from 1 to 1000", "limit")
        return JSONResponse({"batches": await batches(store, limit)})

    async def batch_json(request: Request) -> Response:
        batch_id = request.path_params["id"]
        try:
            report, markdown = await stored_batch(store, batch_id)
        except InputError as exc:
            return _error(404, str(exc), "id")
        return JSONResponse({"id": batch_id, "status": "finished" if report else "running",
                             "report": report, "markdown": markdown})

    async def audit_json(request: Request) -> Response:
        limit = _limit(request, 100)
        if limit is None:
            return _error(400, "an integer from 1 to 1000", "limit")
        rows = await audit.entries(store, request.query_params.get("task") or None, limit)
        return JSONResponse({"entries": rows})

    return [
        Route("/", board_page, methods=["GET"]),
        Route("/tasks/{id}", task_page, methods=["GET"]),
        *(Route(path, page, methods=["GET"]) for path in PAGES if path not in ("/", "/tasks/{id}")),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        Route("/v1/board", board_json, methods=["GET"]),
        Route("/v1/tasks/{id}/log", log_json, methods=["GET"]),
        Route("/v1/batches", batches_json, methods=["GET"]),
        Route("/v1/batches/{id}", batch_json, methods=["GET"]),
        Route("/v1/audit", audit_json, methods=["GET"]),
    ]


_ERR = {"description": "bad request", "content": {"application/json": {"schema": {
    "type": "object", "properties": {"error": {"type": "string"}, "field": {"type": "string"}}}}}}
_LIMIT = {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}
_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
OPENAPI_PATHS: dict[str, Any] = {
    "/v1/board": {"get": {
        "summary": "the newest tasks with their winner and measured gain (the monitor's list)",
        "parameters": [_LIMIT], "responses": {"200": {"description": "tasks"}, "400": _ERR}}},
    "/v1/tasks/{id}/log": {"parameters": [_ID], "get": {
        "summary": "the task's events so far as JSON (?after=ID); the live stream is …/events",
        "parameters": [{"name": "after", "in": "query", "schema": {"type": "integer"}}],
        "responses": {"200": {"description": "events"}, "404": _ERR}}},
    "/v1/batches": {"get": {
        "summary": "the stored batches (afs batch), newest first", "parameters": [_LIMIT],
        "responses": {"200": {"description": "batches"}, "400": _ERR}}},
    "/v1/batches/{id}": {"parameters": [_ID], "get": {
        "summary": "a batch's report (JSON and Markdown; null while it runs)",
        "responses": {"200": {"description": "the batch"}, "404": _ERR}}},
    "/v1/audit": {"get": {
        "summary": "the audit log of applies and rollbacks, newest first",
        "parameters": [_LIMIT, {"name": "task", "in": "query", "schema": {"type": "string"}}],
        "responses": {"200": {"description": "audit entries"}, "400": _ERR}}},
}
