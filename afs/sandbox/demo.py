"""SQL that seeds the sandbox's demo database: a small e-commerce shop.

Five tables, built for query-optimization demos (primary keys and foreign
keys only: finding the missing indexes is the point of the demo):

    users(id, email, country, tier, created_at)
    products(id, name, category, price)
    orders(id, user_id → users, status, total_amount, shipping_country,
           created_at, updated_at)
    order_items(order_id → orders, line_no, product_id → products,
                quantity, unit_price)
    events(id, user_id, kind, payload jsonb, created_at)

The data is skewed the way real data is, so that the planner's choices depend
on the values queried:

- **Customers are Zipf-like.** An order (or event) picks its user as
  ``1 + floor(active_users * u**USER_SKEW)``: user 1 has tens of thousands
  of orders at the ``demo`` scale, the median user about ten. Low ids are the
  oldest customers, and only users who had signed up by the order's time
  are picked, so no order predates its customer.
- **Popular products** likewise: ``1 + floor(products * u**PRODUCT_SKEW)``.
- **Categorical columns** follow fixed weights: order status (completed 60 %,
  shipped 15 %, paid 10 %, cancelled 7 %, pending 5 %, refunded 3 %),
  countries (US 30 %, a long tail of 13 others), user tier (free 80 %),
  event kind (page views 55 %) and a few more below.
- **Time is correlated with id.** Users signed up over three years, orders
  span two years and events 90 days, all ending at the fixed ``END`` (never
  ``now()``); ``created_at`` grows with ``id`` up to a little jitter, so the
  heap is physically in time order. ``updated_at >= created_at``.
- **Line items** per order are uniform on 1..``2 * items_per_order - 1``
  (rounded up: 1..5 for the default 2.75, with 5 half as likely), and
  ``orders.total_amount`` is exactly the sum of its items.

Determinism: every pseudo-random value is ``hashint8extended(key, salt)`` of
the row's id, with a salt derived from the seed and a stream name, so the
data depends only on the scale and the seed, never on the plan, the row
order or ``random()``. Each table is made with one ``CREATE TABLE … AS
SELECT`` from ``generate_series`` (with ``wal_level = minimal`` a table
created and filled in one transaction skips the WAL); keys, NOT NULLs and
foreign keys are added after loading, then everything is analyzed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Scale:
    """Row counts of one size of the demo data set."""

    name: str
    users: int
    products: int
    orders: int
    events: int
    items_per_order: float  # average line items per order, in [1, 3]


SCALES: dict[str, Scale] = {
    s.name: s
    for s in (
        # Scale(name, users, products, orders, events, items_per_order)
        Scale("small", 2_000, 200, 50_000, 20_000, 2.75),
        Scale("demo", 100_000, 2_000, 2_000_000, 500_000, 2.75),
        Scale("large", 500_000, 5_000, 8_000_000, 2_000_000, 2.75),
    )
}

END = "2026-01-01 00:00:00+00"  # every timeline ends here
DAY = 86_400  # seconds
USER_SPAN = 3 * 365 * DAY  # users signed up over the three years before END
ORDER_SPAN = 2 * 365 * DAY
EVENT_SPAN = 90 * DAY
JITTER = 3_600  # seconds a row's created_at may lag behind its id's slot
MAX_UPDATE_DELAY = 30 * DAY  # updated_at - created_at past pending (never beyond END)

USER_SKEW = 3.0  # exponent of the Zipf-like user choice: higher, more skewed
PRODUCT_SKEW = 2.0
QUANTITY_SKEW = 3.0  # most lines have quantity 1, a few up to MAX_QUANTITY
MAX_QUANTITY = 4
MIN_PRICE, MAX_PRICE = 1, 500  # prices lean cheap: MIN + (MAX - MIN) * u**3
SAME_COUNTRY_SHARE = 0.9  # orders shipped to the customer's own country

# Weighted choices: value -> weight (weights need not sum to 100).
COUNTRIES = {
    "US": 30, "GB": 10, "DE": 9, "IN": 8, "FR": 7, "BR": 6, "CA": 5,
    "JP": 5, "AU": 4, "ES": 4, "IT": 4, "NL": 3, "MX": 3, "PL": 2,
}  # fmt: skip
TIERS = {"free": 80, "pro": 17, "enterprise": 3}
EMAIL_DOMAINS = {"gmail.com": 40, "outlook.com": 15, "yahoo.com": 10, "example.com": 35}
ORDER_STATUSES = {
    "completed": 60, "shipped": 15, "paid": 10, "cancelled": 7, "pending": 5, "refunded": 3,
}  # fmt: skip
CATEGORIES = {
    "electronics": 15, "books": 14, "clothing": 13, "home": 11, "sports": 9, "toys": 8,
    "beauty": 8, "grocery": 7, "garden": 5, "automotive": 4, "music": 3, "office": 3,
}  # fmt: skip
EVENT_KINDS = {
    "page_view": 55, "click": 20, "search": 10, "add_to_cart": 8, "login": 4, "checkout": 3,
}  # fmt: skip
DEVICES = {"desktop": 45, "ios": 25, "android": 25, "tablet": 5}
LOGIN_METHODS = {"password": 70, "google": 20, "sso": 10}
# Equally likely choices.
ADJECTIVES = ("Classic", "Compact", "Deluxe", "Eco", "Premium", "Smart", "Ultra", "Vintage")
NOUNS = ("Bag", "Bottle", "Cable", "Chair", "Jacket", "Kit", "Lamp", "Mug", "Speaker", "Watch")
SEARCH_TERMS = ("shoes", "laptop", "gift", "coffee", "headphones", "desk", "yoga mat", "lego")

_KEYS = {  # table: (primary key, the other columns, all NOT NULL)
    "users": ("id", "email, country, tier, created_at"),
    "products": ("id", "name, category, price"),
    "orders": ("id", "user_id, status, total_amount, shipping_country, created_at, updated_at"),
    "order_items": ("order_id, line_no", "product_id, quantity, unit_price"),
    "events": ("id", "user_id, kind, payload, created_at"),
}
_MASK53 = (1 << 53) - 1  # a double holds 53 bits exactly
_LINE_SLOTS = 8  # order_items key = order_id * _LINE_SLOTS + line_no


@dataclass(frozen=True)
class PlantedIndex:
    """An index the demo workload adds (`afs.sandbox.workload.plant_indexes`), for the index
    review to find: `kind` is what it is planted as (duplicate, redundant, unused)."""

    name: str
    kind: str
    sql: str
    why: str


# Not part of the seeded data (the seed has primary and foreign keys only: finding the missing
# indexes is the point of the demo); none of them serves the slow shapes of the workload.
PLANTED_INDEXES: tuple[PlantedIndex, ...] = (
    PlantedIndex("order_items_order_line_idx", "duplicate",
                 "CREATE INDEX IF NOT EXISTS order_items_order_line_idx ON order_items (order_id, line_no)",
                 "the same definition as the primary key order_items_pkey"),
    PlantedIndex("events_user_idx", "redundant",
                 "CREATE INDEX IF NOT EXISTS events_user_idx ON events (user_id)",
                 "a prefix of events_user_created_idx"),
    PlantedIndex("events_user_created_idx", "unused",
                 "CREATE INDEX IF NOT EXISTS events_user_created_idx ON events (user_id, created_at)",
                 "no statement of the workload reads events by user"),
    PlantedIndex("orders_shipping_country_idx", "unused",
                 "CREATE INDEX IF NOT EXISTS orders_shipping_country_idx ON orders (shipping_country)",
                 "no statement of the workload filters on shipping_country; every new order maintains it"),
)


def seed_statements(scale: str, seed: int = 42) -> list[str]:
    """The SQL statements that create and fill the demo tables at `scale`.

    Run them in order, in autocommit mode, in an empty database (existing
    demo tables are dropped first). The same scale and seed always give the
    same rows.
    """
    try:
        size = SCALES[scale]
    except KeyError:
        valid = ", ".join(SCALES)
        raise ValueError(f"unknown demo scale {scale!r}; valid scales: {valid}") from None
    gen = _Gen(seed)
    return [
        "SET maintenance_work_mem = '256MB'",
        "SET synchronous_commit = off",
        "DROP TABLE IF EXISTS events, order_items, orders, products, users CASCADE",
        _users(gen, size),
        _products(gen, size),
        _orders(gen, size),
        _order_items(gen, size),
        _events(gen, size),
        *(_with_keys(table, key, columns) for table, (key, columns) in _KEYS.items()),
        "ALTER TABLE orders ADD FOREIGN KEY (user_id) REFERENCES users",
        "ALTER TABLE order_items ADD FOREIGN KEY (order_id) REFERENCES orders",
        "ALTER TABLE order_items ADD FOREIGN KEY (product_id) REFERENCES products",
        # VACUUM sets the visibility map, so index-only scans work in the forks at once; it
        # marks a page all-visible only once the inserting commits are flushed (they were
        # asynchronous): flush them first
        "SET synchronous_commit = on",
        "SELECT pg_catalog.txid_current()",
        "VACUUM (ANALYZE)",
    ]


class _Gen:
    """SQL expressions for the pseudo-random values of one seed."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def uniform(self, key: str, stream: str) -> str:
        """A float8 in [0, 1), a function of `key` (a bigint expression)."""
        digest = hashlib.blake2b(f"{self.seed}:{stream}".encode(), digest_size=8).digest()
        salt = int.from_bytes(digest, "big", signed=True)
        bits = f"(hashint8extended(({key})::bigint, {salt}) & {_MASK53})"
        return f"({bits}::float8 / {_MASK53 + 1}::float8)"

    def choice(self, weights: Mapping[str, int], key: str, stream: str) -> str:
        """One of the keys of `weights`, drawn with their weights."""
        total = sum(weights.values())
        bounds, running = [], 0
        for weight in list(weights.values())[:-1]:
            running += weight
            bounds.append(repr(running / total))
        values = ", ".join(_literal(value) for value in weights)
        bucket = f"width_bucket({self.uniform(key, stream)}, ARRAY[{', '.join(bounds)}]::float8[])"
        return f"(ARRAY[{values}])[{bucket} + 1]"

    def pick(self, values: Sequence[str], key: str, stream: str) -> str:
        """One of `values`, all equally likely."""
        return self.choice(dict.fromkeys(values, 1), key, stream)

    def skewed_id(self, count: str, skew: float, key: str, stream: str) -> str:
        """An id in 1..`count`, Zipf-like: id 1 is the most frequent."""
        return f"(1 + floor(({count}) * {self.uniform(key, stream)} ^ {skew})::bigint)"

    def country(self, user_id: str) -> str:
        return self.choice(COUNTRIES, user_id, "users.country")

    def price(self, product_id: str) -> str:
        u = self.uniform(product_id, "products.price")
        return f"round(({MIN_PRICE} + {MAX_PRICE - MIN_PRICE} * {u} ^ 3)::numeric, 2)"

    def line_count(self, order_id: str, size: Scale) -> str:
        spread = 2 * size.items_per_order - 1
        return f"(1 + floor({spread} * {self.uniform(order_id, 'orders.lines')})::int)"

    def line(self, order_id: str, line_no: str, size: Scale) -> tuple[str, str]:
        """(product_id, quantity) of one order line."""
        key = f"({order_id})::bigint * {_LINE_SLOTS} + ({line_no})"
        product = self.skewed_id(str(size.products), PRODUCT_SKEW, key, "order_items.product")
        u = self.uniform(key, "order_items.quantity")
        quantity = f"(1 + floor({MAX_QUANTITY} * {u} ^ {QUANTITY_SKEW})::int)"
        return product, quantity

    def timeline(
        self, row_id: str, count: int, span: int, users: int, stream: str
    ) -> tuple[str, str]:
        """(created_at, signed-up users) of row `row_id` of `count`, spread over `span`.

        created_at grows with the id, minus up to JITTER. Users sign up in id
        order over USER_SPAN (see `_users`): users 1..signed-up had all signed
        up by created_at, so they alone may own the row.
        """
        slot = f"{span} * (({row_id}) - 1)::float8 / {count}"  # seconds after the span's start
        seconds_before_end = f"({span} - {slot} + {JITTER} * {self.uniform(row_id, stream)})"
        since_first_signup = f"({USER_SPAN - span - JITTER} + {slot})"
        signed_up = f"greatest(1, floor({users} * {since_first_signup} / {USER_SPAN}))"
        return _before_end(seconds_before_end), signed_up


def _users(gen: _Gen, size: Scale) -> str:
    slot = f"{USER_SPAN}::float8 * (id - 1) / {size.users}"
    jitter = f"{DAY} * {gen.uniform('id', 'users.signup')}"
    created_at = _before_end(f"({USER_SPAN} - {slot} + {jitter})")
    return f"""
CREATE TABLE users AS
SELECT id::bigint AS id,
       'user' || id || '@' || {gen.choice(EMAIL_DOMAINS, "id", "users.email")} AS email,
       {gen.country("id")} AS country,
       {gen.choice(TIERS, "id", "users.tier")} AS tier,
       {created_at} AS created_at
FROM generate_series(1, {size.users}) AS id"""


def _products(gen: _Gen, size: Scale) -> str:
    return f"""
CREATE TABLE products AS
SELECT id::bigint AS id,
       {gen.pick(ADJECTIVES, "id", "products.adjective")} || ' '
           || {gen.pick(NOUNS, "id", "products.noun")} || ' #' || id AS name,
       {gen.choice(CATEGORIES, "id", "products.category")} AS category,
       {gen.price("id")}::numeric(10,2) AS price
FROM generate_series(1, {size.products}) AS id"""


def _orders(gen: _Gen, size: Scale) -> str:
    created_at, signed_up = gen.timeline("id", size.orders, ORDER_SPAN, size.users, "orders.time")
    lines = gen.line_count("id", size)
    terms = []
    for line_no in range(1, math.ceil(2 * size.items_per_order - 1) + 1):
        product, quantity = gen.line("id", str(line_no), size)
        amount = f"{quantity} * {gen.price(product)}"
        terms.append(f"CASE WHEN {lines} >= {line_no} THEN {amount} ELSE 0 END")
    total = "\n           + ".join(terms)
    until_end = f"extract(epoch FROM TIMESTAMPTZ '{END}' - created_at)::float8"
    delay = f"least({MAX_UPDATE_DELAY}, {until_end}) * {gen.uniform('id', 'orders.updated_at')} ^ 2"
    return f"""
CREATE TABLE orders AS
SELECT id, user_id, status, total_amount,
       CASE WHEN {gen.uniform("id", "orders.same_country")} < {SAME_COUNTRY_SHARE}
            THEN {gen.country("user_id")}
            ELSE {gen.choice(COUNTRIES, "id", "orders.shipping_country")} END AS shipping_country,
       created_at,
       CASE WHEN status = 'pending' THEN created_at
            ELSE created_at + {delay} * INTERVAL '1 second' END AS updated_at
FROM (
    SELECT id::bigint AS id,
           {gen.skewed_id(signed_up, USER_SKEW, "id", "orders.user_id")} AS user_id,
           {gen.choice(ORDER_STATUSES, "id", "orders.status")} AS status,
           ({total})::numeric(12,2) AS total_amount,
           {created_at} AS created_at
    FROM generate_series(1, {size.orders}) AS id
) AS o"""


def _order_items(gen: _Gen, size: Scale) -> str:
    product, quantity = gen.line("order_id", "line_no", size)
    return f"""
CREATE TABLE order_items AS
SELECT order_id, line_no, product_id, quantity,
       {gen.price("product_id")}::numeric(10,2) AS unit_price
FROM (
    SELECT order_id::bigint AS order_id, line_no,
           {product} AS product_id,
           {quantity} AS quantity
    FROM generate_series(1, {size.orders}) AS order_id
    CROSS JOIN LATERAL generate_series(1, {gen.line_count("order_id", size)}) AS line_no
) AS l"""


def _events(gen: _Gen, size: Scale) -> str:
    created_at, signed_up = gen.timeline("id", size.events, EVENT_SPAN, size.users, "events.time")
    device = gen.choice(DEVICES, "id", "events.device")
    query = gen.pick(SEARCH_TERMS, "id", "events.query")
    method = gen.choice(LOGIN_METHODS, "id", "events.method")
    product = gen.skewed_id(str(size.products), PRODUCT_SKEW, "id", "events.product")
    return f"""
CREATE TABLE events AS
SELECT id, user_id, kind,
       CASE kind
           WHEN 'search' THEN jsonb_build_object('device', {device}, 'query', {query})
           WHEN 'login' THEN jsonb_build_object('device', {device}, 'method', {method})
           ELSE jsonb_build_object('device', {device}, 'product_id', {product})
       END AS payload,
       created_at
FROM (
    SELECT id::bigint AS id,
           {gen.skewed_id(signed_up, USER_SKEW, "id", "events.user_id")} AS user_id,
           {gen.choice(EVENT_KINDS, "id", "events.kind")} AS kind,
           {created_at} AS created_at
    FROM generate_series(1, {size.events}) AS id
) AS e"""


def _with_keys(table: str, key: str, columns: str) -> str:
    """Add the primary key `key` and make `columns` NOT NULL, in one pass."""
    not_null = "".join(f", ALTER COLUMN {column} SET NOT NULL" for column in columns.split(", "))
    return f"ALTER TABLE {table} ADD PRIMARY KEY ({key}){not_null}"


def _before_end(seconds: str) -> str:
    return f"(TIMESTAMPTZ '{END}' - ({seconds}) * INTERVAL '1 second')"


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
