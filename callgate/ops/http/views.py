"""What the API and the console show of approval requests. Pure: rows in, JSON out."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def _age(created_at: str, now: datetime) -> float:
    return max(0.0, round((now - datetime.fromisoformat(created_at)).total_seconds(), 1))


def notice(request: dict[str, Any], versions: list[dict[str, Any]]) -> str | None:
    """A plain statement when this request's operation asked before under another intent.

    ``versions`` are every request of the same operation. An approval is bound to one
    intent: when the arguments (or the resource they resolve to) changed after a decision,
    the decision does not carry over and a new request is asked.
    """
    earlier = [v for v in versions if v["version"] < request["version"]]
    later = [v for v in versions if v["version"] > request["version"]]
    if request["state"] == "superseded" and later:
        newest = max(later, key=lambda v: v["version"])
        return (
            f"Superseded by version {newest['version']}: the intent changed, so this "
            "request no longer decides anything."
        )
    if request["state"] != "pending" or not earlier:
        return None
    previous = max(earlier, key=lambda v: v["version"])
    if previous["decided_by"]:
        return (
            f"The intent changed after version {previous['version']} was decided by "
            f"{previous['decided_by']}: that decision does not carry over. This is a new "
            "request and needs a new decision."
        )
    return (
        f"This replaces version {previous['version']}, whose intent changed before anyone "
        "decided it."
    )


def approval_views(requests: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """Each request with its age and notice (``requests``: every version of each operation
    the caller may see, as ``store.approvals.requests`` returns them)."""
    by_operation: dict[str, list[dict[str, Any]]] = {}
    for r in requests:
        by_operation.setdefault(r["operation_id"], []).append(r)
    return [
        {
            **r,
            "age_seconds": _age(r["created_at"], now),
            "notice": notice(r, by_operation[r["operation_id"]]),
        }
        for r in requests
    ]
