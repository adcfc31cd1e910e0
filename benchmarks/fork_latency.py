"""How long does a fork take? AFS cloning, AFS copying, and copying a database by hand.

On the sandbox's demo database, in one run, the median of N repetitions of:

  (a) afs clone      fork create + destroy through AFS: `service_fork` + `service_delete`
                     over an MCP stdio session opened beforehand (the fork server and
                     PostgreSQL already run; only the round trips are timed), with
                     `file_copy_method = clone` (copy-on-write; only where the sandbox's
                     filesystem has reflinks, see `afs sandbox up --cow`), as AFS runs it:
                     the fork server keeps AFS_FORK_SPARES (default 3) ready forks of a
                     source it has forked, and the fork claims one (renamed, new password);
                     after each such run the script waits, untimed, until the server has
                     topped its spares up again, as it does between two tasks;
  (a') afs clone, no spare   the same on a fork server without spares (AFS_FORK_SPARES=0):
                     the template cloned while you wait (CREATE DATABASE … FILE_COPY, the
                     fork's role, limits, hand-over, log-in check);
  (b) afs copy       (a') with `file_copy_method = copy`, on the same disk;
  (c) raw template   `CREATE DATABASE … TEMPLATE <demo>_template STRATEGY FILE_COPY` +
                     `DROP DATABASE`, on a superuser connection, with the server's method;
  (d) dump/restore   `CREATE DATABASE`, `pg_dump --format=custom <demo> | pg_restore`
                     into it, `DROP DATABASE`;
  (e) three at once  three AFS forks created at the same time over the MCP session of (a),
                     then destroyed at the same time (the server's method): a squad's start;
  (f) disk per fork  the space one fresh AFS fork (no spare, as (a')) adds to the data
                     directory's filesystem (used blocks before and after it is created,
                     before any change to it).

The method of (a) and (b) is switched for the fork server's connections only
(`ALTER ROLE postgres IN DATABASE postgres SET file_copy_method`, reset at the end).
Repetitions are interleaved (a, a', c, e, f, b, d, a, …) so drift hits all alike, after
one warm-up of (a)/(a')/(b) and (c) that is not counted; each timed action starts after a
CHECKPOINT and a sync (not timed), so none pays for the writes of the one before it.
Goals: clone ≤ 150 ms and ≤ 0.1× copy (demo scale), three at once ≤ 2× one fork,
≤ 5 MB added per fork, afs / dump-restore ≤ 0.25 and afs / raw template ≤ 1.5 ("afs"
is the server's own method).

    AFS_HOME=... python benchmarks/fork_latency.py [--runs N] [--dump-runs N]
                                                   [--scale small|demo|large] [--json] [--quick]

It uses the configured AFS_HOME, starts the sandbox and seeds the demo database
when missing (like `afs sandbox up`), and stops the sandbox at the end only if
it started it. `--json` prints {"afs_ms", "raw_template_ms", "dump_restore_ms",
"ratio_vs_raw_template", "ratio_vs_dump_restore", "db_size_mb", "fork_method", "clone_ms",
"copy_ms", "ratio_clone_vs_copy", "parallel3_ms", "fork_added_mb", "clone_cold_ms",
"ratio_clone_cold_vs_copy", "spares"} as the last line of stdout (the clone figures are null
where forks cannot clone). Progress goes to
stderr. Forks and the bench_* databases are removed on exit, also on Ctrl-C.
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
from dataclasses import dataclass, replace

import harness
import trio
from harness import with_sandbox

from afs.config import Settings
from afs.db import Connection, open_connection
from afs.errors import AfsError
from afs.forks.client import ForkClient
from afs.forks.naming import random_fork_name
from afs.forks.provider import LocalForkProvider, template_name
from afs.pg.names import quote_ident
from afs.sandbox.forks import open_forks
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer, pg_binary

MIN_RUNS = 5
FORK_TTL_S = 600
RAW_DB = "bench_raw"
DUMP_DB = "bench_dump"
ADMIN_TIMEOUT_MS = 600_000
CLEANUP_TIMEOUT_S = 60
SPARES_WAIT_S = 30
GOAL_VS_RAW = 1.5
GOAL_VS_DUMP = 0.25
GOAL_CLONE_MS = 150.0
GOAL_CLONE_VS_COPY = 0.1
GOAL_PARALLEL3_VS_ONE = 2.0
GOAL_ADDED_MB = 5.0
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


@dataclass
class Measured:
    methods: dict[str, Method]  # clone (may be empty), copy, raw, dump, parallel3
    size_mb: float
    fork_method: str  # the server's own
    spares: int  # ready forks the fork server of (a) keeps (0 where forks copy)
    added_mb: list[float]


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


async def use_method(admin: Connection, method: str | None) -> None:
    """Make the fork server's new connections fork with `method` (None: the server's own)."""
    assert method in (None, "clone", "copy")
    action = "RESET file_copy_method" if method is None else f"SET file_copy_method = {method}"
    with trio.CancelScope(shield=method is None):
        await admin.execute(f"ALTER ROLE postgres IN DATABASE postgres {action}")


async def three_at_once(client: ForkClient, provider: LocalForkProvider, source: str) -> float:
    """Three forks created at the same time, then destroyed at the same time; gone on return."""
    names = [random_fork_name("bench") for _ in range(3)]
    made: list[str] = []

    async def create(name: str) -> None:
        await client.create(source, name=name, ttl_seconds=FORK_TTL_S, owner_pid=os.getpid())
        made.append(name)

    async def cycle() -> None:
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(create, name)
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(client.destroy, name)
        made.clear()

    try:
        return await timed(cycle)
    finally:
        for name in made:
            await destroy_fork_shielded(client, provider, name)


def used_mb(path: str) -> float:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize / 1048576


async def added_by_one_fork(client: ForkClient, provider: LocalForkProvider, source: str,
                            data_dir: str) -> float:
    """MB one fresh fork adds to the data directory's filesystem (created, measured, destroyed)."""
    name = random_fork_name("bench")
    before = await trio.to_thread.run_sync(used_mb, data_dir)
    try:
        await client.create(source, name=name, ttl_seconds=FORK_TTL_S, owner_pid=os.getpid())
        os.sync()
        return await trio.to_thread.run_sync(used_mb, data_dir) - before
    finally:
        await destroy_fork_shielded(client, provider, name)


async def settled(admin: Connection, action: Callable[[], Awaitable[float]]) -> float:
    """`action` after a checkpoint and a sync (not timed): no method pays for the writes
    of the one before it."""
    await harness.settle(admin)
    return await action()


async def spares_ready(admin: Connection, source: str, wanted: int) -> None:
    """Wait until `wanted` spares of `source` are ready (at most SPARES_WAIT_S)."""
    if wanted <= 0:
        return
    with trio.move_on_after(SPARES_WAIT_S) as waiting:
        while await admin.fetchval("SELECT count(*) FROM afs.forks WHERE state = 'spare'"  # noqa: ASYNC110
                                   " AND parent = %s", (source,)) < wanted:
            await trio.sleep(0.02)
    if waiting.cancelled_caught:
        progress(f"the fork server did not top up its {wanted} spares in {SPARES_WAIT_S} s")


# -- (c) raw template ------------------------------------------------------------------
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


# -- (d) pg_dump | pg_restore ------------------------------------------------------------
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
                  dump_runs: int) -> Measured:
    """Seed if needed, then run the interleaved repetitions."""
    source = settings.demo_database
    await ensure_demo(settings, server, scale, progress)
    admin_dsn = server.dsn()
    provider = LocalForkProvider(admin_dsn)
    data_dir = str(settings.pgdata)
    methods = {
        "clone": Method("AFS fork, clone, from a spare", []),
        "clone_cold": Method("AFS fork, clone, no spare", []),
        "copy": Method("AFS fork, copy", []),
        "parallel3": Method("three AFS forks at once (create + destroy)", []),
        "raw": Method("CREATE DATABASE … TEMPLATE + DROP", []),
        "dump": Method("pg_dump | pg_restore + DROP", []),
    }
    added: list[float] = []
    async with open_connection(admin_dsn, ADMIN_TIMEOUT_MS) as admin:
        fork_method = str(await admin.fetchval("SHOW file_copy_method"))
        origin = await admin.fetchval("SELECT origin FROM afs.sources WHERE name = %s", (source,))
        if origin and origin.startswith("demo:") and origin.split(":")[1] != scale:
            progress(f"note: {source} exists already, seeded as {origin!r}, not {scale!r}")
        size = await admin.fetchval("SELECT pg_database_size(%s)", (source,))
        size_mb = round((size or 0) / 1048576, 1)
        for leftover in (RAW_DB, DUMP_DB):
            await drop_shielded(admin, leftover)
        progress(f"{source}: {size_mb} MB, forks {fork_method} here; opening the MCP sessions"
                 " (not timed)")
        spares = settings.fork_spares if fork_method == "clone" else 0
        async with open_forks(settings) as client, \
                open_forks(replace(settings, fork_spares=0)) as cold:
            template = template_name(source)

            async def spared(action: Callable[[], Awaitable[float]]) -> float:
                """`action` on the session with spares; then wait (not timed) until the fork
                server has topped them up again, so every such run finds them ready."""
                took = await settled(admin, action)
                await spares_ready(admin, source, spares)
                return took

            try:
                progress("warm-up (not counted)")
                if fork_method == "clone":
                    await spared(lambda: afs_fork_cycle(client, provider, source))
                    await use_method(admin, "copy")
                    await afs_fork_cycle(cold, provider, source)
                await use_method(admin, None)
                await afs_fork_cycle(cold, provider, source)
                await raw_template_cycle(admin, template)
                for run in range(1, max(runs, dump_runs) + 1):
                    if run <= runs:
                        if fork_method == "clone":
                            methods["clone"].samples.append(
                                await spared(lambda: afs_fork_cycle(client, provider, source)))
                            methods["clone_cold"].samples.append(
                                await settled(admin, lambda: afs_fork_cycle(cold, provider, source)))
                        methods["raw"].samples.append(
                            await settled(admin, lambda: raw_template_cycle(admin, template)))
                        methods["parallel3"].samples.append(
                            await spared(lambda: three_at_once(client, provider, source)))
                        added.append(await added_by_one_fork(cold, provider, source, data_dir))
                        if fork_method == "clone":
                            await use_method(admin, "copy")
                        methods["copy"].samples.append(
                            await settled(admin, lambda: afs_fork_cycle(cold, provider, source)))
                        await use_method(admin, None)
                        progress(f"run {run}: " + ", ".join(
                            f"{way} {m.samples[-1]:.1f} ms" for way, m in methods.items()
                            if way != "dump" and m.samples) + f", +{added[-1]:.1f} MB per fork")
                    if run <= dump_runs:
                        progress(f"run {run}: pg_dump | pg_restore …")
                        methods["dump"].samples.append(await dump_restore_cycle(admin, server, source))
                        progress(f"run {run}: dump/restore {methods['dump'].samples[-1]:.1f} ms")
            finally:
                await use_method(admin, None)
    return Measured(methods, size_mb, fork_method, spares, added)


def report(measured: Measured) -> dict[str, object]:
    m = measured.methods
    clone = m["clone"] if m["clone"].samples else None
    cold = m["clone_cold"] if m["clone_cold"].samples else None
    copy, raw, dump, three = m["copy"], m["raw"], m["dump"], m["parallel3"]
    afs = clone if measured.fork_method == "clone" and clone is not None else copy
    print(f"{measured.size_mb} MB database; this server forks by {measured.fork_method}"
          + (f", keeping {measured.spares} spares" if measured.spares else ""))
    print(f"{'method':<42} {'runs':>4} {'median ms':>11} {'min ms':>11} {'max ms':>11}"
          f" {'× AFS':>9}")
    for method in m.values():
        if not method.samples:
            continue
        print(f"{method.label:<42} {len(method.samples):>4} {method.median:>11.1f}"
              f" {min(method.samples):>11.1f} {max(method.samples):>11.1f}"
              f" {method.median / afs.median:>9.2f}")
    if clone is None:
        print("AFS fork, clone: not available here (no reflinks where the sandbox lives;"
              " `afs sandbox up --cow` as root)")
    added = statistics.median(measured.added_mb)
    print(f"disk added by one fresh fork: median {added:.1f} MB"
          f" (min {min(measured.added_mb):.1f}, max {max(measured.added_mb):.1f})")
    result: dict[str, object] = {
        "afs_ms": round(afs.median, 1),
        "raw_template_ms": round(raw.median, 1),
        "dump_restore_ms": round(dump.median, 1),
        "ratio_vs_raw_template": round(afs.median / raw.median, 4),
        "ratio_vs_dump_restore": round(afs.median / dump.median, 4),
        "db_size_mb": measured.size_mb,
        "fork_method": measured.fork_method,
        "clone_ms": round(clone.median, 1) if clone else None,
        "copy_ms": round(copy.median, 1),
        "ratio_clone_vs_copy": round(clone.median / copy.median, 4) if clone else None,
        "parallel3_ms": round(three.median, 1),
        "fork_added_mb": round(added, 2),
        "clone_cold_ms": round(cold.median, 1) if cold else None,
        "ratio_clone_cold_vs_copy": round(cold.median / copy.median, 4) if cold else None,
        "spares": measured.spares,
    }
    goals: list[tuple[str, float | None, float, str]] = [
        ("clone_ms", clone.median if clone else None, GOAL_CLONE_MS, "ms"),
        ("ratio_clone_vs_copy", clone.median / copy.median if clone else None, GOAL_CLONE_VS_COPY,
         "at demo scale"),
        ("clone_cold_ms (no spare)", cold.median if cold else None, GOAL_CLONE_MS, "ms"),
        ("parallel3_ms / afs_ms", three.median / afs.median, GOAL_PARALLEL3_VS_ONE, ""),
        ("fork_added_mb", added, GOAL_ADDED_MB, "MB"),
        ("ratio_vs_raw_template", afs.median / raw.median, GOAL_VS_RAW, ""),
        ("ratio_vs_dump_restore", afs.median / dump.median, GOAL_VS_DUMP, ""),
    ]
    for key, value, goal, unit in goals:
        if value is None:
            print(f"{key} = n/a  (goal ≤ {goal:g} {unit}: not measurable here)")
            continue
        verdict = "met" if value <= goal else "NOT met"
        print(f"{key} = {value:.4g}  (goal ≤ {goal:g} {unit}: {verdict})")
    return result


async def run(args: argparse.Namespace, settings: Settings) -> int:
    scale = args.scale or settings.scale
    dump_runs = args.runs if args.dump_runs is None else args.dump_runs
    outcome = await with_sandbox(
        settings, lambda server: measure(settings, server, scale, args.runs, dump_runs), progress)
    if outcome is None:
        return EXIT_INTERRUPTED
    result = report(outcome)
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
