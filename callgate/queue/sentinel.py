"""Redis behind Sentinel: the ``redis+sentinel://`` URL and the clients built from it.

redis-py reads ``redis://``, ``rediss://`` and ``unix://`` URLs but has no URL for a Sentinel
topology; callgate takes the form several clients already share (Redis-Sentinel-Url,
RedisVL, Prefect)::

    redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/SERVICE[/DB]
        [?sentinel_username=…&sentinel_password=…]

The hosts are the Sentinels (port 26379 unless given), SERVICE the name they monitor the
primary under, DB the database number (0). USER and PASSWORD authenticate to the Redis
servers; ``sentinel_username``/``sentinel_password`` to the Sentinels themselves, when they
require it. The clients are redis-py's own (``Sentinel.master_for``): every new connection
asks the Sentinels where the primary is, and a connection to a server that is gone or no
longer primary fails and is opened again to the new one, so a failover looks like a short
Redis outage to callgate.

``parse`` is pure: it turns the URL into a ``SentinelURL`` or a ConfigurationError that says
what is wrong, never showing a password.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from callgate.core.errors import ConfigurationError

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379
FORM = "redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/SERVICE[/DB]"
OPTIONS = ("sentinel_username", "sentinel_password")

# Asking a Sentinel where the primary is must not hang on one that is down: the next one is
# tried. The Redis servers get the timeouts of a plain redis:// client.
SENTINEL_TIMEOUT_SECONDS = 2.0
CONNECT_TIMEOUT_SECONDS = 5.0
HEALTH_CHECK_SECONDS = 30


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0].lower() == SCHEME if "://" in url else False


def _bad(what: str) -> ConfigurationError:
    return ConfigurationError(f"CALLGATE_REDIS_URL: {what}; the form is {FORM}")


def _host_port(member: str) -> tuple[str, int]:
    if member.startswith("["):  # [IPv6]:PORT
        host, _, rest = member[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise _bad(f"Sentinel address {member!r} is not HOST[:PORT]")
    else:
        host, _, port = member.partition(":")
    if not host:
        raise _bad(f"Sentinel address {member!r} has no host")
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(f"Sentinel address {member!r} has no valid port")
    return host, int(port)


def parse(url: str) -> SentinelURL:
    """The Sentinels, service and credentials a ``redis+sentinel://`` URL names."""
    if not is_sentinel(url):
        raise _bad("not a redis+sentinel:// URL")
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise _bad("a fragment (#…) means nothing here")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        userinfo, hosts = "", netloc
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    members = [m for m in hosts.split(",")]
    if not hosts or any(not m for m in members):
        raise _bad("name at least one Sentinel, as HOST[:PORT], separated by commas")
    sentinels = tuple(_host_port(m) for m in members)
    parts = path.split("/") if path else []
    if parts and parts[-1] == "":
        parts.pop()  # a trailing slash
    if not parts or not parts[0]:
        raise _bad("the service name (the name the Sentinels monitor the primary under) is missing")
    if len(parts) > 2:
        raise _bad("the path is /SERVICE or /SERVICE/DB, nothing more")
    service = unquote(parts[0])
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise _bad(f"the database {parts[1]!r} is not a number")
        db = int(parts[1])
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in OPTIONS:
            raise _bad(f"unknown option {key!r} (known: {', '.join(OPTIONS)})")
        options[key] = value
    return SentinelURL(
        sentinels=sentinels,
        service=service,
        db=db,
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
    )


def _sentinel_kwargs(where: SentinelURL) -> dict[str, Any]:
    return {
        "socket_connect_timeout": SENTINEL_TIMEOUT_SECONDS,
        "socket_timeout": SENTINEL_TIMEOUT_SECONDS,
        "username": where.sentinel_username,
        "password": where.sentinel_password,
    }


def _server_kwargs(where: SentinelURL) -> dict[str, Any]:
    return {
        "db": where.db,
        "username": where.username,
        "password": where.password,
        "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "health_check_interval": HEALTH_CHECK_SECONDS,
    }


def connect(where: SentinelURL) -> redis.Redis:
    """A client of the service's primary, wherever the Sentinels say it is now. Lazy: an
    unreachable Sentinel set shows on the first command (MasterNotFoundError, a
    ConnectionError, so callgate's ``redis_unavailable``)."""
    manager = redis.sentinel.Sentinel(
        list(where.sentinels), sentinel_kwargs=_sentinel_kwargs(where)
    )
    client: redis.Redis = manager.master_for(where.service, **_server_kwargs(where))
    return client


def connect_async(where: SentinelURL, *, max_connections: int | None = None) -> redis.asyncio.Redis:
    """``connect`` for asyncio (fan-in's stream reads), its pool ``max_connections`` large
    (None: redis-py's 100)."""
    manager = redis.asyncio.sentinel.Sentinel(
        list(where.sentinels), sentinel_kwargs=_sentinel_kwargs(where)
    )
    client: redis.asyncio.Redis = manager.master_for(
        where.service, max_connections=max_connections, **_server_kwargs(where)
    )
    return client


def primary_url(url: str) -> str:
    """``url`` itself, or for a ``redis+sentinel://`` URL the ``redis://`` URL of the primary
    the Sentinels name now: for a program that takes only a plain URL (bare RQ's worker in
    the bench). It does not follow a failover."""
    if not is_sentinel(url):
        return url
    where = parse(url)
    manager = redis.sentinel.Sentinel(
        list(where.sentinels), sentinel_kwargs=_sentinel_kwargs(where)
    )
    host, port = manager.discover_master(where.service)
    auth = ""
    if where.username or where.password:
        auth = f"{quote(where.username or '', safe='')}:{quote(where.password or '', safe='')}@"
    return f"redis://{auth}{host}:{port}/{where.db}"


def own_pool(
    pool: redis.sentinel.SentinelConnectionPool, *, socket_timeout: float
) -> redis.sentinel.SentinelConnectionPool:
    """A small pool of its own on the same service and Sentinels as ``pool``."""
    kwargs = {
        k: v
        for k, v in pool.connection_kwargs.items()
        if k not in ("connection_pool", "socket_timeout")
    }
    return redis.sentinel.SentinelConnectionPool(  # type: ignore[no-untyped-call]
        pool.service_name,
        pool.sentinel_manager,
        connection_class=pool.connection_class,
        max_connections=2,
        socket_timeout=socket_timeout,
        **kwargs,
    )
