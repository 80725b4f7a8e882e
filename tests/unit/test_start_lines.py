"""The start lines say whether the process traces, and never print a password."""

from __future__ import annotations

from callgate.core.settings import Settings
from callgate.ops.cli.processes import _where
from callgate.tools.registry import Registry
from callgate.worker.process import started

ENV = {
    "CALLGATE_DATABASE_URL": "postgresql://app:s3cret@db.internal:5432/callgate",
    "CALLGATE_REDIS_URL": "redis://:hunter2@cache.internal:6379/0",
}


def test_the_worker_says_whether_it_traces() -> None:
    line = started(Settings.from_env(ENV), "w1", Registry.of([], {}))
    assert "tracing off (set OTEL_EXPORTER_OTLP_ENDPOINT" in line
    assert "s3cret" not in line and "hunter2" not in line


def test_the_relayer_and_sweeper_say_whether_they_trace() -> None:
    line = _where(Settings.from_env(ENV))
    assert "tracing off" in line and "db.internal" in line
    assert "s3cret" not in line and "hunter2" not in line
