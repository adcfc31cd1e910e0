"""Did an applied change keep its promise, and one set under a storage budget (issue 28, items 3-5).

On the sandbox's demo database, in one run, through AFS's own command line:

1. a regression caught: the slow `orders_of_customer` statement of the demo workload runs
   for customers' pending orders (bind parameters, as an application sends them);
   `afs optimize` finds its winner (an index), `afs apply --yes` builds it; the statement
   runs again and `afs audit --check` must say the change was kept; then the benchmark
   drops the index behind AFS's back, the statement runs again, and the next
   `afs audit --check` must flag a regression (exit 1) and offer the recorded rollback;
   `afs rollback` closes the apply;
2. the budgeted set: the demo workload runs (--duration seconds, the planted indexes in
   place) and `afs batch --max-storage SIZE --emit DIR` chooses one set under the budget
   and measures it together in one fork; the goal: its measured net saving at least the sum
   of its parts', or the report says why not. The migration written is checked: one
   CONCURRENTLY statement a file, up and down.

Run it in an AFS_HOME of its own (it changes the demo database, and resets its statistics):

    AFS_HOME=/tmp/afs-wcheck AFS_SCALE=small .venv/bin/python benchmarks/workload_check.py \\
        [--duration 20] [--max-storage 20MB] [--calls 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness
from harness import with_sandbox
from pglast import parse_sql

from afs.config import DemoWorkload, Settings
from afs.db import open_connection
from afs.errors import AfsError
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer
from afs.sandbox.workload import SHAPES, ensure_pg_stat_statements, plant_indexes, read_shop, run_workload
from afs.testing import run_afs_async

SHAPE = next(s for s in SHAPES if s.name == "orders_of_customer")
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def progress(message: str) -> None:
    print(f"workload_check: {message}", file=sys.stderr, flush=True)


async def afs(settings: Settings, *args: str) -> tuple[int, Any]:
    """One `afs` command in this AFS_HOME: its exit code and its JSON."""
    done = await run_afs_async(*args, "--json", home=settings.home)
    text = done.stdout.decode().strip()
    try:
        return done.returncode, json.loads(text)
    except ValueError:
        raise AfsError(f"`afs {' '.join(args)}` exited {done.returncode}: "
                         f"{done.stderr.decode()[-600:]}") from None


async def calls(dsn: str, n: int, seed: int) -> None:
    """The statement, `n` times, as an application sends it: bind parameters, customers drawn
    as the demo workload draws them, their pending orders."""
    rng = random.Random(seed)
    async with open_connection(dsn) as conn:
        shop = await read_shop(conn)
        for _ in range(n):
            await conn.fetchall(SHAPE.sql, (SHAPE.values(rng, shop)[0], "pending"))


async def regression(settings: Settings, dsn: str, n: int) -> dict[str, Any]:
    """Part 1: apply, check (kept), drop behind AFS's back, check (regression)."""
    async with open_connection(dsn) as conn:
        await ensure_pg_stat_statements(conn)
        user = await conn.fetchval("SELECT user_id FROM orders GROUP BY 1 ORDER BY count(*) DESC LIMIT 1")
    progress(f"{n} calls of {SHAPE.name} before the apply")
    await calls(dsn, n, 1)
    query = SHAPE.sql % (int(user), "'pending'")
    progress("afs optimize (heuristic brains)")
    _, task = await afs(settings, "optimize", "--query", query, "--provider", "heuristic")
    task_id = str(task.get("task_id") or task.get("id"))
    progress(f"afs apply {task_id} --yes")
    _, applied = await afs(settings, "apply", task_id, "--yes", "--approver", "workload_check")
    if not applied.get("applied"):
        return {"task_id": task_id, "applied": False, "detail": applied}
    index = next(s["sql"] for s in applied["plan"]["steps"] if s["sql"].startswith("CREATE"))
    name = parse_sql(index)[0].stmt.idxname
    progress(f"{n} calls with {name}")
    await calls(dsn, n, 2)
    code1, first = await afs(settings, "audit", "--check", "--task", task_id)
    async with open_connection(dsn) as conn:
        progress(f"DROP INDEX {name}, behind AFS's back")
        await conn.execute(f'DROP INDEX "{name}"')
    progress(f"{n} calls without it")
    await calls(dsn, n, 3)
    code2, second = await afs(settings, "audit", "--check", "--task", task_id)
    await afs(settings, "rollback", task_id, "--yes", "--approver", "workload_check")
    return {"task_id": task_id, "applied": True, "index": index,
            "checks": [{"when": "after the apply", "exit": code1, **first["verdicts"][0]},
                       {"when": "after the index was dropped behind AFS's back", "exit": code2,
                        **second["verdicts"][0]}]}


def check_migration(directory: Path) -> dict[str, Any]:
    ups = sorted(directory.glob("*.up.sql"))
    downs = sorted(directory.glob("*.down.sql"))
    one_each = all(len(parse_sql(p.read_text())) == 1 for p in [*ups, *downs])
    concurrent = all(getattr(parse_sql(p.read_text())[0].stmt, "concurrent", False) for p in [*ups, *downs])
    return {"directory": str(directory), "up": [p.name for p in ups], "down": len(downs),
            "one_statement_a_file": one_each, "all_concurrently": concurrent,
            "summary": (directory / "SUMMARY.md").exists()}


async def budgeted(settings: Settings, server: SandboxServer, args: argparse.Namespace) -> dict[str, Any]:
    """Part 2: the workload, then a batch with --max-storage and --emit."""
    dsn = server.dsn(settings.demo_database)
    planted = await plant_indexes(dsn, server.dsn(), settings.demo_database)
    progress(f"planted: {', '.join(planted) or 'already there'}; the workload runs {args.duration:g} s")
    await run_workload(dsn, DemoWorkload(duration_s=args.duration), reset=True, progress=progress)
    out = Path(tempfile.mkdtemp(prefix="afs-migration-")) / "migration"
    progress(f"afs batch --max-storage {args.max_storage} --emit {out}")
    code, doc = await afs(settings, "batch", "--provider", "heuristic", "--top", str(args.top), "--runs", "3",
                          "--force", "--max-storage", args.max_storage, "--emit", str(out))
    return {"exit": code, "chosen_set": doc.get("chosen_set"), "migration": check_migration(out),
            "batch": doc.get("id"), "index_review_error": (doc.get("index_review") or {}).get("error")}


async def measure(settings: Settings, server: SandboxServer, args: argparse.Namespace) -> dict[str, Any]:
    await ensure_demo(settings, server, args.scale or settings.scale, progress)
    dsn = server.dsn(settings.demo_database)
    return {"regression": await regression(settings, dsn, args.calls),
            "budget": await budgeted(settings, server, args)}


def judge(data: dict[str, Any]) -> dict[str, Any]:
    reg = data["regression"]
    checks = reg.get("checks") or []
    flagged = (len(checks) == 2 and checks[0]["verdict"] == "kept" and checks[1]["verdict"] == "regression"
               and checks[1]["exit"] == 1 and bool(checks[1].get("rollback")))
    chosen = data["budget"]["chosen_set"] or {}
    measured = chosen.get("measured") or {}
    total, parts = measured.get("total_ms_per_day"), chosen.get("sum_of_parts_ms_per_day")
    meets = total is not None and parts is not None and total >= parts
    explained = not meets and bool(measured.get("verdict") and "<" in measured["verdict"])
    migration = data["budget"]["migration"]
    return {"regression_flagged": flagged, "set_meets_parts": meets, "set_explained": explained,
            "migration_ok": migration["one_statement_a_file"] and migration["all_concurrently"]
            and migration["summary"] and len(migration["up"]) == len(chosen.get("items") or [])}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def print_tables(data: dict[str, Any], verdict: dict[str, Any]) -> None:
    reg = data["regression"]
    print(f"1. a change applied through afs apply, then undone behind AFS's back (task {reg['task_id']})")
    if not reg.get("applied"):
        print(f"   not applied: {reg.get('detail')}")
    else:
        print(f"   applied: {reg['index']}")
        print(f"   {'check':<48} {'verdict':<11} {'exit':>4} {'before ms':>10} {'recent ms':>10} "
              f"{'calls':>6} {'p(slower)':>10}")
        for c in reg["checks"]:
            served = [s for s in c["statements"] if s["own"]]  # the one the calls went to
            mine = max(served, key=lambda s: (s.get("recent") or {}).get("calls", 0), default={})
            before, recent = mine.get("before") or {}, mine.get("recent") or {}
            print(f"   {c['when']:<48} {c['verdict']:<11} {c['exit']:>4} {before.get('mean_ms', 0):>10.3f} "
                  f"{recent.get('mean_ms', 0):>10.3f} {recent.get('calls', 0):>6} "
                  f"{mine.get('p_slower') if mine.get('p_slower') is not None else '-':>10}")
        last = reg["checks"][-1]
        if last.get("rollback"):
            print(f"   offered: {last['rollback']['command']} ({'; '.join(last['rollback']['sql'])})")
    print("   (the statement it serves that the calls ran; p(slower): the one-sided Welch test's)")
    print(f"   → regression flagged by the next check: {'yes' if verdict['regression_flagged'] else 'NO'}")
    chosen = data["budget"]["chosen_set"]
    print()
    if not chosen:
        print(f"2. no chosen set (batch exit {data['budget']['exit']})")
        return
    print(f"2. the set under {chosen['budget_mb']:.0f} MB (batch {data['budget']['batch']}): "
          f"{chosen['method']}")
    print(f"   {'change':<78} {'MB':>6} {'reads/day':>10} {'writes/day':>10} {'net/day':>10}")
    for i in chosen["items"]:
        write = i.get("write_ms_cost_per_day", i.get("write_ms_saved_per_day"))
        print(f"   {i['sql'][:78]:<78} {i['size_mb']:>6.1f} {_ms(i['read_ms_saved_per_day']):>10} "
              f"{('-' if i['kind'] == 'create' else '+') + _ms(write):>10} {_ms(i['net_ms_per_day']):>10}")
    for left in chosen["left_out"]:
        print(f"   left out: {left['sql'][:70]} — {left['why']}")
    measured = chosen.get("measured") or {}
    print(f"   sum of the parts {_ms(chosen['sum_of_parts_ms_per_day'])} ms/day; measured together "
          f"{_ms(measured.get('total_ms_per_day'))} ms/day")
    print(f"   {measured.get('verdict') or measured.get('error') or ''}")
    explained = "" if verdict["set_meets_parts"] else \
        f"; explained: {'yes' if verdict['set_explained'] else 'NO'}"
    print(f"   → measured ≥ parts: {'yes' if verdict['set_meets_parts'] else 'no'}{explained}")
    m = data["budget"]["migration"]
    print(f"   migration {m['directory']}: {len(m['up'])} up file(s), {m['down']} down; one statement a "
          f"file: {m['one_statement_a_file']}; all CONCURRENTLY: {m['all_concurrently']}; "
          f"SUMMARY.md: {m['summary']}")


async def run(args: argparse.Namespace, settings: Settings) -> int:
    data = await with_sandbox(settings, lambda server: measure(settings, server, args), progress)
    if data is None:
        return EXIT_INTERRUPTED
    verdict = judge(data)
    print_tables(data, verdict)
    if args.json:
        print(json.dumps({"verdict": verdict, **data}, default=str))
    ok = verdict["regression_flagged"] and (verdict["set_meets_parts"] or verdict["set_explained"])
    return EXIT_OK if ok and verdict["migration_ok"] else EXIT_FAILED


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A regression after an apply flagged by afs audit --check; the set chosen under a "
                    "storage budget measured together against the sum of its parts; its migration.")
    parser.add_argument("--duration", type=float, default=20.0, metavar="SECONDS",
                        help="how long the demo workload runs before the batch (default 20)")
    parser.add_argument("--calls", type=int, default=40, metavar="N",
                        help="calls of the statement in each window of part 1 (default 40)")
    parser.add_argument("--top", type=int, default=4, metavar="N", help="statements the batch optimizes")
    parser.add_argument("--max-storage", default="20MB", metavar="SIZE", help="the batch's budget (20MB)")
    parser.add_argument("--scale", choices=("small", "demo", "large"),
                        help="demo data size if it must be seeded (default: AFS_SCALE or demo)")
    parser.add_argument("--json", action="store_true", help="one JSON object on the last line too")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.calls < 10:
        parser.error("--duration must be positive and --calls at least 10")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main("workload_check", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
