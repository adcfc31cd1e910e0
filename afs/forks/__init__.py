"""Forks: disposable copies of a database, made through an MCP server.

    provider.py  the local fork provider: CREATE DATABASE … TEMPLATE, roles, catalog, gc
    server.py    `afs mcp serve`: the provider behind the MCP tools service_list,
                 service_get, service_fork and service_delete (stdio, under trio; or
                 streamable HTTP, always behind a bearer token)
    token.py     that token when none is configured: made once, kept in AFS_HOME (0600)
    client.py    `open_fork_client()` / `open_fork()`: the MCP client side, leak-proof
"""

from afs.forks.client import Fork, ForkClient, open_fork, open_fork_client

__all__ = ["Fork", "ForkClient", "open_fork", "open_fork_client"]
