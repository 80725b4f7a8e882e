"""A worker process: callgate's consumer on its RQ queue, running up to K calls at once.

One process, many calls in flight (``CALLGATE_WORKER_CONCURRENCY``): LLM tools mostly wait
on I/O, so threads (and one event loop for ``async def`` handlers) overlap that waiting
without a process per call. SIGTERM stops taking calls and lets those in flight finish
within ``CALLGATE_WORKER_GRACE_SECONDS``; then the process stops renewing the leases of any
still running and exits, and another worker takes them over once the leases expire. A
SIGKILLed worker's reserved calls are re-issued by a sweeper once their leases expire, the
ones it had taken but not reserved once its liveness key expires (seconds).

Every worker also sweeps, on a thread with its own connection, at the sweeper's cadence with
jitter (``CALLGATE_WORKER_SWEEP``): killing the sweeper process loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from callgate.core import logs
from callgate.core.settings import Settings
from callgate.daemons import sweeper
from callgate.observe import metrics, tracing
from callgate.queue import transport
from callgate.store import db, histories, schema_version, tool_catalog
from callgate.tools import redaction
from callgate.tools import registry as tool_registry
from callgate.worker import runtime
from callgate.worker.consumer import Consumer
from callgate.worker.runtime import HeldResults

log = logging.getLogger("callgate.worker")
lines = logging.getLogger(f"{logs.PROCESS_LOGGER}.worker")


def run(settings: Settings, *, burst: bool = False, name: str | None = None) -> None:
    # Before anything can log: a handler's exception text is tool output (redacted).
    redaction.install_log_redaction()
    rt = runtime.Runtime.create(settings)
    # Connect before taking jobs: a bad URL or an unmigrated database fails here, once, with
    # a clear error, and the first job does not pay for connection setup.
    schema_version.require_current(rt.engine, "worker start")
    with transport.translate_errors("worker start"):
        rt.redis.ping()
    # Producers plan and show tools from the catalogue: publish ours before taking a call. A
    # different definition already published under one of our versions stops the worker here
    # (tool_definition_conflict), rather than let producers plan with the other one.
    tool_catalog.publish(rt.engine, rt.registry, sources=rt.tool_sources)
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
    signalled: list[int] = []
    if threading.current_thread() is threading.main_thread():

        def on_term(signum: int, frame: FrameType | None) -> None:
            signalled.append(signum)
            consumer.stop()
            _exit_after(
                settings.worker_grace_seconds + EXIT_SLACK_SECONDS,
                rt.held,
                until=time.monotonic()
                + settings.worker_grace_seconds
                + settings.lease_seconds
                + EXIT_SLACK_SECONDS,
            )

        signal.signal(signal.SIGTERM, on_term)
    stop_sweeping = threading.Event()
    if settings.worker_sweep:
        start_sweeping(settings, rt.queue.connection, stop_sweeping)
    lines.info("%s", started(settings, consumer.name, rt.registry), extra={"worker": consumer.name})
    remark = histories.replication_warning(rt.engine)
    if remark:
        lines.warning("%s", remark, extra={"worker": consumer.name})
    why = "the queue was empty (--burst)"
    try:
        with transport.translate_errors("worker"):
            consumer.run()
    except KeyboardInterrupt:
        why = "interrupted"
        if consumer.abandoned:  # Ctrl-C: a stop asked for, as SIGTERM is
            _exit_now(0)
        raise
    except BaseException:
        why = "on an error"
        if consumer.abandoned:
            log.exception("worker stopped with %d call(s) in flight", consumer.abandoned)
            _exit_now(1)
        raise
    finally:
        stop_sweeping.set()
        if signalled:
            why = f"on {signal.Signals(signalled[0]).name}"
        lines.info(
            "worker %s stopped %s: ran %d call(s), %d left in flight",
            consumer.name,
            why,
            consumer.done,
            consumer.abandoned,
            extra={"worker": consumer.name, "count": consumer.done},
        )
    if consumer.abandoned:
        _exit_now(0)


def started(settings: Settings, name: str, registry: tool_registry.Catalog) -> str:
    """The start line: what this worker serves, and where; never a password."""
    tools = ", ".join(
        f"{t.name}@{t.version}" for t in sorted(registry.tools.values(), key=lambda t: t.name)
    )
    metrics_at = f"metrics on :{settings.metrics_port}" if settings.metrics_port else "no metrics"
    return (
        f"worker {name} started on queue {settings.queue!r}, concurrency "
        f"{settings.worker_concurrency}, {len(registry.tools)} tool(s): {tools}; {metrics_at}; "
        f"{tracing.described()}; "
        f"postgres {logs.address(settings.require_database())}, "
        f"redis {logs.address(settings.require_redis())}"
    )


# After SIGTERM the process is gone this long after its grace period, whatever it is waiting
# for (a Redis that stopped answering while the worker leaves its list, a hung handler).
EXIT_SLACK_SECONDS = 10.0


def _exit_now(code: int) -> None:
    """End the process now, without waiting for the calls still running.

    Their handlers cannot be stopped (Python cannot cancel a thread), and a normal exit waits
    for them: concurrent.futures joins its executor's threads at exit. Daemon threads would
    not be waited for, but they would keep running tool code (a write, a completion) while
    the interpreter tears down the modules, connections and MCP servers under them. Ending
    here is what a SIGKILL does, which callgate is built to survive: the leases, no longer
    renewed, expire and another worker takes the calls over. Only the logs and the spans
    are flushed first."""
    with contextlib.suppress(Exception):
        tracing.flush()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _exit_after(seconds: float, held: HeldResults, *, until: float) -> None:
    """Exit ``seconds`` from now, or later while a result not yet committed is held, up to
    ``until`` (monotonic): a completion retries for a lease."""

    def overdue() -> None:
        if held.count and time.monotonic() < until:
            _exit_after(1.0, held, until=until)
            return
        log.error("worker still running %.0f s after SIGTERM; exiting", seconds)
        _exit_now(1)

    timer = threading.Timer(seconds, overdue)
    timer.daemon = True
    timer.start()


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
