"""Provider surfaces through the CLI: raw responses in, provider-format results out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.acceptance.conftest import SUPPORT_A, callgate, scalar

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "provider-recordings"

ANTHROPIC_RESPONSE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "stop_reason": "tool_use",
    "content": [
        {"type": "text", "text": "Two reads."},
        {
            "type": "tool_use",
            "id": "toolu_w",
            "name": "get_weather",
            "input": {"city": "Seoul", "unit": "celsius"},
        },
        {"type": "tool_use", "id": "toolu_s", "name": "get_stock", "input": {"symbol": "no way"}},
    ],
}


def _context(tmp_path: Path) -> str:
    path = tmp_path / "ctx.json"
    path.write_text(json.dumps(SUPPORT_A))
    return str(path)


def _submit(
    tmp_path: Path, env: dict[str, str], surface: str, body: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    """`callgate submit --provider SURFACE [flags] -` with ``body`` on its standard input."""
    return callgate(
        "submit",
        "--context",
        _context(tmp_path),
        "--provider",
        surface,
        *flags,
        "-",
        env=env,
        stdin=body,
    )


def test_anthropic_response_in_tool_results_out(tmp_path, service_env, stack):
    stack(workers=2)
    body = json.dumps(ANTHROPIC_RESPONSE)
    sub = _submit(tmp_path, service_env, "anthropic-messages", body, "--json")
    assert sub.returncode == 0, sub.stderr
    turn = json.loads(sub.stdout)
    assert [c["call_id"] for c in turn["calls"]] == ["toolu_w", "toolu_s"]
    out = callgate("collect", turn["turn_id"], "--provider", "anthropic-messages", env=service_env)
    assert out.returncode == 0, out.stderr
    message = json.loads(out.stdout)
    assert message["role"] == "user"
    blocks = {b["tool_use_id"]: b for b in message["content"]}
    assert set(blocks) == {"toolu_w", "toolu_s"}
    assert blocks["toolu_w"]["is_error"] is False and blocks["toolu_s"]["is_error"] is True
    assert "invalid_arguments" in json.dumps(blocks["toolu_s"]["content"])


def test_a_recorded_openai_stream_is_reassembled_and_answered_in_kind(tmp_path, service_env, stack):
    stack(workers=1)
    events = (RECORDINGS / "openai_chat_stream_recorded_0.json").read_text()
    sub = _submit(tmp_path, service_env, "openai-chat", events, "--stream", "--json")
    assert sub.returncode == 0, sub.stderr
    turn = json.loads(sub.stdout)
    (call,) = turn["calls"]
    out = callgate("collect", turn["turn_id"], "--provider", "openai-chat", env=service_env)
    assert out.returncode == 0, out.stderr
    (message,) = json.loads(out.stdout)
    assert message["role"] == "tool" and message["tool_call_id"] == call["call_id"]


def test_a_malformed_response_is_refused_and_nothing_is_recorded(tmp_path, service_env, engine):
    before = scalar(engine, "SELECT count(*) FROM callgate.turns")
    broken = {"stop_reason": "tool_use", "content": [{"type": "text", "text": "no tool block"}]}
    sub = _submit(tmp_path, service_env, "anthropic-messages", json.dumps(broken))
    assert sub.returncode == 2 and "Traceback" not in sub.stderr
    assert sub.stderr.startswith("callgate: missing_tool_calls: ")
    invalid = (RECORDINGS / "anthropic_stream_tool_use_invalid_json_response.json").read_text()
    sub = _submit(tmp_path, service_env, "anthropic-messages", invalid, "--stream")
    assert sub.returncode == 2 and sub.stderr.startswith("callgate: invalid_arguments_json: ")
    assert scalar(engine, "SELECT count(*) FROM callgate.turns") == before


def test_a_final_answer_records_nothing(tmp_path, service_env, engine):
    before = scalar(engine, "SELECT count(*) FROM callgate.turns")
    final = {
        "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "Hi"}}]
    }
    sub = _submit(tmp_path, service_env, "openai-chat", json.dumps(final))
    assert sub.returncode == 0 and "nothing recorded" in sub.stdout
    assert scalar(engine, "SELECT count(*) FROM callgate.turns") == before


def test_tools_for_a_role_in_each_surface_form(service_env):
    names_of = {
        "openai-chat": lambda d: [t["function"]["name"] for t in d],
        "openai-responses": lambda d: [t["name"] for t in d],
        "anthropic-messages": lambda d: [t["name"] for t in d],
        "gemini-generate-content": lambda d: [
            f["name"] for t in d for f in t["functionDeclarations"]
        ],
        "gemini-interactions": lambda d: [t["name"] for t in d],
    }
    for surface, names in names_of.items():
        out = callgate("tools", "--role", "viewer", "--provider", surface, env=service_env)
        assert out.returncode == 0, out.stderr
        assert sorted(names(json.loads(out.stdout))) == [
            "get_news",
            "get_stock",
            "get_weather",
            "read_email",
        ], surface


def test_an_invented_tool_ends_alone_and_the_real_call_runs(tmp_path, service_env, stack):
    """A model invents a tool beside a real call: the turn is recorded, the real call runs,
    the invented one ends unknown_tool (the whole response used to be refused, exit 2)."""
    stack(workers=1)
    response = {
        **ANTHROPIC_RESPONSE,
        "content": [
            ANTHROPIC_RESPONSE["content"][1],
            {"type": "tool_use", "id": "toolu_x", "name": "transfer_funds", "input": {"to": "x"}},
        ],
    }
    sub = _submit(tmp_path, service_env, "anthropic-messages", json.dumps(response), "--json")
    assert sub.returncode == 0, sub.stderr
    turn = json.loads(sub.stdout)
    col = callgate("collect", turn["turn_id"], "--timeout", "30", "--json", env=service_env)
    assert col.returncode == 0, col.stderr
    results = {r["call_id"]: r for r in json.loads(col.stdout)["results"]}
    assert results["toolu_w"]["status"] == "succeeded"
    assert results["toolu_x"]["status"] == "failed_terminal"
    assert results["toolu_x"]["error"]["code"] == "unknown_tool"
