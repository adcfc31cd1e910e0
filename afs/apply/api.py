"""`POST /v1/tasks/{id}/apply` for `afs serve`: the same apply as the command line, approved by
the `approver` the request names (there is no terminal to ask; a request without one is refused).

    POST /v1/tasks/{id}/apply  {"approver": "alice", "dsn": "postgresql://…"  (optional)}
      200 {"applied": true, "plan": …, "audit": …}       built and verified
      409 {"applied": false, "plan": …, "audit": …}      verification failed: rolled back by itself
      200 {"applied": false, "plan": …}                  nothing to apply (rewrite, settings: advice)
      409 {"error": …}                                   refused (not a completed winner, applied
                                                         already, schema changed, T3, another apply)
      404 / 422                                          no such task / no approver
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from afs.apply.resolve import apply_target
from afs.apply.run import apply_winner, load_plan, prepare_apply
from afs.config import Settings
from afs.errors import InputError
from afs.store import Store

OPENAPI_PATH: dict[str, Any] = {
    "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
    "post": {
        "summary": "apply the task's winner to its database (CONCURRENTLY, verified, audited)",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["approver"], "additionalProperties": False,
            "properties": {"approver": {"type": "string", "description": "who approves"},
                           "dsn": {"type": "string", "description": "the target (default: the task's)"}}}}}},
        "responses": {"200": {"description": "applied, or nothing to apply"},
                      "409": {"description": "refused, or failed verification and rolled back"},
                      "404": {"description": "no such task"}, "422": {"description": "no approver"}},
    },
}


async def target_of(store: Store, settings: Settings, task_id: str, dsn: str | None) -> str:
    """The database to apply to: `dsn`, else the task's DSN (resolved), else its sandbox database."""
    task = await store.get(task_id)
    return apply_target(settings, dsn=dsn, task_dsn=task.dsn, source=task.source)


def apply_routes(store: Store, settings: Settings) -> list[Route]:
    async def apply(request: Request) -> Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return JSONResponse({"error": "the body is not valid JSON", "field": "body"}, status_code=400)
        if not isinstance(body, dict) or set(body) - {"approver", "dsn"}:
            return JSONResponse({"error": "expected {approver, dsn?}", "field": "body"}, status_code=422)
        approver, dsn = body.get("approver"), body.get("dsn")
        if not isinstance(approver, str) or not approver.strip():
            return JSONResponse({"error": "an approver is needed to apply", "field": "approver"},
                                status_code=422)
        if dsn is not None and not isinstance(dsn, str):
            return JSONResponse({"error": "a DSN string", "field": "dsn"}, status_code=422)
        task_id = request.path_params["id"]
        plan = await load_plan(store, task_id)
        if plan.tier == "T3":
            raise InputError(f"the winner of task {task_id} is {plan.kind} (T3): never applied")
        if not plan.applicable:
            return JSONResponse({"applied": False, "plan": plan.public()})
        target = await target_of(store, settings, task_id, dsn)
        plan = await prepare_apply(store, plan, target, approver)
        row = await apply_winner(store, plan, target, approver)
        applied = row["result"] == "applied"
        return JSONResponse({"applied": applied, "plan": plan.public(), "audit": row},
                            status_code=200 if applied else 409)

    return [Route("/v1/tasks/{id}/apply", apply, methods=["POST"])]
