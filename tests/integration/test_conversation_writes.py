"""One write per conversation: the same refund proposed again in a later turn of one
conversation (a model that lost the first result) is refused with ``repeated_call`` and
applied once; the application's ``repeat`` makes it again. Real Postgres and Redis, each
call delivered by the worker's executor; refunds counted in the demo downstream."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from callgate.ops.lab.demo.tools import demo_registry
from callgate.worker import executor
from tests.integration.worlds import in_process

REFUND = {"order_id": "O-17", "amount": 3, "currency": "KRW"}


@pytest.fixture
def world(
    make_own_database: Callable[[], str],
    redis_url: str,
    queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Any]:
    # A database of its own: the order's refundable amount is not spent by other tests.
    database_url = make_own_database()
    # The demo tools' own services read their database from the environment.
    monkeypatch.setenv("CALLGATE_DATABASE_URL", database_url)
    monkeypatch.setenv("CALLGATE_REDIS_URL", redis_url)
    rt, producer, engine = in_process(database_url, redis_url, queue_name, demo_registry())
    yield rt, producer, engine
    engine.dispose()


def _turn(world: Any, conversation: str, call_id: str, **extra: Any) -> tuple[str, str]:
    rt, producer, engine = world
    context = {
        "request_id": f"req-{uuid.uuid4().hex[:8]}",
        "tenant_id": "tenant-a",
        "user_id": "user-17",
        "roles": ["support"],
        "conversation_id": conversation,
    }
    turn = producer.submit(
        [{"call_id": call_id, "tool_name": "refund_payment", "arguments": REFUND, **extra}],
        context,
    )
    (call,) = turn.calls
    executor.execute(rt, uuid.UUID(call.ref))
    with engine.connect() as conn:
        state, result = conn.execute(
            text("SELECT state, result FROM callgate.calls WHERE id = :r"), {"r": call.ref}
        ).one()
    return state, (result.get("error") or {}).get("code") or "ok"


def _refunds(engine: Engine, conversation: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM downstream.side_effects s"
                    " JOIN callgate.operations o ON o.idempotency_key = s.idempotency_key"
                    " JOIN callgate.calls c ON c.operation_id = o.operation_id"
                    " JOIN callgate.turns t ON t.turn_id = c.turn_id"
                    " WHERE t.conversation_id = :c"
                ),
                {"c": conversation},
            ).scalar_one()
        )


def test_the_same_refund_in_a_later_turn_is_refused_not_applied_twice(world: Any) -> None:
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    assert _turn(world, conversation, "turn1-refund") == ("succeeded", "ok")
    assert _turn(world, conversation, "turn2-refund") == ("failed_terminal", "repeated_call")
    assert _refunds(world[2], conversation) == 1
    # Another conversation is another user's request: it runs.
    other = f"conv-{uuid.uuid4().hex[:8]}"
    assert _turn(world, other, "turn1-refund") == ("succeeded", "ok")


def test_the_application_may_mean_it_again(world: Any) -> None:
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    assert _turn(world, conversation, "turn1-refund") == ("succeeded", "ok")
    assert _turn(world, conversation, "turn2-refund", repeat=True) == ("succeeded", "ok")
    assert _refunds(world[2], conversation) == 2
