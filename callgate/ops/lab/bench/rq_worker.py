"""Bare RQ's worker classes: RQ's own SimpleWorker, with the bench's jobs imported when the
process starts.

RQ imports a job's function inside the first job it performs, after it stamped that job's
``started_at``; the bench's job module pulls in SQLAlchemy and the demo downstream (about
0.27 s on a loaded 2-core machine), so that import fell inside the measured window of every
bare RQ run, and a 60-call run read bare RQ at a fraction of its speed. Importing the module
here, at start-up, is what RQ's documentation suggests for a worker that should not pay
imports per job. Only the way it leaves its command channel on exit differs besides
(``PreloadedWorker.unsubscribe``): nothing inside the window.
"""

from __future__ import annotations

from typing import Any

from rq.worker import SimpleWorker

from callgate.ops.lab.bench import durable, jobs  # noqa: F401  # imported at start-up


class PreloadedWorker(SimpleWorker):
    """SimpleWorker (one job at a time, no fork) with the bench's jobs already imported."""

    def unsubscribe(self) -> None:
        """Leave the command channel without waiting on its thread, as the process exits.

        RQ 3.0 reads its command channel on a thread that waits up to 60 s for a message
        (``sleep_time=60``); with redis-py 8 a thread that finds itself unsubscribed waits
        out those 60 s, and ``unsubscribe`` joins it: a burst worker often sat a minute after
        its last job (outside the measured window, inside the bench's wall time). The thread
        is a daemon; it ends with the process."""
        if self.pubsub_thread:
            self.pubsub.unsubscribe()
            self.pubsub_thread.stop(timeout=0.1)


class DurableWorker(PreloadedWorker):
    """The same, connected to Postgres for the minimum durable work before its first job
    (SimpleWorker runs jobs on the thread that built it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        durable.warm()


class DurableRefundWorker(DurableWorker):
    """The same, connected to the payments provider too, for the write ceiling's refunds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        durable.warm_downstream()
