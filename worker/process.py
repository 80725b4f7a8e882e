"""A worker process: callgate's consumer on its RQ queue, running up to K calls at once.

One process, many calls in flight (``CALLGATE_WORKER_CONCURRENCY``): LLM tools mostly wait
on I/O, so threads (and one event loop for ``async def`` handlers) overlap that waiting
without a process per call. SIGTERM stops taking calls and lets those in flight finish
within ``CALLGATE_WORKER_GRACE_SECONDS``. A SIGKILLed worker's reserved calls are re-issued
by a sweeper once their leases expire, the ones it had taken but not reserved once its
liveness key expires (seconds).

Every worker also sweeps, on a thread with its own connection, at the sweeper's cadence with
jitter (``CALLGATE_WORKER_SWEEP``): killing the sweeper process loses nothing.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from sqlalchemy import text

from callgate.store import db, metrics, sweeper, transport
from callgate.store.settings import Settings
from callgate.worker import redaction, runtime
from callgate.worker.consumer import Consumer


def run(settings: Settings, *, burst: bool = False, name: str | None = None) -> None:
    # Before anything can log: a handler's exception text is tool output (redacted).
    redaction.install_log_redaction()
    rt = runtime.Runtime.create(settings)
    # Connect before taking jobs: a bad URL fails here, once, with a clear error, and the
    # first job does not pay for connection setup.
    with db.translate_errors("worker start"), db.autocommit(rt.engine) as conn:
        conn.execute(text("SELECT 1"))
    with transport.translate_errors("worker start"):
        rt.redis.ping()
    runtime.install(rt)
    # Every tool's series exist from the start (at zero), so their first increment counts.
    metrics.declare_tools((t.name, t.kind) for t in rt.registry.tools.values())
    metrics.WORKER_CONCURRENCY.set(settings.worker_concurrency)
    consumer = Consumer(
        rt,
        concurrency=settings.worker_concurrency,
        name=name,
        burst=burst,
        grace_seconds=settings.worker_grace_seconds,
    )
    if threading.current_thread() is threading.main_thread():

        def on_term(signum: int, frame: FrameType | None) -> None:
            consumer.stop()

        signal.signal(signal.SIGTERM, on_term)
    stop_sweeping = threading.Event()
    if settings.worker_sweep:
        start_sweeping(settings, rt.queue.connection, stop_sweeping)
    try:
        with transport.translate_errors("worker"):
            consumer.run()
    finally:
        stop_sweeping.set()


# Each wait between two of a worker's sweeps varies by this fraction (and the first one
# starts at a random point of an interval): a fleet started at once does not sweep at once.
SWEEP_JITTER = 0.3


def start_sweeping(settings: Settings, redis: Any, stop: threading.Event) -> threading.Thread:
    """Run the sweeper's loop on a daemon thread of this process, on a connection of its own
    (a sweep never waits for a call's connection, nor a call for the sweep's)."""
    engine = db.create(
        settings.require_database(),
        pool_size=1,
        max_overflow=0,
        application_name="callgate-worker-sweeper",
    )
    metrics.declare_sweeper()
    thread = threading.Thread(
        target=sweeper.run,
        args=(engine, transport.job_queue(redis, settings.queue)),
        kwargs={
            "interval": settings.sweep_seconds,
            "stale_seconds": settings.stale_seconds,
            "successor_grace": settings.successor_grace_seconds,
            "job_timeout": settings.job_timeout_seconds,
            "max_dispatches": settings.max_dispatches,
            "stop": stop,
            "jitter": SWEEP_JITTER,
        },
        name="sweeper",
        daemon=True,
    )
    thread.start()
    return thread
