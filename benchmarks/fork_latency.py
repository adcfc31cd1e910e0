"""How long does a fork take? AFS against the two ways of copying a database by hand.

On the sandbox's demo database, in one run, the median of N repetitions of:

  (a) afs            fork create + destroy through AFS: `service_fork` + `service_delete`
                     over one MCP stdio session opened beforehand (the fork server and
                     PostgreSQL already run; only the round trips are timed);
  (b) raw template   `CREATE DATABASE … TEMPLATE <demo>_template STRATEGY FILE_COPY` +
                     `DROP DATABASE`, on a superuser connection (the template AFS forks from);
  (c) dump/restore   `CREATE DATABASE`, `pg_dump --format=custom <demo> | pg_restore`
                     into it, `DROP DATABASE`.

Repetitions are interleaved (a, b, c, a, b, c, …) so drift hits all three alike,
after one warm-up of (a) and (b) that is not counted. Goals (demo scale):
afs / dump-restore ≤ 0.25 and afs / raw template ≤ 1.5.

    AFS_HOME=... python benchmarks/fork_latency.py [--runs N] [--dump-runs N]
                                                   [--scale small|demo|large] [--json] [--quick]

It uses the configured AFS_HOME, starts the sandbox and seeds the demo database
when missing (like `afs sandbox up`), and stops the sandbox at the end only if
it started it. `--json` prints {"afs_ms", "raw_template_ms", "dump_restore_ms",
"ratio_vs_raw_template", "ratio_vs_dump_restore", "db_size_mb"} as the last line
of stdout. Progress goes to stderr. Forks and the bench_* databases are removed
on exit, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import harness
import trio
from harness import with_sandbox

from afs.config import Settings
from afs.db import Connection, open_connection
from afs.errors import AfsError
from afs.forks.client import ForkClient, open_fork_client
from afs.forks.naming import random_fork_name
from afs.forks.provider import LocalForkProvider, template_name
from afs.pg.names import quote_ident
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer, pg_binary

MIN_RUNS = 5
FORK_TTL_S = 600
RAW_DB = "bench_raw"
DUMP_DB = "bench_dump"
ADMIN_TIMEOUT_MS = 600_000
CLEANUP_TIMEOUT_S = 60
GOAL_VS_RAW = 1.5
GOAL_VS_DUMP = 0.25
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def progress(message: str) -> None:
    print(f"[fork_latency] {message}", file=sys.stderr, flush=True)


@dataclass
class Method:
    label: str
    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


async def timed(action: Callable[[], Awaitable[None]]) -> float:
    """Milliseconds that `action` took."""
    started = time.perf_counter()
    await action()
    return (time.perf_counter() - started) * 1000


# -- (a) AFS ---------------------------------------------------------------------------
async def afs_fork_cycle(client: ForkClient, provider: LocalForkProvider, source: str) -> float:
    """Fork create + destroy over the open MCP session; the fork is gone on return."""
    name = random_fork_name("bench")
    destroyed = False

    async def cycle() -> None:
        nonlocal destroyed
        fork = await client.create(source, name=name, ttl_seconds=FORK_TTL_S,
                                   owner_pid=os.getpid())
        destroyed = await client.destroy(fork.name)

    try:
        return await timed(cycle)
    finally:
        if not destroyed:
            await destroy_fork_shielded(client, provider, name)


async def destroy_fork_shielded(client: ForkClient, provider: LocalForkProvider,
                                name: str) -> None:
    """Destroy `name` through MCP; if the fork server is gone (Ctrl-C reaches it too), directly."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
        try:
            with trio.fail_after(10):
                await client.destroy(name)
            return
        except (AfsError, trio.TooSlowError):
            pass
        try:
            await provider.delete(name)
        except AfsError as exc:
            progress(f"could not destroy fork {name}: {exc}")


# -- (b) raw template ------------------------------------------------------------------
async def raw_template_cycle(admin: Connection, template: str) -> float:
    async def cycle() -> None:
        await admin.execute(
            f"CREATE DATABASE {quote_ident(RAW_DB)} TEMPLATE {quote_ident(template)}"
            " STRATEGY FILE_COPY"
        )
        await admin.execute(f"DROP DATABASE {quote_ident(RAW_DB)}")

    try:
        return await timed(cycle)
    finally:
        await drop_shielded(admin, RAW_DB)


# -- (c) pg_dump | pg_restore ------------------------------------------------------------
async def dump_restore_cycle(admin: Connection, server: SandboxServer, source: str) -> float:
    async def cycle() -> None:
        await admin.execute(f"CREATE DATABASE {quote_ident(DUMP_DB)}")
        await dump_restore(server.dsn(source), server.dsn(DUMP_DB))
        await admin.execute(f"DROP DATABASE {quote_ident(DUMP_DB)}")

    try:
        return await timed(cycle)
    finally:
        await drop_shielded(admin, DUMP_DB)


async def dump_restore(source_dsn: str, target_dsn: str) -> None:
    """`pg_dump --format=custom | pg_restore` as AFS's importer runs it; killed if cancelled."""
    dump_cmd = [pg_binary("pg_dump"), "--format=custom", "--no-owner", "--no-privileges",
                f"--dbname={source_dsn}"]
    restore_cmd = [pg_binary("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error",
                   f"--dbname={target_dsn}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    with tempfile.TemporaryFile() as dump_err, tempfile.TemporaryFile() as restore_err:
        processes: list[trio.Process] = []
        read_fd, write_fd = os.pipe()
        try:
            try:
                processes.append(await trio.lowlevel.open_process(
                    dump_cmd, stdout=write_fd, stderr=dump_err, env=env))
                processes.append(await trio.lowlevel.open_process(
                    restore_cmd, stdin=read_fd, stdout=subprocess.DEVNULL, stderr=restore_err,
                    env=env))
            finally:
                os.close(read_fd)
                os.close(write_fd)
            for process in reversed(processes):
                await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                for process in processes:
                    if process.returncode is None:
                        process.kill()
                    await process.wait()
        for tool, process, err in zip(("pg_dump", "pg_restore"), processes,
                                      (dump_err, restore_err), strict=False):
            if process.returncode != 0:
                err.seek(0)
                detail = err.read().decode(errors="replace").strip()[-500:]
                raise AfsError(f"{tool} failed (exit {process.returncode}): {detail}")


async def drop_shielded(admin: Connection, database: str) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(database)} WITH (FORCE)")
        except AfsError as exc:
            progress(f"could not drop {database}: {exc}")


# -- the run ------------------------------------------------------------------------------
async def measure(settings: Settings, server: SandboxServer, scale: str, runs: int,
                  dump_runs: int) -> tuple[list[Method], float]:
    """Seed if needed, then run the interleaved repetitions. Returns methods and db size (MB)."""
    source = settings.demo_database
    await ensure_demo(settings, server, scale, progress)
    admin_dsn = server.dsn()
    provider = LocalForkProvider(admin_dsn)
    afs = Method("AFS fork (MCP create + destroy)", [])
    raw = Method("CREATE DATABASE … TEMPLATE + DROP", [])
    dump = Method("pg_dump | pg_restore + DROP", [])
    async with open_connection(admin_dsn, ADMIN_TIMEOUT_MS) as admin:
        origin = await admin.fetchval("SELECT origin FROM afs.sources WHERE name = %s", (source,))
        if origin and origin.startswith("demo:") and origin.split(":")[1] != scale:
            progress(f"note: {source} exists already, seeded as {origin!r}, not {scale!r}")
        size = await admin.fetchval("SELECT pg_database_size(%s)", (source,))
        size_mb = round((size or 0) / 1048576, 1)
        for leftover in (RAW_DB, DUMP_DB):
            await drop_shielded(admin, leftover)
        progress(f"{source}: {size_mb} MB; opening the MCP session (not timed)")
        async with open_fork_client(settings) as client:
            template = template_name(source)
            progress("warm-up (not counted)")
            await afs_fork_cycle(client, provider, source)
            await raw_template_cycle(admin, template)
            for run in range(1, max(runs, dump_runs) + 1):
                if run <= runs:
                    afs.samples.append(await afs_fork_cycle(client, provider, source))
                    raw.samples.append(await raw_template_cycle(admin, template))
                    progress(f"run {run}: afs {afs.samples[-1]:.1f} ms,"
                             f" raw template {raw.samples[-1]:.1f} ms")
                if run <= dump_runs:
                    progress(f"run {run}: pg_dump | pg_restore …")
                    dump.samples.append(await dump_restore_cycle(admin, server, source))
                    progress(f"run {run}: dump/restore {dump.samples[-1]:.1f} ms")
    return [afs, raw, dump], size_mb


def report(methods: list[Method], size_mb: float) -> dict[str, float]:
    afs, raw, dump = methods
    print(f"{'method':<34} {'runs':>4} {'median ms':>11} {'min ms':>11} {'max ms':>11}"
          f" {'× AFS':>9}")
    for method in methods:
        print(f"{method.label:<34} {len(method.samples):>4} {method.median:>11.1f}"
              f" {min(method.samples):>11.1f} {max(method.samples):>11.1f}"
              f" {method.median / afs.median:>9.2f}")
    result = {
        "afs_ms": round(afs.median, 1),
        "raw_template_ms": round(raw.median, 1),
        "dump_restore_ms": round(dump.median, 1),
        "ratio_vs_raw_template": round(afs.median / raw.median, 4),
        "ratio_vs_dump_restore": round(afs.median / dump.median, 4),
        "db_size_mb": size_mb,
    }
    for key, goal in (("ratio_vs_raw_template", GOAL_VS_RAW),
                      ("ratio_vs_dump_restore", GOAL_VS_DUMP)):
        verdict = "met" if result[key] <= goal else "NOT met"
        print(f"{key} = {result[key]:.4f}  (goal ≤ {goal}: {verdict})")
    print(f"db_size_mb = {size_mb}")
    return result


async def run(args: argparse.Namespace, settings: Settings) -> int:
    scale = args.scale or settings.scale
    dump_runs = args.runs if args.dump_runs is None else args.dump_runs
    outcome = await with_sandbox(
        settings, lambda server: measure(settings, server, scale, args.runs, dump_runs), progress)
    if outcome is None:
        return EXIT_INTERRUPTED
    result = report(*outcome)
    if args.json:
        print(json.dumps(result))
    return EXIT_OK


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fork latency: AFS (MCP) vs CREATE DATABASE …"
                                     " TEMPLATE vs pg_dump | pg_restore, on the demo database.")
    parser.add_argument("--runs", type=int, help=f"repetitions of each (default {MIN_RUNS};"
                        f" at least {MIN_RUNS} unless --quick)")
    parser.add_argument("--dump-runs", type=int, metavar="N",
                        help="repetitions of pg_dump | pg_restore (default: --runs)")
    parser.add_argument("--scale", choices=("small", "demo", "large"),
                        help="demo data size if it must be seeded (default: AFS_SCALE or demo)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object on the last line")
    parser.add_argument("--quick", action="store_true",
                        help=f"allow fewer than {MIN_RUNS} runs (default 1): a smoke test")
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 1 if args.quick else MIN_RUNS
    if args.runs < (1 if args.quick else MIN_RUNS):
        parser.error(f"--runs must be at least {MIN_RUNS} (or use --quick)")
    if args.dump_runs is not None and args.dump_runs < 1:
        parser.error("--dump-runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main("fork_latency", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
