"""Secrets stay secret (issue 23, items 7-9): passwords scrubbed in every form libpq accepts,
never on a child's command line, the fork server over HTTP guarded by a token always.

The scrubbing tests are property-style: many passwords full of the characters that end a
value somewhere (spaces, quotes, backslashes, `@ / : % & = ? #`), each written in every form
libpq reads, checked against libpq's own parser (psycopg.conninfo) before and after.
"""

from __future__ import annotations

import itertools
import json
import secrets
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from afs.errors import MASK, AfsError, DatabaseError, scrub

SPECIAL = ["", " ", "'", "\\", "\\'", "@", "/", ":", "%", "%40", "&", "=", "?", "#", " x=y ", "é",
           "'; host=evil", "\"", "\t"]


def passwords() -> list[tuple[str, str, str]]:
    """(password, its first distinctive part, its last): both parts must vanish."""
    found = []
    for special in SPECIAL:
        head, tail = "H" + secrets.token_hex(5), "T" + secrets.token_hex(5)
        found.append((f"{head}{special}{tail}", head, tail))
    return found


def _unquoted(value: str) -> str:
    """libpq's unquoted value: a backslash escapes the next character (white space, quotes)."""
    return "".join("\\" + c if c in " \t\\'" else c for c in value)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def forms(password: str, key: str = "password") -> list[str]:
    """One password written every way libpq accepts it."""
    encoded = quote(password, safe="")
    found = [
        f"host=db.example port=5433 user=app {key}={_unquoted(password)} dbname=shop",
        f"host=db.example user=app {key} = {_quoted(password)} dbname=shop",
        f"{key}={_quoted(password)}",
        make_conninfo("", host="db.example", user="app", dbname="shop", **{key: password}),
        f"postgresql://app@db.example:5433/shop?{key}={encoded}",
        f"postgres://db.example/shop?sslmode=prefer&{quote(key, safe='').replace('o', '%6F')}={encoded}",
    ]
    if key == "password":
        found += [f"postgresql://app:{encoded}@db.example:5433/shop",
                  f"postgres://app:{encoded}@db.example/shop?sslmode=prefer",
                  f"postgresql://app:{encoded}@[::1]:5433,db2.example/shop?target_session_attrs=any"]
    return found


CASES = [(form, head, tail, key)
         for (password, head, tail), key in itertools.product(passwords(), ("password", "sslpassword",
                                                                             "oauth_client_secret"))
         for form in forms(password, key)]


@pytest.mark.parametrize(("dsn", "head", "tail", "key"), CASES)
def test_scrub_leaves_no_password_in_any_form_libpq_reads(dsn: str, head: str, tail: str, key: str) -> None:
    parsed = conninfo_to_dict(dsn)
    assert head in str(parsed[key]) and tail in str(parsed[key])  # the form is what libpq reads
    shown = scrub(dsn)
    assert head not in shown and tail not in shown, shown
    # the driver reads the scrubbed text as the same connection string, the secret masked
    assert conninfo_to_dict(shown) == {**parsed, key: MASK}
    # in free text (an error message quoting it), in quotes, and through AfsError
    for text in (f"connection to {dsn} failed: FATAL: no", f"bad DSN '{dsn}' (see --help)",
                 json.dumps({"dsn": dsn, key: parsed[key]}), repr({key: parsed[key], "dsn": dsn}),
                 f"{dsn}\n{dsn}"):
        for out in (scrub(text), str(AfsError(text))):
            assert head not in out and tail not in out, out


@pytest.mark.parametrize(("password", "head", "tail"), passwords())
def test_scrub_hides_passwords_in_uris_of_any_scheme_spelling(password: str, head: str, tail: str) -> None:
    encoded = quote(password, safe="")
    for scheme in ("postgresql", "postgres", "POSTGRESQL", "PostgreS", "pgsql", "jdbc:postgresql"):
        for text in (f"{scheme}://app:{encoded}@db/shop", f"at {scheme}://app:{encoded}@db:1/shop failed",
                     f"{scheme}://app:{password}@db/shop"):
            shown = scrub(text)
            assert tail not in shown and encoded not in shown, shown


def test_libpq_complaints_about_a_dsn_do_not_quote_its_password() -> None:
    """libpq's parser errors quote what it could not read: the userinfo, or the whole URI."""
    secret = "Sx" + secrets.token_hex(6)
    for bad in (f"postgresql://app:{secret} pw@db/shop", f"POSTGRESQL://app:{secret}@db/shop",
                f"host=db password='{secret}", f"postgresql://db/shop?password={secret}%zz",
                f"postgresql://app:{secret}@db/shop?nonsense=1", f"host=db {secret}"):
        with pytest.raises(psycopg.ProgrammingError) as caught:
            conninfo_to_dict(bad)
        assert secret not in scrub(str(caught.value)), str(caught.value)
        assert secret not in str(DatabaseError(str(caught.value)))


def test_scrub_keeps_what_holds_no_password() -> None:
    for text in ("postgresql://app@db:5433/shop?sslmode=require", "host=/tmp/afs port=5432 dbname=x",
                 'password authentication failed for user "bob"', "refused SQL (writes): DELETE FROM t",
                 "", "postgresql://bob:***@host/db"):
        assert scrub(text) == text
    assert scrub("postgresql://bob:hunter2@host/db") == "postgresql://bob:***@host/db"  # a URI stays one
