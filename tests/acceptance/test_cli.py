"""The ``callgate`` CLI as a user runs it: a subprocess, its output and exit code."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.acceptance.conftest import SUPPORT_A, callgate

COMMANDS = [
    "demo",
    "up",
    "migrate",
    "worker",
    "relayer",
    "sweeper",
    "submit",
    "collect",
    "trace",
    "tools",
    "approvals",
    "approvals list",
    "approvals show",
    "approvals approve",
    "approvals deny",
]


def _one_clear_line(proc: subprocess.CompletedProcess[str], code: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"callgate: {code}: "), proc.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str) -> None:
    proc = callgate(*command.split(), "--help")
    assert proc.returncode == 0 and "Usage: callgate" in proc.stdout


def test_version_is_the_installed_packages() -> None:
    from importlib import metadata

    proc = callgate("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"callgate {metadata.version('callgate')}"


def test_submit_then_collect_as_json(stack, service_env, tmp_path: Path) -> None:
    stack(workers=1)
    ctx = tmp_path / "ctx.json"
    ctx.write_text(json.dumps(SUPPORT_A))
    proposals = [
        {
            "call_id": "c-1",
            "tool_name": "get_weather",
            "arguments": {"city": "Seoul", "unit": "celsius"},
        },
        {
            "call_id": "c-2",
            "tool_name": "get_weather",
            "arguments": {"city": "Seoul", "unit": "kelvin"},
        },
    ]
    sub = callgate(
        "submit", "--context", str(ctx), "--json", "-", env=service_env, stdin=json.dumps(proposals)
    )
    assert sub.returncode == 0, sub.stderr
    turn = json.loads(sub.stdout)
    assert [c["call_id"] for c in turn["calls"]] == ["c-1", "c-2"]
    assert all(c["operation_id"].startswith("op-") for c in turn["calls"])

    col = callgate("collect", turn["turn_id"], "--timeout", "10", "--json", env=service_env)
    assert col.returncode == 0, col.stderr
    doc = json.loads(col.stdout)
    assert doc["turn_id"] == turn["turn_id"] and doc["complete"] is True and doc["pending"] == []
    ok, bad = doc["results"]
    assert ok["call_id"] == "c-1" and ok["status"] == "succeeded"
    assert (
        ok["data"]["content"]["city"] == "Seoul" and ok["data"]["trust"] == "untrusted_tool_output"
    )
    assert bad["call_id"] == "c-2" and bad["status"] == "failed_terminal"
    assert bad["error"]["code"] == "invalid_arguments"
    assert bad["error"]["details"][0]["path"] == "/unit"
    assert "kelvin" not in json.dumps(bad)  # the received value is never echoed

    table = callgate("collect", turn["turn_id"], "--timeout", "1", env=service_env)
    assert table.returncode == 0 and "c-1" in table.stdout and "succeeded" in table.stdout
    # The table shows the tool's own data, not the envelope around it.
    assert '"city": "Seoul"' in table.stdout and "untrusted_tool_output" not in table.stdout

    trace = callgate("trace", turn["turn_id"], "--json", env=service_env)
    events = {(e["call_id"], e["event"]) for e in json.loads(trace.stdout)}
    assert ("c-1", "completed") in events and ("c-2", "rejected") in events


def test_collect_names_pending_calls_on_timeout(service_env, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_text(json.dumps(SUPPORT_A))
    proposals = [{"call_id": "p-1", "tool_name": "get_news", "arguments": {"topic": "x"}}]
    sub = callgate(
        "submit", "--context", str(ctx), "--json", env=service_env, stdin=json.dumps(proposals)
    )
    turn_id = json.loads(sub.stdout)["turn_id"]
    col = callgate("collect", turn_id, "--timeout", "0.3", "--json", env=service_env)  # no workers
    doc = json.loads(col.stdout)
    assert doc["complete"] is False and doc["results"] == [] and doc["pending"] == ["p-1"]
    # Incomplete is not success, and with no worker on the queue it says what is missing.
    assert col.returncode == 3, col.stderr
    assert "no live worker serves queue" in col.stderr and "callgate worker" in col.stderr
    table = callgate("collect", turn_id, "--timeout", "0.3", env=service_env)
    assert table.returncode == 3 and "INCOMPLETE" in table.stdout and "p-1" in table.stdout


def test_unreadable_json_is_one_clear_line(service_env, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_text(json.dumps(SUPPORT_A))
    proc = callgate("submit", "--context", str(ctx), env=service_env, stdin='[{"call_id": ')
    _one_clear_line(proc, "invalid_input")


def test_bad_context_is_one_clear_line(service_env, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_text(json.dumps({"tenant_id": "tenant-a"}))
    proc = callgate("submit", "--context", str(ctx), env=service_env, stdin="[]")
    _one_clear_line(proc, "invalid_input")


def test_unknown_turn_is_one_clear_line(service_env) -> None:
    proc = callgate(
        "collect", "00000000-0000-0000-0000-000000000000", "--timeout", "1", env=service_env
    )
    _one_clear_line(proc, "unknown_turn")
    proc = callgate("collect", "not-a-turn", env=service_env)
    _one_clear_line(proc, "unknown_turn")


def test_unreachable_database_is_one_clear_line(service_env) -> None:
    env = {**service_env, "CALLGATE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none"}
    proc = callgate("collect", "00000000-0000-0000-0000-000000000000", env=env)
    _one_clear_line(proc, "database_unavailable")
    proc = callgate("migrate", env=env)
    _one_clear_line(proc, "database_unavailable")


def test_unset_database_is_one_clear_line(service_env) -> None:
    env = {**service_env, "CALLGATE_DATABASE_URL": ""}
    proc = callgate("collect", "00000000-0000-0000-0000-000000000000", env=env)
    _one_clear_line(proc, "invalid_configuration")


def test_the_same_write_in_two_turns_under_one_operation_id_runs_once(
    stack, service_env, engine, tmp_path: Path
) -> None:
    """A model that lost a refund's result proposes it again in the next turn, under a new
    call id. The application names the refund's operation in its proposals file: the second
    turn gets the first refund's result and the payment is refunded once."""
    stack(workers=1)
    ctx = tmp_path / "ctx.json"
    ctx.write_text(json.dumps(SUPPORT_A))
    operation = f"refund-O-17-{uuid.uuid4().hex[:8]}"
    refund = {"order_id": "O-17", "amount": 3, "currency": "KRW"}
    results = []
    for call_id in ("turn1-refund", "turn2-refund"):
        proposal = {
            "call_id": call_id,
            "tool_name": "refund_payment",
            "arguments": refund,
            "operation_id": operation,
        }
        sub = callgate(
            "submit", "--context", str(ctx), "--json", env=service_env, stdin=json.dumps([proposal])
        )
        assert sub.returncode == 0, sub.stderr
        (call,) = json.loads(sub.stdout)["calls"]
        assert call["operation_id"] == operation
        col = callgate(
            "collect",
            json.loads(sub.stdout)["turn_id"],
            "--timeout",
            "30",
            "--json",
            env=service_env,
        )
        assert col.returncode == 0, col.stderr
        (result,) = json.loads(col.stdout)["results"]
        assert result["status"] == "succeeded", result
        results.append(result["data"]["content"])
    assert results[0]["refund_id"] == results[1]["refund_id"]
    with engine.connect() as conn:
        applied = conn.execute(
            text(
                "SELECT count(*) FROM downstream.side_effects s JOIN callgate.operations o"
                " ON o.idempotency_key = s.idempotency_key WHERE o.operation_id = :op"
            ),
            {"op": operation},
        ).scalar_one()
    assert applied == 1
