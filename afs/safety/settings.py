"""The per-query settings a proposal may recommend (pure): measured with SET LOCAL in the fork,
recommended per role or per query, never globally (`check_settings`, `settings_sql`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from afs.models import UnsafeStatement

# Planner settings a proposal may recommend for one query (measured with SET LOCAL in the fork,
# recommended per role or per query, never globally), with the largest value accepted.
SETTING_LIMITS_KB: Mapping[str, int] = {"work_mem": 2 * 1024 * 1024, "hash_mem_multiplier": 0}


_MEMORY = re.compile(r"^\s*(\d+)\s*(kB|MB|GB)?\s*$")


_MULTIPLIER = re.compile(r"^\s*\d+(\.\d+)?\s*$")


_UNIT_KB = {None: 1, "kB": 1, "MB": 1024, "GB": 1024 * 1024}


def check_settings(settings: Sequence[tuple[str, str]]) -> list[UnsafeStatement]:
    """The refused settings of a proposal, each with its reason (empty when all are allowed)."""
    refused: list[UnsafeStatement] = []
    for name, value in settings:
        shown = f"SET LOCAL {name} = {value!r}"
        if name not in SETTING_LIMITS_KB:
            refused.append(UnsafeStatement(shown, f"only {', '.join(sorted(SETTING_LIMITS_KB))} may be set"))
        elif name == "hash_mem_multiplier":
            if not _MULTIPLIER.match(value) or not 1.0 <= float(value) <= 16.0:
                refused.append(UnsafeStatement(shown, "hash_mem_multiplier must be a number from 1 to 16"))
        else:
            match = _MEMORY.match(value)
            if match is None:
                refused.append(UnsafeStatement(shown, "a memory size such as 64MB is expected"))
            elif not 64 <= int(match[1]) * _UNIT_KB[match[2]] <= SETTING_LIMITS_KB[name]:
                refused.append(UnsafeStatement(shown, f"{name} must be between 64kB and 2GB"))
    return refused


def settings_sql(settings: Sequence[tuple[str, str]], scope: str = "SET LOCAL") -> tuple[str, ...]:
    """The statements that apply `settings` (already checked), e.g. for the report."""
    return tuple(f"{scope} {name} = '{value.strip()}'" for name, value in settings)
