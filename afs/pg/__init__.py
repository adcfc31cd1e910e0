"""PostgreSQL vocabulary: plain functions over names, plans and statistics (pure).

    names.py   identifiers and object names: `ident` (bare when it can be), `quote_ident`
               (always quoted), `qualified` / `quote_qualified` for "schema.name",
               `quote_literal`, `object_name` and `index_name` (63 bytes at most)
    plan.py    EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON): the document's plan and time,
               shared buffers, `plan_nodes` (flattened, totals over loops),
               `plan_insights`, and `plan_text` (the plan as one line per node, within a token budget)
    bottleneck.py  where a plan's time goes, as something a design can remove: `Bottleneck`
               (kind, table, columns, node, share, detail, loops) and `bottlenecks(plan, analysed)`
    stats.py   pg_stats arithmetic: `equality_selectivity`, `range_fraction`,
               `prefix_fraction`, `like_prefix`, `parse_timestamp`; column types,
               widths and index size estimates
    functions.py names of aggregates sqlglot leaves anonymous, set-returning functions
    settings.py  the settings that shape plans: which a fork takes over from the user's server
                 (`carry`, `alter_database_sql`) and which it cannot (`server_gaps`)

Nothing here talks to a server, and nothing imports the rest of afs but its models.
"""
