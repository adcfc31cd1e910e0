"""The corpus of `quality.py`: public advisor cases with their known-good fix (the oracle).

Each case is rebuilt from a public source: an advisor's own test suite or docs
(Dexter, postgres-mcp, HypoPG, pg_qualstats), PostgreSQL's docs and wiki, or
Markus Winand's "Use The Index, Luke" (UTIL). The sources were written down from
memory (no network here): `source` names the document and the shape taken from
it; where a case follows common advice rather than one public test, it says so.

A case is plain data:

    schema   statements run first (tables, keys, extensions)
    data     statements that fill the tables with generate_series: deterministic
             (hashint4 of the row number, no random()), skewed where real data is,
             ending with VACUUM ANALYZE; `{name}` is replaced by the scaled row count
             `sizes[name]` (or by a server-dependent value, see `environment`)
    query    the slow query
    oracle   the known-good fix: DDL (`oracle_ddl`), a rewrite returning the same rows
             (`oracle_query`), and per-query settings (`oracle_settings`, applied with
             SET LOCAL); an empty oracle means "nothing to do: do not make it slower"
    params   `oracle_params`: a query run in the fork before anything is changed, whose
             one row fills `{p0}`, `{p1}`, … in `oracle_query` (the keyset of a page)

Sizes are the full run's (scale 1.0): 0.3-2 M rows in the main table, a baseline of
roughly 20-500 ms on two cores, a few seconds to build. The cases of issue 25 (from
`join3_lookup_by_email` on) are shapes an agent reaches only by reading the plan its first
change leaves: an index per table of a join path, the correlation key of a subquery run per
outer row (0.5-1.5 s baselines), a covering column against a plain index, a sort direction,
an index kind other than the B-tree (GIN over an expression, GiST, BRIN); and one slow
baseline (`statement_timeout_ms`: about 5 s against a 1.5 s timeout and cap).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    schema: tuple[str, ...]
    data: tuple[str, ...]
    query: str
    oracle_ddl: tuple[str, ...] = ()
    oracle_query: str | None = None
    oracle_settings: Mapping[str, str] = field(default_factory=dict)
    oracle_params: str | None = None
    sizes: Mapping[str, int] = field(default_factory=dict)
    note: str = ""
    quick: bool = False  # part of the --quick subset (fast to build and to run)
    # the user's statement timeout for AFS's task on this case, in ms (None: the settings'); a
    # slow-baseline case scales it down with its data, so the query is beyond it (and beyond the
    # slow-baseline cap, set to the same) in benchmark time, as a slow query is on a user's server
    statement_timeout_ms: int | None = None

    @property
    def oracle_text(self) -> str:
        """The oracle in one line."""
        parts = [*self.oracle_ddl]
        if self.oracle_query is not None:
            parts.append("rewrite: " + " ".join(self.oracle_query.split()))
        parts += [f"SET LOCAL {k} = {v}" for k, v in self.oracle_settings.items()]
        return "; ".join(parts) or "nothing (already fast)"


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def render(sql: str, values: Mapping[str, object]) -> str:
    """Replace `{name}` for the names in `values`; anything else (JSON, arrays) stays."""
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0),
                            sql)


def scaled(sizes: Mapping[str, int], scale: float, floor: int = 200) -> dict[str, int]:
    return {k: max(min(floor, v), math.ceil(v * scale)) for k, v in sizes.items()}


def u(salt: int) -> str:
    """SQL for a uniform number in [0, 1) derived from the row number `i` and a salt."""
    return f"((hashint4(i * 7 + {salt}) & 2147483647)::float8 / 2147483648)"


def skewed(n: str, salt: int, power: float = 2.0) -> str:
    """SQL for an id in 1..{n}, Zipf-like: low ids are the busy ones."""
    return f"(1 + floor({{{n}}} * power({u(salt)}, {power}))::int)"


def pick(words: list[str], salt: int) -> str:
    """SQL for one of `words`, uniformly."""
    array = "ARRAY[" + ", ".join("'" + w + "'" for w in words) + "]"
    return f"({array})[1 + floor({u(salt)} * {len(words)})::int]"


VACUUM = "VACUUM ANALYZE"

# -- shared shapes -------------------------------------------------------------------------
SHOP_SCHEMA = (
    "CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, country text NOT NULL,"
    " email text NOT NULL)",
    "CREATE TABLE products (id integer PRIMARY KEY, name text NOT NULL, category_id integer NOT NULL,"
    " price numeric(10,2) NOT NULL)",
    "CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer NOT NULL,"
    " status text NOT NULL, total numeric(12,2) NOT NULL, created_at timestamp NOT NULL)",
    "CREATE TABLE order_items (id integer PRIMARY KEY, order_id integer NOT NULL,"
    " product_id integer NOT NULL, quantity integer NOT NULL, unit_price numeric(10,2) NOT NULL)",
)
COUNTRIES = ["DE", "FR", "US", "GB", "JP", "BR", "IN", "NZ", "CA", "ES"]
SHOP_CUSTOMERS = (
    "INSERT INTO customers SELECT i, 'customer ' || i,"
    # country IS only for every 5000th customer: a rare value
    f" CASE WHEN i % 5000 = 0 THEN 'IS' ELSE {pick(COUNTRIES, 1)} END,"
    " 'customer' || i || '@example.com' FROM generate_series(1, {customers}) i"
)
SHOP_PRODUCTS = (
    "INSERT INTO products SELECT i, 'product ' || i, 1 + i % 50,"
    f" round((5 + 200 * {u(2)})::numeric, 2) FROM generate_series(1, {{products}}) i"
)
SHOP_ORDERS = (
    f"INSERT INTO orders SELECT i, {skewed('customers', 3)},"
    " CASE WHEN i % 100 < 3 THEN 'returned' WHEN i % 100 < 8 THEN 'pending'"
    " WHEN i % 100 < 10 THEN 'cancelled' ELSE 'shipped' END,"
    f" round((10 + 490 * {u(4)})::numeric, 2),"
    " timestamp '2023-01-01' + (i::float8 / {orders}) * interval '730 days'"
    " FROM generate_series(1, {orders}) i"
)
SHOP_ITEMS = (
    f"INSERT INTO order_items SELECT i, 1 + (i - 1) / 3, {skewed('products', 5)},"
    f" 1 + floor(5 * {u(6)})::int, round((5 + 200 * {u(7)})::numeric, 2)"
    " FROM generate_series(1, {items}) i"
)
SHOP_FOREIGN_KEYS = (
    "ALTER TABLE orders ADD FOREIGN KEY (customer_id) REFERENCES customers",
    "ALTER TABLE order_items ADD FOREIGN KEY (order_id) REFERENCES orders",
    "ALTER TABLE order_items ADD FOREIGN KEY (product_id) REFERENCES products",
)

LAST_NAMES = ["Smith", "Miller", "Garcia", "Martin", "Schmidt", "Novak", "Rossi", "Tanaka",
              "Kowalski", "Jensen", "Dubois", "Silva", "Kim", "Nguyen", "Hansen", "Weber"]
ADJECTIVES = ["Compact", "Deluxe", "Classic", "Rugged", "Smart", "Vintage", "Slim", "Pro"]
MATERIALS = ["steel", "oak", "titanium", "glass", "copper", "bamboo", "ceramic", "wool", "linen", "carbon"]
THINGS = ["kettle", "lamp", "chair", "desk", "shelf", "mug", "clock", "vase", "rug", "fan", "stool",
          "tray", "bowl", "frame", "hook"]
SOURCES = ["web", "ios", "android", "api", "pos", "kiosk", "partner", "batch", "email", "other"]
FIRST_NAMES = ["Anna", "Ben", "Chloe", "David", "Emma", "Felix", "Greta", "Hugo", "Ida", "Jonas"]


# -- the cases ------------------------------------------------------------------------------
CASES: tuple[Case, ...] = (
    Case(
        name="join4_dim_ids",
        source="postgres-mcp tests/unit/index (DTA index tuning of multi-table join workloads);"
               " Dexter test/index_test.rb join tests — shape: join filtered on two dimension ids",
        schema=SHOP_SCHEMA,
        data=(SHOP_CUSTOMERS, SHOP_PRODUCTS, SHOP_ORDERS, SHOP_ITEMS, *SHOP_FOREIGN_KEYS, VACUUM),
        sizes={"customers": 50_000, "products": 5_000, "orders": 500_000, "items": 1_500_000},
        query="SELECT o.id, o.created_at, p.name, oi.quantity FROM customers c"
              " JOIN orders o ON o.customer_id = c.id JOIN order_items oi ON oi.order_id = o.id"
              " JOIN products p ON p.id = oi.product_id"
              " WHERE c.id = 1234 AND p.id <= 20 ORDER BY o.id, oi.quantity",
        oracle_ddl=("CREATE INDEX qc_orders_customer ON orders (customer_id)",
                    "CREATE INDEX qc_items_order ON order_items (order_id)",
                    "CREATE INDEX qc_items_product ON order_items (product_id)"),
        note="an index on every foreign key the join walks: 3 indexes on 2 tables",
    ),
    Case(
        name="covering_sum",
        source="Use The Index, Luke: ch. 'Index-Only Scan' (SUM(eur_value) WHERE subsidiary_id = ?)",
        schema=("CREATE TABLE sales (id bigint PRIMARY KEY, subsidiary_id integer NOT NULL,"
                " sale_date date NOT NULL, eur_value numeric(12,2) NOT NULL, notes text)",),
        data=(f"INSERT INTO sales SELECT i, {skewed('subsidiaries', 11, 1.5)},"
              " date '2022-01-01' + (i::float8 / {sales} * 1095)::int,"
              f" round((1 + 999 * {u(12)})::numeric, 2),"
              " 'order note ' || md5(i::text) FROM generate_series(1, {sales}) i", VACUUM),
        sizes={"sales": 1_000_000, "subsidiaries": 30},
        query="SELECT count(*), sum(eur_value) FROM sales WHERE subsidiary_id = 7",
        oracle_ddl=("CREATE INDEX qc_sales_subsidiary ON sales (subsidiary_id) INCLUDE (eur_value)",),
        note="count and sum over one value of a low-cardinality column: an index-only scan",
        quick=True,
    ),
    Case(
        name="partial_rare_status",
        source="Use The Index, Luke: ch. 'Partial Indexes' (queue: WHERE processed = 'N');"
               " PostgreSQL docs 11.8 'Partial Indexes'",
        schema=("CREATE TABLE messages (id bigint PRIMARY KEY, receiver integer NOT NULL,"
                " processed char(1) NOT NULL, created_at timestamp NOT NULL, message text NOT NULL)",),
        data=("INSERT INTO messages SELECT i, 1 + i % 10000,"
              f" CASE WHEN {u(21)} < 0.002 THEN 'N' ELSE 'Y' END,"
              " timestamp '2024-01-01' + i * interval '1 second', 'message body ' || md5(i::text)"
              " FROM generate_series(1, {messages}) i", VACUUM),
        sizes={"messages": 1_000_000},
        query="SELECT id, receiver, message FROM messages WHERE processed = 'N'"
              " ORDER BY created_at, id LIMIT 100",
        oracle_ddl=("CREATE INDEX qc_messages_unprocessed ON messages (created_at, id)"
                    " WHERE processed = 'N'",),
        note="the rare status in the index predicate, the sort key as the index key",
    ),
    Case(
        name="composite_eq_range",
        source="Use The Index, Luke: ch. 'Greater, Less and BETWEEN'"
               " (subsidiary_id = ? AND date_of_birth BETWEEN ...: equality column first)",
        schema=("CREATE TABLE employees (employee_id integer PRIMARY KEY, subsidiary_id integer NOT NULL,"
                " first_name text NOT NULL, last_name text NOT NULL, date_of_birth date NOT NULL,"
                " phone_number text)",),
        data=(f"INSERT INTO employees SELECT i, {skewed('subsidiaries', 31, 1.5)},"
              f" {pick(FIRST_NAMES, 32)}, {pick(LAST_NAMES, 33)},"
              f" date '1950-01-01' + floor({u(34)} * 20000)::int, '+49 ' || i"
              " FROM generate_series(1, {employees}) i", VACUUM),
        sizes={"employees": 1_000_000, "subsidiaries": 200},
        query="SELECT first_name, last_name, date_of_birth FROM employees"
              " WHERE date_of_birth >= DATE '1971-01-01' AND date_of_birth <= DATE '1971-01-09'"
              " AND subsidiary_id = 27",
        oracle_ddl=("CREATE INDEX qc_employees_sub_dob ON employees (subsidiary_id, date_of_birth)",),
    ),
    Case(
        name="order_limit_trap",
        source="Use The Index, Luke: ch. 'Querying Top-N Rows' (a pipelined top-N needs the"
               " WHERE column before the ORDER BY column in the index)",
        schema=("CREATE TABLE events (id bigint PRIMARY KEY, user_id integer NOT NULL,"
                " kind text NOT NULL, created_at timestamp NOT NULL, payload text)",),
        data=("INSERT INTO events SELECT i, 1 + (i - 1) / 100,"
              f" {pick(['view', 'click', 'cart', 'buy'], 41)},"
              " timestamp '2023-01-01' + i * interval '10 seconds', md5(i::text)"
              " FROM generate_series(1, {events}) i", VACUUM),
        sizes={"events": 1_000_000},
        query="SELECT id, kind, created_at FROM events WHERE user_id = 42 ORDER BY id DESC LIMIT 10",
        oracle_ddl=("CREATE INDEX qc_events_user_id ON events (user_id, id)",),
        note="the planner walks the primary key backwards hoping to meet user 42 soon;"
             " user 42's rows are the oldest",
    ),
    Case(
        name="or_two_columns",
        source="PostgreSQL docs 11.5 'Combining Multiple Indexes' (WHERE x = 42 OR y = 42)",
        schema=("CREATE TABLE transfers (id bigint PRIMARY KEY, from_account integer NOT NULL,"
                " to_account integer NOT NULL, amount numeric(12,2) NOT NULL,"
                " created_at timestamp NOT NULL)",),
        data=(f"INSERT INTO transfers SELECT i, {skewed('accounts', 51, 1.3)},"
              f" {skewed('accounts', 52, 1.3)}, round((1 + 999 * {u(53)})::numeric, 2),"
              " timestamp '2023-01-01' + i * interval '15 seconds'"
              " FROM generate_series(1, {transfers}) i", VACUUM),
        sizes={"transfers": 1_000_000, "accounts": 50_000},
        query="SELECT id, from_account, to_account, amount FROM transfers"
              " WHERE from_account = 4711 OR to_account = 4711",
        oracle_ddl=("CREATE INDEX qc_transfers_from ON transfers (from_account)",
                    "CREATE INDEX qc_transfers_to ON transfers (to_account)"),
        note="two single-column indexes combined with a BitmapOr",
    ),
    Case(
        name="like_infix_trgm",
        source="pg_trgm docs: 'Index Support' (gin_trgm_ops serves LIKE '%foo%bar')",
        schema=("CREATE EXTENSION IF NOT EXISTS pg_trgm",
                "CREATE TABLE catalog_items (id integer PRIMARY KEY, name text NOT NULL, stock integer)"),
        data=("INSERT INTO catalog_items SELECT i,"
              f" {pick(ADJECTIVES, 61)} || ' ' || {pick(MATERIALS, 62)} || ' ' || {pick(THINGS, 63)}"
              " || ' #' || i, i % 100 FROM generate_series(1, {items}) i", VACUUM),
        sizes={"items": 500_000},
        query="SELECT id, name FROM catalog_items WHERE name LIKE '%titanium kettle%'",
        oracle_ddl=("CREATE INDEX qc_items_name_trgm ON catalog_items USING gin (name gin_trgm_ops)",),
    ),
    Case(
        name="ilike_trgm",
        source="pg_qualstats README: the index advisor lists ILIKE (~~*) quals as not optimisable"
               " by a btree; pg_trgm docs: gin_trgm_ops serves ILIKE",
        schema=("CREATE EXTENSION IF NOT EXISTS pg_trgm",
                "CREATE TABLE contacts (id integer PRIMARY KEY, full_name text NOT NULL,"
                " city text NOT NULL)"),
        data=("INSERT INTO contacts SELECT i, "
              f"{pick(FIRST_NAMES, 71)} || ' ' || CASE WHEN i % 2000 = 0 THEN 'Zimmermann'"
              f" ELSE {pick(LAST_NAMES, 72)} END || '-' || (i % 997),"
              f" {pick(['Berlin', 'Lyon', 'Austin', 'Osaka', 'Leeds'], 73)}"
              " FROM generate_series(1, {contacts}) i", VACUUM),
        sizes={"contacts": 500_000},
        query="SELECT id, full_name FROM contacts WHERE full_name ILIKE '%zimmer%'",
        oracle_ddl=("CREATE INDEX qc_contacts_name_trgm ON contacts USING gin (full_name gin_trgm_ops)",),
    ),
    Case(
        name="jsonb_contains",
        source="PostgreSQL docs 8.14.4 'jsonb Indexing' (jdoc @> '{\"company\": ...}'"
               " with a jsonb_path_ops GIN index)",
        schema=("CREATE TABLE api_events (id bigint PRIMARY KEY, doc jsonb NOT NULL,"
                " created_at timestamp NOT NULL)",),
        data=("INSERT INTO api_events SELECT i, jsonb_build_object("
              f"'type', CASE WHEN {u(81)} < 0.02 THEN 'refund' ELSE"
              f" {pick(['view', 'search', 'purchase', 'login'], 82)} END,"
              f" 'source', {pick(SOURCES, 83)},"
              " 'user', 1 + i % 50000, 'amount', i % 1000),"
              " timestamp '2024-01-01' + i * interval '5 seconds'"
              " FROM generate_series(1, {events}) i", VACUUM),
        sizes={"events": 500_000},
        query="SELECT id, doc->>'amount' AS amount FROM api_events"
              " WHERE doc @> '{\"type\": \"refund\", \"source\": \"ios\"}'",
        oracle_ddl=("CREATE INDEX qc_api_events_doc ON api_events USING gin (doc jsonb_path_ops)",),
    ),
    Case(
        name="prefix_like_collation",
        source="PostgreSQL docs 11.10 'Operator Classes and Operator Families' (text_pattern_ops"
               " for LIKE 'foo%' under a non-C locale); Use The Index, Luke: ch. 'LIKE Filters'",
        schema=("CREATE TABLE people (id integer PRIMARY KEY,"
                " last_name text {collate_clause} NOT NULL, first_name text NOT NULL)",),
        data=("INSERT INTO people SELECT i, CASE WHEN i % 5000 = 0 THEN 'Winand' ELSE"
              f" {pick(LAST_NAMES, 91)} END || lpad((i % 9973)::text, 4, '0'),"
              f" {pick(FIRST_NAMES, 92)} FROM generate_series(1, {{people}}) i", VACUUM),
        sizes={"people": 1_000_000},
        query="SELECT id, last_name, first_name FROM people WHERE last_name LIKE 'Winand%'",
        oracle_ddl=("CREATE INDEX qc_people_last_name ON people (last_name {pattern_opclass})",),
        note="the column gets a non-C collation (libc C.UTF-8 counts: PostgreSQL treats only"
             " C and POSIX as C), so LIKE 'x%' needs text_pattern_ops",
    ),
    Case(
        name="lower_email",
        source="Use The Index, Luke: ch. 'Case-Insensitive Search Using UPPER or LOWER'"
               " (function-based index)",
        schema=("CREATE TABLE users (id integer PRIMARY KEY, email text NOT NULL, name text NOT NULL,"
                " created_at timestamp NOT NULL)",),
        data=("INSERT INTO users SELECT i, 'User' || i || '@Example.COM', 'user ' || i,"
              " timestamp '2020-01-01' + i * interval '1 minute' FROM generate_series(1, {users}) i",
              VACUUM),
        sizes={"users": 1_000_000},
        query="SELECT id, email FROM users WHERE lower(email) = 'user4242@example.com'",
        oracle_ddl=("CREATE INDEX qc_users_lower_email ON users (lower(email))",),
        quick=True,
    ),
    Case(
        name="not_in_subquery",
        source="PostgreSQL wiki 'Don't Do This': Don't use NOT IN (a subquery too big to hash"
               " is rescanned per row; NOT EXISTS becomes an anti join)",
        schema=SHOP_SCHEMA[:1] + SHOP_SCHEMA[2:3],
        data=(SHOP_CUSTOMERS,
              # customers past 99 % have no orders
              "INSERT INTO orders SELECT i, 1 + floor({customers} * 0.99 * " + u(101) + ")::int,"
              " 'shipped', 10, timestamp '2023-01-01' + i * interval '1 minute'"
              " FROM generate_series(1, {orders}) i", VACUUM),
        # the subquery must stay above work_mem * hash_mem_multiplier at scale 1 under the user's
        # work_mem of 16MB (quality.USER_SETTINGS): the planner counts ~32 bytes a row, so 32 MB
        # hold ~1.05M rows; 1.2M (~38 MB) are rescanned per customer (PostgreSQL 18: ~2 s)
        sizes={"customers": 1_000, "orders": 1_200_000},
        query="SELECT c.id, c.name FROM customers c"
              " WHERE c.id NOT IN (SELECT o.customer_id FROM orders o)",
        oracle_query="SELECT c.id, c.name FROM customers c"
                     " WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id)",
        note="orders.customer_id is NOT NULL, so NOT EXISTS returns the same rows",
    ),
    Case(
        name="offset_to_keyset",
        source="Use The Index, Luke: ch. 'Paging Through Results' (seek method instead of OFFSET)",
        schema=("CREATE TABLE posts (id bigint PRIMARY KEY, created_at timestamp NOT NULL,"
                " title text NOT NULL, body text)",),
        data=("INSERT INTO posts SELECT i, timestamp '2020-01-01' + (i / 3) * interval '1 minute',"
              " 'post ' || i, repeat(md5(i::text), 2) FROM generate_series(1, {posts}) i", VACUUM),
        sizes={"posts": 1_000_000, "offset": 100_000},
        query="SELECT id, created_at, title FROM posts ORDER BY created_at DESC, id DESC"
              " OFFSET {offset} LIMIT 20",
        oracle_ddl=("CREATE INDEX qc_posts_created_id ON posts (created_at, id)",),
        oracle_query="SELECT id, created_at, title FROM posts WHERE (created_at, id) < ({p0}, {p1})"
                     " ORDER BY created_at DESC, id DESC LIMIT 20",
        oracle_params="SELECT quote_literal(created_at::text) || '::timestamp', id::text FROM posts"
                      " ORDER BY created_at DESC, id DESC OFFSET {offset} - 1 LIMIT 1",
        note="the keyset is the last row of the previous page (what the application remembers)",
    ),
    Case(
        name="date_cast_sargable",
        source="Use The Index, Luke: ch. 'Obfuscated Conditions: Dates' (a range on the column"
               " instead of a function of it)",
        schema=("CREATE TABLE shop_sales (id bigint PRIMARY KEY, store_id integer NOT NULL,"
                " created_at timestamp NOT NULL, amount numeric(12,2) NOT NULL)",),
        data=("INSERT INTO shop_sales SELECT i, 1 + i % 300,"
              " timestamp '2023-01-01' + (i::float8 / {sales}) * interval '730 days',"
              f" round((1 + 299 * {u(111)})::numeric, 2) FROM generate_series(1, {{sales}}) i", VACUUM),
        sizes={"sales": 1_000_000},
        query="SELECT count(*), sum(amount) FROM shop_sales WHERE created_at::date = DATE '2024-03-15'",
        oracle_ddl=("CREATE INDEX qc_shop_sales_created ON shop_sales (created_at)",),
        oracle_query="SELECT count(*), sum(amount) FROM shop_sales"
                     " WHERE created_at >= TIMESTAMP '2024-03-15' AND created_at < TIMESTAMP '2024-03-16'",
    ),
    Case(
        name="correlated_scalar_subquery",
        source="common advice, no single public advisor test: decorrelate a scalar subquery in the"
               " select list into LEFT JOIN ... GROUP BY",
        schema=SHOP_SCHEMA[:1] + SHOP_SCHEMA[2:3],
        data=(SHOP_CUSTOMERS, SHOP_ORDERS, VACUUM),
        sizes={"customers": 50_000, "orders": 600_000},
        query="SELECT c.id, c.name, (SELECT count(*) FROM orders o WHERE o.customer_id = c.id)"
              " AS order_count FROM customers c WHERE c.country = 'IS'",
        oracle_query="SELECT c.id, c.name, count(o.id) AS order_count FROM customers c"
                     " LEFT JOIN orders o ON o.customer_id = c.id WHERE c.country = 'IS'"
                     " GROUP BY c.id, c.name",
        note="one scan of orders instead of one per customer (an index on orders.customer_id"
             " does even better: reaching or beating the oracle counts)",
    ),
    Case(
        name="in_subquery",
        source="Dexter test/index_test.rb (IN-list and subquery filters) — shape:"
               " WHERE customer_id IN (SELECT id FROM customers WHERE country = ?)",
        schema=SHOP_SCHEMA[:1] + SHOP_SCHEMA[2:3],
        data=(SHOP_CUSTOMERS, SHOP_ORDERS, VACUUM),
        sizes={"customers": 100_000, "orders": 1_000_000},
        query="SELECT o.id, o.total FROM orders o"
              " WHERE o.customer_id IN (SELECT c.id FROM customers c WHERE c.country = 'IS')",
        oracle_ddl=("CREATE INDEX qc_orders_customer ON orders (customer_id)",
                    "CREATE INDEX qc_customers_country ON customers (country)"),
    ),
    Case(
        name="redundant_distinct",
        source="common advice, no single public advisor test: DISTINCT over a join to a primary"
               " key cannot remove anything (the row's own key is in the select list)",
        schema=SHOP_SCHEMA[:1] + SHOP_SCHEMA[2:3],
        data=(SHOP_CUSTOMERS, SHOP_ORDERS, VACUUM),
        sizes={"customers": 50_000, "orders": 600_000},
        query="SELECT DISTINCT o.id, o.total, o.created_at FROM orders o"
              " JOIN customers c ON c.id = o.customer_id WHERE c.country IN ('DE', 'FR')",
        oracle_query="SELECT o.id, o.total, o.created_at FROM orders o"
                     " JOIN customers c ON c.id = o.customer_id WHERE c.country IN ('DE', 'FR')",
    ),
    Case(
        name="analytic_date_range",
        source="analytic query with a literal date range (AFS corpus); the known fix is an index"
               " (Use The Index, Luke: ch. 'Index-Only Scan'), not a view of the answer",
        schema=("CREATE TABLE sales (id bigint PRIMARY KEY, subsidiary_id integer NOT NULL,"
                " sale_date date NOT NULL, eur_value numeric(12,2) NOT NULL, notes text)",),
        data=(f"INSERT INTO sales SELECT i, {skewed('subsidiaries', 121, 1.5)},"
              " date '2022-01-01' + (i::float8 / {sales} * 1095)::int,"
              f" round((1 + 999 * {u(122)})::numeric, 2),"
              " 'order note ' || md5(i::text) FROM generate_series(1, {sales}) i", VACUUM),
        sizes={"sales": 1_000_000, "subsidiaries": 30},
        query="SELECT sale_date, count(*) AS sales, sum(eur_value) AS revenue FROM sales"
              " WHERE sale_date BETWEEN DATE '2024-05-01' AND DATE '2024-05-07'"
              " GROUP BY sale_date ORDER BY sale_date",
        oracle_ddl=("CREATE INDEX qc_sales_date ON sales (sale_date) INCLUDE (eur_value)",),
    ),
    Case(
        name="analytic_having",
        source="analytic query with a HAVING threshold (AFS corpus); the known fix is an index on"
               " (filter, group key): an index-only scan feeding a GroupAggregate",
        schema=SHOP_SCHEMA[:1] + SHOP_SCHEMA[2:3],
        data=(SHOP_CUSTOMERS, SHOP_ORDERS, VACUUM),
        sizes={"customers": 50_000, "orders": 1_000_000},
        query="SELECT customer_id, count(*) AS returns FROM orders WHERE status = 'returned'"
              " GROUP BY customer_id HAVING count(*) >= 3 ORDER BY customer_id",
        oracle_ddl=("CREATE INDEX qc_orders_status_customer ON orders (status, customer_id)",),
    ),
    Case(
        name="analytic_name_filter",
        source="analytic query filtered on a name (AFS corpus); the known fix is an index on the"
               " name and on the foreign key the join walks",
        schema=(SHOP_SCHEMA[1], SHOP_SCHEMA[3]),
        data=(SHOP_PRODUCTS,
              f"INSERT INTO order_items SELECT i, 1 + (i - 1) / 3, {skewed('products', 131)},"
              f" 1 + floor(5 * {u(132)})::int, round((5 + 200 * {u(133)})::numeric, 2)"
              " FROM generate_series(1, {items}) i", VACUUM),
        sizes={"products": 20_000, "items": 1_500_000},
        query="SELECT p.name, sum(oi.quantity) AS units, sum(oi.quantity * oi.unit_price) AS revenue"
              " FROM products p JOIN order_items oi ON oi.product_id = p.id"
              " WHERE p.name = 'product 777' GROUP BY p.name",
        oracle_ddl=("CREATE INDEX qc_products_name ON products (name)",
                    "CREATE INDEX qc_items_product ON order_items (product_id)"),
    ),
    Case(
        name="correlated_columns_stats",
        source="PostgreSQL docs 14.2.2 'Extended Statistics' (city/zip: multivariate n-distinct"
               " counts for GROUP BY on correlated columns)",
        schema=("CREATE TABLE addresses (id integer PRIMARY KEY, city text NOT NULL, zip text NOT NULL,"
                " street text NOT NULL)",),
        data=("INSERT INTO addresses SELECT i, 'city ' || (z / 10), 'zip ' || z, 'street ' || (i % 9000)"
              f" FROM (SELECT i, floor({{zips}} * power({u(141)}, 1.2))::int AS z"
              " FROM generate_series(1, {addresses}) i) s", VACUUM),
        sizes={"addresses": 1_000_000, "zips": 3_000},
        query="SELECT city, zip, count(*) FROM addresses GROUP BY city, zip",
        oracle_ddl=("CREATE STATISTICS qc_addresses_city_zip (ndistinct, dependencies)"
                    " ON city, zip FROM addresses",
                    "ANALYZE addresses"),
        note="without the statistics the planner multiplies the distinct counts of city and zip",
    ),
    Case(
        name="not_in_hashed_work_mem",
        source="PostgreSQL wiki 'Don't Do This: Don't use NOT IN' (a subquery too big to hash is"
               " rescanned per row) and docs 19.4.1 'work_mem' (hash tables of IN subqueries)",
        schema=("CREATE TABLE accounts (id integer PRIMARY KEY, email text NOT NULL)",
                # account_id may be NULL: NOT EXISTS would not return the same rows in general
                "CREATE TABLE logins (id bigint PRIMARY KEY, account_id integer,"
                " at timestamp NOT NULL)"),
        data=("INSERT INTO accounts SELECT i, 'acct' || i || '@example.com'"
              " FROM generate_series(1, {accounts}) i",
              # accounts past 99 % never logged in
              "INSERT INTO logins SELECT i, 1 + floor({accounts} * 0.99 * " + u(151) + ")::int,"
              " timestamp '2024-01-01' + i * interval '1 minute' FROM generate_series(1, {logins}) i",
              VACUUM),
        # the subquery must stay above work_mem * hash_mem_multiplier at scale 1 under the user's
        # work_mem of 16MB (quality.USER_SETTINGS): 1.2M rows of 8 + 24 bytes = 38 MB > 32 MB, so
        # it is rescanned per account; the oracle's 32MB (64 MB to hash) holds it
        sizes={"accounts": 1_000, "logins": 1_200_000},
        query="SELECT a.id, a.email FROM accounts a WHERE a.id NOT IN (SELECT l.account_id FROM logins l)",
        oracle_settings={"work_mem": "'32MB'"},
        note="logins.account_id is nullable, so the NOT EXISTS rewrite is not proven; with a larger"
             " work_mem the subquery is hashed once instead of rescanned per account",
    ),
    Case(
        name="already_fast",
        source="Dexter test suite (a lookup already served by an index gets no suggestion)",
        schema=("CREATE TABLE accounts (id integer PRIMARY KEY, email text NOT NULL,"
                " balance numeric(12,2) NOT NULL)",),
        data=("INSERT INTO accounts SELECT i, 'acct' || i || '@example.com', i % 1000"
              " FROM generate_series(1, {accounts}) i", VACUUM),
        sizes={"accounts": 500_000},
        query="SELECT id, email, balance FROM accounts WHERE id = 4242",
        note="nothing to do: AFS must not make it slower",
        quick=True,
    ),
    Case(
        name="hypopg_readme",
        source="HypoPG README (CREATE TABLE hypo (id integer, val text), 'line ' || i;"
               " SELECT * FROM hypo WHERE id = 1; hypothetical index on hypo (id))",
        schema=("CREATE TABLE hypo (id integer, val text)",),
        data=("INSERT INTO hypo SELECT i, 'line ' || i FROM generate_series(1, {rows}) i", VACUUM),
        sizes={"rows": 1_000_000},
        query="SELECT * FROM hypo WHERE id = 1",
        oracle_ddl=("CREATE INDEX qc_hypo_id ON hypo (id)",),
        quick=True,
    ),
    # -- issue 25: shapes an agent reaches only by reading its own result ----------------------
    Case(
        name="join3_lookup_by_email",
        source="Use The Index, Luke: ch. 'Nested Loops' (an index on the driving table's filter and"
               " on every join predicate the nested loop walks); built: a support desk's three"
               " tables, no single public advisor test",
        schema=("CREATE TABLE members (id integer PRIMARY KEY, email text NOT NULL,"
                " joined_at timestamp NOT NULL)",
                "CREATE TABLE tickets (id integer PRIMARY KEY, member_id integer NOT NULL,"
                " opened_at timestamp NOT NULL, subject text NOT NULL)",
                "CREATE TABLE ticket_messages (id bigint PRIMARY KEY, ticket_id integer NOT NULL,"
                " sent_at timestamp NOT NULL, body text NOT NULL)"),
        data=("INSERT INTO members SELECT i, 'member' || i || '@example.org',"
              " timestamp '2020-01-01' + i * interval '5 minutes' FROM generate_series(1, {members}) i",
              f"INSERT INTO tickets SELECT i, {skewed('members', 161, 1.2)},"
              " timestamp '2022-01-01' + i * interval '1 minute', 'subject ' || (i % 977)"
              " FROM generate_series(1, {tickets}) i",
              f"INSERT INTO ticket_messages SELECT i, 1 + floor({{tickets}} * {u(162)})::int,"
              " timestamp '2022-01-01' + i * interval '20 seconds', 'message ' || md5(i::text)"
              " FROM generate_series(1, {messages}) i", VACUUM),
        sizes={"members": 100_000, "tickets": 400_000, "messages": 1_200_000},
        query="SELECT t.id, t.subject, tm.sent_at FROM members m JOIN tickets t ON t.member_id = m.id"
              " JOIN ticket_messages tm ON tm.ticket_id = t.id"
              " WHERE m.email = 'member4242@example.org' ORDER BY tm.sent_at",
        oracle_ddl=("CREATE INDEX qc_members_email ON members (email)",
                    "CREATE INDEX qc_tickets_member ON tickets (member_id)",
                    "CREATE INDEX qc_messages_ticket ON ticket_messages (ticket_id)"),
        note="a filter on a text column of the driving table, then two foreign keys: one index per"
             " table",
        quick=True,
    ),
    Case(
        name="join5_store_chain",
        source="Use The Index, Luke: ch. 'Nested Loops' (an index on each join predicate of the"
               " nested-loop path); PostgreSQL docs 14.3 'Controlling the Planner with Explicit JOIN"
               " Clauses' (joins of many tables); built: a retail chain of five tables",
        schema=("CREATE TABLE stores (id integer PRIMARY KEY, code text NOT NULL, city text NOT NULL)",
                "CREATE TABLE cashiers (id integer PRIMARY KEY, store_id integer NOT NULL,"
                " name text NOT NULL)",
                "CREATE TABLE receipts (id integer PRIMARY KEY, cashier_id integer NOT NULL,"
                " issued_at timestamp NOT NULL, total numeric(12,2) NOT NULL)",
                "CREATE TABLE receipt_lines (id bigint PRIMARY KEY, receipt_id integer NOT NULL,"
                " sku_id integer NOT NULL, qty integer NOT NULL, price numeric(10,2) NOT NULL)",
                "CREATE TABLE skus (id integer PRIMARY KEY, code text NOT NULL, name text NOT NULL)"),
        data=("INSERT INTO stores SELECT i, 'ST-' || lpad(i::text, 5, '0'),"
              f" {pick(['Berlin', 'Lyon', 'Austin', 'Osaka', 'Leeds'], 171)}"
              " FROM generate_series(1, {stores}) i",
              "INSERT INTO cashiers SELECT i, 1 + (hashint4(i) & 2147483647) % {stores}, 'cashier ' || i"
              " FROM generate_series(1, {cashiers}) i",
              f"INSERT INTO receipts SELECT i, 1 + floor({{cashiers}} * {u(172)})::int,"
              " timestamp '2024-01-01' + i * interval '30 seconds',"
              f" round((5 + 195 * {u(173)})::numeric, 2) FROM generate_series(1, {{receipts}}) i",
              f"INSERT INTO receipt_lines SELECT i, 1 + (i - 1) / 3, {skewed('skus', 174, 1.5)},"
              f" 1 + floor(4 * {u(175)})::int, round((1 + 99 * {u(176)})::numeric, 2)"
              " FROM generate_series(1, {lines}) i",
              "INSERT INTO skus SELECT i, 'SKU-' || i, 'article ' || i FROM generate_series(1, {skus}) i",
              VACUUM),
        sizes={"stores": 20_000, "cashiers": 60_000, "receipts": 600_000, "lines": 1_800_000,
               "skus": 50_000},
        query="SELECT r.id, r.issued_at, l.qty, k.name FROM stores s"
              " JOIN cashiers c ON c.store_id = s.id JOIN receipts r ON r.cashier_id = c.id"
              " JOIN receipt_lines l ON l.receipt_id = r.id JOIN skus k ON k.id = l.sku_id"
              " WHERE s.code = 'ST-00042' ORDER BY r.issued_at, l.id",
        oracle_ddl=("CREATE INDEX qc_stores_code ON stores (code)",
                    "CREATE INDEX qc_cashiers_store ON cashiers (store_id)",
                    "CREATE INDEX qc_receipts_cashier ON receipts (cashier_id)",
                    "CREATE INDEX qc_lines_receipt ON receipt_lines (receipt_id)"),
        note="four hops from a store's code to its lines: an index on each table the path walks"
             " (the fifth is reached by its primary key)",
    ),
    Case(
        name="correlated_avg_per_key",
        source="Wikipedia 'Correlated subquery' (employees earning more than their department's"
               " average: WHERE salary > (SELECT AVG(salary) FROM employees WHERE department ="
               " emp.department))",
        schema=("CREATE TABLE staff (id integer PRIMARY KEY, department_id integer NOT NULL,"
                " name text NOT NULL, salary numeric(10,2) NOT NULL, hired_on date NOT NULL)",),
        data=("INSERT INTO staff SELECT i, 1 + (hashint4(i * 3) & 2147483647) % {departments},"
              f" {pick(FIRST_NAMES, 181)} || ' ' || {pick(LAST_NAMES, 182)},"
              f" round((30000 + 90000 * {u(183)})::numeric, 2),"
              " date '2005-01-01' + (i::float8 / {staff} * 7300)::int"
              " FROM generate_series(1, {staff}) i", VACUUM),
        sizes={"staff": 70_000, "departments": 2_000},
        query="SELECT s.id, s.name, s.salary FROM staff s WHERE s.hired_on >= DATE '2024-12-20'"
              " AND s.salary > (SELECT avg(s2.salary) FROM staff s2"
              " WHERE s2.department_id = s.department_id)",
        oracle_ddl=("CREATE INDEX qc_staff_department_salary ON staff (department_id, salary)",
                    "CREATE INDEX qc_staff_hired ON staff (hired_on)"),
        note="a SubPlan per recent hire, each a scan of the whole table without an index on the"
             " correlation key",
    ),
    Case(
        name="correlated_max_per_key",
        source="PostgreSQL docs 9.21 'Aggregate Functions' (max() of an indexed column is one index"
               " probe) — shape: the last reading per sensor of a site as a scalar subquery per row"
               " (greatest-per-group, common advice)",
        schema=("CREATE TABLE sensors (id integer PRIMARY KEY, site text NOT NULL, label text NOT NULL)",
                "CREATE TABLE readings (id bigint PRIMARY KEY, sensor_id integer NOT NULL,"
                " taken_at timestamp NOT NULL, value float8 NOT NULL)"),
        data=("INSERT INTO sensors SELECT i, 'site ' || (i % 500), 'sensor ' || i"
              " FROM generate_series(1, {sensors}) i",
              f"INSERT INTO readings SELECT i, 1 + floor({{sensors}} * {u(191)})::int,"
              " timestamp '2024-01-01' + i * interval '10 seconds', 100 * " + u(192) +
              " FROM generate_series(1, {readings}) i", VACUUM),
        sizes={"sensors": 5_000, "readings": 600_000},
        query="SELECT s.id, s.label, (SELECT max(r.taken_at) FROM readings r WHERE r.sensor_id = s.id)"
              " AS last_seen FROM sensors s WHERE s.site = 'site 42'",
        oracle_ddl=("CREATE INDEX qc_readings_sensor_taken ON readings (sensor_id, taken_at)",),
        note="ten sensors, ten scans of all readings; with the index each max is one probe",
    ),
    Case(
        name="exists_correlated",
        source="PostgreSQL docs 9.23.1 'EXISTS' (WHERE EXISTS (SELECT 1 FROM tab2 WHERE col2 ="
               " tab1.col2)) — shape: subscribers with a failed payment",
        schema=("CREATE TABLE subscribers (id integer PRIMARY KEY, plan text NOT NULL,"
                " country text NOT NULL)",
                "CREATE TABLE payments (id bigint PRIMARY KEY, subscriber_id integer NOT NULL,"
                " paid_at timestamp NOT NULL, status text NOT NULL, amount numeric(10,2) NOT NULL)"),
        data=("INSERT INTO subscribers SELECT i, CASE WHEN i % 200 = 0 THEN 'enterprise'"
              f" ELSE {pick(['free', 'basic', 'pro'], 201)} END, {pick(COUNTRIES, 202)}"
              " FROM generate_series(1, {subscribers}) i",
              f"INSERT INTO payments SELECT i, 1 + floor({{subscribers}} * {u(203)})::int,"
              " timestamp '2023-01-01' + i * interval '1 minute',"
              f" CASE WHEN {u(204)} < 0.02 THEN 'failed' ELSE 'paid' END,"
              f" round((5 + 95 * {u(205)})::numeric, 2) FROM generate_series(1, {{payments}}) i", VACUUM),
        sizes={"subscribers": 200_000, "payments": 1_000_000},
        query="SELECT s.id, s.country FROM subscribers s WHERE s.plan = 'enterprise'"
              " AND EXISTS (SELECT 1 FROM payments p WHERE p.subscriber_id = s.id"
              " AND p.status = 'failed')",
        oracle_ddl=("CREATE INDEX qc_payments_subscriber_status ON payments (subscriber_id, status)",
                    "CREATE INDEX qc_subscribers_plan ON subscribers (plan)"),
        note="a semi join: with the correlation key indexed, a probe per enterprise subscriber"
             " instead of a hash of every failed payment",
    ),
    Case(
        name="lateral_top_n",
        source="PostgreSQL docs 7.2.1.5 'LATERAL Subqueries'; Use The Index, Luke: ch. 'Querying"
               " Top-N Rows' (a pipelined top-N per outer row) — shape: the three newest posts of"
               " each author of a country",
        schema=("CREATE TABLE authors (id integer PRIMARY KEY, name text NOT NULL, country text NOT NULL)",
                "CREATE TABLE posts (id bigint PRIMARY KEY, author_id integer NOT NULL,"
                " published_at timestamp NOT NULL, title text NOT NULL)"),
        data=("INSERT INTO authors SELECT i, 'author ' || i,"
              f" CASE WHEN i % 2000 = 0 THEN 'IS' ELSE {pick(COUNTRIES, 211)} END"
              " FROM generate_series(1, {authors}) i",
              f"INSERT INTO posts SELECT i, 1 + floor({{authors}} * {u(212)})::int,"
              f" timestamp '2021-01-01' + {u(213)} * interval '1000 days', 'post ' || i"
              " FROM generate_series(1, {posts}) i", VACUUM),
        sizes={"authors": 20_000, "posts": 500_000},
        query="SELECT a.id, a.name, p.id AS post_id, p.published_at FROM authors a"
              " CROSS JOIN LATERAL (SELECT p.id, p.published_at FROM posts p WHERE p.author_id = a.id"
              " ORDER BY p.published_at DESC LIMIT 3) p WHERE a.country = 'IS'"
              " ORDER BY a.id, p.published_at DESC",
        oracle_ddl=("CREATE INDEX qc_posts_author_published ON posts (author_id, published_at)",),
        note="ten authors, each a scan and top-N sort of all posts; with the index three rows each",
    ),
    Case(
        name="range_aggregate_index_only",
        source="PostgreSQL docs 11.9 'Index-Only Scans and Covering Indexes' (INCLUDE the column the"
               " query reads so the heap is not visited) — shape: an aggregate over a value range"
               " scattered through a wide table",
        schema=("CREATE TABLE http_requests (id bigint PRIMARY KEY, at timestamp NOT NULL, path text"
                " NOT NULL, status integer NOT NULL, response_ms integer NOT NULL, bytes_sent integer"
                " NOT NULL, user_agent text NOT NULL)",),
        data=("INSERT INTO http_requests SELECT i, timestamp '2024-01-01' + i * interval '2 seconds',"
              " '/page/' || (i % 5000), CASE WHEN i % 50 = 0 THEN 500 ELSE 200 END,"
              f" floor(3000 * power({u(221)}, 2))::int, floor(200000 * {u(222)})::int,"
              " 'Mozilla/5.0 (X11; Linux x86_64) client ' || md5(i::text) || md5((i + 1)::text)"
              " FROM generate_series(1, {requests}) i", VACUUM),
        sizes={"requests": 1_000_000},
        query="SELECT count(*), sum(bytes_sent), avg(response_ms) FROM http_requests"
              " WHERE response_ms BETWEEN 800 AND 1200",
        oracle_ddl=("CREATE INDEX qc_requests_response ON http_requests (response_ms)"
                    " INCLUDE (bytes_sent)",),
        note="about a tenth of the rows, spread over every page: a plain index still reads the"
             " heap; the covering one does not",
    ),
    Case(
        name="slow_baseline_ip_ranges",
        source="built: IP-range lookup (geolocation blocks joined on ip BETWEEN ip_from AND ip_to),"
               " PostgreSQL docs 11.2 'Index Types' (a B-tree serves <, <=, >=, > and BETWEEN);"
               " the baseline runs past the statement timeout (a nested loop comparing every pair)",
        schema=("CREATE TABLE geo_blocks (id integer PRIMARY KEY, ip_from bigint NOT NULL,"
                " ip_to bigint NOT NULL, country text NOT NULL)",
                "CREATE TABLE visits (id bigint PRIMARY KEY, ip bigint NOT NULL, at timestamp NOT NULL)"),
        data=("INSERT INTO geo_blocks SELECT i, (i - 1) * 1000000::bigint, i * 1000000::bigint - 1,"
              f" {pick(COUNTRIES, 231)} FROM generate_series(1, {{blocks}}) i",
              f"INSERT INTO visits SELECT i, floor({{blocks}} * 1000000::float8 * {u(232)})::bigint,"
              " timestamp '2024-01-01' + i * interval '1 minute' FROM generate_series(1, {visits}) i",
              VACUUM),
        sizes={"blocks": 2_000, "visits": 15_000},
        query="SELECT g.country, count(*) AS visits FROM visits v"
              " JOIN geo_blocks g ON v.ip BETWEEN g.ip_from AND g.ip_to GROUP BY g.country ORDER BY 1",
        oracle_ddl=("CREATE INDEX qc_visits_ip ON visits (ip)",),
        statement_timeout_ms=1_500,
        note="no equality to hash or merge on: a nested loop over every pair, seconds; with an index"
             " on the point each block is one range scan",
    ),
    Case(
        name="covering_vs_plain",
        source="PostgreSQL docs 11.9 'Index-Only Scans and Covering Indexes' (SELECT y FROM tab"
               " WHERE x = 'key' with CREATE INDEX tab_x_y ON tab(x) INCLUDE (y))",
        schema=("CREATE TABLE page_views (id bigint PRIMARY KEY, url_id integer NOT NULL,"
                " viewed_at timestamp NOT NULL, visitor_id integer NOT NULL, referrer text NOT NULL,"
                " agent text NOT NULL)",),
        data=(f"INSERT INTO page_views SELECT i, {skewed('urls', 241, 3.0)},"
              " timestamp '2024-01-01' + i * interval '3 seconds', (hashint4(i) & 2147483647) % 100000,"
              " 'https://ref.example/' || md5(i::text), 'agent ' || md5((i * 7)::text)"
              " FROM generate_series(1, {views}) i", VACUUM),
        sizes={"views": 1_000_000, "urls": 5_000},
        query="SELECT viewed_at FROM page_views WHERE url_id = 3",
        oracle_ddl=("CREATE INDEX qc_views_url ON page_views (url_id) INCLUDE (viewed_at)",),
        note="about 1 % of the rows, on every page: the plain index on url_id still visits the heap",
    ),
    Case(
        name="expression_jsonb_field",
        source="PostgreSQL docs 11.7 'Indexes on Expressions' and 8.14.4 'jsonb Indexing' (an"
               " expression index on a field extracted with ->>, which a GIN index does not serve)",
        schema=("CREATE TABLE documents (id integer PRIMARY KEY, meta jsonb NOT NULL,"
                " created_at timestamp NOT NULL, body text NOT NULL)",),
        data=("INSERT INTO documents SELECT i, jsonb_build_object('customer_ref', 'C-'"
              " || lpad(((hashint4(i) & 2147483647) % 100000)::text, 6, '0'),"
              f" 'kind', {pick(['invoice', 'offer', 'letter', 'memo'], 251)}, 'pages', 1 + i % 9),"
              " timestamp '2023-01-01' + i * interval '1 minute', 'text ' || md5(i::text)"
              " FROM generate_series(1, {documents}) i", VACUUM),
        sizes={"documents": 500_000},
        query="SELECT id, created_at FROM documents WHERE meta->>'customer_ref' = 'C-004242'",
        oracle_ddl=("CREATE INDEX qc_documents_customer_ref ON documents ((meta->>'customer_ref'))",),
    ),
    Case(
        name="mixed_direction_top_n",
        source="PostgreSQL docs 11.4 'Indexes and ORDER BY' (ORDER BY x ASC, y DESC is served by an"
               " index on (x ASC, y DESC)); Use The Index, Luke: ch. 'ASC, DESC and NULLS"
               " FIRST/LAST'",
        schema=("CREATE TABLE leaderboard (id bigint PRIMARY KEY, game_id integer NOT NULL,"
                " level integer NOT NULL, finished_at timestamp NOT NULL, player text NOT NULL)",),
        data=("INSERT INTO leaderboard SELECT i, 1 + (hashint4(i) & 2147483647) % {games},"
              f" 1 + floor(20 * {u(261)})::int,"
              f" timestamp '2024-01-01' + {u(262)} * interval '300 days', 'player ' || (i % 77777)"
              " FROM generate_series(1, {entries}) i", VACUUM),
        sizes={"entries": 1_000_000, "games": 50},
        query="SELECT player, level, finished_at FROM leaderboard WHERE game_id = 7"
              " ORDER BY level DESC, finished_at ASC LIMIT 10",
        oracle_ddl=("CREATE INDEX qc_leaderboard_game_level ON leaderboard"
                    " (game_id, level DESC, finished_at)",),
        note="twenty levels, a thousand rows each in a game: an index in one direction still"
             " sorts the top level",
        quick=True,
    ),
    Case(
        name="fulltext_gin",
        source="PostgreSQL docs 12.2.2 'Creating Indexes' (CREATE INDEX pgweb_idx ON pgweb USING"
               " GIN (to_tsvector('english', body)); the query repeats the expression)",
        schema=("CREATE TABLE articles (id integer PRIMARY KEY, title text NOT NULL, body text NOT NULL)",),
        data=("INSERT INTO articles SELECT i, 'article ' || i,"
              f" {pick(ADJECTIVES, 271)} || ' ' || {pick(MATERIALS, 272)} || ' ' || {pick(THINGS, 273)}"
              f" || ' and ' || {pick(THINGS, 274)} || ' made of ' || {pick(MATERIALS, 275)} || ' in '"
              f" || {pick(['Berlin', 'Lyon', 'Austin', 'Osaka', 'Leeds'], 276)}"
              " || CASE WHEN i % 997 = 0 THEN ' with autovacuum' ELSE '' END"
              " || CASE WHEN i % 31 = 0 THEN ' and freezing notes' ELSE '' END"
              " FROM generate_series(1, {articles}) i", VACUUM),
        sizes={"articles": 50_000},
        query="SELECT id, title FROM articles"
              " WHERE to_tsvector('english', body) @@ to_tsquery('english', 'autovacuum & freezing')",
        oracle_ddl=("CREATE INDEX qc_articles_body_fts ON articles"
                    " USING gin (to_tsvector('english', body))",),
    ),
    Case(
        name="range_overlap_gist",
        source="PostgreSQL docs 8.17.11 'Indexing' of range types (CREATE INDEX reservation_idx ON"
               " reservation USING GIST (during); && served by GiST)",
        schema=("CREATE TABLE room_bookings (id integer PRIMARY KEY, room_id integer NOT NULL,"
                " during tsrange NOT NULL, booked_by text NOT NULL)",),
        data=("INSERT INTO room_bookings SELECT i, 1 + i % 400,"
              " tsrange(s, s + (30 + floor(150 * " + u(281) + ")::int) * interval '1 minute'),"
              " 'guest ' || (i % 9999) FROM (SELECT i, timestamp '2020-01-01' + i * interval '2 minutes'"
              f" + floor(60 * {u(282)})::int * interval '1 minute' AS s"
              " FROM generate_series(1, {bookings}) i) b", VACUUM),
        sizes={"bookings": 1_000_000},
        query="SELECT id, room_id, during FROM room_bookings"
              " WHERE during && tsrange('2021-06-15 10:00', '2021-06-15 11:00')",
        oracle_ddl=("CREATE INDEX qc_bookings_during ON room_bookings USING gist (during)",),
    ),
    Case(
        name="brin_append_only",
        source="PostgreSQL docs 'BRIN Indexes' introduction (values correlated with the physical"
               " order, e.g. a table of store orders with a date column appended in order)",
        schema=("CREATE TABLE sensor_log (id bigint PRIMARY KEY, logged_at timestamp NOT NULL,"
                " device_id integer NOT NULL, reading float8 NOT NULL)",),
        data=("INSERT INTO sensor_log SELECT i, timestamp '2024-01-01' + i * interval '15 seconds',"
              f" 1 + i % 200, 50 * {u(291)} FROM generate_series(1, {{rows}}) i", VACUUM),
        sizes={"rows": 2_000_000},
        query="SELECT device_id, avg(reading) FROM sensor_log WHERE logged_at >= TIMESTAMP '2024-06-01'"
              " AND logged_at < TIMESTAMP '2024-06-08' GROUP BY device_id ORDER BY device_id",
        oracle_ddl=("CREATE INDEX qc_sensor_log_logged ON sensor_log USING brin (logged_at)",),
        note="a week of an append-only log: a BRIN index of a few pages skips the rest (a B-tree"
             " reaches the same time at a thousand times its size)",
    ),
)


def by_name() -> dict[str, Case]:
    return {c.name: c for c in CASES}
