"""Bare RQ's side: the same number of jobs, ``enqueue_many``, then W ``rq worker --burst``
(SimpleWorker, JSON) processes, measured from RQ's own job timestamps; and RQ running the
minimum durable work (``callgate.ops.lab.bench.durable``), alone or around the same refund
as the write scenario's, measured from its rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from rq import Queue
from rq.serializers import JSONSerializer

from callgate.ops.lab.bench import durable, measure, procs
from callgate.ops.lab.bench.services import Services, delete_keys, queue_name
from callgate.ops.lab.bench.workload import TURN, new_order

_T = TypeVar("_T")
RESULT_TTL_SECONDS = 600  # long enough to read the timestamps; deleted right after


def noops(calls: int) -> list[tuple[str, tuple[Any, ...]]]:
    return [("callgate.ops.lab.bench.jobs.noop", ())] * calls


def sleeps(calls: int, ms: int) -> list[tuple[str, tuple[Any, ...]]]:
    return [("callgate.ops.lab.bench.jobs.sleep_ms", (ms,))] * calls


def refunds(services: Services, calls: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The same downstream refunds as callgate's write scenario, one order per 20."""
    jobs: list[tuple[str, tuple[Any, ...]]] = []
    for t, start in enumerate(range(0, calls, TURN)):
        payment = f"pay-{new_order(services.engine, f'rq{t}')}"
        for i in range(start, min(calls, start + TURN)):
            key = f"bench-rq-{payment}-{i}"
            jobs.append(("callgate.ops.lab.bench.jobs.refund", (key, "tenant-a", payment, 1 + i)))
    return jobs


def burst(services: Services, jobs: list[tuple[str, tuple[Any, ...]]], *, workers: int) -> float:
    """Enqueue ``jobs`` in one ``enqueue_many``, drain with ``workers`` burst workers; jobs/s."""
    worker = "callgate.ops.lab.bench.rq_worker.PreloadedWorker"
    return _drain(
        services, jobs, workers, worker, lambda ids: measure.rq_per_second(services.redis, ids)
    )


def durable_burst(services: Services, calls: int, *, workers: int) -> durable.Run:
    """``calls`` jobs of the minimum durable work, one call row each inserted before the
    workers start; read (and checked: one winner, one result and one outbox row per call)
    from the rows' own timestamps."""
    run, call_ids = durable.seed(services.engine, calls)
    try:
        jobs = [("callgate.ops.lab.bench.jobs.minimum_durable", (c,)) for c in call_ids]
        worker = "callgate.ops.lab.bench.rq_worker.DurableWorker"
        _drain(services, jobs, workers, worker, lambda ids: None)
        return durable.checked(services.engine, run, "RQ + minimum durable work")
    finally:
        durable.delete(services.engine, run)


def durable_refunds(services: Services, calls: int, *, workers: int) -> durable.Run:
    """``calls`` jobs of the minimum durable work around the same refunds as ``refunds``
    (``durable.refund``); read from the rows and checked on both sides: one winner, one
    result and one outbox row per call, and one refund per call at the provider."""
    run, plan = durable.seed_refunds(services.engine, calls)
    try:
        jobs = [("callgate.ops.lab.bench.jobs.minimum_durable_refund", args) for args in plan]
        worker = "callgate.ops.lab.bench.rq_worker.DurableRefundWorker"
        _drain(services, jobs, workers, worker, lambda ids: None)
        what = "RQ + minimum durable work + the same refund"
        return durable.checked(services.engine, run, what, refunds=True)
    finally:
        durable.delete(services.engine, run)


def _drain(
    services: Services,
    jobs: list[tuple[str, tuple[Any, ...]]],
    workers: int,
    worker_class: str,
    read: Callable[[list[str]], _T],
) -> _T:
    """Enqueue, run ``workers`` burst workers of ``worker_class``, ``read`` the jobs before
    they are deleted."""
    queue = Queue(queue_name("benchrq"), connection=services.redis, serializer=JSONSerializer)
    ids: list[str] = []
    try:
        datas = [
            Queue.prepare_data(func, args=args, result_ttl=RESULT_TTL_SECONDS, timeout=300)
            for func, args in jobs
        ]
        ids += [job.id for job in queue.enqueue_many(datas)]
        env = {"CALLGATE_DATABASE_URL": services.database_url}
        children = [
            procs.rq_worker(queue.name, services.redis_url, env, worker_class)
            for _ in range(workers)
        ]
        procs.wait_all(children, "rq worker --burst")
        procs.forget(children)
        return read(ids)
    finally:
        _delete_jobs(services, ids)
        delete_keys(services.redis, f"rq:*{queue.name}*")
        queue.delete(delete_jobs=True)


def _delete_jobs(services: Services, ids: list[str]) -> None:
    pipe = services.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.delete(f"rq:job:{job_id}", f"rq:results:{job_id}")
    pipe.execute()
