"""Test helpers: where the recordings live, inbound envelopes built from proposals, and the
(call id, status) pairs read back out of each surface's result message."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from callgate.core.types import ProposedCall
from callgate.producer.adapters import names

REPO = Path(__file__).resolve().parents[3]
# The recordings are copied into the repo so a clone elsewhere (CI) still has them;
# CALLGATE_FIXTURES_DIR points the tests at another copy.
IN_REPO_RECORDINGS = REPO / "tests" / "fixtures" / "provider-recordings"


def recordings_dir() -> Path:
    override = os.environ.get("CALLGATE_FIXTURES_DIR")
    return Path(override) if override else IN_REPO_RECORDINGS


def load(name: str) -> Any:
    return json.loads((recordings_dir() / name).read_text(encoding="utf-8"))


def wire(surface: str, name: str) -> str:
    return names.wire_name(surface, name)


# Where inbound() puts the non-call items: before the calls, in every gap between two calls,
# after them, or all three.
PLACES = ("before", "between", "after", "around")


def place(extras: list[Any], calls: list[Any], where: str) -> list[Any]:
    """``calls`` in order with copies of ``extras`` placed ``where`` (one of PLACES)."""
    if where not in PLACES:
        raise AssertionError(where)
    if not calls:
        return copy.deepcopy(extras)
    out = copy.deepcopy(extras) if where in ("before", "around") else []
    for index, call in enumerate(calls):
        if index and where in ("between", "around"):
            out += copy.deepcopy(extras)
        out.append(call)
    if where in ("after", "around"):
        out += copy.deepcopy(extras)
    return out


def inbound(
    surface: str, proposals: list[ProposedCall], *, with_ids: bool = True, where: str = "before"
) -> Any:
    """The response ``surface`` would send proposing ``proposals``, with text, thought or
    reasoning items placed ``where`` beside the calls (they must never hide them).
    Chat Completions has no items to place: its text is a field of the message."""
    if surface == "openai-chat":
        calls = [
            {
                "id": p.call_id,
                "type": "function",
                "function": {
                    "name": wire(surface, p.tool_name),
                    "arguments": json.dumps(p.arguments),
                },
            }
            for p in proposals
        ]
        message: dict[str, Any] = {"role": "assistant", "content": "Let me check."}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
    if surface == "openai-responses":
        output = [
            {
                "type": "function_call",
                "id": f"fc_{index}",
                "call_id": p.call_id,
                "name": wire(surface, p.tool_name),
                "arguments": json.dumps(p.arguments),
                "status": "completed",
            }
            for index, p in enumerate(proposals)
        ]
        extras = [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}],
            },
        ]
        return {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "output": place(extras, output, where),
        }
    if surface == "anthropic-messages":
        blocks = [
            {
                "type": "tool_use",
                "id": p.call_id,
                "name": wire(surface, p.tool_name),
                "input": p.arguments,
            }
            for p in proposals
        ]
        extras = [
            {"type": "text", "text": "three reads"},
            # a provider-run tool and its result: the provider's to execute, not ours
            {
                "type": "server_tool_use",
                "id": "srvtoolu_1",
                "name": "web_search",
                "input": {"query": "weather"},
            },
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        ]
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": place(extras, blocks, where),
            "stop_reason": "tool_use" if proposals else "end_turn",
        }
    if surface == "gemini-generate-content":
        parts: list[dict[str, Any]] = []
        for p in proposals:
            call: dict[str, Any] = {"name": wire(surface, p.tool_name), "args": p.arguments}
            if with_ids:
                call["id"] = p.call_id
            parts.append({"functionCall": call, "thoughtSignature": "c2ln"})
        extras = [{"text": "planning", "thought": True}, {"text": "Let me check."}]
        return {
            "candidates": [
                {
                    "content": {"role": "model", "parts": place(extras, parts, where)},
                    "finishReason": "STOP",
                }
            ]
        }
    if surface == "gemini-interactions":
        steps: list[dict[str, Any]] = []
        for p in proposals:
            step: dict[str, Any] = {
                "type": "function_call",
                "name": wire(surface, p.tool_name),
                "arguments": p.arguments,
            }
            if with_ids:
                step["id"] = p.call_id
            steps.append(step)
        extras = [
            {"type": "thought", "signature": "c2ln"},
            {"type": "model_output", "content": [{"type": "text", "text": "Let me check."}]},
        ]
        status = "requires_action" if proposals else "completed"
        return {
            "id": "interaction-1",
            "status": status,
            "steps": place(extras, steps, where),
        }
    raise AssertionError(surface)


def id_status(surface: str, envelope: Any) -> list[tuple[str | None, str]]:
    """(call id, status) per item of a result message, in message order (a fixture's idStatus)."""
    if surface == "openai-chat":
        return [(m["tool_call_id"], json.loads(m["content"])["status"]) for m in envelope]
    if surface == "openai-responses":
        return [(i["call_id"], json.loads(i["output"])["status"]) for i in envelope]
    if surface == "anthropic-messages":
        return [(b["tool_use_id"], json.loads(b["content"])["status"]) for b in envelope["content"]]
    if surface == "gemini-generate-content":
        return [
            (p["functionResponse"].get("id"), p["functionResponse"]["response"]["status"])
            for p in envelope["parts"]
        ]
    if surface == "gemini-interactions":
        return [
            (i["call_id"], json.loads(i["result"][0]["text"])["status"]) for i in envelope["input"]
        ]
    raise AssertionError(surface)


def bodies(surface: str, envelope: Any) -> list[dict[str, Any]]:
    """The result body of each item, parsed."""
    if surface == "openai-chat":
        return [json.loads(m["content"]) for m in envelope]
    if surface == "openai-responses":
        return [json.loads(i["output"]) for i in envelope]
    if surface == "anthropic-messages":
        return [json.loads(b["content"]) for b in envelope["content"]]
    if surface == "gemini-generate-content":
        return [p["functionResponse"]["response"] for p in envelope["parts"]]
    if surface == "gemini-interactions":
        return [json.loads(i["result"][0]["text"]) for i in envelope["input"]]
    raise AssertionError(surface)
