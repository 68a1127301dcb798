"""``DATABASE_URL``: checked before use, described without its password, and scrubbed from every
error message.

libpq echoes the connection string in some of its errors (``missing "=" after
"mysql://root:pw@..."``) and, when an ``@`` in a password is not percent-encoded, takes the rest
of the password for the host name and prints that (``failed to resolve host 'pw@db'``). So a URL
is checked here first, with messages of our own that quote no part of it, and any text that
goes to a person passes through :func:`scrub`, which removes the URL, its password and every
fragment of the part before the host that could be one.
"""

from __future__ import annotations

import os
import re

import psycopg
from psycopg import conninfo

from sync.errors import DatabaseUnavailable

POSTGRES_SCHEMES = ("postgresql", "postgres")
REDACTED = "[redacted]"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_KEYWORD_PASSWORD = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)")
_QUOTED = re.compile(r'"[^"]*"')
_MIN_FRAGMENT = 3  # shorter fragments would scrub innocent text


def check(url: str) -> dict[str, str]:
    """The parsed connection parameters of ``url``, or :class:`DatabaseUnavailable` with a
    one-line message that says what is wrong and quotes nothing that could be a secret."""
    scheme = _SCHEME.match(url)
    if scheme and scheme.group(1).lower() not in POSTGRES_SCHEMES:
        shown = scheme.group(1) if len(scheme.group(1)) <= 20 else "another"
        raise DatabaseUnavailable(
            f"DATABASE_URL must be a postgresql:// URL, not a {shown}:// one; write it as "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        )
    try:
        params = _params(url)
    except psycopg.ProgrammingError as exc:
        reason = _QUOTED.sub("…", str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        raise DatabaseUnavailable(
            f"DATABASE_URL is not a valid Postgres URL ({scrub(reason, url)}); write it as "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or as key=value pairs such as "
            "'host=HOST dbname=DATABASE user=USER'"
        ) from None
    if "@" in params.get("host", "") or any(c in params.get("user", "") for c in ":@"):
        raise DatabaseUnavailable(
            "DATABASE_URL's user name or host holds an '@' or ':' (an '@' in the password not "
            "written %40, or the ':' before the password written %3A); percent-encode '@' and "
            "':' inside the user name and password only"
        )
    port = params.get("port", "5432")
    if not all(part.isdigit() and 0 < int(part) < 65536 for part in port.split(",")):
        raise DatabaseUnavailable(
            "the port in DATABASE_URL must be a number from 1 to 65535 (percent-encode any "
            "'/', '@' or ':' in the password)"
        )
    return params


def is_valid(url: str) -> bool:
    try:
        check(url)
    except DatabaseUnavailable:
        return False
    return True


def describe(url: str) -> str:
    """The URL without its password, for messages: ``postgresql://user@host:port/db``, and
    where libpq connects when it names no host: ``$PGHOST``, else a Unix socket in its default
    directory (not ``localhost``, which would mean TCP)."""
    try:
        params = check(url)
    except DatabaseUnavailable:
        return "an invalid DATABASE_URL"
    user = f"{params['user']}@" if params.get("user") else ""
    dbname = params.get("dbname", "")
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST", "")
    if not host:
        return f"postgresql://{user}/{dbname} on the local socket"
    if host.startswith("/"):  # a Unix socket directory
        return f"postgresql://{user}/{dbname}?host={host}"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    return f"postgresql://{user}{host}:{port}/{dbname}"


def secrets_in(url: str) -> list[str]:
    """Every part of ``url`` that could be a password, longest first: the parsed password, the
    pieces of what stands before the host (a password with an unencoded '@' or ':' splits
    there), or of a keyword string's password value, and the URL itself when it holds one of
    them or cannot be parsed. A URL without a password holds no secret: it stays readable in
    the errors that quote it."""
    found: set[str] = set()
    try:
        params = _params(url)
    except psycopg.ProgrammingError:
        params = {}
        found.add(url)
    found.add(params.get("password") or "")
    # A password that libpq took for part of the user name or of the host.
    found.add(params.get("user", "").partition(":")[2])
    found.add(params.get("host", "").rpartition("@")[0])
    if _SCHEME.match(url):
        rest = url.split("://", 1)[1]
        authority = rest.split("?", 1)[0]
        userinfo = authority.rsplit("@", 1)[0] if "@" in authority else ""
        _, colon, secret = userinfo.partition(":")
        if colon or "@" in userinfo:  # a password, or a user name that swallowed one
            found.update(re.split(r"[:@/]", secret or userinfo))
            found.update((secret, userinfo))
    for match in _KEYWORD_PASSWORD.finditer(url):
        value = match.group(1).strip("'")
        found.update((value, *value.split()))
    found.discard("")
    if found:
        found.add(url)
    return sorted((s for s in found if len(s) >= _MIN_FRAGMENT), key=len, reverse=True)


def _params(url: str) -> dict[str, str]:
    return {k: str(v) for k, v in conninfo.conninfo_to_dict(url).items() if v is not None}


def scrub(text: str, url: str | None) -> str:
    """``text`` with every possible secret of ``url`` replaced."""
    if not url:
        return text
    for secret in secrets_in(url):
        text = text.replace(secret, REDACTED)
    return text
