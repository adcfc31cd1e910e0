"""The query read once per task (pure).

    text.py      input limits (check_input), the one query in a text (select_text), the one
                 sqlglot reading (parse_query, counted in PARSES), the one pglast walker (walk)
    query.py     Query: pglast's check + sqlglot's tree + scopes + the one column resolver
    features.py  what the router counts (QueryFeatures), and the tables behind views
    shape.py     what the strategists read: predicates, disjunctions, sort keys (QueryShape)
    opclasses.py the index kind from the catalog: the query's WHERE and ORDER BY terms, and the
                 access method and operator class that serve each (from OperatorSupport rows)
"""
