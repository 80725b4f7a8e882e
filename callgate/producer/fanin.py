"""Fan-in: join results to proposals by call id, and pace the loop that waits for them.
Pure: no I/O.

Never by array position or arrival order. A result for an unknown call, a result with
another tool's name, or a second, different result for one call is an error; an identical
second copy (the relayer published twice) is dropped and counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pydantic import ValidationError

from callgate.core.errors import CorrelationError, ErrorCode
from callgate.core.types import (
    RESULT_ADAPTER,
    TERMINAL_STATES,
    FailedRetryable,
    FailedTerminal,
    Succeeded,
)

Result = Succeeded | FailedRetryable | FailedTerminal


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
