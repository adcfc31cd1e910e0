"""The whole workload (issue 28): drop advice verified, and the write cost of a new index.

On the sandbox's demo database, in one run:

1. the demo's planted indexes (afs.sandbox.demo.PLANTED_INDEXES: a duplicate of a primary key,
   a redundant prefix, unused ones) are created, the statistics reset, and the demo workload
   runs for --duration seconds (afs.sandbox.workload, writes rolled back);
2. the index review (afs.batch.indexes, as `afs indexes --min-window 0s`: the window is the
   workload's few seconds, so it judges on any window): every planted index must be found,
   as what it was planted as, and verified in a fork with the table's statements replayed
   (verdict "drop", no read slower); no index behind a constraint or unique may be proposed;
3. the write cost of a new index (the one the slow `orders_of_customer` lacks, as a winner
   would add it): AFS's figure (afs.batch.indexes.new_index_write_costs: the observed INSERT
   into orders replayed in a fork with and without the index) against the benchmark's own
   direct measurement in another fork — blocks of single-row inserts into orders in one
   server-side loop, timed with the index and with it dropped in a rolled-back transaction,
   alternating. Goal: the same sign and the same order of magnitude (ratio within 0.1–10).

    .venv/bin/python benchmarks/workload.py [--duration 20] [--scale demo] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any

import harness
import trio
from harness import with_sandbox

from afs.batch.indexes import Verifying, new_index_write_costs, review_indexes
from afs.batch.statements import read_counters
from afs.config import DemoWorkload, Settings
from afs.db import Connection, open_connection
from afs.sandbox.demo import PLANTED_INDEXES
from afs.sandbox.forks import open_forks
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer
from afs.sandbox.workload import plant_indexes, run_workload

NEW_INDEX = "CREATE INDEX ON orders (user_id, status, created_at)"
INSERT_PREFIX = "INSERT INTO orders"
DIRECT_ROUNDS = 7  # pairs of blocks, with and without the index
DIRECT_INSERTS = 2000  # single-row inserts per block
MAX_RATIO = 10.0  # the same order of magnitude: within a factor of 10 either way
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130

_BLOCK = """
DO $$
DECLARE base bigint := (SELECT max(id) FROM orders); users bigint := (SELECT max(id) FROM users);
BEGIN
  FOR i IN 1..{n} LOOP
    INSERT INTO orders (id, user_id, status, total_amount, shipping_country, created_at, updated_at)
    VALUES (base + i, 1 + (i * 7919) % users, 'pending', 10 + i % 90, 'US', now(), now());
  END LOOP;
END $$
"""


def progress(message: str) -> None:
    print(f"workload: {message}", file=sys.stderr, flush=True)


async def _block(conn: Connection, drop: str | None) -> float:
    """One block of inserts in a transaction rolled back (the index dropped in it first): ms."""
    await conn.execute("BEGIN")
    try:
        if drop is not None:
            await conn.execute(f"DROP INDEX {drop}")
        start = time.perf_counter()
        await conn.execute(_BLOCK.format(n=DIRECT_INSERTS))
        return (time.perf_counter() - start) * 1000
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")


async def direct_cost(forks: Any, source: str, settings: Settings) -> dict[str, Any]:
    """The benchmark's own figure: ms an insert into orders takes more with the new index."""
    async with forks.open_fork(source) as fork, open_connection(
            fork.dsn, settings.measuring.statement_timeout_ms) as conn:
        before = {r[0] for r in await conn.fetchall("SELECT indexrelid FROM pg_index"
                                                    " WHERE indrelid = 'orders'::regclass")}
        await conn.execute(NEW_INDEX)
        name = await conn.fetchval(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'orders'::regclass"
            " AND NOT (indexrelid = ANY(%s))", (list(before),))
        await _block(conn, None)  # warm-up
        with_ms, without_ms = [], []
        for _ in range(DIRECT_ROUNDS):
            with_ms.append(await _block(conn, None))
            without_ms.append(await _block(conn, str(name)))
    per_insert = (statistics.median(with_ms) - statistics.median(without_ms)) / DIRECT_INSERTS
    return {"ms_per_insert": round(per_insert, 5), "rounds": DIRECT_ROUNDS,
            "inserts_per_block": DIRECT_INSERTS,
            "with_ms": [round(x, 1) for x in with_ms], "without_ms": [round(x, 1) for x in without_ms]}


async def measure(settings: Settings, server: SandboxServer, args: argparse.Namespace) -> dict[str, Any]:
    await ensure_demo(settings, server, args.scale or settings.scale, progress)
    database = settings.demo_database
    dsn = server.dsn(database)
    planted = await plant_indexes(dsn, server.dsn(), database)
    progress(f"planted: {', '.join(planted) or 'already there'}; the workload runs {args.duration:g} s")
    ran = await run_workload(dsn, DemoWorkload(duration_s=args.duration), reset=True, progress=progress)
    async with open_forks(settings) as forks, open_connection(dsn) as target:
        at = Verifying(target, forks, database, settings, progress)
        review = await review_indexes(at, min_window_s=0)
        protected = {str(r[0]) for r in await target.fetchall(
            "SELECT indexrelid::regclass::text FROM pg_index i WHERE i.indisunique OR i.indisprimary"
            " OR EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)")}
        counters = await read_counters(target)
        progress(f"the write cost of {NEW_INDEX}, replayed")
        costs = await new_index_write_costs(at, [NEW_INDEX], counters)
        progress("the same, measured directly")
        direct = await direct_cost(forks, database, settings)
    return {"workload": {"statements": ran.statements, "seconds": ran.seconds}, "review": review,
            "protected": protected, "cost": costs.get(NEW_INDEX), "direct": direct}


def judge(measured: dict[str, Any]) -> dict[str, Any]:
    advice = {a["index"].split(".")[-1].strip('"'): a for a in measured["review"]["advice"]}
    rows = []
    for planted in PLANTED_INDEXES:
        found = advice.get(planted.name)
        rows.append({"index": planted.name, "planted": planted.kind,
                     "found": None if found is None else found["kind"],
                     "verdict": None if found is None else found["verdict"],
                     "reads_slower": [] if found is None else found["reads_slower"],
                     "write_ms_saved_per_day": None if found is None else found["write_ms_saved_per_day"],
                     "storage_mb": None if found is None else found["storage_mb"],
                     "write_significant": found is not None and bool(found.get("write_significant")),
                     "ok": found is not None and found["kind"] == planted.kind
                     and found["verdict"] == "drop"})
    proposed_protected = sorted(
        name for name, a in advice.items() if a["verdict"] == "drop"
        and any(p.split(".")[-1].strip('"') == name for p in measured["protected"]))
    cost = measured["cost"] or {}
    inserts = [m for m in cost.get("measured", []) if m["statement"].startswith(INSERT_PREFIX)]
    afs_insert = None
    if inserts and inserts[0]["with_ms"] is not None:
        afs_insert = round(-inserts[0]["delta_ms"], 5)  # with minus without: the index's cost
    direct = measured["direct"]["ms_per_insert"]
    ratio = None if not afs_insert or not direct else afs_insert / direct
    agrees = ratio is not None and ratio > 0 and abs(math.log10(ratio)) <= math.log10(MAX_RATIO)
    return {"planted": rows, "all_planted_found_and_verified": all(r["ok"] for r in rows),
            "protected_proposed": proposed_protected,
            "write_cost": {"afs_ms_per_insert": afs_insert, "direct_ms_per_insert": direct,
                           "ratio": None if ratio is None else round(ratio, 2), "agrees": agrees,
                           "afs_ms_per_write": cost.get("ms_per_write"),
                           "afs_ms_per_day": cost.get("ms_per_day"),
                           "writes_per_day": cost.get("writes_per_day")},
            "other_advice": sorted(n for n in advice if n not in {p.name for p in PLANTED_INDEXES}),
            "window": measured["review"]["window"]["note"], "workload": measured["workload"]}


def print_table(data: dict[str, Any]) -> None:
    print(f"workload: {data['workload']['statements']} statements in {data['workload']['seconds']:.0f} s; "
          f"{data['window']} (judged with --min-window 0s)")
    print(f"{'planted index':<30} {'planted as':<10} {'found as':<10} {'verdict':<7} "
          f"{'reads slower':>12} {'write ms/day':>12} {'MB':>7}  ok")
    for r in data["planted"]:
        per_day = "-" if r["write_ms_saved_per_day"] is None else (
            f"{r['write_ms_saved_per_day']:.0f}" + ("" if r["write_significant"] else "~"))
        mb = "-" if r["storage_mb"] is None else f"{r['storage_mb']:.1f}"
        print(f"{r['index']:<30} {r['planted']:<10} {r['found'] or '-':<10} {r['verdict'] or '-':<7} "
              f"{len(r['reads_slower']):>12} {per_day:>12} {mb:>7}  {'yes' if r['ok'] else 'NO'}")
    print("(~: the writes' runs with and without the index overlap: a saving within the noise)")
    print(f"indexes behind a constraint or unique proposed: {len(data['protected_proposed'])}"
          + (f" ({', '.join(data['protected_proposed'])})" if data["protected_proposed"] else ""))
    w = data["write_cost"]
    print(f"write cost of `{NEW_INDEX}` per insert into orders: AFS replay {w['afs_ms_per_insert']} ms, "
          f"direct {w['direct_ms_per_insert']} ms, ratio {w['ratio']} → "
          f"{'same sign and order of magnitude' if w['agrees'] else 'DISAGREE'}")
    print(f"  AFS, over every write to orders: {w['afs_ms_per_write']} ms a write, "
          f"{w['writes_per_day']} writes a day → {w['afs_ms_per_day']} ms a day")


async def run(args: argparse.Namespace, settings: Settings) -> int:
    measured = await with_sandbox(settings, lambda server: measure(settings, server, args), progress)
    if measured is None:
        return EXIT_INTERRUPTED
    data = judge(measured)
    print_table(data)
    if args.json:
        print(json.dumps(data, default=str))
    ok = (data["all_planted_found_and_verified"] and not data["protected_proposed"]
          and data["write_cost"]["agrees"])
    return EXIT_OK if ok else EXIT_FAILED


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The whole workload: the demo's planted indexes found and verified in a fork, and "
                    "the write cost of a new index, replayed by AFS and measured directly.")
    parser.add_argument("--duration", type=float, default=20.0, metavar="SECONDS",
                        help="how long the demo workload runs (default 20)")
    parser.add_argument("--scale", choices=("small", "demo", "large"),
                        help="demo data size if it must be seeded (default: AFS_SCALE or demo)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object on the last line")
    args = parser.parse_args(argv)
    if args.duration <= 0:
        parser.error("--duration must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main("workload", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
