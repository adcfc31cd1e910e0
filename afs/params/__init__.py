"""The query's family (pure): other values for its literals and its parameters, drawn from
pg_stats, and written into any query of the family.

    family.py  parameter_sets (other values for the literals of a query, read once as a
               Query), apply_parameters (a set written into the original, a suite variant or
               a rewrite), baked_literals and stored_rows (a view that caches today's answer)
    fill.py    the `$n` filling: a normalised statement's parameters filled from the pg_stats
               of the columns they are compared with (afs.batch.fill runs it on the target)

Both read the statistics one way (afs.pg.stats: most common values by frequency, quantiles
of the histogram) and find a column's table through the one resolver (afs.query).
"""
