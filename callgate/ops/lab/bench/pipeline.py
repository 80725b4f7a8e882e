"""callgate's side: turns submitted through ``Producer.submit``, then W burst workers and one
relayer, measured from Postgres' own timestamps; every call must end and fan in."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from callgate.ops.lab.bench import measure, procs
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.services import Services, delete_keys, queue_name
from callgate.ops.lab.bench.workload import CONTEXT, Proposal
from callgate.producer import Producer
from callgate.queue import transport

PUBLISH_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class Run:
    window: measure.Window
    turns: list[str]


def burst(
    services: Services,
    turns: Sequence[Sequence[Proposal]],
    *,
    workers: int,
    deliveries: int = 1,
    **env: str,
) -> Run:
    """Submit every turn, then drain them with ``workers`` ``callgate worker --burst``
    processes and one relayer. ``deliveries`` > 1 enqueues each call that many times in
    all (right after its turn is submitted, so copies race each other)."""
    queue = queue_name("bench")
    run_env = services.env(queue, **env)
    producer = Producer.from_env(services.settings(run_env))
    try:
        turn_ids: list[str] = []
        for proposals in turns:
            turn = producer.submit(proposals, CONTEXT)
            turn_ids.append(turn.turn_id)
            refs = [uuid.UUID(c.ref) for c in turn.calls]
            for _ in range(deliveries - 1):
                transport.enqueue_calls(producer.queue, refs, timeout=300)
        services.tidy()  # outside the window: it opens at the first reservation
        relayer = procs.callgate(["relayer"], run_env)
        children = [procs.callgate(["worker", "--burst"], run_env) for _ in range(workers)]
        procs.wait_all(children, "callgate worker --burst")
        _await_published(services, turn_ids, relayer)
        procs.stop([relayer])
        procs.forget([*children, relayer])
        run = Run(measure.window(services.engine, turn_ids), turn_ids)
        _check_ended(run)
        for turn_id in turn_ids:
            collected = producer.collect(turn_id, timeout=10)
            if not collected.complete:
                raise BenchError(f"fan-in of turn {turn_id} is missing {collected.pending}")
        return run
    finally:
        delete_keys(producer.redis, f"callgate:{queue}:*")
        delete_keys(producer.redis, f"rq:*{queue}*")
        producer.close()


def _await_published(services: Services, turns: list[str], relayer: procs.Child) -> None:
    deadline = time.monotonic() + PUBLISH_TIMEOUT_SECONDS
    while measure.unpublished(services.engine, turns):
        if relayer.proc.poll() is not None:
            raise BenchError(f"callgate relayer exited {relayer.proc.returncode}: {relayer.tail()}")
        if time.monotonic() > deadline:
            procs.stop([relayer])
            raise BenchError(f"results still unpublished after {PUBLISH_TIMEOUT_SECONDS:g}s")
        time.sleep(0.05)


def _check_ended(run: Run) -> None:
    w = run.window
    if w.terminal != w.calls or w.unpublished:
        raise BenchError(
            f"{w.calls - w.terminal} of {w.calls} calls did not end, "
            f"{w.unpublished} results unpublished"
        )
