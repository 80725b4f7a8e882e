"""Gauges read from Postgres and Redis at scrape time: what is open, late or waiting.

They describe shared state, not one process, so exactly one kind of process should serve
them: the sweeper does by default (``--state-metrics`` / ``CALLGATE_STATE_METRICS`` on any
other process, ``--no-state-metrics`` on the sweeper). Several sweepers serve identical
values under different ``instance`` labels; rules read them with ``max()``.

Every query is bounded by what is open, never by history: each reads a partial index
(``calls_open``, ``calls_awaiting``, ``outbox_unpublished``, ``operations_reconciliation``,
``approvals_pending``) and runs under a short statement timeout. When Postgres or Redis
cannot be read, ``callgate_state_source_up{source}`` is 0 and that source's gauges are
left out of the scrape (never stale values).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import redis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from callgate.core.settings import Settings
from callgate.store import gauge_reads
from callgate.store.db import Engine

log = logging.getLogger("callgate.metrics")

# Non-cumulative age buckets of open calls: (label, lower bound in seconds).
AGE_BUCKETS: Final = (
    ("under_1m", 0),
    ("1m_to_5m", 60),
    ("5m_to_15m", 300),
    ("15m_to_1h", 900),
    ("over_1h", 3600),
)
OPEN_STATES: Final = ("proposed", "started", "awaiting_approval")
STATEMENT_TIMEOUT_MS: Final = 2000


def recovery_window(settings: Settings) -> float:
    """How long an open call may take before something is wrong: every dispatch the sweeper
    allows (each after a lost job or an expired lease, plus a sweep), then one job's run."""
    per_dispatch = max(settings.stale_seconds, settings.lease_seconds) + settings.sweep_seconds
    return settings.max_dispatches * per_dispatch + settings.job_timeout_seconds


@dataclass(frozen=True)
class _Family:
    name: str
    documentation: str
    labels: tuple[str, ...] = ()


FAMILIES: Final = (
    _Family(
        "callgate_calls_open",
        "Calls not yet terminal, by state and age since they were proposed.",
        ("state", "age"),
    ),
    _Family(
        "callgate_calls_open_oldest_age_seconds",
        "Age of the oldest call not yet terminal, by state (0 when none).",
        ("state",),
    ),
    _Family(
        "callgate_calls_past_recovery_window",
        "Proposed or started calls older than callgate_recovery_window_seconds that wait "
        "for no approval: the sweeper should have ended them.",
    ),
    _Family(
        "callgate_recovery_window_seconds",
        "CALLGATE_MAX_DISPATCHES x (max(stale, lease) + sweep seconds) + job timeout, as the "
        "serving process is configured.",
    ),
    _Family("callgate_outbox_unpublished", "Outbox rows committed and not yet published."),
    _Family(
        "callgate_outbox_oldest_unpublished_age_seconds",
        "Age of the oldest unpublished outbox row (0 when none).",
    ),
    _Family(
        "callgate_operations_awaiting_reconciliation",
        "Write operations that ended reconciliation_pending and nobody resolved yet "
        "(callgate reconcile resolve).",
    ),
    _Family(
        "callgate_operations_awaiting_reconciliation_oldest_age_seconds",
        "Age of the oldest operation awaiting reconciliation (0 when none).",
    ),
    _Family("callgate_approvals_pending", "Approval requests waiting for a decision."),
    _Family(
        "callgate_approvals_oldest_pending_age_seconds",
        "Age of the oldest pending approval request (0 when none).",
    ),
    _Family("callgate_queue_depth", "Jobs waiting on the RQ queue (Redis)."),
    _Family(
        "callgate_state_source_up",
        "1 if the last scrape could read the source (postgres, redis), else 0.",
        ("source",),
    ),
    _Family("callgate_state_scrape_seconds", "Time the last scrape of these gauges took."),
)
FAMILY_NAMES: Final = tuple(f.name for f in FAMILIES)


class StateCollector(Collector):
    """A prometheus-client collector that queries Postgres and Redis on each scrape."""

    def __init__(
        self,
        engine: Engine,
        redis_connection: redis.Redis,
        *,
        queue_key: str,
        window_seconds: float,
    ) -> None:
        self.engine = engine
        self.redis = redis_connection
        self.queue_key = queue_key
        self.window_seconds = window_seconds

    def describe(self) -> Iterable[Metric]:
        # Registering must not query anything.
        return [_family(f) for f in FAMILIES]

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        families = {f.name: _family(f) for f in FAMILIES}
        up = families["callgate_state_source_up"]
        try:
            self._postgres(families)
            up.add_metric(["postgres"], 1)
        except Exception as exc:  # a scrape must answer even when Postgres does not
            log.warning("state metrics: cannot read PostgreSQL: %s", exc)
            up.add_metric(["postgres"], 0)
        try:
            depth: Any = self.redis.llen(self.queue_key)
            _gauge(families, "callgate_queue_depth").add_metric([], float(depth))
            up.add_metric(["redis"], 1)
        except redis.exceptions.RedisError as exc:
            log.warning("state metrics: cannot read Redis: %s", exc)
            up.add_metric(["redis"], 0)
        _gauge(families, "callgate_recovery_window_seconds").add_metric([], self.window_seconds)
        _gauge(families, "callgate_state_scrape_seconds").add_metric([], time.monotonic() - started)
        for family in families.values():
            if family.samples:
                yield family

    def _postgres(self, families: dict[str, GaugeMetricFamily]) -> None:
        read = gauge_reads.read(
            self.engine, window_seconds=self.window_seconds, timeout_ms=STATEMENT_TIMEOUT_MS
        )
        by_state, outbox = read.by_state, read.outbox
        reconciliation, approvals = read.reconciliation, read.approvals
        open_calls = _gauge(families, "callgate_calls_open")
        oldest = _gauge(families, "callgate_calls_open_oldest_age_seconds")
        overdue = 0
        for state in OPEN_STATES:
            row = by_state.get(state)
            for label, _lower in AGE_BUCKETS:
                open_calls.add_metric([state, label], float(getattr(row, label, 0) or 0))
            oldest.add_metric([state], _seconds(row.oldest if row is not None else None))
            overdue += int(row.overdue or 0) if row is not None else 0
        _gauge(families, "callgate_calls_past_recovery_window").add_metric([], overdue)
        _gauge(families, "callgate_outbox_unpublished").add_metric([], outbox.unpublished)
        _gauge(families, "callgate_outbox_oldest_unpublished_age_seconds").add_metric(
            [], _seconds(outbox.oldest)
        )
        _gauge(families, "callgate_operations_awaiting_reconciliation").add_metric(
            [], reconciliation.pending
        )
        _gauge(
            families, "callgate_operations_awaiting_reconciliation_oldest_age_seconds"
        ).add_metric([], _seconds(reconciliation.oldest))
        _gauge(families, "callgate_approvals_pending").add_metric([], approvals.pending)
        _gauge(families, "callgate_approvals_oldest_pending_age_seconds").add_metric(
            [], _seconds(approvals.oldest)
        )


def _family(f: _Family) -> GaugeMetricFamily:
    return GaugeMetricFamily(f.name, f.documentation, labels=list(f.labels))


def _gauge(families: dict[str, GaugeMetricFamily], name: str) -> GaugeMetricFamily:
    return families[name]


def _seconds(value: object) -> float:
    return max(0.0, float(value)) if value is not None else 0.0  # type: ignore[arg-type]
