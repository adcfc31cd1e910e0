"""The demo shop's own workload: something for pg_stat_statements to rank.

    report = await run_workload(dsn, DemoWorkload(duration_s=60, clients=4, seed=1), progress=print)

`clients` connections run a mix of the shop's statements against the demo
database for `duration_s` seconds (`afs.config.DemoWorkload`, passed whole).
Every value is a bind parameter (psycopg sends them apart from the text), so
pg_stat_statements normalises each shape to one entry with $1 … $n, as it
would for an application. Ids are drawn the way the demo data is skewed
(`demo.USER_SKEW`: a few customers place most orders), so the hot rows are the
ones the data makes hot.

The mix (`SHAPES`) is mostly fast OLTP lookups by primary key, plus four
deliberately slow shapes, each missing what would make it fast:

    orders_of_customer   WHERE user_id = $1 AND status = $2 ORDER BY created_at: no index on user_id
    orders_of_product    orders joined through order_items.product_id, a foreign key with no index
    customer_total       count and sum over (user_id, status): wants a covering index
    orders_of_day        WHERE created_at::date = $1: a cast on the column defeats any index

and writes (an order's status changes, a line item is added, an order is placed,
an event is logged), each in a transaction that is rolled back: pg_stat_statements
and the table statistics count them, the demo data stays as seeded.

`plant_indexes` adds the demo's planted indexes (`demo.PLANTED_INDEXES`: a duplicate
of a primary key, a redundant prefix, indexes no statement reads) and refreshes the
forks' template, so that `afs indexes` and `afs batch` have drop advice to verify and
the writes something to maintain; `afs sandbox workload` plants them before it runs.
`ensure_pg_stat_statements` checks that the server preloads the extension and creates it in the database (the
sandbox's server preloads it: `afs.sandbox.server`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Literal

import psycopg
import trio
from psycopg.types.numeric import Int8

from afs.config import DEMO_WORKLOAD, DemoWorkload
from afs.db import Connection, open_connection
from afs.errors import DatabaseError, InputError
from afs.sandbox.demo import (
    COUNTRIES,
    EVENT_KINDS,
    ORDER_STATUSES,
    PLANTED_INDEXES,
    PRODUCT_SKEW,
    USER_SKEW,
)

STATEMENT_TIMEOUT_MS = 10_000  # a slow shape at a large scale must not hold a client forever
MAX_ERRORS_IN_A_ROW = 20  # a client that fails this often in a row stops the workload
PROGRESS_EVERY_S = 1.0

Kind = Literal["fast", "slow", "write"]


@dataclass(frozen=True)
class Shop:
    """What the parameters are drawn from, read once from the demo database."""

    users: int
    products: int
    orders: int
    first_day: date  # of the orders
    last_day: date
    events: int = 0


@dataclass(frozen=True)
class Shape:
    """One statement of the mix: its text (%s: a bind parameter), weight and values."""

    name: str
    kind: Kind
    weight: int
    sql: str
    values: Callable[[random.Random, Shop], tuple[Any, ...]]
    lacks: str = ""  # for a slow shape: what would make it fast


def skewed_id(rng: random.Random, n: int, skew: float) -> int:
    """An id in 1..n, Zipf-like: 1 + floor(n * u**skew), as the demo data picks customers."""
    return min(n, 1 + math.floor(n * float(rng.random() ** skew)))


# ids go as bigint whatever their size (psycopg would pick int2, int4 or int8 by value, and each
# parameter type is another pg_stat_statements entry)
def _user(rng: random.Random, shop: Shop) -> Int8:
    return Int8(skewed_id(rng, shop.users, USER_SKEW))


def _product(rng: random.Random, shop: Shop) -> Int8:
    return Int8(skewed_id(rng, shop.products, PRODUCT_SKEW))


def _order(rng: random.Random, shop: Shop) -> Int8:
    # recent orders are read most: the skew counts back from the newest
    return Int8(shop.orders + 1 - skewed_id(rng, shop.orders, 2.0))


def _status(rng: random.Random) -> str:
    return rng.choices(list(ORDER_STATUSES), weights=list(ORDER_STATUSES.values()))[0]


def _new_id(rng: random.Random, count: int) -> Int8:
    """An id past the last one (the write is rolled back: it never stays)."""
    return Int8(count + 1 + rng.randrange(1_000_000))


def _country(rng: random.Random) -> str:
    return rng.choices(list(COUNTRIES), weights=list(COUNTRIES.values()))[0]


def _day(rng: random.Random, shop: Shop) -> date:
    span = (shop.last_day - shop.first_day).days
    return shop.last_day - timedelta(days=min(span, int(span * rng.random() ** 2)))


SHAPES: tuple[Shape, ...] = (
    # fast: lookups by primary key
    Shape("user_by_id", "fast", 25, "SELECT id, email, country, tier FROM users WHERE id = %s",
          lambda r, s: (_user(r, s),)),
    Shape("product_by_id", "fast", 20, "SELECT id, name, category, price FROM products WHERE id = %s",
          lambda r, s: (_product(r, s),)),
    Shape("order_by_id", "fast", 20,
          "SELECT id, user_id, status, total_amount, created_at FROM orders WHERE id = %s",
          lambda r, s: (_order(r, s),)),
    Shape("items_of_order", "fast", 15,
          "SELECT line_no, product_id, quantity, unit_price FROM order_items WHERE order_id = %s"
          " ORDER BY line_no", lambda r, s: (_order(r, s),)),
    # slow: each misses what would make it fast
    Shape("orders_of_customer", "slow", 4,
          "SELECT id, total_amount, created_at FROM orders WHERE user_id = %s AND status = %s"
          " ORDER BY created_at DESC LIMIT 20",
          lambda r, s: (_user(r, s), _status(r)), "an index on orders (user_id, status, created_at)"),
    Shape("orders_of_product", "slow", 3,
          "SELECT o.id, o.created_at, i.quantity FROM order_items i JOIN orders o ON o.id = i.order_id"
          " WHERE i.product_id = %s ORDER BY o.created_at DESC LIMIT 50",
          lambda r, s: (_product(r, s),), "an index on the foreign key order_items (product_id)"),
    Shape("customer_total", "slow", 3,
          "SELECT count(*), sum(total_amount) FROM orders WHERE user_id = %s AND status = %s",
          lambda r, s: (_user(r, s), _status(r)),
          "a covering index on orders (user_id, status) INCLUDE (total_amount)"),
    Shape("orders_of_day", "slow", 2,
          "SELECT id, user_id, total_amount FROM orders WHERE created_at::date = %s",
          lambda r, s: (_day(r, s),), "a range on created_at instead of the cast, and an index on it"),
    # writes, rolled back (the demo data stays as seeded)
    Shape("set_order_status", "write", 4, "UPDATE orders SET status = %s, updated_at = now() WHERE id = %s",
          lambda r, s: (_status(r), _order(r, s))),
    Shape("add_order_item", "write", 2,
          "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price)"
          " VALUES (%s, %s, %s, %s, %s)",
          lambda r, s: (_order(r, s), Int8(100 + r.randrange(1000)), _product(r, s), Int8(1 + r.randrange(3)),
                        round(1 + 99 * r.random(), 2))),
    Shape("log_event", "write", 2,
          "INSERT INTO events (id, user_id, kind, payload, created_at) VALUES (%s, %s, %s, '{}', now())",
          lambda r, s: (_new_id(r, s.events), _user(r, s),
                        r.choices(list(EVENT_KINDS), weights=list(EVENT_KINDS.values()))[0])),
    Shape("place_order", "write", 1,
          "INSERT INTO orders (id, user_id, status, total_amount, shipping_country, created_at, updated_at)"
          " VALUES (%s, %s, 'pending', %s, %s, now(), now())",
          lambda r, s: (_new_id(r, s.orders), _user(r, s), round(1 + 499 * r.random(), 2), _country(r))),
)


def pick(rng: random.Random, shapes: Sequence[Shape] = SHAPES) -> Shape:
    return rng.choices(shapes, weights=[s.weight for s in shapes])[0]


# -- on the database ----------------------------------------------------------------------
async def ensure_pg_stat_statements(conn: Connection) -> bool:
    """pg_stat_statements preloaded by the server and created in this database (InputError
    saying how to fix it when the server does not preload it); True when created now."""
    preload = str(await conn.fetchval("SELECT current_setting('shared_preload_libraries')") or "")
    if "pg_stat_statements" not in [p.strip() for p in preload.split(",")]:
        raise InputError("the sandbox server does not preload pg_stat_statements (it was set up by an "
                         "older AFS): restart it with `afs sandbox down` then `afs sandbox up`")
    if await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"):
        return False
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


async def read_shop(conn: Connection) -> Shop:
    """Row counts and the orders' days (by primary key: created_at grows with id)."""
    row = await conn.fetchone(
        "SELECT (SELECT max(id) FROM users), (SELECT max(id) FROM products), (SELECT max(id) FROM orders),"
        " (SELECT created_at::date FROM orders ORDER BY id LIMIT 1),"
        " (SELECT created_at::date FROM orders ORDER BY id DESC LIMIT 1), (SELECT max(id) FROM events)")
    if row is None or any(v is None for v in row):
        raise InputError("the demo database has no data: run `afs sandbox reset`")
    return Shop(int(row[0]), int(row[1]), int(row[2]), row[3], row[4], int(row[5]))


async def plant_indexes(dsn: str, admin_dsn: str, database: str) -> tuple[str, ...]:
    """The demo's planted indexes (`demo.PLANTED_INDEXES`) in `database` (at `dsn`), then the
    forks' template refreshed through the provider at `admin_dsn` (only when one was missing);
    the names created now."""
    from afs.forks.provider import LocalForkProvider  # the MCP SDK: only when planting

    created = []
    async with open_connection(dsn) as conn:
        for index in PLANTED_INDEXES:
            if not await conn.fetchval("SELECT to_regclass(%s) IS NOT NULL", (index.name,)):
                await conn.execute(index.sql)
                created.append(index.name)
    if created:
        await LocalForkProvider(admin_dsn).refresh_template(database)
    return tuple(created)


@dataclass
class Tally:
    """What one shape did: calls, time, errors (the last one's message)."""

    calls: int = 0
    total_ms: float = 0.0
    errors: int = 0
    last_error: str | None = None


@dataclass
class _Counts:
    shapes: dict[str, Tally] = field(default_factory=lambda: {s.name: Tally() for s in SHAPES})

    @property
    def statements(self) -> int:
        return sum(t.calls for t in self.shapes.values())

    @property
    def errors(self) -> int:
        return sum(t.errors for t in self.shapes.values())


@dataclass(frozen=True)
class WorkloadReport:
    database: str
    clients: int
    seconds: float
    statements: int
    errors: int
    interrupted: bool
    shapes: tuple[dict[str, Any], ...]  # name, kind, calls, mean_ms, errors, lacks

    @property
    def per_second(self) -> float:
        return self.statements / self.seconds if self.seconds > 0 else 0.0


def _run_one(raw: psycopg.Connection[Any], shape: Shape, values: tuple[Any, ...]) -> None:
    if shape.kind == "write":
        with raw.transaction(force_rollback=True), raw.cursor() as cur:
            cur.execute(shape.sql, values)
        return
    with raw.cursor() as cur:
        cur.execute(shape.sql, values)
        cur.fetchall()


async def _client(dsn: str, rng: random.Random, shop: Shop, deadline: float, counts: _Counts) -> None:
    async with open_connection(dsn, STATEMENT_TIMEOUT_MS) as conn:
        in_a_row = 0
        while trio.current_time() < deadline:
            shape = pick(rng)
            values = shape.values(rng, shop)
            tally = counts.shapes[shape.name]
            t0 = trio.current_time()
            try:
                await conn.run(lambda raw, s=shape, v=values: _run_one(raw, s, v))  # type: ignore[misc]
            except psycopg.Error as exc:
                tally.errors += 1
                tally.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                in_a_row += 1
                if in_a_row >= MAX_ERRORS_IN_A_ROW:
                    raise DatabaseError(f"the workload stops: {in_a_row} statements failed in a row "
                                        f"(last, {shape.name}: {tally.last_error})") from exc
                continue
            in_a_row = 0
            tally.calls += 1
            tally.total_ms += (trio.current_time() - t0) * 1000


async def _report_progress(counts: _Counts, started: float, duration_s: float,
                           progress: Callable[[str], None]) -> None:
    last, last_at = 0, started
    while True:
        await trio.sleep(PROGRESS_EVERY_S)
        now, done = trio.current_time(), counts.statements
        rate = (done - last) / max(now - last_at, 1e-9)
        progress(f"workload: {now - started:.0f}/{duration_s:.0f} s, {done} statements "
                 f"({rate:.0f}/s), {counts.errors} errors")
        last, last_at = done, now


async def run_workload(dsn: str, plan: DemoWorkload = DEMO_WORKLOAD, *, reset: bool = False,
                       progress: Callable[[str], None] = lambda message: None,
                       stop: trio.Event | None = None) -> WorkloadReport:
    """Run the mix for `plan.duration_s` (or until `stop` is set) from `plan.clients`
    connections, its values drawn with `plan.seed`; the summary of what ran.

    The database's pg_stat_statements entries are reset first with `reset`, and when the
    extension is created now (they hold the demo data's seeding, nobody's workload)."""
    duration_s, clients, seed = plan.duration_s, plan.clients, plan.seed
    if duration_s <= 0:
        raise InputError(f"--duration must be positive, got {duration_s:g}")
    if clients < 1:
        raise InputError(f"--clients must be at least 1, got {clients}")
    async with open_connection(dsn) as conn:
        await conn.execute("SET pg_stat_statements.track = none")  # the setup is not the workload
        created = await ensure_pg_stat_statements(conn)
        if reset or created:  # created now: what it holds of this database is the seeding's
            await conn.execute("SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                               " WHERE datname = current_database()), 0)")
            # the table and index counters too (their window, pg_stat_database.stats_reset, is then
            # the workload's, as pg_stat_statements' is)
            await conn.execute("SELECT pg_stat_reset()")
        shop = await read_shop(conn)
        database = str(await conn.fetchval("SELECT current_database()"))
    counts = _Counts()
    started = trio.current_time()
    interrupted = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_report_progress, counts, started, duration_s, progress)
        if stop is not None:
            async def on_stop() -> None:
                nonlocal interrupted
                assert stop is not None
                await stop.wait()
                interrupted = True
                nursery.cancel_scope.cancel()
            nursery.start_soon(on_stop)
        async with trio.open_nursery() as running:
            for n in range(clients):
                running.start_soon(_client, dsn, random.Random(seed * 1_000 + n), shop,
                                   started + duration_s, counts)
        nursery.cancel_scope.cancel()
    shapes = tuple({"name": s.name, "kind": s.kind, "calls": counts.shapes[s.name].calls,
                    "mean_ms": round(counts.shapes[s.name].total_ms / max(1, counts.shapes[s.name].calls), 3),
                    "errors": counts.shapes[s.name].errors, "last_error": counts.shapes[s.name].last_error,
                    "lacks": s.lacks} for s in SHAPES)
    return WorkloadReport(database, clients, round(trio.current_time() - started, 2), counts.statements,
                          counts.errors, interrupted, shapes)


def summary_text(report: WorkloadReport) -> str:
    out = [f"workload on {report.database}: {report.statements} statements in {report.seconds:.1f} s "
           f"({report.per_second:.0f}/s) from {report.clients} clients, {report.errors} errors"
           + (" (stopped early)" if report.interrupted else ""),
           "  (mean ms as the clients saw it, round trip included; pg_stat_statements has the server's)"]
    width = max(len(s["name"]) for s in report.shapes)
    for s in report.shapes:
        line = f"  {s['name']:<{width}}  {s['kind']:<5}  {s['calls']:>7} calls  {s['mean_ms']:>9.2f} ms mean"
        if s["errors"]:
            line += f"  {s['errors']} errors (last: {s['last_error']})"
        if s["lacks"]:
            line += f"  — lacks {s['lacks']}"
        out.append(line)
    out.append("next: `afs batch --top 5` ranks these statements by total time and optimizes them")
    return "\n".join(out)

