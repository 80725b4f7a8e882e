"""Bare RQ's side: the same number of jobs, ``enqueue_many``, then W ``rq worker --burst``
(SimpleWorker, JSON) processes, measured from RQ's own job timestamps."""

from __future__ import annotations

from typing import Any

from rq import Queue
from rq.serializers import JSONSerializer

from callgate.ops.lab.bench import measure, procs
from callgate.ops.lab.bench.services import Services, delete_keys, queue_name
from callgate.ops.lab.bench.workload import TURN, new_order

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
    queue = Queue(queue_name("benchrq"), connection=services.redis, serializer=JSONSerializer)
    ids: list[str] = []
    try:
        datas = [
            Queue.prepare_data(func, args=args, result_ttl=RESULT_TTL_SECONDS, timeout=300)
            for func, args in jobs
        ]
        ids += [job.id for job in queue.enqueue_many(datas)]
        env = {"CALLGATE_DATABASE_URL": services.database_url}
        children = [procs.rq_worker(queue.name, services.redis_url, env) for _ in range(workers)]
        procs.wait_all(children, "rq worker --burst")
        procs.forget(children)
        return measure.rq_per_second(services.redis, ids)
    finally:
        _delete_jobs(services, ids)
        delete_keys(services.redis, f"rq:*{queue.name}*")
        queue.delete(delete_jobs=True)


def _delete_jobs(services: Services, ids: list[str]) -> None:
    pipe = services.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.delete(f"rq:job:{job_id}", f"rq:results:{job_id}")
    pipe.execute()
