"""One check of a task for the command line and the API, one answer to "does the sandbox serve
the forks?", and `afs serve` assembled above the rooms it uses (issue 24)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from afs.brains.choose import PROVIDERS as BRAIN_PROVIDERS
from afs.cli import build_parser
from afs.cli.commands import COMMANDS
from afs.config import Settings, load_settings
from afs.models import Priority, Provider, TaskType
from afs.sandbox.forks import in_process, uses_the_sandbox
from afs.service.api import OPENAPI, FieldError, parse_submission
from afs.task import MAX_RUNS, PRIORITIES, PROVIDERS, TASK_TYPES
from afs.testing import Child, run_afs

QUERY = "SELECT id FROM orders WHERE user_id = 42"


def _choices(command: str, dest: str) -> tuple[str, ...]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    option = next(a for a in commands.choices[command]._actions if a.dest == dest)
    assert option.choices is not None
    return tuple(option.choices)


def test_the_choices_are_the_literals_of_models_everywhere() -> None:
    assert PROVIDERS == get_args(Provider) == BRAIN_PROVIDERS == _choices("optimize", "provider")
    assert _choices("batch", "provider") == PROVIDERS
    assert PRIORITIES == get_args(Priority) == _choices("optimize", "priority")
    assert TASK_TYPES == get_args(TaskType) == _choices("optimize", "type")
    body = OPENAPI["paths"]["/v1/tasks"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert tuple(body["properties"]["provider"]["enum"]) == PROVIDERS
    assert body["properties"]["runs"]["maximum"] == MAX_RUNS


@pytest.mark.parametrize(("field", "value", "flag", "given"), [
    ("runs", MAX_RUNS + 1, "--runs", str(MAX_RUNS + 1)),
    ("runs", 0, "--runs", "0"),
    ("weights", {"performance": 0.9, "storage": 0.2}, "--weights", "performance=0.9,storage=0.2"),
])
def test_the_command_line_refuses_what_the_api_refuses_for_the_same_reason(
        tmp_path: Path, field: str, value: object, flag: str, given: str) -> None:
    with pytest.raises(FieldError) as api:
        parse_submission({"query": QUERY, field: value}, default_runs=5)
    assert api.value.field == field
    # --server: nothing here would start; a task that passes the check would then fail to connect
    cli = run_afs("optimize", "--query", QUERY, flag, given, "--server", "http://127.0.0.1:9",
                  "--json", home=tmp_path, child=Child(timeout_s=120))
    assert cli.returncode == 2, cli.stderr
    error = json.loads(cli.stdout)["error"]
    assert error.startswith(f"{flag}: ") and str(api.value).startswith(f"{field}: ")
    reason = error.removeprefix(f"{flag}: ").split(", got")[0]
    assert reason == str(api.value).removeprefix(f"{field}: ").split(", got")[0]
    assert not load_settings({"AFS_HOME": str(tmp_path)}).pgdata.exists()


def test_one_predicate_says_whether_the_sandbox_serves_the_forks(tmp_path: Path) -> None:
    settings: Settings = load_settings({"AFS_HOME": str(tmp_path)})
    remote = dataclasses.replace(settings, fork_server_url="http://forks.example:8471/mcp")
    own = dataclasses.replace(settings, fork_server_command=("my-fork-server",))
    dsn = "postgresql://app@db.example/shop"
    assert in_process(settings) and uses_the_sandbox(settings, dsn) and uses_the_sandbox(settings, None)
    for other in (remote, own):  # another fork server forks the database itself
        assert not in_process(other)
        assert not uses_the_sandbox(other, dsn)
        assert uses_the_sandbox(other, None)  # the demo database is the sandbox's


def test_a_fork_server_url_and_a_dsn_need_a_task_store_of_their_own(tmp_path: Path) -> None:
    """The command line asks the one predicate: with AFS_FORK_SERVER_URL and --dsn the sandbox
    serves nothing, so the task store must be named; refused before anything starts."""
    done = run_afs("optimize", "--provider", "heuristic", "--dsn", "postgresql://app@127.0.0.1:9/shop",
                   "--query", QUERY, home=tmp_path, child=Child(timeout_s=120),
                   env={"PATH": "/usr/bin:/bin", "AFS_FORK_SERVER_URL": "http://127.0.0.1:9/mcp"})
    assert done.returncode == 2, done.stderr
    assert b"AFS_STORE_URL" in done.stderr
    assert not load_settings({"AFS_HOME": str(tmp_path)}).pgdata.exists()


def test_the_table_of_commands_is_what_the_modules_add() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(commands.choices) == list(COMMANDS)
    listed = {c.dest: c.help for c in commands._choices_actions}
    assert listed == {name: command.help for name, command in COMMANDS.items()}
    for name, command in COMMANDS.items():  # each command comes from the module the table names
        alone = build_parser(name)
        sub = next(a for a in alone._actions if isinstance(a, argparse._SubParsersAction))
        built = [n for n, p in sub.choices.items() if p._actions[1:]]  # more than -h: built in full
        assert built == [n for n, c in COMMANDS.items() if c.module == command.module]


PROBE = """
import sys
from afs.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(" ".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize(("argv", "loaded", "not_loaded"), [
    (["--help"], set(), {"trio", "psycopg", "afs.store", "afs.sandbox.server", "afs.cli.sandbox"}),
    (["history", "--help"], {"afs.cli.service"},
     {"afs.cli.sandbox", "afs.cli.batch", "afs.sandbox.workload", "mcp", "afs.optimize"}),
    # the MCP SDK (a second) only for the commands that fork: `afs sandbox down` stops the sandbox fast
    (["sandbox", "down", "--help"], {"afs.cli.sandbox"}, {"mcp", "afs.forks.provider"}),
])
def test_the_command_line_imports_only_what_its_command_needs(
        argv: list[str], loaded: set[str], not_loaded: set[str]) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True,
                          check=True, timeout=120)
    modules = set(done.stdout.split())
    assert loaded <= modules and not modules & not_loaded, modules & not_loaded
