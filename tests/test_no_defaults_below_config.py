"""No default is declared below afs.config (issue 24): pure checks over the source, no server.

A default is a constant or a frozen policy of afs.config, passed whole (as `Timeouts` is):
below config no signature or dataclass field defaults to a `DEFAULT_*` name (nor to a module
constant that only renames one), and no room reads an environment variable's value (passing
the environment whole to a child process, psql or pg_ctl, is fine). And no function of afs takes
more than six parameters (self and cls aside): what travels together is one frozen dataclass.
"""

from __future__ import annotations

import argparse
import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import afs
from afs.batch.indexes import review_indexes
from afs.batch.schedule import Cron, Scheduler
from afs.brains.gemini.brain import GeminiBrain
from afs.brains.gemini.client import GeminiClient
from afs.brains.gemini.parsing import MAX_CANDIDATES
from afs.cli import build_parser
from afs.config import (
    ASKING,
    CONNECTING,
    DEFAULT_CANDIDATES,
    DEFAULT_STATEMENT_TIMEOUT_MS,
    DEMO_WORKLOAD,
    LEASING,
    MODEL_RETRY,
    PLAN_TOKEN_BUDGET,
    SCHEDULE_POLL_S,
    SCHEDULE_TIMEZONE,
    Asking,
    ForkLimits,
    RetryPolicy,
    Settings,
    Timeouts,
)
from afs.db import DATABASE_THREADS, connect_sync, open_connection, run_in_thread

PACKAGE = Path(afs.__file__).parent

# PostgreSQL's own selectivity guesses (DEFAULT_EQ_SEL, …), not our defaults
POSTGRES_CONSTANTS = "pg/stats.py"

# What is left, each in a room outside this change (module, the DEFAULT_* or its alias):
# a new entry needs a reason as good as the ones that were here; a fixed one leaves the list.
KNOWN: set[tuple[str, str]] = set()


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module != "config.py":
            yield module, ast.parse(path.read_text(), module)


def _names(node: ast.AST) -> set[str]:
    """Every name `node` mentions, `X` and `config.X` alike."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, ast.Name | ast.Attribute)}


def _aliases(tree: ast.Module) -> set[str]:
    """The module's constants that only rename a DEFAULT_* (`DEFAULT_COUNT = DEFAULT_SETS`,
    `UNUSED_MIN_WINDOW_S = DEFAULT_UNUSED_INDEX_WINDOW_S`), transitively."""
    assigned = [(t.id, node.value) for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name) and node.value is not None]
    tainted: set[str] = set()
    while True:
        more = {name for name, value in assigned
                if any(n.startswith("DEFAULT_") or n in tainted for n in _names(value))} - tainted
        if not more:
            return tainted
        tainted |= more


def _defaults(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    """(where, default) for every signature default and every dataclass field's default."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            where = getattr(node, "name", "lambda")
            for default in (*node.args.defaults, *node.args.kw_defaults):
                if default is not None:
                    yield where, default
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and item.value is not None:
                    yield f"{node.name}.{ast.unparse(item.target)}", item.value


def defaults_below_config() -> dict[tuple[str, str], list[str]]:
    """(module, name) → where: a DEFAULT_* (or a module constant renaming one) as a default."""
    found: dict[tuple[str, str], list[str]] = {}
    for module, tree in _sources():
        if module == POSTGRES_CONSTANTS:
            continue
        aliases = _aliases(tree)
        for where, default in _defaults(tree):
            for name in _names(default):
                if name.startswith("DEFAULT_") or name in aliases:
                    found.setdefault((module, name), []).append(where)
    return found


def test_no_signature_below_config_defaults_to_a_default_of_its_own() -> None:
    found = defaults_below_config()
    unknown = {key: where for key, where in found.items() if key not in KNOWN}
    assert not unknown, ("a default declared below afs.config (make it a constant or a frozen policy "
                         f"there, passed whole): {unknown}")


def test_the_check_sees_a_default_a_signature_or_a_field_hides() -> None:
    """The check itself: a DEFAULT_* in a signature, a field, a keyword-only default or behind
    an alias is found; a policy passed whole is not."""
    tree = ast.parse(
        "DEFAULT_CLIENTS = 4\n"
        "COUNT = DEFAULT_PARAMETER_SETS\n"
        "SETS = 1 + COUNT\n"
        "def a(x=DEFAULT_CLIENTS): ...\n"
        "async def b(*, y=config.DEFAULT_SEED): ...\n"
        "def c(z=SETS): ...\n"
        "class D:\n    w: int = DEFAULT_RUNS\n"
        "def e(plan=DEMO_WORKLOAD, leasing=LEASING): ...\n")
    assert _aliases(tree) == {"COUNT", "SETS"}
    seen = {(where, name) for where, default in _defaults(tree) for name in _names(default)
            if name.startswith("DEFAULT_") or name in _aliases(tree)}
    assert seen == {("a", "DEFAULT_CLIENTS"), ("b", "DEFAULT_SEED"), ("c", "SETS"), ("D.w", "DEFAULT_RUNS")}


def test_the_environment_is_only_passed_through_below_config() -> None:
    """os.environ below config goes whole to a child process (a call's argument); nothing reads
    a variable's value from it (os.environ[...], .get, `in`, os.getenv)."""
    reads = []
    for module, tree in _sources():
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
                if node.attr in ("getenv", "getenvb", "environb"):
                    reads.append(f"{module}:{node.lineno} os.{node.attr}")
                elif node.attr == "environ":
                    parent = parents.get(node)
                    while isinstance(parent, ast.IfExp):  # dict(os.environ if env is None else env)
                        parent = parents.get(parent)
                    if not (isinstance(parent, ast.Call) and node not in (parent.func,)):
                        reads.append(f"{module}:{node.lineno} os.environ")
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                reads.extend(f"{module}:{node.lineno} from os import {a.name}" for a in node.names
                             if a.name in ("environ", "getenv", "environb", "getenvb"))
    assert not reads, f"the environment read below afs.config: {reads}"


def _option(parser: argparse.ArgumentParser, *path: str) -> dict[str, object]:
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return {a.dest: a.default for a in parser._actions}


def test_the_policies_are_configs_and_the_cli_reads_them(tmp_path: Path) -> None:
    parser = build_parser()
    workload = _option(parser, "sandbox", "workload")
    assert (workload["duration"], workload["clients"], workload["seed"]) == (
        DEMO_WORKLOAD.duration_s, DEMO_WORKLOAD.clients, DEMO_WORKLOAD.seed) == (60.0, 4, 1)
    worker, serve = _option(parser, "worker"), _option(parser, "serve")
    assert (worker["lease"], worker["poll"], serve["lease"]) == (LEASING.lease_s, LEASING.poll_s,
                                                                 LEASING.lease_s) == (30.0, 0.5, 30.0)
    settings = Settings(home=tmp_path)
    assert settings.fork_limits == ForkLimits()  # one set of defaults
    tight = settings.with_(fork_max_growth_mb=20, fork_temp_file_limit_mb=1, statement_timeout_ms=500)
    assert tight.fork_limits == ForkLimits(temp_file_limit_mb=1, max_growth_mb=20, statement_timeout_ms=500)


def _default(fn: object, parameter: str) -> object:
    return inspect.signature(fn).parameters[parameter].default  # type: ignore[arg-type]


def test_connections_and_schedules_take_configs_defaults() -> None:
    """afs.db's defaults are config.CONNECTING's, the same values as before; its limiter is the
    one process-wide DATABASE_THREADS; a schedule's zone is config's, as `afs schedule add`'s."""
    timeouts = {_default(f, "statement_timeout_ms") for f in (open_connection, connect_sync)}
    assert timeouts == {CONNECTING.statement_timeout_ms} == {DEFAULT_STATEMENT_TIMEOUT_MS} == {60_000}
    assert _default(open_connection, "limiter") is _default(run_in_thread, "limiter") is DATABASE_THREADS
    assert DATABASE_THREADS.total_tokens == CONNECTING.threads == 16
    assert CONNECTING.connect_timeout_s == 10
    schedule = _option(build_parser(), "schedule", "add")
    assert Cron("@daily").timezone == schedule["tz"] == SCHEDULE_TIMEZONE == "UTC"


def test_the_model_clients_retries_and_how_the_brain_asks_are_configs() -> None:
    """The Gemini client's retries and how the brain asks are config's frozen policies, with the
    values they had below it; a schedule polls at config's interval; the index review's window
    is its caller's (the settings', `--min-window`), with no default of its own."""
    assert _default(GeminiClient.generate_json, "policy") is _default(GeminiClient.check_model, "policy") \
        is MODEL_RETRY == RetryPolicy(attempts=4, backoff_s=(1.0, 2.0, 4.0), max_wait_s=60.0, jitter=True,
                                      max_timeouts=2)
    assert Asking() == Asking(model_phase_s=Timeouts().model, call_timeout_s=None, policy=MODEL_RETRY,
                              plan_budget_tokens=PLAN_TOKEN_BUDGET, max_candidates=DEFAULT_CANDIDATES)
    assert (Asking().model_phase_s, Asking().plan_budget_tokens, Asking().max_candidates) == (120.0, 4000, 4)
    assert _default(GeminiBrain, "asking") is None  # None: config's ASKING
    assert Asking() == ASKING and MAX_CANDIDATES == ASKING.max_candidates == DEFAULT_CANDIDATES
    assert _default(Scheduler.run_forever, "poll_s") == SCHEDULE_POLL_S == 30.0
    assert _default(review_indexes, "min_window_s") is inspect.Parameter.empty


MAX_PARAMETERS = 6
# Functions over six parameters that stay, each with its reason (module, qualified name): none
# is left (issue 24 grouped what travels together: bench.Suites/Earlier, agents.TaskCommon,
# brains.StepSeen, testing.Pacing/FakeModels/Child); a new entry needs a reason as good as theirs.
MANY_PARAMETERS: dict[tuple[str, str], str] = {}


def parameter_counts(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """(qualified name, parameters) of every function and method of `tree`, nested ones too:
    positional, keyword-only, *args and **kwargs each count one; a method's self or cls does not."""
    def walk(body: list[ast.stmt], prefix: str, in_class: bool) -> Iterator[tuple[str, int]]:
        for node in body:
            if isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                named = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
                if in_class and not static and named and named[0].arg in ("self", "cls"):
                    named = named[1:]
                yield f"{prefix}{node.name}", len(named) + (a.vararg is not None) + (a.kwarg is not None)
                yield from walk(node.body, f"{prefix}{node.name}.", False)
            else:
                for field_name in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field_name, None)
                    if isinstance(inner, list):
                        yield from walk([n for n in inner if isinstance(n, ast.stmt | ast.excepthandler)],
                                        prefix, in_class)
    yield from walk(tree.body, "", False)


def functions_over(limit: int) -> dict[tuple[str, str], int]:
    return {(module, name): count for module, tree in _all_sources()
            for name, count in parameter_counts(tree) if count > limit}


def _all_sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), path.name)


def test_no_function_takes_more_than_six_parameters() -> None:
    found = functions_over(MAX_PARAMETERS)
    unknown = {key: count for key, count in found.items() if key not in MANY_PARAMETERS}
    assert not unknown, (f"more than {MAX_PARAMETERS} parameters (group what travels together in a "
                         f"frozen dataclass, or a policy of afs.config passed whole): {unknown}")
    fixed = sorted(set(MANY_PARAMETERS) - set(found))
    assert not fixed, f"{MAX_PARAMETERS} parameters or fewer now, take them off MANY_PARAMETERS: {fixed}"


def test_the_count_sees_methods_nested_functions_and_star_parameters() -> None:
    tree = ast.parse(
        "def a(p, q, r, s, t, u): ...\n"
        "def b(p, /, q, *r, s, t, u, **v): ...\n"
        "class C:\n"
        "    def m(self, p, q, r, s, t, u): ...\n"
        "    @classmethod\n"
        "    def k(cls, p, q, r, s, t, u, v): ...\n"
        "    @staticmethod\n"
        "    def z(self, p, q, r, s, t, u): ...\n"
        "if True:\n"
        "    async def d(p, q, r, s, t, u):\n"
        "        def e(*, p, q, r, s, t, u, v): ...\n")
    counts = dict(parameter_counts(tree))
    assert counts == {"a": 6, "b": 7, "C.m": 6, "C.k": 7, "C.z": 7, "d": 6, "d.e": 7}
