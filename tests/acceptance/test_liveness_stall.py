"""A worker whose Redis connection stops answering (a network path that drops packets, a
failover that leaves old connections hanging, no connection closed) keeps its liveness key
alive: the beat gives up on that connection after 2 s and beats on a new one. A real worker
process whose Redis traffic passes through the fault proxy; one liveness beat is held for
30 s on its connection while every other connection goes on."""

from __future__ import annotations

import time

import redis as redis_lib

from callgate.ops.stack import Stack, wait_for_workers
from callgate.queue import deliveries
from tests.faults.core import STALL
from tests.faults.redisproxy import RedisProxy, command_fault

HELD_SECONDS = 30.0


def test_a_beat_caught_by_a_silent_connection_does_not_let_the_key_expire(
    service_env: dict[str, str], redis_url: str, queue_name: str, redis_proxy: RedisProxy
) -> None:
    env = {
        **service_env,
        "CALLGATE_REDIS_URL": redis_proxy.url(redis_url),
        "CALLGATE_WORKER_SWEEP": "off",
    }
    direct = redis_lib.Redis.from_url(redis_url)
    stack = Stack(env=env, workers=1, relayer=False, sweeper=False)
    stack.__enter__()
    try:
        wait_for_workers(redis_url, queue_name, 1)
        (name,) = (n.decode() for n in direct.smembers(deliveries.workers_key(queue_name)))
        alive = deliveries.liveness_key(queue_name, name)
        fault = redis_proxy.arm(
            command_fault(STALL, "SET", args=r":alive\b", seconds=HELD_SECONDS, label="a beat")
        )
        assert fault.wait(10), "no liveness beat reached the proxy"
        assert fault.hit_at is not None
        # Past the key's TTL (5 s) and well inside the held beat's 30 s: the key must be
        # there all along, renewed by beats on another connection.
        missing = []
        deadline = fault.hit_at + 3 * deliveries.LIVENESS_TTL_SECONDS
        while time.monotonic() < deadline:
            if not direct.exists(alive):
                missing.append(round(time.monotonic() - fault.hit_at, 1))
            time.sleep(0.2)
        assert not missing, (
            f"the liveness key was gone at {missing[:3]}… s after a beat was held "
            f"(a live worker looked dead to every sweeper)"
        )
    finally:
        redis_proxy.disarm()
        stack.stop()
        direct.close()
