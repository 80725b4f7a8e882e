"""callgate behind PgBouncer in transaction mode (Debian's pgbouncer, a real process).

The spine's tests run through it too (tests/acceptance/test_spine.py, parametrised). Here:
what a deployment meets on the way — the URL flag, migrate, the relayer without LISTEN —
and chaos scenarios (a worker killed in the crash gap, every server session terminated,
duplicate deliveries) through the pooler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.core.settings import Settings
from callgate.ops.stack import Stack
from callgate.producer import Producer
from callgate.store import db, schema_version
from tests.acceptance.conftest import REFUND_O17, SUPPORT_A, side_effects
from tests.conftest import ADMIN_URL, REDIS_URL
from tests.pgbouncer import PgBouncer

WEATHER = {
    "call_id": "w",
    "tool_name": "get_weather",
    "arguments": {"city": "Seoul", "unit": "celsius"},
}


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_the_pooler_without_the_flag_is_named_and_nothing_is_half_written(
    pgbouncer: PgBouncer, service_env: dict[str, str], engine: Engine
) -> None:
    """Without ``?pgbouncer=true`` psycopg's prepared statements land on other server
    connections within a few turns: the submit says which flag to add, and the failed turn
    left no row (the fixture's pooler really is in transaction mode, or this cannot fail)."""
    url = pgbouncer.url_for(service_env["CALLGATE_DATABASE_URL"], raw=True)
    settings = Settings.from_env({**service_env, "CALLGATE_DATABASE_URL": url})
    # Two producers, as two processes would be: their client connections share the pooler's
    # server connections, and psycopg names its statements alike on each (_pg3_0, …).
    producers = [Producer.from_env(settings), Producer.from_env(settings)]
    request = f"req-{uuid.uuid4().hex[:8]}"
    submitted = 0
    try:
        with pytest.raises(ConfigurationError) as refused:
            for i in range(40):
                context = {**SUPPORT_A, "request_id": f"{request}-{i}"}
                producers[i % 2].submit([WEATHER], context)
                submitted += 1
    finally:
        for producer in producers:
            producer.close()
    assert refused.value.code == ErrorCode.INVALID_CONFIGURATION
    assert "add ?pgbouncer=true to CALLGATE_DATABASE_URL" in refused.value.message
    assert 1 <= submitted < 40
    recorded = _count(
        engine, f"SELECT count(*) FROM callgate.turns WHERE request_id LIKE '{request}-%'"
    )
    assert recorded == submitted


def test_migrate_and_many_turns_through_the_pooler_with_a_polling_relayer(
    pgbouncer: PgBouncer,
    make_database: Callable[..., str],
    service_env: dict[str, str],
    tmp_path: Path,
) -> None:
    direct = make_database()
    pooled = pgbouncer.url_for(direct)
    env = {**service_env, "CALLGATE_DATABASE_URL": pooled}
    migrated = subprocess.run(
        [sys.executable, "-m", "callgate", "migrate", "--demo-downstream"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    engine = db.create(direct)
    try:
        schema_version.require_current(engine, "test")
        writes: list[str] = []
        with Stack(env=env, workers=2, log_path=str(tmp_path / "stack.log")):
            producer = Producer.from_env(Settings.from_env(env))
            try:
                # Past psycopg's sixth run of each statement on each connection: the point
                # where it would have prepared them.
                for i in range(12):
                    refund = {
                        "call_id": "r",
                        "tool_name": "refund_payment",
                        "arguments": {**REFUND_O17, "amount": 100 + i},
                    }
                    context = {**SUPPORT_A, "request_id": f"req-{i}"}
                    turn = producer.submit([WEATHER, refund], context)
                    writes.append(turn.calls[1].operation_id)
                    collected = producer.collect(turn.turn_id, timeout=30)
                    assert collected.complete, collected.pending
                    assert [r.status for r in collected.results] == ["succeeded"] * 2, (
                        collected.results
                    )
            finally:
                producer.close()
        assert [len(side_effects(engine, op)) for op in writes] == [1] * 12
        unpublished = "SELECT count(*) FROM callgate.outbox WHERE published_at IS NULL"
        assert _count(engine, unpublished) == 0
    finally:
        engine.dispose()
    assert "polling every 0.05s (behind a pooler" in (tmp_path / "stack.log").read_text()


def _chaos(env: dict[str, str], *names: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "callgate.ops.lab.chaos", *names, "--seed", "7", "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_chaos_scenarios_hold_their_promises_through_the_pooler(pgbouncer: PgBouncer) -> None:
    pooled = pgbouncer.url_for(ADMIN_URL)
    refused = subprocess.run(
        [sys.executable, "-m", "callgate.ops.lab.chaos", "duplicate-delivery"],
        env={**os.environ, "CALLGATE_DATABASE_URL": pooled, "CALLGATE_REDIS_URL": REDIS_URL},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("callgate: invalid_configuration: chaos creates a database")
    doc = _chaos(
        {
            "CALLGATE_DATABASE_URL": pooled,
            "CALLGATE_DIRECT_DATABASE_URL": ADMIN_URL,
            "CALLGATE_REDIS_URL": REDIS_URL,
        },
        "worker-kill-crash-gap",
        "postgres-terminate",
        "duplicate-delivery",
    )
    verdicts = {s["scenario"]: (s["verdict"], s["violations"]) for s in doc["scenarios"]}
    assert verdicts == {
        "worker-kill-crash-gap": ("pass", []),
        "postgres-terminate": ("pass", []),
        "duplicate-delivery": ("pass", []),
    }
    terminate = next(s for s in doc["scenarios"] if s["scenario"] == "postgres-terminate")
    # Sessions really were cut: the pooler's server connections, under the processes.
    assert sum(f.get("terminated", 0) for f in terminate["faults_injected"]) > 0, terminate
