"""A stack of real processes on a private Redis, for tests that flush or stop Redis, with
the test registry (tests.acceptance.legacy_tools) and short leases, and helpers to submit one
call and read its outcome."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from callgate.core.settings import Settings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db
from tests.acceptance import legacy_tools
from tests.acceptance.conftest import SUPPORT_A, scalar
from tests.acceptance.processes import PrivateRedis

LEGACY = "tests.acceptance.legacy_tools:registry"
FAST = {
    "CALLGATE_LEASE_SECONDS": "1",
    "CALLGATE_SWEEP_SECONDS": "0.2",
    "CALLGATE_STALE_SECONDS": "1",
}
NO_DELAY = {"CALLGATE_DEMO_DELAY_MS": ""}


@pytest.fixture
def database_url(make_own_database: Callable[[], str]) -> str:
    """A private stack has its own database too: its sweeper must not re-dispatch the open
    calls other tests left in the shared one (a test that counts refunds would count theirs)."""
    return make_own_database()


@pytest.fixture
def env(database_url: str, private_redis: PrivateRedis, queue_name: str) -> dict[str, str]:
    return {
        "CALLGATE_DATABASE_URL": database_url,
        "CALLGATE_REDIS_URL": private_redis.url,
        "CALLGATE_QUEUE": queue_name,
        "CALLGATE_TOOLS": LEGACY,
        **FAST,
    }


@pytest.fixture
def start(env: dict[str, str]) -> Iterator[Callable[..., Stack]]:
    started: list[Stack] = []

    def start_(*, workers: int = 1, relayer: bool = True, sweeper: bool = True, **extra: str):
        s = Stack(env={**env, **extra}, workers=workers, relayer=relayer, sweeper=sweeper)
        s.__enter__()
        started.append(s)
        if workers:
            wait_for_workers(env["CALLGATE_REDIS_URL"], env["CALLGATE_QUEUE"], workers)
        return s

    yield start_
    for s in started:
        s.stop()


@pytest.fixture
def make_producer(env: dict[str, str]) -> Iterator[Callable[..., Producer]]:
    made: list[Producer] = []

    def make(**extra: str) -> Producer:
        settings = Settings.from_env({**env, **extra})
        p = Producer(
            settings=settings,
            engine=db.create(settings.require_database()),
            redis_connection=transport.connect(settings.require_redis()),
            registry=legacy_tools.registry(),
        )
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def submit_one(
    producer: Producer,
    tool: str,
    arguments: dict[str, Any],
    *,
    call_id: str = "c1",
    operation_id: str | None = None,
) -> tuple[str, str, str]:
    turn = producer.submit(
        [{"call_id": call_id, "tool_name": tool, "arguments": arguments}],
        SUPPORT_A,
        operation_ids={call_id: operation_id} if operation_id else None,
    )
    (call,) = turn.calls
    return turn.turn_id, call.ref, call.operation_id


def key_of(engine: Engine, operation_id: str) -> str:
    return str(
        scalar(
            engine,
            "SELECT idempotency_key FROM callgate.operations WHERE operation_id = :o",
            o=operation_id,
        )
    )


def dispatches(engine: Engine, ref: str) -> int:
    return int(scalar(engine, "SELECT dispatches FROM callgate.calls WHERE id = :r", r=ref))


def only_result(producer: Producer, turn_id: str, timeout: float = 20) -> Any:
    collected = producer.collect(turn_id, timeout=timeout)
    assert collected.complete, f"the call did not end: pending {collected.pending}"
    (result,) = collected.results
    return result


def code_of(result: Any) -> str:
    return str(result.error.code)


def worker_without_delay(s: Stack, name: str, **env: str) -> None:
    s.start(
        name,
        ["worker", "--name", f"{name}-{os.getpid()}-{time.monotonic_ns()}"],
        env={
            **NO_DELAY,
            **env,
        },
    )
