"""What every request of the API and the console shares, built once when the app starts."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import anyio

from callgate.ops.http.auth import RateLimiter, WaitSlots
from callgate.ops.http.settings import ApiSettings
from callgate.producer import Producer
from callgate.producer.async_producer import AsyncProducer
from callgate.queue import transport
from callgate.store.db import Engine


@dataclass
class Services:
    """One producer (its engine and Redis connection are shared by every request), its
    asyncio twin for long-polls (the turn's stream is awaited, no thread is held), the rate
    limiter, the long-poll slots, the key checks' own threads and the API's settings."""

    producer: Producer
    collector: AsyncProducer
    limiter: RateLimiter
    waits: WaitSlots
    key_checks: anyio.CapacityLimiter
    readiness: anyio.CapacityLimiter
    api: ApiSettings

    @property
    def engine(self) -> Engine:
        return self.producer.engine

    def dispatch(self, refs: list[uuid.UUID]) -> None:
        """Enqueue calls a decision made runnable. The decision is committed already: if
        Redis fails here, the sweeper dispatches them (as for ``callgate approvals``)."""
        transport.dispatch_after_commit(
            self.producer.queue,
            refs,
            timeout=self.producer.settings.job_timeout_seconds,
            who="api",
        )
