"""`callgate trace CALL_ID`: a provider's call id may recur across turns; the trace names each
event's turn and keeps each turn's calls apart."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from callgate.core.types import CallContext, ProposedCall
from callgate.ops.cli.turns import trace_cmd
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.store import audit, db, reservations, turns

CTX = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))


@pytest.fixture
def own(make_own_database: Callable[[], str]) -> Iterator[tuple[Engine, str]]:
    url = make_own_database()
    engine = db.create(url, pool_size=2)
    yield engine, url
    engine.dispose()


def _turn(engine: Engine, call_id: str, tool: str) -> uuid.UUID:
    """A recorded turn whose one call a worker reserved (its first trace event)."""
    args = {"order_id": "o-1"} if tool == "get_order" else {"to": "a@b.c", "template": "t"}
    proposed = ProposedCall(call_id=call_id, tool_name=tool, arguments=args)
    (planned,) = plan([proposed], CTX, demo_registry())
    turn_id, (recorded,) = turns.record(engine, CTX, [planned])
    got = reservations.reserve(
        engine,
        operation_id=recorded.operation_id,
        call_ref=recorded.ref,
        turn_id=turn_id,
        owner_token=uuid.uuid4(),
        intent_hash="intent-1",
        lease_seconds=30,
    )
    assert isinstance(got, reservations.Reserved)
    return turn_id


def test_a_reused_call_id_is_traced_per_turn(own: tuple[Engine, str]) -> None:
    engine, url = own
    call_id = f"call_{uuid.uuid4().hex[:6]}"
    first = _turn(engine, call_id, "get_order")
    second = _turn(engine, call_id, "send_email")

    events = audit.events(engine, call_id)
    by_turn = {str(t): [e for e in events if e["turn_id"] == str(t)] for t in (first, second)}
    assert all(by_turn.values()) and sum(map(len, by_turn.values())) == len(events)
    assert {e["tool_name"] for e in by_turn[str(first)]} == {"get_order"}
    assert {e["tool_name"] for e in by_turn[str(second)]} == {"send_email"}

    runner = CliRunner()
    env = {"CALLGATE_DATABASE_URL": url}
    as_json = runner.invoke(trace_cmd, [call_id, "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    assert {e["turn_id"] for e in json.loads(as_json.output)} == {str(first), str(second)}

    shown = runner.invoke(trace_cmd, [call_id], env=env)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("turn ")]
    assert [lines[i] for i in headers] == [f"turn {first}", f"turn {second}"]
    # Each section holds only its own turn's call: the first's tool never under the second.
    first_section = "\n".join(lines[headers[0] : headers[1]])
    second_section = "\n".join(lines[headers[1] :])
    assert "get_order" in first_section and "send_email" not in first_section
    assert "send_email" in second_section and "get_order" not in second_section
