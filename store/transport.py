"""Redis as transport: connection, key names, the job queue and the result streams.

Every Redis key callgate uses is named here. Messages carry ids, not payloads; the only
payload on Redis is a committed result on its way to fan-in, and Postgres holds it too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue
from rq.serializers import JSONSerializer

from callgate.store.errors import ConfigurationError, ErrorCode, ServiceUnavailable

JOB_FUNCTION = "callgate.worker.jobs.run_call"
RESULT_STREAM_TTL_SECONDS = 24 * 3600
FAILED_JOB_TTL_SECONDS = 24 * 3600


def connect(url: str) -> redis.Redis:
    """A client for ``url`` (redis://, rediss:// or unix://). Connects lazily; a URL redis-py
    cannot read is a ConfigurationError that names the variable, never the URL (it may hold
    a password)."""
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    except ValueError as exc:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        shown = f"scheme {scheme!r}" if scheme and scheme.isalnum() else "this URL"
        raise ConfigurationError(
            f"CALLGATE_REDIS_URL: redis cannot use {shown}; use redis://HOST:PORT/DB, "
            f"rediss://… or unix://PATH ({type(exc).__name__})"
        ) from None


def results_stream(queue: str, turn_id: uuid.UUID | str) -> str:
    return f"callgate:{queue}:results:{turn_id}"


def api_bucket(queue: str, key_id: str) -> str:
    """The HTTP API's rate-limit token bucket of one API key."""
    return f"callgate:{queue}:api:bucket:{key_id}"


def job_queue(connection: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=connection, serializer=JSONSerializer)


def enqueue_calls(queue: Queue, call_refs: Iterable[uuid.UUID], *, timeout: float) -> int:
    """Enqueue one job per call in one Redis round trip. Jobs carry only the call's ref."""
    datas = [
        Queue.prepare_data(
            JOB_FUNCTION,
            args=(str(ref),),
            timeout=int(timeout),
            result_ttl=0,
            failure_ttl=FAILED_JOB_TTL_SECONDS,
            description=f"call {ref}",
        )
        for ref in call_refs
    ]
    if not datas:
        return 0
    with translate_errors("enqueue"):
        queue.enqueue_many(datas)
    return len(datas)


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise ServiceUnavailable(
            f"{what}: cannot reach Redis ({exc})", code=ErrorCode.REDIS_UNAVAILABLE
        ) from exc
