"""AFS — Agentic Fork Squad: make slow PostgreSQL queries fast by experiment.

Layering (lower layers never import higher ones):

    pure core     config, errors, forks.naming, sandbox.demo
    I/O edges     db (psycopg under trio), sandbox.server (pg_ctl), sandbox.seeding,
                  sandbox.importer, forks.provider, forks.server (MCP), forks.client (MCP)
    entry points  cli, __main__
"""

__version__ = "0.1.0"
