"""RQ's storage as callgate reads it (callgate/queue/rq_format.py), on a real Redis.

callgate enqueues through RQ's public API but takes, decodes and looks for jobs itself, so an
RQ release that renames the job hash, its ``data`` field, the call's encoding or the queue
list would lose every call silently. pyproject.toml caps RQ below its next major; this test
is what a raised cap must pass, and each assertion names what changed.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Iterator

import pytest
import redis

from callgate.queue import deliveries, rq_format, transport

WORKER = "contract-worker"


@pytest.fixture
def conn(redis_url: str, queue_name: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    keys = [
        *client.scan_iter(f"rq:*{queue_name}*"),
        *client.scan_iter(f"callgate:{queue_name}:*"),
    ]
    if keys:
        client.delete(*keys)
    client.srem("rq:queues", f"rq:queue:{queue_name}")
    client.close()


def _decoded(key: str, data: bytes) -> object:
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        pytest.fail(f"{key} field {rq_format.JOB_DATA_FIELD!r} is no longer zlib data: {exc}")
    try:
        return json.loads(raw)
    except ValueError as exc:
        pytest.fail(f"{key} field {rq_format.JOB_DATA_FIELD!r} is no longer JSON: {exc}")


def test_jobs_callgate_enqueues_are_stored_where_and_as_callgate_reads_them(
    conn: redis.Redis, queue_name: str
) -> None:
    queue = transport.job_queue(conn, queue_name)
    refs = [uuid.uuid4(), uuid.uuid4(), uuid.uuid4()]

    assert transport.enqueue_calls(queue, refs, timeout=30) == 3

    # The queue list: the take script pops job ids from its head, oldest first.
    assert queue.key == f"rq:queue:{queue_name}", f"RQ's queue list is now {queue.key!r}"
    listed = [i.decode() for i in conn.lrange(queue.key, 0, -1)]
    assert listed == [str(r) for r in refs], f"RQ's queue list holds {listed}, not the job ids"

    for ref in refs:
        key = f"rq:job:{ref}"
        assert rq_format.job_key(transport.job_id(ref)) == key, "RQ's job key prefix changed"
        assert conn.type(key) == b"hash", f"RQ no longer stores job {ref} as the hash {key}"
        fields = {f.decode(): v for f, v in conn.hgetall(key).items()}
        assert rq_format.JOB_DATA_FIELD in fields, (
            f"{key} has no field {rq_format.JOB_DATA_FIELD!r} (the take script reads it);"
            f" RQ wrote {sorted(fields)}"
        )
        data = fields[rq_format.JOB_DATA_FIELD]
        assert _decoded(key, data) == [transport.JOB_FUNCTION, None, [str(ref)], {}], (
            f"{key} field {rq_format.JOB_DATA_FIELD!r} no longer holds the call as"
            " [function, instance, args, kwargs]"
        )
        assert deliveries.call_ref(data) == ref

    # Where the sweeper looks: every job waits, by its hash and its list entry.
    states = deliveries.job_states(queue, refs)
    assert list(states.values()) == ["queued"] * 3, states

    # The consumer's take, as callgate/worker/consumer.py calls it: each job's data reaches
    # the worker and its taken hash, and RQ's hash is gone.
    take = conn.register_script(deliveries.TAKE_LUA)
    replies = take(
        keys=[
            queue.key,
            deliveries.taking_key(queue_name, WORKER),
            deliveries.taken_key(queue_name, WORKER),
        ],
        args=[len(refs), rq_format.JOB_KEY_PREFIX],
    )
    job_ids = [i.decode() for i in replies[::2]]
    assert job_ids == [str(r) for r in refs]
    assert [deliveries.call_ref(d) for d in replies[1::2]] == refs
    taken = conn.hgetall(deliveries.taken_key(queue_name, WORKER))
    assert sorted(deliveries.call_ref(d) for d in taken.values()) == sorted(refs)
    assert conn.exists(*(rq_format.job_key(i) for i in job_ids)) == 0
    assert conn.llen(queue.key) == 0


def test_a_job_whose_data_is_not_a_callgate_call_yields_no_ref() -> None:
    """What the consumer drops (with a warning) instead of crashing its loop."""
    assert deliveries.call_ref(None) is None
    assert deliveries.call_ref(b"not zlib") is None
    assert deliveries.call_ref(zlib.compress(b"[1, 2]")) is None  # not a 4-tuple
    assert deliveries.call_ref(zlib.compress(b'["f", null, [], {}]')) is None  # no argument
    assert deliveries.call_ref(zlib.compress(b'["f", null, "x", {}]')) is None  # args not a list
    ref = uuid.uuid4()
    assert (
        deliveries.call_ref(zlib.compress(json.dumps(["f", None, [str(ref)], {}]).encode())) == ref
    )
