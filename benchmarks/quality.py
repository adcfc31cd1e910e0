"""How good are AFS's answers? Public advisor cases against their known-good fix.

For every case of `quality_cases.py` (a public advisor's test or doc example
with its oracle: the DDL, rewrite or setting known to fix it), in one run:

  1. build the case database `afs_qc_<name>` in the sandbox (schema, data with
     generate_series, VACUUM ANALYZE), with the planner settings of a user's server
     (USER_SETTINGS, not the sandbox's defaults), and register it as a fork source, as
     `afs sandbox import` does for an imported database;
  2. run AFS on the query: `optimize()` with the offline strategists and the
     routed squad (what `afs optimize --provider heuristic` runs), and take its
     winner, if any;
  3. in ONE fork of the case database, measure the same way for all: the baseline,
     AFS's winner (its DDL and its rewrite) and the oracle (its DDL, rewrite and
     SET LOCAL settings). Everything is applied once; each run hides what belongs
     to the other configurations inside a transaction that is rolled back
     (`BEGIN; DROP INDEX …; SET LOCAL …; EXPLAIN ANALYZE …; ROLLBACK`), so the
     runs interleave (baseline, AFS, oracle, rotating, every other round reversed)
     and drift hits all alike: one warm-up each, then --runs rounds, the median of
     server-side execution time (AFS and the oracle get as many rounds again when they
     come out within 1.5× of each other: the verdict is about 10 %). Each
     configuration's rows are checked against the original query's
     (count and order-independent checksum). A winner whose changes cannot be
     hidden that way (it creates tables: partitioning) is measured in a fork of
     its own, before and after;
  4. the peer column: postgres-mcp's index tuning (benchmarks/peer.py) asked about the
     same case, loaded into a private cluster of Debian's PostgreSQL with HypoPG (set
     up by benchmarks/peer_setup.sh: apt-get as root, postgres-mcp in a venv of its
     own); its advised indexes are applied in the same fork and measured with the
     others. Where it cannot run: "cannot run: <reason>" (--no-peer skips it).

Verdicts per case:

    reach          AFS's time within 10 % of the oracle's (0.3 ms when the oracle is
                   under 1 ms), or better, or AFS's winner is the oracle's very fix (the
                   same objects by definition, names aside; the same query as PostgreSQL
                   parses it; the same settings: "= oracle" in the table, their times
                   differ by noise only), with a winner that is neither a regression
                   nor an answer cache (those never count, however fast); no winner
                   means AFS's time is the baseline's
    regression     the winner is significantly slower than the baseline (complete
                   separation and ≥ 5 % between medians, afs.bench.significant) or
                   returns other rows
    answer cache   the winner creates a view whose predicates contain a literal of the
                   query's WHERE/HAVING, or its rewrite reads a view it created without
                   applying those literals (sqlglot, generic)

The table's AFS/oracle is the measured ratio; median_ratio_to_oracle takes the baseline's
time for a winner that is a regression or an answer cache (what AFS may honestly offer).
Under a winner's row, the step chain of its agent's loop (CandidateResult.chain): each step's
design, its measured time, and the plan node that motivated it.

Two more figures: `median_task_s`, the median wall time of AFS's routed task per case; and
`distinct_designs_ratio`, three agents against one: per case, the squad of three (the routed
run when the router sent all three, else a second task with the fixed squad) and one agent
alone, the one the router sends alone to a simple query (gemini25flash: the routed run when
the router sent it alone, else a third task), and the distinct designs their agents measured
(AgentOutcome.candidates with status "measured", one design however many agents measured it:
its statements without the index's name, its rewrite as parsed, its settings) are summed
over the cases; the ratio is three's sum over one's (`--no-designs` skips those tasks).

    AFS_HOME=... python benchmarks/quality.py [--case NAME ...] [--quick] [--scale F]
                 [--runs N] [--afs-runs N] [--no-afs] [--no-peer] [--no-designs] [--json]

It uses the configured AFS_HOME, starts the sandbox if needed (and stops it only if
it started it). Progress goes to stderr. `--json` prints {"cases", "reach_share",
"regressions", "answer_caches", "median_ratio_to_oracle", "distinct_designs_ratio",
"median_task_s", "peer", "details"} as the last line of stdout. Case databases (and their
templates) are dropped at the end of each case, also on failure and Ctrl-C; forks are destroyed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import harness
import pglast
import sqlglot
import trio
from harness import with_sandbox
from peer import Advice, Peer, peer_session
from pglast.stream import RawStream
from quality_cases import CASES, Case, render, scaled
from sqlglot import exp

# -- AFS internals used here: kept in this one block (they are being reorganised) ---------
from afs.bench import Sample, run_once, significant, timing
from afs.brains import Squad, StrategistBrain
from afs.config import Settings
from afs.consensus import score
from afs.db import Connection, open_connection
from afs.errors import AfsError, StatementTimeout
from afs.events import Emitter, Event, log_sink
from afs.forks.client import ForkClient
from afs.forks.naming import random_fork_name
from afs.forks.provider import LocalForkProvider, quote_ident
from afs.models import AGENTS, AgentOutcome, OptimizationProposal, TaskResult
from afs.optimize import Crew, TaskRequest, new_task_id, optimize
from afs.pg.settings import alter_database_sql
from afs.router import load_rules
from afs.sandbox.forks import open_forks
from afs.sandbox.server import SandboxServer
from afs.suite import result_checksum_sql

# ------------------------------------------------------------------------------------------
DB_PREFIX = "afs_qc_"
# The user's server is not the sandbox: each case database gets these planner settings of a
# tuned server on SSDs (not the defaults the sandbox runs with), and every fork of it plans with
# them, AFS's and the measuring one (afs.conditions, afs.forks.provider)
USER_SETTINGS = {"work_mem": "16MB", "random_page_cost": "1.1", "effective_cache_size": "8GB"}
DEFAULT_RUNS = 7
QUICK_SCALE = 0.05
REACH_SHARE = 0.10  # within 10 % of the oracle
REACH_ABS_MS = 0.3  # … or within 0.3 ms when the oracle is under 1 ms
BUILD_TIMEOUT_MS = 1_800_000
MEASURE_TIMEOUT_MS = 60_000
FORK_TTL_S = 3600
CLEANUP_TIMEOUT_S = 120
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def progress(message: str) -> None:
    print(f"[quality] {message}", file=sys.stderr, flush=True)


# -- the server ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerFacts:
    values: Mapping[str, str]  # placeholders the cases may use
    collation_note: str


async def non_c_collation(conn: Connection) -> str | None:
    """A usable collation the planner does not treat as C (only libc C and POSIX are), if any.

    Preference: an en_US locale, then ICU, then any other libc locale (glibc's C.UTF-8 too).
    """
    candidates = [str(r[0]) for r in await conn.fetchall(
        "SELECT collname FROM pg_collation"
        " WHERE (collprovider = 'c' AND collcollate NOT IN ('C', 'POSIX')) OR collprovider = 'i'"
        " ORDER BY collname NOT LIKE 'en\\_US%', collprovider <> 'i', collname")]
    for name in candidates:
        try:
            await conn.fetchval(f"SELECT 'a' COLLATE {quote_ident(name)} < 'B'")
            return name
        except AfsError:
            continue
    return None


async def server_facts(admin_dsn: str) -> ServerFacts:
    async with open_connection(admin_dsn) as conn:
        collation = await non_c_collation(conn)
    if collation is not None:
        values = {"collate_clause": f"COLLATE {quote_ident(collation)}",
                  "pattern_opclass": "text_pattern_ops"}
        note = f"column collation {collation}"
    else:
        values = {"collate_clause": "", "pattern_opclass": ""}
        note = ("no non-C collation on this server: the column uses C, where a plain btree"
                " serves LIKE 'x%'")
    return ServerFacts(values=values, collation_note=note)


# -- the case database ------------------------------------------------------------------------
def database_name(case: Case) -> str:
    return DB_PREFIX + case.name


async def build_database(server: SandboxServer, provider: LocalForkProvider, case: Case,
                         values: Mapping[str, object]) -> float:
    """Create and fill the case database, then make it forkable; returns seconds."""
    started = time.monotonic()
    db = database_name(case)
    await provider.drop_source(db)  # a leftover of an interrupted run
    async with open_connection(server.dsn(), BUILD_TIMEOUT_MS) as conn:
        await conn.execute(f"CREATE DATABASE {quote_ident(db)}")
        for name, value in USER_SETTINGS.items():
            await conn.execute(alter_database_sql(db, name, value))
    async with open_connection(server.dsn(db), BUILD_TIMEOUT_MS) as conn:
        # commits flushed at once: VACUUM marks pages all-visible only once the inserting
        # transaction's commit is on disk (index-only scans need that)
        await conn.execute("SET synchronous_commit = on")
        for statement in (*case.schema, *case.data):
            await conn.execute(render(statement, values))
    await provider.register_source(db, origin=f"quality:{case.name}")
    return time.monotonic() - started


class Build:
    """One case database being built (`build_database`), possibly while the case before it runs
    its designs' tasks; `wait` gives its seconds or raises what failed it."""

    def __init__(self, case: Case) -> None:
        self.case, self.done = case, trio.Event()
        self.seconds = 0.0
        self.error: AfsError | None = None

    async def run(self, server: SandboxServer, provider: LocalForkProvider,
                  values: Mapping[str, object]) -> None:
        sizes = ", ".join(f"{k}={v}" for k, v in values.items() if k in self.case.sizes)
        progress(f"{self.case.name}: building {database_name(self.case)} ({sizes})")
        try:
            self.seconds = await build_database(server, provider, self.case, values)
        except AfsError as exc:
            self.error = exc
        finally:
            self.done.set()

    async def wait(self) -> float:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.seconds


async def drop_database(provider: LocalForkProvider, case: Case) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
        try:
            await provider.drop_source(database_name(case))
        except AfsError as exc:
            progress(f"could not drop {database_name(case)}: {exc}")


# -- AFS ----------------------------------------------------------------------------------------
@dataclass
class AfsRun:
    status: str = "not run"
    agents: tuple[str, ...] = ()
    winner: str | None = None
    proposal: OptimizationProposal | None = None
    seconds: float = 0.0
    error: str | None = None
    outcomes: tuple[AgentOutcome, ...] = ()
    chain: tuple[Any, ...] = ()  # the winner's loop steps (CandidateResult.chain), if any


ALL_AGENTS: tuple[str, ...] = tuple(AGENTS)  # the squad of three
# one agent alone: the one the router sends alone to a simple query (routing_rules.yaml,
# low_complexity and simple_aggregation)
ONE_AGENT: tuple[str, ...] = ("gemini25flash",)


def case_settings(settings: Settings, case: Case) -> Settings:
    """The settings of AFS's task on `case`: a slow-baseline case's own statement timeout, and the
    slow-baseline cap at the same (the query is beyond both, as on the user's server)."""
    if case.statement_timeout_ms is None:
        return settings
    return settings.with_(statement_timeout_ms=case.statement_timeout_ms,
                          slow_baseline_cap_s=case.statement_timeout_ms / 1000)


async def run_afs(settings: Settings, server: SandboxServer, client: ForkClient,
                  provider: LocalForkProvider, db: str, query: str, runs: int,
                  agents: tuple[str, ...] | None = None) -> AfsRun:
    """One `optimize()` task with the offline strategists: the routed squad, or `agents`."""
    brain = StrategistBrain()
    squad = Squad(brain_for=lambda _agent: brain, provider="heuristic",
                  note="offline strategists (quality corpus)", agents=agents)
    rules = load_rules(settings.routing_rules)

    def sink(event: Event) -> None:
        if event.kind == "agents_assigned":
            progress(f"  afs: agents {', '.join(event.data.get('agents', []))}")
        elif event.kind == "proposal_submitted" and event.data.get("proposal_type"):
            progress(f"  afs: {event.agent} proposes {event.data['proposal_type']}")
        elif event.kind == "agent_failed":
            progress(f"  afs: {event.agent} failed: {event.data.get('error')}")

    emitter = Emitter(new_task_id(), sinks=(log_sink, sink))
    started = time.monotonic()
    run = AfsRun()
    try:
        result: TaskResult = await optimize(
            settings, TaskRequest(query=query, runs=runs), source=db, source_dsn=server.dsn(db),
            crew=Crew(forks=client, squad=squad, rules=rules), events=emitter)
    except AfsError as exc:
        run.status, run.error = "failed", str(exc)
        return run
    finally:
        run.seconds = time.monotonic() - started
        await remove_leftover_forks(provider, emitter.task_id)
    run.status, run.error = result.status, result.error
    run.agents = tuple(o.agent for o in result.outcomes)
    run.outcomes = tuple(result.outcomes)
    for outcome in result.outcomes:
        for line in candidate_lines(outcome):
            progress(f"  afs: {outcome.agent} {line}")
    run.winner = result.decision.winner if result.decision is not None else None
    for outcome in result.outcomes:
        if outcome.agent == run.winner:
            run.proposal = outcome.proposal
            run.chain = winner_chain(outcome)
    return run


def winner_chain(outcome: AgentOutcome) -> tuple[Any, ...]:
    """The loop steps behind the outcome's proposal (CandidateResult.chain), () without a loop."""
    for candidate in outcome.candidates:
        if candidate.proposal == outcome.proposal:
            return tuple(getattr(candidate, "chain", ()) or ())
    return ()


def chain_lines(chain: Sequence[Any]) -> list[str]:
    """The report's step chain: step, the plan node that motivated it, the design, its time."""
    lines = []
    for step in chain:
        ms = getattr(step, "median_ms", None)
        why = getattr(step, "motivated_by", None)
        kept = getattr(step, "kept", True)
        note = getattr(step, "note", "")
        lines.append(f"step {getattr(step, 'step', '?')}: {winner_short(step.proposal)[:70]}"
                     f" -> {_fmt(ms) if ms is not None else '-'} ms"
                     + (f" (after: {why[:70]})" if why else "")
                     + ("" if kept else " not kept") + (f"; {note[:60]}" if note else ""))
    return lines


_INDEX_NAME = re.compile(r"^(CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?)(?:IF\s+NOT\s+EXISTS\s+)?"
                         r"(?!ON\s)\S+\s+(ON\s)", re.IGNORECASE)


def design_key(proposal: OptimizationProposal) -> tuple[tuple[str, ...], str, tuple[tuple[str, str], ...]]:
    """A design by what it does: its statements (an index's name aside, spacing and case
    folded), its rewrite as PostgreSQL parses it, its settings."""
    def statement(sql: str) -> str:
        text = " ".join(sql.split())
        return _INDEX_NAME.sub(r"\1\2", text).lower()

    rewrite = normalized_sql(proposal.rewritten_query) if proposal.rewritten_query else ""
    return (tuple(sorted(statement(c) for c in proposal.sql_commands)), rewrite,
            tuple(sorted((k.lower(), v.strip("'").lower()) for k, v in proposal.settings)))


def distinct_designs(run: AfsRun) -> int:
    """The distinct designs the run's agents measured (status "measured"), shared ones once."""
    return len({design_key(c.proposal) for o in run.outcomes for c in o.candidates
                if c.status == "measured"})


def candidate_lines(outcome: AgentOutcome) -> list[str]:
    """One line per candidate the agent tried: what it was, the planner's verdict, the measurement."""
    lines = []
    for c in outcome.candidates:
        what = winner_short(c.proposal)[:90]
        cost = ("" if c.planner_cost is None
                else f" cost {c.planner_cost:,.0f}/{c.baseline_cost or 0:,.0f}")
        measured = ""
        if c.benchmark is not None:
            suite = ", ".join(f"{m.name} {m.baseline.median_ms:.2f}->{m.optimized.median_ms:.2f}"
                              + ("" if m.significant else "~") for m in c.benchmark.measurements)
            family = ", ".join(
                f"{p.label[:30]} {'slower' if p.slower else 'ok'}{'' if p.equivalent else ' DIFFERS'}"
                + (f" ({p.note[:60]})" if p.note else "")
                for p in c.benchmark.parameter_checks)
            measured = f" [{suite}]" + (f" family [{family}]" if family else "")
        if c.benchmark is not None:
            trial = AgentOutcome(agent=outcome.agent, status="ok", proposal=c.proposal,
                                 validation=c.validation, benchmark=c.benchmark,
                                 writes_per_read=outcome.writes_per_read)
            breakdown = score(trial)
            if breakdown is not None:
                why = "; ".join(breakdown.disqualified)[:120]
                measured += f" score {breakdown.total:.1f}" + (f" CANNOT WIN: {why}" if why else "")
        note = f" ({c.note[:100]})" if c.note else ""
        lines.append(f"#{c.rank} {c.status}: {what}{cost}{measured}{note}")
    if outcome.error:
        lines.append(f"-> {outcome.status}: {outcome.error[:160]}")
    return lines


async def remove_leftover_forks(provider: LocalForkProvider, task_id: str) -> None:
    """The agents destroy their forks through MCP; destroy any of this task still there directly
    (on Ctrl-C the MCP session may be gone before their cleanup ran)."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
        try:
            for fork in (await provider.list_services())["forks"]:
                if f"-task{task_id}-" in fork["name"]:
                    progress(f"fork {fork['name']} was left behind; destroying it")
                    await provider.delete(fork["name"])
        except AfsError as exc:
            progress(f"could not check for leftover forks: {exc}")


@asynccontextmanager
async def measuring_fork(client: ForkClient, provider: LocalForkProvider, db: str,
                         label: str) -> AsyncIterator[Connection]:
    """A fork of `db` and a connection to it; the fork is destroyed on exit, directly if MCP is gone."""
    name = random_fork_name(label)
    try:
        async with client.open_fork(db, name=name, ttl_seconds=FORK_TTL_S) as fork, \
                open_connection(fork.dsn, MEASURE_TIMEOUT_MS) as conn:
            yield conn
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
            try:
                if (await provider.delete(name))["deleted"]:
                    progress(f"fork {name} was left behind by the MCP session; destroyed it directly")
            except AfsError as exc:
                progress(f"could not destroy fork {name}: {exc}")


# -- measuring in one fork -------------------------------------------------------------------
@dataclass
class Config:
    """One way to run the query: its changes, its query, its settings, and what was measured."""

    label: str
    ddl: tuple[str, ...]
    query: str
    settings: Mapping[str, str] = field(default_factory=dict)
    created: list[tuple[str, str]] = field(default_factory=list)  # (kind, qualified name)
    samples: list[Sample] = field(default_factory=list)
    rows: int | None = None
    checksum: str | None = None
    error: str | None = None
    note: str = ""
    own_fork: bool = False  # its changes cannot be hidden: measured in a fork of its own
    definitions: list[str] = field(default_factory=list)  # what it created, without object names
    per_run: tuple[str, ...] = ()  # statements run inside each run's transaction (statistics)

    def __post_init__(self) -> None:
        self.ddl, per_run = split_statistics(self.ddl)
        self.per_run = self.per_run or per_run

    @property
    def median_ms(self) -> float | None:
        return timing(self.samples).median_ms if self.samples else None


_SET_STATISTICS = re.compile(r"\bSET\s+STATISTICS\b", re.IGNORECASE)
_ANALYZE = re.compile(r"^\s*ANALYZE\b", re.IGNORECASE)


def split_statistics(ddl: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the DDL applied once, the statements run inside each run's transaction). A change of a
    column's statistics target and the ANALYZE that rebuilds the statistics with it change what
    every configuration in the fork plans with, and they cannot be hidden by dropping an object:
    they run inside each of this configuration's runs instead, and roll back with it (ANALYZE runs
    in a transaction block; its new statistics are rolled back too)."""
    if not any(_SET_STATISTICS.search(s) for s in ddl):
        return tuple(ddl), ()
    per_run = tuple(s for s in ddl if _SET_STATISTICS.search(s) or _ANALYZE.match(s))
    return tuple(s for s in ddl if s not in per_run), per_run


_OBJECTS = """
SELECT CASE c.relkind WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'm' THEN 'materialized view'
                      WHEN 'v' THEN 'view' ELSE 'table' END,
       format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('i', 'I', 'm', 'v', 'r', 'p', 'f')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
UNION ALL
SELECT 'statistics', format('%I.%I', n.nspname, s.stxname)
FROM pg_statistic_ext s JOIN pg_namespace n ON n.oid = s.stxnamespace
UNION ALL
SELECT 'extension', quote_ident(extname) FROM pg_extension
"""
_HIDE_ORDER = ("extension", "materialized view", "view", "statistics", "index")


async def objects(conn: Connection) -> set[tuple[str, str]]:
    return {(str(k), str(n)) for k, n in await conn.fetchall(_OBJECTS)}


def hide_statements(created: Sequence[tuple[str, str]]) -> list[str]:
    """DROP statements for objects, run inside a transaction that is rolled back."""
    statements = []
    for kind in _HIDE_ORDER:
        for k, name in created:
            if k != kind:
                continue
            if kind == "index":
                statements.append(f"DROP INDEX IF EXISTS {name}")
            elif kind == "statistics":
                statements.append(f"DROP STATISTICS IF EXISTS {name}")
            else:
                statements.append(f"DROP {kind.upper()} IF EXISTS {name} CASCADE")
    return statements


async def apply(conn: Connection, config: Config) -> None:
    """Apply the configuration's DDL (committed); record what it created."""
    before = await objects(conn)
    for statement in config.ddl:
        try:
            await conn.execute(statement)
        except AfsError as exc:
            config.error = f"applying failed: {str(exc).splitlines()[0][:200]}"
            break
    after = await objects(conn)
    config.created = sorted(after - before)
    if any(kind == "table" for kind, _ in config.created) or before - after:
        config.own_fork = True  # partitioning or a swap: cannot be hidden in a transaction
    config.definitions = sorted([d for kind, name in config.created
                                 if (d := await definition(conn, kind, name)) is not None])


_UNNAMED = r"^(CREATE (?:UNIQUE )?(?:INDEX|STATISTICS) )\S+ "


async def definition(conn: Connection, kind: str, name: str) -> str | None:
    """An object's definition without its name (two configurations creating the same index under
    other names create the same thing); None for an extension (the case may have it already)."""
    if kind == "index":
        sql = "SELECT regexp_replace(pg_get_indexdef(to_regclass(%s)), %s, '\\1')"
    elif kind == "statistics":
        sql = ("SELECT regexp_replace(pg_get_statisticsobjdef(s.oid), %s, '\\1') FROM pg_statistic_ext s"
               " JOIN pg_namespace n ON n.oid = s.stxnamespace"
               " WHERE format('%%I.%%I', n.nspname, s.stxname) = %s")
        return str(await conn.fetchval(sql, (_UNNAMED, name)))
    elif kind == "extension":
        return None
    else:
        return f"{kind} {name}"  # a view or a table: never the same as another configuration's
    return str(await conn.fetchval(sql, (name, _UNNAMED)))


def normalized_sql(sql: str) -> str:
    """The query as PostgreSQL's parser reads it, printed back (aliases, spacing, AS normalised)."""
    try:
        return str(RawStream()(pglast.parse_sql(sql)))
    except pglast.parser.ParseError:
        return " ".join(sql.split())


def same_fix(a: Config, b: Config) -> bool:
    """Whether two configurations are one fix: the same objects (by definition), the same query,
    the same settings. Their times then differ by noise only."""
    def settings(c: Config) -> dict[str, str]:
        return {k.lower(): v.strip("'").lower() for k, v in c.settings.items()}

    def per_run(c: Config) -> list[str]:
        return sorted(normalized_sql(s) for s in c.per_run)

    return (a.error is None and b.error is None and a.definitions == b.definitions
            and per_run(a) == per_run(b)
            and normalized_sql(a.query) == normalized_sql(b.query) and settings(a) == settings(b))


async def in_transaction(conn: Connection, hide: Sequence[str], settings: Mapping[str, str],
                         sql: str, fetch: bool, per_run: Sequence[str] = ()) -> Any:
    await conn.execute("BEGIN")
    try:
        for statement in (*hide, *per_run):
            await conn.execute(statement)
        for name, value in settings.items():
            await conn.execute(f"SET LOCAL {name} = {value}")
        if fetch:
            return await conn.fetchone(sql)
        return await run_once(conn, sql)
    finally:
        with trio.CancelScope(shield=True):
            await conn.execute("ROLLBACK")


async def check_rows(conn: Connection, config: Config, hide: Sequence[str]) -> None:
    row = await in_transaction(conn, hide, config.settings, result_checksum_sql(config.query, False), True,
                               config.per_run)
    assert row is not None
    config.rows, config.checksum = int(row[0]), str(row[1])


async def measure_configs(conn: Connection, configs: Sequence[Config], runs: int) -> None:
    """Warm-up, then `runs` rounds (`rounds`); each run hides the others' objects. When AFS and
    the oracle come out close (`CLOSE_RATIO`), as many rounds again of the two: the verdict is
    about 10 %, and on a loaded machine seven runs a side do not resolve that."""
    everything = [o for c in configs for o in c.created]

    def hide_for(config: Config) -> list[str]:
        return hide_statements([o for o in everything if o not in config.created])

    live = [c for c in configs if c.error is None]
    for config in live:
        try:
            await check_rows(conn, config, hide_for(config))
        except AfsError as exc:
            config.error = f"checking its rows failed: {str(exc).splitlines()[0][:200]}"
    live = [c for c in live if c.error is None]
    for config in live:  # warm-up
        await _sample(conn, config, hide_for(config), keep=False)
    for config in rounds(live, runs):
        if config.error is None:
            await _sample(conn, config, hide_for(config), keep=True)
    close = [c for c in live if c.label in ("afs", "oracle") and c.error is None and c.samples]
    if len(close) == 2 and close_call(close[0].median_ms, close[1].median_ms):
        for config in rounds(close, runs):
            if config.error is None:
                await _sample(conn, config, hide_for(config), keep=True)


CLOSE_RATIO = 1.5  # AFS and the oracle within this factor of each other: measure them more


def close_call(a: float | None, b: float | None) -> bool:
    """Whether two medians are near enough that the reach verdict needs more runs."""
    if a is None or b is None or a <= 0 or b <= 0:
        return False
    return max(a, b) / min(a, b) <= CLOSE_RATIO and max(a, b) - min(a, b) > REACH_ABS_MS


def rounds(configs: Sequence[Config], runs: int) -> list[Config]:
    """`runs` rounds of every configuration, rotating, every other round in reverse: each one
    is preceded by each other about equally often (a slow scan just before a fast query leaves
    it cold caches; a fixed order would hand that to the same configuration every round)."""
    order: list[Config] = []
    for round_no in range(runs):
        shift = (round_no // 2) % len(configs) if configs else 0
        turn = list(configs[shift:]) + list(configs[:shift])
        order.extend(reversed(turn) if round_no % 2 else turn)
    return order


async def _sample(conn: Connection, config: Config, hide: Sequence[str], keep: bool) -> None:
    try:
        sample = await in_transaction(conn, hide, config.settings, config.query, False, config.per_run)
    except StatementTimeout:
        config.error = f"timed out (over {MEASURE_TIMEOUT_MS / 1000:g} s)"
        return
    except AfsError as exc:
        config.error = f"failed: {str(exc).splitlines()[0][:200]}"
        return
    if keep:
        config.samples.append(sample)


async def oracle_query(conn: Connection, case: Case, values: Mapping[str, object]) -> str:
    query = render(case.oracle_query or case.query, values)
    if case.oracle_params is None:
        return query
    row = await conn.fetchone(render(case.oracle_params, values))
    assert row is not None, "the oracle's parameter query returned no row"
    return render(query, {f"p{i}": v for i, v in enumerate(row)})


async def measure_case(client: ForkClient, provider: LocalForkProvider, db: str, case: Case,
                       values: Mapping[str, object], afs: AfsRun, runs: int,
                       peer: Advice | None = None) -> dict[str, Config]:
    """Baseline, AFS's winner, the oracle and the peer's advice, applied in one fork and measured
    interleaved."""
    query = render(case.query, values)
    async with measuring_fork(client, provider, db, "quality") as conn:
        baseline = Config("baseline", (), query)
        configs = {"baseline": baseline}
        if afs.proposal is not None:
            configs["afs"] = Config("afs", tuple(afs.proposal.sql_commands),
                                    afs.proposal.rewritten_query or query,
                                    {name: "'" + value.replace("'", "''") + "'"
                                     for name, value in afs.proposal.settings})
        if case.oracle_ddl or case.oracle_query or case.oracle_settings:
            configs["oracle"] = Config("oracle", tuple(render(s, values) for s in case.oracle_ddl),
                                       await oracle_query(conn, case, values),
                                       dict(case.oracle_settings))
        if peer is not None and peer.ddl:
            configs["peer"] = Config("peer", peer.ddl, query)
        for config in configs.values():
            if config.label != "baseline":
                await apply(conn, config)
        shared = [c for c in configs.values() if not c.own_fork]
        await measure_configs(conn, shared, runs)
    for config in configs.values():
        if config.own_fork:
            await measure_in_own_fork(client, provider, db, config, runs)
    return configs


async def measure_in_own_fork(client: ForkClient, provider: LocalForkProvider, db: str,
                              config: Config, runs: int) -> None:
    """A configuration whose changes cannot be hidden: after the change, in a fork of its own."""
    async with measuring_fork(client, provider, db, "qualityown") as conn:
        fresh = Config(config.label, config.ddl, config.query, config.settings, per_run=config.per_run)
        await apply(conn, fresh)
        fresh.created = []  # nothing to hide: it is alone in this fork
        await measure_configs(conn, [fresh], runs)
        config.samples, config.rows, config.checksum = fresh.samples, fresh.rows, fresh.checksum
        config.error = config.error or fresh.error
        config.note = "measured in a fork of its own after the change (its changes cannot be hidden)"


# -- verdicts -------------------------------------------------------------------------------------
def _literal(node: exp.Literal) -> str:
    text = str(node.this)
    if node.is_string:
        return text
    try:
        return str(Decimal(text).normalize())
    except InvalidOperation:
        return text


def predicate_literals(tree: exp.Expr) -> set[str]:
    """Literals of the WHERE, HAVING and JOIN … ON conditions anywhere in `tree`."""
    found: set[str] = set()
    conditions: list[exp.Expr] = list(tree.find_all(exp.Where, exp.Having))
    conditions += [j.args["on"] for j in tree.find_all(exp.Join) if j.args.get("on") is not None]
    for condition in conditions:
        found |= {_literal(lit) for lit in condition.find_all(exp.Literal)}
    return found


def _parse(sql: str) -> exp.Expr | None:
    try:
        return sqlglot.parse_one(sql, read="postgres")
    except sqlglot.errors.SqlglotError:
        return None


def literal_bound(query: str, proposal: OptimizationProposal | None) -> str | None:
    """Which literals of the query's conditions a partial index of the proposal repeats in its
    predicate, or None. Not a verdict (a rare status value is a fine predicate, a customer id
    is not): shown beside the winner, as AFS's own check with other values decides it."""
    tree = _parse(query) if proposal is not None else None
    if tree is None or proposal is None:
        return None
    literals = predicate_literals(tree)
    for command in proposal.sql_commands:
        create = _parse(command)
        if not isinstance(create, exp.Create) or str(create.args.get("kind", "")).upper() != "INDEX":
            continue
        where = create.find(exp.Where)
        repeated = literals & {_literal(lit) for lit in where.find_all(exp.Literal)} if where else set()
        if repeated:
            return f"a partial index on the query's literal(s) {', '.join(sorted(repeated))}"
    return None


def answer_cache(query: str, proposal: OptimizationProposal | None) -> str | None:
    """Why the proposal caches today's answer instead of serving the query family, or None."""
    if proposal is None:
        return None
    tree = _parse(query)
    if tree is None:
        return None
    literals = predicate_literals(tree)
    views: set[str] = set()
    for command in proposal.sql_commands:
        create = _parse(command)
        if not isinstance(create, exp.Create) or str(create.args.get("kind", "")).upper() != "VIEW":
            continue
        target = create.this
        table = target.this if isinstance(target, exp.Schema) else target
        name = table.name if isinstance(table, exp.Table) else str(table)
        views.add(name.lower())
        body = create.expression
        baked = literals & predicate_literals(body) if isinstance(body, exp.Expr) else set()
        if baked:
            return f"view {name} bakes in the query's literal(s) {', '.join(sorted(baked))}"
    if views and proposal.rewritten_query:
        rewrite = _parse(proposal.rewritten_query)
        if rewrite is not None:
            read = {t.name.lower() for t in rewrite.find_all(exp.Table)} & views
            missing = literals - predicate_literals(rewrite)
            if read and missing:
                return (f"the rewrite reads {', '.join(sorted(read))} without the query's"
                        f" literal(s) {', '.join(sorted(missing))}")
    return None


_INDEX = re.compile(r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?"
                    r"(?:\S+\s+)?ON\s+(?:ONLY\s+)?(.*)$", re.IGNORECASE | re.DOTALL)
_VIEW = re.compile(r"^\s*CREATE\s+(MATERIALIZED\s+)?VIEW\s+(?:IF\s+NOT\s+EXISTS\s+)?(\S+)", re.IGNORECASE)


def winner_short(proposal: OptimizationProposal | None) -> str:
    if proposal is None:
        return "none"
    parts = []
    for command in proposal.sql_commands:
        text = " ".join(command.split())
        if match := _INDEX.match(text):
            parts.append("idx " + re.sub(r"^(public\.)", "", match.group(1)).replace('"', ""))
        elif match := _VIEW.match(text):
            parts.append(("mv " if match.group(1) else "view ") + match.group(2))
        elif re.match(r"^\s*(ANALYZE|REFRESH)\b", text, re.IGNORECASE):
            continue
        else:
            parts.append(text[:40])
    if proposal.rewritten_query:
        parts.append("rewrite")
    return "; ".join(parts) or proposal.proposal_type


@dataclass
class Verdict:
    case: Case
    query: str  # the case's query as run (placeholders filled)
    afs: AfsRun
    configs: dict[str, Config]
    peer: Advice
    build_s: float
    error: str | None = None
    # distinct measured designs of the squad of three and of one agent (None: not run)
    designs: dict[str, int | None] = field(default_factory=lambda: {"three": None, "one": None})
    # wall seconds of each phase of the case: build, routed, three, one, peer, measure
    phases: dict[str, float] = field(default_factory=dict)

    def ms(self, label: str) -> float | None:
        config = self.configs.get(label)
        if config is None:  # no winner / no oracle: the query as it is
            config = self.configs.get("baseline")
        return None if config is None or config.error else config.median_ms

    def samples(self, label: str) -> list[Sample]:
        config = self.configs.get(label) or self.configs.get("baseline")
        return config.samples if config is not None else []

    @property
    def ratio(self) -> float | None:
        return self._ratio(self.ms("afs"))

    @property
    def peer_ratio(self) -> float | None:
        """The peer's time over the oracle's; None where it could not run (no advice: the baseline)."""
        return self._ratio(self.ms("peer")) if self.peer.ran and not self.peer_error else None

    @property
    def peer_error(self) -> str | None:
        config = self.configs.get("peer")
        if config is None:
            return None
        if config.error:
            return config.error
        return "returns other rows than the query" if self.differs("peer") else None

    @property
    def peer_reach(self) -> bool:
        """The peer's time within 10 % of the oracle's (the same test as AFS's), or its very fix."""
        if not self.peer.ran or self.peer_error:
            return False
        peer, oracle = self.configs.get("peer"), self.configs.get("oracle")
        if peer is not None and oracle is not None and same_fix(peer, oracle):
            return True
        return self._within(self.ms("peer"))

    @property
    def accepted_ratio(self) -> float | None:
        """The ratio with a disqualified winner (regression, answer cache) replaced by no change."""
        if self.regression is not None or self.cache is not None:
            return self._ratio(self.ms("baseline"))
        return self.ratio

    def _ratio(self, afs: float | None) -> float | None:
        oracle = self.ms("oracle")
        if afs is None or oracle is None:
            return None
        return afs / oracle if oracle > 0 else math.inf

    @property
    def reach(self) -> bool:
        return self.fast and self.regression is None and self.cache is None

    @property
    def same_as_oracle(self) -> bool:
        """AFS's winner is the oracle's fix (same objects by definition, same query, same settings)."""
        afs, oracle = self.configs.get("afs"), self.configs.get("oracle")
        return afs is not None and oracle is not None and same_fix(afs, oracle)

    @property
    def fast(self) -> bool:
        """AFS's time alone: within 10 % of the oracle's (0.3 ms under 1 ms), or better; or the
        oracle's very fix (their times then differ by noise only)."""
        if self.same_as_oracle:
            return True
        return self._within(self.ms("afs"))

    def _within(self, ms: float | None) -> bool:
        oracle = self.ms("oracle")
        if ms is None or oracle is None:
            return False
        if oracle < 1.0:
            return ms <= oracle + REACH_ABS_MS
        return ms <= oracle * (1 + REACH_SHARE)

    def differs(self, label: str) -> bool:
        config, baseline = self.configs.get(label), self.configs.get("baseline")
        if config is None or baseline is None or config.rows is None:
            return False
        return (config.rows, config.checksum) != (baseline.rows, baseline.checksum)

    @property
    def regression(self) -> str | None:
        afs = self.configs.get("afs")
        if afs is None:
            return None
        if afs.error:
            return afs.error
        if self.differs("afs"):
            return "returns other rows than the query"
        base = self.samples("baseline")
        if afs.samples and base and significant(base, afs.samples) \
                and statistics.median(s.ms for s in afs.samples) > statistics.median(s.ms for s in base):
            return "significantly slower than the baseline"
        return None

    @property
    def cache(self) -> str | None:
        return answer_cache(self.query, self.afs.proposal)

    @property
    def oracle_faster(self) -> bool | None:
        """Whether the oracle is significantly faster than the baseline as measured here (the
        measuring stick holds at this scale); None without an oracle."""
        oracle, base = self.configs.get("oracle"), self.samples("baseline")
        if oracle is None or not oracle.samples or not base:
            return None
        return (significant(base, oracle.samples)
                and statistics.median(s.ms for s in oracle.samples) < statistics.median(s.ms for s in base))

    def details(self) -> dict[str, Any]:
        def config_data(label: str) -> dict[str, Any] | None:
            c = self.configs.get(label)
            if c is None:
                return None
            t = timing(c.samples) if c.samples else None
            return {"median_ms": t.median_ms if t else None, "spread_ms": t.spread_ms if t else None,
                    "runs": len(c.samples), "buffers": t.buffers if t else None, "rows": c.rows,
                    "same_rows": not self.differs(label), "ddl": [*c.ddl, *c.per_run], "query": c.query,
                    "settings": dict(c.settings), "created": [n for _, n in c.created],
                    "error": c.error, "note": c.note}

        proposal = self.afs.proposal
        return {
            "case": self.case.name, "source": self.case.source, "note": self.case.note,
            "error": self.error, "build_s": round(self.build_s, 1),
            "phases_s": {k: round(v, 1) for k, v in self.phases.items()},
            "baseline_ms": self.ms("baseline"), "afs_ms": self.ms("afs"), "oracle_ms": self.ms("oracle"),
            "ratio_to_oracle": None if self.ratio is None else float(f"{self.ratio:.4g}"),
            "accepted_ratio_to_oracle": (None if self.accepted_ratio is None
                                         else float(f"{self.accepted_ratio:.4g}")),
            "reach": self.reach, "fast_as_oracle": self.fast, "same_fix_as_oracle": self.same_as_oracle,
            "regression": self.regression,
            "answer_cache": self.cache, "oracle_faster": self.oracle_faster,
            "literal_bound": literal_bound(self.query, self.afs.proposal),
            "peer": {"status": self.peer.note, "ddl": list(self.peer.ddl or ()), "ms": (
                         self.ms("peer") if self.peer.ran else None),
                     "ratio_to_oracle": (None if self.peer_ratio is None
                                         else float(f"{self.peer_ratio:.4g}")),
                     "reach": self.peer_reach, "error": self.peer_error},
            "oracle": self.case.oracle_text,
            "afs": {"status": self.afs.status, "agents": list(self.afs.agents), "winner": self.afs.winner,
                    "proposal_type": proposal.proposal_type if proposal else None,
                    "sql": list(proposal.sql_commands) if proposal else [],
                    "rewritten_query": proposal.rewritten_query if proposal else None,
                    "short": winner_short(proposal), "seconds": round(self.afs.seconds, 1),
                    "error": self.afs.error, "chain": chain_lines(self.afs.chain)},
            "distinct_designs": dict(self.designs),
            "measured": {label: config_data(label) for label in ("baseline", "afs", "oracle", "peer")},
        }


# -- one case, all cases ------------------------------------------------------------------------
def case_values(case: Case, facts: ServerFacts, args: argparse.Namespace) -> tuple[Case, dict[str, object]]:
    """The case as run (the collation note added where it matters) and its placeholders' values."""
    if case.name == "prefix_like_collation":
        case = _with_note(case, facts.collation_note)
    return case, {**scaled(case.sizes, args.scale), **facts.values}


async def run_case(settings: Settings, server: SandboxServer, client: ForkClient,
                   provider: LocalForkProvider, facts: ServerFacts, peer: Peer, case: Case,
                   args: argparse.Namespace, build: Build,
                   build_next: Callable[[], Build | None]) -> Verdict:
    """One case, its database being built by `build`. `build_next` starts building the next
    case's database (None: no case is left): while this case's designs' tasks run (their
    designs are counted, not timed), and done before its final measurement, which runs alone."""
    case, values = case_values(case, facts, args)
    db = database_name(case)
    verdict = Verdict(case=case, query=render(case.query, values), afs=AfsRun(), configs={},
                      peer=Advice(None, peer.status), build_s=0.0)
    following: Build | None = None
    try:
        verdict.build_s = await build.wait()
        verdict.phases["build"] = verdict.build_s
        if not args.no_afs:
            progress(f"{case.name}: AFS optimize (offline strategists, routed squad)")
            task_settings = case_settings(settings, case)
            runs = args.afs_runs or settings.runs
            verdict.afs = await run_afs(task_settings, server, client, provider, db, verdict.query, runs)
            verdict.phases["routed"] = verdict.afs.seconds
            progress(f"{case.name}: AFS {verdict.afs.status} in {verdict.afs.seconds:.1f} s, winner"
                     f" {verdict.afs.winner or 'none'}: {winner_short(verdict.afs.proposal)}")
            for line in chain_lines(verdict.afs.chain):
                progress(f"{case.name}:   {line}")
            if not args.no_designs:
                following = build_next()
                verdict.designs = await squad_designs(task_settings, server, client, provider, db,
                                                      verdict.query, runs, verdict.afs, verdict.phases)
                progress(f"{case.name}: distinct measured designs: three agents"
                         f" {verdict.designs['three']}, one agent {verdict.designs['one']}")
        else:
            verdict.afs.status = "skipped (--no-afs)"
        if following is not None:  # the final measurement runs alone on the server
            started = time.monotonic()
            await following.done.wait()
            verdict.phases["wait"] = time.monotonic() - started
        if peer.ready:
            progress(f"{case.name}: asking the peer (postgres-mcp) on its own server")
            started = time.monotonic()
            verdict.peer = await peer.advise(
                case.name, [render(s, values) for s in (*case.schema, *case.data)], verdict.query)
            verdict.phases["peer"] = time.monotonic() - started
            progress(f"{case.name}: peer in {verdict.phases['peer']:.1f} s: {verdict.peer.note}"
                     + "".join(f"; {d}" for d in verdict.peer.ddl or ()))
        progress(f"{case.name}: measuring baseline, AFS, oracle and peer in one fork ({args.runs} rounds)")
        started = time.monotonic()
        verdict.configs = await measure_case(client, provider, db, case, values, verdict.afs, args.runs,
                                             verdict.peer)
        verdict.phases["measure"] = time.monotonic() - started
        oracle = verdict.configs.get("oracle")
        if oracle is not None and (oracle.error or verdict.differs("oracle")):
            verdict.error = f"the oracle is broken: {oracle.error or 'it returns other rows'}"
    except AfsError as exc:
        verdict.error = str(exc)
        progress(f"{case.name}: failed: {exc}")
    finally:
        await drop_database(provider, case)
    return verdict


async def squad_designs(settings: Settings, server: SandboxServer, client: ForkClient,
                        provider: LocalForkProvider, db: str, query: str, runs: int,
                        routed: AfsRun, phases: dict[str, float]) -> dict[str, int | None]:
    """Distinct measured designs of the squad of three and of one agent alone on the query (the
    routed run counts as the squad of three when the router sent all three, and as the one
    agent when it sent that one alone); their wall times go to `phases`."""
    three = one = routed
    if sorted(routed.agents) != sorted(ALL_AGENTS):
        progress("  designs: the squad of three")
        three = await run_afs(settings, server, client, provider, db, query, runs, ALL_AGENTS)
        phases["three"] = three.seconds
    if routed.agents != ONE_AGENT:
        progress(f"  designs: {ONE_AGENT[0]} alone")
        one = await run_afs(settings, server, client, provider, db, query, runs, ONE_AGENT)
        phases["one"] = one.seconds
    return {"three": distinct_designs(three) if three.outcomes else None,
            "one": distinct_designs(one) if one.outcomes else None}


def _with_note(case: Case, note: str) -> Case:
    from dataclasses import replace

    return replace(case, note=f"{case.note} ({note})")


async def measure_all(settings: Settings, server: SandboxServer, cases: Sequence[Case],
                      args: argparse.Namespace) -> list[Verdict]:
    provider = LocalForkProvider(server.dsn(), statement_timeout_ms=BUILD_TIMEOUT_MS)
    facts = await server_facts(server.dsn())
    verdicts = []
    async with peer_session(not args.no_peer, progress) as peer, open_forks(settings) as client:
        progress(f"peer (postgres-mcp): {peer.status}")
        builds: dict[int, Build] = {}  # by the case's index, once started
        try:
            async with trio.open_nursery() as nursery:

                def start(index: int) -> Build | None:
                    if index >= len(cases) or index in builds:
                        return builds.get(index)
                    case, values = case_values(cases[index], facts, args)
                    builds[index] = Build(case)
                    nursery.start_soon(builds[index].run, server, provider, values)
                    return builds[index]

                for number, case in enumerate(cases, 1):
                    progress(f"case {number}/{len(cases)}: {case.name}")
                    build = start(number - 1)
                    assert build is not None
                    verdict = await run_case(settings, server, client, provider, facts, peer, case, args,
                                             build, functools.partial(start, number))
                    verdicts.append(verdict)
                    progress(f"{case.name}: baseline {_fmt(verdict.ms('baseline'))} ms, AFS"
                             f" {_fmt(verdict.ms('afs'))} ms, oracle {_fmt(verdict.ms('oracle'))} ms,"
                             f" peer {peer_cell(verdict)}, reach {'yes' if verdict.reach else 'no'}")
        finally:  # a database built ahead for a case that did not run (interrupted)
            for index, build in builds.items():
                if index >= len(verdicts):
                    await drop_database(provider, build.case)
    return verdicts


# -- the report -------------------------------------------------------------------------------------
def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.{max(digits, 2)}f}"
    return f"{value:,.{digits}f}"


def peer_cell(v: Verdict) -> str:
    """The peer's time in the table: its ms, or why not ("cannot run", "error")."""
    if not v.peer.ran:
        return "cannot run"
    if v.peer_error:
        return "error"
    return _fmt(v.ms("peer"))


def peer_summary(measured: Sequence[Verdict]) -> dict[str, Any]:
    ran = [v for v in measured if v.peer.ran and not v.peer_error]
    ratios = [r for v in ran if (r := v.peer_ratio) is not None]
    reasons = sorted({v.peer.note for v in measured if not v.peer.ran})
    return {"name": "postgres-mcp (analyze_query_indexes, dta)", "cases_run": len(ran),
            "reach_share": round(sum(v.peer_reach for v in ran) / len(measured), 3) if measured else 0.0,
            "median_ratio_to_oracle": float(f"{statistics.median(ratios):.4g}") if ratios else None,
            "cannot_run": reasons}


def designs_ratio(verdicts: Sequence[Verdict]) -> float | None:
    """Distinct measured designs of three agents over those of one, summed over the cases where
    both ran; None when none did (or one agent measured nothing anywhere)."""
    pairs = [(three, one) for v in verdicts
             if (three := v.designs["three"]) is not None and (one := v.designs["one"]) is not None]
    one_total = sum(one for _, one in pairs)
    return round(sum(three for three, _ in pairs) / one_total, 3) if one_total else None


def median_task_s(verdicts: Sequence[Verdict]) -> float | None:
    """The median wall time of AFS's (routed) task per case; None when AFS did not run."""
    times = [v.afs.seconds for v in verdicts if v.afs.status not in ("not run", "skipped (--no-afs)")]
    return round(statistics.median(times), 1) if times else None


def summary(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    measured = [v for v in verdicts if v.error is None]
    ratios = [v.accepted_ratio for v in measured if v.accepted_ratio is not None]
    return {
        "cases": len(measured),
        "reach_share": round(sum(v.reach for v in measured) / len(measured), 3) if measured else 0.0,
        "regressions": sum(v.regression is not None for v in measured),
        "answer_caches": sum(v.cache is not None for v in measured),
        "median_ratio_to_oracle": float(f"{statistics.median(ratios):.4g}") if ratios else None,
        "distinct_designs_ratio": designs_ratio(measured),
        "median_task_s": median_task_s(measured),
        "peer": peer_summary(measured),
        "details": [v.details() for v in verdicts],
    }


def report(verdicts: Sequence[Verdict], wall_s: float, args: argparse.Namespace) -> dict[str, Any]:
    data = summary(verdicts)
    print(f"AFS against the known-good fix (oracle), {len(verdicts)} public advisor cases,"
          f" scale {args.scale:g}, {args.runs} interleaved rounds per configuration")
    print("peer = postgres-mcp's index tuning (analyze_query_indexes, dta) on Debian's PostgreSQL"
          " with HypoPG; its indexes measured in the same fork")
    print()
    header = (f"{'case':<27} {'baseline ms':>11} {'AFS ms':>9} {'oracle ms':>9} {'peer ms':>10}"
              f" {'AFS/oracle':>10} {'peer/oracle':>11} {'reach':>5}  AFS's winner")
    print(header)
    print("-" * (len(header) + 30))
    for v in verdicts:
        if v.error is not None:
            print(f"{v.case.name:<27} error: {v.error[:120]}")
            continue
        flags = []
        if v.regression:
            flags.append(f"REGRESSION: {v.regression}")
        if v.cache:
            flags.append(f"ANSWER CACHE: {v.cache}")
        if bound := literal_bound(v.query, v.afs.proposal):
            flags.append(f"note: {bound} (serves other values only where they are in its predicate)")
        if v.oracle_faster is False:
            flags.append("the oracle is not measurably faster than the baseline at this scale")
        ratio = _ratio_text(v.ratio)
        print(f"{v.case.name:<27} {_fmt(v.ms('baseline')):>11} {_fmt(v.ms('afs')):>9}"
              f" {_fmt(v.ms('oracle')):>9} {peer_cell(v):>10} {ratio:>10} {_ratio_text(v.peer_ratio):>11}"
              f" {'yes' if v.reach else 'no':>5}"
              f"  {'= oracle: ' if v.same_as_oracle else ''}{winner_short(v.afs.proposal)[:70]}")
        for flag in flags:
            print(f"{'':<27}   {flag}")
        for line in chain_lines(v.afs.chain):
            print(f"{'':<27}   {line}")
    print()
    print(f"cases {data['cases']}, reach {data['reach_share']:.0%}, regressions {data['regressions']},"
          f" answer caches {data['answer_caches']}, median AFS/oracle"
          f" {data['median_ratio_to_oracle']} (a disqualified winner counts as no change)"
          f"  (wall time {wall_s / 60:.1f} min)")
    paired = [v for v in verdicts if v.error is None and None not in v.designs.values()]
    three = sum(v.designs["three"] or 0 for v in paired)
    one = sum(v.designs["one"] or 0 for v in paired)
    print(f"distinct measured designs: three agents {three}, one agent ({ONE_AGENT[0]}) {one},"
          f" ratio {data['distinct_designs_ratio']}; median AFS task {data['median_task_s']} s"
          " (routed squad)")
    totals: dict[str, float] = {}
    for v in verdicts:
        for phase, seconds in v.phases.items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    spent = ", ".join(f"{phase} {seconds / 60:.1f} min" for phase, seconds in totals.items())
    print(f"time by phase: {spent}"
          + " (build: the case databases; routed, three, one: the AFS tasks; measure: the final rounds)")
    peer = data["peer"]
    print(f"peer (postgres-mcp): ran on {peer['cases_run']} of {data['cases']} cases, reach"
          f" {peer['reach_share']:.0%}, median peer/oracle {peer['median_ratio_to_oracle']}")
    for v in verdicts:
        if v.error is None:
            what = v.peer_error or v.peer.note
            advice = "; ".join(winner_short_sql(d) for d in v.peer.ddl or ())
            print(f"  peer {v.case.name}: {what}" + (f": {advice}" if advice and not v.peer_error else ""))
    return data


def _ratio_text(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.3g}" if ratio < 100 else f"{ratio:,.0f}"


def winner_short_sql(command: str) -> str:
    text = " ".join(command.split())
    match = _INDEX.match(text)
    return "idx " + re.sub(r"^(public\.)", "", match.group(1)).replace('"', "") if match else text[:60]


# -- the script -------------------------------------------------------------------------------------
QUICK_CASES = tuple(c.name for c in CASES if c.quick)


def select_cases(args: argparse.Namespace) -> list[Case]:
    known = {c.name: c for c in CASES}
    if args.case:
        unknown = [n for n in args.case if n not in known]
        if unknown:
            raise SystemExit(f"quality: unknown case {', '.join(unknown)} (known: {', '.join(known)})")
        return [known[n] for n in args.case]
    if args.quick:
        return [known[n] for n in QUICK_CASES]
    return list(CASES)


async def run(args: argparse.Namespace, settings: Settings) -> int:
    cases = select_cases(args)
    started = time.monotonic()
    verdicts = await with_sandbox(settings, lambda server: measure_all(settings, server, cases, args),
                                  progress)
    if verdicts is None:
        return EXIT_INTERRUPTED
    data = report(verdicts, time.monotonic() - started, args)
    if args.json:
        print(json.dumps(data, default=str))
    return EXIT_FAILED if any(v.error for v in verdicts) else EXIT_OK


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="AFS against the known-good fix of public advisor cases: reach, regressions,"
                    " answer caches.")
    parser.add_argument("--case", action="append", metavar="NAME",
                        help="run this case only (repeatable); known: " + ", ".join(c.name for c in CASES))
    parser.add_argument("--quick", action="store_true",
                        help=f"a small subset ({', '.join(QUICK_CASES)}) at scale {QUICK_SCALE:g}")
    parser.add_argument("--scale", type=float, metavar="F",
                        help=f"row count factor (default 1, or {QUICK_SCALE:g} with --quick)")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, metavar="N",
                        help=f"interleaved measured rounds per configuration (default {DEFAULT_RUNS})")
    parser.add_argument("--afs-runs", type=int, metavar="N",
                        help="AFS's own runs per suite query and side (default: AFS_RUNS or 5)")
    parser.add_argument("--no-afs", action="store_true", help="measure baseline and oracle only")
    parser.add_argument("--no-designs", action="store_true",
                        help="skip the two extra AFS tasks per case (the squad of three and one agent"
                             " alone) that count distinct measured designs")
    parser.add_argument("--no-peer", action="store_true",
                        help="skip the peer column (postgres-mcp on Debian's PostgreSQL with HypoPG, set up"
                             " by benchmarks/peer_setup.sh: apt-get as root, a venv of its own)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object on the last line")
    args = parser.parse_args(argv)
    if args.scale is None:
        args.scale = QUICK_SCALE if args.quick else 1.0
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.runs < 1 or (args.afs_runs is not None and args.afs_runs < 1):
        parser.error("--runs and --afs-runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return harness.main("quality", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
