"""How a handler is tried again: what may be repeated, how long to wait, and the budget.

A failed attempt is made again with the same idempotency key and fence only where a repeat
cannot apply a write twice (``may_retry``), while the call's lease holds, within its retry
budget (CALLGATE_RETRY_ATTEMPTS, CALLGATE_RETRY_BUDGET_SECONDS); a downstream's
``retry_after_ms`` is honoured. A status lookup only reads, so it is repeated after a dropped
connection (``lookup``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential,
    wait_random,
)

from callgate.core.errors import StaleFence, ToolError
from callgate.core.settings import Settings
from callgate.observe import metrics
from callgate.store import db
from callgate.tools.registry import Arguments, ExecutionContext, Tool
from callgate.worker import aio

_T = TypeVar("_T")

# Between two attempts of a handler: exponential back-off (0.1 s, 0.2 s, 0.4 s, … at most 2 s)
# plus up to 0.1 s of jitter, so calls that failed together do not retry together; never less
# than the downstream's own retry_after_ms. The attempts and the time they may take are the
# call's retry budget (CALLGATE_RETRY_ATTEMPTS, CALLGATE_RETRY_BUDGET_SECONDS).
BACKOFF = wait_exponential(multiplier=0.1, max=2) + wait_random(0, 0.1)


class Lease(Protocol):
    """What a retry asks of the call's lease: has it been lost?"""

    def expired(self) -> bool: ...


def safe_to_repeat(tool: Tool, key_age_seconds: float = 0.0) -> bool:
    """``Tool.safe_to_repeat``: may this tool run again after an attempt that may have
    applied?"""
    return tool.safe_to_repeat(key_age_seconds)


def key_dropped(tool: Tool, key_age_seconds: float) -> bool:
    """Does this write rest on an idempotency key its downstream no longer keeps?"""
    return (
        tool.kind == "write"
        and not tool.effect.idempotent
        and tool.downstream.idempotency_keys
        and not tool.downstream.keeps_key(key_age_seconds)
    )


def transient_failure(exc: BaseException) -> bool:
    """A failure of the handler's connection to its downstream that the next attempt may
    not meet: a dropped or terminated database connection (PostgreSQL's ``AdminShutdown``),
    a refused or reset socket, a timeout. Not a refusal, not a bug."""
    return db.is_connection_failure(exc) or isinstance(exc, ConnectionError | TimeoutError)


# A repeat-safe write (keyed or idempotent) that keeps meeting transient failures is run by at
# most this many deliveries (each retrying in place within CALLGATE_RETRY_ATTEMPTS and
# CALLGATE_RETRY_BUDGET_SECONDS; each later one a takeover after the lease), then ends
# ``failed_retryable``: a bounded number of runs, not one per dispatch.
REPEAT_SAFE_DELIVERIES = 3


def may_retry(tool: Tool, exc: BaseException, key_age_seconds: float = 0.0) -> bool:
    """May a failed attempt be made again with the same key and fence? A retryable refusal,
    a transient failure, or (for a repeat-safe write) any failure that is not a refusal,
    and only where a repeat cannot apply the write twice: a read, a repeat-safe write, or a
    refusal the handler says did not apply. A stale fence never."""
    if isinstance(exc, StaleFence):
        return False
    safe = safe_to_repeat(tool, key_age_seconds)
    if isinstance(exc, ToolError):
        return exc.retryable and (safe or exc.applied is False)
    if transient_failure(exc):
        return safe
    # A bug, an unexpected exception: its downstream replays the key (or the effect is
    # idempotent), so running it again cannot apply it twice.
    return safe and tool.kind == "write"


def lookup(read: Callable[[], _T], settings: Settings) -> _T:
    """A status lookup, again after a dropped connection within the retry budget: it only
    reads, so a repeat changes nothing (a terminated backend must not refuse a call)."""
    retrying = Retrying(
        stop=stop_after_attempt(settings.retry_attempts)
        | stop_before_delay(settings.retry_budget_seconds),
        wait=_wait,
        retry=retry_if_exception(transient_failure),
        reraise=True,
    )
    return retrying(read)


def retry_delay(backoff: float, retry_after_ms: int | None) -> float:
    """The wait before the next attempt: the back-off, or the downstream's hint if longer."""
    if retry_after_ms is None or retry_after_ms <= 0:
        return backoff
    return max(backoff, retry_after_ms / 1000)


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome is not None else None
    return retry_delay(BACKOFF(state), getattr(exc, "retry_after_ms", None))


def run_handler(
    tool: Tool,
    args: Arguments,
    ctx: ExecutionContext,
    heartbeat: Lease,
    *,
    attempts: int,
    budget_seconds: float,
    key_age_seconds: float = 0.0,
) -> dict[str, Any]:
    """Retry what ``may_retry`` allows with the same key and fence, while the lease holds,
    within the call's budget: at most ``attempts`` attempts, and no wait that would end past
    ``budget_seconds`` after the first attempt started. ``key_age_seconds``: how long ago the
    key was first sent, when this attempt started (a downstream keeps keys for a while).

    The first attempt runs bare: most succeed, and a retry policy costs more to set up than
    a no-op handler does to run. Only a failure that may be retried goes on under tenacity,
    which replays it as its attempt 1 (the handler does not run again for it) and counts the
    budget from the first attempt's start."""
    started = time.monotonic()

    def repeatable(exc: BaseException) -> bool:
        return may_retry(tool, exc, key_age_seconds + time.monotonic() - started)

    metrics.handler_invoked(tool.name, tool.kind)
    try:
        result: dict[str, Any] = aio.call(tool.handler, args, ctx)
        return result
    except Exception as exc:
        if attempts <= 1 or not repeatable(exc) or heartbeat.expired():
            raise
        first: Exception = exc
    replayed = False

    def attempt() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            raise first
        metrics.handler_invoked(tool.name, tool.kind)
        again: dict[str, Any] = aio.call(tool.handler, args, ctx)
        return again

    retrying = Retrying(
        before_sleep=lambda _: metrics.retry(tool.name),
        stop=stop_after_attempt(attempts)
        | stop_before_delay(max(0.0, budget_seconds - (time.monotonic() - started))),
        wait=_wait,
        retry=retry_if_exception(lambda e: repeatable(e) and not heartbeat.expired()),
        reraise=True,
    )
    retried: dict[str, Any] = retrying(attempt)
    return retried
