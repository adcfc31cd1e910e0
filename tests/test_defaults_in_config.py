"""Defaults in one place, typed facts, measuring in one room (issue 24): pure checks, no server.

A default is a constant or a frozen policy in afs.config, passed whole; the environment is
read in config alone; every error AFS raises on purpose is in the one tree of afs.errors;
model usage travels as a typed record.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import afs
import afs.errors
from afs.agents import AgentJob
from afs.batch.job import BatchOptions
from afs.bench import StopRule, TaskMeasurements
from afs.brains import Squad, StrategistBrain
from afs.config import (
    ADMIN_STATEMENT_TIMEOUT_MS,
    BATCH_PARAMETER_SETS,
    DEFAULT_PARAMETER_SETS,
    PARAMETER_QUANTILES,
    Measuring,
    Settings,
    Timeouts,
)
from afs.forks.provider import LocalForkProvider
from afs.models import ModelUsage
from afs.params import family, fill

PACKAGE = Path(afs.__file__).parent


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([str(PACKAGE)], "afs.")
                  if m.name != "afs.__main__")


def test_every_branch_of_the_error_tree_is_in_errors_and_drawn_there() -> None:
    """bench.ApplyError was a branch of its own outside the tree (and collided with afs/apply/);
    a room may refine a branch (a leaf under InputError), not start one."""
    for name in _modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if inspect.isclass(value) and afs.errors.AfsError in value.__bases__:
                assert value.__module__ == "afs.errors", f"{name}.{attr} starts a branch outside afs.errors"
    doc = afs.errors.__doc__ or ""
    for attr, value in vars(afs.errors).items():
        if inspect.isclass(value) and issubclass(value, afs.errors.AfsError):
            assert f" {attr} " in doc, f"{attr} is not drawn in afs.errors' docstring"


# the rooms of this change: below config, no default is declared again
OWN = ["agents.py", "bench.py", "optimize.py", "analysis.py", "brains/__init__.py", "forks/provider.py"]


def _names(node: ast.AST | None) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node is not None else set()


@pytest.mark.parametrize("module", OWN)
def test_no_default_is_declared_again_below_config(module: str) -> None:
    """No DEFAULT_* of config in a signature or a field below it: the policy is passed whole."""
    tree = ast.parse((PACKAGE / module).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for default in (*node.args.defaults, *node.args.kw_defaults):
                found |= _names(default)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign):
                    found |= _names(item.value)
        elif isinstance(node, ast.ImportFrom) and node.module == "afs.config":
            found |= {a.name for a in node.names}
    assert not {n for n in found if n.startswith("DEFAULT_")}, module


def test_the_parameter_sets_have_one_source() -> None:
    """2 other sets in the query family, the statement's own and 2 others in a batch: both
    counts are their callers' (the family's from `Measuring.parameter_sets`, a batch's from
    BATCH_PARAMETER_SETS), neither a default of the pure functions."""
    assert Measuring().parameter_sets == DEFAULT_PARAMETER_SETS
    assert BATCH_PARAMETER_SETS == 1 + DEFAULT_PARAMETER_SETS
    assert BatchOptions().sets == BATCH_PARAMETER_SETS
    for function in (family.parameter_sets, fill.fill):
        assert inspect.signature(function).parameters["count"].default is inspect.Parameter.empty


def test_the_histogram_positions_of_other_values_have_one_source() -> None:
    assert family.QUANTILES is PARAMETER_QUANTILES.moves
    assert fill.LOWER is PARAMETER_QUANTILES.lower and fill.UPPER is PARAMETER_QUANTILES.upper
    assert all(low <= high for low, high in zip(fill.LOWER, fill.UPPER, strict=True))


def test_the_measuring_policy_is_the_settings_passed_whole(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    policy = settings.measuring
    assert policy == Measuring(slow_cap_s=policy.slow_cap_s)  # the same defaults, one place
    # the long baseline run: at least the statement timeout, at most 2/3 of the agent's limit
    assert policy.slow_cap_s == Timeouts().agent * 2 / 3
    tight = settings.with_(statement_timeout_ms=200, slow_baseline_cap_s=60.0, runs=4, min_runs=4)
    assert tight.measuring.slow_cap_s == 60.0 and not tight.measuring.adaptive
    assert StopRule.of(tight.measuring) == StopRule(min_runs=4, max_runs=4)
    assert StopRule.of(policy, policy.family_runs) == StopRule(min_runs=3, max_runs=3)
    # an agent's job carries the timeouts and the policy, not nine settings one by one
    job_fields = {f.name for f in dataclasses.fields(AgentJob)}
    assert {"timeouts", "measuring"} <= job_fields
    assert not job_fields & {"runs", "min_runs", "candidates", "measured", "parameter_sets",
                             "statement_timeout_ms", "slow_cap_s", "measure_budget_s"}
    # what a task's measurements share is one object (slow runs with the reused baselines)
    shared = TaskMeasurements()
    assert shared.reuse.for_fork().slow_runs is shared.reuse.slow_runs


def test_the_fork_providers_own_timeout_is_configs() -> None:
    assert LocalForkProvider("dbname=nothing").statement_timeout_ms == ADMIN_STATEMENT_TIMEOUT_MS
    default = inspect.signature(LocalForkProvider).parameters["statement_timeout_ms"].default
    assert default == ADMIN_STATEMENT_TIMEOUT_MS  # no value of its own (it was a literal 120_000)


def test_the_environment_is_read_in_config_alone(tmp_path: Path) -> None:
    for module in ("sandbox/importer.py", "service/runner.py"):
        text = (PACKAGE / module).read_text()
        assert "os.environ" not in text and "getenv" not in text, module
    settings = Settings(home=tmp_path, environment={"GEMINI_API_KEY": "secret-key"})
    assert "secret-key" not in repr(settings)  # never printed
    assert settings == Settings(home=tmp_path)  # nor compared


def test_model_usage_is_a_typed_record() -> None:
    squad = Squad(brain_for=lambda _agent: StrategistBrain(), provider="heuristic")
    assert squad.usage_of("gemini25pro") is None  # no model, no usage
    assert "usage" not in {f.name for f in dataclasses.fields(Squad)}  # nothing mutable inside
    usage = ModelUsage(model="gemini-3.8-flash", prompt_tokens=10, calls=1, estimated_cost_usd=None)
    assert ModelUsage(**usage.record()) == usage
    assert usage.record()["estimated_cost_usd"] is None


def test_the_index_reviews_window_is_one_setting(tmp_path: Path) -> None:
    # `afs indexes`, `afs batch` and `afs apply --drop-index` judge "unused" over one window
    from afs.config import DEFAULT_UNUSED_INDEX_WINDOW_S, ConfigError, load_settings
    from afs.errors import InputError

    home = {"AFS_HOME": str(tmp_path)}
    assert load_settings(home).unused_index_window_s == DEFAULT_UNUSED_INDEX_WINDOW_S == 7 * 86_400
    assert load_settings({**home, "AFS_UNUSED_INDEX_WINDOW_S": "0"}).unused_index_window_s == 0
    for bad in ("a week", "-1", "nan"):
        with pytest.raises(ConfigError, match="unused_index_window_s"):
            load_settings({**home, "AFS_UNUSED_INDEX_WINDOW_S": bad})
    from afs.cli.indexes import min_window
    assert min_window(None, 60.0) == 60.0 and min_window("2h", 60.0) == 7200.0
    with pytest.raises(InputError):
        min_window("soon", 60.0)
