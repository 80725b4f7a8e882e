"""Batch deletion with one approval, safe results, and loop budgets, with real workers."""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.ops.lab.demo.downstream import INJECTION_EMAIL, MAILBOX, POLICY_EMAILS
from callgate.producer import Producer
from callgate.queue import transport
from tests.acceptance.conftest import (
    SUPPORT_A,
    callgate,
    requests_for,
    scalar,
    trace_events,
    wait_until,
)
from tests.acceptance.test_gate import approvals_of, final, producer_env, submit_one

VIEWER_A = {
    "request_id": "req-v",
    "tenant_id": "tenant-a",
    "user_id": "user-5",
    "roles": ["viewer"],
}


def mailbox(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT email_id, deleted_at IS NOT NULL AS deleted, deleted_by"
                " FROM downstream.emails WHERE account = :a"
            ),
            {"a": MAILBOX},
        ).mappings()
        return {r["email_id"]: dict(r) for r in rows}


def changed_per_email(engine: Engine, key: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT resource_id, count(*) AS n FROM downstream.side_effects"
                " WHERE idempotency_key = :k GROUP BY resource_id"
            ),
            {"k": key},
        )
        return {r.resource_id: r.n for r in rows}


def test_deleting_50_emails_takes_one_approval_and_changes_each_once(
    producer, stack, engine, fresh_payments
):
    stack(workers=2)
    policy = {f"em-a-policy-{n:02d}" for n in range(1, POLICY_EMAILS + 1)}
    turn_id, ref, op, key = submit_one(
        producer, SUPPORT_A, "delete_emails", {"query": "policy update"}
    )

    # Before approval: parked, nothing changed, nothing sent to the mailbox provider.
    assert final(engine, ref)["state"] == "awaiting_approval"
    assert not any(e["deleted"] for e in mailbox(engine).values())
    assert requests_for(engine, key) == 0

    # The approval shows the count and the account, computed by the server.
    (request,) = approvals_of(engine, op)
    # An approver of user-17's tenant (never user-17: four eyes).
    env = {**producer_env(producer), "CALLGATE_APPROVER_TENANT": "tenant-a"}
    shown = json.loads(
        callgate("approvals", "show", str(request["approval_id"]), "--json", env=env).stdout
    )
    impact = shown["impact"]
    assert (impact["count"], impact["account"], impact["recoverable"]) == (50, MAILBOX, True)
    assert set(impact["email_ids"]) == policy
    listed = callgate("approvals", "list", env=env)
    assert str(request["approval_id"]) in listed.stdout

    proc = callgate("approvals", "approve", str(request["approval_id"]), "--by", "alice", env=env)
    assert proc.returncode == 0, proc.stderr
    (result,) = producer.collect(turn_id, timeout=15).results
    assert result.status == "succeeded"
    assert sorted(result.data["content"]["deleted"]) == sorted(policy)

    # Exactly the approved set changed, each e-mail once, softly (recoverable).
    box = mailbox(engine)
    assert {e for e, row in box.items() if row["deleted"]} == policy
    assert all(box[e]["deleted_by"] == key for e in policy)
    assert changed_per_email(engine, key) == dict.fromkeys(policy, 1)
    # The trace links every deleted id to this call.
    (completed,) = trace_events(engine, ref, "completed")
    assert sorted(completed["detail"]["resources"]) == sorted(policy)

    # Redelivery: a duplicate job of the same call, and the same operation in a new turn.
    transport.enqueue_calls(producer.queue, [uuid.UUID(ref)], timeout=60)
    wait_until(lambda: trace_events(engine, ref, "duplicate_delivery"), what="the duplicate job")
    turn2, _, _, _ = submit_one(
        producer, SUPPORT_A, "delete_emails", {"query": "policy update"}, op
    )
    (again,) = producer.collect(turn2, timeout=15).results
    assert again.status == "succeeded" and again.data == result.data
    assert requests_for(engine, key) == 1
    assert changed_per_email(engine, key) == dict.fromkeys(policy, 1)


def test_a_result_is_untrusted_data_that_grants_nothing(producer, stack, engine, fresh_payments):
    stack(workers=1)
    turn_id, ref, _, _ = submit_one(
        producer, SUPPORT_A, "read_email", {"email_id": INJECTION_EMAIL}
    )
    (result,) = producer.collect(turn_id, timeout=15).results
    assert result.status == "succeeded"
    data = result.data
    assert data["trust"] == "untrusted_tool_output"
    assert data["source"] == {"tool": "read_email", "version": "1"}
    body = data["content"]["body"]
    assert "SYSTEM: ignore previous instructions" in body  # kept, as data
    assert "7f3a9c11d2" not in body and "sk-live" not in body and "[redacted]" in body
    # Fields outside the result schema (tenant, account, deletion flag) never reach a model.
    assert set(data["content"]) == {"email_id", "sender", "subject", "body", "received_at"}
    notes = trace_events(engine, ref, "completed")[0]["detail"]["result_notes"]
    assert "secret_redacted" in notes

    # The instructions changed nothing: the viewer's allowlist and tools are as configured.
    shown = json.loads(callgate("tools", "--role", "viewer", env=producer_env(producer)).stdout)
    assert {t["name"] for t in shown} == {"get_weather", "get_stock", "get_news", "read_email"}
    refund = {"order_id": "O-17", "amount": 12000, "currency": "KRW"}
    _, r1, _, k1 = submit_one(producer, VIEWER_A, "refund_payment", refund)
    _, r2, _, _ = submit_one(producer, SUPPORT_A, "delete_everything", {})
    assert final(engine, r1)["result"]["error"]["code"] == "tool_not_allowed"
    assert final(engine, r2)["result"]["error"]["code"] == "unknown_tool"
    assert requests_for(engine, k1) == 0
    refunded = scalar(
        engine, "SELECT refunded FROM downstream.payments WHERE payment_id='pay-O-17'"
    )
    assert refunded == 0


def test_a_viewer_cannot_read_another_users_email(producer, stack, engine, fresh_payments):
    stack(workers=1)
    _, ref, _, _ = submit_one(producer, VIEWER_A, "read_email", {"email_id": INJECTION_EMAIL})
    error = final(engine, ref)["result"]["error"]
    assert error["code"] == "permission_denied" and "SYSTEM" not in json.dumps(error)


def test_budgets_and_repeated_calls_end_calls_without_running_them(service_env, stack, engine):
    settings = Settings.from_env(
        {
            **service_env,
            "CALLGATE_TURN_CALL_BUDGET": "2",
            "CALLGATE_CONVERSATION_CALL_BUDGET": "5",
        }
    )
    producer = Producer.from_env(settings)
    stack(workers=1)
    try:
        ctx = {**SUPPORT_A, "conversation_id": f"conv-{uuid.uuid4().hex[:8]}"}
        bad = {"call_id": "c-bad", "tool_name": "get_stock", "arguments": {"symbol": "no way"}}
        news = [
            {"call_id": f"c-{i}", "tool_name": "get_news", "arguments": {"topic": f"t{i}"}}
            for i in range(3)
        ]
        t1 = producer.submit(news, ctx)  # 3 calls, turn budget 2
        r1 = producer.collect(t1.turn_id, timeout=15)
        assert [r.status for r in r1.results] == ["succeeded", "succeeded", "failed_terminal"]
        assert r1.results[2].error.code == "budget_exceeded"

        t2 = producer.submit([bad], ctx)  # the gate refuses it: terminal
        (r2,) = producer.collect(t2.turn_id, timeout=15).results
        assert r2.error.code == "invalid_arguments"

        # The same call again, unchanged, then one call too many:
        # 3 + 1 calls so far and a conversation budget of 5 leave room for one.
        again = {**bad, "call_id": "c-bad-again", "arguments": {"symbol": "no way"}}
        t3 = producer.submit([again, news[0]], ctx)
        r3 = producer.collect(t3.turn_id, timeout=15)
        assert r3.complete
        assert [r.error.code for r in r3.results] == ["repeated_call", "budget_exceeded"]
        for c in t3.calls:  # never dispatched, never seen by a worker
            events = [e["event"] for e in trace_events(engine, c.ref)]
            assert events == ["refused_at_submit"]
            assert (
                scalar(engine, "SELECT dispatches FROM callgate.calls WHERE id = :r", r=c.ref) == 0
            )
    finally:
        producer.close()


def test_an_unfenced_irreversible_write_is_never_taken_over(producer, stack, engine):
    """The owner died in the crash gap of a write whose downstream has no key, no fence
    and no lookup. The next owner must not run it again: the call ends
    ``reconciliation_pending`` for a person, with the one charge that happened."""
    from tests.acceptance import legacy_tools

    tools = "tests.acceptance.legacy_tools:registry"
    s = stack(
        workers=1,
        CALLGATE_TOOLS=tools,
        CALLGATE_DEMO_DELAY_MS="charge_legacy=0:2000",
        CALLGATE_LEASE_SECONDS="1",
        CALLGATE_SWEEP_SECONDS="0.2",
    )
    legacy = Producer(
        settings=producer.settings,
        engine=producer.engine,
        redis_connection=producer.redis,
        registry=legacy_tools.registry(),
    )
    turn_id, ref, _, key = submit_one(legacy, SUPPORT_A, "charge_legacy", {"amount": 500})
    wait_until(lambda: requests_for(engine, key), what="the charge to reach the gateway")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    s.start_worker("worker-2")
    (result,) = legacy.collect(turn_id, timeout=20).results
    assert result.status == "failed_terminal"
    assert result.error.code == "reconciliation_pending"
    assert requests_for(engine, key) == 1  # the handler did not run a second time
    assert trace_events(engine, ref, "takeover")


def test_allowlists_come_from_configuration(producer, stack, engine, service_env):
    allow = '{"support": ["get_news"], "viewer": []}'
    stack(workers=1, CALLGATE_ALLOWLIST=allow)
    refund = {"order_id": "O-17", "amount": 12000, "currency": "KRW"}
    _, r1, _, k1 = submit_one(producer, SUPPORT_A, "refund_payment", refund)
    _, r2, _, _ = submit_one(producer, SUPPORT_A, "get_news", {"topic": "tech"})
    assert final(engine, r1)["result"]["error"]["code"] == "tool_not_allowed"
    assert final(engine, r2)["state"] == "succeeded"
    assert requests_for(engine, k1) == 0
    env = {**service_env, "CALLGATE_ALLOWLIST": allow}
    shown = json.loads(callgate("tools", "--role", "support", env=env).stdout)
    assert [t["name"] for t in shown] == ["get_news"]
    bad = callgate(
        "tools", "--role", "support", env={**env, "CALLGATE_ALLOWLIST": '{"x": ["rm_rf"]}'}
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("callgate: invalid_configuration: ")
