"""The worker's retry decisions: what may be tried again, how long to wait, and that a
downstream's retry_after_ms is honoured; the budget settings."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from callgate.core.errors import ConfigurationError, ErrorCode, StaleFence, ToolError
from callgate.core.settings import Settings
from callgate.ops.lab.chaos.tools import UNKEYED, chaos_registry
from callgate.tools.registry import ExecutionContext
from callgate.worker.retry import (
    key_dropped,
    lookup,
    may_retry,
    retry_delay,
    run_handler,
    safe_to_repeat,
    transient_failure,
)

REGISTRY = chaos_registry()
READ = REGISTRY.tools["get_stock"]
KEYED = REGISTRY.tools["send_email"]
UNKEYED_WRITE = REGISTRY.tools[UNKEYED]


def admin_shutdown() -> OperationalError:
    """What SQLAlchemy raises when pg_terminate_backend ends a handler's connection."""
    orig = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    return OperationalError("INSERT ...", {}, orig)


def unavailable(applied: bool | None = None) -> ToolError:
    return ToolError("down", code=ErrorCode.UPSTREAM_UNAVAILABLE, applied=applied)


def test_a_terminated_connection_is_transient_and_a_bug_is_not() -> None:
    assert transient_failure(admin_shutdown())
    assert transient_failure(psycopg.OperationalError("server closed the connection"))
    assert transient_failure(ConnectionResetError()) and transient_failure(TimeoutError())
    assert not transient_failure(ValueError("bug"))
    assert not transient_failure(psycopg.errors.ProgramLimitExceeded("row too big"))


def test_a_keyed_write_and_a_read_are_retried_after_a_dropped_connection() -> None:
    assert may_retry(KEYED, admin_shutdown())
    assert may_retry(READ, admin_shutdown())


def test_an_unkeyed_write_is_never_retried_unless_it_surely_did_not_apply() -> None:
    assert not may_retry(UNKEYED_WRITE, admin_shutdown())
    assert not may_retry(UNKEYED_WRITE, unavailable())
    assert may_retry(UNKEYED_WRITE, unavailable(applied=False))


def test_a_stale_fence_and_a_terminal_refusal_are_never_retried() -> None:
    for tool in (READ, KEYED):
        assert not may_retry(tool, StaleFence("newer owner"))
        assert not may_retry(tool, ToolError("no", code=ErrorCode.NOT_FOUND))


def test_a_bug_is_retried_only_where_the_key_makes_a_repeat_harmless() -> None:
    assert may_retry(KEYED, RuntimeError("bug"))
    assert may_retry(KEYED, KeyError("field"))
    assert not may_retry(READ, RuntimeError("bug"))  # a read's bug fails the same way again
    assert not may_retry(UNKEYED_WRITE, RuntimeError("bug"))


def test_an_idempotent_write_is_retried_like_a_keyed_one() -> None:
    idempotent = dataclasses.replace(
        UNKEYED_WRITE, effect=dataclasses.replace(UNKEYED_WRITE.effect, idempotent=True)
    )
    assert may_retry(idempotent, admin_shutdown())


@pytest.mark.parametrize(
    ("backoff", "hint", "expected"),
    [(0.2, None, 0.2), (0.2, 0, 0.2), (0.2, -5, 0.2), (0.2, 1500, 1.5), (3.0, 1500, 3.0)],
)
def test_the_wait_is_the_backoff_or_the_downstreams_hint_if_longer(
    backoff: float, hint: int | None, expected: float
) -> None:
    assert retry_delay(backoff, hint) == expected


def test_the_retry_budget_settings() -> None:
    default = Settings.from_env({})
    assert (default.retry_attempts, default.retry_budget_seconds) == (3, 10.0)
    s = Settings.from_env({"CALLGATE_RETRY_ATTEMPTS": "5", "CALLGATE_RETRY_BUDGET_SECONDS": "2.5"})
    assert (s.retry_attempts, s.retry_budget_seconds) == (5, 2.5)
    with pytest.raises(ConfigurationError, match="CALLGATE_RETRY_ATTEMPTS"):
        Settings.from_env({"CALLGATE_RETRY_ATTEMPTS": "0"})
    assert Settings.from_env({"CALLGATE_WORKER_SWEEP": "off"}).worker_sweep is False
    assert default.worker_sweep is True


class _Held:
    """A lease that holds (the handler's retries stop early when it does not)."""

    def expired(self) -> bool:
        return False


def _attempts(failure: BaseException | None, *, tool: Any = READ, **budget: Any) -> list[float]:
    """Run ``_run_handler`` on a handler that fails with ``failure`` once per attempt; returns
    when each attempt started."""
    started: list[float] = []

    def handler(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        started.append(time.monotonic())
        if failure is not None:
            raise failure
        return {"ok": True}

    ctx = ExecutionContext("t", "u", "op", "key", 1, "r")
    with contextlib.suppress(Exception):
        run_handler(
            dataclasses.replace(tool, handler=handler),
            {},
            ctx,
            _Held(),
            **budget,  # type: ignore[arg-type]
        )
    return started


def test_a_retryable_refusal_is_tried_up_to_the_attempt_budget_with_growing_waits() -> None:
    started = _attempts(unavailable(), attempts=3, budget_seconds=10)
    assert len(started) == 3
    first, second = started[1] - started[0], started[2] - started[1]
    assert 0.1 <= first < second  # 0.1 s + jitter, then 0.2 s + jitter


def test_retry_after_ms_is_waited_for_and_a_hint_past_the_budget_ends_the_retries() -> None:
    hinted = ToolError("slow down", code=ErrorCode.UPSTREAM_UNAVAILABLE, retry_after_ms=600)
    started = _attempts(hinted, attempts=2, budget_seconds=10)
    assert len(started) == 2 and started[1] - started[0] >= 0.6
    too_long = ToolError("later", code=ErrorCode.UPSTREAM_UNAVAILABLE, retry_after_ms=60_000)
    t0 = time.monotonic()
    assert len(_attempts(too_long, attempts=5, budget_seconds=2)) == 1
    assert time.monotonic() - t0 < 5  # no sleep past the budget


def test_a_dropped_connection_is_retried_for_a_keyed_write_and_not_for_an_unkeyed_one() -> None:
    assert len(_attempts(admin_shutdown(), tool=KEYED, attempts=3, budget_seconds=10)) == 3
    assert len(_attempts(admin_shutdown(), tool=UNKEYED_WRITE, attempts=3, budget_seconds=10)) == 1


def test_a_status_lookup_is_read_again_after_a_dropped_connection_but_not_after_a_bug() -> None:
    settings = Settings.from_env({})
    reads: list[int] = []

    def flaky() -> str:
        reads.append(1)
        if len(reads) == 1:
            raise admin_shutdown()
        return "found"

    assert lookup(flaky, settings) == "found" and len(reads) == 2

    def broken() -> str:
        reads.append(1)
        raise ValueError("bug")

    reads.clear()
    with pytest.raises(ValueError):
        lookup(broken, settings)
    assert len(reads) == 1


def test_a_key_is_sent_again_only_while_its_downstream_keeps_it() -> None:
    from callgate.tools.registry import KEY_MARGIN_SECONDS, Downstream

    kept = dataclasses.replace(
        KEYED, downstream=Downstream(idempotency_keys=True, keys_kept_seconds=3600)
    )
    assert safe_to_repeat(kept, 0) and safe_to_repeat(kept, 3600 - KEY_MARGIN_SECONDS - 1)
    assert not safe_to_repeat(kept, 3600 - KEY_MARGIN_SECONDS)
    assert key_dropped(kept, 3600) and not key_dropped(kept, 10)
    assert safe_to_repeat(KEYED, 10 * 365 * 86400)  # no lifetime declared: kept
    assert not key_dropped(KEYED, 10 * 365 * 86400)
    assert not key_dropped(UNKEYED_WRITE, 10**9)  # no key to drop
    drop = ConnectionResetError()
    assert may_retry(kept, drop, 10) and not may_retry(kept, drop, 3600)
    assert may_retry(kept, unavailable(applied=False), 3600)  # did not apply: repeat is safe
