"""Loop and budget guards, decided when a turn is recorded. Pure: no I/O.

- A turn may propose at most ``turn_budget`` calls, a conversation at most
  ``conversation_budget``; calls beyond either end ``budget_exceeded`` without running.
- The same tool with the same arguments, proposed again in a conversation after it ended
  with a terminal error, ends ``repeated_call``: running it again cannot succeed, and a
  model looping on it would spend the budget for nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from callgate.producer.planning import rechain
from callgate.store.errors import ErrorCode
from callgate.store.turns import ConversationFacts, PlannedCall


def apply_budgets(
    planned: Sequence[PlannedCall],
    facts: ConversationFacts,
    *,
    turn_budget: int,
    conversation_budget: int,
) -> list[PlannedCall]:
    """The calls with ``refusal`` set where a budget or the repeated-call rule stops them."""
    decided: list[PlannedCall] = []
    for position, p in enumerate(planned):
        refusal: dict[str, Any] | None = None
        if position >= turn_budget:
            refusal = _error(
                ErrorCode.BUDGET_EXCEEDED, "turn_budget", f"at most {turn_budget} calls per turn"
            )
        elif facts.prior_calls + position >= conversation_budget:
            refusal = _error(
                ErrorCode.BUDGET_EXCEEDED,
                "conversation_budget",
                f"at most {conversation_budget} calls per conversation",
            )
        elif (p.proposal.tool_name, p.args_hash) in facts.failed:
            refusal = _error(
                ErrorCode.REPEATED_CALL,
                "failed_before",
                "different arguments or another action: this exact call already failed",
            )
        decided.append(dataclasses.replace(p, refusal=refusal) if refusal else p)
    return rechain(decided)


def _error(code: ErrorCode, detail: str, expected: str) -> dict[str, Any]:
    return {"code": code.value, "details": [{"code": detail, "expected": expected}]}
