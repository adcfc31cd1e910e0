"""The table of `afs`'s commands: which module of afs.cli holds each one (its arguments and
what it runs) and the line `afs --help` shows for it. Light on purpose: `afs --help` reads
this table and imports none of the command modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    module: str  # afs.cli.<module>: its arguments (add_commands) and its handler
    help: str


COMMANDS: dict[str, Command] = {  # in the order `afs --help` lists them
    "sandbox": Command("sandbox", "the embedded PostgreSQL sandbox and its demo data"),
    "fork": Command("forks", "disposable forks of a database"),
    "optimize": Command("optimize", "find out, in forks, how to make a query faster"),
    "history": Command("service", "the tasks in the store, newest first"),
    "show": Command("service", "a stored task's report (the same as `afs optimize` printed)"),
    "events": Command("service", "a task's events, in order (one JSON object a line with --json)"),
    "resume": Command("service", "run a failed, cancelled or interrupted task again (interrupted: "
                                 "the command that ran it was killed)"),
    "worker": Command("service", "take queued tasks from the store and run them"),
    "serve": Command("service", "the HTTP API (and N in-process workers)"),
    "batch": Command("batch", "optimize the target's costliest statements (pg_stat_statements), one "
                              "task each; `afs batch show ID` prints a stored report, `afs batch list` "
                              "the stored batches"),
    "schedule": Command("batch", "batches run on a cron schedule by `afs serve`"),
    "indexes": Command("indexes", "indexes worth dropping (unused, duplicate, redundant), each "
                                  "verified in a fork with the workload replayed"),
    "apply": Command("apply", "apply a task's winner to the database, after approval"),
    "rollback": Command("apply", "undo a task's applied winner with its recorded rollback"),
    "audit": Command("apply", "the audit log of applies and rollbacks, newest first"),
    "mcp": Command("mcp", "the MCP fork server"),
}

# every option that takes a DSN says so in its help
DSN_PASSWORDS = ("Keep the password out of the DSN (a command line is visible to every local user in "
                 "`ps`): libpq reads it from PGPASSWORD, ~/.pgpass, or a service file "
                 "(service=NAME, in ~/.pg_service.conf).")


def add_top(commands: Any, name: str, handler: Any = None, *, json_flag: bool = True,
            description: str | None = None) -> Any:
    """Command `name` of the table: with a handler it is a command (its help its description,
    --json unless `json_flag` is false); without, a group of subcommands."""
    if handler is not None:
        return add_command(commands, name, COMMANDS[name].help, handler, json_flag)
    return commands.add_parser(name, help=COMMANDS[name].help, description=description)


def add_command(group: Any, name: str, help_text: str, handler: Any, json_flag: bool = True) -> Any:
    """A subcommand of `group` run by `handler`, with --json unless `json_flag` is false."""
    command = group.add_parser(name, help=help_text, description=help_text)
    command.set_defaults(handler=handler)
    if json_flag:
        command.add_argument("--json", action="store_true", help="print one JSON document")
    return command
