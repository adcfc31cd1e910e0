"""The plain data that flows through one optimization task (pure: no I/O).

    query ─► QueryFeatures ─► RoutingDecision
          ─► per agent: AnalysisResult ─► OptimizationProposal ─► ValidationResult
                        ─► BenchmarkOutcome (Measurement per suite query) ─► AgentOutcome
          ─► ConsensusDecision

Field names follow the agent specification (seed 001) where it names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# -- agents -------------------------------------------------------------------------
AgentKey = str  # "gemini25pro" | "gemini25flash" | "gemini20flash"


@dataclass(frozen=True)
class AgentSpec:
    key: AgentKey
    model: str  # the Gemini model name
    specialization: str


AGENTS: Mapping[AgentKey, AgentSpec] = {
    "gemini25pro": AgentSpec("gemini25pro", "gemini-2.5-pro",
                             "index design: composite, partial and covering indexes; query plans"),
    "gemini25flash": AgentSpec("gemini25flash", "gemini-2.5-flash",
                               "structure for large tables: BRIN, range partitioning"),
    "gemini20flash": AgentSpec("gemini20flash", "gemini-2.0-flash",
                               "pre-computation: materialized views and the rewrites that read them"),
}
# Tie-break preference (consensus): gemini-2.5-pro first.
AGENT_PREFERENCE: tuple[AgentKey, ...] = ("gemini25pro", "gemini25flash", "gemini20flash")

TaskType = Literal["query_optimization", "schema_improvement", "index_recommendation"]
Priority = Literal["high", "normal", "low"]
Provider = Literal["auto", "heuristic", "gemini"]  # who thinks: auto = Gemini when credentials are set
ColumnRole = Literal["equality", "range", "join", "group", "sort", "select", "other"]
# "statistics": CREATE STATISTICS (extended statistics) and the ANALYZE that builds them;
# "settings": per-query planner settings only (OptimizationProposal.settings), no DDL
ProposalType = Literal[
    "index", "partial_index", "composite_index", "query_rewrite",
    "materialized_view", "partitioning", "denormalization", "statistics", "settings",
]
PROPOSAL_TYPES: tuple[str, ...] = (
    "index", "partial_index", "composite_index", "query_rewrite",
    "materialized_view", "partitioning", "denormalization", "statistics", "settings",
)
RiskLevel = Literal["low", "medium", "high"]
SuiteName = Literal["baseline", "limit", "filter", "sort"]


# -- the query ----------------------------------------------------------------------
@dataclass(frozen=True)
class ColumnUse:
    """One use of a column in the query: `orders.status` as an equality filter, etc."""

    table: str | None  # the base table it belongs to (resolved through aliases), if known
    column: str
    role: ColumnRole
    operator: str | None = None  # "=", "<", ">=", "IN", "BETWEEN", "LIKE", "IS NULL", …
    value: Any = None  # the constant compared with, when there is one


@dataclass(frozen=True)
class QueryFeatures:
    join_count: int
    subquery_count: int
    aggregation_count: int
    window_count: int
    set_operation_count: int
    order_by_count: int
    has_limit: bool
    tables: tuple[str, ...]  # base tables referenced, in order of appearance
    aliases: Mapping[str, str]  # alias -> table
    columns: tuple[ColumnUse, ...]
    main_table: str | None  # the first table of the outermost FROM
    complexity_score: int  # the seed's formula
    complexity: Literal["low", "medium", "high"]  # 0-2, 3-5, 6+


@dataclass(frozen=True)
class QueryVariant:
    name: SuiteName
    sql: str
    ordered: bool  # the query fixes a total order: results compare row by row
    exact: bool  # False when a LIMIT without a total order makes only the row count comparable
    note: str = ""
    own_limit: int | None = None  # the "limit" variant: the query's own constant LIMIT it edits


# -- routing ------------------------------------------------------------------------
@dataclass(frozen=True)
class RoutingDecision:
    agents: tuple[AgentKey, ...]
    rationale: tuple[str, ...]
    waiting: bool = False  # every candidate is at its hard capacity limit


# -- what an agent sees (gathered in its fork by the analysis step) ----------------------
@dataclass(frozen=True)
class ColumnInfo:
    name: str
    data_type: str  # as format_type() prints it: "bigint", "timestamp with time zone", …
    nullable: bool = True
    # the collation that orders it ("C", "en_US.UTF-8", …; the database's when the column has
    # the default); None for types without collation, or when unknown
    collation: str | None = None


@dataclass(frozen=True)
class ColumnStats:
    """pg_stats of one column (None where PostgreSQL has nothing)."""

    null_frac: float = 0.0
    n_distinct: float = 0.0  # > 0: distinct values; < 0: minus the fraction of rows
    correlation: float | None = None  # physical order vs value order, -1 … 1
    most_common_vals: tuple[str, ...] = ()  # as text
    most_common_freqs: tuple[float, ...] = ()
    histogram_bounds: tuple[str, ...] = ()  # as text
    avg_width: int | None = None  # average stored width in bytes (pg_stats.avg_width)


@dataclass(frozen=True)
class IndexInfo:
    name: str
    definition: str  # pg_get_indexdef()
    columns: tuple[str, ...]  # key columns, in order (expressions as text)
    unique: bool = False
    primary: bool = False
    size_mb: float = 0.0


@dataclass(frozen=True)
class TableInfo:
    name: str  # as referenced in the query (unqualified unless it was qualified)
    rows: int  # reltuples (estimate) or a count
    size_mb: float  # total relation size with indexes and TOAST
    columns: tuple[ColumnInfo, ...]
    indexes: tuple[IndexInfo, ...]
    primary_key: tuple[str, ...] = ()
    column_stats: Mapping[str, ColumnStats] = field(default_factory=dict)  # referenced columns only
    writes_per_read: float = 0.0  # (ins + upd + del) / (seq + idx scans) from pg_stat_user_tables
    ddl: str = ""  # CREATE TABLE … as a person would read it
    referenced_by: tuple[str, ...] = ()  # tables with a foreign key pointing at this one
    constraints: tuple[str, ...] = ()  # its foreign keys and CHECK constraints, as pg_get_constraintdef
    partitioning: str = ""  # "PARTITION BY RANGE (created_at), 24 partitions", "partition of t", ""


@dataclass(frozen=True)
class OperatorSupport:
    """One operator class that can serve one operator the query uses, from the fork's catalog
    (pg_amop, pg_opclass, pg_am; afs.analysis.operator_support reads it, afs.query.opclasses
    chooses among them)."""

    operator: str  # pg_operator.oprname: "=", "@>", "~~", "&&", …
    left_type: str  # format_type of the operator's left argument: "jsonb", "text", "anyrange"
    right_type: str
    method: str  # pg_am.amname: "btree", "hash", "gin", "gist", "spgist", "brin", …
    opclass: str  # pg_opclass.opcname
    default: bool  # the default operator class of its type for the method
    purpose: Literal["search", "order"]  # pg_amop.amoppurpose: a WHERE test, or ORDER BY (KNN)
    family_operators: int  # operators of the class's family for the method: fewer, more specialised
    extension: str | None = None  # the extension the class belongs to
    installed: bool = True  # False: the extension is available, and created only with the index


@dataclass(frozen=True)
class AnalysisContext:
    """Everything an agent (model or strategist) knows when it proposes."""

    task_id: str
    task_type: TaskType
    query: str
    features: QueryFeatures
    plan: Mapping[str, Any]  # EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) → [0]["Plan"]
    execution_ms: float
    tables: Mapping[str, TableInfo]  # by name as used in features.tables
    suite: tuple[QueryVariant, ...] = ()
    slow: bool = False  # the query ran past the statement timeout: plan without ANALYZE,
    #                     execution_ms is the timeout (a lower bound)
    keyset_last_key: tuple[Any, ...] | None = None  # OFFSET pages: the key of the row before the page
    # the server the plan ran on: server_version and the planner settings that shape plans
    # (work_mem, random_page_cost, effective_cache_size, …), as SHOW prints them
    server: Mapping[str, str] = field(default_factory=dict)
    # the source database's server, the one the advice is for (same keys as `server`): for an
    # imported database the server it was imported from (`source_imported`), often older
    source_server: Mapping[str, str] = field(default_factory=dict)
    source_imported: bool = False
    # operator + " " + the type of its left argument (and of each column type binary-coercible to
    # it: "~~ character varying" beside "~~ text") → the operator classes that serve it, for the
    # operators the query filters, joins and sorts with, resolved as PostgreSQL resolved them
    # (afs.analysis.operator_support). Empty: the catalog was not read.
    operator_classes: Mapping[str, tuple[OperatorSupport, ...]] = field(default_factory=dict)
    # (table, expression as afs.query.opclasses.where_terms prints it) → (its type, the key as
    # pg_get_indexdef prints it), for the expressions of one column the WHERE clause compares that
    # PostgreSQL accepts as an index key (immutable: it built an index on an empty copy of the
    # table); an expression not here is not indexable. Read with operator_classes.
    index_expressions: Mapping[tuple[str, str], tuple[str, str]] = field(default_factory=dict)


# -- one agent's work ---------------------------------------------------------------
@dataclass(frozen=True)
class AnalysisResult:
    insights: tuple[str, ...]
    proposed_actions: tuple[str, ...]
    confidence: float  # 0.0 - 1.0
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EstimatedImpact:
    """The agent's own prediction: never reported as a measurement."""

    query_time_improvement: float  # percent
    storage_overhead_mb: float
    complexity: Literal["low", "medium", "high"]
    risk: RiskLevel


@dataclass(frozen=True)
class OptimizationProposal:
    agent: AgentKey
    proposal_type: ProposalType
    sql_commands: tuple[str, ...]  # applied in the fork, in order
    rollback_commands: tuple[str, ...]
    rationale: str
    estimated_impact: EstimatedImpact
    rewritten_query: str | None = None  # the query to run instead (materialized views, rewrites)
    needs_refresh: bool = False  # needs triggers or refresh jobs to stay correct
    validation_steps: tuple[str, ...] = ()
    # planner settings for this query only (e.g. ("work_mem", "64MB")): measured with SET LOCAL,
    # recommended per role or per query, never globally (afs.safety.check_settings)
    settings: tuple[tuple[str, str], ...] = ()
    # the application must change too (keyset pagination: it passes the last key it showed)
    needs_application_change: bool = False


@dataclass(frozen=True)
class UnsafeStatement:
    statement: str
    reason: str


@dataclass(frozen=True)
class ValidationResult:
    is_valid: bool
    risk_level: RiskLevel
    reversibility: float  # 0.0 - 1.0
    warnings: tuple[str, ...] = ()
    rollback_commands: tuple[str, ...] = ()
    rejected: tuple[UnsafeStatement, ...] = ()


# -- measuring -------------------------------------------------------------------------
@dataclass(frozen=True)
class Timing:
    median_ms: float
    spread_ms: float  # (max - min) / 2 of the measured runs
    runs: int
    buffers: int  # shared hit + read of the median run
    lower_bound: bool = False  # the run hit its time cap: the true time is at least median_ms
    min_ms: float | None = None  # the fastest and the slowest run (None in results stored before)
    max_ms: float | None = None
    reused: int = 0  # of the runs, those taken from an earlier measurement of the task (afs.bench.Reuse)


@dataclass(frozen=True)
class Measurement:
    name: SuiteName
    baseline: Timing
    optimized: Timing
    rows: int
    equivalent: bool  # same rows (multiset, ordered or count, per the variant)
    significant: bool  # the difference beats the noise
    note: str = ""
    stopped: str = ""  # why measuring stopped: separated, overlap, max_runs, budget (afs.bench)

    @property
    def improvement_pct(self) -> float:
        if self.baseline.median_ms <= 0:
            return 0.0
        return 100.0 * (self.baseline.median_ms - self.optimized.median_ms) / self.baseline.median_ms

    @property
    def effect_pct(self) -> float:
        """The improvement as the averages count it: a slowdown within the noise (not
        `significant`) is none. Percentages are bounded at 100 % faster but not slower, so a
        sub-millisecond query's noise (0.05 → 0.3 ms: -500 %) would outweigh a 250 → 17 ms gain
        of the query as given."""
        pct = self.improvement_pct
        return pct if pct >= 0 or self.significant else 0.0


# -- parameter sets: the values a query is measured with -------------------------------------
@dataclass(frozen=True)
class Substitution:
    """One literal of the query replaced by another of the same type."""

    column: str | None  # "orders.created_at"; None for a literal not compared with a column
    old: str  # the literal as written in the query (SQL text, quotes and sign included)
    new: str  # the replacement literal, SQL text


@dataclass(frozen=True)
class ParameterSet:
    """One set of values for the query's literals (`afs.params` draws them from pg_stats;
    the batch job fills a normalised statement's $1 … $n with them).

    `substitutions` turn the query as given into this set, in any query of its family (the
    original, a suite variant, a rewrite): `afs.params.apply_parameters`. A set filled into
    a normalised statement also has its `values` ($n → SQL literal) and its `query`."""

    label: str  # for a person: "orders.status = 'shipped' (a common value, 15% of rows); …"
    substitutions: tuple[Substitution, ...] = ()
    values: Mapping[int, str] = field(default_factory=dict)
    query: str = ""


@dataclass(frozen=True)
class WorkloadWrite:
    """One INSERT, UPDATE or DELETE of the workload on a table the task's query reads, filled
    with values (the batch's, `afs.batch.replay`): what a new index's write cost is measured on."""

    statement: str  # $1 … $n, as pg_stat_statements stores it
    query: str  # filled with `values`: what the fork runs (rolled back)
    table: str  # the table it writes
    calls: int  # in the window the statistics cover
    per_day: float | None  # calls a day at the observed rate (None: the window is unknown)
    values: tuple[tuple[int, str], ...] = ()  # $n → SQL literal (the fill)


@dataclass(frozen=True)
class WriteWorkload:
    """What the task's statement shares its tables with: the workload's writes of them and the
    statement's own observed rate (reads a day), so that a new index's measured write cost can
    be set against the read time it saves (afs.consensus.index_write_cost)."""

    writes: tuple[WorkloadWrite, ...] = ()
    reads_per_day: float | None = None  # the statement's calls a day at the observed rate


@dataclass(frozen=True)
class StatementParameters:
    """A task's explicit parameter sets: a normalised statement and the values it was filled
    with. The first set is the query the suite times (the task's query); each proposal is
    measured and result-checked on the others as well (instead of sets drawn from pg_stats)."""

    statement: str  # $1 … $n, as pg_stat_statements stores it
    sets: tuple[ParameterSet, ...]
    workload: WriteWorkload | None = None  # the writes of the tables it reads (the batch's; afs.task checks)

    @property
    def measured_on(self) -> str:
        return self.sets[0].label if self.sets else ""

    @property
    def others(self) -> tuple[ParameterSet, ...]:
        return self.sets[1:]


@dataclass(frozen=True)
class FamilyQuery:
    """The query with other parameter values, before and after the proposal.

    `candidate_sql` is None when the proposal's query has no place for the new values:
    the literals are baked into what it reads (an answer cache, not an optimization).
    """

    label: str  # which values, e.g. "status = 'shipped' (most common value)"
    baseline_sql: str
    candidate_sql: str | None


@dataclass(frozen=True)
class ParameterCheck:
    """One other parameter set, measured and result-checked like the suite."""

    label: str
    equivalent: bool  # the same rows before and after for these values
    slower: bool  # the proposal is slower than the original for these values (beyond the noise)
    baseline: Timing | None = None
    optimized: Timing | None = None
    rows: int = 0
    note: str = ""


@dataclass(frozen=True)
class WriteCost:
    """What a proposal's new indexes cost the workload's writes, measured in the fork: each write
    replayed with the indexes and with them dropped (rolled back), `afs.replay.fork_write_cost`."""

    ms_per_write: float  # extra time per write with the indexes (calls-weighted; may be noise)
    writes_per_day: float | None  # the replayed writes' calls a day at the observed rate
    ms_per_day: float | None  # ms_per_write at that rate (None: the rate is unknown)
    reads_per_day: float | None  # the task's statement's calls a day (WriteWorkload.reads_per_day)
    significant: bool  # some write's two sides apart beyond the noise (afs.bench.significant)
    statements: int  # write statements replayed
    note: str = ""  # what was not replayed, and why


@dataclass(frozen=True)
class BenchmarkOutcome:
    measurements: tuple[Measurement, ...]
    storage_before_mb: float
    storage_after_mb: float
    skipped: tuple[str, ...] = ()  # suite queries left out, with the reason
    parameter_checks: tuple[ParameterCheck, ...] = ()  # the query family: other literals
    answer_cache: str | None = None  # why the proposal only serves today's literals, if it does
    apply_s: float = 0.0  # measured time to apply the proposal (an index or view build = its refresh cost)
    baseline_lower_bound: bool = False  # the baseline exceeded the statement timeout: a lower bound
    write_cost: WriteCost | None = None  # a new index's cost to the workload's writes, when replayed

    @property
    def storage_delta_mb(self) -> float:
        return max(0.0, self.storage_after_mb - self.storage_before_mb)

    @property
    def equivalent(self) -> bool:
        return all(m.equivalent for m in self.measurements) and all(
            c.equivalent for c in self.parameter_checks)

    @property
    def family_improvement_pct(self) -> float:
        """The average improvement over the suite and the other parameter sets that were timed:
        what the query family gains, not only today's literals."""
        values = [m.effect_pct for m in self.measurements]
        for check in self.parameter_checks:
            if check.baseline is not None and check.optimized is not None and check.baseline.median_ms > 0:
                values.append(100.0 * (check.baseline.median_ms - check.optimized.median_ms)
                              / check.baseline.median_ms)
        return sum(values) / len(values) if values else 0.0

    @property
    def family_problem(self) -> str | None:
        """Why the proposal does not serve the query with other values (None when it does)."""
        if self.answer_cache:
            return self.answer_cache
        for check in self.parameter_checks:
            if not check.equivalent:
                if check.note.startswith("not proven"):  # its rows could not be read (afs.bench)
                    return f"its rows for {check.label} are not proven the same"
                return f"returns other rows for {check.label}"
        for check in self.parameter_checks:
            if check.slower:
                return f"slower than the original for {check.label}"
        return None

    @property
    def average_improvement_pct(self) -> float:
        if not self.measurements:
            return 0.0
        return sum(m.effect_pct for m in self.measurements) / len(self.measurements)


# -- the user's conditions: how far the forks are from the user's server ------------------
@dataclass(frozen=True)
class SettingGap:
    """A setting whose value on the source the forks do not have, and why (afs.pg.settings)."""

    name: str
    source: str  # the source's value, as SHOW prints it
    sandbox: str | None  # the sandbox's value (None: unknown there, or not read)
    reason: str


@dataclass(frozen=True)
class PlanCheck:
    """The query's plan in a fork against its plan on the source, both EXPLAIN without ANALYZE,
    in short form (afs.pg.plan.plan_shape), before any candidate is measured."""

    matches: bool
    source_shape: tuple[str, ...]
    fork_shape: tuple[str, ...]
    differences: tuple[str, ...] = ()  # afs.pg.plan.shape_differences
    carried: Mapping[str, str] = field(default_factory=dict)  # the source's settings the fork took
    gaps: tuple[SettingGap, ...] = ()  # what it could not take, with both values


@dataclass(frozen=True)
class TableState:
    """One table of the query on the source and in the copy the forks are made from."""

    name: str
    source_bytes: int | None = None  # the heap's size (pg_relation_size), read at optimize time
    copy_bytes: int | None = None  # the copy's, when it was imported
    source_all_visible: float | None = None  # relallvisible / relpages (None: no pages)
    copy_all_visible: float | None = None


@dataclass(frozen=True)
class UserConditions:
    """What the forks took over from the user's server, and where they differ from it
    (afs.conditions): the report says it before any number."""

    # the plan settings of the application's sessions on the source, read at optimize time:
    # every fork is given them (PlanCheck says what it took and what it could not)
    carried: Mapping[str, str] = field(default_factory=dict)
    server: Mapping[str, str] = field(default_factory=dict)  # the source's NOT_CARRIED facts
    source_plan: tuple[str, ...] = ()  # the query's plan shape on the source
    imported_at: str | None = None  # when the copy was imported (None: the source is not a copy)
    tables: tuple[TableState, ...] = ()
    stale: tuple[str, ...] = ()  # tables whose size drifted past config.SIZE_DRIFT, said in words
    unsettled: tuple[str, ...] = ()  # tables whose all-visible fraction differs, said in words
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelUsage:
    """What one agent's model calls took, summed over the task (an estimate, not a bill):
    the model configured and the version and stage the API said answered, tokens, the
    estimated cost at list prices (None: a model without a known price), and how the calls
    went (attempts, retries, failed attempts, timeouts, re-prompts)."""

    model: str
    model_version: str | None = None
    model_stage: str | None = None
    retirement: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0  # thinking included
    thinking_tokens: int = 0
    cached_tokens: int = 0
    total_tokens: int = 0
    estimated_cost_usd: float | None = 0.0
    calls: int = 0
    attempts: int = 0
    retries: int = 0
    failed_attempts: int = 0
    timeouts: int = 0
    reprompts: int = 0
    refusals_reprompted: int = 0
    seconds: float = 0.0  # time spent waiting for the model (the budget's count)
    # why the agent's model calls stopped before it was done: its model budget (which part was
    # spent) or the spending cap (with what was spent); None when nothing stopped them
    stopped: str | None = None

    def record(self) -> dict[str, Any]:
        """As the store and the report's JSON keep it (a mapping of the fields)."""
        return asdict(self)


AgentStatus = Literal["ok", "failed", "rejected"]
CandidateStatus = Literal["measured", "screened_out", "rejected", "failed"]


@dataclass(frozen=True)
class LoopStep:
    """One step of an agent's loop: a design, the plan node that led to it, its measured time."""

    step: int  # 1 = the first design
    proposal: OptimizationProposal
    motivated_by: str | None  # the Bottleneck.detail that led to it; None for step 1
    median_ms: float | None  # the query's measured time with it
    kept: bool
    note: str = ""  # "" or why it was not kept / a refusal / an apply error


@dataclass(frozen=True)
class CandidateResult:
    """One design an agent tried: screened with the planner, and measured when promising."""

    proposal: OptimizationProposal
    status: CandidateStatus
    rank: int  # the brain's order, 1 = its first choice
    validation: ValidationResult | None = None
    planner_cost: float | None = None  # EXPLAIN total cost of the query with the design in place
    baseline_cost: float | None = None  # the same without it
    benchmark: BenchmarkOutcome | None = None
    note: str = ""
    chain: tuple[LoopStep, ...] = ()  # the loop's steps that led to this design (afs.agents)


@dataclass(frozen=True)
class AgentOutcome:
    agent: AgentKey
    status: AgentStatus
    error: str | None = None
    fork: str | None = None
    analysis: AnalysisResult | None = None
    proposal: OptimizationProposal | None = None
    validation: ValidationResult | None = None
    benchmark: BenchmarkOutcome | None = None
    duration_s: float = 0.0
    waited_s: float = 0.0  # of duration_s, spent waiting for the benchmark slot
    measured_by: AgentKey | None = None  # another agent measured this identical proposal
    usage: ModelUsage | None = None  # its model calls (afs.brains.MeteredBrain); None without a model
    candidates: tuple[CandidateResult, ...] = ()  # every design tried; `proposal` is the best
    writes_per_read: Mapping[str, float] = field(default_factory=dict)  # by table, measured on the source
    plan_check: PlanCheck | None = None  # the query's plan in the fork against the source's


# -- consensus -------------------------------------------------------------------------
@dataclass(frozen=True)
class ScoreBreakdown:
    performance: float
    storage: float
    complexity: float
    risk: float
    total: float
    disqualified: tuple[str, ...] = ()  # reasons; empty when the proposal may win


@dataclass(frozen=True)
class ConsensusDecision:
    winner: AgentKey | None
    scores: Mapping[AgentKey, ScoreBreakdown]
    ranking: tuple[AgentKey, ...]
    rationale: tuple[str, ...]
    confidence: float  # 0.0 - 1.0; higher when agents agree on equivalent DDL


# -- the task ---------------------------------------------------------------------------
TaskStatus = Literal["completed", "no_improvement", "failed"]


@dataclass(frozen=True)
class ReviewFlag:
    """A reviewer's concern about another agent's measured proposal: shown in the report, never
    a change to any measurement, score or the consensus."""

    agent: AgentKey  # whose proposal
    reviewer: AgentKey
    concern: str


@dataclass(frozen=True)
class TaskResult:
    task_id: str
    status: TaskStatus
    query: str
    source: str
    routing: RoutingDecision
    outcomes: tuple[AgentOutcome, ...]
    decision: ConsensusDecision | None
    provider: str
    provider_note: str
    duration_s: float
    error: str | None = None
    review: tuple[ReviewFlag, ...] = ()  # the reviewer's flags on measured proposals (shown only)
    parameters: StatementParameters | None = None  # the task's explicit parameter sets, if any
    conditions: UserConditions | None = None  # the forks against the user's server (afs.conditions)
