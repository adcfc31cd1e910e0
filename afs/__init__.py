"""AFS — Agentic Fork Squad: make slow PostgreSQL queries fast by experiment.

The rooms, from the bottom up: a room imports only rooms listed above it, never one below
(tests/test_core.py holds this map to the code: every module and folder of afs is listed
once, every listed one exists, no import runs upward, and the pure core imports no I/O).

pure core: no server, no trio, no network
    errors      the one error tree, its exit codes; scrub hides passwords in messages
    models      the frozen dataclasses every room passes around; the Literals of the choices
    config      Settings: the only reader of the environment, settings.yaml and the rules file
    pg/         PostgreSQL vocabulary: names, plans, statistics, settings, functions
    query/      the query read once per task: text (limits, the walker), Query, features, shape
    safety/     the validator: what a proposal may run, and what it creates
    consensus   the measured candidates ranked: scorers, adjustments, gates
    report      a task's report, as text and JSON
    params/     the query family and the `$n` filling from pg_stats
    suite       the four-query suite a proposal is measured with
    router      which agents a task gets (routing_rules.yaml) and the consensus weights
    task        a task request's one check (limits, choices, runs, weights), for the CLI and the API
I/O edges
    log         structured logs (structlog): stderr and $AFS_HOME/logs
    events      a task's events: emitters and sinks
    display     the live view of `afs optimize` (events on a terminal)
    asgi        what AFS's HTTP servers share: bind checks, the token, the request guard, JSON bodies
    db          psycopg under trio: connections, run_in_thread with server-side cancel
    locks       advisory locks
    catalog     the second safety layer: a proposal against the real catalog, rolled back
    analysis    SQL in a fork: EXPLAIN, table statistics, server facts
    target      the one path of a query to a user's database: checked, then read-only as a
                low-privilege role
    conditions  the user's settings, plan and tables against the forks'
    forks/      fork names, the provider (PostgreSQL), the MCP fork server and client, limits
    sandbox/    the embedded PostgreSQL (pg_ctl), demo data, imports, copy-on-write, workload
    brains/     Brain, Squad; strategists/ (offline rules over one query); gemini/ (the model)
    bench       the measuring loop in a fork
    replay      statements replayed in a fork with and without some indexes, rolled back
    store/      the task store in PostgreSQL: tasks, events, results, leases
workflow
    agents      one agent: fork → analyse → propose → validate → benchmark
    optimize    one task: route, one nursery, consensus
    testing     the fakes that ship (brains, FakeGemini) and the CLI in a subprocess
wings
    service/    the task API's routes, the task runner, workers, the service's client
    batch/      the target's costliest statements, one task each; their schedules
    apply/      a winner applied after approval, its rollback, the audit log, the apply route
    web/        the execution monitor: its pages and the JSON they read
entry points
    serve       `afs serve` assembled: API, monitor, apply route, workers, recovery, schedules
    cli/        the `afs` command line, one module per command group, and output
    __main__    `python -m afs`
"""

__version__ = "0.1.0"
