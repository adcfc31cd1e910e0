"""The one configuration object.

`Settings` is built once, by `load_settings()`, from the environment and the
optional YAML file `$AFS_HOME/settings.yaml`, then passed explicitly. The
environment wins over the file; the file wins over the defaults below.

Every default is declared here once, as a named constant or a frozen policy that the rooms
below take whole: `Timeouts` (per-phase limits), `Measuring` (`Settings.measuring`: runs, stop
rule, budget, candidates, parameter sets, the long baseline run), `Quantiles` (histogram
positions of other values), `ForkLimits` (`Settings.fork_limits`), `RoutingDefaults` (what
routing_rules.yaml leaves out), `Leasing` (workers' leases and polling), `DemoWorkload`,
`Connecting` (afs.db's connections), `GeminiSettings`, `RetryPolicy` (`MODEL_RETRY`: the model
client's retries), `Asking` (how the Gemini brain asks). No `DEFAULT_*` is a default in a
signature or a field below this module (tests/test_no_defaults_below_config.py holds it and
lists what is left). The process environment is read here (`load_settings`,
`process_environment`); `Settings.environment` keeps it for the model SDK's credentials and
child processes.

Environment:
    AFS_HOME                  state directory (default ~/.afs)
    AFS_DATABASE_URL          the user's own database (libpq DSN or URL);
                              PGHOST/PGPORT/PGDATABASE/PGUSER/PGSERVICE count too
    AFS_FORK_SERVER_COMMAND   command of an MCP fork server over stdio (shell words; default:
                              the sandbox's fork server inside the process, afs.sandbox.forks)
    AFS_STATEMENT_TIMEOUT_MS  server-side statement timeout of every connection
    AFS_FORK_TTL_SECONDS      default lifetime of a fork
    AFS_FORK_GC_INTERVAL_S    how often a running fork server collects expired forks (default 60)
    AFS_FORK_SPARES           ready forks the fork server keeps per source where forks clone
                              (default 3; 0: none)
    AFS_FORK_MAX_GROWTH_MB    how much a fork may grow past its copy (default 2048)
    AFS_FORK_TEMP_FILE_LIMIT_MB  temp_file_limit of every fork's role (default 2048)
    AFS_SCALE                 demo data scale: small | demo | large
    AFS_ROUTING_RULES         path of the routing rules file
    AFS_TIMEOUT_<PHASE>_S     fork, model, benchmark, agent, task time limits
    AFS_CANDIDATES            designs each agent screens with the planner (default 4)
    AFS_MEASURED              of those, how many it measures in its fork (default 3)
    AFS_PARAMETER_SETS        other literal values each proposal is checked with (default 2)
    AFS_SLOW_BASELINE_CAP_S   cap of the one baseline run of a query past the statement timeout
    AFS_RUNS                  measured runs per suite query and side, at most (default 5)
    AFS_MIN_RUNS              runs before measuring may stop because the verdict is certain (default 3;
                              = AFS_RUNS measures a fixed count)
    AFS_MEASURE_BUDGET_S      query time one candidate's measurement may take (default 60)
    AFS_LOOP_STEPS            designs an agent's loop adds to its best one, reading the plan with it
                              in place (default 3; 0: no loop)
    AFS_LOOP_BUDGET_S         time an agent's loop may take, its measurements included (default 120)
    AFS_BATCH_MIN_MEAN_MS     `afs batch` leaves out statements faster than this on average, before
                              any fork (default 1; 0: none; --min-ms overrides it)
    AFS_UNUSED_INDEX_WINDOW_S the index review calls an index unused only when the statistics cover at
                              least this long (default 604800, 7 days; 0: any window; `afs indexes
                              --min-window` overrides it; `afs batch` and `afs apply --drop-index` take it)
    AFS_COW                   1: `afs sandbox up` puts the sandbox on a copy-on-write XFS image file
                              when its filesystem has no reflinks (needs root; see afs.sandbox.storage)
    AFS_COW_SIZE              the image's size, sparse (default 100G)

    AFS_GEMINI_MODEL_<AGENT>  the model behind an agent, e.g. AFS_GEMINI_MODEL_GEMINI25PRO
    AFS_STORE_URL             the task store's database (default: the sandbox's `postgres`)
    AFS_SERVICE_TOKEN         bearer token of `afs serve` (required off loopback and for an apply
                              over HTTP) and its clients
    AFS_SERVICE_HOSTS         host names `afs serve` answers to besides loopback (comma-separated;
                              a request with another Host header is refused: DNS rebinding)
    AFS_SERVICE_MAX_BODY      the largest request body `afs serve` reads (default 1M)
    AFS_FORK_SERVER_URL       a fork server over streamable HTTP (`afs mcp serve --http`), e.g.
                              http://forks:8471/mcp, instead of the stdio command
    AFS_FORK_SERVER_TOKEN     its bearer token (always required; default: made by the server once and
                              kept in $AFS_HOME/fork-server.token, mode 0600, where AFS's clients read it)
    AFS_ADMIN_DSN             superuser DSN of the server `afs mcp serve` forks on (default: the sandbox):
                              instead of --admin-dsn, whose command line every local user sees in `ps`
    AFS_SOURCE_SERVER_URL     the server holding the source databases, for workers on other
                              machines (its database name is replaced by the task's source)
    AFS_APPLICATION_ROLE      the role the application uses on the user's database: forks take
                              its per-role and per-database planner settings (default: the DSN's role)

Gemini credentials are the SDK's own variables (GOOGLE_API_KEY or GEMINI_API_KEY;
GOOGLE_GENAI_USE_ENTERPRISE, or the older GOOGLE_GENAI_USE_VERTEXAI, with GOOGLE_CLOUD_PROJECT
and GOOGLE_CLOUD_LOCATION), plus
AFS_GEMINI_BASE_URL (another endpoint: proxies, the fake server); `afs.brains.gemini.client`
reads them from the environment the CLI passes in.

The YAML file may also hold `timeouts: {fork: 30, model: 120, ...}`, `runs`, `candidates`,
`measured`, `parameter_sets`, `slow_baseline_cap_s`, `min_runs`, `measure_budget_s`,
`loop_steps`, `loop_budget_s`,
`batch_min_mean_ms`, `unused_index_window_s`, `cow`,
`cow_size`, `service_hosts` (a list), `service_max_body`, and `gemini:` with `models`
(agent → model) and `model_settings` (model → generation settings, merged over MODEL_SETTINGS):

    gemini:
      models: {gemini25pro: gemini-3.1-pro-preview}
      model_settings:
        gemini-3.1-pro-preview: {thinking_level: high, call_timeout_s: 100}
      max_spend_usd: 0.50     # per task (AFS_GEMINI_MAX_SPEND_USD): no model call past it
      send_values: false      # AFS_GEMINI_SEND_VALUES: no literals, MCVs or bounds in prompts
      stream: true            # AFS_GEMINI_STREAM: a stalled stream, not one wall clock, ends a call
      budget: {turns: 12, tokens: 400000, seconds: 300}   # per agent and task (ModelBudget;
                              # AFS_GEMINI_BUDGET_TURNS, _TOKENS, _SECONDS)
"""

from __future__ import annotations

import hashlib
import math
import os
import random as _random
import re
import shlex
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

import yaml

from afs.errors import ConfigError

DEFAULT_HOME = "~/.afs"
DEFAULT_STATEMENT_TIMEOUT_MS = 60_000  # every connection to a fork, and the forks' roles
# the fork provider's own connections (copying a template, registering a source, a fork's catalog
# work as the admin): longer than a query's, as they copy whole databases
ADMIN_STATEMENT_TIMEOUT_MS: Final = 120_000
DEFAULT_FORK_TTL_SECONDS = 3600
DEFAULT_FORK_GC_INTERVAL_S = 60
DEFAULT_FORK_SPARES = 3  # a squad's forks at once
DEFAULT_FORK_MAX_GROWTH_MB = 2048
DEFAULT_FORK_TEMP_FILE_LIMIT_MB = 2048
DEFAULT_SCALE = "demo"
DEFAULT_SEED = 42
DEMO_DATABASE = "afs_demo"
DEFAULT_RUNS = 5  # measured runs per suite query and side, at most
DEFAULT_MIN_RUNS = 3  # runs before measuring may stop because the verdict is certain
DEFAULT_MEASURE_BUDGET_S = 60.0  # query time one candidate's measurement may take
DEFAULT_CANDIDATES = 4  # designs an agent screens with the planner
DEFAULT_MEASURED = 3  # of those, how many it measures for real in its fork
# the agent's loop (afs.agents): the steps it may add to its best design, and the time they may take
DEFAULT_LOOP_STEPS = 3
DEFAULT_LOOP_BUDGET_S = 120.0
# a squad design a spare measuring slot screens (afs.agents): its rolled-back build may take this
# long in the fork, and one that takes longer is passed over (an SP-GiST build of a million ranges
# ran past a minute only to be screened)
DEFAULT_SPARE_BUILD_S = 10.0
# other literal values every proposal is also checked with (afs.params.family); a batch fills a
# statement's $n with its own values and as many others (afs.params.fill)
DEFAULT_PARAMETER_SETS = 2
FAMILY_RUNS = 3  # measured runs a side, at most, of the query with other values
MIN_COW_SIZE_BYTES = 512 * 1024 ** 2  # mkfs.xfs refuses file systems under 300 MB
DEFAULT_COW_SIZE = "100G"  # the sandbox's sparse XFS image (it takes space only as data is written)
# a batch spends no fork on a statement faster than this on average (a primary-key lookup:
# there is nothing to win that pays a fork, and its measurements are noise)
DEFAULT_BATCH_MIN_MEAN_MS = 1.0
DEFAULT_UNUSED_INDEX_WINDOW_S = 7 * 86_400.0  # the index review's window for "unused" (afs.batch.indexes)
DEFAULT_SLOW_BASELINE_CAP_S = 600.0  # one baseline run of a query past the statement timeout
# of the time left before the agent's deadline (less a statement timeout for each query with
# other values still to probe), what that one run may take: the rest is the candidate's
SLOW_CAP_SHARE = 0.5
# a candidate this many times faster than every baseline run, reading at most half the baseline's
# shared buffers, has its verdict from LARGE_EFFECT_RUNS baseline runs (afs.bench: the large
# effect): the factor beyond which afs.bench already trusts baseline runs measured earlier
# in the task without a fresh one (REUSE_FACTOR, above the worst drift seen: 2.2x)
LARGE_EFFECT = 3.0
LARGE_EFFECT_RUNS = 1
# The copy against the user's server (afs.conditions): a table whose size differs from the
# source's by more than this fraction makes the copy stale; an all-visible fraction
# (relallvisible / the pages it has now, as the planner reads it) that differs by more than
# this makes index-only scans measure otherwise than on the user's server.
SIZE_DRIFT: Final = 0.2
ALL_VISIBLE_GAP: Final = 0.2
DEFAULT_SERVICE_MAX_BODY_BYTES = 1024 ** 2  # a task request is at most a 100 kB query and its options


@dataclass(frozen=True)
class Timeouts:
    """Per-phase time limits in seconds (the agent specification's defaults)."""

    fork: float = 30.0
    model: float = 120.0
    benchmark: float = 300.0
    agent: float = 600.0
    task: float = 900.0

    @property
    def closing(self) -> float:
        """What an agent keeps of its time for closing its fork, so what it measured is still
        reported: the fork's limit, at most a quarter of the agent's time (a short agent time,
        as in tests, would otherwise end every measurement before it starts)."""
        return min(self.fork, self.agent / 4)


@dataclass(frozen=True)
class Quantiles:
    """Histogram positions other values of a column are drawn from (afs.params), in order of
    preference. The query family moves a range or a bound to `moves`; the `$n` filling gives
    its n-th parameter set the lower bound `lower[n]` and the upper bound `upper[n]`, pairs
    that keep a lower bound below its upper one."""

    moves: tuple[float, ...] = (0.25, 0.75, 0.5, 0.1, 0.9, 0.4, 0.6)
    lower: tuple[float, ...] = (0.25, 0.1, 0.5, 0.4)
    upper: tuple[float, ...] = (0.75, 0.5, 0.9, 0.6)


PARAMETER_QUANTILES: Final = Quantiles()


@dataclass(frozen=True)
class Measuring:
    """How a task's candidates are searched and measured, passed whole (as `Timeouts` is):
    `Settings.measuring`, with a task's own `runs` over it (afs.optimize), read by the agents
    and the measuring loop (afs.bench: stop rule, budget, the long baseline run)."""

    runs: int = DEFAULT_RUNS  # measured runs per suite query and side, at most
    min_runs: int = DEFAULT_MIN_RUNS  # runs before measuring may stop (the verdict is certain)
    budget_s: float = DEFAULT_MEASURE_BUDGET_S  # query time one candidate's measurement may take
    family_runs: int = FAMILY_RUNS  # runs a side, at most, of the query with other values
    candidates: int = DEFAULT_CANDIDATES  # designs an agent screens with the planner
    measured: int = DEFAULT_MEASURED  # of those, how many it measures in its fork
    parameter_sets: int = DEFAULT_PARAMETER_SETS  # other literal values checked per proposal
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS  # of every connection to a fork
    slow_cap_s: float = 0.0  # one baseline run of a query past the statement timeout (0: none)
    slow_cap_share: float = SLOW_CAP_SHARE  # at most this share of the agent's time left (afs.bench)
    large_effect: float = LARGE_EFFECT  # this many times faster settles early (0: never; afs.bench)
    large_effect_runs: int = LARGE_EFFECT_RUNS  # baseline runs that settle a large effect
    loop_steps: int = DEFAULT_LOOP_STEPS  # designs the agent's loop may add to its best one (0: none)
    loop_budget_s: float = DEFAULT_LOOP_BUDGET_S  # time the agent's loop may take
    spare_build_s: float = DEFAULT_SPARE_BUILD_S  # a spare slot's screening build, at most

    @property
    def adaptive(self) -> bool:
        """Whether a loop may stop before `runs` (and reuse baseline runs across candidates)."""
        return self.min_runs < self.runs

    @property
    def runs_ahead(self) -> int:
        """Baseline runs of each query measured before any candidate exists
        (afs.bench.measure_before): what settles a large effect; a candidate that is not one
        tops them up to `min_runs` (afs.bench)."""
        if self.adaptive and self.large_effect > 0:
            return max(1, min(self.large_effect_runs, self.min_runs))
        return self.min_runs


# a batch fills a statement's `$n` with its own values and as many others as the query family
# draws (afs.params.fill; afs.batch.job.BatchOptions.sets)
BATCH_PARAMETER_SETS: Final = 1 + DEFAULT_PARAMETER_SETS


@dataclass(frozen=True)
class ForkLimits:
    """What a fork may consume, set on its role when it is made (afs.forks.limits), passed whole:
    `Settings.fork_limits`."""

    temp_file_limit_mb: int = DEFAULT_FORK_TEMP_FILE_LIMIT_MB
    max_growth_mb: int = DEFAULT_FORK_MAX_GROWTH_MB
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS


@dataclass(frozen=True)
class RoutingDefaults:
    """What routing_rules.yaml may leave out (afs.router): the agent a task gets when no rule
    selects one, and the capacity (an agent with `soft_limit` tasks or more is kept with a note,
    one with `hard_limit` or more is skipped)."""

    default_agent: str = "gemini25flash"  # an afs.models.AgentKey
    soft_limit: int = 2
    hard_limit: int = 3


ROUTING_DEFAULTS: Final = RoutingDefaults()


@dataclass(frozen=True)
class Leasing:
    """How a worker holds the tasks it runs and looks for more (afs.service.worker): its lease on
    a task, renewed every min(lease_s / 3, 0.5) s (a worker that stops renewing it is taken for
    dead once it runs out), and how often an idle worker looks at the queue. `afs worker --lease
    --poll` and `afs serve --lease` over it."""

    lease_s: float = 30.0
    poll_s: float = 0.5


LEASING: Final = Leasing()


@dataclass(frozen=True)
class DemoWorkload:
    """How the demo shop's workload runs (afs.sandbox.workload): for `duration_s` seconds, from
    `clients` connections, its values drawn with `seed`. `afs sandbox workload --duration
    --clients --seed` over it."""

    duration_s: float = 60.0
    clients: int = 4
    seed: int = 1


DEMO_WORKLOAD: Final = DemoWorkload()


@dataclass(frozen=True)
class Connecting:
    """How AFS talks to PostgreSQL (afs.db): the server-side statement timeout of a connection
    whose caller names none, how long opening one may take, and how many threads may talk to
    PostgreSQL at once, process-wide (one trio.CapacityLimiter, afs.db.DATABASE_THREADS)."""

    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
    connect_timeout_s: int = 10
    threads: int = 16


CONNECTING: Final = Connecting()
# the IANA time zone a schedule's cron expression is read in when none is given
# (afs.batch.schedule.add_schedule; `afs schedule add --tz`)
SCHEDULE_TIMEZONE: Final = "UTC"
SCHEDULE_POLL_S: Final = 30.0  # a schedule added meanwhile is noticed within this (afs serve's scheduler)


TEMPLATE_SUFFIX = "_template"
# The longest unix socket path is 107 bytes; keep a margin for ".s.PGSQL.5432".
_MAX_SOCKET_DIR = 90
_LIBPQ_TARGET_VARS = ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE", "PGHOSTADDR")

# The user's libpq variables (PGHOST, PGPORT, PGSERVICE, PGSSLMODE, PGTZ, …: every name with the
# PG prefix) describe the user's database, not AFS's own servers. libpq reads them at every
# connect, in this process and in every child, and a connection string cannot undo some of them
# (PGSERVICE, PGTZ, PGDATESTYLE). So `load_settings` takes them out of the process environment
# once and keeps them here; `afs.db.resolve_dsn` writes them into the user's DSNs explicitly,
# as libpq would have (the DSN first, then its service, then these), while AFS's own servers
# (the sandbox, its forks) see none of them. This is process state because the environment is.
_TAKEN_LIBPQ_ENV: dict[str, str] = {}


def take_libpq_environment(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Move every PG* variable out of `env` (default: the process environment) and return all
    taken so far (a later call takes what was set since)."""
    env = os.environ if env is None else env
    for name in [n for n in env if n.startswith("PG")]:
        _TAKEN_LIBPQ_ENV[name] = env.pop(name)
    return dict(_TAKEN_LIBPQ_ENV)


def process_environment() -> dict[str, str]:
    """This process's environment as it is now (the user's PG* variables taken out once
    settings are loaded): what child processes and the model SDK's credentials read
    (`Settings.environment`; afs.sandbox.importer gives it to pg_dump and pg_restore)."""
    return dict(os.environ)


def user_libpq_environment() -> dict[str, str]:
    """The user's libpq variables as `take_libpq_environment` took them (nothing before)."""
    return dict(_TAKEN_LIBPQ_ENV)


# -- Gemini models -------------------------------------------------------------------------
# The agents keep the seed's identities (gemini25pro, gemini25flash, gemini20flash: routing,
# reports, tie-breaks); the model behind each moves on. Defaults chosen on 2026-11-27 among
# GA (stable) models only, from the Gemini API's models, deprecations and pricing pages: no
# Pro model is GA (gemini-3.1-pro-preview is a Preview: excluded from production use by the
# terms, no free quota), so the index-design role and the review take the most capable GA
# Flash (gemini-3.8-flash, thinking high); structure takes the previous GA Flash
# (gemini-3.7-flash, the same price); pre-computation takes the newest GA Flash-Lite
# (gemini-3.5-flash-lite: gemini-3.1-flash-lite shuts down on 2027-05-07).
GEMINI_DEFAULTS_CHOSEN: Final = "2026-11-27"
DEFAULT_GEMINI_MODELS: Final[Mapping[str, str]] = {
    "gemini25pro": "gemini-3.8-flash",
    "gemini25flash": "gemini-3.7-flash",
    "gemini20flash": "gemini-3.5-flash-lite",
}
ENV_GEMINI_MODEL_PREFIX: Final = "AFS_GEMINI_MODEL_"  # + the agent key in capitals
THINKING_LEVELS: Final = ("minimal", "low", "medium", "high")
MODEL_STAGES: Final = ("stable", "preview", "deprecated")  # as the deprecations page lists them
DEFAULT_CALL_TIMEOUT_S: Final = 60.0  # one HTTP attempt of a model without an entry below


@dataclass(frozen=True)
class Price:
    """List prices in USD per million tokens, from `since` (an ISO date) on."""

    since: str
    input_usd_per_mtok: float
    output_usd_per_mtok: float  # thinking included
    cached_input_usd_per_mtok: float | None = None


@dataclass(frozen=True)
class ModelSettings:
    """How AFS calls one model, and what is known of it: thinking, sampling, output limit,
    time per call, price, stage.

    `thinking_level` is for Gemini 3.x, `thinking_budget` (tokens; -1 dynamic, 0 off) for 2.5;
    2.5-pro always thinks (no budget 0); None sends nothing (2.0 models do not think).
    `thinking_levels` are the levels the model accepts (empty: not known, not checked).
    `temperature` None leaves the vendor's default (Gemini 3 advises keeping it: lower values can
    loop). `max_output_tokens` includes the thinking tokens. Prices are USD per million tokens,
    output including thinking (list prices: an estimate, not a bill), in effect from
    `prices_from`; `price_changes` are announced later prices; None: unknown. `stage` and
    `shutdown` (ISO date) are the deprecations page's; `free_tier` says whether the Gemini API's
    free tier has quota for the model (None: not known).
    """

    thinking_level: str | None = None
    thinking_budget: int | None = None
    temperature: float | None = None
    max_output_tokens: int = 16_384
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None
    cached_input_usd_per_mtok: float | None = None
    prices_from: str | None = None
    price_changes: tuple[Price, ...] = ()
    thinking_levels: tuple[str, ...] = ()
    stage: str | None = None
    shutdown: str | None = None
    free_tier: bool | None = None

    def price_on(self, day: str) -> Price | None:
        """The prices in effect on `day` (an ISO date); None without a known price."""
        if self.input_usd_per_mtok is None or self.output_usd_per_mtok is None:
            return None
        price = Price(self.prices_from or "", self.input_usd_per_mtok, self.output_usd_per_mtok,
                      self.cached_input_usd_per_mtok)
        for change in sorted(self.price_changes, key=lambda c: c.since):
            if change.since <= day:
                price = change
        return price


# Per model family (a versioned name such as gemini-2.5-pro-002 reads its family's entry).
# Checked on 2026-11-27. Prices: the Gemini API's paid tier for text prompts up to 200k
# tokens (ai.google.dev/gemini-api/docs/pricing as transcribed on 2026-10-07; cached-input
# prices a tenth of the input price, as resellers list them). Stages and shutdown dates:
# ai.google.dev/gemini-api/docs/deprecations. Thinking levels: the Agent Platform's model
# pages (3.5 Flash, 3.1 Pro, 3.1 and 3.5 Flash-Lite); 3.8 Flash dropped `minimal`; 3.6 and 3.7
# Flash are taken to accept what 3.5 Flash does. A thinking call can take more than a minute:
# its per-call timeout is longer, still inside the 120 s model phase.
_GEMINI3_LEVELS: Final = THINKING_LEVELS
MODEL_SETTINGS: Final[Mapping[str, ModelSettings]] = {
    "gemini-3.8-flash": ModelSettings(
        thinking_level="high", max_output_tokens=32_768, call_timeout_s=100.0,
        input_usd_per_mtok=0.75, output_usd_per_mtok=3.75, cached_input_usd_per_mtok=0.075,
        prices_from="2026-09-02",
        price_changes=(Price("2027-01-01", 1.50, 7.50, 0.15),),
        thinking_levels=("low", "medium", "high"), stage="stable", free_tier=True),
    "gemini-3.7-flash": ModelSettings(
        thinking_level="medium", max_output_tokens=32_768, call_timeout_s=75.0,
        input_usd_per_mtok=0.75, output_usd_per_mtok=3.75, cached_input_usd_per_mtok=0.075,
        prices_from="2026-08-13", thinking_levels=_GEMINI3_LEVELS, stage="stable"),
    "gemini-3.6-flash": ModelSettings(
        thinking_level="medium", max_output_tokens=32_768, call_timeout_s=75.0,
        input_usd_per_mtok=0.75, output_usd_per_mtok=3.75, cached_input_usd_per_mtok=0.075,
        prices_from="2026-07-21", thinking_levels=_GEMINI3_LEVELS, stage="stable"),
    "gemini-3.5-flash": ModelSettings(
        thinking_level="medium", max_output_tokens=32_768, call_timeout_s=75.0,
        input_usd_per_mtok=1.50, output_usd_per_mtok=9.00, cached_input_usd_per_mtok=0.15,
        prices_from="2026-05-19", thinking_levels=_GEMINI3_LEVELS, stage="stable"),
    "gemini-3.5-flash-lite": ModelSettings(
        thinking_level="medium", max_output_tokens=16_384, call_timeout_s=60.0,
        input_usd_per_mtok=0.30, output_usd_per_mtok=2.50, cached_input_usd_per_mtok=0.03,
        prices_from="2026-07-21", thinking_levels=_GEMINI3_LEVELS, stage="stable"),
    "gemini-3.1-flash-lite": ModelSettings(
        thinking_level="medium", max_output_tokens=16_384, call_timeout_s=60.0,
        input_usd_per_mtok=0.25, output_usd_per_mtok=1.50, cached_input_usd_per_mtok=0.025,
        prices_from="2026-05-07", thinking_levels=_GEMINI3_LEVELS, stage="stable",
        shutdown="2027-05-07"),
    "gemini-3.1-pro-preview": ModelSettings(
        thinking_level="high", max_output_tokens=32_768, call_timeout_s=100.0,
        input_usd_per_mtok=2.00, output_usd_per_mtok=12.00, cached_input_usd_per_mtok=0.20,
        prices_from="2026-02-19", thinking_levels=("low", "medium", "high"), stage="preview",
        free_tier=False),
    "gemini-3-flash-preview": ModelSettings(
        thinking_level="medium", max_output_tokens=32_768, call_timeout_s=75.0,
        input_usd_per_mtok=0.50, output_usd_per_mtok=3.00, cached_input_usd_per_mtok=0.05,
        prices_from="2025-12-17", thinking_levels=_GEMINI3_LEVELS, stage="preview"),
    "gemini-2.5-pro": ModelSettings(thinking_budget=8_192, temperature=0.2, max_output_tokens=32_768,
                                    call_timeout_s=100.0, input_usd_per_mtok=1.25,
                                    output_usd_per_mtok=10.00, cached_input_usd_per_mtok=0.125,
                                    prices_from="2025-07-01", stage="deprecated",
                                    shutdown="2026-06-17"),
    "gemini-2.5-flash": ModelSettings(thinking_budget=4_096, temperature=0.2, max_output_tokens=16_384,
                                      call_timeout_s=75.0, input_usd_per_mtok=0.30,
                                      output_usd_per_mtok=2.50, cached_input_usd_per_mtok=0.03,
                                      prices_from="2025-07-01", stage="deprecated",
                                      shutdown="2026-06-17"),
    "gemini-2.0-flash": ModelSettings(temperature=0.2, max_output_tokens=8_192, call_timeout_s=60.0,
                                      input_usd_per_mtok=0.10, output_usd_per_mtok=0.40,
                                      prices_from="2025-02-05", stage="deprecated"),
}
_VERSION_SUFFIX: Final = re.compile(r"-(?:\d+|latest|preview|exp\w*)$")  # one segment at a time


@dataclass(frozen=True)
class ModelBudget:
    """What one agent's model calls may take in one task (the Gemini brain checks it before
    every call: once one part is spent the agent's conversation stops, and the report says
    which). `turns`: model calls (re-prompts and the loop's turns included); `tokens`: prompt
    and output tokens (thinking included; a conversation resends its earlier turns, so later
    turns cost more); `seconds`: time spent waiting for the model."""

    turns: int = 12
    tokens: int = 400_000
    seconds: float = 300.0

    def spent(self, turns: int, tokens: int, seconds: float) -> str | None:
        """Which part is spent after `turns` calls of `tokens` and `seconds`, said for the
        report; None while the next call fits."""
        if turns >= self.turns:
            return f"{turns} model turns of {self.turns} (gemini.budget.turns)"
        if tokens >= self.tokens:
            return f"{tokens:,} tokens of {self.tokens:,} (gemini.budget.tokens)"
        if seconds >= self.seconds:
            return f"{seconds:.0f} s in model calls of {self.seconds:g} (gemini.budget.seconds)"
        return None


@dataclass(frozen=True)
class GeminiSettings:
    """The model behind each agent, and the generation settings of each model."""

    models: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_GEMINI_MODELS))
    model_settings: Mapping[str, ModelSettings] = field(default_factory=lambda: dict(MODEL_SETTINGS))
    max_spend_usd: float | None = None  # per task: no model call once the estimate reaches it
    send_values: bool = True  # False: no literals, most common values or bounds in prompts
    stream: bool = False  # stream answers: a stall, not one wall clock, ends a thinking call
    budget: ModelBudget = field(default_factory=ModelBudget)  # per agent and task

    def model_of(self, agent: str) -> str:
        return self.models.get(agent) or DEFAULT_GEMINI_MODELS.get(agent) or DEFAULT_GEMINI_MODELS[
            "gemini25pro"]

    def settings_of(self, model: str) -> ModelSettings:
        """The entry of `model`, else of its family (without a version suffix), else defaults
        (`entry_of` says whether there is one: AFS warns before any fork when there is not)."""
        return self.entry_of(model) or ModelSettings()

    def entry_of(self, model: str) -> ModelSettings | None:
        """The entry of `model` or of its family; None when the table has neither."""
        name = model.removeprefix("models/")
        while True:
            if name in self.model_settings:
                return self.model_settings[name]
            shorter = _VERSION_SUFFIX.sub("", name)
            if shorter == name:
                return None
            name = shorter

    @staticmethod
    def setting_names(agent: str) -> str:
        """Where a person changes the model of `agent`."""
        return f"gemini.models.{agent} in settings.yaml or {ENV_GEMINI_MODEL_PREFIX}{agent.upper()}"


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts and waits of the model client's `generate_json` (the seed's "Retry Strategy").

    Waits have full jitter (a uniform draw from 0 to the cap of the attempt): the agents share
    one key, and without jitter they retry in lockstep and hit the rate limit together again.
    A call that timed out is retried once at most: a second slow answer will not be faster.
    """

    attempts: int = 4
    backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0)  # caps before the 2nd, 3rd, 4th attempt
    max_wait_s: float = 60.0  # a longer Retry-After ends the retries at once
    jitter: bool = True
    max_timeouts: int = 2  # attempts that may time out: the first and its one retry
    random: Callable[[], float] = field(default=_random.random, compare=False, repr=False)

    def backoff(self, attempt: int) -> float:
        """The wait after failed attempt number `attempt` (1-based)."""
        cap = self.backoff_s[min(attempt, len(self.backoff_s)) - 1]
        return cap * self.random() if self.jitter else cap


MODEL_RETRY: Final = RetryPolicy()
PLAN_TOKEN_BUDGET: Final = 4000  # the plan in a prompt, in tokens (afs.pg.plan.plan_text)


@dataclass(frozen=True)
class Asking:
    """How a `GeminiBrain` asks, passed whole: the model phase every question fits in
    (`Timeouts.model`), a call timeout overriding each model's own (tests; None: the model's
    `call_timeout_s`), the retries, the plan's token budget in a prompt, and how many candidates
    a proposal asks for (`Settings.candidates`)."""

    model_phase_s: float = Timeouts().model
    call_timeout_s: float | None = None
    policy: RetryPolicy = MODEL_RETRY
    plan_budget_tokens: int = PLAN_TOKEN_BUDGET
    max_candidates: int = DEFAULT_CANDIDATES


ASKING: Final = Asking()


def default_fork_server_command() -> tuple[str, ...]:
    return (sys.executable, "-m", "afs", "mcp", "serve")


@dataclass(frozen=True)
class Settings:
    home: Path
    target_dsn: str | None = None
    fork_server_command: tuple[str, ...] = field(default_factory=default_fork_server_command)
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
    fork_ttl_seconds: int = DEFAULT_FORK_TTL_SECONDS
    fork_gc_interval_s: int = DEFAULT_FORK_GC_INTERVAL_S
    fork_spares: int = DEFAULT_FORK_SPARES
    fork_max_growth_mb: int = DEFAULT_FORK_MAX_GROWTH_MB
    fork_temp_file_limit_mb: int = DEFAULT_FORK_TEMP_FILE_LIMIT_MB
    scale: str = DEFAULT_SCALE
    seed: int = DEFAULT_SEED
    demo_database: str = DEMO_DATABASE
    timeouts: Timeouts = field(default_factory=Timeouts)
    runs: int = DEFAULT_RUNS
    min_runs: int = DEFAULT_MIN_RUNS
    measure_budget_s: float = DEFAULT_MEASURE_BUDGET_S
    loop_steps: int = DEFAULT_LOOP_STEPS
    loop_budget_s: float = DEFAULT_LOOP_BUDGET_S
    candidates: int = DEFAULT_CANDIDATES
    measured: int = DEFAULT_MEASURED
    parameter_sets: int = DEFAULT_PARAMETER_SETS
    slow_baseline_cap_s: float = DEFAULT_SLOW_BASELINE_CAP_S
    large_effect: float = LARGE_EFFECT  # Measuring.large_effect (0: every verdict on min_runs a side)
    batch_min_mean_ms: float = DEFAULT_BATCH_MIN_MEAN_MS  # `afs batch --min-ms`'s default
    unused_index_window_s: float = DEFAULT_UNUSED_INDEX_WINDOW_S  # `afs indexes --min-window`'s default
    cow: bool = False  # put the sandbox on a copy-on-write image when its filesystem has no reflinks
    cow_size_bytes: int = 100 * 1024 ** 3  # DEFAULT_COW_SIZE
    routing_rules: Path | None = None  # default: routing_rules.yaml (see afs.router.load_rules)
    gemini: GeminiSettings = field(default_factory=GeminiSettings)
    store_url: str | None = None  # the task store; None: the sandbox server's `postgres` database
    service_token: str | None = None  # bearer token of the HTTP service
    fork_server_url: str | None = None  # the fork server over streamable HTTP, instead of stdio
    fork_server_token: str | None = None  # its bearer token
    admin_dsn: str | None = None  # where `afs mcp serve` forks (default: the sandbox)
    source_server_url: str | None = None  # where the sources are read; None: the sandbox
    application_role: str | None = None  # whose planner settings forks take; None: the DSN's role
    service_hosts: tuple[str, ...] = ()  # Host names the service answers to besides loopback
    service_max_body_bytes: int = DEFAULT_SERVICE_MAX_BODY_BYTES  # larger request bodies: 413
    # the process environment when the settings were made (Gemini credentials, AFS_GEMINI_BASE_URL:
    # afs.brains.gemini reads them from here); never printed or compared
    environment: Mapping[str, str] = field(default_factory=process_environment, repr=False,
                                           compare=False)

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
    def fork_server_token_file(self) -> Path:
        """The fork server's token over HTTP when `fork_server_token` is not set (afs.forks.token)."""
        return self.home / "fork-server.token"

    @property
    def socket_dir(self) -> Path:
        """Where the sandbox server puts its unix socket (short enough to bind)."""
        preferred = self.home / "run"
        if len(str(preferred)) <= _MAX_SOCKET_DIR:
            return preferred
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
        return Path("/tmp") / f"afs-{digest}"

    @property
    def fork_limits(self) -> ForkLimits:
        """What each fork may consume, as these settings say."""
        return ForkLimits(temp_file_limit_mb=self.fork_temp_file_limit_mb,
                          max_growth_mb=self.fork_max_growth_mb,
                          statement_timeout_ms=self.statement_timeout_ms)

    @property
    def measuring(self) -> Measuring:
        """The measuring policy these settings give (`slow_cap_s` bounded by the agent's time
        limit, leaving it a third for everything else)."""
        cap = max(self.statement_timeout_ms / 1000,
                  min(self.slow_baseline_cap_s, self.timeouts.agent * 2 / 3))
        return Measuring(runs=self.runs, min_runs=self.min_runs, budget_s=self.measure_budget_s,
                         candidates=self.candidates, measured=self.measured,
                         parameter_sets=self.parameter_sets,
                         statement_timeout_ms=self.statement_timeout_ms, slow_cap_s=cap,
                         large_effect=self.large_effect,
                         loop_steps=self.loop_steps, loop_budget_s=self.loop_budget_s)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in a size such as "100G", "512M", "2T" (powers of 1024); ValueError otherwise."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 100G or 512M)")
    number, unit = float(match.group(1)), match.group(2).upper()
    return int(number * 1024 ** "_KMGT".index(unit or "_"))


def parse_cow_size(text: str) -> int:
    """The size of the sandbox's copy-on-write image: a size of at least 512M."""
    size = parse_size(text)
    if size < MIN_COW_SIZE_BYTES:
        raise ValueError(f"{text!r} is too small: the image needs at least 512M")
    return size


def _target_from_env(env: Mapping[str, str]) -> str | None:
    if env.get("AFS_DATABASE_URL"):
        return env["AFS_DATABASE_URL"]
    if any(env.get(name) for name in _LIBPQ_TARGET_VARS):
        return ""  # libpq fills everything in from the PG* variables
    return None


def _int(value: Any, name: str, source: str, minimum: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ConfigError(f"{source}: {name} must be {'positive' if minimum == 1 else f'at least {minimum}'},"
                          f" got {number}")
    return number


def _number(value: Any, name: str, source: str, unit: str, positive: bool) -> float:
    """A finite number of `unit`, positive or not negative (ConfigError naming the setting)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} must be a number of {unit}, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ConfigError(f"{source}: {name} must {'be positive' if positive else 'not be negative'},"
                          f" got {value!r}")
    return number


def safe_yaml(text: str) -> Any:
    """`yaml.safe_load`, by libyaml when PyYAML has it (ten times faster: the routing rules
    are read for every task)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from `env` (default: the process environment) and the YAML file."""
    if env is None:  # the user's PG* variables are for the user's database only (above)
        env = {**os.environ, **take_libpq_environment()}
    home = Path(env.get("AFS_HOME") or DEFAULT_HOME).expanduser().resolve()
    file_values: dict[str, Any] = {}
    settings_file = home / "settings.yaml"
    if settings_file.exists():
        try:
            loaded = safe_yaml(settings_file.read_text()) or {}
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
        ("fork_gc_interval_s", "AFS_FORK_GC_INTERVAL_S"),
        ("fork_max_growth_mb", "AFS_FORK_MAX_GROWTH_MB"),
        ("fork_temp_file_limit_mb", "AFS_FORK_TEMP_FILE_LIMIT_MB"),
    ):
        value, source = pick(key, env_name)
        if value is not None:
            changes[key] = _int(value, key, source)
    value, source = pick("fork_spares", "AFS_FORK_SPARES")
    if value is not None:
        changes["fork_spares"] = _int(value, "fork_spares", source, minimum=0)
    for key, env_name in (
        ("runs", "AFS_RUNS"),
        ("min_runs", "AFS_MIN_RUNS"),
        ("candidates", "AFS_CANDIDATES"),
        ("measured", "AFS_MEASURED"),
        ("parameter_sets", "AFS_PARAMETER_SETS"),
    ):
        value, source = pick(key, env_name)
        if value is not None:
            changes[key] = _int(value, key, source)
    value, source = pick("loop_steps", "AFS_LOOP_STEPS")
    if value is not None:
        changes["loop_steps"] = _int(value, "loop_steps", source, minimum=0)
    for key, env_name, unit, positive in (
        ("measure_budget_s", "AFS_MEASURE_BUDGET_S", "seconds", True),
        ("loop_budget_s", "AFS_LOOP_BUDGET_S", "seconds", False),
        ("batch_min_mean_ms", "AFS_BATCH_MIN_MEAN_MS", "milliseconds", False),
        ("unused_index_window_s", "AFS_UNUSED_INDEX_WINDOW_S", "seconds", False),
    ):
        value, source = pick(key, env_name)
        if value is not None:
            changes[key] = _number(value, key, source, unit, positive)
    value, source = pick("slow_baseline_cap_s", "AFS_SLOW_BASELINE_CAP_S")
    if value is not None:
        changes["slow_baseline_cap_s"] = float(_int(value, "slow_baseline_cap_s", source))
    value, source = pick("cow", "AFS_COW")
    if value is not None:
        if str(value).lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ConfigError(f"{source}: cow must be true or false, got {value!r}")
        changes["cow"] = str(value).lower() in ("1", "true", "yes", "on")
    value, source = pick("cow_size", "AFS_COW_SIZE")
    if value is not None:
        try:
            changes["cow_size_bytes"] = parse_cow_size(str(value))
        except ValueError as exc:
            raise ConfigError(f"{source}: cow_size: {exc}") from None
    for key, env_name in (("store_url", "AFS_STORE_URL"), ("service_token", "AFS_SERVICE_TOKEN"),
                          ("fork_server_url", "AFS_FORK_SERVER_URL"),
                          ("fork_server_token", "AFS_FORK_SERVER_TOKEN"),
                          ("admin_dsn", "AFS_ADMIN_DSN"),
                          ("source_server_url", "AFS_SOURCE_SERVER_URL"),
                          ("application_role", "AFS_APPLICATION_ROLE")):
        value, _ = pick(key, env_name)
        if value:
            changes[key] = str(value)
    hosts, _ = pick("service_hosts", "AFS_SERVICE_HOSTS")
    if hosts:
        words = hosts.split(",") if isinstance(hosts, str) else [str(h) for h in hosts]
        changes["service_hosts"] = tuple(h.strip().lower() for h in words if h.strip())
    value, source = pick("service_max_body", "AFS_SERVICE_MAX_BODY")
    if value is not None:
        try:
            changes["service_max_body_bytes"] = parse_size(str(value))
        except ValueError as exc:
            raise ConfigError(f"{source}: service_max_body: {exc}") from None
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
    changes["gemini"] = _gemini_settings(file_values.get("gemini"), env, str(settings_file))
    scale, source = pick("scale", "AFS_SCALE")
    if scale is not None:
        if scale not in ("small", "demo", "large"):
            raise ConfigError(f"{source}: scale must be small, demo or large, got {scale!r}")
        changes["scale"] = scale
    return replace(settings, **changes)


# what settings.yaml may set (announced price changes are the table's alone)
_MODEL_SETTING_FIELDS: Final = frozenset(f.name for f in fields(ModelSettings)) - {"price_changes"}
_PRICE_FIELDS: Final = frozenset({"input_usd_per_mtok", "output_usd_per_mtok", "cached_input_usd_per_mtok"})


def _iso_date(value: Any, where: str, name: str) -> str | None:
    if value is None:
        return None
    text = str(value)  # YAML reads 2027-05-07 as a date: its str() is the ISO form
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ConfigError(f"{where}: {name} must be a date (YYYY-MM-DD), got {value!r}")
    return text


def _model_settings(model: str, raw: Any, base: ModelSettings, source: str) -> ModelSettings:
    """One model's entry of `gemini.model_settings`, checked, over `base`."""
    where = f"{source}: gemini.model_settings.{model}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    unknown = sorted(set(raw) - _MODEL_SETTING_FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown setting {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(_MODEL_SETTING_FIELDS))})")
    values = {**{f.name: getattr(base, f.name) for f in fields(ModelSettings)}, **raw}
    if "thinking_level" in raw and raw["thinking_level"] is not None and "thinking_budget" not in raw:
        values["thinking_budget"] = None  # the one given replaces the other
    if "thinking_budget" in raw and raw["thinking_budget"] is not None and "thinking_level" not in raw:
        values["thinking_level"] = None
    if _PRICE_FIELDS & set(raw):  # your own prices hold from today on: no announced change applies
        values["price_changes"] = ()
    accepted = values["thinking_levels"]
    if not isinstance(accepted, list | tuple) or any(str(a).lower() not in THINKING_LEVELS for a in accepted):
        raise ConfigError(f"{where}: thinking_levels must be a list of {', '.join(THINKING_LEVELS)}, "
                          f"got {accepted!r}")
    accepted = tuple(str(a).lower() for a in accepted)
    level, budget = values["thinking_level"], values["thinking_budget"]
    if level is not None:
        level = str(level).lower()
        if level not in (accepted or THINKING_LEVELS):
            allowed = ", ".join(accepted or THINKING_LEVELS)
            raise ConfigError(f"{where}: thinking_level must be one of {allowed}"
                              f"{' (the levels ' + model + ' accepts)' if accepted else ''}, "
                              f"got {values['thinking_level']!r}")
    stage = values["stage"]
    if stage is not None and str(stage).lower() not in MODEL_STAGES:
        raise ConfigError(f"{where}: stage must be one of {', '.join(MODEL_STAGES)}, got {stage!r}")
    free_tier = values["free_tier"]
    if free_tier is not None and not isinstance(free_tier, bool):
        raise ConfigError(f"{where}: free_tier must be true or false, got {free_tier!r}")
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < -1:
            raise ConfigError(f"{where}: thinking_budget must be a number of tokens (-1: dynamic, "
                              f"0: off), got {budget!r}")
        if budget == 0 and "2.5-pro" in model:
            raise ConfigError(f"{where}: {model} always thinks: thinking_budget 0 is refused "
                              f"(use 128 or more, or -1)")
    if level is not None and budget is not None:
        raise ConfigError(f"{where}: give thinking_level (Gemini 3) or thinking_budget (2.5), not both")
    temperature = values["temperature"]
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(
            temperature, int | float) or not 0 <= temperature <= 2):
        raise ConfigError(f"{where}: temperature must be a number from 0 to 2 (or null for the "
                          f"vendor's default), got {temperature!r}")
    numbers: dict[str, float | None] = {}
    for name in ("max_output_tokens", "call_timeout_s", "input_usd_per_mtok", "output_usd_per_mtok",
                 "cached_input_usd_per_mtok"):
        value = values[name]
        optional = name.endswith("_per_mtok")
        if value is None and optional:
            numbers[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value < 0 or (value == 0 and not optional):
            raise ConfigError(f"{where}: {name} must be a positive number, got {value!r}")
        numbers[name] = value
    return ModelSettings(thinking_level=level, thinking_budget=budget,
                         temperature=None if temperature is None else float(temperature),
                         max_output_tokens=int(numbers["max_output_tokens"] or 0),
                         call_timeout_s=float(numbers["call_timeout_s"] or 0),
                         input_usd_per_mtok=numbers["input_usd_per_mtok"],
                         output_usd_per_mtok=numbers["output_usd_per_mtok"],
                         cached_input_usd_per_mtok=numbers["cached_input_usd_per_mtok"],
                         prices_from=_iso_date(values["prices_from"], where, "prices_from"),
                         price_changes=tuple(values["price_changes"]), thinking_levels=accepted,
                         stage=None if stage is None else str(stage).lower(),
                         shutdown=_iso_date(values["shutdown"], where, "shutdown"), free_tier=free_tier)


def _gemini_settings(raw: Any, env: Mapping[str, str], source: str) -> GeminiSettings:
    """`gemini:` of the settings file, then AFS_GEMINI_MODEL_<AGENT> over its models."""
    raw = raw if raw is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: gemini must be a mapping (models, model_settings)")
    keys = ("models", "model_settings", "max_spend_usd", "send_values", "stream", "budget")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ConfigError(f"{source}: gemini: unknown key {', '.join(unknown)} (known: {', '.join(keys)})")
    spend: float | None = None
    value, where = (raw.get("max_spend_usd"), f"{source}: gemini.max_spend_usd")
    if env.get("AFS_GEMINI_MAX_SPEND_USD"):
        value, where = env["AFS_GEMINI_MAX_SPEND_USD"], "AFS_GEMINI_MAX_SPEND_USD"
    if value is not None:
        try:
            spend = float(value)
        except (TypeError, ValueError):
            spend = -1.0
        if isinstance(value, bool) or not math.isfinite(spend) or spend < 0:
            raise ConfigError(f"{where} must be a number of US dollars (0 or more), got {value!r}")
    switches = {"send_values": True, "stream": False}
    for key in switches:
        value, where = (raw.get(key), f"{source}: gemini.{key}")
        if env.get(f"AFS_GEMINI_{key.upper()}"):
            value, where = env[f"AFS_GEMINI_{key.upper()}"], f"AFS_GEMINI_{key.upper()}"
        if value is not None:
            if str(value).lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ConfigError(f"{where} must be true or false, got {value!r}")
            switches[key] = str(value).lower() in ("1", "true", "yes", "on")
    models = dict(DEFAULT_GEMINI_MODELS)
    file_models = raw.get("models") or {}
    if not isinstance(file_models, dict):
        raise ConfigError(f"{source}: gemini.models must map agents to model names")
    for agent, model in file_models.items():
        if agent not in DEFAULT_GEMINI_MODELS:
            raise ConfigError(f"{source}: gemini.models: unknown agent {agent!r} "
                              f"(agents: {', '.join(DEFAULT_GEMINI_MODELS)})")
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"{source}: gemini.models.{agent} must be a model name, got {model!r}")
        models[agent] = model.strip()
    for agent in DEFAULT_GEMINI_MODELS:
        from_env = env.get(ENV_GEMINI_MODEL_PREFIX + agent.upper(), "").strip()
        if from_env:
            models[agent] = from_env
    table = dict(MODEL_SETTINGS)
    file_table = raw.get("model_settings") or {}
    if not isinstance(file_table, dict):
        raise ConfigError(f"{source}: gemini.model_settings must map model names to settings")
    defaults = GeminiSettings(models={}, model_settings=table)
    for model, entry in file_table.items():
        table[str(model)] = _model_settings(str(model), entry, defaults.settings_of(str(model)), source)
    return GeminiSettings(models=models, model_settings=table, max_spend_usd=spend,
                          send_values=switches["send_values"], stream=switches["stream"],
                          budget=_model_budget(raw.get("budget"), env, source))


def _model_budget(raw: Any, env: Mapping[str, str], source: str) -> ModelBudget:
    """`gemini.budget` of the settings file (turns, tokens, seconds), then
    AFS_GEMINI_BUDGET_TURNS / _TOKENS / _SECONDS over it."""
    raw = raw if raw is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: gemini.budget must be a mapping (turns, tokens, seconds)")
    names = tuple(f.name for f in fields(ModelBudget))
    unknown = sorted(str(k) for k in set(raw) - set(names))
    if unknown:
        raise ConfigError(f"{source}: gemini.budget: unknown key {', '.join(unknown)} "
                          f"(known: {', '.join(names)})")
    values: dict[str, Any] = {}
    for name in names:
        value, where = raw.get(name), f"{source}: gemini.budget.{name}"
        variable = f"AFS_GEMINI_BUDGET_{name.upper()}"
        if env.get(variable):
            value, where = env[variable], variable
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = -1.0
        if isinstance(value, bool) or not math.isfinite(number) or number <= 0 or (
                name != "seconds" and number != int(number)):
            what = "a number of seconds" if name == "seconds" else f"a whole number of {name}"
            raise ConfigError(f"{where} must be {what}, more than 0, got {value!r}")
        values[name] = number if name == "seconds" else int(number)
    return ModelBudget(**values)
