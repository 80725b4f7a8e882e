"""A submit whose COMMIT reply is lost, with real workers, relayer and sweeper: the
application does what the error tells it, and the e-mail is counted where it lands
(downstream.side_effects), not where callgate says it went."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, text

from callgate.core.errors import CallgateError, ErrorCode
from callgate.core.settings import Settings
from callgate.ops.lab.demo.tools import demo_registry
from callgate.ops.stack import Stack
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db
from tests.acceptance.conftest import SUPPORT_A, wait_until
from tests.faults.pgproxy import PgProxy, commit_fault

# The first turn's job is never enqueued (its submit failed before the enqueue): the
# sweeper's stale rule dispatches it, so it is kept short here.
STALE = {"CALLGATE_STALE_SECONDS": "2", "CALLGATE_SWEEP_SECONDS": "0.5"}


@pytest.fixture
def own_url(make_own_database: Callable[[], str]) -> str:
    return make_own_database()


@pytest.fixture
def service_env(own_url: str, redis_url: str, queue_name: str) -> dict[str, str]:
    return {
        "CALLGATE_DATABASE_URL": own_url,
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": queue_name,
        "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
        **STALE,
    }


@pytest.fixture
def engine(own_url: str) -> Iterator[Engine]:
    e = db.create(own_url)
    yield e
    e.dispose()


@pytest.fixture
def proxied(pg_proxy: PgProxy, service_env: dict[str, str]) -> Iterator[Producer]:
    settings = Settings.from_env(service_env)
    p = Producer(
        settings=settings,
        engine=db.create(pg_proxy.url(service_env["CALLGATE_DATABASE_URL"])),
        redis_connection=transport.connect(service_env["CALLGATE_REDIS_URL"]),
        registry=demo_registry(),
    )
    yield p
    p.close()


def _email(call_id: str) -> list[dict[str, object]]:
    return [
        {
            "call_id": call_id,
            "tool_name": "send_email",
            "arguments": {"to": "kim@example.com", "template": "receipt"},
        }
    ]


def _effects(engine: Engine, call_id: str) -> int:
    """E-mails the downstream really sent for calls with this call id, over every turn."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM downstream.side_effects s"
                    " JOIN callgate.operations o ON o.idempotency_key = s.idempotency_key"
                    " JOIN callgate.calls c ON c.operation_id = o.operation_id"
                    " WHERE c.call_id = :c"
                ),
                {"c": call_id},
            ).scalar_one()
        )


def _open_calls(engine: Engine, call_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM callgate.calls WHERE call_id = :c"
                    " AND state NOT IN ('succeeded', 'failed_retryable', 'failed_terminal')"
                ),
                {"c": call_id},
            ).scalar_one()
        )


def test_the_application_retrying_as_the_error_invites_sends_one_email(
    stack: Callable[..., Stack],
    pg_proxy: PgProxy,
    proxied: Producer,
    engine: Engine,
) -> None:
    stack(workers=1)
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    lost = pg_proxy.arm(commit_fault())
    turn_ids: list[str] = []
    for _ in range(3):  # the application: submit, and again while the error invites it
        try:
            turn_ids.append(proxied.submit(_email(call_id), SUPPORT_A).turn_id)
            break
        except CallgateError as exc:
            if exc.code == ErrorCode.INVALID_INPUT:
                # docs/errors.md: "Nothing was recorded" -- so the application sends it again
                # (a fixed input would carry the same e-mail).
                continue
            raise
    assert pg_proxy.fired == [lost]

    wait_until(
        lambda: _open_calls(engine, call_id) == 0 and _effects(engine, call_id) >= 1,
        timeout=60,
        what="every call with this call id to end",
    )
    assert _effects(engine, call_id) == 1
    assert len(set(turn_ids)) == 1
