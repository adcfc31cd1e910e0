"""A task request's one check, shared by the command line (`afs optimize`) and the API
(`POST /v1/tasks`): whoever asks, the same query is refused for the same reason, before
anything is stored, forked or started. (The request itself is afs.optimize.TaskRequest.)

    read_query(sql) -> (query, features)   the query as AFS reads it, or InputError:
        text      check_text: Unicode that UTF-8 can carry (no lone surrogate: a command
                  line's undecodable bytes, a JSON "\\ud800" without its pair), no NUL
        limits    afs.features.check_input: at most MAX_QUERY_BYTES, MAX_QUERY_DEPTH deep,
                  no parameters ($1)
        safety    afs.safety.check_query: one read-only SELECT
        features  afs.features.extract_features, reading at least one table

CPU-bound: a query at the size limit takes a second or two to read. Trio code calls
`read_query` in a worker thread (`trio.to_thread.run_sync`), never on the event loop: the
command line before it starts anything, the service under a CapacityLimiter of its own so
that parsing never holds up its other routes. The service also bounds the body it reads
(afs.asgi.guard_requests, AFS_SERVICE_MAX_BODY) before any of this sees it.
"""

from __future__ import annotations

from afs.errors import InputError
from afs.models import QueryFeatures
from afs.query.features import extract_features
from afs.query.text import check_input
from afs.safety import check_query


def check_text(text: str, what: str = "the query") -> None:
    """InputError when `text` holds a lone surrogate (it is not text UTF-8 can carry) or a
    NUL character (PostgreSQL's text cannot hold one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} is not valid UTF-8: character {exc.start + 1} is a lone surrogate "
                         f"(U+{ord(text[exc.start]):04X}: a byte that is not UTF-8, or half of a "
                         "\\ud800-style pair)") from None
    if "\0" in text:
        raise InputError(f"{what} holds a NUL character (character {text.index(chr(0)) + 1}), "
                         "which PostgreSQL text cannot hold")


def read_query(sql: str) -> tuple[str, QueryFeatures]:
    """The query to optimize and its features, or InputError: not UTF-8 text, too large or too
    deep to read, parameters, not one read-only SELECT, no table."""
    check_text(sql)
    check_input(sql)
    query = check_query(sql)
    features = extract_features(query)
    if not features.tables:
        raise InputError("the query reads no table: there is nothing to optimize")
    return query, features

