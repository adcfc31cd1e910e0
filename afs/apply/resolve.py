"""Which database an apply or a rollback runs on (pure: settings and stored rows in, a DSN out).

The store never holds a password: a task's DSN and an audit row's target are scrubbed
(`postgresql://app:***@db/shop`). They name the database (host, port, name: its origin);
the password comes from where the user configured it:

    apply     --dsn, else the task's database (its DSN resolved as below), else its
              database in the sandbox
    rollback  the database the audit row says the winner was applied on, resolved:
              --dsn (it must name that database), else a configured DSN that names it
              (AFS_DATABASE_URL / PG* / database_url, AFS_SOURCE_SERVER_URL, the sandbox's
              databases), else the recorded DSN without its password: libpq then finds one
              as for psql (PGPASSWORD, ~/.pgpass or PGPASSFILE, a service file), or the
              server needs none (a socket that trusts its user). A recorded DSN that does
              not parse → InputError.
"""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import conninfo

from afs.config import Settings
from afs.errors import InputError, scrub
from afs.sandbox.server import dsn_for

SCRUBBED = "***"  # what afs.errors.scrub puts where a password was


def configured(settings: Settings, databases: Iterable[str | None] = ()) -> list[str]:
    """Every DSN the configuration knows (the user's own first), for `databases` on the
    source server and in the sandbox too."""
    found = [settings.target_dsn] if settings.target_dsn else []
    for name in filter(None, databases):
        if settings.source_server_url:
            found.append(conninfo.make_conninfo(settings.source_server_url, dbname=name))
        found.append(dsn_for(settings, name))
    return found


def _origin(dsn: str) -> str | None:
    from afs.sandbox.importer import origin_of  # here: that module imports the fork client (mcp)

    try:
        return origin_of(dsn)
    except InputError:
        return None


def same_database(a: str, b: str) -> bool:
    """Whether two DSNs (passwords or not) name the same database."""
    origin = _origin(a)
    return origin is not None and origin == _origin(b)


def resolve(recorded: str, candidates: Iterable[str], what: str) -> str:
    """The first candidate that names the same database as `recorded` (a scrubbed DSN), else
    `recorded` without the password the store scrubbed (libpq's own lookup finds it)."""
    origin = _origin(recorded)
    if origin is None:
        raise InputError(f"{what}: the recorded database {scrub(recorded)!r} is not a connection string")
    for dsn in candidates:
        if _origin(dsn) == origin:
            return dsn
    params = conninfo.conninfo_to_dict(recorded)
    if params.get("password") != SCRUBBED:
        return recorded
    del params["password"]  # PGPASSWORD, ~/.pgpass, a service file: as psql would find it
    return conninfo.make_conninfo("", **params)


def apply_target(settings: Settings, *, dsn: str | None, task_dsn: str | None,
                 source: str | None) -> str:
    """Where `afs apply` builds the winner."""
    if dsn:
        return dsn
    if task_dsn:
        return resolve(task_dsn, configured(settings), "the task's database")
    return dsn_for(settings, source or settings.demo_database)


def rollback_target(settings: Settings, *, recorded: str, dsn: str | None,
                    source: str | None) -> str:
    """Where `afs rollback` undoes the winner: the database it was applied on (the audit row)."""
    if dsn:
        if not same_database(dsn, recorded):
            raise InputError(f"the winner was applied on {scrub(recorded)}, and --dsn names another "
                             f"database ({_origin(dsn) or scrub(dsn)}): a rollback runs where the apply ran")
        return dsn
    return resolve(recorded, configured(settings, (source, settings.demo_database)),
                   "cannot tell where to roll back")
