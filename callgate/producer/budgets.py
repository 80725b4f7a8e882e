"""Loop and budget guards, decided when a turn is recorded. Pure: no I/O.

- A turn may propose at most ``turn_budget`` calls, a conversation at most
  ``conversation_budget``; calls beyond either end ``budget_exceeded`` without running.
- The same tool with the same arguments, proposed again in a conversation after it ended
  with a terminal error, ends ``repeated_call``: running it again cannot succeed, and a
  model looping on it would spend the budget for nothing.
- A write proposed twice in one turn with the same tool and the same arguments runs once:
  the second ends ``repeated_call`` naming the first. Two identical writes in one response
  are almost always a model repeating itself, and running both would apply the effect
  twice. Identical reads both run: reading twice changes nothing.
- A write proposed again in a conversation (same tool, same arguments) while an earlier one
  of the conversation succeeded or has not ended ends ``repeated_call`` naming it: a model
  that lost a result proposes the write again, and running it would apply it twice. Under
  the earlier call's operation id it is no repeat (it gets that result); a proposal the
  application marks ``repeat=True`` (a second refund the user asked for) runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from callgate.core.errors import ErrorCode
from callgate.core.values import printable
from callgate.producer.planning import rechain
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
    first_write: dict[tuple[str, str], str] = {}
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
        elif p.kind == "write" and (earlier := _earlier_write(p, facts)) is not None:
            refusal = _error(
                ErrorCode.REPEATED_CALL,
                "done_before",
                f"one write per action: call '{printable(earlier)}' of this conversation makes "
                "it (the application may propose it with repeat=true to make it again)",
            )
        elif p.kind == "write" and (action := (p.proposal.tool_name, p.args_hash)) in first_write:
            refusal = _error(
                ErrorCode.REPEATED_CALL,
                "repeated_in_turn",
                f"one write per action: call '{printable(first_write[action])}' of this turn "
                "makes it",
            )
        if p.kind == "write" and refusal is None:
            first_write.setdefault((p.proposal.tool_name, p.args_hash), p.proposal.call_id)
        decided.append(dataclasses.replace(p, refusal=refusal) if refusal else p)
    return rechain(decided)


def _earlier_write(p: PlannedCall, facts: ConversationFacts) -> str | None:
    """The call id of the conversation's earlier write this one would repeat, if any."""
    if p.proposal.repeat:
        return None
    earlier = facts.writes.get((p.proposal.tool_name, p.args_hash))
    if earlier is None or earlier[1] == p.operation_id:  # the same operation: its result
        return None
    return earlier[0]


def _error(code: ErrorCode, detail: str, expected: str) -> dict[str, Any]:
    return {"code": code.value, "details": [{"code": detail, "expected": expected}]}
