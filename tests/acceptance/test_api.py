"""The HTTP API with real worker, relayer and sweeper processes and a real ``callgate api``.

- The principal of a request is its key's: a body naming another tenant or user changes
  nothing (the turn is recorded for the key's principal, the gate judges it as such, the
  other tenant's order is refused and its payments provider sees nothing).
- Four eyes over HTTP: the requester's key cannot approve (or deny) its own request, even
  with the approver role; another approver of the tenant can, and the refund runs once.
- A revoked key is refused from the next request on; a key over its rate gets 429.
- Idempotency-Key: a repeat gets the first answer, and one turn is recorded.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from tests.acceptance.api_server import ApiServer, api, engine, env, make_key, running
from tests.acceptance.conftest import (
    REFUND_O17,
    callgate,
    effects_for,
    requests_for,
    scalar,
    wait_until,
)

__all__ = ["api", "engine", "env", "running"]  # fixtures, for pytest


def _results(server: ApiServer, key: str, turn_id: str, *, until: str) -> dict[str, Any]:
    """Long-poll the turn's results until every call has one (``complete``) or waits for
    an approval (``parked``)."""
    with server.client(key) as http:
        for _ in range(12):
            resp = http.get(f"/v1/turns/{turn_id}/results", params={"wait": 10})
            assert resp.status_code == 200, resp.text
            doc: dict[str, Any] = resp.json()
            if until == "complete" and doc["complete"]:
                return doc
            if until == "parked" and doc["awaiting_approval"]:
                return doc
    raise AssertionError(f"turn {turn_id} never became {until}: {doc}")


def _refund_turn(server: ApiServer, key: str, body: Any, **params: str) -> dict[str, Any]:
    with server.client(key) as http:
        resp = http.post("/v1/turns", json=body, params=params)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _key_of_call(engine: Engine, turn_id: str) -> str:
    return str(
        scalar(
            engine,
            "SELECT o.idempotency_key FROM callgate.calls c"
            " JOIN callgate.operations o USING (operation_id) WHERE c.turn_id = :t",
            t=turn_id,
        )
    )


def test_the_key_decides_the_principal_not_the_body(running, env, engine):
    b = make_key(env, "tenant-b", "user-42", "support")["key"]
    # An OpenAI chat completion asking to refund tenant-a's order, wrapped in fields that
    # name tenant-a's user: the API reads none of them.
    response = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "tenant_id": "tenant-a",
        "user_id": "user-17",
        "roles": ["support", "approver"],
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": "refund_payment",
                                "arguments": '{"order_id": "O-17", "amount": 500, '
                                '"currency": "KRW"}',
                            },
                        }
                    ],
                },
            }
        ],
    }
    turn = _refund_turn(running, b, response, provider="openai-chat")
    doc = _results(running, b, turn["turn_id"], until="complete")
    (result,) = doc["results"]
    assert result["error"]["code"] == "permission_denied", result
    owner = scalar(
        engine,
        "SELECT tenant_id || '/' || user_id FROM callgate.turns WHERE turn_id = :t",
        t=turn["turn_id"],
    )
    assert owner == "tenant-b/user-42"
    key = _key_of_call(engine, turn["turn_id"])
    assert requests_for(engine, key) == 0 and effects_for(engine, key) == 0

    # tenant-a's key sees nothing of tenant-b's turn: not its results, not its trace.
    a = make_key(env, "tenant-a", "user-17", "support")["key"]
    with running.client(a) as http:
        resp = http.get(f"/v1/turns/{turn['turn_id']}/results")
        assert (resp.status_code, resp.json()["code"]) == (404, "unknown_turn")
        resp = http.get(f"/v1/calls/{turn['turn_id']}/trace")
        assert (resp.status_code, resp.json()["code"]) == (404, "unknown_turn")
    with running.client(b) as http:
        resp = http.get(f"/v1/calls/{turn['turn_id']}/trace")
        assert resp.status_code == 200
        assert "permission_denied" in resp.text
        assert {event["turn_id"] for event in resp.json()} == {turn["turn_id"]}


def test_the_requester_cannot_approve_their_own_request(running, env, engine):
    requester = make_key(env, "tenant-a", "user-17", "support", "approver")["key"]
    colleague = make_key(env, "tenant-a", "user-5", "approver")["key"]
    outsider = make_key(env, "tenant-b", "user-42", "approver")["key"]
    proposals = [{"call_id": "c1", "tool_name": "refund_payment", "arguments": REFUND_O17}]
    turn = _refund_turn(running, requester, proposals)
    parked = _results(running, requester, turn["turn_id"], until="parked")
    approval_id = parked["awaiting_approval"]["c1"]
    key = _key_of_call(engine, turn["turn_id"])

    with running.client(requester) as http:
        for verdict in ("approve", "deny"):
            resp = http.post(f"/v1/approvals/{approval_id}/{verdict}")
            assert resp.status_code == 403, resp.text
            assert resp.headers["content-type"] == "application/problem+json"
            assert resp.json()["code"] == "approval_forbidden"
    with running.client(outsider) as http:  # another tenant's approver: as if it did not exist
        resp = http.post(f"/v1/approvals/{approval_id}/approve")
        assert (resp.status_code, resp.json()["code"]) == (404, "unknown_approval")
    assert requests_for(engine, key) == 0

    with running.client(colleague) as http:
        shown = http.get(f"/v1/approvals/{approval_id}").json()
        assert shown["impact"]["amount"] == 12000 and shown["impact"]["currency"] == "KRW"
        assert shown["requested_by"] == "user-17" and shown["state"] == "pending"
        resp = http.post(f"/v1/approvals/{approval_id}/approve")
        assert resp.status_code == 200, resp.text
        assert resp.json() == {
            "approval_id": approval_id,
            "state": "approved",
            "decided_by": "user-5",
            "calls": 1,
        }
    (result,) = _results(running, requester, turn["turn_id"], until="complete")["results"]
    assert result["status"] == "succeeded", result
    assert requests_for(engine, key) == 1 and effects_for(engine, key) == 1
    with running.client(requester) as http:  # the provider's own result format
        resp = http.get(
            f"/v1/turns/{turn['turn_id']}/results", params={"provider": "anthropic-messages"}
        )
        assert resp.status_code == 200, resp.text
        message = resp.json()
        assert message["role"] == "user"
        assert [b["tool_use_id"] for b in message["content"]] == ["c1"]
    with running.client(colleague) as http:  # decided: nothing more to decide
        resp = http.post(f"/v1/approvals/{approval_id}/deny")
        assert (resp.status_code, resp.json()["code"]) == (409, "approval_not_pending")


def test_a_revoked_key_is_refused(running, env):
    made = make_key(env, "tenant-a", "user-17", "support")
    viewer = make_key(env, "tenant-a", "user-5", "viewer")["key"]
    with running.client(viewer) as http:  # the tools of the key's roles, never more
        names = {t["name"] for t in http.get("/v1/tools").json()}
        assert "get_weather" in names and "refund_payment" not in names
    with running.client(made["key"]) as http:
        tools = http.get("/v1/tools", params={"provider": "openai-chat"})
        assert tools.status_code == 200
        assert "refund_payment" in {t["function"]["name"] for t in tools.json()}
        proc = callgate("keys", "revoke", made["key_id"], env=env)
        assert proc.returncode == 0, proc.stderr
        resp = http.get("/v1/tools")
        assert resp.status_code == 401
        assert resp.json()["code"] == "unauthenticated"
    again = callgate("keys", "revoke", made["key_id"], env=env)
    assert again.returncode == 2 and "unknown_api_key" in again.stderr
    # A key whose secret is wrong, for a key id that exists, answers the same.
    forged = made["key"].rsplit(".", 1)[0] + ".x" + uuid.uuid4().hex
    with running.client(forged) as http:
        assert http.get("/v1/tools").json()["code"] == "unauthenticated"


def test_a_key_over_its_rate_gets_429(running, env):
    slow = make_key(env, "tenant-a", "user-17", "support", rate="0.05", burst="2")["key"]
    other = make_key(env, "tenant-a", "user-17", "support")["key"]
    with running.client(slow) as http:
        codes = [http.get("/v1/tools").status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        resp = http.get("/v1/tools")
        assert resp.status_code == 429 and resp.json()["code"] == "rate_limited"
        assert int(resp.headers["retry-after"]) >= 1
    with running.client(other) as http:  # a bucket per key
        assert http.get("/v1/tools").status_code == 200


def test_an_idempotency_key_records_one_turn(running, env, engine):
    key = make_key(env, "tenant-a", "user-17", "support")["key"]
    body = [{"call_id": "w1", "tool_name": "get_weather", "arguments": {"city": "Seoul"}}]
    with running.client(key) as http:
        first = http.post("/v1/turns", json=body, headers={"Idempotency-Key": "req-1"}).json()
        again = http.post("/v1/turns", json=body, headers={"Idempotency-Key": "req-1"}).json()
        assert first == again
        other = [{**body[0], "arguments": {"city": "Busan"}}]
        resp = http.post("/v1/turns", json=other, headers={"Idempotency-Key": "req-1"})
        assert (resp.status_code, resp.json()["code"]) == (409, "idempotency_conflict")
    assert scalar(engine, "SELECT count(*) FROM callgate.turns") == 1


def test_the_start_line_shows_at_the_default_level(
    api: Callable[[dict[str, str]], ApiServer], env: dict[str, str]
) -> None:
    """A person starting `callgate api` sees where it listens, and whether it traces, without
    raising the log level (as the worker, relayer and sweeper do)."""
    quiet = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    server = api({**quiet, "CALLGATE_LOG_LEVEL": "WARNING"})
    line = wait_until(
        lambda: next((x for x in server.stderr().splitlines() if "api listening on" in x), None),
        what="the api's start line",
    )
    assert "tracing off" in line, line
