"""Redis URLs: the one redaction for printing, TLS defaults, and secrets kept off argv.

Pure stdlib (the producer uses it too). Every URL that reaches a log line, an error
message or `gradefleet status` goes through `redact_url`; every URL a process
connects with goes through `connect_url` at its entry point.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from workers.errors import ConfigError

__all__ = ["REDACTED", "connect_url", "read_secret", "redact_url"]

REDACTED = "***"
# Query parameters that carry a credential (redis-py reads `password`, Sentinel
# set-ups `sentinel_password`): any whose name contains one of these is redacted.
_SECRET_PARAMS = ("password", "passwd", "secret", "token")
_TLS_SCHEMES = frozenset({"rediss"})


def redact_url(url: str) -> str:
    """`url` with every credential replaced by `***` (safe to print and log).

    Covers the userinfo (`user:pass@`, `:pass@`) and query parameters such as
    `?password=`; an unparsable URL is not echoed at all.
    """
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if has_password:
        host = netloc.rsplit("@", 1)[1]
        netloc = f"{parts.username or ''}:{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, REDACTED if _is_secret(k) else v) for k, v in pairs], safe="*/"
        )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_PARAMS)


def connect_url(url: str, *, password: str | None = None) -> str:
    """The URL a client connects with: `password` inserted (when the URL has none)
    and, for `rediss://`, certificates verified unless the URL says otherwise
    (`ssl_cert_reqs=required`; Celery's result backend refuses a `rediss://` URL
    without the parameter, which used to crash the worker at start).

    Raises:
        ConfigError: the URL cannot be parsed.
    """
    try:
        parts = urlsplit(url)
        url_password = parts.password
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {redact_url(url)}: {exc}") from exc
    if password and url_password is None:
        host = parts.netloc.rsplit("@", 1)[-1]
        user = quote(parts.username or "", safe="")
        parts = parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}")
    if parts.scheme.lower() in _TLS_SCHEMES:
        query = parse_qsl(parts.query, keep_blank_values=True)
        if not any(name == "ssl_cert_reqs" for name, _ in query):
            query.append(("ssl_cert_reqs", "required"))
            parts = parts._replace(query=urlencode(query, safe="/"))
    return urlunsplit(parts)


def read_secret(environ: Mapping[str, str], name: str) -> str | None:
    """A secret from `$NAME`, or from the file named by `$NAME_FILE` (one trailing
    newline dropped), or None: never from the command line, where `ps` shows it.

    Raises:
        ConfigError: both are set, or the file cannot be read.
    """
    value = environ.get(name) or None
    path = environ.get(f"{name}_FILE") or None
    if value is not None and path is not None:
        raise ConfigError(f"set {name} or {name}_FILE, not both")
    if path is None:
        return value
    try:
        text = Path(os.path.expanduser(path)).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{name}_FILE: cannot read {path}: {exc}") from exc
    return text.removesuffix("\n").removesuffix("\r") or None
