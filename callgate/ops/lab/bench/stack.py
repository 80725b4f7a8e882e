"""Long-running workers and a relayer, for the scenarios that submit while they run:
fan-in, latency per stage, memory per in-flight call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from callgate.ops.lab.bench import procs
from callgate.ops.lab.bench.services import Services, delete_keys, queue_name
from callgate.producer import Producer


@dataclass
class Running:
    producer: Producer
    workers: list[procs.Child]
    env: dict[str, str]


@contextmanager
def running(services: Services, *, workers: int, **env: str) -> Iterator[Running]:
    """``workers`` ``callgate worker`` processes and one relayer on a queue of their own,
    listening before this yields; stopped (SIGTERM) after."""
    queue = queue_name("bench")
    run_env = services.env(queue, **env)
    producer = Producer.from_env(services.settings(run_env))
    services.tidy()
    children = [procs.callgate(["relayer"], run_env)]
    try:
        worker_children = [procs.callgate(["worker"], run_env) for _ in range(workers)]
        children += worker_children
        procs.await_workers(services.redis_url, queue, workers)
        yield Running(producer, worker_children, run_env)
    finally:
        procs.stop(children)
        procs.forget(children)
        delete_keys(producer.redis, f"callgate:{queue}:*")
        delete_keys(producer.redis, f"rq:*{queue}*")
        producer.close()
