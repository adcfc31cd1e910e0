"""The `$n` filling on the target (read-only: catalog, pg_stats, EXPLAIN).

    filled = await fill_statement(conn, statement.query, count=3)

The statement is first screened with `EXPLAIN (GENERIC_PLAN)` (it plans with its parameters
unknown), its tables' statistics read (`read_tables`, afs.analysis.table_info), the values
chosen by afs.params.fill (pure), and every filled query checked with a plain EXPLAIN;
neither runs the statement, and both go through `afs.target.on_target`: the input limits,
the structural and the catalog checks first (a refused statement is skipped with the reason,
never planned: planning evaluates IMMUTABLE functions), then a READ ONLY transaction as the
low-privilege role.
"""

from __future__ import annotations

from pglast.parser import scan

from afs.analysis import table_info
from afs.batch.statements import relations
from afs.db import Connection
from afs.errors import DatabaseError, InputError, UnsafeSqlError
from afs.models import TableInfo
from afs.params.fill import Filled, fill, typed_parameters
from afs.target import check_on_target, generic_plan, on_target, plan_only


# -- on the target (read-only: catalog, pg_stats, EXPLAIN) ----------------------------------
async def read_tables(conn: Connection, query: str) -> dict[str, TableInfo]:
    """TableInfo (with pg_stats of every column) of each relation the statement names."""
    tables: dict[str, TableInfo] = {}
    for name in relations(query):
        columns = {str(c) for (c,) in await conn.fetchall(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
            " AND NOT attisdropped", (name,))}
        info = await table_info(conn, name, columns)
        if info is not None:
            tables[name] = info
    return tables


async def fill_statement(conn: Connection, query: str, count: int) -> Filled:
    """Screen (the target's checks, then EXPLAIN (GENERIC_PLAN)), fill from pg_stats, EXPLAIN
    each filled query; every plan through `afs.target.on_target`. A statement the checks
    refuse is a Filled with the reason, never planned."""
    query = typed_parameters(query)
    generic = any(t.name == "PARAM" for t in scan(query))
    try:
        if generic:
            await on_target(conn, query, generic_plan, parameters=True)
        else:
            await check_on_target(conn, query)  # before its tables' statistics are read
    except InputError as exc:
        return Filled((), _refused(exc), query)
    except DatabaseError as exc:
        what = "does not plan with its parameters" if generic else "cannot be checked on the target"
        return Filled((), f"{what}: {str(exc).splitlines()[0]}", query)
    filled = fill(query, await read_tables(conn, query), count)
    good = []
    for pset in filled.sets:
        try:
            await on_target(conn, pset.query, plan_only)
        except InputError as exc:
            return Filled((), f"filled ({pset.label}) it is {_refused(exc)}", query)
        except DatabaseError as exc:
            return Filled((), f"filled ({pset.label}) it does not plan: {str(exc).splitlines()[0]}", query)
        good.append(pset)
    return Filled(tuple(good), filled.reason, query)


def _refused(exc: InputError) -> str:
    reason = exc.reason if isinstance(exc, UnsafeSqlError) else str(exc).splitlines()[0]
    return f"refused by the checks on the target: {reason}"
