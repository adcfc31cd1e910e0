"""AFS — Agentic Fork Squad: make slow PostgreSQL queries fast by experiment.

Layering (lower layers never import higher ones):

    pure core     models, config, errors, pg (names, plan, stats), features, router,
                  safety, suite, brains.strategists, brains.gemini.parsing, consensus,
                  report, forks.naming, sandbox.demo
    I/O edges     db (psycopg under trio), sandbox.server (pg_ctl), sandbox.seeding,
                  sandbox.importer, forks.provider, forks.server (MCP), forks.client (MCP),
                  analysis and bench (SQL in a fork), conditions (the user's settings,
                  plan and tables against the forks'), events, display,
                  target (the one path of a query to a user's database: checked, then
                  read-only as a low-privilege role), brains (Brain, Squad), brains.gemini
                  (the model client and brain)
    workflow      agents (one agent: fork → analyse → propose → validate → benchmark),
                  optimize (one task: route, one nursery, consensus)
    entry points  cli, __main__
"""

__version__ = "0.1.0"
