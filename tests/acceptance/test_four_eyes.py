"""Approvers through the CLI, with real worker, relayer and sweeper processes.

- Four eyes: the user whose call asked for the approval can neither approve nor deny it; the
  refund does not run (counted at the payments provider). Another person of the same tenant
  approves, and it runs exactly once.
- Tenants: an approver acts for one tenant; another tenant's request is invisible and answers
  exactly like a missing one.
- Redis down while approving: the decision is committed in Postgres, so the command succeeds
  with a warning, and the sweeper dispatches the resumed call once Redis is reachable.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import Engine, text

from tests.acceptance.conftest import (
    SUPPORT_A,
    call_row,
    callgate,
    effects_for,
    requests_for,
    trace_events,
)
from tests.acceptance.test_gate import (
    NEEDS_APPROVAL,
    approvals_of,
    final,
    new_order,
    refund,
    submit_one,
)

NOBODY_LISTENS = "redis://127.0.0.1:1/0"


def _one_line(proc: Any, code: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"callgate: {code}: "), line
    return str(line)


def _request_row(engine: Engine, approval_id: str) -> tuple[str, str | None]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, decided_by FROM callgate.approvals WHERE approval_id = :a"),
            {"a": approval_id},
        ).one()
    return row.state, row.decided_by


def _parked_refund(producer: Any, engine: Engine) -> tuple[str, str, str, str]:
    """A big refund by user-17 of tenant-a, parked; (turn id, call ref, key, approval id)."""
    order, _ = new_order(engine, "tenant-a")
    turn_id, ref, op, key = submit_one(
        producer, SUPPORT_A, "refund_payment", refund(order, NEEDS_APPROVAL)
    )
    assert final(engine, ref)["state"] == "awaiting_approval"
    (request,) = approvals_of(engine, op)
    return turn_id, ref, key, str(request["approval_id"])


def test_the_requester_cannot_approve_their_own_refund(producer, stack, engine, service_env):
    stack(workers=1)
    turn_id, ref, key, approval_id = _parked_refund(producer, engine)

    # user-17 asked for it: neither approve nor deny, with the flag or its variable.
    line = _one_line(
        callgate(
            "approvals",
            "approve",
            approval_id,
            "--by",
            "user-17",
            "--tenant",
            "tenant-a",
            env=service_env,
        ),
        "approval_forbidden",
    )
    assert "user-17" in line
    _one_line(
        callgate(
            "approvals",
            "deny",
            approval_id,
            env={
                **service_env,
                "CALLGATE_APPROVER": "user-17",
                "CALLGATE_APPROVER_TENANT": "tenant-a",
            },
        ),
        "approval_forbidden",
    )
    # Nothing moved: the request is pending, the call parked with no job, nothing ran.
    assert _request_row(engine, approval_id) == ("pending", None)
    assert call_row(engine, ref)["state"] == "awaiting_approval"
    assert producer.queue.count == 0
    assert (requests_for(engine, key), effects_for(engine, key)) == (0, 0)
    assert trace_events(engine, ref, "approval_granted") == []

    # Another person of the same tenant approves: the refund runs exactly once.
    proc = callgate(
        "approvals",
        "approve",
        approval_id,
        "--by",
        "user-99",
        "--tenant",
        "tenant-a",
        env=service_env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    (result,) = producer.collect(turn_id, timeout=15).results
    assert result.status == "succeeded"
    assert (requests_for(engine, key), effects_for(engine, key)) == (1, 1)
    assert _request_row(engine, approval_id) == ("approved", "user-99")
    (granted,) = trace_events(engine, ref, "approval_granted")
    assert granted["detail"]["by"] == "user-99"


def test_an_approver_of_another_tenant_cannot_see_or_decide(producer, stack, engine, service_env):
    stack(workers=1)
    _, ref, key, approval_id = _parked_refund(producer, engine)
    tenant_b = {
        **service_env,
        "CALLGATE_APPROVER": "user-42",
        "CALLGATE_APPROVER_TENANT": "tenant-b",
    }
    missing = str(uuid.uuid4())

    listed = callgate("approvals", "list", "--state", "all", "--json", env=tenant_b)
    assert listed.returncode == 0, listed.stderr
    assert approval_id not in {a["approval_id"] for a in json.loads(listed.stdout)}
    own = callgate(
        "approvals", "list", "--json", env={**tenant_b, "CALLGATE_APPROVER_TENANT": "tenant-a"}
    )
    assert approval_id in {a["approval_id"] for a in json.loads(own.stdout)}

    for command in ("show", "approve", "deny"):
        theirs = _one_line(
            callgate("approvals", command, approval_id, env=tenant_b), "unknown_approval"
        )
        absent = _one_line(
            callgate("approvals", command, missing, env=tenant_b), "unknown_approval"
        )
        assert theirs.replace(approval_id, "ID") == absent.replace(missing, "ID")

    assert _request_row(engine, approval_id) == ("pending", None)
    assert call_row(engine, ref)["state"] == "awaiting_approval"
    assert (requests_for(engine, key), effects_for(engine, key)) == (0, 0)


def test_approvals_need_the_approvers_tenant(service_env):
    env = {**service_env, "CALLGATE_APPROVER": "alice", "CALLGATE_APPROVER_TENANT": ""}
    for args in (("list",), ("show", str(uuid.uuid4())), ("approve", str(uuid.uuid4()))):
        proc = callgate("approvals", *args, env=env)
        assert proc.returncode == 2, proc.stderr
        assert "--tenant" in proc.stderr and "Traceback" not in proc.stderr


def test_an_approval_committed_while_redis_is_down_succeeds_with_a_warning(
    producer, stack, engine, service_env
):
    # A short stale interval, so the sweeper's re-dispatch is seen within the test.
    stack(workers=1, CALLGATE_STALE_SECONDS="1", CALLGATE_SWEEP_SECONDS="0.2")
    turn_id, ref, key, approval_id = _parked_refund(producer, engine)

    proc = callgate(
        "approvals",
        "approve",
        approval_id,
        "--by",
        "alice",
        "--tenant",
        "tenant-a",
        env={**service_env, "CALLGATE_REDIS_URL": NOBODY_LISTENS},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"approved {approval_id} by alice" in proc.stdout
    (warning,) = proc.stderr.strip().splitlines()
    assert warning.startswith("callgate: warning: redis_unavailable: ")
    assert "recorded" in warning and "sweeper" in warning

    # The decision is in Postgres; the call waits for a dispatch.
    assert _request_row(engine, approval_id) == ("approved", "alice")
    assert call_row(engine, ref)["state"] in ("proposed", "started", "succeeded")
    # The sweeper (Redis is up for it) dispatches the resumed call: it runs once.
    (result,) = producer.collect(turn_id, timeout=20).results
    assert result.status == "succeeded"
    assert (requests_for(engine, key), effects_for(engine, key)) == (1, 1)
