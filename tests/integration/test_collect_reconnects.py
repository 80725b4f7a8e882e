"""Both producers' collect reads again, on a new connection, a PostgreSQL read that a lost
connection interrupted: here the last one, which says which pending calls await an approval.
No worker runs, so the turn stays pending and that read is always made; the collecting
producers' PostgreSQL is behind a proxy that cuts the connection carrying it (a real fault).
"""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio

from callgate import AsyncProducer, Collected, Producer
from callgate.core.settings import Settings
from callgate.ops.lab.demo.tools import demo_registry
from callgate.queue import transport
from callgate.store import db
from tests.faults.core import CUT
from tests.faults.pgproxy import PgProxy, sql_fault

# turns.awaiting_approval's SELECT (and no other statement of collect's).
AWAITING_SQL = r"SELECT callgate\.calls\.call_id, callgate\.calls\.approval_id\s+FROM"
CONTEXT = {
    "request_id": "r-1",
    "tenant_id": "t-support",
    "user_id": "u-a",
    "roles": ["support"],
}
READS = [{"call_id": "w", "tool_name": "get_weather", "arguments": {"city": "Seoul"}}]


def _behind(proxy: PgProxy, database_url: str, redis_url: str, queue: str) -> Producer:
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue,
        }
    )
    return Producer(
        settings=settings,
        engine=db.create(proxy.url(database_url)),
        redis_connection=transport.connect(redis_url),
        registry=demo_registry(),
    )


def _submit(producer: Producer) -> str:
    context = {**CONTEXT, "request_id": f"r-{uuid.uuid4().hex[:8]}"}
    return producer.submit(READS, context).turn_id


def _check(collected: Collected, proxy_fault_fired: bool) -> None:
    assert proxy_fault_fired, "the awaiting-approval read was cut"
    assert not collected.complete and collected.pending == ["w"]
    assert collected.awaiting_approval == {}


def test_sync_collect_reads_awaiting_approvals_again_after_a_cut(
    producer: Producer, pg_proxy: PgProxy, database_url: str, redis_url: str, queue_name: str
) -> None:
    turn_id = _submit(producer)
    fault = pg_proxy.arm(sql_fault(CUT, AWAITING_SQL))
    behind = _behind(pg_proxy, database_url, redis_url, queue_name)
    try:
        collected = behind.collect(turn_id, timeout=0.2)
    finally:
        behind.close()
    _check(collected, fault.fired.is_set())


def test_async_collect_reads_awaiting_approvals_again_after_a_cut(
    producer: Producer, pg_proxy: PgProxy, database_url: str, redis_url: str, queue_name: str
) -> None:
    turn_id = _submit(producer)
    fault = pg_proxy.arm(sql_fault(CUT, AWAITING_SQL))
    behind = _behind(pg_proxy, database_url, redis_url, queue_name)

    async def collect() -> Collected:
        aproducer = AsyncProducer(behind, redis.asyncio.Redis.from_url(redis_url))
        try:
            return await aproducer.collect(turn_id, timeout=0.2)
        finally:
            await aproducer.aclose()

    _check(asyncio.run(collect()), fault.fired.is_set())
