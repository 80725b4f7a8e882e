"""A worker process: one RQ ``SimpleWorker`` consuming callgate's queue.

SimpleWorker runs jobs in its own process: no fork per job (RQ's forking worker costs ~4× in
throughput here and leaves an orphan child running when only the parent is killed), one
PID for metrics. A SIGKILLed worker's job is not re-run by RQ; callgate's sweeper re-issues
it once the operation's lease expires.
"""

from __future__ import annotations

from rq import SimpleWorker
from rq.serializers import JSONSerializer
from sqlalchemy import text

from store import db, transport
from store.settings import Settings
from worker import redaction, runtime


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
    worker = SimpleWorker([rt.queue], connection=rt.redis, serializer=JSONSerializer, name=name)
    worker.work(burst=burst, logging_level="WARNING")
