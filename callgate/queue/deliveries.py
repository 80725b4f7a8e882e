"""The delivery protocol on Redis: which worker holds which job, and what a sweeper finds
when a worker or Redis itself loses them.

A worker takes jobs off the queue and deletes them, so once taken a call lives only in the
worker's memory until it ends or reserves its operation in Postgres. To notice quickly that
a worker died in between, each worker

- keeps ``liveness_key`` alive (a key with a TTL it refreshes every second, ``Liveness``),
  and is listed in ``workers_key``;
- moves each job it takes, in the same atomic step (``TAKE_LUA``), into its ``taken_key``
  hash (job id -> job data), and removes it there once the delivery returned.

A sweeper that finds a listed worker without its liveness key dispatches that worker's taken
calls again from Postgres (``dead_workers``, ``claim_recovery``, ``return_taking``,
``taken_calls``, ``forget_taken``). A whole Redis that lost its data (FLUSHALL, a restart
without persistence, a failover) is noticed through ``epoch_key`` (``RedisEpoch``).
"""

from __future__ import annotations

import logging
import threading
import uuid

import redis
from rq import Queue

from callgate.queue import rq_format, transport
from callgate.queue.transport import job_id, translate_errors

log = logging.getLogger("callgate.transport")

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


# --- a worker: alive, and what it took ---------------------------------------------------


class Liveness:
    """Keeps this worker's liveness key alive on a thread of its own, so sweepers can tell
    a dead worker from a busy one within ``LIVENESS_TTL_SECONDS`` (a job heartbeat on the
    consumer's loop would stall whenever every slot is busy)."""

    def __init__(self, shared: redis.Redis, queue: str, name: str) -> None:
        self.redis = transport.own_client(shared, socket_timeout=LIVENESS_SOCKET_TIMEOUT_SECONDS)
        self.name = name
        self.queue = queue
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        self._beat()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.sadd(workers_key(self.queue), self.name)
                pipe.set(
                    liveness_key(self.queue, self.name),
                    "1",
                    px=int(LIVENESS_TTL_SECONDS * 1000),
                )
                pipe.execute()
        except Exception as exc:
            # Whatever Redis answers (unreachable, READONLY after a failover, OOM), this thread
            # beats again a second later: if it died, the worker would run on unlisted, its
            # calls dispatched again by every sweeper, until it was restarted.
            if not self._failing:
                log.warning("liveness beat refused (%s: %s); beating on", type(exc).__name__, exc)
            self._failing = True
            return
        if self._failing:
            log.info("liveness beat accepted again")
        self._failing = False

    def _run(self) -> None:
        while not self._stop.wait(LIVENESS_BEAT_SECONDS):
            self._beat()

    def stop(self, returned: list[str]) -> None:
        """Stop beating. A worker whose taken hash is empty once ``returned`` is dropped
        leaves the list; one with calls still in it (running past the grace period, or taken
        by a script whose reply was lost) stays listed, and a sweeper dispatches them again
        now that its liveness key is gone."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        taken = taken_key(self.queue, self.name)
        with self.redis.pipeline(transaction=False) as pipe:
            if returned:
                pipe.hdel(taken, *returned)
            pipe.hlen(taken)
            left = pipe.execute()[-1]
        # Unlisted before its liveness key goes: a sweeper never finds a worker that left
        # cleanly listed without one (it would recover nothing, and log a dead worker).
        with self.redis.pipeline(transaction=False) as pipe:
            if left == 0:
                pipe.srem(workers_key(self.queue), self.name)
            pipe.delete(liveness_key(self.queue, self.name))
            pipe.execute()
        self.redis.connection_pool.disconnect()


# A beat that waits on Redis longer than this gives up and beats again: the shared pool's
# reads may wait minutes (RQ's worker raises its socket timeout to the job timeout), and a
# liveness thread blocked on a stalled Redis would let its key expire long after Redis came
# back, so sweepers would take a live worker for a dead one.
LIVENESS_SOCKET_TIMEOUT_SECONDS = 2.0


# --- a sweeper: dead workers ----------------------------------------------------------------

# How long one sweeper's claim on recovering a dead worker's calls lasts.
RECOVERY_CLAIM_SECONDS = 30


def live_workers(conn: redis.Redis, queue: str) -> list[str]:
    """Listed workers whose liveness key exists: the workers serving the queue now."""
    members: set[bytes] = conn.smembers(workers_key(queue))  # type: ignore[assignment]
    return sorted(w.decode() for w in members if conn.exists(liveness_key(queue, w.decode())))


def dead_workers(conn: redis.Redis, queue: str) -> list[str]:
    """Listed workers whose liveness key is gone: dead, or stopped longer than its TTL."""
    members: set[bytes] = conn.smembers(workers_key(queue))  # type: ignore[assignment]
    return [w.decode() for w in members if not conn.exists(liveness_key(queue, w.decode()))]


def claim_recovery(conn: redis.Redis, queue: str, worker: str) -> bool:
    """Claim the recovery of a dead worker's calls for ``RECOVERY_CLAIM_SECONDS``: at most one
    sweeper recovers a worker at a time."""
    claimed = conn.set(recovering_key(queue, worker), "1", nx=True, ex=RECOVERY_CLAIM_SECONDS)
    return bool(claimed)


def return_taking(queue: Queue, worker: str) -> int:
    """Put back on the queue the jobs a worker had moved to wait on but not yet taken."""
    returned: int = queue.connection.register_script(RETURN_TAKING_LUA)(
        keys=[queue.key, taking_key(queue.name, worker)]
    )
    return returned


def taken_calls(conn: redis.Redis, queue: str, worker: str) -> tuple[list[bytes], list[uuid.UUID]]:
    """The job ids in a worker's taken hash, and the calls they carry."""
    taken: dict[bytes, bytes] = conn.hgetall(taken_key(queue, worker))  # type: ignore[assignment]
    refs = [r for r in (call_ref(data) for data in taken.values()) if r is not None]
    return list(taken), refs


def forget_taken(conn: redis.Redis, queue: str, worker: str, job_ids: list[bytes]) -> None:
    """Remove these job ids (only these) from a worker's taken hash."""
    if job_ids:
        conn.hdel(taken_key(queue, worker), *job_ids)


def forget_worker(conn: redis.Redis, queue: str, worker: str) -> None:
    """Unlist a worker whose calls were dispatched again."""
    conn.srem(workers_key(queue), worker)


# --- a sweeper: what Redis lost --------------------------------------------------------------


class RedisEpoch:
    """Redis's history as this process last settled it: the queue's epoch key and the
    replication id of the Redis it reached.

    The key holds a random value set by the first sweeper that found it missing. Redis that
    lost its data (FLUSHALL, a restart without persistence) loses the key, so the value
    changes. A replica promoted to primary (a Sentinel failover) holds the epoch key,
    replicated long ago, but may lack the writes of the primary's last moments: jobs
    enqueued, or taken, just before it died. Redis gives every history a replication id
    (INFO's ``master_replid``); a promotion or a restart starts a new one. So the value is
    the key's and the id's together: a new id counts as a loss too, even when nothing was
    lost (the cost is one duplicate job per open call, which the reservation CAS makes
    harmless). A Redis that refuses INFO (an ACL without it) is judged by the key alone.

    Whether a new value means a loss is not this process's to say: the sweeper compares it
    with the value recorded in Postgres (``callgate.store.sweeps.record_epoch``), which every
    process shares and a restart does not forget. This object only spares that round trip
    while the value stays what this process settled last.
    """

    def __init__(self) -> None:
        self.seen: str | None = None

    def look(self, conn: redis.Redis, queue: str) -> str | None:
        """The value now, if it is not the one this process settled last; else None. One
        round trip (GET and INFO replication) while nothing changed; a SET NX and a second
        GET when the key is missing."""
        key = epoch_key(queue)
        with conn.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.info("replication")
            current, info = pipe.execute(raise_on_error=False)
        if isinstance(current, Exception):
            raise current
        if current is None:
            conn.set(key, uuid.uuid4().hex, nx=True)
            current = conn.get(key)
        history = info.get("master_replid", "") if isinstance(info, dict) else ""
        now = f"{(current or b'').decode()}@{history}"
        return None if now == self.seen else now
