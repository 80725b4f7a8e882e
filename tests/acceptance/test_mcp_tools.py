"""MCP servers' tools through real worker processes: the real ``mcp-server-time`` and
``mcp-server-git``, the tests' recording server (it counts every ``tools/call`` it receives)
and a misbehaving raw server.

One worker, relayer and sweeper serve the whole module (each start connects to five
servers); the tests share its servers, so each counts only its own requests.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.store import db, mcp_catalog
from tests.acceptance.conftest import call_row, callgate, trace_events, wait_until
from tests.acceptance.mcp_world import SUPPORT, World, call_id, make_world

ROLE = "support"
CTX = {**SUPPORT, "roles": [ROLE]}
SLOW_START = 90.0  # a worker start connects to five servers on a shared machine


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return make_world(tmp_path_factory.mktemp("mcp"))


@pytest.fixture(scope="module")
def mcp_env(world: World, make_own_database: Callable[[], str], redis_url: str) -> dict[str, str]:
    return {
        "CALLGATE_DATABASE_URL": make_own_database(),
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": f"t-mcp-{uuid.uuid4().hex[:8]}",
        "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
        "CALLGATE_MCP_CONFIG": str(world.config),
        "CALLGATE_LOG_LEVEL": "INFO",
        "CALLGATE_LOG_FORMAT": "json",
    }


@pytest.fixture(scope="module")
def log_path(world: World) -> Path:
    return world.root / "stack.log"


@pytest.fixture(scope="module")
def mcp_stack(mcp_env: dict[str, str], log_path: Path) -> Iterator[Stack]:
    stack = Stack(env=mcp_env, workers=1, log_path=str(log_path))
    stack.__enter__()
    try:
        wait_for_workers(
            mcp_env["CALLGATE_REDIS_URL"], mcp_env["CALLGATE_QUEUE"], 1, timeout=SLOW_START
        )
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def mcp_producer(mcp_env: dict[str, str], mcp_stack: Stack) -> Iterator[Producer]:
    producer = Producer.from_env(Settings.from_env(mcp_env))
    yield producer
    producer.close()


@pytest.fixture(scope="module")
def mcp_engine(mcp_env: dict[str, str]) -> Iterator[Engine]:
    engine = db.create(mcp_env["CALLGATE_DATABASE_URL"])
    yield engine
    engine.dispose()


def run(
    producer: Producer, engine: Engine, tool: str, args: Any, timeout: float = 60.0
) -> tuple[str, dict[str, Any]]:
    """Submit one call and wait until it is terminal or parked; (call ref, row)."""
    cid = call_id()
    turn = producer.submit([{"call_id": cid, "tool_name": tool, "arguments": args}], CTX)
    ref = turn.calls[0].ref
    row = wait_until(
        lambda: (
            (r := call_row(engine, ref))["state"]
            in ("succeeded", "failed_terminal", "failed_retryable", "awaiting_approval")
            and r
        ),
        timeout=timeout,
        what=f"{tool} to settle",
    )
    return ref, row


def error_code(row: dict[str, Any]) -> str:
    return str(row["result"]["error"]["code"])


def test_a_real_server_answers_through_the_gate_with_its_request_id_beside_the_call_id(
    mcp_producer: Producer, mcp_engine: Engine
) -> None:
    ref, row = run(mcp_producer, mcp_engine, "time__get_current_time", {"timezone": "Asia/Seoul"})
    assert row["state"] == "succeeded", row
    result = row["result"]
    assert result["data"]["trust"] == "untrusted_tool_output"
    assert result["data"]["source"]["tool"] == "time__get_current_time"
    assert result["data"]["content"]["structuredContent"]["timezone"] == "Asia/Seoul"

    (request,) = trace_events(mcp_engine, ref, "mcp_request")
    (response,) = trace_events(mcp_engine, ref, "mcp_response")
    rid = request["detail"]["jsonrpc_id"]
    assert rid.startswith("callgate-")
    call_id_of_ref = result["call_id"]
    assert rid != call_id_of_ref  # a new JSON-RPC id, never the provider's call id
    assert request["detail"]["tool_call_id"] == call_id_of_ref
    assert response["detail"]["response_id"] == rid and response["detail"]["id_matches"]
    assert response["detail"]["outcome"] == "result"
    assert request["detail"]["protocol_version"]
    # The call's own trace names the schema version it was admitted under.
    (started,) = trace_events(mcp_engine, ref, "completed")
    version = started["detail"]["schema_version"]
    (row_,) = [r for r in mcp_catalog.latest(mcp_engine, "time") if r["tool"] == "get_current_time"]
    assert version == str(row_["version"])
    assert row_["server_name"] == "mcp-time" and row_["server_version"]


def test_git_reads_a_repository(mcp_producer: Producer, mcp_engine: Engine, world: World) -> None:
    _, row = run(mcp_producer, mcp_engine, "git__git_log", {"repo_path": str(world.repo)})
    assert row["state"] == "succeeded", row
    assert "first" in json.dumps(row["result"]["data"]["content"])


def test_invalid_arguments_are_refused_before_the_server_sees_them(
    mcp_producer: Producer, mcp_engine: Engine, world: World
) -> None:
    before = len(world.received("echo"))
    ref, row = run(mcp_producer, mcp_engine, "rec__echo", {"text": 5, "extra": True})
    assert row["state"] == "failed_terminal"
    assert error_code(row) == "invalid_arguments"
    details = {(d["path"], d["code"]) for d in row["result"]["error"]["details"]}
    assert details == {("/text", "type"), ("/extra", "extra_forbidden")}
    assert trace_events(mcp_engine, ref, "mcp_request") == []
    # A valid one goes through, and only it reaches the server.
    _, ok = run(mcp_producer, mcp_engine, "rec__echo", {"text": "hello"})
    assert ok["state"] == "succeeded", ok
    assert ok["result"]["data"]["content"]["structuredContent"] == {"echo": "hello"}
    assert [r["arguments"] for r in world.received("echo")[before:]] == [{"text": "hello"}]


def test_calls_share_one_session_per_server_in_a_worker(
    mcp_producer: Producer, mcp_engine: Engine, world: World
) -> None:
    markers = [{"text": f"reuse-{i}-{uuid.uuid4().hex[:4]}"} for i in range(3)]
    for marker in markers:
        _, row = run(mcp_producer, mcp_engine, "rec__echo", marker)
        assert row["state"] == "succeeded"
    pids = {r["pid"] for r in world.received("echo") if r["arguments"] in markers}
    assert len(pids) == 1  # one server process served them all: not a session per call


def test_tool_errors_are_classified_by_the_servers_stable_code(
    mcp_producer: Producer, mcp_engine: Engine
) -> None:
    # mcp-server-time's isError has no stable code: a terminal tool failure, detail kept.
    ref, row = run(mcp_producer, mcp_engine, "time__get_current_time", {"timezone": "Mars/Base"})
    assert row["state"] == "failed_terminal"
    assert error_code(row) == "mcp_tool_execution_failed"
    (detail,) = row["result"]["error"]["details"]
    assert detail["code"] == "mcp_tool_detail" and "Invalid timezone" in detail["message"]
    (response,) = trace_events(mcp_engine, ref, "mcp_response")
    assert response["detail"]["outcome"] == "tool_error"

    _, fixable = run(mcp_producer, mcp_engine, "rec__fail", {"code": "invalid_arguments"})
    assert fixable["state"] == "failed_terminal"
    assert error_code(fixable) == "invalid_arguments"
    (message,) = [d["message"] for d in fixable["result"]["error"]["details"]]
    assert "hunter2" not in message and "failed as asked" in message

    _, transient = run(mcp_producer, mcp_engine, "rec__fail", {"code": "upstream_unavailable"})
    assert transient["state"] == "failed_retryable"
    assert error_code(transient) == "upstream_unavailable"


def test_structured_content_is_checked_against_the_output_schema(
    mcp_producer: Producer, mcp_engine: Engine
) -> None:
    _, row = run(mcp_producer, mcp_engine, "rec__bad_output", {})
    assert row["state"] == "failed_terminal"
    assert error_code(row) == "mcp_invalid_output"
    assert row["result"]["error"]["details"][0]["path"] == "/n"


@pytest.mark.parametrize(
    ("tool", "code"),
    [
        ("raw__invalid", "mcp_invalid_params"),
        ("raw__broken", "mcp_wire_error"),
        ("raw__garbled", "mcp_wire_error"),
        ("raw__mismatch", "mcp_response_id_mismatch"),
    ],
)
def test_protocol_errors_are_terminal_and_kept_apart_from_tool_errors(
    mcp_producer: Producer, mcp_engine: Engine, tool: str, code: str
) -> None:
    ref, row = run(mcp_producer, mcp_engine, tool, {})
    assert row["state"] == "failed_terminal", row
    assert error_code(row) == code
    (response,) = trace_events(mcp_engine, ref, "mcp_response")
    if tool == "raw__mismatch":
        assert response["detail"]["id_matches"] is False
    else:
        assert response["detail"]["id_matches"] is True


def test_a_write_answered_under_another_id_is_never_sent_again(
    mcp_producer: Producer, mcp_engine: Engine, world: World
) -> None:
    # The server may have applied the write, and its answer cannot say: a write that is not
    # idempotent and has no status lookup waits for a person, sent exactly once.
    ref, row = run(mcp_producer, mcp_engine, "raw__mismatch_write", {})
    assert row["state"] == "failed_terminal", row
    assert error_code(row) == "reconciliation_pending"
    (request,) = trace_events(mcp_engine, ref, "mcp_request")
    sent = [
        json.loads(line)
        for line in world.raw_record.read_text().splitlines()
        if json.loads(line)["id"] == request["detail"]["jsonrpc_id"]
    ]
    assert len(sent) == 1
    assert all(r["tool"] == "mismatch_write" for r in sent)
    (response,) = trace_events(mcp_engine, ref, "mcp_response")
    assert response["detail"]["id_matches"] is False
    # Sent once in all: no other request of this tool reached the server for this call.
    attempts = trace_events(mcp_engine, ref, "mcp_request")
    assert len(attempts) == 1


def test_a_hung_call_times_out_into_a_retryable_error(
    mcp_producer: Producer, mcp_engine: Engine
) -> None:
    ref, row = run(mcp_producer, mcp_engine, "hung__slow", {"seconds": 30})
    assert row["state"] == "failed_retryable"
    assert error_code(row) == "upstream_unavailable"
    failures = trace_events(mcp_engine, ref, "mcp_no_response")
    assert failures and all(f["detail"]["sent"] for f in failures)
    assert "did not answer within 1s" in failures[0]["detail"]["reason"]


def _pid_of(world: World, tool: str, marker: dict[str, Any]) -> int:
    def find() -> int | None:
        for line in world.received(tool):
            if line["arguments"] == marker:
                return int(line["pid"])
        return None

    found: int = wait_until(find, timeout=30, what=f"{tool} to reach the server")
    return found


def test_a_server_killed_mid_call_is_restarted_and_the_read_runs_again(
    mcp_producer: Producer, mcp_engine: Engine, world: World
) -> None:
    marker = {"seconds": 2.5}
    cid = call_id()
    turn = mcp_producer.submit(
        [{"call_id": cid, "tool_name": "rec__slow", "arguments": marker}], CTX
    )
    ref = turn.calls[0].ref
    pid = _pid_of(world, "slow", marker)
    os.kill(pid, signal.SIGKILL)
    row = wait_until(
        lambda: (
            (r := call_row(mcp_engine, ref))["state"] != "started"
            and r["state"] != "proposed"
            and r
        ),
        timeout=60,
        what="the read to finish",
    )
    assert row["state"] == "succeeded", row
    pids = [line["pid"] for line in world.received("slow") if line["arguments"] == marker]
    assert len(pids) == 2 and pids[0] == pid and pids[1] != pid  # sent again, to a new server
    lost = trace_events(mcp_engine, ref, "mcp_no_response")
    assert lost and lost[0]["detail"]["sent"] is True


def test_a_write_whose_server_dies_mid_call_is_never_sent_twice(
    mcp_producer: Producer, mcp_engine: Engine, world: World
) -> None:
    marker = {"text": f"note-{uuid.uuid4().hex[:6]}", "seconds": 2.5}
    cid = call_id()
    turn = mcp_producer.submit(
        [{"call_id": cid, "tool_name": "rec__note", "arguments": marker}], CTX
    )
    ref = turn.calls[0].ref
    os.kill(_pid_of(world, "note", marker), signal.SIGKILL)
    row = wait_until(
        lambda: (r := call_row(mcp_engine, ref))["state"] not in ("proposed", "started") and r,
        timeout=60,
        what="the write to end",
    )
    assert row["state"] == "failed_terminal"
    assert error_code(row) == "reconciliation_pending"
    assert [r for r in world.received("note") if r["arguments"] == marker] != []
    assert len([r for r in world.received("note") if r["arguments"] == marker]) == 1


def test_a_destructive_tool_waits_for_an_approval_bound_to_its_intent(
    mcp_producer: Producer, mcp_engine: Engine, mcp_env: dict[str, str], world: World
) -> None:
    (world.repo / "README").write_text("changed\n")
    subprocess_git(world.repo, "add", "README")
    ref, row = run(mcp_producer, mcp_engine, "git__git_reset", {"repo_path": str(world.repo)})
    assert row["state"] == "awaiting_approval"
    with mcp_engine.connect() as conn:
        impact = conn.execute(
            text("SELECT impact FROM callgate.approvals WHERE approval_id = :a"),
            {"a": row["approval_id"]},
        ).scalar_one()
    assert impact["mcp_server"] == "git" and impact["mcp_tool"] == "git_reset"
    assert impact["destructive"] is True and impact["reversible"] is False
    assert "repo_path" in impact["arguments"]
    assert "README" in subprocess_git(world.repo, "diff", "--cached", "--name-only")

    approved = callgate(
        "approvals",
        "approve",
        str(row["approval_id"]),
        "--by",
        "user-99",
        "--tenant",
        "tenant-a",
        env=mcp_env,
    )
    assert approved.returncode == 0, approved.stderr
    done = wait_until(
        lambda: (r := call_row(mcp_engine, ref))["state"] == "succeeded" and r,
        timeout=60,
        what="the approved reset",
    )
    assert done["state"] == "succeeded"
    assert subprocess_git(world.repo, "diff", "--cached", "--name-only") == ""


def subprocess_git(repo: Path, *args: str) -> str:
    import subprocess

    out = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def test_stderr_of_a_server_goes_to_the_log_never_the_protocol(
    mcp_producer: Producer, mcp_engine: Engine, log_path: Path
) -> None:
    _, row = run(mcp_producer, mcp_engine, "rec__echo", {"text": "quiet"})
    assert row["state"] == "succeeded"

    def logged() -> bool:
        for line in log_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("logger") == "callgate.mcp.rec" and record.get("message") == (
                "stderr: handling echo"
            ):
                return True
        return False

    wait_until(logged, what="the server's stderr in the worker's log, under the server's name")


def test_callgate_tools_lists_the_mcp_tools_a_role_may_use(mcp_env: dict[str, str]) -> None:
    shown = callgate("tools", "--role", ROLE, env=mcp_env)
    assert shown.returncode == 0, shown.stderr
    names = {d["name"] for d in json.loads(shown.stdout)}
    assert {"time__get_current_time", "git__git_status", "rec__echo"} <= names
    # A role the allowlist does not name is refused, not shown an empty list.
    nobody = callgate("tools", "--role", "nobody", env=mcp_env)
    assert nobody.returncode == 2 and nobody.stdout == ""
    assert nobody.stderr.startswith("callgate: invalid_input: no role named 'nobody'")


def test_a_schema_change_is_a_new_version_and_the_gate_uses_it(
    mcp_producer: Producer, mcp_engine: Engine, world: World
) -> None:
    ref_v1, first = run(mcp_producer, mcp_engine, "rec__echo", {"text": "before"})
    assert first["state"] == "succeeded"
    (started,) = trace_events(mcp_engine, ref_v1, "completed")
    v1 = int(started["detail"]["schema_version"])

    world.schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
                "additionalProperties": False,
            }
        )
    )

    def echo_version() -> int:
        rows = [r for r in mcp_catalog.latest(mcp_engine, "rec") if r["tool"] == "echo"]
        return int(rows[0]["version"]) if rows else 0

    wait_until(lambda: echo_version() > v1, timeout=30, what="the new schema's version")
    # The worker learns the change from the server's notifications/tools/list_changed.
    deadline = time.monotonic() + 30
    while True:
        ref_v2, second = run(mcp_producer, mcp_engine, "rec__echo", {"message": "after"})
        if second["state"] == "succeeded" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert second["state"] == "succeeded", second
    (started2,) = trace_events(mcp_engine, ref_v2, "completed")
    assert int(started2["detail"]["schema_version"]) == echo_version() > v1

    before = len(world.received("echo"))
    _, stale = run(mcp_producer, mcp_engine, "rec__echo", {"text": "old shape"})
    assert stale["state"] == "failed_terminal" and error_code(stale) == "invalid_arguments"
    assert len(world.received("echo")) == before  # refused by the gate: never sent
