"""Function names PostgreSQL knows and sqlglot does not classify (pure).

    ANONYMOUS_AGGREGATES   aggregates sqlglot parses as anonymous functions
    SET_RETURNING          set-returning functions: in a select list they multiply rows
"""

from __future__ import annotations

# PostgreSQL aggregates sqlglot parses as anonymous functions.
ANONYMOUS_AGGREGATES = frozenset({
    "jsonb_agg", "jsonb_agg_strict", "json_agg_strict", "json_object_agg", "jsonb_object_agg_strict",
    "every", "xmlagg", "bit_or", "bit_xor", "range_agg", "range_intersect_agg", "any_value",
    "array_agg", "string_agg", "covar_pop", "covar_samp", "stddev_pop", "stddev_samp", "var_pop",
    "var_samp", "regr_count", "regr_avgx", "regr_avgy", "regr_intercept", "regr_r2", "regr_sxx",
    "regr_sxy", "regr_syy",
})
# Set-returning functions: in a select list they multiply rows.
SET_RETURNING = frozenset({
    "unnest", "generate_series", "generate_subscripts", "jsonb_array_elements",
    "jsonb_array_elements_text", "json_array_elements", "json_array_elements_text", "jsonb_each",
    "jsonb_each_text", "json_each", "json_each_text", "jsonb_object_keys", "json_object_keys",
    "jsonb_path_query", "jsonb_to_recordset", "json_to_recordset", "jsonb_populate_recordset",
    "json_populate_recordset", "regexp_matches", "regexp_split_to_table", "string_to_table",
    "explode", "exploding_generate_series",
})
