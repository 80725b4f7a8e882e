"""``AsyncProducer`` against real workers, relayer, Postgres and Redis."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, text

from callgate import AsyncProducer, Producer
from callgate.core.errors import ErrorCode, InputError, ProducerClosed, UnknownTurn
from callgate.core.settings import Settings
from callgate.core.types import ProposedCall
from callgate.ops.stack import Stack
from callgate.producer.frameworks.relay import Parked, TurnRelay
from callgate.queue import transport
from tests.acceptance.conftest import SUPPORT_A

READS = [
    {"call_id": "slow", "tool_name": "get_weather", "arguments": {"city": "Seoul"}},
    {"call_id": "fast", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}},
    {"call_id": "middle", "tool_name": "get_news", "arguments": {"topic": "tech"}},
]
DELAYS = "get_weather=300,get_stock=0,get_news=150"


T = TypeVar("T")


@pytest.fixture
def in_loop(service_env: dict[str, str]) -> Callable[..., Any]:
    """Run ``fn(producer)`` on a new event loop with an AsyncProducer made on that loop (its
    Redis connections belong to the loop they were made on), closed afterwards."""

    def run(fn: Callable[[AsyncProducer], Awaitable[T]]) -> T:
        async def main() -> T:
            async with AsyncProducer.from_env(Settings.from_env(service_env)) as p:
                return await fn(p)

        return asyncio.run(main())

    return run


def _publish_order(engine: Engine, turn_id: str) -> list[str]:
    """The order the relayer published the turn's results in: its outbox rows' order."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.call_id FROM callgate.outbox o JOIN callgate.calls c ON c.id = o.call_ref"
                " WHERE c.turn_id = :t ORDER BY o.id"
            ),
            {"t": turn_id},
        )
        return [r.call_id for r in rows]


def test_results_stream_each_call_once_in_the_order_they_land(
    in_loop: Callable[..., Any], stack: Callable[..., Stack], engine: Engine
) -> None:
    stack(workers=1, CALLGATE_WORKER_CONCURRENCY="4", CALLGATE_DEMO_DELAY_MS=DELAYS)

    async def run(aproducer: AsyncProducer) -> tuple[str, list[str]]:
        turn = await aproducer.submit(READS, SUPPORT_A)
        seen = [r.call_id async for r in aproducer.results(turn.turn_id, timeout=30)]
        return turn.turn_id, seen

    turn_id, seen = in_loop(run)
    assert sorted(seen) == ["fast", "middle", "slow"]
    assert seen == _publish_order(engine, turn_id)


def test_a_result_published_twice_is_yielded_once(
    in_loop: Callable[..., Any], stack: Callable[..., Stack], producer: Producer
) -> None:
    stack(workers=1)

    async def run(aproducer: AsyncProducer) -> list[str]:
        turn = await aproducer.submit(READS[1:], SUPPORT_A)
        first = [r.call_id async for r in aproducer.results(turn.turn_id, timeout=30)]
        # The relayer may publish a result again (a crash between publish and mark): copy
        # every entry of the stream once more, as a second publish would.
        stream = transport.results_stream(producer.settings.queue, turn.turn_id)
        for _, fields in producer.redis.xrange(stream):
            producer.redis.xadd(stream, fields)
        again = [r.call_id async for r in aproducer.results(turn.turn_id, timeout=5)]
        assert len(first) == 2 and producer.redis.xlen(stream) == 4
        return again

    assert sorted(in_loop(run)) == ["fast", "middle"]


def test_without_a_relayer_results_still_arrive_from_postgres(
    in_loop: Callable[..., Any], stack: Callable[..., Stack], producer: Producer
) -> None:
    stack(workers=1, relayer=False)

    async def run(aproducer: AsyncProducer) -> tuple[list[str], int]:
        turn = await aproducer.submit(READS, SUPPORT_A)
        seen = [r.call_id async for r in aproducer.results(turn.turn_id, timeout=30)]
        stream = transport.results_stream(producer.settings.queue, turn.turn_id)
        return seen, producer.redis.xlen(stream)

    seen, published = in_loop(run)
    assert published == 0  # nothing came through Redis
    assert sorted(seen) == ["fast", "middle", "slow"]


def test_collect_matches_the_synchronous_producer_for_many_turns_at_once(
    in_loop: Callable[..., Any], stack: Callable[..., Stack], producer: Producer
) -> None:
    stack(workers=2, CALLGATE_WORKER_CONCURRENCY="8")

    async def run(aproducer: AsyncProducer) -> list[dict[str, Any]]:
        turns = await asyncio.gather(*(aproducer.submit(READS, SUPPORT_A) for _ in range(12)))
        collected = await asyncio.gather(*(aproducer.collect(t.turn_id, 30) for t in turns))
        return [c.as_json() for c in collected]

    docs = in_loop(run)
    assert all(d["complete"] and d["pending"] == [] for d in docs)
    for doc in docs:
        again = producer.collect(doc["turn_id"], timeout=0).as_json()
        assert json.dumps(doc, sort_keys=True) == json.dumps(again, sort_keys=True)
        assert [r["call_id"] for r in doc["results"]] == ["slow", "fast", "middle"]


def test_a_timeout_ends_the_stream_without_inventing_results(
    in_loop: Callable[..., Any], producer: Producer
) -> None:
    async def run(aproducer: AsyncProducer) -> tuple[list[Any], Any]:
        turn = await aproducer.submit(READS[:1], SUPPORT_A)  # no worker runs
        seen = [r async for r in aproducer.results(turn.turn_id, timeout=0.3)]
        return seen, await aproducer.collect(turn.turn_id, 0)

    seen, collected = in_loop(run)
    assert seen == []
    assert not collected.complete and collected.pending == ["slow"]


def test_bad_turn_ids_and_timeouts_are_refused_with_their_codes(
    in_loop: Callable[..., Any],
) -> None:
    def first(turn_id: str, timeout: float | None) -> Callable[[AsyncProducer], Awaitable[None]]:
        async def run(aproducer: AsyncProducer) -> None:
            async for _ in aproducer.results(turn_id, timeout=timeout):
                break

        return run

    with pytest.raises(UnknownTurn) as unknown:
        in_loop(first("not-a-uuid", 1))
    assert unknown.value.code == ErrorCode.UNKNOWN_TURN
    with pytest.raises(InputError):
        in_loop(first("00000000-0000-0000-0000-000000000000", float("nan")))


def test_aclose_ends_the_waits_still_running_and_nothing_goes_on_after_it(
    service_env: dict[str, str], engine: Engine
) -> None:
    """Another task's wait ends with ProducerClosed when the producer is closed (it does not
    go on reconnecting behind a closed producer), and a submit after close records nothing."""

    def turns() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM callgate.turns")).scalar_one())

    async def main() -> tuple[list[BaseException | None], float, int]:
        producer = AsyncProducer.from_env(Settings.from_env(service_env))
        turn = await producer.submit(READS[:1], SUPPORT_A)  # no worker runs: the waits block

        async def stream() -> None:
            async for _ in producer.results(turn.turn_id):
                pass

        waits = [
            asyncio.create_task(stream()),
            asyncio.create_task(producer.collect(turn.turn_id, 60)),
        ]
        await asyncio.sleep(1.5)  # both are in their Redis reads (and the 1 s Postgres recheck)
        assert not any(w.done() for w in waits)
        started = time.monotonic()
        await producer.aclose()
        took = time.monotonic() - started
        assert all(w.done() for w in waits)  # ended by aclose, not left running
        outcomes = [w.exception() for w in waits]
        before = turns()
        with pytest.raises(ProducerClosed) as late:
            await producer.submit(READS[:1], SUPPORT_A)
        assert late.value.code == ErrorCode.PRODUCER_CLOSED
        with pytest.raises(ProducerClosed):
            await producer.collect(turn.turn_id, 1)
        await producer.aclose()  # twice is harmless
        return outcomes, took, turns() - before

    outcomes, took, recorded_after_close = asyncio.run(main())
    assert [type(o) for o in outcomes] == [ProducerClosed, ProducerClosed]
    assert took < 3
    assert recorded_after_close == 0


def test_a_relay_still_following_a_parked_call_when_the_producer_closes_leaves_no_stray_error(
    service_env: dict[str, str], stack: Callable[..., Stack]
) -> None:
    """A framework's wait returns once its call is parked, while the relay's follower goes on
    for its recheck period; closing the producer then ends the follower without asyncio's
    "Task exception was never retrieved" on the application's console."""
    stack(workers=1)
    reported: list[dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        context = {**SUPPORT_A, "request_id": f"req-{uuid.uuid4().hex[:8]}"}
        async with AsyncProducer.from_env(Settings.from_env(service_env)) as producer:
            relay = TurnRelay(producer, context, timeout=30)
            call = ProposedCall(
                call_id="c-del", tool_name="delete_emails", arguments={"query": "policy update"}
            )
            await relay.submit([call])
            outcome = await relay.outcome("c-del")
        follower = relay._watches[next(iter(relay._watches))]._task
        assert follower is not None
        # Well within the relay's 30 s timeout, with room for a loaded machine.
        await asyncio.wait({follower}, timeout=15)
        assert follower.done()  # the follower ended with the producer
        del relay, follower
        gc.collect()
        await asyncio.sleep(0)
        return outcome

    outcome = asyncio.run(main())
    assert isinstance(outcome, Parked)
    assert [ctx.get("message") for ctx in reported] == []
