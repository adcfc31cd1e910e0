"""What a fork may consume, and the checks that keep it there.

Every fork's role gets, at creation (`ALTER ROLE … SET`, by the admin):

    temp_file_limit                       superuser-only: the fork's role cannot raise it
    statement_timeout                     the default of any session that sets none (psql)
    idle_in_transaction_session_timeout   an abandoned transaction does not pin the fork
    afs.max_growth_mb                     how much the fork may grow past its copy (readable
                                          by any client: `current_setting('afs.max_growth_mb')`)

The growth cap is kept twice: `check_growth` refuses, before it runs, a statement the
planner expects to write more than the cap (a `CREATE MATERIALIZED VIEW … AS SELECT *
FROM a, b` fails at once, with the estimate in the message), and the fork server cancels
the running statements of a fork that grew past its cap anyway (`enforce_limits`).
"""

from __future__ import annotations

import json

from afs.config import ForkLimits
from afs.db import Connection
from afs.errors import DatabaseError, ForkLimitError
from afs.pg.names import quote_ident, quote_literal
from afs.safety import writes_from_query

GROWTH_SETTING = "afs.max_growth_mb"
IDLE_IN_TRANSACTION_MS = 10 * 60 * 1000


def role_settings(limits: ForkLimits) -> dict[str, str]:
    """The settings a fork's role gets for `limits` (afs.config.ForkLimits: `Settings.fork_limits`)."""
    return {
        "temp_file_limit": f"{limits.temp_file_limit_mb}MB",
        "statement_timeout": str(limits.statement_timeout_ms),
        "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_MS),
        GROWTH_SETTING: str(limits.max_growth_mb),
    }


async def apply_role_limits(conn: Connection, role: str, limits: ForkLimits) -> None:
    """Set the limits on the fork's role (as the admin: temp_file_limit is superuser-only)."""
    await conn.execute(";".join(f"ALTER ROLE {quote_ident(role)} SET {name} = {quote_literal(value)}"
                                for name, value in role_settings(limits).items()))  # one round trip


async def check_growth(conn: Connection, sql: str) -> None:
    """Raise ForkLimitError when the planner expects `sql` to write more than the fork's cap.

    Only statements that write a relation from a query are estimated (CREATE MATERIALIZED
    VIEW / TABLE … AS, INSERT … SELECT, SELECT … INTO); a connection without the cap setting
    (not a fork) is not checked.
    """
    if not writes_from_query(sql):
        return
    cap = await conn.fetchval("SELECT current_setting(%s, true)", (GROWTH_SETTING,))
    if not cap:
        return
    try:
        plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}")
    except DatabaseError:
        return  # the statement itself will say what is wrong with it
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    estimate_mb = float(top.get("Plan Rows", 0)) * float(top.get("Plan Width", 0)) / 1048576
    if estimate_mb > int(cap):
        raise ForkLimitError(
            f"refused before running: the planner expects this statement to write about"
            f" {_size(estimate_mb)} ({float(top.get('Plan Rows', 0)):,.0f} rows), more than the"
            f" fork may grow ({_size(int(cap))}, {GROWTH_SETTING})", limit_mb=int(cap))


def _size(mb: float) -> str:
    return f"{mb / 1024:,.1f} GB" if mb >= 1024 else f"{mb:,.0f} MB"
