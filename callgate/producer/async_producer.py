"""``AsyncProducer``: the producer for asyncio applications.

``submit`` runs the synchronous producer's exact path (validation, one Postgres transaction,
one enqueue) on a worker thread, so both producers record and enqueue a turn the same way.
Fan-in is native asyncio: it awaits the reads of ``Producer.collect``'s own loop
(``fanin.follow``): results arrive on the turn's Redis stream (``redis.asyncio``) and Postgres
is re-read every second as the safety net for a publish Redis lost, and instead of the stream
while Redis is away. Waiting therefore holds no thread, however many turns an application
follows at once.

``aclose()`` ends every wait still running on the producer (another task's ``results()`` or
``collect()``) with ``ProducerClosed`` before it closes the connections, so no wait goes on
reconnecting to Redis or Postgres behind a closed producer, and nothing is left running when
the event loop stops.

    async with AsyncProducer.from_env() as producer:
        turn = await producer.submit(proposals, context)
        async for result in producer.results(turn.turn_id, timeout=30):
            ...  # each call's result as it lands, joined by call id, duplicates dropped
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio

import callgate.producer.validation as validation
from callgate.core.errors import ProducerClosed
from callgate.core.settings import Settings
from callgate.core.types import CallContext, ProposedCall, Turn
from callgate.observe import tracing
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
    traced,
)
from callgate.queue import transport
from callgate.store import db, turns

T = TypeVar("T")


class AsyncProducer:
    """Embed this in an asyncio application: ``await AsyncProducer.from_env().submit(...)``."""

    def __init__(self, producer: Producer, redis_connection: redis.asyncio.Redis) -> None:
        self.producer = producer
        self.redis = redis_connection
        self._closing = asyncio.Event()
        # Reads in flight for any task: aclose() ends them (Redis reads and sleeps are
        # cancelled; a Postgres read on a thread cannot be, so it is awaited) before it
        # closes the connections under them.
        self._reads: set[asyncio.Future[Any]] = set()

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
        return await self._read(
            asyncio.to_thread(
                self.producer.submit,
                proposals,
                context,
                operation_ids=operation_ids,
                submit_key=submit_key,
            ),
            interruptible=False,
        )

    def results(self, turn_id: str, *, timeout: float | None = None) -> AsyncIterator[Result]:
        """Yield each call's terminal result once, as it lands (results Postgres already
        holds first), until every proposed call has one or ``timeout`` seconds pass.

        ``timeout=None`` waits for the last call, however long an approval takes. A call
        still running when the iteration ends simply was not yielded: nothing is invented.

        The whole iteration is one ``callgate.collect`` span, ended however it ends: the
        last result, the timeout, an error, or the consumer stopping early (a ``break``,
        ``aclose()``, a cancelled task).
        """
        return self._results(turn_id, timeout)

    async def _results(
        self, turn_id: str, timeout: float | None, *, traced: bool = True
    ) -> AsyncIterator[Result]:
        """``results()``. ``traced=False`` for a caller that follows a turn in short rounds
        (the framework executors' relay), where a span per round would flood the trace."""
        with tracing.streaming(turn_id, on=traced) as span:
            if timeout is not None:
                validation.check_timeout(timeout)
            deadline = None if timeout is None else time.monotonic() + timeout
            state = await self._in_thread(
                "collect", first_read, self.producer.engine, turn_id, timeout
            )
            loaded = time.monotonic()
            fan = FanIn(state.proposals)
            yielded = 0
            try:
                async for result in self._landing(state, fan, deadline):
                    yielded += 1  # counted as it is handed over: a break after it counts it
                    yield result
            finally:
                calls = len(state.proposals)
                tracing.collected(
                    span, complete=yielded == calls, results=yielded, pending=calls - yielded
                )
            fanned_in(state, fan, loaded)

    async def collect(self, turn_id: str, timeout: float) -> Collected:
        """``Producer.collect``, awaited: up to ``timeout`` seconds for one result per call."""
        with tracing.collecting(turn_id) as span:
            done = await self._collect(turn_id, timeout)
            traced(span, done)
            return done

    async def _collect(self, turn_id: str, timeout: float) -> Collected:
        validation.check_timeout(timeout)
        deadline = time.monotonic() + timeout
        state = await self._in_thread("collect", first_read, self.producer.engine, turn_id, timeout)
        loaded = time.monotonic()
        fan = FanIn(state.proposals)
        async for _ in self._landing(state, fan, deadline):
            pass
        fanned_in(state, fan, loaded)
        return await self._in_thread("collect", collected, self.producer.engine, state, fan)

    async def aclose(self) -> None:
        """End every wait still running on this producer (it raises ``ProducerClosed``), then
        close its Redis and Postgres connections. Calling it again does nothing."""
        if self._closing.is_set():
            return
        self._closing.set()
        while self._reads:
            await asyncio.gather(*self._reads, return_exceptions=True)
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
                await self._read(asyncio.sleep(request.seconds))
            else:
                try:
                    answer = await self._read(
                        self.redis.xread(
                            {request.stream: request.last_id}, block=request.block_ms, count=500
                        )
                    )
                except REDIS_AWAY as exc:
                    request = advance(loop, error=exc)
                    continue
            request = advance(loop, answer)

    async def _in_thread(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        def run() -> T:
            with db.translate_errors(what):
                return fn(*args)

        return await self._read(asyncio.to_thread(run), interruptible=False)

    async def _read(self, step: Awaitable[T], *, interruptible: bool = True) -> T:
        """Await one step of a wait. ``aclose()`` interrupts a Redis read or a sleep (the
        wait raises ``ProducerClosed``) and lets a Postgres read or a submit on a thread end
        first, since a thread cannot be stopped and a submit's outcome is the caller's."""
        if self._closing.is_set():
            if inspect.iscoroutine(step):
                step.close()  # never started: no "was never awaited" warning
            raise ProducerClosed("this AsyncProducer is closed: make a new one to go on")
        read = asyncio.ensure_future(step)
        self._reads.add(read)
        read.add_done_callback(self._reads.discard)
        if not interruptible:
            return await read
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({read, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not read.done():
                read.cancel()  # aclose() ends this read, or our own caller was cancelled
                await asyncio.wait({read})
        if read.cancelled():
            raise ProducerClosed(
                "aclose() ran while this wait was in progress: it ended without a result"
            )
        return read.result()


def _connect(url: str) -> redis.asyncio.Redis:
    return transport.connect_async(url)  # the same URLs, checks and errors as the sync client
