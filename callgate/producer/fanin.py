"""Fan-in: join results to proposals by call id, and the loop that waits for them.
Pure: no I/O. The loop (``follow``) is a generator that asks for each read or wait and is
told the answer, so ``Producer.collect`` and ``AsyncProducer`` drive the same decisions, one
with blocking calls, the other awaited.

Never by array position or arrival order. A result for an unknown call, a result with
another tool's name, or a second, different result for one call is an error; an identical
second copy (the relayer published twice) is dropped and counted.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from callgate.core.errors import CorrelationError, ErrorCode
from callgate.core.types import (
    RESULT_ADAPTER,
    TERMINAL_STATES,
    FailedRetryable,
    FailedTerminal,
    Succeeded,
)

Result = Succeeded | FailedRetryable | FailedTerminal

log = logging.getLogger("callgate.producer")

# Redis is down or restarting: PostgreSQL holds every committed result too.
REDIS_AWAY = (RedisConnectionError, RedisTimeoutError)

# How often the loop re-reads Postgres while it waits on the stream: the safety net for a
# publish Redis dropped. Results normally arrive through the stream within milliseconds.
POSTGRES_RECHECK_SECONDS = 1.0


@dataclass
class FanIn:
    proposals: Sequence[tuple[str, str]]  # (call_id, tool_name), proposal order
    results: dict[str, Result] = field(default_factory=dict)
    duplicates: int = 0

    def __post_init__(self) -> None:
        self._tools = dict(self.proposals)
        if len(self._tools) != len(self.proposals):
            raise CorrelationError(
                "proposal set has a repeated call id", code=ErrorCode.INVALID_INPUT
            )

    def add(self, raw: dict[str, Any]) -> bool:
        """Take one result. Returns False for an identical duplicate."""
        if not isinstance(raw, dict) or not isinstance(raw.get("call_id"), str):
            raise CorrelationError(
                "a result is not an object with a string call_id",
                code=ErrorCode.NON_TERMINAL_RESULT,
            )
        call_id = raw["call_id"]
        if call_id not in self._tools:
            raise CorrelationError(
                f"result for call {call_id!r}, which was not proposed",
                code=ErrorCode.EXTRA_RESULT,
            )
        if raw.get("tool_name") != self._tools[call_id]:
            raise CorrelationError(
                f"result for call {call_id!r} names tool {raw.get('tool_name')!r},"
                f" the proposal named {self._tools[call_id]!r}",
                code=ErrorCode.TOOL_NAME_MISMATCH,
            )
        if raw.get("status") not in TERMINAL_STATES:
            raise CorrelationError(
                f"result for call {call_id!r} has non-terminal status {raw.get('status')!r}",
                code=ErrorCode.NON_TERMINAL_RESULT,
            )
        try:
            result = RESULT_ADAPTER.validate_python(raw)
        except ValidationError:
            raise CorrelationError(
                f"result for call {call_id!r} is malformed", code=ErrorCode.NON_TERMINAL_RESULT
            ) from None
        existing = self.results.get(call_id)
        if existing is not None:
            if existing == result:
                self.duplicates += 1
                return False
            raise CorrelationError(
                f"two different terminal results for call {call_id!r}",
                code=ErrorCode.DUPLICATE_RESULT,
            )
        self.results[call_id] = result
        return True

    def add_all(self, raws: Iterable[dict[str, Any]]) -> None:
        for raw in raws:
            self.add(raw)

    @property
    def pending(self) -> list[str]:
        return [call_id for call_id, _ in self.proposals if call_id not in self.results]

    @property
    def complete(self) -> bool:
        return not self.pending

    def ordered(self) -> list[Result]:
        """Results in proposal order (only those that arrived)."""
        return [self.results[c] for c, _ in self.proposals if c in self.results]


def correlate(
    proposals: Sequence[tuple[str, str]], results: Iterable[dict[str, Any]]
) -> list[Result]:
    """Exactly one terminal result per proposal, in proposal order, or a CorrelationError."""
    fan = FanIn(proposals)
    fan.add_all(results)
    if fan.pending:
        raise CorrelationError(
            f"no result for call(s) {fan.pending}", code=ErrorCode.MISSING_RESULT
        )
    return fan.ordered()


# --- the fan-in loop's decisions, shared by Producer.collect and AsyncProducer ---------------


class Next(Enum):
    DONE = "done"  # every call has its result, or the time is up
    READ_STREAM = "read_stream"  # block on the turn's Redis stream for ``seconds``
    READ_POSTGRES = "read_postgres"  # re-read the committed results (the safety net)
    WAIT = "wait"  # Redis is away: wait ``seconds``, then try it and PostgreSQL again


@dataclass(frozen=True)
class Step:
    next: Next
    seconds: float = 0.0


@dataclass
class Pacing:
    """When a fan-in reads what. Pure: the caller does the I/O and reports back, so the
    synchronous and the asyncio loops take the same decisions.

    Results normally arrive on the Redis stream; PostgreSQL, which holds every committed
    result, is re-read every ``recheck`` seconds (a publish Redis lost), and at once when
    Redis cannot be reached, then every ``recheck`` seconds until it is back."""

    now: float
    deadline: float | None  # None: until every call has a result
    recheck: float
    next_recheck: float = field(init=False)
    redis_back_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.next_recheck = self.now + self.recheck
        self.redis_back_at = self.now

    def step(self, complete: bool, now: float) -> Step:
        if complete:
            return Step(Next.DONE)
        remaining = None if self.deadline is None else self.deadline - now
        if remaining is not None and remaining <= 0:
            return Step(Next.DONE)
        if now >= self.next_recheck:
            return Step(Next.READ_POSTGRES)
        until = self.next_recheck - now
        if remaining is not None:
            until = min(until, remaining)
        if now < self.redis_back_at:
            return Step(Next.WAIT, max(0.0, min(until, self.redis_back_at - now)))
        return Step(Next.READ_STREAM, max(0.001, until))

    def postgres_read(self, now: float) -> None:
        """A re-read was attempted (whether PostgreSQL answered or not)."""
        self.next_recheck = now + self.recheck

    def redis_failed(self, now: float) -> None:
        """Redis could not be reached: read PostgreSQL now, try Redis again later (its
        stream from the start: fan-in drops the copies)."""
        self.next_recheck = now
        self.redis_back_at = now + self.recheck


# --- the fan-in loop: what to read or wait for next, told the answer by its driver -----------


@dataclass(frozen=True)
class ReadPostgres:
    """Re-read the turn's committed results. Answer: the results, or None while PostgreSQL
    is away (the loop looks again later)."""


@dataclass(frozen=True)
class ReadStream:
    """Block up to ``block_ms`` on the turn's result stream after ``last_id``. Answer: the
    XREAD reply; a ``REDIS_AWAY`` error is thrown into the loop instead."""

    stream: str
    last_id: str
    block_ms: int


@dataclass(frozen=True)
class Sleep:
    """Redis is away and PostgreSQL was just read: wait ``seconds``. Answer: None."""

    seconds: float


@dataclass(frozen=True)
class Landed:
    """Not I/O: a result the fan-in accepted (first copies only), for a driver that yields
    results as they land. Answer: None."""

    result: Result


Request = ReadPostgres | ReadStream | Sleep | Landed
Loop = Generator[Request, Any, None]


def follow(
    fan: FanIn,
    stream: str,
    committed: Iterable[dict[str, Any]],
    deadline: float | None,
    *,
    recheck: float = POSTGRES_RECHECK_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> Loop:
    """The one fan-in loop: ``committed`` (what the first read found) first, then the stream,
    with PostgreSQL re-read every ``recheck`` seconds and instead of the stream while Redis
    is away, until ``fan`` is complete or ``clock()`` reaches ``deadline`` (None: no limit)."""
    for raw in committed:
        if fan.add(raw):
            yield Landed(fan.results[raw["call_id"]])
    pacing = Pacing(now=clock(), deadline=deadline, recheck=recheck)
    last_id = "0-0"
    while (step := pacing.step(fan.complete, clock())).next is not Next.DONE:
        landed: list[dict[str, Any]] = []
        if step.next is Next.READ_POSTGRES:
            landed = (yield ReadPostgres()) or []
            pacing.postgres_read(clock())
        elif step.next is Next.WAIT:
            yield Sleep(step.seconds)
        else:
            try:
                reply = yield ReadStream(stream, last_id, max(1, int(step.seconds * 1000)))
            except REDIS_AWAY as exc:
                log.warning("collect: cannot reach Redis (%s); reading PostgreSQL", exc)
                pacing.redis_failed(clock())
                last_id = "0-0"  # read the stream from the start when it is back
                continue
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last_id = entry_id.decode()
                    landed.append(json.loads(fields[b"result"]))
        for raw in landed:
            if fan.add(raw):
                yield Landed(fan.results[raw["call_id"]])


def advance(loop: Loop, answer: Any = None, error: BaseException | None = None) -> Request | None:
    """Resume ``loop`` with the answer to its last request (or the error that request
    raised); its next request, or None once it is done. A driver starts it with no answer."""
    try:
        return loop.send(answer) if error is None else loop.throw(error)
    except StopIteration:
        return None
