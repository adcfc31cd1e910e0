"""Ask postgres-mcp's index tuning for its advice on one query; run in the peer's own venv.

    PEER_VENV/bin/python benchmarks/peer_postgres_mcp.py DSN QUERY

This is what postgres-mcp's MCP tool `analyze_query_indexes` (method "dta", the default) runs:
`TextPresentation(driver, DatabaseTuningAdvisor(driver)).analyze_queries([query])`, over the
same SqlDriver, in its unrestricted mode (the database is a private cluster made for it, and
HypoPG's hypothetical indexes change nothing). Prints one JSON object:
{"indexes": [CREATE INDEX …], "summary": {…}} or {"error": "…"}.

It imports postgres-mcp (Python >= 3.12, its own dependencies): benchmarks/peer_setup.sh
installs it in a virtualenv of its own; AFS's environment never imports this file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any


async def advise(dsn: str, query: str) -> dict[str, Any]:
    from postgres_mcp.index.dta_calc import DatabaseTuningAdvisor
    from postgres_mcp.index.presentation import TextPresentation
    from postgres_mcp.sql import DbConnPool, SqlDriver

    os.environ.setdefault("POSTGRES_MCP_INCLUDE_LANGFUSE_TRACE", "false")
    pool = DbConnPool(dsn)
    await pool.pool_connect()
    try:
        driver = SqlDriver(conn=pool)
        tool = TextPresentation(driver, DatabaseTuningAdvisor(driver))
        result = await tool.analyze_queries(queries=[query])
    finally:
        await pool.close()
    if "error" in result:
        return {"error": str(result["error"])}
    recommendations = result.get("recommendations")
    if not isinstance(recommendations, list):  # "No index recommendations found."
        return {"indexes": [], "summary": str(recommendations)}
    return {"indexes": [r["index_definition"] for r in recommendations],
            "summary": result.get("summary", {})}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: peer_postgres_mcp.py DSN QUERY", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        out = asyncio.run(advise(argv[1], argv[2]))
    except Exception as exc:  # the peer's own failure, reported as its answer
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
