"""Counts Postgres and Redis round trips per call, by phase (``python -m ops.roundtrips``).

Runs producer, worker executor, relayer and fan-in in this one process against the services
in ``CALLGATE_DATABASE_URL`` / ``CALLGATE_REDIS_URL``, so every statement and every Redis
command can be counted. Postgres: statements plus explicit BEGIN/COMMIT/ROLLBACK; Redis:
packed sends (a pipeline is one).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from redis.connection import Connection as RedisConnection
from sqlalchemy import Engine, event

from producer import Producer
from store import db, migrate, relayer
from store.settings import Settings
from worker import executor, runtime
from worker.demo import downstream
from worker.demo.tools import DEMO_TOOLS, DemoServices, demo_registry

COUNTS: Counter[str] = Counter()
_phase = ["idle"]


@contextmanager
def phase(name: str) -> Iterator[None]:
    _phase[0] = name
    try:
        yield
    finally:
        _phase[0] = "idle"


def _count_postgres(engine: Engine, label: str = "pg") -> None:
    def statement(*_: Any) -> None:
        COUNTS[f"{_phase[0]}:{label}"] += 1

    def transaction_control(conn: Any) -> None:
        # Autocommit connections send no BEGIN/COMMIT although SQLAlchemy fires the events.
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            COUNTS[f"{_phase[0]}:{label}"] += 1

    event.listen(engine, "before_cursor_execute", statement)
    for name in ("begin", "commit"):
        event.listen(engine, name, transaction_control)


def _count_redis() -> None:
    original: Any = RedisConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        COUNTS[f"{_phase[0]}:redis"] += 1
        original(self, command, check_health)

    RedisConnection.send_packed_command = send  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20, help="calls per turn")
    parser.add_argument(
        "--kind",
        choices=["read", "write"],
        default="read",
        help="get_weather reads (concurrent), or refund_payment writes (one after another, "
        "each with a status lookup before it)",
    )
    args = parser.parse_args()
    settings = Settings.from_env()
    settings = Settings.from_env(
        {
            **_env(settings),
            "CALLGATE_QUEUE": f"rt-{uuid.uuid4().hex[:8]}",
            "CALLGATE_TOOLS": DEMO_TOOLS,  # it counts the demo tools' round trips
        }
    )
    engine = db.create(settings.require_database())
    migrate.upgrade(engine)
    downstream.install(engine)
    producer = Producer.from_env(settings)
    services = DemoServices(settings)
    registry = demo_registry(services)
    rt = dataclasses.replace(runtime.Runtime.create(settings), registry=registry)
    for e in (producer.engine, rt.engine):
        _count_postgres(e)
    _count_postgres(services.engine, label="downstream")
    _count_redis()
    ctx = {"request_id": "rt", "tenant_id": "tenant-a", "user_id": "user-17", "roles": ["support"]}
    order = f"O-rt-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        downstream.add_payment(conn, order, "tenant-a", "m", f"pay-{order}", 10**9, "KRW")
    proposals = [
        {
            "call_id": f"c{i}",
            "tool_name": "get_weather",
            "arguments": {"city": f"C{i}", "unit": "celsius"},
        }
        if args.kind == "read"
        else {
            "call_id": f"c{i}",
            "tool_name": "refund_payment",
            "arguments": {"order_id": order, "amount": 1000 + i, "currency": "KRW"},
        }
        for i in range(args.calls)
    ]
    with phase("submit"):
        turn = producer.submit(proposals, ctx)
    started = time.perf_counter()
    with phase("worker"):
        for call in turn.calls:
            executor.execute(rt, uuid.UUID(call.ref))
    worker_ms = (time.perf_counter() - started) * 1000
    with phase("relayer"):
        relayer.drain(producer.engine, producer.redis, queue=settings.queue, batch=100)
    with phase("collect"):
        collected = producer.collect(turn.turn_id, timeout=5)
    assert collected.complete
    n = args.calls
    print(f"round trips per call, turn of {n} {args.kind}s (totals in brackets)")
    for name in ("submit", "worker", "relayer", "collect"):
        pg, rd = COUNTS[f"{name}:pg"], COUNTS[f"{name}:redis"]
        line = f"  {name:<8} postgres {pg / n:5.2f} [{pg:3d}]   redis {rd / n:5.2f} [{rd:3d}]"
        if ds := COUNTS[f"{name}:downstream"]:
            line += f"   downstream postgres {ds / n:5.2f} [{ds:3d}]"
        print(line)
    print(f"  worker wall time {worker_ms / n:.2f} ms per call")
    rt.queue.empty()  # type: ignore[no-untyped-call]


def _env(settings: Settings) -> dict[str, str]:
    return {
        "CALLGATE_DATABASE_URL": settings.require_database(),
        "CALLGATE_REDIS_URL": settings.require_redis(),
    }


if __name__ == "__main__":
    main()
