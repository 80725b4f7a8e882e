"""Real processes: workers, relayer and sweeper started through the CLI, killed for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.store import audit as store_audit

SUPPORT_A = {
    "request_id": "req-t",
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "roles": ["support"],
}
REFUND_O17 = {"order_id": "O-17", "amount": 12000, "currency": "KRW"}


@pytest.fixture
def producer(service_env: dict[str, str]) -> Iterator[Producer]:
    p = Producer.from_env(Settings.from_env(service_env))
    yield p
    p.close()


@pytest.fixture
def stack(service_env: dict[str, str]) -> Iterator[Callable[..., Stack]]:
    """Start a Stack with extra env; it is stopped (SIGCONT + SIGTERM, then SIGKILL) after."""
    started: list[Stack] = []

    def start(*, workers: int = 1, relayer: bool = True, sweeper: bool = True, **env: str) -> Stack:
        s = Stack(env={**service_env, **env}, workers=workers, relayer=relayer, sweeper=sweeper)
        s.__enter__()
        started.append(s)
        if workers:
            wait_for_workers(
                service_env["CALLGATE_REDIS_URL"], service_env["CALLGATE_QUEUE"], workers
            )
        return s

    yield start
    for s in started:
        s.stop()


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def side_effects(engine: Engine, operation_id: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.* FROM downstream.side_effects s"
                " JOIN callgate.operations o ON o.idempotency_key = s.idempotency_key"
                " WHERE o.operation_id = :op ORDER BY s.id"
            ),
            {"op": operation_id},
        ).mappings()
        return [dict(r) for r in rows]


def trace_events(engine: Engine, call_ref: str, event: str | None = None) -> list[dict[str, Any]]:
    """A call's audit events, as `callgate trace` shows them: its trace_events rows, and the
    audit a read stores on its call row (no trace_events row), as its `completed` event."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT event, generation, detail FROM ("
                " SELECT at, id AS seq, event, generation, detail FROM callgate.trace_events"
                "  WHERE call_ref = :r"
                " UNION ALL"
                " SELECT completed_at, 0, 'completed', NULL,"
                "        jsonb_build_object('status', state, 'code', result #>> '{error,code}')"
                "          || (audit - 'delivery')"
                "   FROM callgate.calls WHERE id = :r AND audit IS NOT NULL"
                ") AS e WHERE CAST(:e AS text) IS NULL OR event = :e ORDER BY at, seq"
            ),
            {"r": call_ref, "e": event},
        ).mappings()
        return [dict(r) for r in rows]


def handler_intervals(engine: Engine, refs: list[str]) -> dict[str, tuple[Any, Any]]:
    """Each started call's [started, ended] interval by ref (a read's from its audit)."""
    found = store_audit.execution_intervals(engine, refs=refs)
    return {ref: (started, ended) for ref, (_, started, ended) in found.items() if started}


def handler_runs(engine: Engine, ref: str) -> int:
    """How many times a call's handler ran: each reservation or takeover of its operation;
    a read, once for its ending and once more for each delivery whose result came too late
    (a duplicate with reason ``ended``)."""
    reserved = len(trace_events(engine, ref, "reserved")) + len(
        trace_events(engine, ref, "takeover")
    )
    if reserved:
        return reserved
    late = [
        e
        for e in trace_events(engine, ref, "duplicate_delivery")
        if e["detail"].get("reason") == "ended"
    ]
    return len(trace_events(engine, ref, "completed")) + len(late)


def callgate(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user does: a subprocess, its output and exit code."""
    return subprocess.run(
        [sys.executable, "-m", "callgate.ops.cli", *args],
        env={**os.environ, **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def requests_for(engine: Engine, idempotency_key: str) -> int:
    """Write requests the downstream received for one key: handler invocations that ran."""
    return int(
        scalar(
            engine,
            "SELECT count(*) FROM downstream.requests WHERE idempotency_key = :k",
            k=idempotency_key,
        )
    )


def effects_for(engine: Engine, idempotency_key: str) -> int:
    return int(
        scalar(
            engine,
            "SELECT count(*) FROM downstream.side_effects WHERE idempotency_key = :k",
            k=idempotency_key,
        )
    )


def call_row(engine: Engine, ref: str) -> dict[str, Any]:
    with engine.connect() as conn:
        row = (
            conn.execute(
                text("SELECT state, result, approval_id FROM callgate.calls WHERE id = :r"),
                {"r": ref},
            )
            .mappings()
            .one()
        )
    return dict(row)
