"""Redis URLs: the one redaction for printing, TLS defaults, secrets kept off argv,
and the `sentinel://` form.

Pure stdlib (the producer uses it too). Every URL that reaches a log line, an error
message or `gradefleet status` goes through `redact_url`; every URL a process
connects with goes through `connect_url` at its entry point; `workers.wire.connections`
turns it into a client.

A Sentinel URL names the sentinels and the master they watch, in one string (an env
var, one `--broker` option):

    sentinel://[[user]:password@]host1:26379[,host2:26379...][/db]?master_name=NAME
        [&sentinel_password=...]

`password` (and `user`) authenticate to the master and replicas, as in `redis://`;
`sentinel_password` to the sentinels themselves (their `requirepass`), when set.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from workers.errors import ConfigError

__all__ = [
    "REDACTED",
    "SENTINEL_SCHEME",
    "SentinelUrl",
    "connect_url",
    "is_loopback_url",
    "is_sentinel_url",
    "parse_sentinel_url",
    "read_secret",
    "redact_url",
]

REDACTED = "***"
# Query parameters that carry a credential (redis-py reads `password`, Sentinel
# set-ups `sentinel_password`): any whose name contains one of these is redacted.
_SECRET_PARAMS = ("password", "passwd", "secret", "token")
_TLS_SCHEMES = frozenset({"rediss"})
SENTINEL_SCHEME = "sentinel"
DEFAULT_SENTINEL_PORT = 26379
# The query parameters a Sentinel URL takes; any other is refused rather than ignored.
_SENTINEL_PARAMS = frozenset({"master_name", "sentinel_password"})


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


def is_loopback_url(url: str) -> bool:
    """True when every host `url` names is this machine (`localhost`, 127.0.0.0/8,
    `::1`; no host: redis-py's localhost) or it is a Unix socket. Decided from the
    text alone, no DNS lookup: any other name (`broker`, `redis.internal`) counts as
    another machine, and so does a URL that does not parse."""
    try:
        parts = urlsplit(url)
        if parts.scheme.lower() == "unix":
            return True
        if is_sentinel_url(url):
            hosts = [host for host, _ in parse_sentinel_url(url).sentinels]
        else:
            hosts = [parts.hostname or "localhost"]
    except (ValueError, ConfigError):
        return False
    return all(_is_loopback_host(host) for host in hosts)


def _is_loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class SentinelUrl:
    """A parsed `sentinel://` URL (see the module docstring)."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() == SENTINEL_SCHEME


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The sentinels, master name, db and credentials of a `sentinel://` URL.

    Raises:
        ConfigError: not a Sentinel URL, no host, a bad port or db, no
            `master_name`, or a query parameter it does not know.
    """
    where = redact_url(url)
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError as exc:
        raise ConfigError(f"invalid Sentinel URL {where}: {exc}") from exc
    if parts.scheme.lower() != SENTINEL_SCHEME:
        raise ConfigError(f"not a sentinel:// URL: {where}")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - _SENTINEL_PARAMS)
    if unknown:
        raise ConfigError(f"{where}: unknown parameter(s) {', '.join(unknown)}")
    master_name = query.get("master_name", "")
    if not master_name:
        raise ConfigError(f"{where}: add ?master_name=<the name sentinels monitor>")
    hosts = parts.netloc.rsplit("@", 1)[-1]
    sentinels = tuple(_host_port(h, where) for h in hosts.split(",") if h)
    if not sentinels:
        raise ConfigError(f"{where}: no sentinel host")
    db_text = parts.path.strip("/") or "0"
    if not db_text.isdigit():
        raise ConfigError(f"{where}: the database must be a number, not {db_text!r}")
    return SentinelUrl(
        sentinels=sentinels,
        master_name=master_name,
        db=int(db_text),
        username=unquote(username) if username else None,
        password=None if password is None else unquote(password),
        sentinel_password=query.get("sentinel_password") or None,
    )


def _host_port(text: str, where: str) -> tuple[str, int]:
    """`host:port`, `[ipv6]:port`, or a host alone (port 26379)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = text.partition(":")
    if not host:
        raise ConfigError(f"{where}: empty sentinel host")
    if not port:
        return host, DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65_536:
        raise ConfigError(f"{where}: bad sentinel port {port!r}")
    return host, int(port)
