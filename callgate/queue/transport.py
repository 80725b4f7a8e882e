"""Redis as transport: connection, key names, the job queue and the result streams.

Every Redis key callgate uses is named here. Messages carry ids, not payloads; the only
payload on Redis is a committed result on its way to fan-in, and Postgres holds it too.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import redis
import redis.asyncio
import redis.sentinel
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


def enqueue_calls(queue: Queue, call_refs: Iterable[uuid.UUID], *, timeout: float) -> int:
    """Enqueue one job per call in two Redis round trips. Jobs carry only the call's ref.

    A call's job gets the call's own id (``job_id``) unless a job of that id already
    waits (a duplicate sent on purpose, or a second enqueue racing the first), or the call
    repeats in ``call_refs``: those get a random id, so each copy is still delivered rather
    than overwriting the waiting one. Finding out costs one pipelined EXISTS round trip."""
    refs = list(call_refs)
    if not refs:
        return 0
    with translate_errors("enqueue"), queue.connection.pipeline(transaction=False) as pipe:
        for ref in refs:
            pipe.exists(rq_format.job_key(job_id(ref)))
        waiting = pipe.execute()
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


# --- who holds which job: worker liveness and the calls each worker took ------------------
#
# A worker takes jobs off the queue and deletes them, so once taken a call lives only in the
# worker's memory until it reserves its operation in Postgres (then the lease speaks for it).
# To notice quickly that a worker died in between, each worker
# - keeps ``liveness_key`` alive (a key with a TTL it refreshes every second or so), and is
#   listed in ``workers_key``;
# - moves each job it takes, in the same atomic step, into its ``taken_key`` hash (job id ->
#   job data), and removes it there once the delivery returned.
# A sweeper that finds a listed worker without its liveness key dispatches that worker's
# taken calls again from Postgres (the reservation CAS makes any duplicate harmless).
# A whole Redis that lost its data (FLUSHALL, a restart without persistence) is noticed by
# ``epoch_key`` disappearing or changing under a sweeper that saw it: every unreserved open
# call is then dispatched again.

LIVENESS_TTL_SECONDS = 5.0
LIVENESS_BEAT_SECONDS = 1.0


def workers_key(queue: str) -> str:
    return f"callgate:{queue}:workers"


def worker_prefix(queue: str) -> str:
    """What every per-worker key starts with (``JOB_STATES_LUA`` builds them from it)."""
    return f"callgate:{queue}:worker:"


def liveness_key(queue: str, worker: str) -> str:
    return f"{worker_prefix(queue)}{worker}:alive"


def taken_key(queue: str, worker: str) -> str:
    return f"{worker_prefix(queue)}{worker}:taken"


def taking_key(queue: str, worker: str) -> str:
    """The list BLMOVE puts a job id in while the worker waits for work (see ``TAKE_LUA``)."""
    return f"callgate:{queue}:worker:{worker}:taking"


def recovering_key(queue: str, worker: str) -> str:
    """A sweeper's claim on dispatching a dead worker's taken calls again (with a TTL)."""
    return f"callgate:{queue}:worker:{worker}:recovering"


def epoch_key(queue: str) -> str:
    return f"callgate:{queue}:epoch"


# KEYS: queue list, taking list, taken hash. ARGV: count, job key prefix, then the job ids
# whose deliveries returned (removed from the taken hash). Returns [job id, data, ...], data
# being the job hash's data field (rq_format.JOB_DATA_FIELD; decoded by ``call_ref``).
# Atomic: a job is either still queued (or in the taking list) or recorded as taken by this
# worker; there is no moment where only the worker's memory holds it.
TAKE_LUA = (
    """
for i = 3, #ARGV do redis.call('HDEL', KEYS[3], ARGV[i]) end
local count = tonumber(ARGV[1])
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('DEL', KEYS[2])
if #ids < count then
  local popped = redis.call('LPOP', KEYS[1], count - #ids)
  if popped then for _, id in ipairs(popped) do table.insert(ids, id) end end
end
local out = {}
for _, id in ipairs(ids) do
  local key = ARGV[2] .. id
  local data = redis.call('HGET', key, '"""
    + rq_format.JOB_DATA_FIELD
    + """')
  redis.call('DEL', key)
  if data then
    redis.call('HSET', KEYS[3], id, data)
    table.insert(out, id)
    table.insert(out, data)
  end
end
return out
"""
)

# KEYS: queue list, taking list. Puts back jobs a dead worker had moved but not yet taken.
RETURN_TAKING_LUA = """
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
for _, id in ipairs(ids) do redis.call('RPUSH', KEYS[1], id) end
redis.call('DEL', KEYS[2])
return #ids
"""


# KEYS: the workers set, the queue list. ARGV: the job key prefix, the worker key prefix,
# the largest number of waiting ids read in full, then job ids.
# Returns, per job id, where its job is: 'queued' (it waits in the queue, or in a taking
# list), 'taken' (in the taken hash of a worker whose liveness key exists), or 'absent'
# (nowhere Redis knows of: the delivery was lost, or it returned without ending the call).
# A job waits if its job hash exists AND its id is in a waiting list: a hash whose list entry
# is gone (a partial loss: an evicted or deleted queue key) is a lost job, not a backlog that
# never moves. The lists are read in full once per call, up to ARGV[3] ids; a longer backlog
# is judged by the hashes alone (reading it would block Redis), except that an empty one
# holds nothing. One round trip for a sweep's whole batch.
JOB_STATES_LUA = """
local live = {}
local lists = {KEYS[2]}
for _, w in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[2] .. w .. ':alive') == 1 then
    table.insert(live, ARGV[2] .. w .. ':taken')
  end
  table.insert(lists, ARGV[2] .. w .. ':taking')
end
local waiting = 0
for _, l in ipairs(lists) do waiting = waiting + redis.call('LLEN', l) end
local listed = nil
if waiting <= tonumber(ARGV[3]) then
  listed = {}
  for _, l in ipairs(lists) do
    for _, id in ipairs(redis.call('LRANGE', l, 0, -1)) do listed[id] = true end
  end
end
local out = {}
for i = 4, #ARGV do
  local state = 'absent'
  if redis.call('EXISTS', ARGV[1] .. ARGV[i]) == 1 and waiting > 0
     and (listed == nil or listed[ARGV[i]]) then
    state = 'queued'
  else
    for _, taken in ipairs(live) do
      if redis.call('HEXISTS', taken, ARGV[i]) == 1 then
        state = 'taken'
        break
      end
    end
  end
  table.insert(out, state)
end
return out
"""

# How many waiting job ids ``JOB_STATES_LUA`` reads to check that a job hash is still listed.
JOB_STATES_LIST_LIMIT = 10_000


def job_states(queue: Queue, refs: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Where each call's job is now: 'queued', 'taken' (by a live worker) or 'absent'."""
    if not refs:
        return {}
    conn: redis.Redis = queue.connection
    with translate_errors("job lookup"):
        states = conn.register_script(JOB_STATES_LUA)(
            keys=[workers_key(queue.name), queue.key],
            args=[
                rq_format.JOB_KEY_PREFIX,
                worker_prefix(queue.name),
                JOB_STATES_LIST_LIMIT,
                *(job_id(r) for r in refs),
            ],
        )
    return {ref: s.decode() for ref, s in zip(refs, states, strict=True)}


def call_ref(data: bytes | None) -> uuid.UUID | None:
    """The call ref a job's data carries: its only argument (``rq_format.job_args``)."""
    if data is None:  # the job's hash is gone (Redis flushed, or another copy took it)
        return None
    try:
        return uuid.UUID(rq_format.job_args(data)[0])
    except (ValueError, TypeError, IndexError) as exc:
        log.warning("dropped a job that carries no call ref: %s", exc)
        return None


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
