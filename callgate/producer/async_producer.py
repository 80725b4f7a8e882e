"""``AsyncProducer``: the producer for asyncio applications.

``submit`` runs the synchronous producer's exact path (validation, one Postgres transaction,
one enqueue) on a worker thread, so both producers record and enqueue a turn the same way.
Fan-in is native asyncio: it awaits the reads of ``Producer.collect``'s own loop
(``fanin.follow``): results arrive on the turn's Redis stream (``redis.asyncio``) and Postgres
is re-read every second as the safety net for a publish Redis lost, and instead of the stream
while Redis is away. Waiting therefore holds no thread, however many turns an application
follows at once.

    async with AsyncProducer.from_env() as producer:
        turn = await producer.submit(proposals, context)
        async for result in producer.results(turn.turn_id, timeout=30):
            ...  # each call's result as it lands, joined by call id, duplicates dropped
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio

from callgate.core.settings import Settings
from callgate.core.types import CallContext, ProposedCall, Turn
from callgate.producer import validation
from callgate.producer.fanin import (
    REDIS_AWAY,
    FanIn,
    Landed,
    ReadPostgres,
    Result,
    Sleep,
    advance,
    follow,
)
from callgate.producer.producer import (
    Collected,
    Producer,
    collected,
    fanned_in,
    first_read,
    recheck,
)
from callgate.queue import transport
from callgate.store import db, turns

T = TypeVar("T")


class AsyncProducer:
    """Embed this in an asyncio application: ``await AsyncProducer.from_env().submit(...)``."""

    def __init__(self, producer: Producer, redis_connection: redis.asyncio.Redis) -> None:
        self.producer = producer
        self.redis = redis_connection

    @classmethod
    def from_env(cls, settings: Settings | None = None) -> AsyncProducer:
        """Build from the same settings as ``Producer.from_env`` (tools from the catalogue
        workers publish, or from ``CALLGATE_TOOLS`` when set)."""
        producer = Producer.from_env(settings)
        return cls(producer, _connect(producer.settings.require_redis()))

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def submit(
        self,
        proposals: Sequence[ProposedCall | Mapping[str, Any]],
        context: CallContext | Mapping[str, Any],
        *,
        operation_ids: Mapping[str, str] | None = None,
        submit_key: str | None = None,
    ) -> Turn:
        """Record the turn and enqueue its calls: ``Producer.submit``, awaited (the same
        ``submit_key`` rules and errors)."""
        return await asyncio.to_thread(
            self.producer.submit,
            proposals,
            context,
            operation_ids=operation_ids,
            submit_key=submit_key,
        )

    async def results(self, turn_id: str, *, timeout: float | None = None) -> AsyncIterator[Result]:
        """Yield each call's terminal result once, as it lands (results Postgres already
        holds first), until every proposed call has one or ``timeout`` seconds pass.

        ``timeout=None`` waits for the last call, however long an approval takes. A call
        still running when the iteration ends simply was not yielded: nothing is invented.
        """
        if timeout is not None:
            validation.check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        state = await asyncio.to_thread(first_read, self.producer.engine, turn_id, timeout)
        loaded = time.monotonic()
        fan = FanIn(state.proposals)
        async for result in self._landing(state, fan, deadline):
            yield result
        fanned_in(state, fan, loaded)

    async def collect(self, turn_id: str, timeout: float) -> Collected:
        """``Producer.collect``, awaited: up to ``timeout`` seconds for one result per call."""
        validation.check_timeout(timeout)
        deadline = time.monotonic() + timeout
        state = await asyncio.to_thread(first_read, self.producer.engine, turn_id, timeout)
        loaded = time.monotonic()
        fan = FanIn(state.proposals)
        async for _ in self._landing(state, fan, deadline):
            pass
        fanned_in(state, fan, loaded)
        return await asyncio.to_thread(collected, self.producer.engine, state, fan)

    async def aclose(self) -> None:
        await self.redis.aclose()
        await asyncio.to_thread(self.producer.close)

    async def _landing(
        self, state: turns.TurnState, fan: FanIn, deadline: float | None
    ) -> AsyncIterator[Result]:
        """Drive ``Producer.collect``'s loop (``fanin.follow``) with awaited reads,
        yielding each result as it lands."""
        stream = transport.results_stream(self.producer.settings.queue, state.turn_id)
        loop = follow(fan, stream, state.results, deadline)
        request = advance(loop)
        while request is not None:
            answer: Any = None
            if isinstance(request, Landed):
                yield request.result
            elif isinstance(request, ReadPostgres):
                answer = await self._in_thread(
                    "collect", recheck, self.producer.engine, state.turn_id
                )
            elif isinstance(request, Sleep):
                await asyncio.sleep(request.seconds)
            else:
                try:
                    answer = await self.redis.xread(
                        {request.stream: request.last_id}, block=request.block_ms, count=500
                    )
                except REDIS_AWAY as exc:
                    request = advance(loop, error=exc)
                    continue
            request = advance(loop, answer)

    @staticmethod
    async def _in_thread(what: str, fn: Callable[..., T], *args: Any) -> T:
        def run() -> T:
            with db.translate_errors(what):
                return fn(*args)

        return await asyncio.to_thread(run)


def _connect(url: str) -> redis.asyncio.Redis:
    transport.connect(url)  # the same URL check and error as the synchronous client
    return redis.asyncio.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
