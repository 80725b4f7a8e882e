"""Postgres and Redis traffic per call, counted in one process.

``python -m callgate.ops.lab.roundtrips`` runs it.

Runs the producer, callgate's worker consumer (one call at a time), the relayer and fan-in
in this process against ``CALLGATE_DATABASE_URL`` / ``CALLGATE_REDIS_URL``, so every
statement and every Redis command is counted. The worker's
start and stop (registration, maintenance) are measured on an empty queue and subtracted:
what is left is the cost per job. Bare RQ draining the same number of no-op jobs is counted
the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import uuid
from typing import Any

from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from callgate.core.settings import Settings
from callgate.daemons import relayer
from callgate.ops.lab.bench import counting
from callgate.ops.lab.bench.counting import COUNTS, phase
from callgate.ops.lab.demo import downstream
from callgate.ops.lab.demo.tools import DEMO_TOOLS, DemoServices, demo_registry
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db, migrate
from callgate.worker import runtime
from callgate.worker.consumer import Consumer

PHASES = ("submit", "worker", "relayer", "collect")
CONTEXT = {"request_id": "rt", "tenant_id": "tenant-a", "user_id": "user-17", "roles": ["support"]}


def _burst(rt: runtime.Runtime, name: str) -> float:
    """callgate's worker consumer draining ``rt.queue`` in this process (one call at a time),
    counted under ``name``, less its start and stop (counted under ``name`` + ``_idle`` on
    an empty queue)."""
    empty = transport.job_queue(rt.redis, f"rt-empty-{uuid.uuid4().hex[:8]}")
    with phase(f"{name}_idle"):
        Consumer(dataclasses.replace(rt, queue=empty), concurrency=1, burst=True).run()
    started = time.perf_counter()
    with phase(name):
        Consumer(rt, concurrency=1, burst=True).run()
    for key in [k for k in COUNTS if k.startswith(f"{name}_idle:")]:
        COUNTS[key.replace("_idle:", ":", 1)] -= COUNTS[key]
    return (time.perf_counter() - started) * 1000


def _rq_burst(queue: Queue, name: str) -> float:
    """RQ's own SimpleWorker draining ``queue``, counted the same way (the baseline)."""
    empty = Queue(f"rt-empty-{uuid.uuid4().hex[:8]}", connection=queue.connection)
    with phase(f"{name}_idle"):
        SimpleWorker([empty], connection=queue.connection, serializer=JSONSerializer).work(
            burst=True, logging_level="WARNING"
        )
    started = time.perf_counter()
    with phase(name):
        SimpleWorker([queue], connection=queue.connection, serializer=JSONSerializer).work(
            burst=True, logging_level="WARNING"
        )
    for key in [k for k in COUNTS if k.startswith(f"{name}_idle:")]:
        COUNTS[key.replace("_idle:", ":", 1)] -= COUNTS[key]
    return (time.perf_counter() - started) * 1000


def measure(settings: Settings, *, calls: int, kind: str) -> dict[str, Any]:
    """Counts per call for ``calls`` calls of ``kind`` (read: get_stock, turns of 20; write:
    refund_payment, one turn of ``min(calls, 20)`` writes at a time), and bare RQ's."""
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": settings.require_database(),
            "CALLGATE_REDIS_URL": settings.require_redis(),
            "CALLGATE_QUEUE": f"rt-{uuid.uuid4().hex[:8]}",
            "CALLGATE_TOOLS": DEMO_TOOLS,  # it counts the demo tools' traffic
        }
    )
    engine = db.create(settings.require_database())
    migrate.upgrade(engine)
    downstream.install(engine)
    producer = Producer.from_env(settings)
    services = DemoServices(settings)
    rt = dataclasses.replace(runtime.Runtime.create(settings), registry=demo_registry(services))
    for e in (producer.engine, rt.engine):
        counting.count_postgres(e)
    counting.count_postgres(services.engine, label="downstream")
    counting.count_redis()
    turns = _submit(producer, engine, calls=calls, kind=kind)
    worker_ms = _burst(rt, "worker")
    with phase("relayer"):
        relayer.drain(producer.engine, producer.redis, queue=settings.queue, batch=100)
    with phase("collect"):
        for turn_id in turns:
            if not producer.collect(turn_id, timeout=10).complete:
                raise RuntimeError(f"turn {turn_id} did not complete")
    labels = ("pg", "downstream")
    result: dict[str, Any] = {
        "kind": kind,
        "calls": calls,
        "phases": {name: counting.per_call(name, calls, labels) for name in PHASES},
        "worker_ms_per_call": round(worker_ms / calls, 3),
    }
    result["bare_rq"] = _bare_rq(producer.redis, calls)
    rt.queue.delete(delete_jobs=True)
    for turn_id in turns:
        producer.redis.delete(transport.results_stream(settings.queue, turn_id))
    producer.close()
    engine.dispose()
    return result


def _submit(producer: Producer, engine: Any, *, calls: int, kind: str) -> list[str]:
    turns: list[str] = []
    order = f"O-rt-{uuid.uuid4().hex[:8]}"
    if kind == "write":
        with engine.begin() as conn:
            downstream.add_payment(conn, order, "tenant-a", "m", f"pay-{order}", 10**12, "KRW")
    with phase("submit"):
        for start in range(0, calls, 20):
            proposals = [
                {"call_id": f"c{i}", "tool_name": "get_stock", "arguments": {"symbol": f"S{i}"}}
                if kind == "read"
                else {
                    "call_id": f"c{i}",
                    "tool_name": "refund_payment",
                    "arguments": {"order_id": order, "amount": 1 + i, "currency": "KRW"},
                }
                for i in range(start, min(calls, start + 20))
            ]
            turns.append(producer.submit(proposals, CONTEXT).turn_id)
    return turns


def _bare_rq(connection: Any, calls: int) -> dict[str, float]:
    queue = Queue(f"rt-rq-{uuid.uuid4().hex[:8]}", connection=connection, serializer=JSONSerializer)
    datas = [
        Queue.prepare_data("callgate.ops.lab.bench.jobs.noop", result_ttl=0) for _ in range(calls)
    ]
    with phase("rq_enqueue"):
        queue.enqueue_many(datas)
    _rq_burst(queue, "rq_worker")
    queue.delete(delete_jobs=True)
    out = counting.per_call("rq_enqueue", calls, ())
    worker = counting.per_call("rq_worker", calls, ())
    return {
        "enqueue_redis_commands": out["redis_commands"],
        "enqueue_redis_round_trips": out["redis_round_trips"],
        "worker_redis_commands": worker["redis_commands"],
        "worker_redis_round_trips": worker["redis_round_trips"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100, help="calls (turns of 20)")
    parser.add_argument(
        "--kind",
        choices=["read", "write"],
        default="read",
        help="get_stock reads (concurrent), or refund_payment writes (one after another in "
        "their turn, each with a status lookup before it)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    result = measure(Settings.from_env(), calls=args.calls, kind=args.kind)
    if args.json:
        print(json.dumps(result))
        return
    print(f"per call, {args.calls} {args.kind}s in turns of 20 (RQ worker start/stop excluded)")
    print("  phase     pg stmts  commits  trips   downstream stmts   redis cmds  trips")
    for name, c in result["phases"].items():
        print(
            f"  {name:<8} {c['pg_statements']:8.2f} {c['pg_commits']:8.2f} "
            f"{c['pg_round_trips']:6.2f}   {c['downstream_statements']:16.2f}   "
            f"{c['redis_commands']:10.2f} {c['redis_round_trips']:6.2f}"
        )
    rq = result["bare_rq"]
    print(
        f"  bare RQ no-op job: enqueue {rq['enqueue_redis_commands']:.2f} redis cmds, "
        f"worker {rq['worker_redis_commands']:.2f} cmds in {rq['worker_redis_round_trips']:.2f} "
        "trips"
    )
    print(f"  worker wall time {result['worker_ms_per_call']:.2f} ms per call")


if __name__ == "__main__":
    main()
