"""Spans of the producer and of one delivery, on the real services with an in-memory
exporter: one ``callgate.propose {tool}`` per proposal under ``callgate.submit`` (sync and
async), ``callgate.collect`` around ``AsyncProducer.results()`` however its iteration ends,
and the opt-in to record a call's arguments, redacted."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from typing import Any

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import Engine, text

from callgate import AsyncProducer
from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.core.settings import Settings
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer import Producer
from callgate.queue import transport
from callgate.worker import executor
from callgate.worker.runtime import Runtime
from tests.redaction_corpus import SECRET_KINDS

SUPPORT = {
    "request_id": "req-t",
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "roles": ["support"],
}
REFUND = {"order_id": "O-17", "amount": 1200, "currency": "KRW"}


def _settings(database_url: str, redis_url: str, queue_name: str, **extra: str) -> Settings:
    return Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
            **extra,
        }
    )


@pytest.fixture
def make_producer(database_url: str, redis_url: str, queue_name: str, engine: Engine):
    made: list[Producer] = []

    def make(**extra: str) -> Producer:
        p = Producer(
            settings=_settings(database_url, redis_url, queue_name, **extra),
            engine=engine,
            redis_connection=transport.connect(redis_url),
            registry=demo_registry(),
        )
        made.append(p)
        return p

    return make


# A read, two writes (the second waits for the first) and a call past the turn budget.
PROPOSALS = [
    {"call_id": "r1", "tool_name": "get_weather", "arguments": {"city": "Seoul"}},
    {"call_id": "w1", "tool_name": "refund_payment", "arguments": REFUND},
    {"call_id": "w2", "tool_name": "send_email", "arguments": {"to": "a@b.c", "body": "hi"}},
    {"call_id": "r2", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}},
]
OUTCOMES = {"r1": "queued", "w1": "queued", "w2": "waiting", "r2": "refused"}


def _check_intake(spans: tuple[ReadableSpan, ...], turn: Any, engine: Engine) -> None:
    (submit,) = [s for s in spans if s.name == "callgate.submit"]
    proposed = [s for s in spans if s.name.startswith("callgate.propose ")]
    assert len(proposed) == len(PROPOSALS)  # one each, exported once
    refs = {c.call_id: c for c in turn.calls}
    for span in proposed:
        a = dict(span.attributes or {})
        call = refs[a["gen_ai.tool.call.id"]]
        assert span.name == f"callgate.propose {call.tool_name}"
        assert span.kind is SpanKind.INTERNAL
        assert span.parent is not None and span.parent.span_id == submit.context.span_id
        assert a["gen_ai.tool.name"] == call.tool_name
        assert a["callgate.call_ref"] == call.ref
        assert a["callgate.operation_id"] == call.operation_id
        assert a["callgate.turn_id"] == turn.turn_id
        assert a["callgate.outcome"] == OUTCOMES[call.call_id], call.call_id
        if call.call_id == "r2":
            assert a["callgate.code"] == a["error.type"] == "budget_exceeded"
            assert span.status.status_code is StatusCode.ERROR
        else:
            assert "error.type" not in a and "callgate.code" not in a
            assert span.status.status_code is StatusCode.UNSET
        assert submit.start_time <= span.start_time <= span.end_time <= submit.end_time
    # The context stored with the turn stays the submit span's: the workers' spans are its
    # children, never a proposal span's.
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT trace_context FROM callgate.turns WHERE turn_id = :t"),
            {"t": turn.turn_id},
        ).scalar_one()
    assert stored["traceparent"].split("-")[2] == f"{submit.context.span_id:016x}"


def test_submit_opens_one_span_per_proposal_with_its_intake_outcome(
    make_producer, exported, engine
):
    producer = make_producer(CALLGATE_TURN_CALL_BUDGET="3")
    with trace.get_tracer("app").start_as_current_span("agent run"):
        turn = producer.submit(PROPOSALS, SUPPORT)
    _check_intake(exported.get_finished_spans(), turn, engine)


def test_an_async_submit_opens_the_same_spans(make_producer, exported, engine, redis_url):
    producer = make_producer(CALLGATE_TURN_CALL_BUDGET="3")

    async def main() -> Any:
        aproducer = AsyncProducer(producer, transport.connect_async(redis_url))
        with trace.get_tracer("app").start_as_current_span("agent run"):
            turn = await aproducer.submit(PROPOSALS, SUPPORT)
        await aproducer.redis.aclose()
        return turn

    turn = asyncio.run(main())
    _check_intake(exported.get_finished_spans(), turn, engine)


def test_a_repeated_submit_marks_what_it_enqueues_again(make_producer, exported):
    """A repeat records nothing: its call still waiting for a first job is enqueued again,
    the one refused at intake is left as the first submit ended it."""
    producer = make_producer(CALLGATE_TURN_CALL_BUDGET="1")
    key = f"k-{uuid.uuid4().hex}"
    first = producer.submit(PROPOSALS[:2], SUPPORT, submit_key=key)
    exported.clear()
    again = producer.submit(PROPOSALS[:2], SUPPORT, submit_key=key)
    assert again.turn_id == first.turn_id
    spans = [s for s in exported.get_finished_spans() if s.name.startswith("callgate.propose")]
    outcomes = {
        s.attributes["gen_ai.tool.call.id"]: s.attributes["callgate.outcome"] for s in spans
    }
    assert outcomes == {"r1": "queued", "w1": "repeat"}
    assert all(s.status.status_code is StatusCode.UNSET for s in spans)


def test_without_a_provider_a_submit_makes_no_span(make_producer):
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    make_producer().submit(PROPOSALS[:1], SUPPORT)  # nothing to export to: it just works


# --- AsyncProducer.results() ------------------------------------------------------------


def _refused_turn(producer: Producer) -> str:
    """A turn whose two calls both end at intake (the conversation's budget is spent), so
    their results are in PostgreSQL at once and no worker is needed."""
    conversation = {**SUPPORT, "conversation_id": f"conv-{uuid.uuid4().hex}"}
    producer.submit(PROPOSALS[:1], conversation)
    reads = [
        {"call_id": "a", "tool_name": "get_stock", "arguments": {"symbol": "AAPL"}},
        {"call_id": "b", "tool_name": "get_news", "arguments": {"topic": "tech"}},
    ]
    return producer.submit(reads, conversation).turn_id


def _collects(exported: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exported.get_finished_spans() if s.name == "callgate.collect"]


@pytest.mark.parametrize("ending", ["full", "break", "aclose", "cancel"])
def test_results_is_one_collect_span_however_the_iteration_ends(
    make_producer, exported, redis_url, ending
):
    producer = make_producer(CALLGATE_CONVERSATION_CALL_BUDGET="1")
    turn_id = _refused_turn(producer)
    exported.clear()

    async def main() -> tuple[list[str], int]:
        aproducer = AsyncProducer(producer, transport.connect_async(redis_url))
        seen: list[str] = []
        tracer = trace.get_tracer("app")
        with tracer.start_as_current_span("agent run") as app:
            if ending == "full":
                seen = [r.call_id async for r in aproducer.results(turn_id, timeout=10)]
            elif ending == "break":
                async for r in aproducer.results(turn_id, timeout=10):
                    seen.append(r.call_id)
                    break
            elif ending == "aclose":
                stream = aproducer.results(turn_id, timeout=10)
                seen.append((await anext(stream)).call_id)  # type: ignore[attr-defined]
                await stream.aclose()  # type: ignore[attr-defined]
            else:
                # A third turn's call never ends (no worker): the wait is cancelled.
                waiting = producer.submit(PROPOSALS[:1], SUPPORT).turn_id

                async def drain() -> None:
                    async for _ in aproducer.results(waiting, timeout=None):
                        pass

                task = asyncio.create_task(drain())
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            # A generator let go after a break is closed by the loop's finalizer, soon.
            for _ in range(20):
                if _collects(exported):
                    break
                await asyncio.sleep(0.05)
        await aproducer.redis.aclose()
        return seen, app.get_span_context().span_id

    seen, app_id = asyncio.run(main())
    (collect,) = _collects(exported)  # ended, exported once
    a = dict(collect.attributes or {})
    assert collect.parent is not None and collect.parent.span_id == app_id
    assert collect.status.status_code is StatusCode.UNSET  # stopping early is no error
    assert "error.type" not in a
    if ending == "full":
        assert sorted(seen) == ["a", "b"]
        assert a == {
            "callgate.turn_id": turn_id,
            "callgate.complete": True,
            "callgate.results": 2,
            "callgate.pending": 0,
        }
    elif ending == "cancel":
        assert a["callgate.complete"] is False and a["callgate.results"] == 0
        assert a["callgate.pending"] == 1
    else:
        assert len(seen) == 1
        assert a["callgate.complete"] is False
        assert (a["callgate.results"], a["callgate.pending"]) == (1, 1)


def test_results_of_an_unknown_turn_ends_its_span_with_the_error_code(
    make_producer, exported, redis_url
):
    producer = make_producer()

    async def main() -> None:
        aproducer = AsyncProducer(producer, transport.connect_async(redis_url))
        try:
            with pytest.raises(Exception) as raised:
                async for _ in aproducer.results(str(uuid.uuid4()), timeout=1):
                    pass
            assert getattr(raised.value, "code", None) == ErrorCode.UNKNOWN_TURN
        finally:
            await aproducer.redis.aclose()

    asyncio.run(main())
    (collect,) = _collects(exported)
    assert collect.attributes["error.type"] == "unknown_turn"
    assert collect.status.status_code is StatusCode.ERROR


# --- CALLGATE_TRACE_ARGUMENTS ----------------------------------------------------------


def _secrets() -> list[tuple[str, tuple[str, ...]]]:
    """Secret-looking values from the redaction corpus, each with the parts that must never
    be seen."""
    rng = random.Random(7)
    picked = [SECRET_KINDS[k](rng) for k in ("github_pat", "stripe_live", "aws_key", "jwt")]
    return [(s.text, s.cores) for s in picked]


def test_the_opt_in_records_the_arguments_redacted_and_the_default_none(
    database_url, redis_url, queue_name, engine, exported
):
    secrets = _secrets()
    arguments = {
        "city": "Reykjavik",
        "unit": "celsius",
        "note": f"deploy with {secrets[0][0]} tonight",
        "token": secrets[1][0],
        "password": "correct-horse-staple",
        "headers": [["Authorization", f"Bearer {secrets[2][0]}"]],
        "nested": {"jwt": secrets[3][0]},
    }

    def delivered(**extra: str) -> list[ReadableSpan]:
        exported.clear()
        settings = _settings(database_url, redis_url, queue_name, **extra)
        producer = Producer(
            settings=settings,
            engine=engine,
            redis_connection=transport.connect(redis_url),
            registry=demo_registry(),
        )
        turn = producer.submit(
            [{"call_id": "c1", "tool_name": "get_weather", "arguments": arguments}], SUPPORT
        )
        rt = Runtime(
            settings=settings,
            engine=engine,
            redis=redis.Redis.from_url(redis_url),
            queue=producer.queue,
            registry=demo_registry(),
        )
        executor.execute(rt, uuid.UUID(turn.calls[0].ref))
        return list(exported.get_finished_spans())

    spans = delivered(CALLGATE_TRACE_ARGUMENTS="redacted")
    (tool,) = [s for s in spans if s.name == "execute_tool get_weather"]
    recorded = json.loads(tool.attributes["gen_ai.tool.call.arguments"])
    assert recorded["city"] == "Reykjavik" and recorded["unit"] == "celsius"  # harmless: kept
    assert recorded["password"] == "[redacted]"
    everything = json.dumps([json.loads(s.to_json()) for s in spans])
    assert "Reykjavik" in everything
    assert "correct-horse-staple" not in everything
    for _, cores in secrets:
        for core in cores:
            assert core not in everything
            assert (
                core[: len(core) // 2] not in everything
                and core[len(core) // 2 :] not in everything
            )

    spans = delivered()  # the default: off
    (tool,) = [s for s in spans if s.name == "execute_tool get_weather"]
    assert "gen_ai.tool.call.arguments" not in tool.attributes
    assert "Reykjavik" not in json.dumps([json.loads(s.to_json()) for s in spans])


def test_a_bad_trace_arguments_value_is_a_configuration_error():
    with pytest.raises(ConfigurationError) as raised:
        Settings.from_env({"CALLGATE_TRACE_ARGUMENTS": "raw"})
    assert raised.value.code == ErrorCode.INVALID_CONFIGURATION
    assert "CALLGATE_TRACE_ARGUMENTS='raw': expected off or redacted" in str(raised.value)
    assert Settings.from_env({}).trace_arguments == "off"
