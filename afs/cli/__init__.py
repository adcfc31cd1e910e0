"""The `afs` command line: one module per command group, and output.

    afs optimize --query SQL                    measure how to make a query faster, in forks
    afs sandbox up|status|down|reset|import     the embedded PostgreSQL and its demo data
    afs sandbox workload                        the demo shop's workload, for `afs batch` to rank
    afs fork create|list|destroy|gc|psql|roundtrip   disposable forks, through the MCP server
    afs mcp serve                               the fork provider as an MCP server (stdio)
    afs history|show|events|resume              tasks in the store: list, report, events, run again
    afs worker | afs serve                      take queued tasks; the HTTP API with live events
    afs batch [show ID | list]                  the target's costliest statements, optimized in turn
    afs schedule add|list|remove                batches on a cron schedule, run by `afs serve`
    afs apply|rollback|audit                    apply a task's winner after approval; undo it; the log

Exit codes: 0 success, 1 failure, 2 bad input or usage, 130 interrupted.
Results go to stdout (`--json` for scripts); progress and logs go to stderr.

    commands.py  the table of commands: the module that holds each, its line in `afs --help`
    output.py    emit, progress, errors as messages and exit codes
    run.py       running the chosen command: settings, logs, trio, Ctrl-C
    shared.py    what the command modules share: the sandbox under a command, the task store,
                 the target from --dsn and psql's flags, a task's report
    sandbox.py   afs sandbox …                 forks.py    afs fork …
    optimize.py  afs optimize                  service.py  afs history|show|events|resume|worker|serve
    batch.py     afs batch, afs schedule …     apply.py    afs apply|rollback|audit
    mcp.py       afs mcp serve

Each command module imports what its commands use at its top, but for what pulls in the MCP SDK
or the whole workflow (a second or more), which the commands that need it import themselves.
`main` imports only the module of the command asked for (afs.cli.commands says which) and gives
the others their name and help line alone: `afs --help` imports no command module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator, Sequence

from afs.cli.commands import COMMANDS, DSN_PASSWORDS
from afs.cli.output import EXIT_INTERRUPTED, failed, reader_left
from afs.errors import AfsError, InputError, single_leaf


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The parser of the whole command line (`chosen` None), or of command `chosen` in full
    with every other command by its name and help line only (what `main` parses with)."""
    parser = argparse.ArgumentParser(
        prog="afs",
        description="Agentic Fork Squad: make slow PostgreSQL queries fast by experiment, "
                    "in disposable forks of the database.",
        epilog="State lives in $AFS_HOME (default ~/.afs). Exit codes: 0 ok, 1 failed, "
               "2 bad input, 130 interrupted.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = COMMANDS[chosen].module if chosen in COMMANDS else None
    built: set[str] = set()
    for name, command in COMMANDS.items():
        if chosen is None or command.module == wanted:
            if command.module not in built:  # the module adds all of its commands, in table order
                importlib.import_module(f"afs.cli.{command.module}").add_commands(commands)
                built.add(command.module)
        else:
            commands.add_parser(name, help=command.help)
    return parser


def chosen_command(argv: Sequence[str]) -> str:
    """The command `argv` names: its first word that is not an option ('' for none)."""
    return next((word for word in argv if not word.startswith("-")), "")


def _actions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Iterator[argparse.Action]:
    """The arguments of `parser` and of the subcommands `args` chose, recursively."""
    for action in parser._actions:  # argparse keeps them there; it has no public walk
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(str(getattr(args, action.dest, "")))
            if chosen is not None:
                yield from _actions(chosen, args)
        else:
            yield action


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse an argument that is not UTF-8 text (InputError, exit 2), and say where a
    password given in a DSN option is better kept.

    Python hands an argument's undecodable bytes over as lone surrogates (U+DC80-U+DCFF);
    nothing downstream (SQL, a DSN, a name in the store) can carry them.
    """
    names: dict[str, str] = {}
    dsn_options = set()
    for action in _actions(parser, args):
        names[action.dest] = max(action.option_strings, key=len, default=action.dest)
        if action.metavar == "DSN":
            dsn_options.add(action.dest)
    for dest, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            at = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
            if at is not None:
                code = ord(text[at])
                what = (f"byte 0x{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF
                        else f"a lone surrogate U+{code:04X}")
                raise InputError(f"{names.get(dest, dest)} is not valid UTF-8 text ({what} at character "
                                 f"{at + 1}): give it as UTF-8")
            if dest in dsn_options and _has_password(text):
                print(f"afs: note: the password in {names[dest]} is visible to every local user (ps). "
                      + DSN_PASSWORDS, file=sys.stderr)


def _has_password(dsn: str) -> bool:
    from psycopg import conninfo  # only when a DSN is given: psycopg is not for --help

    try:
        return "password" in conninfo.conninfo_to_dict(dsn)
    except Exception:  # not a connection string: the command says so itself
        return False


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(chosen_command(words))
    args = parser.parse_args(words)
    try:
        check_arguments(parser, args)
        from afs.cli.run import run_command  # trio, the settings, the logs: not for --help

        return run_command(args)
    except BaseExceptionGroup as group:
        leaf = single_leaf(group)
        if isinstance(leaf, AfsError):
            return failed(args, str(leaf), leaf.exit_code, type(leaf).__name__)
        if isinstance(leaf, BrokenPipeError):
            return reader_left()
        raise
    except BrokenPipeError:
        return reader_left()
    except AfsError as exc:
        return failed(args, str(exc), exc.exit_code, type(exc).__name__)
    except KeyboardInterrupt:
        return failed(args, "interrupted", EXIT_INTERRUPTED, "Interrupted", prefix="afs: ")


if __name__ == "__main__":
    sys.exit(main())
