"""Fork names (pure): the seed's pattern afs-fork-{agent}-task{id}-{unix}."""

from __future__ import annotations

import re
import secrets
import time

FORK_PREFIX = "afs-fork-"
MAX_IDENTIFIER = 63
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


class InvalidForkName(ValueError):
    pass


def validate_fork_name(name: str) -> str:
    """Check a fork name; the `afs-fork-` prefix is added when missing."""
    if not name.startswith(FORK_PREFIX):
        name = FORK_PREFIX + name
    if len(name) > MAX_IDENTIFIER or not _NAME.match(name):
        raise InvalidForkName(
            f"invalid fork name {name!r}: use lower-case letters, digits, '-' and '_',"
            f" at most {MAX_IDENTIFIER} characters"
        )
    return name


def fork_name(agent: str, task_id: str | int, now: float | None = None) -> str:
    """E.g. fork_name("gemini-2.5-pro", 123) == "afs-fork-gemini25pro-task123-<unix>"."""
    agent_part = re.sub(r"[^a-z0-9]", "", agent.lower()) or "agent"
    task_part = re.sub(r"[^a-z0-9]", "", str(task_id).lower()) or "0"
    unix = int(time.time() if now is None else now)
    return validate_fork_name(f"{FORK_PREFIX}{agent_part}-task{task_part}-{unix}")


def random_fork_name(label: str = "manual") -> str:
    return fork_name(label, secrets.token_hex(3))
