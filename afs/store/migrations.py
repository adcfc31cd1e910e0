"""The store's schema, as numbered migrations applied in order on start.

Append a new `Migration` to change the schema; never edit one that shipped.
Each runs in its own transaction under an advisory lock, so two processes that
start at once do not both apply it; `afs_store.migrations` records what ran.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA = "afs_store"
LOCK_KEY = 0x0AF5_5702  # pg_advisory_xact_lock key of the migrations
AGENTS_LOCK_KEY = 0x0AF5_5703  # ... and of agent assignment (the capacity across workers)
SCHEDULE_LOCK_KEY = 0x0AF5_5704  # pg_try_advisory_lock(key, hashtext(schedule id)): a run going
EVENTS_CHANNEL = "afs_events"  # NOTIFY channel of appended events; the payload is the task id


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "tasks, events, agents, proposals, benchmarks, consensus, forks", """
CREATE TABLE afs_store.tasks (
    id               text PRIMARY KEY,
    status           text NOT NULL CHECK (status IN ('queued', 'running', 'recovering', 'completed',
                                                     'no_improvement', 'failed', 'cancelled')),
    query            text NOT NULL,
    source           text,               -- a database in the sandbox
    dsn              text,               -- or the user's database (its sandbox copy is used)
    task_type        text NOT NULL,
    priority         text NOT NULL,
    provider         text NOT NULL,
    weights          jsonb,
    runs             integer NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    worker           text,               -- who holds the lease
    lease_expires_at timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 2,
    cancel_requested boolean NOT NULL DEFAULT false,
    error            text,
    result           jsonb,              -- the TaskResult (afs.store.codec)
    report           jsonb               -- afs.report.to_json of it
);
CREATE INDEX tasks_queue ON afs_store.tasks (
    (CASE priority WHEN 'high' THEN 0 WHEN 'normal' THEN 1 ELSE 2 END), created_at)
    WHERE status = 'queued';
CREATE INDEX tasks_created ON afs_store.tasks (created_at DESC);

CREATE TABLE afs_store.events (
    id         bigserial PRIMARY KEY,
    task_id    text NOT NULL REFERENCES afs_store.tasks (id) ON DELETE CASCADE,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind       text NOT NULL,
    agent      text,
    fork       text,
    duration_s double precision,
    data       jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX events_task ON afs_store.events (task_id, id);
CREATE FUNCTION afs_store.events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT 1 FROM afs_store.tasks WHERE id = OLD.task_id) THEN
        RETURN OLD;  -- the task itself is being deleted
    END IF;
    RAISE EXCEPTION 'afs_store.events is append-only';
END $$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON afs_store.events
    FOR EACH ROW EXECUTE FUNCTION afs_store.events_append_only();

CREATE TABLE afs_store.agent_executions (
    task_id     text NOT NULL REFERENCES afs_store.tasks (id) ON DELETE CASCADE,
    agent       text NOT NULL,
    status      text NOT NULL,
    error       text,
    fork        text,
    duration_s  double precision,
    waited_s    double precision,
    measured_by text,
    usage       jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (task_id, agent)
);

CREATE TABLE afs_store.proposals (
    task_id          text NOT NULL,
    agent            text NOT NULL,
    rank             integer NOT NULL,   -- the brain's order, 1 = its first choice
    status           text NOT NULL,      -- measured, screened_out, rejected, failed
    chosen           boolean NOT NULL,   -- the agent's proposal (its best candidate)
    proposal_type    text NOT NULL,
    sql_commands     jsonb NOT NULL,
    rollback_commands jsonb NOT NULL,
    settings         jsonb NOT NULL,
    rewritten_query  text,
    rationale        text NOT NULL,
    planner_cost     double precision,
    baseline_cost    double precision,
    note             text NOT NULL DEFAULT '',
    PRIMARY KEY (task_id, agent, rank),
    FOREIGN KEY (task_id, agent) REFERENCES afs_store.agent_executions ON DELETE CASCADE
);

CREATE TABLE afs_store.benchmark_results (
    task_id      text NOT NULL,
    agent        text NOT NULL,
    rank         integer NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('suite', 'parameters')),
    name         text NOT NULL,          -- suite query, or the parameter set's label
    baseline_ms  double precision,
    optimized_ms double precision,
    rows         bigint,
    equivalent   boolean NOT NULL,
    significant  boolean,                -- suite: beats the noise
    slower       boolean,                -- parameter sets: slower than the original
    note         text NOT NULL DEFAULT '',
    FOREIGN KEY (task_id, agent, rank) REFERENCES afs_store.proposals ON DELETE CASCADE
);
CREATE INDEX benchmark_results_task ON afs_store.benchmark_results (task_id);

CREATE TABLE afs_store.consensus_decisions (
    task_id    text PRIMARY KEY REFERENCES afs_store.tasks (id) ON DELETE CASCADE,
    winner     text,
    ranking    jsonb NOT NULL,
    rationale  jsonb NOT NULL,
    confidence double precision NOT NULL,
    scores     jsonb NOT NULL
);

CREATE TABLE afs_store.forks (
    name         text PRIMARY KEY,
    task_id      text NOT NULL REFERENCES afs_store.tasks (id) ON DELETE CASCADE,
    agent        text,
    worker       text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    destroyed_at timestamptz
);
CREATE INDEX forks_task ON afs_store.forks (task_id);
"""),
    Migration(2, "agent assignments: the router's capacity across workers", """
CREATE TABLE afs_store.agent_assignments (
    task_id     text NOT NULL REFERENCES afs_store.tasks (id) ON DELETE CASCADE,
    agent       text NOT NULL,
    assigned_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, agent)
);
"""),
    # the batch job (afs.batch); numbered apart from the service's own migrations
    Migration(100, "batches: the batch job's runs and the statements each optimized", """
CREATE TABLE afs_store.batches (
    id          text PRIMARY KEY,
    origin      text NOT NULL,           -- host:port/database of the target, no password
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    options     jsonb NOT NULL,
    report      jsonb,                   -- afs.batch.report.build_report
    markdown    text
);
CREATE INDEX batches_created ON afs_store.batches (created_at DESC);

CREATE TABLE afs_store.batch_statements (
    batch_id    text NOT NULL REFERENCES afs_store.batches (id) ON DELETE CASCADE,
    queryid     bigint NOT NULL,         -- pg_stat_statements.queryid on the target
    origin      text NOT NULL,
    query       text NOT NULL,
    schema_hash text NOT NULL,           -- of the tables it reads: columns, indexes, statistics
    task_id     text REFERENCES afs_store.tasks (id) ON DELETE SET NULL,
    status      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (batch_id, queryid)
);
CREATE INDEX batch_statements_recent ON afs_store.batch_statements (origin, queryid, created_at DESC);
"""),
    # 200: the apply branch's (afs.apply); far from the service's numbers so that neither clashes
    Migration(200, "audit log of winners applied to target databases (afs apply, afs rollback)", """
CREATE TABLE afs_store.audit (
    id           bigserial PRIMARY KEY,
    task_id      text NOT NULL REFERENCES afs_store.tasks (id) ON DELETE CASCADE,
    action       text NOT NULL CHECK (action IN ('apply', 'rollback')),
    approver     text NOT NULL,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    target       text NOT NULL,      -- the target database, password scrubbed
    tier         text NOT NULL,
    sql_commands jsonb NOT NULL,     -- exactly what ran (or would have), in order
    result       text NOT NULL CHECK (result IN ('applied', 'rolled_back', 'failed', 'refused')),
    detail       text NOT NULL DEFAULT '',
    duration_s   double precision NOT NULL DEFAULT 0,
    rollback_sql jsonb NOT NULL DEFAULT '[]',
    verification jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_task ON afs_store.audit (task_id, id);
"""),
    # 300: the schedule branch's (afs.batch.schedule, `afs batch --since`, `afs batch --server`)
    Migration(300, "schedules and their runs; pg_stat_statements snapshots; the store's identity", """
CREATE TABLE afs_store.schedules (
    id          text PRIMARY KEY,
    dsn         text,                    -- the target as given (NULL: the sandbox's demo database)
    origin      text NOT NULL,           -- host:port/database, no password (what lists show)
    cron        text NOT NULL,           -- five fields, checked by croniter
    timezone    text NOT NULL,           -- an IANA zone the cron expression is read in
    options     jsonb NOT NULL,          -- afs.batch.job.BatchOptions, and `since`
    created_at  timestamptz NOT NULL DEFAULT now(),
    next_run_at timestamptz NOT NULL     -- UTC; missed runs coalesce: it moves past now, once
);

CREATE TABLE afs_store.schedule_runs (
    id          bigserial PRIMARY KEY,
    schedule_id text NOT NULL REFERENCES afs_store.schedules (id) ON DELETE CASCADE,
    due_at      timestamptz NOT NULL,    -- the first due time this run stands for
    missed      integer NOT NULL DEFAULT 0,  -- later due times that passed meanwhile (not run)
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    status      text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'interrupted')),
    runner      text NOT NULL,           -- the afs serve process that ran it
    batch_id    text REFERENCES afs_store.batches (id) ON DELETE SET NULL,
    error       text
);
CREATE INDEX schedule_runs_schedule ON afs_store.schedule_runs (schedule_id, id DESC);

-- pg_stat_statements counters of a target, as read at each batch (`afs batch --since` subtracts)
CREATE TABLE afs_store.statement_snapshots (
    id          bigserial PRIMARY KEY,
    origin      text NOT NULL,
    taken_at    timestamptz NOT NULL,    -- the target server's clock
    stats_reset timestamptz,             -- pg_stat_statements_info.stats_reset then
    batch_id    text REFERENCES afs_store.batches (id) ON DELETE SET NULL
);
CREATE INDEX statement_snapshots_origin ON afs_store.statement_snapshots (origin, taken_at DESC);
CREATE TABLE afs_store.statement_counters (
    snapshot_id bigint NOT NULL REFERENCES afs_store.statement_snapshots (id) ON DELETE CASCADE,
    queryid     bigint NOT NULL,
    calls       bigint NOT NULL,
    total_ms    double precision NOT NULL,
    rows        bigint NOT NULL,
    PRIMARY KEY (snapshot_id, queryid)
);

-- one row: which store this is (`afs batch --server` checks it shares the server's store)
CREATE TABLE afs_store.identity (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    id  text NOT NULL DEFAULT md5(random()::text || clock_timestamp()::text)
);
INSERT INTO afs_store.identity DEFAULT VALUES;
"""),
    # 400: the workload branch's (explicit parameter sets); numbered apart from the others
    Migration(400, "a task's explicit parameter sets (the batch job's filled $1 … $n)", """
ALTER TABLE afs_store.tasks ADD COLUMN parameters jsonb;  -- afs.models.StatementParameters (codec)
"""),
    # 500: every event appended, whoever writes it, wakes the SSE streams that LISTEN (afs.store.listen)
    Migration(500, "events notify their channel (LISTEN/NOTIFY wakes the live event streams)", f"""
CREATE FUNCTION afs_store.notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{EVENTS_CHANNEL}', NEW.task_id);  -- sent at commit; one per task per transaction
    RETURN NULL;
END $$;
CREATE TRIGGER events_notify AFTER INSERT ON afs_store.events
    FOR EACH ROW EXECUTE FUNCTION afs_store.notify_event();
"""),
    # 600: a task run by the command that started it (`afs optimize`, `afs batch`, `afs resume`)
    # is not the queue's: when that process dies, the task is interrupted, not run again unasked
    Migration(600, "tasks run in the process that started them; the interrupted status", """
ALTER TABLE afs_store.tasks ADD COLUMN in_process boolean NOT NULL DEFAULT false;
ALTER TABLE afs_store.tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE afs_store.tasks ADD CONSTRAINT tasks_status_check CHECK (status IN ('queued', 'running',
    'recovering', 'completed', 'no_improvement', 'failed', 'cancelled', 'interrupted'));
"""),
    # 700: the apply branch's; a verified index drop (`afs apply --drop-index`) is audited without a task
    Migration(700, "audit rows of index drops: a kind, the index, no task", """
ALTER TABLE afs_store.audit ALTER COLUMN task_id DROP NOT NULL;
ALTER TABLE afs_store.audit ADD COLUMN kind text NOT NULL DEFAULT 'winner'
    CHECK (kind IN ('winner', 'drop_index'));
ALTER TABLE afs_store.audit ADD COLUMN subject text;  -- a drop's index, schema-qualified and quoted
ALTER TABLE afs_store.audit ADD CONSTRAINT audit_kind_subject
    CHECK (kind = 'winner' AND task_id IS NOT NULL OR kind = 'drop_index' AND subject IS NOT NULL);
"""),
)
