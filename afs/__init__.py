"""AFS — Agentic Fork Squad: make slow PostgreSQL queries fast by experiment.

Layering (lower layers never import higher ones):

    pure core     models, config, errors, features, router, safety, suite, strategists,
                  consensus, report, forks.naming, sandbox.demo
    I/O edges     db (psycopg under trio), sandbox.server (pg_ctl), sandbox.seeding,
                  sandbox.importer, forks.provider, forks.server (MCP), forks.client (MCP),
                  analysis and bench (SQL in a fork), events, display
    workflow      agents (one agent: fork → analyse → propose → validate → benchmark),
                  optimize (one task: route, one nursery, consensus)
    entry points  cli, __main__
"""

__version__ = "0.1.0"
