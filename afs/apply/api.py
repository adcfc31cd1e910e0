"""`POST /v1/tasks/{id}/apply` for `afs serve`: the same apply as the command line, approved by
the authenticated principal and the `approver` the request names (there is no terminal to ask).

    POST /v1/tasks/{id}/apply  {"approver": "alice", "dsn": "postgresql://…"  (optional)}
      200 {"applied": true, "plan": …, "audit": …}       built and verified
      409 {"applied": false, "plan": …, "audit": …}      verification failed: rolled back by itself
      200 {"applied": false, "plan": …}                  nothing to apply (rewrite, settings: advice)
      409 {"error": …}                                   refused (not a completed winner, applied
                                                         already, schema changed, T3, another apply)
      403 {"error": …}                                   no token configured, or `dsn` names another
                                                         database than the task's
      400 / 404 / 422                                    not UTF-8 / no such task / no approver
      502 {"error": …}                                   the task's database failed (unreachable, a
                                                         statement): the reason, also logged

Who may apply: only a request that authenticated with the service's token. Without
AFS_SERVICE_TOKEN the service applies nothing over HTTP, even on loopback (any local
process, or a page in the user's browser, could ask); `afs apply` at a terminal still works.
The audit row's approver is the principal (`token:<sha256 prefix>`, afs.asgi.token_principal)
with the name the request gives: "token:3f2a9c1d0b7e (alice)".

Where: the task's own database, resolved as `afs apply` resolves it without --dsn
(afs.apply.resolve.apply_target). The body's `dsn` may only name that same database, with
every connection parameter equal but the password (which it may add); anything else (another
host, port, database, a `hostaddr` or `service` that sends libpq elsewhere) is refused
before any connection is opened.
"""

from __future__ import annotations

from typing import Any

import structlog
from psycopg import conninfo
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from afs.apply.resolve import apply_target
from afs.apply.run import apply_winner, load_plan, prepare_apply
from afs.asgi import PRINCIPAL, BodyError, parse_json
from afs.config import Settings
from afs.errors import AfsError, InputError, scrub
from afs.sandbox.server import dsn_for
from afs.store import Store

log = structlog.get_logger(__name__)

OPENAPI_PATH: dict[str, Any] = {
    "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
    "post": {
        "summary": "apply the task's winner to its database (CONCURRENTLY, verified, audited; token)",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["approver"], "additionalProperties": False,
            "properties": {"approver": {"type": "string", "description": "who approves"},
                           "dsn": {"type": "string", "description": "the task's own database with its "
                                   "password (default: as configured)"}}}}}},
        "responses": {"200": {"description": "applied, or nothing to apply"},
                      "403": {"description": "no token configured, or dsn names another database"},
                      "409": {"description": "refused, or failed verification and rolled back"},
                      "404": {"description": "no such task"}, "422": {"description": "no approver"},
                      "502": {"description": "the task's database failed"}},
    },
}
NO_TOKEN = ("applying over HTTP needs a token: set AFS_SERVICE_TOKEN for `afs serve` (clients send "
            "Authorization: Bearer …), or apply at a terminal with `afs apply`")


class TargetRefused(InputError):
    """The request's `dsn` names another database than the task's own."""


def _connection(dsn: str) -> dict[str, str] | None:
    """Where a DSN connects and as whom: its libpq parameters but the password."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except Exception:  # not a connection string (psycopg says why in several ways)
        return None
    return {k: str(v) for k, v in params.items() if k != "password"}


def checked_target(settings: Settings, *, dsn: str | None, task_dsn: str | None,
                   source: str | None) -> str:
    """Where an apply over HTTP runs (pure: no connection). With `dsn`: it, when it connects
    where the task's database is and as the same user, differing at most by its password;
    TargetRefused otherwise. Without: the task's database, as `afs apply` resolves it."""
    if dsn is None:
        return apply_target(settings, dsn=None, task_dsn=task_dsn, source=source)
    own = task_dsn or dsn_for(settings, source or settings.demo_database)
    given = _connection(dsn)
    if given is None or given != _connection(own):
        raise TargetRefused(f"an apply over HTTP runs only on the task's own database ({scrub(own)}): "
                            "`dsn` may name it again, with its password, and nothing else")
    return dsn


def apply_routes(store: Store, settings: Settings) -> list[Route]:
    async def apply(request: Request) -> Response:
        principal = request.scope.get(PRINCIPAL)
        if principal is None:  # no token configured: nobody is authenticated
            return JSONResponse({"error": NO_TOKEN, "field": "Authorization"}, status_code=403)
        try:
            body = parse_json(await request.body())  # small (the guard bounds it): read here
        except BodyError as exc:
            return JSONResponse({"error": str(exc), "field": exc.field}, status_code=400)
        if not isinstance(body, dict) or set(body) - {"approver", "dsn"}:
            return JSONResponse({"error": "expected {approver, dsn?}", "field": "body"}, status_code=422)
        name, dsn = body.get("approver"), body.get("dsn")
        if not isinstance(name, str) or not name.strip():
            return JSONResponse({"error": "an approver is needed to apply", "field": "approver"},
                                status_code=422)
        if dsn is not None and not isinstance(dsn, str):
            return JSONResponse({"error": "a DSN string", "field": "dsn"}, status_code=422)
        task_id = request.path_params["id"]
        task = await store.get(task_id)
        try:
            target = checked_target(settings, dsn=dsn, task_dsn=task.dsn, source=task.source)
        except TargetRefused as exc:
            return JSONResponse({"error": str(exc), "field": "dsn"}, status_code=403)
        plan = await load_plan(store, task_id)
        if plan.tier == "T3":
            raise InputError(f"the winner of task {task_id} is {plan.kind} (T3): never applied")
        if not plan.applicable:
            return JSONResponse({"applied": False, "plan": plan.public()})
        approver = f"{principal} ({name.strip()})"
        try:
            plan = await prepare_apply(store, plan, target, approver)
            row = await apply_winner(store, plan, target, approver)
        except InputError:
            raise  # refused: 409 (afs.service.api)
        except AfsError as exc:  # the database failed: its reason, not a bare 500
            log.error("apply_failed", task_id=task_id, target=scrub(target), approver=approver,
                      error=str(exc))
            return JSONResponse({"error": str(exc), "field": "dsn"}, status_code=502)
        applied = row["result"] == "applied"
        log.info("apply_finished", task_id=task_id, result=row["result"], approver=approver)
        return JSONResponse({"applied": applied, "plan": plan.public(), "audit": row},
                            status_code=200 if applied else 409)

    return [Route("/v1/tasks/{id}/apply", apply, methods=["POST"])]
