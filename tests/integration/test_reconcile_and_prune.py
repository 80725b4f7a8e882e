"""Manual reconciliation and retention against real Postgres (each test on its own database:
pruning is database-wide)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from callgate.core.errors import ErrorCode, InputError, ReconciliationError
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.store import api_keys, completions, db, reconciliation, reservations, retention, turns

CTX = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))
OTHER = CallContext(request_id="r", tenant_id="tenant-b", user_id="user-42", roles=("support",))
DOUBT = {"code": "reconciliation_pending", "details": [{"message": "worker died after sending"}]}


@pytest.fixture
def own(make_own_database: Callable[[], str]) -> Iterator[Engine]:
    engine = db.create(make_own_database(), pool_size=4)
    yield engine
    engine.dispose()


def _rows(engine: Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), params).all())


def _value(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def _record(engine: Engine, ctx: CallContext = CTX, op: str | None = None) -> turns.PlannedCall:
    call = ProposedCall(
        call_id=f"c-{uuid.uuid4().hex[:6]}",
        tool_name="send_email",
        arguments={"to": "a@b.c", "template": "t"},
    )
    ops = {call.call_id: op} if op else None
    (planned,) = plan([call], ctx, demo_registry(), ops)
    turns.record(engine, ctx, [planned])
    return planned


def _reserve(engine: Engine, p: turns.PlannedCall, lease: float) -> reservations.Lease:
    turn_id = _value(engine, "SELECT turn_id FROM callgate.calls WHERE id = :r", r=p.ref)
    owner = uuid.uuid4()
    got = reservations.reserve(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=turn_id,
        owner_token=owner,
        intent_hash="intent-1",
        lease_seconds=lease,
    )
    assert isinstance(got, reservations.Reserved)
    return reservations.Lease(p.operation_id, owner, got.generation, "intent-1")


def _in_doubt(engine: Engine, ctx: CallContext = CTX) -> turns.PlannedCall:
    """A write whose worker died in the crash gap: its lease expired, and the operation is
    concluded ``reconciliation_pending``, as the executor does for a write with no key and
    no status lookup."""
    p = _record(engine, ctx)
    lease = _reserve(engine, p, lease=0.05)
    time.sleep(0.1)
    with db.autocommit(engine) as conn:
        ended = reservations.conclude(
            conn,
            operation_id=p.operation_id,
            generation=lease.generation,
            error=DOUBT,
            event="reconciliation_pending",
        )
    assert ended.won and ended.finished == 1
    return p


def _finish(engine: Engine, p: turns.PlannedCall) -> None:
    lease = _reserve(engine, p, lease=30)
    done = completions.complete(engine, lease, status="succeeded", payload={"content": {}})
    assert done.won


# --- reconciliation ------------------------------------------------------------------------


def test_a_write_in_doubt_is_listed_per_tenant_and_shown_with_its_calls_and_trace(
    own: Engine,
) -> None:
    mine, theirs = _in_doubt(own), _in_doubt(own, OTHER)
    _finish(own, _record(own))  # a settled write is never listed

    listed = reconciliation.pending(own)
    assert {r["operation_id"] for r in listed} == {mine.operation_id, theirs.operation_id}
    (only,) = reconciliation.pending(own, tenant="tenant-a")
    assert only["operation_id"] == mine.operation_id
    assert only["tool_name"] == "send_email" and only["calls"] == 1
    assert only["idempotency_key"] and only["age_seconds"] >= 0

    shown = reconciliation.show(own, mine.operation_id)
    (call,) = shown["calls"]
    assert (call["state"], call["code"]) == ("failed_terminal", "reconciliation_pending")
    assert [e["event"] for e in shown["trace"]][-1] == "reconciliation_pending"
    assert "arguments" not in shown and "owner_token" not in shown


def test_resolve_settles_the_operation_once_with_an_audit_event_and_keeps_the_calls_result(
    own: Engine,
) -> None:
    p = _in_doubt(own)
    call_result = _value(own, "SELECT result FROM callgate.calls WHERE id = :r", r=p.ref)

    settled = reconciliation.resolve(
        own, p.operation_id, outcome="succeeded", by="ops-anna", note="seen in the mail log"
    )
    assert (settled.outcome, settled.by, settled.generation) == ("succeeded", "ops-anna", 1)

    op = _rows(
        own,
        "SELECT state, result FROM callgate.operations WHERE operation_id = :o",
        o=p.operation_id,
    )[0]
    assert op.state == "succeeded"
    assert op.result["data"]["content"] == {
        "reconciled": True,
        "outcome": "succeeded",
        "by": "ops-anna",
        "note": "seen in the mail log",
    }
    audit = _rows(
        own,
        "SELECT detail FROM callgate.trace_events WHERE operation_id = :o AND event = 'reconciled'",
        o=p.operation_id,
    )
    assert [a.detail["by"] for a in audit] == ["ops-anna"]
    # The call keeps the one terminal result fan-in already has: no second one is published.
    assert _value(own, "SELECT result FROM callgate.calls WHERE id = :r", r=p.ref) == call_result
    assert _value(own, "SELECT count(*) FROM callgate.outbox WHERE call_ref = :r", r=p.ref) == 1
    assert reconciliation.pending(own) == []

    with pytest.raises(ReconciliationError) as again:
        reconciliation.resolve(own, p.operation_id, outcome="failed", by="ops-ben")
    assert again.value.code == ErrorCode.NOT_AWAITING_RECONCILIATION
    assert "succeeded" in again.value.message


def test_a_retry_of_the_settled_write_reuses_the_persons_outcome(own: Engine) -> None:
    p = _in_doubt(own)
    reconciliation.resolve(own, p.operation_id, outcome="failed", by="ops-anna")
    retry = _record(own, op=p.operation_id)  # the same logical write, in a new turn
    reused = reservations.reuse(own, call_ref=retry.ref, intent_hash="intent-1")
    assert reused.finished == 1
    result = _value(own, "SELECT result FROM callgate.calls WHERE id = :r", r=retry.ref)
    assert result["status"] == "failed_terminal"
    assert result["error"]["code"] == ErrorCode.EXECUTION_FAILED
    assert "ops-anna found that the write did not apply" in str(result["error"]["details"])


def test_two_people_settling_at_once_record_exactly_one_outcome(own: Engine) -> None:
    p = _in_doubt(own)
    barrier = threading.Barrier(6)
    won: list[str] = []
    refused: list[ErrorCode] = []

    def settle(i: int) -> None:
        barrier.wait()
        try:
            won.append(
                reconciliation.resolve(
                    own, p.operation_id, outcome=("succeeded", "failed")[i % 2], by=f"p{i}"
                ).by
            )
        except ReconciliationError as exc:
            refused.append(exc.code)

    threads = [threading.Thread(target=settle, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and refused == [ErrorCode.NOT_AWAITING_RECONCILIATION] * 5
    events = _value(
        own,
        "SELECT count(*) FROM callgate.trace_events"
        " WHERE operation_id = :o AND event = 'reconciled'",
        o=p.operation_id,
    )
    assert events == 1


def test_bad_requests_are_refused_with_their_codes_and_change_nothing(own: Engine) -> None:
    p = _in_doubt(own)
    with pytest.raises(ReconciliationError) as unknown:
        reconciliation.resolve(own, "op-nope", outcome="succeeded", by="ops-anna")
    assert unknown.value.code == ErrorCode.UNKNOWN_OPERATION
    with pytest.raises(ReconciliationError):
        reconciliation.show(own, "op-nope")
    with pytest.raises(InputError):
        reconciliation.resolve(own, p.operation_id, outcome="maybe", by="ops-anna")
    with pytest.raises(InputError):
        reconciliation.resolve(own, p.operation_id, outcome="succeeded", by="  ")
    assert [r["operation_id"] for r in reconciliation.pending(own)] == [p.operation_id]


# --- retention -----------------------------------------------------------------------------


def _age(engine: Engine, p: turns.PlannedCall, days: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE callgate.turns SET created_at = now() - make_interval(days => :d)"
                " WHERE turn_id = (SELECT turn_id FROM callgate.calls WHERE id = :r)"
            ),
            {"d": days, "r": p.ref},
        )


def _publish_all(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE callgate.outbox SET published_at = now()"))


def _counts(engine: Engine) -> dict[str, int]:
    tables = ("turns", "calls", "outbox", "trace_events", "operations")
    return {t: _value(engine, f"SELECT count(*) FROM callgate.{t}") for t in tables}


def test_prune_removes_only_old_finished_published_turns(own: Engine) -> None:
    old_done, new_done, old_open, old_unpublished = (_record(own) for _ in range(4))
    _finish(own, old_done)
    _finish(own, new_done)
    _publish_all(own)
    _finish(own, old_unpublished)  # its outbox row is not published yet
    for p in (old_done, old_open, old_unpublished):
        _age(own, p, days=3)
    before = _counts(own)
    events = _value(
        own, "SELECT count(*) FROM callgate.trace_events WHERE call_ref = :r", r=old_done.ref
    )

    would = retention.prune(own, older_than=86_400, dry_run=True)
    assert (would.turns, would.calls) == (1, 1) and _counts(own) == before

    pruned = retention.prune(own, older_than=86_400, batch=1)
    assert (pruned.turns, pruned.calls, pruned.outbox, pruned.operations) == (1, 1, 1, 1)
    assert pruned.trace_events == events > 0
    after = _counts(own)
    assert {t: before[t] - after[t] for t in before} == {
        "turns": 1,
        "calls": 1,
        "outbox": 1,
        "trace_events": events,
        "operations": 1,
    }
    left = {r.id: r.state for r in _rows(own, "SELECT id, state FROM callgate.calls")}
    assert old_done.ref not in left
    assert left[old_open.ref] == "proposed" and left[old_unpublished.ref] == "succeeded"
    assert left[new_done.ref] == "succeeded"


def test_prune_keeps_a_write_awaiting_reconciliation_and_an_operation_still_in_use(
    own: Engine,
) -> None:
    doubt = _in_doubt(own)
    first = _record(own)
    _finish(own, first)
    retry = _record(own, op=first.operation_id)  # a new turn reuses the first's operation
    _publish_all(own)
    for p in (doubt, first):
        _age(own, p, days=3)

    pruned = retention.prune(own, older_than=86_400)
    assert (pruned.turns, pruned.operations) == (2, 0)
    ops = {r.operation_id for r in _rows(own, "SELECT operation_id FROM callgate.operations")}
    assert {doubt.operation_id, first.operation_id} <= ops
    assert [r["operation_id"] for r in reconciliation.pending(own)] == [doubt.operation_id]
    assert _value(own, "SELECT state FROM callgate.calls WHERE id = :r", r=retry.ref) == "proposed"


def test_prune_removes_api_idempotency_answers_claimed_before_the_window(own: Engine) -> None:
    key = api_keys.create(own, tenant="tenant-a", user="user-17", roles=["support"])
    for idem, days in (("old-answered", 3), ("old-unanswered", 3), ("new", 0)):
        api_keys.claim(own, key.key_id, idem, "digest")
        if idem != "old-unanswered":
            api_keys.answer(own, key.key_id, idem, {"turn_id": None, "calls": []})
        with own.begin() as conn:
            conn.execute(
                text(
                    "UPDATE callgate.api_idempotency"
                    " SET claimed_at = now() - make_interval(days => :d)"
                    " WHERE idempotency_key = :i"
                ),
                {"d": days, "i": idem},
            )

    assert retention.prune(own, older_than=86_400, dry_run=True).api_idempotency == 2
    assert _value(own, "SELECT count(*) FROM callgate.api_idempotency") == 3

    assert retention.prune(own, older_than=86_400, batch=1).api_idempotency == 2
    left = [r.idempotency_key for r in _rows(own, "SELECT * FROM callgate.api_idempotency")]
    assert left == ["new"]


@pytest.mark.parametrize(("text_", "seconds"), [("90s", 90), ("30m", 1800), ("7d", 604_800)])
def test_durations_parse(text_: str, seconds: float) -> None:
    assert retention.parse_duration(text_) == seconds


@pytest.mark.parametrize("bad", ["", "7", "-1d", "0h", "1y", "1.5.2d", "inf"])
def test_bad_durations_are_refused(bad: str) -> None:
    with pytest.raises(InputError):
        retention.parse_duration(bad)
