"""A keyed write whose handler keeps failing runs a bounded number of times, then ends
``failed_retryable``: a resend under the same operation id is safe (the downstream replays
the key), and the result says so. Before, a bug ended ``reconciliation_pending`` at once, and
a dropped connection every time was taken over once per dispatch (30 runs over ~100 s).

Real Postgres and Redis; deliveries run in process (``executor.execute``), each the way a
worker runs one; runs and charges are counted in the gateway.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine

from callgate.producer import Producer
from callgate.tools.registry import Downstream, ExecutionContext, Registry, SideEffect, Tool
from callgate.worker import executor, retry
from callgate.worker.runtime import Runtime
from tests.integration.worlds import call_row, in_process, lease_expired, submit_one

CONTEXT = {"request_id": "req-keyed", "tenant_id": "t1", "user_id": "u1", "roles": ["support"]}
ATTEMPTS = 2  # CALLGATE_RETRY_ATTEMPTS: each delivery runs the handler at most this often


class ChargeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int


@dataclass
class Gateway:
    """Deduplicates by idempotency key; after applying, the handler raises ``failure``."""

    failure: Callable[[], Exception]
    charges: dict[str, int] = field(default_factory=dict)
    runs: int = 0

    def charge(self, args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        self.runs += 1
        self.charges.setdefault(ctx.idempotency_key, args.amount)
        raise self.failure()


@dataclass
class World:
    engine: Engine
    rt: Runtime
    producer: Producer
    gateway: Gateway

    def submit(self) -> tuple[uuid.UUID, str]:
        return submit_one(self.producer, "charge", {"amount": 5}, CONTEXT)

    def call(self, ref: uuid.UUID) -> Any:
        return call_row(self.engine, ref)

    def wait_for_lease_to_expire(self, operation_id: str) -> None:
        deadline = time.monotonic() + 10
        while not lease_expired(self.engine, operation_id):
            if time.monotonic() > deadline:
                raise AssertionError("the lease did not expire")
            time.sleep(0.1)


def _world(
    database_url: str, redis_url: str, queue_name: str, failure: Callable[[], Exception]
) -> World:
    gateway = Gateway(failure)
    tool = Tool(
        "charge",
        "Charge a card.",
        ChargeArgs,
        "write",
        gateway.charge,
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(idempotency_keys=True),
    )
    rt, producer, engine = in_process(
        database_url,
        redis_url,
        queue_name,
        Registry.of([tool], {"support": ["charge"]}),
        CALLGATE_LEASE_SECONDS="1",
        CALLGATE_RETRY_ATTEMPTS=str(ATTEMPTS),
    )
    return World(engine, rt, producer, gateway)


@pytest.fixture
def make_world(
    database_url: str, redis_url: str, queue_name: str
) -> Iterator[Callable[[Callable[[], Exception]], World]]:
    made: list[World] = []

    def make(failure: Callable[[], Exception]) -> World:
        w = _world(database_url, redis_url, queue_name, failure)
        made.append(w)
        return w

    yield make
    for w in made:
        w.engine.dispose()


def test_a_bug_is_retried_in_place_then_ends_failed_retryable(
    make_world: Callable[[Callable[[], Exception]], World],
) -> None:
    world = make_world(lambda: RuntimeError("KeyError in the response parser"))
    ref, _ = world.submit()

    executor.execute(world.rt, ref)

    assert world.gateway.runs == ATTEMPTS  # retried in place, with the same key
    assert len(world.gateway.charges) == 1
    row = world.call(ref)
    assert row.state == "failed_retryable", row
    error = row.result["error"]
    assert error["code"] == "execution_failed"
    assert "a resend under the same operation id is safe" in str(error["details"])
    assert "KeyError" not in str(row.result)  # a handler's text never reaches the model


def test_a_connection_dropped_every_time_ends_after_a_bounded_number_of_deliveries(
    make_world: Callable[[Callable[[], Exception]], World],
) -> None:
    world = make_world(lambda: ConnectionError("connection reset by peer"))
    ref, op = world.submit()

    deliveries = 0
    while deliveries < retry.REPEAT_SAFE_DELIVERIES + 2:
        deliveries += 1
        executor.execute(world.rt, ref)
        if world.call(ref).state != "started":
            break
        world.wait_for_lease_to_expire(op)  # the delivery let its lease go: a takeover

    assert deliveries == retry.REPEAT_SAFE_DELIVERIES
    assert world.gateway.runs == ATTEMPTS * retry.REPEAT_SAFE_DELIVERIES
    assert len(world.gateway.charges) == 1
    row = world.call(ref)
    assert row.state == "failed_retryable", row
    assert row.result["error"]["code"] == "upstream_unavailable"
    assert f"failed in {retry.REPEAT_SAFE_DELIVERIES} deliveries" in str(row.result["error"])
