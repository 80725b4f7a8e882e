"""A worker process: callgate's consumer on its RQ queue, running up to K calls at once.

One process, many calls in flight (``CALLGATE_WORKER_CONCURRENCY``): LLM tools mostly wait
on I/O, so threads (and one event loop for ``async def`` handlers) overlap that waiting
without a process per call. SIGTERM stops taking calls and lets those in flight finish
within ``CALLGATE_WORKER_GRACE_SECONDS``; a SIGKILLed worker's calls are re-issued by the
sweeper once their leases expire.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from sqlalchemy import text

from callgate.store import db, metrics, transport
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
    with transport.translate_errors("worker"):
        consumer.run()
