"""The batch job: the statements that cost a database the most, filled and optimized.

    statements.read_workload  pg_stat_statements of the target database, ranked, filtered
    fill.fill_statement       $1 … $n filled from pg_stats, screened with EXPLAIN (GENERIC_PLAN);
                              every plan through afs.target.on_target (checked, read-only)
    job.run_batch             one stored task per statement, deduplicated; the batch report
    report                    the report: per statement, the indexes merged, what is unsolved
"""
