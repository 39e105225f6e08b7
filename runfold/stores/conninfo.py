"""PostgreSQL connection strings, read by libpq's own parser (`psycopg.conninfo`), never echoed.

A connection string may carry a password in four places: the URL's userinfo
(`postgresql://user:secret@host/db`), a `?password=` parameter, a `password=` keyword of a
libpq keyword string, and the `PGPASSWORD` environment variable. Everything runfold prints or
raises about a PostgreSQL store goes through `describe` (a label without the password) or
`scrub` (a message with every known form of the password replaced by `***`).

psycopg is imported on first use: it is the optional `postgres` extra, and the command line
describes a store URL before it knows whether the driver is installed.
"""

from __future__ import annotations

import contextlib
import os
import re
from urllib.parse import parse_qsl, quote, quote_plus, urlencode, urlsplit, urlunsplit

__all__ = ["MASK", "check", "describe", "scrub", "secrets", "split_schema"]

MASK = "***"
"""What a password is replaced with."""

_SCHEMES = ("postgresql", "postgres")
# libpq's parse errors quote the fragment they stumbled on, which can be part of the password
# (`missing "=" after "cret"`, `invalid percent-encoded token: "p%zzsecret"`); the input cannot
# be parsed, so the password cannot be told apart from the rest: every quoted fragment goes.
_QUOTED = re.compile(r'"[^"]*"')


def split_schema(dsn: str) -> tuple[str, str | None]:
    """A URL `dsn` without its `schema` query parameter (not one libpq knows), and its value."""
    parts = urlsplit(dsn)
    if parts.scheme not in _SCHEMES or not parts.query:
        return dsn, None
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    named = [value for key, value in pairs if key == "schema"]
    if not named:
        return dsn, None
    query = urlencode([(key, value) for key, value in pairs if key != "schema"])
    return urlunsplit(parts._replace(query=query)), named[-1]


def check(dsn: str) -> dict[str, str]:
    """The keywords of `dsn` (without its `schema`) as libpq reads them.

    Raises `ValueError` naming what libpq refused, with every quoted fragment of its message
    withheld (it could be part of the password).
    """
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        keywords = conninfo_to_dict(split_schema(dsn)[0])
    except ProgrammingError as exc:
        reason = " ".join(_QUOTED.sub('"…"', str(exc)).split())
    else:
        return {key: str(value) for key, value in keywords.items()}
    # Raised out here, so that libpq's error is not even kept as the context.
    raise ValueError(f"not a valid PostgreSQL connection string: {reason}")


def secrets(dsn: str) -> tuple[str, ...]:
    """Every text form of a password `dsn` or `PGPASSWORD` holds (as given and as decoded)."""
    found: set[str] = set()
    with contextlib.suppress(ValueError, ImportError):  # unparsable: only its raw forms below
        found.add(check(dsn).get("password", ""))
    found.add(os.environ.get("PGPASSWORD", ""))
    try:
        netloc, query = urlsplit(dsn)[1:4:2]
    except ValueError:  # a malformed URL (an unclosed `[::1`): its parts found by hand
        rest = dsn.partition("://")[2]
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        query = rest.partition("?")[2].partition("#")[0]
    if netloc or query:
        # The raw forms of the URL, in case a message quotes the URL itself.
        userinfo = netloc.rpartition("@")[0]
        if ":" in userinfo:
            found.add(userinfo.partition(":")[2])
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key == "password":
                found.add(value)
    for secret in list(found):
        found.update((quote(secret, safe=""), quote_plus(secret)))
    found.discard("")
    return tuple(sorted(found, key=len, reverse=True))  # longest first: no partial leftovers


def scrub(text: str, dsn: str) -> str:
    """`text` with every form of the password of `dsn` (or `PGPASSWORD`) replaced by `***`."""
    for secret in secrets(dsn):
        text = text.replace(secret, MASK)
    return text


def _host(host: str) -> str:
    """A host as a URL shows it: an IPv6 address in brackets, a socket folder quoted."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return quote(host, safe="[]:")


def describe(dsn: str) -> str:
    """`dsn` as a URL to show people: user, host, port, database and options, no password.

    A libpq keyword string is shown in URL form too; one libpq cannot parse is not shown.
    Several hosts are shown each with its port (`host=a,b port=5432,5433` as `a:5432,b:5433`).
    """
    try:
        keywords = check(dsn)
    except ValueError:
        return "postgresql://(a connection string libpq cannot parse)"
    except ImportError:  # no psycopg: nothing can read the string, so nothing of it is shown
        return "postgresql://(not shown: runfold[postgres] is not installed)"
    user = quote(keywords.pop("user", ""), safe="")
    if keywords.pop("password", None) is not None:
        user = f"{user}:{MASK}"
    hosts = keywords.pop("host", "").split(",")
    ports = keywords.pop("port", "").split(",")
    if len(ports) == 1:  # one port (or none) for every host
        ports *= len(hosts)
    elif len(ports) != len(hosts):  # libpq refuses this when it connects: shown as given
        keywords["port"] = ",".join(ports)
        ports = [""] * len(hosts)
    netloc = (f"{user}@" if user else "") + ",".join(
        _host(host) + (f":{port}" if port else "") for host, port in zip(hosts, ports, strict=True)
    )
    database = quote(keywords.pop("dbname", ""), safe="")
    schema = split_schema(dsn)[1]
    options = sorted(keywords.items()) + ([("schema", schema)] if schema is not None else [])
    return urlunsplit(("postgresql", netloc, f"/{database}" if database else "", "", "")) + (
        f"?{urlencode(options)}" if options else ""
    )
