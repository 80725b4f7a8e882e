"""Redis as transport: connection, key names, the job queue and the result streams.

Every Redis key callgate uses is named here. Messages carry ids, not payloads; the only
payload on Redis is a committed result on its way to fan-in, and Postgres holds it too.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import redis
import redis.asyncio
import redis.sentinel
from redis.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue

from callgate.core.errors import ConfigurationError, ErrorCode, ServiceUnavailable
from callgate.queue import rq_format, sentinel

log = logging.getLogger("callgate.transport")

# The job's function, as RQ records it: a label, not an importable function. callgate's
# consumer reads only the call's ref (rq_format.call_ref); a plain `rq worker` pointed at
# callgate's queue fails such a job, and the sweeper dispatches the call again from Postgres.
JOB_FUNCTION = "callgate.call"
RESULT_STREAM_TTL_SECONDS = 24 * 3600
FAILED_JOB_TTL_SECONDS = 24 * 3600


def connect(url: str) -> redis.Redis:
    """A client for ``url`` (redis://, rediss://, unix://, or redis+sentinel:// for the
    primary a set of Sentinels names: ``sentinel``). Connects lazily; a URL that cannot be
    read is a ConfigurationError that names the variable, never the URL (it may hold a
    password)."""
    if sentinel.is_sentinel(url):
        return sentinel.connect(sentinel.parse(url))
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    except ValueError as exc:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        shown = f"scheme {scheme!r}" if scheme and scheme.isalnum() else "this URL"
        raise ConfigurationError(
            f"CALLGATE_REDIS_URL: redis cannot use {shown}; use redis://HOST:PORT/DB, "
            f"rediss://…, unix://PATH or {sentinel.FORM} ({type(exc).__name__})"
        ) from None


def connect_async(url: str, *, max_connections: int | None = None) -> redis.asyncio.Redis:
    """``connect`` for asyncio: the same URLs, checks and errors. ``max_connections`` sizes
    its pool (None: redis-py's 100); a command past it fails, it does not wait."""
    if sentinel.is_sentinel(url):
        return sentinel.connect_async(sentinel.parse(url), max_connections=max_connections)
    connect(url)  # the URL check and its error
    return redis.asyncio.Redis.from_url(
        url, socket_connect_timeout=5, health_check_interval=30, max_connections=max_connections
    )


def own_client(shared: redis.Redis, *, socket_timeout: float) -> redis.Redis:
    """A client of the same server as ``shared``, on a small pool of its own whose reads
    give up after ``socket_timeout`` (the shared pool's may wait for minutes: RQ's worker
    raises them to its job timeout)."""
    pool = shared.connection_pool
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        return redis.Redis(connection_pool=sentinel.own_pool(pool, socket_timeout=socket_timeout))
    kwargs = {**pool.connection_kwargs, "socket_timeout": socket_timeout}
    return redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, max_connections=2, **kwargs
        )
    )


def results_stream(queue: str, turn_id: uuid.UUID | str) -> str:
    return f"callgate:{queue}:results:{turn_id}"


def published_marks(stream: str) -> str:
    """A hash of the outbox ids already published on ``stream`` (same lifetime): the relayer
    sets each with HSETNX in its publish pipeline, so a row published again (its relayer
    died between publish and mark) is seen, and counted, as a re-publish."""
    return f"{stream}:published"


def api_bucket(queue: str, key_id: str) -> str:
    """The HTTP API's rate-limit token bucket of one API key."""
    return f"callgate:{queue}:api:bucket:{key_id}"


def job_queue(connection: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=connection, serializer=rq_format.SERIALIZER)


def job_id(ref: uuid.UUID | str) -> str:
    """A call's job id is its ref, so a sweeper can ask Redis whether the call's job is
    still waiting (``JOB_STATES_LUA``) instead of guessing from the time since dispatch."""
    return str(ref)


def enqueue_calls(
    queue: Queue,
    call_refs: Iterable[uuid.UUID],
    *,
    timeout: float,
    first: Callable[[Pipeline], int] | None = None,
) -> int:
    """Enqueue one job per call in two Redis round trips. Jobs carry only the call's ref.

    A call's job gets the call's own id (``job_id``) unless a job of that id already
    waits (a duplicate sent on purpose, or a second enqueue racing the first), or the call
    repeats in ``call_refs``: those get a random id, so each copy is still delivered rather
    than overwriting the waiting one. Finding out costs one pipelined EXISTS round trip.

    ``first`` adds commands to that round trip, sent before anything is enqueued; it returns
    how many it added (their replies are not this function's)."""
    refs = list(call_refs)
    if not refs and first is None:
        return 0
    with translate_errors("enqueue"), queue.connection.pipeline(transaction=False) as pipe:
        added = first(pipe) if first is not None else 0
        for ref in refs:
            pipe.exists(rq_format.job_key(job_id(ref)))
        waiting = pipe.execute()[added:]
    if not refs:
        return 0
    seen = {job_id(ref) for ref, exists in zip(refs, waiting, strict=True) if exists}
    datas = []
    for ref in refs:
        own = job_id(ref)
        datas.append(
            Queue.prepare_data(
                JOB_FUNCTION,
                args=(str(ref),),
                timeout=int(timeout),
                result_ttl=0,
                failure_ttl=FAILED_JOB_TTL_SECONDS,
                description=f"call {ref}",
                job_id=None if own in seen else own,
            )
        )
        seen.add(own)
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


# --- dispatch after commit ----------------------------------------------------------------


def dispatch_after_commit(
    queue: Queue,
    refs: Sequence[uuid.UUID],
    *,
    timeout: float,
    who: str,
    log_failure: bool = True,
) -> ServiceUnavailable | None:
    """Enqueue calls that a committed statement made runnable and marked dispatched (a
    finish's successors, an approver's decision). The one way callgate does it.

    A Redis failure here is not the caller's: Postgres holds the calls as dispatched, and the
    sweeper enqueues them again once they have waited ``stale_seconds`` (a successor: its
    predecessor's grace). So it is logged and returned, never raised: raising would tell
    the caller its committed change was lost, and a retry would find it already done.
    ``log_failure=False``: the caller tells a person itself (the CLI's one warning line)."""
    if not refs:
        return None
    try:
        enqueue_calls(queue, refs, timeout=timeout)
    except ServiceUnavailable as exc:
        if not log_failure:
            return exc
        log.warning(
            "%s: %d call(s) committed but not enqueued; the sweeper dispatches them: %s",
            who,
            len(refs),
            exc.message,
        )
        return exc
    return None
