"""The one path of a query to a user's database: `on_target`.

Every statement AFS plans, explains or runs on a database it is pointed at (the source of
`afs optimize`, the database `afs batch` reads, the database `afs apply` verifies) goes
through `on_target`, in this order:

    1. input limits          afs.query.text.check_input: size, depth; `$n` only when the caller
                             says so (pg_stat_statements' texts, planned generically)
    2. the structure         afs.safety.check_query: exactly one read-only SELECT
    3. the catalog           afs.catalog.check_query_catalog: every function, operator, cast and
                             relation it uses resolved by the target's own catalog; only built-ins
                             and allow-listed extensions pass
    4. the transaction       READ ONLY, as TARGET_ROLE when it can be had, always rolled back;
                             the caller's `work` runs there (a plan, a generic plan, timed runs)

The catalog check comes before anything plans the query: planning evaluates IMMUTABLE
functions (constant folding) and STABLE ones (selectivity estimates), so an EXPLAIN is
enough to run a function a user planted, with the rights of the role AFS connected as (often
a superuser). Steps 1 and 2 are CPU-bound and run in a worker thread.

    plan = await on_target(conn, query, plan_json)
    await on_target(conn, statement, generic_plan, parameters=True)
    times = await on_target(conn, query, timed_runs(3, 30_000))

`check_on_target` is steps 1-3 alone, for a query that will run later (apply checks the
query it verifies with before it builds anything). Catalog reads (pg_class, pg_stats,
pg_stat_statements) carry no user's query and do not come here.

TARGET_ROLE (afs_explain) is NOLOGIN and a member of pg_read_all_data only: it reads every
table and may do nothing else. It is created on first use where the connected role may
create roles (a superuser: the sandbox, or a privileged DSN). A TARGET_ROLE with more
rights than that (someone made it a member of another role, or a superuser) is refused,
never used: InputError saying how to fix it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg
import structlog
import trio
from psycopg.pq import TransactionStatus

from afs.catalog import GATE_ROLE, check_query_catalog, gate_role
from afs.db import Connection, translate
from afs.query.text import check_input
from afs.safety import References, check_query, query_references

log = structlog.get_logger(__name__)

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]
Work = Callable[[Cursor, str], T]

TARGET_ROLE = GATE_ROLE  # the one low-privilege role, checked in one place (afs.catalog.gate_role)


# -- the work done in the transaction ----------------------------------------------------
def plan_only(cur: Cursor, query: str) -> None:
    """EXPLAIN: the plan is made (names, types, rights checked), nothing runs."""
    cur.execute(f"EXPLAIN {query}")


def generic_plan(cur: Cursor, query: str) -> None:
    """EXPLAIN (GENERIC_PLAN): the plan of a statement with `$n` parameters left unknown."""
    cur.execute(f"EXPLAIN (GENERIC_PLAN) {query}")


def plan_json(cur: Cursor, query: str) -> Mapping[str, Any]:
    """The top node of EXPLAIN (FORMAT JSON)'s plan."""
    cur.execute(f"EXPLAIN (FORMAT JSON) {query}")
    row = cur.fetchone()
    assert row is not None
    return dict(row[0][0]["Plan"])


def timed_runs(runs: int, timeout_ms: int) -> Callable[[Cursor, str], list[float]]:
    """Run the query `runs` times (each under `timeout_ms`), fetching every row: the times in ms."""
    def work(cur: Cursor, query: str) -> list[float]:
        cur.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            cur.execute(query)
            cur.fetchall()
            times.append((time.perf_counter() - start) * 1000)
        return times
    return work


# -- the path ----------------------------------------------------------------------------------
def _checked(sql: str, parameters: bool) -> tuple[str, References]:
    check_input(sql, allow_parameters=parameters)
    query = check_query(sql)
    return query, query_references(query)


async def check_on_target(conn: Connection, sql: str, *, parameters: bool = False) -> str:
    """Steps 1-3 of `on_target`: the query as it will run (stripped, no trailing semicolon).

    Raises InputError (too large, too deep, parameters not allowed) or UnsafeSqlError (not
    one read-only SELECT; the catalog refuses a function, operator, cast or relation)."""
    query, refs = await trio.to_thread.run_sync(_checked, sql, parameters)
    await check_query_catalog(conn, query, refs)
    return query


async def on_target(conn: Connection, sql: str, work: Work[T], *, parameters: bool = False) -> T:
    """`work(cursor, query)` for a checked query, in a READ ONLY transaction as TARGET_ROLE.

    Raises what `check_on_target` raises before anything is planned; InputError when
    TARGET_ROLE exists with more rights than reading; DatabaseError when the server refuses
    (StatementTimeout for the statement timeout). The connection is left as it was.

    Without TARGET_ROLE (the connected role may neither create it nor SET ROLE to it), the
    query is still checked and the transaction still READ ONLY, and a warning
    (`target_role_unavailable`) is logged. What is lost: a function that got past the
    catalog check would run with every right of the connected role that a read-only
    transaction leaves, instead of only reading: reading server files and running programs
    (COPY … TO PROGRAM is not a write) where the role is a member of pg_read_server_files or
    pg_execute_server_program, signalling other sessions (pg_signal_backend), and reaching
    other servers through dblink or postgres_fdw where they are installed.
    """
    query = await check_on_target(conn, sql, parameters=parameters)
    return await _read_only(conn, query, work)


async def target_role(conn: Connection) -> str | None:
    """TARGET_ROLE if the connected role may SET ROLE to it (created if missing), else None.
    InputError when it exists with more rights than reading."""
    return await conn.run(gate_role)


async def _read_only(conn: Connection, query: str, work: Work[T]) -> T:
    """The last layer of `on_target` (call that): `work` in a READ ONLY transaction, as
    TARGET_ROLE when it can be had, rolled back whatever happens."""
    role = await target_role(conn)
    if role is None:
        user = await conn.fetchval("SELECT current_user")
        log.warning("target_role_unavailable", role=TARGET_ROLE, user=str(user),
                    detail=f"{user} may neither create {TARGET_ROLE} nor SET ROLE to it: the query is "
                           "planned READ ONLY with this role's other rights (see afs.target.on_target)")

    def in_transaction(raw: psycopg.Connection[Any]) -> T:
        try:
            with raw.cursor() as cur:
                cur.execute("BEGIN TRANSACTION READ ONLY")
                try:
                    if role is not None:
                        cur.execute(f"SET LOCAL ROLE {role}")
                    return work(cur, query)
                finally:
                    if raw.info.transaction_status != TransactionStatus.IDLE:
                        raw.execute("ROLLBACK")
        except psycopg.Error as exc:
            raise translate(exc, query) from exc

    return await conn.run(in_transaction)
