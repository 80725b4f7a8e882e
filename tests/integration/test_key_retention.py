"""A downstream that keeps idempotency keys for a limited time (24 hours, say): callgate sends
a key again only while the downstream still keeps it. Past that, a takeover or a later
attempt is settled as for a downstream without keys: the status lookup if the tool has one,
else ``reconciliation_pending``; the handler does not run again. Real Postgres and Redis;
the first attempt applies and then loses its connection (a real ``ConnectionError`` from
the handler), and the 25 hours are the key's first send moved back in the operation's row.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, text

from callgate.core.errors import ConfigurationError
from callgate.producer import Producer
from callgate.tools.registry import Downstream, ExecutionContext, Registry, SideEffect, Tool
from callgate.worker import executor
from callgate.worker.runtime import Runtime
from tests.integration.worlds import call_row, in_process, lease_expired, submit_one

CONTEXT = {"request_id": "req-keys", "tenant_id": "t1", "user_id": "u1", "roles": ["support"]}
DAY = 24 * 3600.0


class ChargeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int


@dataclass
class Gateway:
    """A payment gateway that deduplicates by idempotency key. Its first request applies and
    then the connection drops before the reply (``ConnectionError``)."""

    charges: dict[str, int] = field(default_factory=dict)
    invocations: int = 0

    def charge(self, args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        self.invocations += 1
        self.charges.setdefault(ctx.idempotency_key, args.amount)
        if self.invocations == 1:
            raise ConnectionError("connection reset by peer")
        return {"charged": self.charges[ctx.idempotency_key]}

    def find(self, args: Any, ctx: ExecutionContext) -> dict[str, Any] | None:
        found = self.charges.get(ctx.idempotency_key)
        return None if found is None else {"charged": found}


@dataclass
class World:
    engine: Engine
    rt: Runtime
    producer: Producer
    gateway: Gateway

    def submit(self) -> tuple[uuid.UUID, str]:
        return submit_one(self.producer, "charge", {"amount": 5}, CONTEXT)

    def key_sent_hours_ago(self, operation_id: str, hours: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE callgate.operations SET first_sent_at = now() - "
                    "make_interval(secs => :s) WHERE operation_id = :o"
                ),
                {"s": hours * 3600, "o": operation_id},
            )

    def lease_expired(self, operation_id: str) -> bool:
        return lease_expired(self.engine, operation_id)

    def call(self, ref: uuid.UUID) -> Any:
        return call_row(self.engine, ref)


def _world(database_url: str, redis_url: str, queue_name: str, *, lookup: bool) -> World:
    gateway = Gateway()
    tool = Tool(
        "charge",
        "Charge a card.",
        ChargeArgs,
        "write",
        gateway.charge,
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(idempotency_keys=True, keys_kept_seconds=DAY),
        lookup=gateway.find if lookup else None,
    )
    rt, producer, engine = in_process(
        database_url,
        redis_url,
        queue_name,
        Registry.of([tool], {"support": ["charge"]}),
        CALLGATE_LEASE_SECONDS="1",
        CALLGATE_RETRY_ATTEMPTS="1",  # the drop is not retried in place: a takeover
    )
    return World(engine, rt, producer, gateway)


@pytest.fixture
def world(database_url: str, redis_url: str, queue_name: str) -> Iterator[World]:
    w = _world(database_url, redis_url, queue_name, lookup=False)
    yield w
    w.engine.dispose()


@pytest.fixture
def world_with_lookup(database_url: str, redis_url: str, queue_name: str) -> Iterator[World]:
    w = _world(database_url, redis_url, queue_name, lookup=True)
    yield w
    w.engine.dispose()


def _first_attempt_applies_and_loses_its_connection(world: World) -> tuple[uuid.UUID, str]:
    ref, op = world.submit()
    executor.execute(world.rt, ref)  # applies, then the connection drops: the lease let go
    assert world.gateway.invocations == 1 and len(world.gateway.charges) == 1
    assert world.call(ref).state == "started"
    deadline = time.monotonic() + 10
    while not world.lease_expired(op) and time.monotonic() < deadline:
        time.sleep(0.1)
    return ref, op


def test_a_takeover_within_the_keys_lifetime_sends_the_key_again(world: World) -> None:
    ref, op = _first_attempt_applies_and_loses_its_connection(world)
    world.key_sent_hours_ago(op, 23)

    executor.execute(world.rt, ref)

    assert world.gateway.invocations == 2  # sent again, deduplicated downstream
    assert len(world.gateway.charges) == 1
    row = world.call(ref)
    assert row.state == "succeeded" and row.result["data"]["content"]["charged"] == 5


def test_a_takeover_after_the_key_was_dropped_does_not_send_it_again(world: World) -> None:
    ref, op = _first_attempt_applies_and_loses_its_connection(world)
    world.key_sent_hours_ago(op, 25)

    executor.execute(world.rt, ref)

    assert world.gateway.invocations == 1  # a second request would be a new charge
    assert len(world.gateway.charges) == 1
    row = world.call(ref)
    assert row.state == "failed_terminal"
    assert row.result["error"]["code"] == "reconciliation_pending"


def test_a_dropped_key_is_settled_by_the_status_lookup(world_with_lookup: World) -> None:
    world = world_with_lookup
    ref, op = _first_attempt_applies_and_loses_its_connection(world)
    world.key_sent_hours_ago(op, 25)

    executor.execute(world.rt, ref)

    assert world.gateway.invocations == 1
    row = world.call(ref)
    assert row.state == "succeeded" and row.result["data"]["content"]["charged"] == 5


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"idempotency_keys": True, "keys_kept_seconds": 0}, "a number above 0"),
        ({"idempotency_keys": True, "keys_kept_seconds": "1d"}, "a number above 0"),
        ({"keys_kept_seconds": DAY}, "without idempotency_keys=True"),
    ],
)
def test_a_keys_lifetime_that_cannot_hold_is_refused(
    declared: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Downstream(**declared)
