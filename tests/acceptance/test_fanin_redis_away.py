"""Both producers' fan-in with Redis unreachable for the producer while the results land
in PostgreSQL: the synchronous ``collect`` and ``AsyncProducer`` read them there alike.

The workers, relayer and sweeper use the shared Redis; the collecting producer's Redis
client points at a port nothing listens on (a real refused connect on every try), or at a
proxy that is stopped while both producers wait on the stream.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

from callgate import AsyncProducer, Producer
from callgate.core.settings import Settings
from callgate.ops.lab.demo.tools import demo_registry
from callgate.ops.stack import Stack
from callgate.store import db
from tests.acceptance.conftest import SUPPORT_A
from tests.faults.redisproxy import RedisProxy

READS = [
    {
        "call_id": "weather",
        "tool_name": "get_weather",
        "arguments": {"city": "Seoul", "unit": "celsius"},
    },
    {"call_id": "stock", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}},
]
# Slow enough that the results land after the fan-in has started waiting on Redis.
DELAYS = "get_weather=1500,get_stock=1500"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cut_off(service_env: dict[str, str], redis_url: str) -> Producer:
    settings = Settings.from_env({**service_env, "CALLGATE_REDIS_URL": redis_url})
    return Producer(
        settings=settings,
        engine=db.create(settings.require_database()),
        redis_connection=redis.Redis.from_url(redis_url, socket_connect_timeout=2),
        registry=demo_registry(),
    )


def _submit(producer: Producer) -> str:
    ctx = {**SUPPORT_A, "request_id": f"r-{uuid.uuid4().hex[:6]}"}
    return producer.submit(READS, ctx).turn_id


def test_async_collect_reads_postgres_while_redis_is_away(
    stack: Callable[..., Stack], producer: Producer, service_env: dict[str, str]
) -> None:
    stack(workers=1, CALLGATE_WORKER_CONCURRENCY="2", CALLGATE_DEMO_DELAY_MS=DELAYS)
    turn_id = _submit(producer)
    away = f"redis://127.0.0.1:{_closed_port()}/0"

    async def collect() -> tuple[bool, list[str], list[str]]:
        inner = _cut_off(service_env, away)
        aproducer = AsyncProducer(inner, redis.asyncio.Redis.from_url(away))
        try:
            collected = await aproducer.collect(turn_id, timeout=60)
            streamed = [r.call_id async for r in aproducer.results(turn_id, timeout=5)]
        finally:
            await aproducer.aclose()
        return collected.complete, [r.status for r in collected.results], streamed

    complete, statuses, streamed = asyncio.run(collect())
    assert complete
    assert statuses == ["succeeded", "succeeded"]
    assert sorted(streamed) == ["stock", "weather"]


def test_sync_collect_reads_postgres_while_redis_is_away(
    stack: Callable[..., Stack], producer: Producer, service_env: dict[str, str]
) -> None:
    stack(workers=1, CALLGATE_WORKER_CONCURRENCY="2", CALLGATE_DEMO_DELAY_MS=DELAYS)
    turn_id = _submit(producer)
    cut_off = _cut_off(service_env, f"redis://127.0.0.1:{_closed_port()}/0")
    try:
        collected = cut_off.collect(turn_id, timeout=60)
    finally:
        cut_off.close()
    assert collected.complete
    assert [r.status for r in collected.results] == ["succeeded", "succeeded"], collected.results


def _xreads(proxy: RedisProxy) -> int:
    return sum(1 for rt in proxy.seen for words in rt.commands if words[:1] == (b"XREAD",))


def test_sync_and_async_collect_agree_when_redis_goes_away_mid_wait(
    stack: Callable[..., Stack],
    producer: Producer,
    service_env: dict[str, str],
    redis_proxy: RedisProxy,
) -> None:
    """One turn collected by both producers at once, through a Redis proxy that is stopped
    (its connections cut, every reconnect refused) once both are blocked on the stream: both
    finish from PostgreSQL with the same document, one result per call."""
    stack(workers=1, CALLGATE_WORKER_CONCURRENCY="2", CALLGATE_DEMO_DELAY_MS=DELAYS)
    turn_id = _submit(producer)
    through = redis_proxy.url(service_env["CALLGATE_REDIS_URL"])
    redis_proxy.keep_seen = True
    sync_producer = _cut_off(service_env, through)
    async_inner = _cut_off(service_env, through)
    collected: dict[str, dict[str, Any]] = {}
    failures: list[BaseException] = []

    def collect_sync() -> None:
        try:
            collected["sync"] = sync_producer.collect(turn_id, timeout=60).as_json()
        except BaseException as exc:
            failures.append(exc)

    def collect_async() -> None:
        async def run() -> dict[str, Any]:
            aproducer = AsyncProducer(async_inner, redis.asyncio.Redis.from_url(through))
            try:
                return (await aproducer.collect(turn_id, timeout=60)).as_json()
            finally:
                await aproducer.aclose()

        try:
            collected["async"] = asyncio.run(run())
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=collect_sync), threading.Thread(target=collect_async)]
    for thread in threads:
        thread.start()
    try:
        waited_until = time.monotonic() + 10
        while _xreads(redis_proxy) < 2 and time.monotonic() < waited_until:
            time.sleep(0.02)
        xreads_before = _xreads(redis_proxy)
        redis_proxy.stop()
        for thread in threads:
            thread.join(timeout=90)
    finally:
        sync_producer.close()
    assert not failures, failures
    assert xreads_before >= 2, "both producers were waiting on the stream when Redis went"
    assert _xreads(redis_proxy) == xreads_before, "no XREAD reached Redis after the stop"
    assert collected["sync"]["complete"], collected["sync"]
    assert [r["status"] for r in collected["sync"]["results"]] == ["succeeded", "succeeded"]
    assert collected["async"] == collected["sync"]
