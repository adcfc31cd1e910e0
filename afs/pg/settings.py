"""The settings that shape plans, and which of them a fork can take over (pure).

A fork plans like the user's server only when it runs with the user's planner settings.
Two kinds:

    carried      PLAN_SETTINGS (and every enable_*): session settings (pg_settings context
                 'user'), so they can be given to a database with `ALTER DATABASE … SET`,
                 and every session of that database starts with them
    not carried  NOT_CARRIED: the server's own (shared_buffers, the major version, the
                 worker processes) and what no setting describes (the hardware, the cache's
                 state); the report lists them with both values

`carry` decides, for values read on the source, which the sandbox can take (a name it knows
as a session setting of the same kind) and which it cannot, and why; `alter_database_sql`
writes the statement with the literal writer, for a name `carry` has let through.
Nothing here talks to a server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

from afs.models import SettingGap
from afs.pg.names import quote_ident, quote_literal

# Settings that change what the planner chooses or what a plan costs, besides every enable_*.
PLAN_SETTINGS: Final = (
    "work_mem", "hash_mem_multiplier", "maintenance_work_mem",
    "random_page_cost", "seq_page_cost", "effective_cache_size",
    "effective_io_concurrency", "maintenance_io_concurrency",
    "jit", "jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost",
    "jit_expressions", "jit_tuple_deforming",
    "default_statistics_target",
    "max_parallel_workers_per_gather", "max_parallel_workers", "max_parallel_maintenance_workers",
    "parallel_setup_cost", "parallel_tuple_cost", "parallel_leader_participation",
    "min_parallel_table_scan_size", "min_parallel_index_scan_size",
    "from_collapse_limit", "join_collapse_limit", "geqo", "geqo_threshold",
    "plan_cache_mode", "constraint_exclusion", "cursor_tuple_fraction",
    "recursive_worktable_factor",
    "cpu_tuple_cost", "cpu_index_tuple_cost", "cpu_operator_cost",
)
_PATTERN: Final = re.compile(r"^(enable_[a-z_]+|cpu_[a-z_]+_cost)$")

# What a fork cannot take from the user's server: compared, and reported when they differ.
NOT_CARRIED: Final = ("server_version", "shared_buffers", "max_worker_processes", "block_size")
# Never compared by a setting: said once in the report.
NOT_DESCRIBED: Final = "the hardware (CPU, disks) and the cache's state are not compared"

# The pattern of the names read on a server (a LIKE for pg_settings): PLAN_SETTINGS + these.
SETTINGS_LIKE: Final = ("enable\\_%", "cpu\\_%\\_cost")


def is_plan_setting(name: str) -> bool:
    """Whether `name` is one of the settings a fork takes over from the source."""
    return name in PLAN_SETTINGS or bool(_PATTERN.match(name))


def carry(source: Mapping[str, str], sandbox_contexts: Mapping[str, str]
          ) -> tuple[dict[str, str], tuple[SettingGap, ...]]:
    """Which of the source's plan settings forks take over (name → value), and the gaps.

    `sandbox_contexts`: pg_settings.context by name on the sandbox's server. A name is
    carried only when it is a plan setting and the sandbox knows it as a session setting
    ('user'); the others are gaps (a value the sandbox then refuses is a gap too, found when
    it is set: `refused`)."""
    carried: dict[str, str] = {}
    gaps: list[SettingGap] = []
    for name, value in sorted(source.items()):
        if not is_plan_setting(name):
            continue
        context = sandbox_contexts.get(name)
        if context is None:
            gaps.append(SettingGap(name, value, None, "the sandbox's server has no such setting"))
        elif context != "user":
            gaps.append(SettingGap(name, value, None, f"a {context} setting on the sandbox's server"))
        else:
            carried[name] = value
    return carried, tuple(gaps)


def refused(name: str, value: str, sandbox: str | None, error: str) -> SettingGap:
    return SettingGap(name, value, sandbox, f"the sandbox's server refused it: {error}")


def server_gaps(source: Mapping[str, str], sandbox: Mapping[str, str]) -> tuple[SettingGap, ...]:
    """NOT_CARRIED settings whose values differ (the major version for server_version)."""
    gaps = []
    for name in NOT_CARRIED:
        mine, theirs = source.get(name), sandbox.get(name)
        if mine is None or theirs is None:
            continue
        differ = (major(mine) != major(theirs)) if name == "server_version" else mine != theirs
        if differ:
            why = ("another major version: the planner itself differs" if name == "server_version"
                   else "a server setting: the sandbox's server has its own")
            gaps.append(SettingGap(name, mine, theirs, why))
    return tuple(gaps)


def major(version: str) -> str:
    """"18" of "18.6 (Debian …)", "9.6" of "9.6.24"."""
    parts = re.findall(r"\d+", version)
    if not parts:
        return version
    return parts[0] if int(parts[0]) >= 10 or len(parts) < 2 else f"{parts[0]}.{parts[1]}"


def overlay(values: Mapping[str, str], layers: Iterable[Iterable[str]]) -> dict[str, str]:
    """`values` with pg_db_role_setting entries ("name=value") laid over them, in order (later
    wins): for the role the application uses, as PostgreSQL would at its log-in."""
    out = dict(values)
    for layer in layers:
        for entry in layer:
            name, sep, value = entry.partition("=")
            if sep and is_plan_setting(name):
                out[name] = value
    return out


def alter_database_sql(database: str, name: str, value: str) -> str:
    """ALTER DATABASE … SET for a plan setting (`name` checked here, value as a literal)."""
    if not is_plan_setting(name):
        raise ValueError(f"{name!r} is not a plan setting")
    return f"ALTER DATABASE {quote_ident(database)} SET {name} = {quote_literal(value)}"
