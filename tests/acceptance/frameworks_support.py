"""What the agent-framework tests share: a database of their own (their sweeper must not
re-dispatch other tests' calls, and they count the demo downstream's rows), real worker,
relayer and sweeper processes with short leases, an AsyncProducer on the test's event loop,
and an approver who is not the requester."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine

from callgate import AsyncProducer
from callgate.core.settings import Settings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.queue import transport
from callgate.store import approvals
from tests.acceptance.conftest import scalar, wait_until

T = TypeVar("T")

FAST = {
    "CALLGATE_LEASE_SECONDS": "1",
    "CALLGATE_SWEEP_SECONDS": "0.2",
    "CALLGATE_STALE_SECONDS": "1",
}
# The refund sleeps a minute after the payments provider applied it: its crash gap.
CRASH_GAP = {"CALLGATE_DEMO_DELAY_MS": "refund_payment=0:60000"}
APPROVER = "user-99"  # of tenant-a, and not the requester (user-17)


@pytest.fixture
def database_url(make_own_database: Callable[[], str]) -> str:
    return make_own_database()


@pytest.fixture
def fw_stack(service_env: dict[str, str]) -> Iterator[Callable[..., Stack]]:
    started: list[Stack] = []

    def start(*, workers: int = 2, **env: str) -> Stack:
        s = Stack(env={**service_env, **FAST, **env}, workers=workers)
        s.__enter__()
        started.append(s)
        wait_for_workers(service_env["CALLGATE_REDIS_URL"], service_env["CALLGATE_QUEUE"], workers)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def in_loop(service_env: dict[str, str]) -> Callable[..., Any]:
    """Run ``fn(producer)`` on a new event loop with an AsyncProducer made on that loop."""

    def run(fn: Callable[[AsyncProducer], Awaitable[T]]) -> T:
        async def main() -> T:
            async with AsyncProducer.from_env(Settings.from_env(service_env)) as producer:
                return await fn(producer)

        return asyncio.run(main())

    return run


def support_context(**extra: Any) -> dict[str, Any]:
    """user-17 of tenant-a, support role, with a request id of its own."""
    return {
        "request_id": f"req-{uuid.uuid4().hex[:10]}",
        "tenant_id": "tenant-a",
        "user_id": "user-17",
        "roles": ["support"],
        **extra,
    }


def approve(producer: AsyncProducer, approval_id: str, *, by: str = APPROVER) -> int:
    """What ``callgate approvals approve ID --by USER --tenant tenant-a`` does."""
    resumed = approvals.approve(producer.producer.engine, approval_id, by=by, tenant="tenant-a")
    transport.enqueue_calls(
        producer.producer.queue, resumed, timeout=producer.producer.settings.job_timeout_seconds
    )
    return len(resumed)


def effects_of_tool(engine: Engine, request_id: str, tool_name: str) -> int:
    """Rows the demo downstream changed for the writes of one request's calls of a tool."""
    return int(
        scalar(
            engine,
            "SELECT count(*) FROM downstream.side_effects s"
            " WHERE s.idempotency_key IN (SELECT o.idempotency_key FROM callgate.operations o"
            "   JOIN callgate.calls c ON c.operation_id = o.operation_id"
            "   JOIN callgate.turns t ON t.turn_id = c.turn_id"
            "  WHERE t.request_id = :r AND c.tool_name = :tool)",
            r=request_id,
            tool=tool_name,
        )
    )


def turns_of(engine: Engine, request_id: str) -> int:
    return int(
        scalar(engine, "SELECT count(*) FROM callgate.turns WHERE request_id = :r", r=request_id)
    )


async def kill_in_crash_gap(s: Stack, engine: Engine, request_id: str) -> None:
    """Once the refund applied, SIGKILL its worker (and its sibling) in the crash gap, then
    start a worker without the delay: the sweeper re-dispatches, the new worker takes over."""

    def applied() -> bool:
        return effects_of_tool(engine, request_id, "refund_payment") == 1

    await asyncio.to_thread(wait_until, applied, 30.0, "the refund to apply")
    for name in [n for n in s.procs if n.startswith("worker")]:
        s.signal(name, signal.SIGKILL)
        s.procs[name].wait()
    s.start(
        "worker-after",
        ["worker", "--name", f"after-{os.getpid()}-{time.monotonic_ns()}"],
        env={"CALLGATE_DEMO_DELAY_MS": ""},
    )
