"""`afs serve` assembled: the HTTP API (afs.service.api) with the routes the wings add (the
apply route, afs.apply.api; the execution monitor, afs.web), in-process workers or the
recovery of dead workers' tasks (afs.service.worker), and the scheduler of `afs schedule`
(afs.batch.schedule), on hypercorn under trio.

    serve(settings, bind=…, workers=…, lease_s=…)   the command: the sandbox when the store or
                                                   the workers need it, then run_service
    run_service(…)                                 the service until cancelled (tests start it
                                                   in a nursery: it reports the bound URLs)

It sits above every room it assembles, so that none of them imports another upward: the task
API knows neither the monitor, the apply route nor the schedules.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import hypercorn.trio
import structlog
import trio
from hypercorn.config import Config

from afs.apply.api import OPENAPI_PATH as APPLY_PATH
from afs.apply.api import apply_routes
from afs.asgi import check_bind
from afs.batch.schedule import run_schedules
from afs.config import Leasing, Settings
from afs.errors import InputError
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer
from afs.service.api import build_app
from afs.service.runner import relayed_cancellation
from afs.service.worker import open_runtime, run_recovery, run_worker, worker_name
from afs.store import Store, open_store, store_url
from afs.web import OPENAPI_PATHS as WEB_PATHS
from afs.web import web_routes

log = structlog.get_logger(__name__)


def assemble(store: Store, settings: Settings, token: str | None, hosts: tuple[str, ...] = ()) -> Any:
    """The ASGI application of `afs serve`: the task API with the apply route and the monitor."""
    return build_app(store, settings, token, hosts,
                     routes=[*apply_routes(store, settings),  # POST /v1/tasks/{id}/apply
                             *web_routes(store, settings)],  # the monitor's pages and their JSON
                     paths={"/v1/tasks/{id}/apply": APPLY_PATH, **WEB_PATHS})


async def run_service(settings: Settings, *, bind: str, workers: int, lease_s: float,
                      task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """The API, `workers` in-process workers and the scheduler of `afs schedule`, until
    cancelled; reports the bound URLs."""
    host, _ = check_bind(bind, settings.service_token)
    if workers < 0:
        raise InputError(f"--workers must be 0 or more, got {workers}")
    own = () if host in ("0.0.0.0", "::") else (host,)  # the address it listens on names it too
    url = store_url(settings)
    config = Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = None
    async with open_store(url) as store, trio.open_nursery() as nursery:
        never = trio.Event()
        urls: list[str] = await nursery.start(partial(
            hypercorn.trio.serve, assemble(store, settings, settings.service_token, own), config,
            shutdown_trigger=never.wait))
        for _ in range(workers):
            nursery.start_soon(_one_worker, settings, url, lease_s)
        if not workers:  # the workers are elsewhere: this server still recovers their dead tasks
            nursery.start_soon(run_recovery, settings, url, Leasing(lease_s=lease_s))
        await nursery.start(run_schedules, settings, url)  # `afs schedule`: the stored schedules' batches
        log.info("service_started", urls=urls, workers=workers)
        task_status.started(urls)


async def _one_worker(settings: Settings, url: str, lease_s: float) -> None:
    leasing = Leasing(lease_s=lease_s)
    async with relayed_cancellation() as work, open_runtime(settings, url, leasing=leasing) as rt:
        with work:  # stopping the server gives the worker's task back, its forks destroyed
            await run_worker(rt, worker_name("serve"), poll_s=leasing.poll_s)


async def serve(settings: Settings, *, bind: str, workers: int, lease_s: float) -> None:
    """`afs serve`: the sandbox (when the store or the workers need it), then the service.

    A deployment with its own store (AFS_STORE_URL) and source server
    (AFS_SOURCE_SERVER_URL) starts no sandbox.
    """
    check_bind(bind, settings.service_token)
    if settings.store_url is None or (workers and not settings.source_server_url):
        server = SandboxServer(settings)
        await trio.to_thread.run_sync(server.start)
        if workers:
            await ensure_demo(settings, server, settings.scale, lambda m: None)
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(run_service, settings, bind=bind, workers=workers,
                                           lease_s=lease_s))
        print(f"afs serve: listening on {', '.join(urls)} with {workers} worker(s); Ctrl-C stops it",
              file=sys.stderr, flush=True)
