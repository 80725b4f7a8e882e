"""``AsyncProducer``: the producer for asyncio applications.

``submit`` runs the synchronous producer's exact path (validation, one Postgres transaction,
one enqueue) on a worker thread, so both producers record and enqueue a turn the same way.
Fan-in is native asyncio: results arrive on the turn's Redis stream (``redis.asyncio``) and
Postgres is re-read every second as the safety net for a publish Redis lost, and instead of
the stream while Redis is away; the steps are ``Producer.collect``'s, decided by the same
``fanin.Pacing``. Waiting therefore holds no thread, however many turns an application
follows at once.

    async with AsyncProducer.from_env() as producer:
        turn = await producer.submit(proposals, context)
        async for result in producer.results(turn.turn_id, timeout=30):
            ...  # each call's result as it lands, joined by call id, duplicates dropped
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio

import callgate.producer.validation as validation
from callgate.core.settings import Settings
from callgate.core.types import CallContext, ProposedCall, Turn
from callgate.producer.fanin import FanIn, Next, Pacing, Result
from callgate.producer.producer import (
    POSTGRES_RECHECK_SECONDS,
    REDIS_AWAY,
    Collected,
    Producer,
    fanned_in,
    first_read,
    recheck,
)
from callgate.queue import transport
from callgate.store import db, turns

T = TypeVar("T")

log = logging.getLogger("callgate.producer")


@dataclass
class _Following:
    """One turn being fanned in: its proposal set and the results joined so far."""

    state: turns.TurnState
    fan: FanIn
    stream: str
    last_id: str = "0-0"
    loaded: float = field(default_factory=time.monotonic)  # when ``state`` was read


class AsyncProducer:
    """Embed this in an asyncio application: ``await AsyncProducer.from_env().submit(...)``."""

    def __init__(self, producer: Producer, redis_connection: redis.asyncio.Redis) -> None:
        self.producer = producer
        self.redis = redis_connection

    @classmethod
    def from_env(cls, settings: Settings | None = None) -> AsyncProducer:
        """Build from the same settings as ``Producer.from_env`` (``CALLGATE_TOOLS`` is
        required)."""
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
        following = await self._open(turn_id, timeout)
        async for result in self._landing(following, timeout):
            yield result
        fanned_in(following.state, following.fan, following.loaded)

    async def collect(self, turn_id: str, timeout: float) -> Collected:
        """``Producer.collect``, awaited: up to ``timeout`` seconds for one result per call."""
        validation.check_timeout(timeout)
        following = await self._open(turn_id, timeout)
        async for _ in self._landing(following, timeout):
            pass
        fanned_in(following.state, following.fan, following.loaded)
        awaiting: dict[str, str] = {}
        fan = following.fan
        if not fan.complete:
            awaiting = await self._in_thread(
                "collect", turns.awaiting_approval, self.producer.engine, following.state.turn_id
            )
        return Collected(
            turn_id=str(following.state.turn_id),
            complete=fan.complete,
            results=fan.ordered(),
            pending=fan.pending,
            proposals=list(following.state.proposals),
            awaiting_approval={c: a for c, a in awaiting.items() if c in fan.pending},
        )

    async def aclose(self) -> None:
        await self.redis.aclose()
        await asyncio.to_thread(self.producer.close)

    async def _open(self, turn_id: str, timeout: float | None) -> _Following:
        state = await asyncio.to_thread(first_read, self.producer.engine, turn_id, timeout)
        stream = transport.results_stream(self.producer.settings.queue, state.turn_id)
        return _Following(state=state, fan=FanIn(state.proposals), stream=stream)

    async def _landing(self, following: _Following, timeout: float | None) -> AsyncIterator[Result]:
        """``Producer.collect``'s loop, awaited: the same ``Pacing`` decides each step, so
        Redis away means PostgreSQL is read instead, here as there."""
        fan = following.fan
        for raw in following.state.results:
            if fan.add(raw):
                yield fan.results[raw["call_id"]]
        now = time.monotonic()
        pacing = Pacing(
            now=now,
            deadline=None if timeout is None else now + timeout,
            recheck=POSTGRES_RECHECK_SECONDS,
        )
        while (step := pacing.step(fan.complete, time.monotonic())).next is not Next.DONE:
            landed: list[dict[str, Any]] = []
            if step.next is Next.READ_POSTGRES:
                results = await self._in_thread(
                    "collect", recheck, self.producer.engine, following.state.turn_id
                )
                pacing.postgres_read(time.monotonic())
                landed = results or []
            elif step.next is Next.WAIT:
                await asyncio.sleep(step.seconds)
            else:
                try:
                    reply: Any = await self.redis.xread(
                        {following.stream: following.last_id},
                        block=max(1, int(step.seconds * 1000)),
                        count=500,
                    )
                except REDIS_AWAY as exc:
                    log.warning("collect: cannot reach Redis (%s); reading PostgreSQL", exc)
                    pacing.redis_failed(time.monotonic())
                    following.last_id = "0-0"
                    continue
                for _stream, entries in reply or []:
                    for entry_id, fields in entries:
                        following.last_id = entry_id.decode()
                        landed.append(json.loads(fields[b"result"]))
            for raw in landed:
                if fan.add(raw):
                    yield fan.results[raw["call_id"]]

    @staticmethod
    async def _in_thread(what: str, fn: Callable[..., T], *args: Any) -> T:
        def run() -> T:
            with db.translate_errors(what):
                return fn(*args)

        return await asyncio.to_thread(run)


def _connect(url: str) -> redis.asyncio.Redis:
    transport.connect(url)  # the same URL check and error as the synchronous client
    return redis.asyncio.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
