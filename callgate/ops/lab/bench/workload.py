"""What the scenarios submit: turns of demo calls, and payments for the refunds to draw on."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine

from callgate.ops.lab.demo import downstream

CONTEXT = {
    "request_id": "bench",
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "roles": ["support"],
}
TURN = 20
# Far more than the refunds of a run draw; each refund stays below the demo's approval
# amount, so none waits for a person.
BALANCE = 10**12

Proposal = dict[str, Any]


def reads(calls: int, *, per_turn: int = TURN) -> list[list[Proposal]]:
    """``get_stock`` calls in turns of ``per_turn``."""
    return _turns(
        [
            {"call_id": f"c{i}", "tool_name": "get_stock", "arguments": {"symbol": f"S{i}"}}
            for i in range(calls)
        ],
        per_turn,
    )


def refunds(engine: Engine, calls: int, *, per_turn: int = TURN) -> list[list[Proposal]]:
    """``refund_payment`` calls of small amounts in turns of ``per_turn``; each turn refunds
    an order of its own (so turns do not queue on one payment row)."""
    turns: list[list[Proposal]] = []
    for t, start in enumerate(range(0, calls, per_turn)):
        order = new_order(engine, f"{t}")
        turns.append(
            [
                {
                    "call_id": f"c{i}",
                    "tool_name": "refund_payment",
                    "arguments": {"order_id": order, "amount": 1 + i, "currency": "KRW"},
                }
                for i in range(start, min(calls, start + per_turn))
            ]
        )
    return turns


def fan_in() -> list[Proposal]:
    """One turn of three reads (their delays come from CALLGATE_DEMO_DELAY_MS)."""
    return [
        {
            "call_id": "weather",
            "tool_name": "get_weather",
            "arguments": {"city": "Seoul", "unit": "celsius"},
        },
        {"call_id": "stock", "tool_name": "get_stock", "arguments": {"symbol": "ACME"}},
        {"call_id": "news", "tool_name": "get_news", "arguments": {"topic": "rates"}},
    ]


def new_order(engine: Engine, tag: str) -> str:
    """An order of tenant-a with one payment of ``BALANCE`` KRW; returns its id."""
    order = f"O-bench-{uuid.uuid4().hex[:10]}-{tag}"
    with engine.begin() as conn:
        downstream.add_payment(
            conn, order, "tenant-a", "merchant-a", f"pay-{order}", BALANCE, "KRW"
        )
    return order


def _turns(proposals: list[Proposal], per_turn: int) -> list[list[Proposal]]:
    return [proposals[i : i + per_turn] for i in range(0, len(proposals), per_turn)]
