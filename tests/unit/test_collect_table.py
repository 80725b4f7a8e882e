"""`callgate collect`'s table: every call with its tool (a parked one too), and a long value
cut only with a visible marker saying how much is left out."""

from __future__ import annotations

from typing import Any

from callgate.ops.cli.turns import collect_rows

DOC: dict[str, Any] = {
    "turn_id": "t",
    "complete": False,
    "results": [
        {
            "call_id": "c1",
            "tool_name": "get_order",
            "status": "succeeded",
            "data": {"note": "x" * 200},
        }
    ],
    "pending": ["c2"],
    "awaiting_approval": {"c3": "a-1"},
}
TOOLS = {"c1": "get_order", "c2": "get_order", "c3": "refund_payment"}


def test_every_call_is_listed_with_its_tool() -> None:
    rows = {r["call_id"]: r for r in collect_rows(DOC, TOOLS, width=80)}
    assert sorted(rows) == ["c1", "c2", "c3"]
    assert rows["c3"]["tool_name"] == "refund_payment"
    assert rows["c3"]["status"] == "awaiting_approval"
    assert rows["c3"]["data | error"] == "callgate approvals show a-1"
    assert (rows["c2"]["tool_name"], rows["c2"]["status"]) == ("get_order", "pending")


def test_a_long_value_is_cut_with_a_marker_or_shown_whole() -> None:
    (cut,) = [r for r in collect_rows(DOC, TOOLS, width=80) if r["call_id"] == "c1"]
    whole = '{"note": "' + "x" * 200 + '"}'
    assert cut["data | error"] == whole[:80] + f"…(+{len(whole) - 80} chars)"
    (full,) = [r for r in collect_rows(DOC, TOOLS, width=None) if r["call_id"] == "c1"]
    assert full["data | error"] == whole
