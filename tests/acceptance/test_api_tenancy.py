"""What a real ``callgate api`` tells one principal about another's turns and operations.

- A turn a failover lost is answered ``410 turn_lost`` to the principal it was submitted for
  (its tenant and user are kept with the lost turn), and to anyone else, of its tenant or
  another, exactly as an id that was never a turn: ``404 unknown_turn``.
- An operation id the application names that another tenant already holds is answered as an
  id no one holds: the turn is recorded and its call runs as a new operation of this tenant.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import redis
from sqlalchemy import Engine, text

from callgate.daemons import failover
from callgate.store import api_keys, histories
from tests.acceptance.api_server import ApiServer, api, engine, env

__all__ = ["api", "engine", "env"]  # fixtures, for pytest

WEATHER = [{"call_id": "w1", "tool_name": "get_weather", "arguments": {"city": "Seoul"}}]


def _keys(engine: Engine, *principals: tuple[str, str]) -> list[str]:
    return [
        api_keys.create(engine, tenant=tenant, user=user, roles=["support"]).key
        for tenant, user in principals
    ]


def _submit(http: httpx.Client, proposals: list[dict[str, Any]]) -> dict[str, Any]:
    resp = http.post("/v1/turns", json=proposals)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def _lose(engine: Engine, env: dict[str, str], turn_id: str) -> None:
    """What a failover to a replica that lacked the turn leaves: no row of it in PostgreSQL,
    Redis remembering its submit, and the reconciliation recording it lost (as epoch 0's)."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM callgate.calls WHERE turn_id = :t"), {"t": turn_id})
        conn.execute(text("DELETE FROM callgate.turns WHERE turn_id = :t"), {"t": turn_id})
    connection = redis.Redis.from_url(env["CALLGATE_REDIS_URL"])
    try:
        remembered = failover.remembered(connection, env["CALLGATE_QUEUE"])
    finally:
        connection.close()
    assert histories.record_lost(engine, 0, remembered) == 1


def _unknown_alike(resp: httpx.Response, turn_id: str, unknown: httpx.Response) -> None:
    """``resp`` is the answer to an id that was never a turn, but for the id itself."""
    other = str(unknown.json()["detail"]).rsplit(" ", 1)[-1]
    assert resp.status_code == unknown.status_code == 404, resp.text
    assert resp.json() == {
        **unknown.json(),
        "detail": unknown.json()["detail"].replace(other, turn_id),
    }, resp.text


def test_the_owner_of_a_lost_turn_is_told_it_is_lost_and_no_one_else(
    env: dict[str, str], engine: Engine, api: Callable[[dict[str, str]], ApiServer]
) -> None:
    server = api(env)
    owner, colleague, stranger = _keys(
        engine, ("tenant-a", "user-17"), ("tenant-a", "user-18"), ("tenant-b", "user-42")
    )
    with server.client(owner) as http:
        turn_id = str(_submit(http, WEATHER)["turn_id"])
    _lose(engine, env, turn_id)

    with server.client(owner) as http:
        for wait in (0, 1):
            lost = http.get(f"/v1/turns/{turn_id}/results", params={"wait": wait})
            assert lost.status_code == 410, lost.text
            assert lost.headers["content-type"] == "application/problem+json"
            assert lost.json()["code"] == "turn_lost" and turn_id in lost.json()["detail"]
    for key in (colleague, stranger):
        with server.client(key) as http:
            unknown = http.get(f"/v1/turns/{uuid.uuid4()}/results")
            for wait in (0, 1):
                resp = http.get(f"/v1/turns/{turn_id}/results", params={"wait": wait})
                _unknown_alike(resp, turn_id, unknown)


def _weather(operation_id: str) -> list[dict[str, Any]]:
    return [
        {
            "call_id": "w1",
            "tool_name": "get_weather",
            "arguments": {"city": "Seoul"},
            "operation_id": operation_id,
        }
    ]


def _operations(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT tenant_id, count(*) FROM callgate.operations GROUP BY tenant_id")
        ).all()
    return {str(r[0]): int(r[1]) for r in rows}


def test_an_operation_id_another_tenant_holds_is_answered_as_an_unknown_one(
    env: dict[str, str], engine: Engine, api: Callable[[dict[str, str]], ApiServer]
) -> None:
    server = api(env)
    a, b = _keys(engine, ("tenant-a", "user-17"), ("tenant-b", "user-42"))
    with server.client(a) as http:
        _submit(http, _weather("weather-seoul"))
    with server.client(b) as http:
        fresh = f"weather-{uuid.uuid4().hex}"
        for op in ("weather-seoul", fresh):  # held by tenant-a; held by no one
            answer = _submit(http, _weather(op))
            assert answer["calls"] == [
                {"call_id": "w1", "tool_name": "get_weather", "operation_id": op}
            ], answer
    assert _operations(engine) == {"tenant-a": 1, "tenant-b": 2}
    with server.client(a) as http:  # a tenant's own reuse still names its one operation
        answer = _submit(http, _weather("weather-seoul"))
        assert answer["calls"][0]["operation_id"] == "weather-seoul", answer
    assert _operations(engine) == {"tenant-a": 1, "tenant-b": 2}
