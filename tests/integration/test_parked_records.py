"""Parking a call for approval is a state change: one INFO record per parked call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

from callgate.core.settings import Settings
from callgate.producer import Producer


def test_three_parked_calls_write_three_records(
    make_own_database: Callable[[], str], service_env: dict[str, str]
) -> None:
    env = {**service_env, "CALLGATE_DATABASE_URL": make_own_database()}
    producer = Producer.from_env(Settings.from_env(env))
    try:
        turns = [
            producer.submit(
                [
                    {
                        "call_id": f"refund-{i}",
                        "tool_name": "refund_payment",
                        "arguments": {"order_id": "O-17", "amount": i, "currency": "KRW"},
                    }
                ],
                {
                    "request_id": f"r-park-{i}",
                    "tenant_id": "tenant-a",
                    "user_id": "user-17",
                    "roles": ["support"],
                },
            ).turn_id
            for i in (1, 2, 3)
        ]
    finally:
        producer.close()
    worker = ["worker", "--burst"]
    done = subprocess.run(
        [sys.executable, "-m", "callgate", "--log-format", "json", "--log-level", "INFO", *worker],
        env={**os.environ, **env, "CALLGATE_DEMO_APPROVAL_AMOUNT": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    parked = [r for r in records if r.get("event") == "awaiting_approval"]
    assert len(parked) == 3, done.stderr
    assert {r["turn_id"] for r in parked} == set(turns)
    assert all(r["tool"] == "refund_payment" and r["call_id"] and r["approval_id"] for r in parked)
