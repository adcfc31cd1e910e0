"""The one configuration object.

`Settings` is built once, by `load_settings()`, from the environment and the
optional YAML file `$AFS_HOME/settings.yaml`, then passed explicitly. The
environment wins over the file; the file wins over the defaults below.

Environment:
    AFS_HOME                  state directory (default ~/.afs)
    AFS_DATABASE_URL          the user's own database (libpq DSN or URL);
                              PGHOST/PGPORT/PGDATABASE/PGUSER/PGSERVICE count too
    AFS_FORK_SERVER_COMMAND   command of the MCP fork server (shell words)
    AFS_STATEMENT_TIMEOUT_MS  server-side statement timeout of every connection
    AFS_FORK_TTL_SECONDS      default lifetime of a fork
    AFS_SCALE                 demo data scale: small | demo | large
    AFS_ROUTING_RULES         path of the routing rules file
    AFS_TIMEOUT_<PHASE>_S     fork, model, benchmark, agent, task time limits
    AFS_CANDIDATES            designs each agent screens with the planner (default 4)
    AFS_MEASURED              of those, how many it measures in its fork (default 3)
    AFS_PARAMETER_SETS        other literal values each proposal is checked with (default 2)
    AFS_SLOW_BASELINE_CAP_S   cap of the one baseline run of a query past the statement timeout
    AFS_STORE_URL             the task store's database (default: the sandbox's `postgres`)
    AFS_SERVICE_TOKEN         bearer token of `afs serve` (required off loopback) and its clients
    AFS_FORK_SERVER_URL       a fork server over streamable HTTP (`afs mcp serve --http`), e.g.
                              http://forks:8471/mcp, instead of the stdio command
    AFS_FORK_SERVER_TOKEN     its bearer token (required off loopback)
    AFS_SOURCE_SERVER_URL     the server holding the source databases, for workers on other
                              machines (its database name is replaced by the task's source)

Gemini credentials are the SDK's own variables (GOOGLE_API_KEY or GEMINI_API_KEY;
GOOGLE_GENAI_USE_VERTEXAI with GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION), plus
AFS_GEMINI_BASE_URL (another endpoint: proxies, the fake server) and
AFS_GEMINI_MODEL_<AGENT> (e.g. AFS_GEMINI_MODEL_GEMINI25PRO); `afs.brains.gemini.client` reads
them from the environment the CLI passes in.

The YAML file may also hold `timeouts: {fork: 30, model: 120, ...}`, `runs`, `candidates`,
`measured`, `parameter_sets` and `slow_baseline_cap_s`.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from afs.errors import ConfigError

DEFAULT_HOME = "~/.afs"
DEFAULT_STATEMENT_TIMEOUT_MS = 60_000
DEFAULT_FORK_TTL_SECONDS = 3600
DEFAULT_SCALE = "demo"
DEFAULT_SEED = 42
DEMO_DATABASE = "afs_demo"
DEFAULT_RUNS = 5
DEFAULT_CANDIDATES = 4  # designs an agent screens with the planner
DEFAULT_MEASURED = 3  # of those, how many it measures for real in its fork
DEFAULT_PARAMETER_SETS = 2  # other literal values every proposal is also checked with
DEFAULT_SLOW_BASELINE_CAP_S = 600.0  # one baseline run of a query past the statement timeout


@dataclass(frozen=True)
class Timeouts:
    """Per-phase time limits in seconds (the agent specification's defaults)."""

    fork: float = 30.0
    model: float = 120.0
    benchmark: float = 300.0
    agent: float = 600.0
    task: float = 900.0
TEMPLATE_SUFFIX = "_template"
# The longest unix socket path is 107 bytes; keep a margin for ".s.PGSQL.5432".
_MAX_SOCKET_DIR = 90
_LIBPQ_TARGET_VARS = ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE", "PGHOSTADDR")


def default_fork_server_command() -> tuple[str, ...]:
    return (sys.executable, "-m", "afs", "mcp", "serve")


@dataclass(frozen=True)
class Settings:
    home: Path
    target_dsn: str | None = None
    fork_server_command: tuple[str, ...] = field(default_factory=default_fork_server_command)
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
    fork_ttl_seconds: int = DEFAULT_FORK_TTL_SECONDS
    scale: str = DEFAULT_SCALE
    seed: int = DEFAULT_SEED
    demo_database: str = DEMO_DATABASE
    timeouts: Timeouts = field(default_factory=Timeouts)
    runs: int = DEFAULT_RUNS
    candidates: int = DEFAULT_CANDIDATES
    measured: int = DEFAULT_MEASURED
    parameter_sets: int = DEFAULT_PARAMETER_SETS
    slow_baseline_cap_s: float = DEFAULT_SLOW_BASELINE_CAP_S
    routing_rules: Path | None = None  # default: routing_rules.yaml (see afs.router.load_rules)
    store_url: str | None = None  # the task store; None: the sandbox server's `postgres` database
    service_token: str | None = None  # bearer token of the HTTP service
    fork_server_url: str | None = None  # the fork server over streamable HTTP, instead of stdio
    fork_server_token: str | None = None  # its bearer token
    source_server_url: str | None = None  # where the sources are read; None: the sandbox

    @property
    def sandbox_dir(self) -> Path:
        return self.home / "sandbox"

    @property
    def pgdata(self) -> Path:
        return self.sandbox_dir / "data"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def socket_dir(self) -> Path:
        """Where the sandbox server puts its unix socket (short enough to bind)."""
        preferred = self.home / "run"
        if len(str(preferred)) <= _MAX_SOCKET_DIR:
            return preferred
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
        return Path("/tmp") / f"afs-{digest}"

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)


def _target_from_env(env: Mapping[str, str]) -> str | None:
    if env.get("AFS_DATABASE_URL"):
        return env["AFS_DATABASE_URL"]
    if any(env.get(name) for name in _LIBPQ_TARGET_VARS):
        return ""  # libpq fills everything in from the PG* variables
    return None


def _int(value: Any, name: str, source: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} must be an integer, got {value!r}") from None
    if number <= 0:
        raise ConfigError(f"{source}: {name} must be positive, got {number}")
    return number


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from `env` (default: the process environment) and the YAML file."""
    env = os.environ if env is None else env
    home = Path(env.get("AFS_HOME") or DEFAULT_HOME).expanduser().resolve()
    file_values: dict[str, Any] = {}
    settings_file = home / "settings.yaml"
    if settings_file.exists():
        try:
            loaded = yaml.safe_load(settings_file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{settings_file}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{settings_file}: expected a mapping at the top level")
        file_values = loaded

    def pick(key: str, env_name: str) -> tuple[Any, str]:
        if env.get(env_name):
            return env[env_name], env_name
        return file_values.get(key), str(settings_file)

    settings = Settings(home=home)
    changes: dict[str, Any] = {}
    target = _target_from_env(env)
    if target is None and file_values.get("database_url"):
        target = str(file_values["database_url"])
    changes["target_dsn"] = target

    command, _ = pick("fork_server_command", "AFS_FORK_SERVER_COMMAND")
    if command:
        words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
        if not words:
            raise ConfigError("the fork server command is empty")
        changes["fork_server_command"] = tuple(words)
    for key, env_name in (
        ("statement_timeout_ms", "AFS_STATEMENT_TIMEOUT_MS"),
        ("fork_ttl_seconds", "AFS_FORK_TTL_SECONDS"),
    ):
        value, source = pick(key, env_name)
        if value is not None:
            changes[key] = _int(value, key, source)
    for key, env_name in (
        ("runs", "AFS_RUNS"),
        ("candidates", "AFS_CANDIDATES"),
        ("measured", "AFS_MEASURED"),
        ("parameter_sets", "AFS_PARAMETER_SETS"),
    ):
        value, source = pick(key, env_name)
        if value is not None:
            changes[key] = _int(value, key, source)
    value, source = pick("slow_baseline_cap_s", "AFS_SLOW_BASELINE_CAP_S")
    if value is not None:
        changes["slow_baseline_cap_s"] = float(_int(value, "slow_baseline_cap_s", source))
    for key, env_name in (("store_url", "AFS_STORE_URL"), ("service_token", "AFS_SERVICE_TOKEN"),
                          ("fork_server_url", "AFS_FORK_SERVER_URL"),
                          ("fork_server_token", "AFS_FORK_SERVER_TOKEN"),
                          ("source_server_url", "AFS_SOURCE_SERVER_URL")):
        value, _ = pick(key, env_name)
        if value:
            changes[key] = str(value)
    rules, _ = pick("routing_rules", "AFS_ROUTING_RULES")
    if rules:
        changes["routing_rules"] = Path(str(rules)).expanduser()
    limits: dict[str, float] = {}
    file_timeouts = file_values.get("timeouts") or {}
    if not isinstance(file_timeouts, dict):
        raise ConfigError(f"{settings_file}: timeouts must be a mapping")
    for phase in ("fork", "model", "benchmark", "agent", "task"):
        env_name = f"AFS_TIMEOUT_{phase.upper()}_S"
        raw = env.get(env_name) or file_timeouts.get(phase)
        if raw is not None:
            try:
                limits[phase] = float(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"timeout {phase} must be a number of seconds, got {raw!r}") from None
            if limits[phase] <= 0:
                raise ConfigError(f"timeout {phase} must be positive, got {raw!r}")
    if limits:
        changes["timeouts"] = Timeouts(**limits)
    scale, source = pick("scale", "AFS_SCALE")
    if scale is not None:
        if scale not in ("small", "demo", "large"):
            raise ConfigError(f"{source}: scale must be small, demo or large, got {scale!r}")
        changes["scale"] = scale
    return replace(settings, **changes)
