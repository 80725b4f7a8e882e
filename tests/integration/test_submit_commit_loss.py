"""A submit whose COMMIT reply is lost: the turn is committed, the producer cannot know.

Real PostgreSQL behind the Postgres fault proxy (tests/faults/pgproxy.py), which lets the
COMMIT execute on the server and drops its reply. Counted in PostgreSQL's own rows: how many
turns and calls one logical submit leaves behind.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine, text

from callgate.core.errors import CallgateError, ErrorCode, ServiceUnavailable
from callgate.core.settings import Settings
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db
from tests.faults.pgproxy import PgProxy, commit_fault
from tests.integration.conftest import stored

CONTEXT = {
    "request_id": "r-commit",
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "roles": ["support"],
}


def _email(call_id: str) -> list[dict[str, object]]:
    return [
        {
            "call_id": call_id,
            "tool_name": "send_email",
            "arguments": {"to": "kim@example.com", "template": "receipt"},
        }
    ]


@pytest.fixture
def proxied_producer(
    pg_proxy: PgProxy, database_url: str, redis_url: str, queue_name: str
) -> Iterator[Producer]:
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
        }
    )
    p = Producer(
        settings=settings,
        engine=db.create(pg_proxy.url(database_url)),
        redis_connection=transport.connect(redis_url),
        registry=demo_registry(),
    )
    yield p
    p.close()


def _turns_with_call(engine: Engine, call_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(DISTINCT turn_id) FROM callgate.calls WHERE call_id = :c"),
                {"c": call_id},
            ).scalar_one()
        )


def test_a_lost_commit_reply_is_found_by_the_producers_own_retry(
    pg_proxy: PgProxy, proxied_producer: Producer, engine: Engine
) -> None:
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    lost = pg_proxy.arm(commit_fault())

    turn = proxied_producer.submit(_email(call_id), CONTEXT)

    assert pg_proxy.fired == [lost]  # the fault really happened: a COMMIT ran, its reply lost
    assert _turns_with_call(engine, call_id) == 1
    with engine.connect() as conn:
        recorded = conn.execute(
            text("SELECT turn_id FROM callgate.calls WHERE call_id = :c"), {"c": call_id}
        ).scalar_one()
    assert str(recorded) == turn.turn_id  # the answer names the turn that was committed


def test_a_submit_that_gives_up_after_a_lost_commit_says_the_outcome_is_unknown(
    pg_proxy: PgProxy, proxied_producer: Producer, producer: Producer, engine: Engine
) -> None:
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    # PostgreSQL unreachable for the rest of the budget once the reply is lost.
    lost = pg_proxy.arm(commit_fault(refuse_after=3600))

    with pytest.raises(ServiceUnavailable) as caught:
        proxied_producer.submit(_email(call_id), CONTEXT)

    assert pg_proxy.fired == [lost]
    assert pg_proxy.refused > 0  # the producer did try again, and was refused
    err = caught.value
    assert err.code == ErrorCode.DATABASE_UNAVAILABLE
    assert err.recorded is None and err.submit_key
    assert "outcome unknown" in err.message and err.submit_key in err.message
    assert "nothing was recorded" not in err.message
    assert _turns_with_call(engine, call_id) == 1  # it was recorded

    # The application does what the error says, on a PostgreSQL it reaches again.
    turn = producer.submit(_email(call_id), CONTEXT, submit_key=err.submit_key)
    assert _turns_with_call(engine, call_id) == 1
    assert _turn_of(engine, call_id) == turn.turn_id


def test_a_submit_refused_before_commit_says_nothing_was_recorded(
    pg_proxy: PgProxy, proxied_producer: Producer, engine: Engine
) -> None:
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    pg_proxy.shut_for(3600)  # no statement of the turn reaches PostgreSQL

    with pytest.raises(ServiceUnavailable) as caught:
        proxied_producer.submit(_email(call_id), CONTEXT)

    assert caught.value.recorded is False
    assert "nothing was recorded" in caught.value.message
    assert _turns_with_call(engine, call_id) == 0


def test_a_repeat_with_the_same_key_returns_the_first_turn_and_records_nothing(
    producer: Producer, engine: Engine
) -> None:
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    key = f"k-{uuid.uuid4().hex}"
    first = producer.submit(_email(call_id), CONTEXT, submit_key=key)
    before = stored(engine)

    again = producer.submit(_email(call_id), {**CONTEXT, "request_id": "r-other"}, submit_key=key)

    assert again == first
    assert stored(engine) == before


def test_the_same_key_with_other_proposals_is_an_idempotency_conflict(
    producer: Producer, engine: Engine
) -> None:
    key = f"k-{uuid.uuid4().hex}"
    producer.submit(_email(f"mail-{uuid.uuid4().hex[:8]}"), CONTEXT, submit_key=key)
    before = stored(engine)
    other = [{**_email("x")[0], "arguments": {"to": "lee@example.com", "template": "receipt"}}]

    with pytest.raises(CallgateError) as caught:
        producer.submit(other, CONTEXT, submit_key=key)

    assert caught.value.code == ErrorCode.IDEMPOTENCY_CONFLICT
    assert stored(engine) == before
    # Another tenant's key space is its own.
    tenant_b = {**CONTEXT, "tenant_id": "tenant-b", "user_id": "user-42"}
    producer.submit(other, tenant_b, submit_key=key)
    assert stored(engine)[0] == before[0] + 1


def _waiting(engine: Engine, application_name: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = :a AND wait_event_type = 'Lock'"
                ),
                {"a": application_name},
            ).scalar_one()
        )


def test_two_concurrent_submits_with_one_key_record_one_turn_and_both_name_it(
    database_url: str, redis_url: str, queue_name: str, engine: Engine
) -> None:
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
        }
    )
    app = f"submit-race-{uuid.uuid4().hex[:6]}"
    racer = Producer(
        settings=settings,
        engine=db.create(database_url, pool_size=4, application_name=app),
        redis_connection=transport.connect(redis_url),
        registry=demo_registry(),
    )
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    ctx = {**CONTEXT, "conversation_id": conversation}
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    key = f"k-{uuid.uuid4().hex}"
    answers: list[str] = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            answers.append(racer.submit(_email(call_id), ctx, submit_key=key).turn_id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    # Hold the conversation's lock, so the first submit stops inside its transaction with
    # its turn claimed but not committed; the second then meets that claim for real.
    with engine.connect() as holder:
        holder.execute(
            text("SELECT pg_advisory_lock(hashtext('callgate.conversation:' || :t || ':' || :c))"),
            {"t": ctx["tenant_id"], "c": conversation},
        )
        threads = [threading.Thread(target=submit) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while _waiting(engine, app) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiting(engine, app) == 2  # one on the conversation, one on the key
        holder.execute(
            text(
                "SELECT pg_advisory_unlock(hashtext('callgate.conversation:' || :t || ':' || :c))"
            ),
            {"t": ctx["tenant_id"], "c": conversation},
        )
        holder.commit()
    for t in threads:
        t.join(timeout=30)
    racer.close()

    assert errors == []
    assert _turns_with_call(engine, call_id) == 1
    assert answers == [_turn_of(engine, call_id)] * 2


def _turn_of(engine: Engine, call_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT turn_id FROM callgate.calls WHERE call_id = :c"), {"c": call_id}
            ).scalar_one()
        )


def test_redis_away_after_the_record_says_recorded_and_a_repeat_enqueues_the_turn(
    database_url: str, queue_name: str, producer: Producer, engine: Engine
) -> None:
    with socket.socket() as s:  # a port nothing listens on: every connect refused
        s.bind(("127.0.0.1", 0))
        away = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": away,
            "CALLGATE_QUEUE": queue_name,
        }
    )
    cut_off = Producer(
        settings=settings,
        engine=db.create(database_url),
        redis_connection=redis.Redis.from_url(away, socket_connect_timeout=2),
        registry=demo_registry(),
    )
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(ServiceUnavailable) as caught:
            cut_off.submit(_email(call_id), CONTEXT)
    finally:
        cut_off.close()
    err = caught.value
    assert err.code == ErrorCode.REDIS_UNAVAILABLE and err.recorded is True
    turn_id = _turn_of(engine, call_id)
    assert turn_id in err.message  # the turn is named: the sweeper dispatches it later
    assert producer.redis.llen(f"rq:queue:{queue_name}") == 0

    again = producer.submit(_email(call_id), CONTEXT, submit_key=err.submit_key)

    assert again.turn_id == turn_id
    assert _turns_with_call(engine, call_id) == 1
    assert producer.redis.llen(f"rq:queue:{queue_name}") == 1  # its job, enqueued now
