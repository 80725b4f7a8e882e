"""``callgate demo``: the worked examples, end to end, with their invariants checked.

1. Three reads (120/280/200 ms) in one turn run at once (their intervals overlap in the
   trace) and are joined by id whatever order they complete in.
2. The 12,000 KRW refund of order O-17 runs once.
3. The same refund delivered twice (a duplicate job, then a new turn with the same
   operation id) changes nothing downstream and reuses the first result.
4. Deleting last week's 50 policy e-mails: parked until a person approves the impact the
   server computed (50 e-mails of user-17), then exactly those 50 change, once each.
5. Refusals: a viewer proposing a refund, and a refund of another tenant's order, end with
   their codes; neither reaches the payments provider nor asks for an approval.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, TextIO

from sqlalchemy import Engine, text

from callgate.core.errors import ApprovalError, ErrorCode
from callgate.core.settings import Settings
from callgate.ops.lab.demo.tools import DEMO_TOOLS
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import approvals, audit

READ_DELAYS = "get_weather=120,get_stock=280,get_news=200"
READ_ATTEMPTS = 3
SUPPORT_A = {
    "request_id": "req-8",
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "roles": ["support"],
}


@dataclass
class Report:
    out: TextIO
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, name: str, ok: bool, evidence: str) -> None:
        self.checks.append((name, ok, evidence))
        self.out.write(f"  [{'ok' if ok else 'FAIL'}] {name}: {evidence}\n")

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


def run(settings: Settings, *, workers: int, out: TextIO) -> bool:
    env = {
        "CALLGATE_DATABASE_URL": settings.require_database(),
        "CALLGATE_REDIS_URL": settings.require_redis(),
        "CALLGATE_QUEUE": settings.queue,
        "CALLGATE_DEMO_DELAY_MS": READ_DELAYS,
        # The demo checks the demo tools' invariants: it names their registry itself, for
        # its workers and its producer, whatever the shell has configured.
        "CALLGATE_TOOLS": DEMO_TOOLS,
        "CALLGATE_ALLOWLIST": "",
    }
    report = Report(out)
    producer = Producer.from_env(settings.replace(tools=DEMO_TOOLS, allowlist=None))
    try:
        with Stack(env=env, workers=workers):
            wait_for_workers(settings.require_redis(), settings.queue, workers)
            out.write(f"callgate demo: {workers} workers, relayer and sweeper running\n\n")
            turns = [_parallel_reads(producer, report)]
            first = _refund(producer, report)
            turns.append(first["turn_id"])
            turns.append(_refund_again(producer, report, first))
            turns.append(_delete_with_approval(producer, report))
            turns.extend(_refusals(producer, report))
        out.write("\nper-call trace\n")
        for turn_id in turns:
            _print_trace(producer.engine, turn_id, out)
    finally:
        producer.close()
    passed = sum(ok for _, ok, _ in report.checks)
    out.write(f"\n{passed}/{len(report.checks)} invariants hold\n")
    return report.ok


def _parallel_reads(producer: Producer, report: Report) -> str:
    """The three reads in one turn. Concurrency is read from the trace (every read was
    executing at one moment), never from a wall-clock threshold; the elapsed time is printed
    as a figure. A loaded machine may delay a worker's pickup, so up to three turns are
    tried; a sequential executor would never overlap in any of them."""
    report.out.write("1. three independent reads: 120 / 280 / 200 ms\n")
    proposals = [
        {
            "call_id": "call-weather",
            "tool_name": "get_weather",
            "arguments": {"city": "Seoul", "unit": "celsius"},
        },
        {"call_id": "call-stock", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}},
        {"call_id": "call-news", "tool_name": "get_news", "arguments": {"topic": "tech"}},
    ]
    ids = [str(p["call_id"]) for p in proposals]
    for attempt in range(1, READ_ATTEMPTS + 1):
        started = time.monotonic()
        context = {**SUPPORT_A, "request_id": f"req-8.{attempt}"}
        turn = producer.submit(proposals, context)
        collected = producer.collect(turn.turn_id, timeout=10)
        elapsed = time.monotonic() - started
        intervals = _execution_intervals(producer.engine, turn.turn_id)
        overlap = _common_overlap_ms(intervals)
        report.out.write(
            f"   turn {attempt}: {elapsed * 1000:.0f} ms end to end (a figure, not a check)\n"
        )
        if overlap is not None and overlap > 0:
            break
    got = [r.call_id for r in collected.results]
    report.check(
        "every proposed call has one terminal result",
        collected.complete and got == ids,
        f"{got}",
    )
    order = sorted(intervals, key=lambda c: intervals[c][1])
    report.check(
        "joined by id, whatever order they finished in",
        got == ids and sorted(order) == sorted(ids),
        f"finished {order}",
    )
    report.check(
        "ran concurrently: all three were executing at once (trace timestamps)",
        overlap is not None and overlap > 0,
        _overlap_evidence(overlap, attempt),
    )
    return turn.turn_id


def _refund(producer: Producer, report: Report) -> dict[str, Any]:
    report.out.write("\n2. refund 12,000 KRW of order O-17 (user-17, tenant-a)\n")
    turn = producer.submit(
        [
            {
                "call_id": "call-refund-3",
                "tool_name": "refund_payment",
                "arguments": {"order_id": "O-17", "amount": 12000, "currency": "KRW"},
            }
        ],
        SUPPORT_A,
    )
    result = producer.collect(turn.turn_id, timeout=10).results
    call = turn.calls[0]
    ok = len(result) == 1 and result[0].status == "succeeded"
    data = (result[0].model_dump().get("data") or {}).get("content") or {} if result else {}
    report.check("the refund succeeded", ok, json.dumps(data))
    effects = _side_effects(producer.engine, call.operation_id, "refund_payment")
    report.check(
        "exactly one side effect downstream",
        effects == 1,
        f"{effects} row(s) in downstream.side_effects",
    )
    return {"turn_id": turn.turn_id, "call": call, "data": data}


def _refund_again(producer: Producer, report: Report, first: dict[str, Any]) -> str:
    call = first["call"]
    report.out.write("\n3. the same refund delivered twice\n")
    transport.enqueue_calls(producer.queue, [uuid.UUID(call.ref)] * 2, timeout=60)
    report.out.write(
        "   enqueued the finished call's job twice more; new turn reuses its operation id\n"
    )
    turn = producer.submit(
        [
            {
                "call_id": "call-refund-3-retry",
                "tool_name": "refund_payment",
                "arguments": {"order_id": "O-17", "amount": 12000, "currency": "KRW"},
            }
        ],
        {**SUPPORT_A, "request_id": "req-9"},
        operation_ids={"call-refund-3-retry": call.operation_id},
    )
    again = producer.collect(turn.turn_id, timeout=10).results
    data = (again[0].model_dump().get("data") or {}).get("content") or {} if again else {}
    report.check(
        "the redelivery reuses the first result",
        bool(again)
        and again[0].status == "succeeded"
        and data.get("refund_id") == first["data"].get("refund_id"),
        f"refund_id {data.get('refund_id')}",
    )
    _wait_for_trace(producer.engine, call.ref, "duplicate_delivery", 2)
    effects = _side_effects(producer.engine, call.operation_id, "refund_payment")
    report.check("still exactly one side effect downstream", effects == 1, f"{effects} row(s)")
    results = _outbox_rows(producer.engine, call.ref)
    report.check(
        "the first call still has exactly one terminal result",
        results == 1,
        f"{results} outbox row(s)",
    )
    return turn.turn_id


def _delete_with_approval(producer: Producer, report: Report) -> str:
    report.out.write("\n4. delete last week's policy e-mails (user-17)\n")
    turn = producer.submit(
        [
            {
                "call_id": "call-delete",
                "tool_name": "delete_emails",
                "arguments": {"query": "policy update"},
            }
        ],
        {**SUPPORT_A, "request_id": "req-10"},
    )
    call = turn.calls[0]
    approval_id = None
    deadline = time.monotonic() + 5
    while approval_id is None and time.monotonic() < deadline:
        waiting = producer.collect(turn.turn_id, timeout=0.1)
        approval_id = waiting.awaiting_approval.get(call.call_id)
    deleted_before = _deleted_emails(producer.engine)
    report.check(
        "parked for approval, nothing deleted yet",
        approval_id is not None and deleted_before == 0,
        f"approval {approval_id}, {deleted_before} deleted",
    )
    if approval_id is None:
        return turn.turn_id
    tenant = "tenant-a"  # the approver acts for the tenant of user-17
    impact = approvals.show(producer.engine, approval_id, tenant=tenant)["impact"]
    report.check(
        "the approval shows the server's count and account",
        (impact["count"], impact["account"]) == (50, "user-17"),
        f"{impact['count']} e-mails of {impact['account']}, recoverable={impact['recoverable']}",
    )
    # Four eyes: user-17 asked for it, so only another person of tenant-a may decide.
    try:
        approvals.approve(producer.engine, approval_id, by="user-17", tenant=tenant)
        refused = "accepted"
    except ApprovalError as exc:
        refused = exc.code
    still = approvals.show(producer.engine, approval_id, tenant=tenant)["state"]
    report.check(
        "four eyes: user-17 cannot approve their own request",
        refused == ErrorCode.APPROVAL_FORBIDDEN and still == "pending",
        f"{refused}; the request is still {still}",
    )
    resumed = approvals.approve(producer.engine, approval_id, by="demo-approver", tenant=tenant)
    transport.enqueue_calls(producer.queue, resumed, timeout=60)
    done = producer.collect(turn.turn_id, timeout=10)
    changed = _changed_once(producer.engine, _key(producer.engine, call.operation_id))
    report.check(
        "after approval exactly the approved 50 changed, once each",
        done.complete
        and done.results[0].status == "succeeded"
        and sorted(changed) == sorted(impact["email_ids"])
        and set(changed.values()) == {1},
        f"{len(changed)} e-mails, {_deleted_emails(producer.engine)} deleted in the mailbox",
    )
    return turn.turn_id


def _refusals(producer: Producer, report: Report) -> list[str]:
    report.out.write("\n5. refusals at the gate\n")
    refund = {"order_id": "O-42", "amount": 1000, "currency": "KRW"}
    viewer = {"request_id": "req-11", "tenant_id": "tenant-a", "user_id": "user-5"}
    cases = [
        ("tool_not_allowed", {**viewer, "roles": ["viewer"]}, "call-viewer-refund"),
        ("permission_denied", {**SUPPORT_A, "request_id": "req-12"}, "call-foreign-refund"),
    ]
    turn_ids = []
    for code, ctx, call_id in cases:
        turn = producer.submit(
            [{"call_id": call_id, "tool_name": "refund_payment", "arguments": refund}], ctx
        )
        turn_ids.append(turn.turn_id)
        results = producer.collect(turn.turn_id, timeout=10).results
        got = results[0].model_dump().get("error", {}).get("code") if results else None
        requests = _requests(producer.engine, _key(producer.engine, turn.calls[0].operation_id))
        report.check(
            f"{call_id} ends {code}, nothing reaches the provider",
            got == code and requests == 0,
            f"{got}, {requests} provider request(s)",
        )
    return turn_ids


def _deleted_emails(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM downstream.emails WHERE deleted_at IS NOT NULL")
            ).scalar_one()
        )


def _changed_once(engine: Engine, key: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT resource_id, count(*) AS n FROM downstream.side_effects"
                " WHERE idempotency_key = :k GROUP BY resource_id"
            ),
            {"k": key},
        )
        return {r.resource_id: int(r.n) for r in rows}


def _requests(engine: Engine, key: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM downstream.requests WHERE idempotency_key = :k"),
                {"k": key},
            ).scalar_one()
        )


def _key(engine: Engine, operation_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT idempotency_key FROM callgate.operations WHERE operation_id = :op"),
                {"op": operation_id},
            ).scalar_one()
        )


def _side_effects(engine: Engine, operation_id: str, tool: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM downstream.side_effects WHERE idempotency_key = :k"),
                {"k": _key(engine, operation_id)},
            ).scalar_one()
        )


def _outbox_rows(engine: Engine, call_ref: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM callgate.outbox WHERE call_ref = :r"), {"r": call_ref}
            ).scalar_one()
        )


def _execution_intervals(engine: Engine, turn_id: str) -> dict[str, tuple[Any, Any]]:
    """Per call, when its handler started and when its completion committed, on Postgres'
    clock (``store.audit.execution_intervals``)."""
    found = audit.execution_intervals(engine, turn_id=turn_id)
    return {call_id: (started, ended) for call_id, started, ended in found.values()}


def _overlap_evidence(overlap: float | None, attempt: int) -> str:
    if overlap is None:
        return "reserved/completed events missing from the trace"
    if overlap <= 0:
        return f"never all at once in {attempt} turn(s)"
    return f"all three executing together for {overlap:.0f} ms (turn {attempt})"


def _common_overlap_ms(intervals: dict[str, tuple[Any, Any]]) -> float | None:
    """How long every call was executing at once (negative: never all at once)."""
    if not intervals or any(s is None or e is None for s, e in intervals.values()):
        return None
    latest_start = max(s for s, _ in intervals.values())
    earliest_end = min(e for _, e in intervals.values())
    return float((earliest_end - latest_start).total_seconds() * 1000)


def _wait_for_trace(
    engine: Engine, call_ref: str, event: str, count: int, timeout: float = 10
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            n = conn.execute(
                text(
                    "SELECT count(*) FROM callgate.trace_events WHERE call_ref = :r AND event = :e"
                ),
                {"r": call_ref, "e": event},
            ).scalar_one()
        if n >= count:
            return
        time.sleep(0.05)


def _print_trace(engine: Engine, turn_id: str, out: TextIO) -> None:
    out.write(f"\nturn {turn_id}\n")
    out.write(f"  {'call_id':<22}{'tool':<16}{'event':<22}{'gen':<5}detail\n")
    for e in audit.events(engine, turn_id):
        detail = _compact(e["detail"])
        gen = "" if e["generation"] is None else str(e["generation"])
        who = f"{e['call_id'] or '':<22}{e['tool_name'] or '':<16}"
        out.write(f"  {who}{e['event']:<22}{gen:<5}{json.dumps(detail)}\n")


_QUIET = {"request_id", "tool_call_id", "tool", "schema_version", "intent_hash"}


def _compact(detail: dict[str, Any]) -> dict[str, Any]:
    """The trace detail worth reading on a terminal: verdicts that did not pass, outcomes."""
    out = {k: v for k, v in detail.items() if k not in _QUIET and v is not None}
    verdicts = out.pop("verdicts", None)
    if verdicts:
        failed = {k: v for k, v in verdicts.items() if v not in ("pass", "no_approval_needed")}
        out["gate"] = failed or "all layers pass"
    if isinstance(out.get("resources"), list):
        out["resources"] = f"{len(out['resources'])} ids"
    out.pop("operation_key_hash", None)
    return out
