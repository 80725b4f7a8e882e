"""``callgate submit`` and ``POST /v1/turns`` (without an Idempotency-Key) when the COMMIT
reply of the turn is lost and PostgreSQL stays unreachable past the producer's reconnect
budget: each says the outcome is unknown and names the key to repeat with, and the repeat
returns the turn that was recorded, once. Real processes, PostgreSQL behind the Postgres fault
proxy (tests/faults/pgproxy.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import text

from callgate.store import db
from tests.acceptance.api_server import ApiServer, api, engine, env, make_key
from tests.acceptance.conftest import SUPPORT_A, callgate
from tests.faults.pgproxy import PgProxy, commit_fault

__all__ = ["api", "engine", "env"]  # fixtures, for pytest

TURN_INSERT = r"INSERT INTO callgate\.turns"


def _lose_the_turns_commit(proxy: PgProxy) -> object:
    """The turn's COMMIT runs, its reply is lost, and PostgreSQL turns every connection away
    from then on, past the producer's reconnect budget (``proxy.open()`` ends that)."""
    return proxy.arm(commit_fault(after=TURN_INSERT, refuse_after=3600))


def _email(call_id: str) -> list[dict[str, object]]:
    return [
        {
            "call_id": call_id,
            "tool_name": "send_email",
            "arguments": {"to": "kim@example.com", "template": "receipt"},
        }
    ]


def _turns_with_call(url: str, call_id: str) -> list[str]:
    engine = db.create(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT DISTINCT turn_id FROM callgate.calls WHERE call_id = :c"),
                {"c": call_id},
            ).all()
    finally:
        engine.dispose()
    return [str(r.turn_id) for r in rows]


def test_cli_submit_names_the_key_to_repeat_with(
    pg_proxy: PgProxy, env: dict[str, str], tmp_path: Path
) -> None:
    url = env["CALLGATE_DATABASE_URL"]
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    (tmp_path / "ctx.json").write_text(json.dumps(SUPPORT_A))
    (tmp_path / "calls.json").write_text(json.dumps(_email(call_id)))
    args = ["submit", "--context", str(tmp_path / "ctx.json"), str(tmp_path / "calls.json")]
    fault = _lose_the_turns_commit(pg_proxy)

    lost = callgate(*args, "--json", env={**env, "CALLGATE_DATABASE_URL": pg_proxy.url(url)})

    assert pg_proxy.fired == [fault]
    assert lost.returncode == 2, lost.stderr
    assert "outcome unknown" in lost.stderr and "nothing was recorded" not in lost.stderr
    assert "Traceback" not in lost.stderr
    key = lost.stderr.split("--submit-key ", 1)[1].split(":", 1)[0].strip()
    recorded = _turns_with_call(url, call_id)
    assert len(recorded) == 1

    again = callgate(*args, "--json", "--submit-key", key, env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["turn_id"] == recorded[0]
    assert _turns_with_call(url, call_id) == recorded


def test_api_without_idempotency_key_names_the_key_to_repeat_with(
    api: Callable[[dict[str, str]], ApiServer], pg_proxy: PgProxy, env: dict[str, str]
) -> None:
    url = env["CALLGATE_DATABASE_URL"]
    key = make_key(env, "tenant-a", "user-17", "support")["key"]
    server = api({**env, "CALLGATE_DATABASE_URL": pg_proxy.url(url)})
    call_id = f"mail-{uuid.uuid4().hex[:8]}"
    fault = _lose_the_turns_commit(pg_proxy)

    with server.client(key) as client:
        lost = client.post("/v1/turns", json=_email(call_id))
        assert pg_proxy.fired == [fault]
        assert lost.status_code == 503, lost.text
        problem = lost.json()
        assert "outcome unknown" in problem["detail"]
        (outcome,) = [d for d in problem["details"] if d.get("code") == "submit_outcome"]
        assert outcome["recorded"] is None
        recorded = _turns_with_call(url, call_id)
        assert len(recorded) == 1

        pg_proxy.open()  # PostgreSQL is reachable again
        again = client.post(
            "/v1/turns",
            json=_email(call_id),
            headers={"Idempotency-Key": outcome["idempotency_key"]},
        )
    assert again.status_code == 200, again.text
    assert again.json()["turn_id"] == recorded[0]
    assert _turns_with_call(url, call_id) == recorded
