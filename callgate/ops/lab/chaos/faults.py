"""Fault points and fault actions: each fault waits for its point, read from the database
(or the turn's result stream), then happens as a real process-level event: a signal to a
real pid, a job enqueued again, a FLUSHALL, a server killed, a backend terminated."""

from __future__ import annotations

import random
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from callgate.ops.lab.chaos import invariants
from callgate.ops.lab.chaos.scenario import FaultSpec, StackSpec
from callgate.ops.lab.chaos.services import OwnedPostgres, OwnedRedis, terminate_backends
from callgate.ops.lab.replicated import Replicated
from callgate.ops.stack import Stack
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import approvals

CONTROL_APP = "callgate-chaos"
APPROVER = "chaos-approver"
POLL = 0.02
# Points that watch one call of the workload (the fault's `tool`, its `call`-th).
CALL_POINTS = ("started", "crash_gap", "completed", "parked")


@dataclass(frozen=True)
class PlannedFault:
    """A fault with the choices the seed made for it (replayed by the same seed)."""

    spec: FaultSpec
    jitter_s: float
    victim_draw: float
    call_draw: float

    def as_json(self) -> dict[str, Any]:
        return {
            "action": self.spec.action,
            "at": self.spec.at,
            "tool": self.spec.tool,
            "victim": self.spec.victim,
            "jitter_ms": round(self.jitter_s * 1000),
            "victim_draw": round(self.victim_draw, 6),
            "call_draw": round(self.call_draw, 6),
        }


def plan(faults: tuple[FaultSpec, ...], rng: random.Random) -> list[PlannedFault]:
    """Draw every random choice of the schedule up front, in order."""
    planned = []
    for f in faults:
        low, high = f.jitter_ms
        planned.append(
            PlannedFault(
                spec=f,
                jitter_s=rng.randint(low, high) / 1000,
                victim_draw=rng.random(),
                call_draw=rng.random(),
            )
        )
    return planned


@dataclass(frozen=True)
class Call:
    turn_id: str
    ref: str
    call_id: str
    tool: str
    operation_id: str


@dataclass
class Live:
    """Everything a fault may touch during one scenario."""

    stack: Stack
    spec: StackSpec
    engine: Engine
    producer: Producer
    env: dict[str, str]
    admin_url: str
    database: str
    redis: OwnedRedis | None
    postgres: OwnedPostgres | None
    calls: list[Call] = field(default_factory=list)
    replacements: int = 0
    # A replicated scenario: callgate's primary and replica, and the run's server holding
    # the downstreams and the ledger (``engine`` reads callgate's rows, on the primary).
    replicated: Replicated | None = None
    ledger: Engine | None = None

    def workers(self) -> list[str]:
        return sorted(
            n for n, p in self.stack.procs.items() if n.startswith("worker") and p.poll() is None
        )

    def start_worker(self) -> None:
        self.replacements += 1
        name = f"worker-r{self.replacements}"
        extra = {} if self.spec.replacement_delays else {"CALLGATE_DEMO_DELAY_MS": ""}
        self.stack.start(
            name, ["worker", "--name", f"chaos-{name}-{uuid.uuid4().hex[:8]}"], env=extra
        )

    def name_of(self, pid: int) -> str | None:
        for name, proc in self.stack.procs.items():
            if proc.pid == pid and proc.poll() is None:
                return name
        return None


class PointNotReached(Exception):
    """A fault's point never came within the scenario's window."""


def target(live: Live, fault: PlannedFault) -> Call | None:
    if fault.spec.tool is None:
        return None
    mine = [c for c in live.calls if c.tool == fault.spec.tool]
    if not mine:
        raise PointNotReached(f"the workload has no {fault.spec.tool} call")
    if fault.spec.call == "random":
        return mine[int(fault.call_draw * len(mine))]
    index = int(fault.spec.call)
    if index >= len(mine):
        raise PointNotReached(f"the workload has no {fault.spec.tool} call #{index}")
    return mine[index]


def wait_for_point(live: Live, fault: PlannedFault, timeout: float) -> dict[str, Any]:
    """Block until the fault's point is reached; returns what the point found (pid, ...)."""
    spec = fault.spec
    call = target(live, fault) if spec.at in CALL_POINTS else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _reached(live, spec, call)
        if found is not None:
            if call is not None:
                found["call_id"] = call.call_id
            return found
        time.sleep(POLL)
    what = f"{spec.at} of {call.call_id}" if call else spec.at
    raise PointNotReached(f"{spec.action}: point {what} not reached in {timeout:.0f}s")


def _reached(live: Live, spec: FaultSpec, call: Call | None) -> dict[str, Any] | None:
    if spec.at in ("start", "submitted"):
        return {}
    if spec.at == "progress":
        done = invariants.terminal_count(live.engine)
        return {"terminal": done} if done >= spec.fraction * len(live.calls) else None
    if spec.at == "published":
        return _published(live)
    assert call is not None
    with live.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT c.state, c.approval_id, o.idempotency_key,"
                " (SELECT pid FROM chaos.invocations i WHERE i.operation_id = c.operation_id"
                "   ORDER BY i.id DESC LIMIT 1) AS pid,"
                " EXISTS (SELECT 1 FROM downstream.side_effects s"
                "   WHERE s.idempotency_key = o.idempotency_key) AS applied"
                " FROM callgate.calls c JOIN callgate.operations o USING (operation_id)"
                " WHERE c.id = :ref"
            ),
            {"ref": call.ref},
        ).one()
    terminal = row.state in invariants.TERMINAL
    if spec.at == "started" and row.pid is not None and not row.applied and not terminal:
        return {"pid": row.pid}
    if spec.at == "crash_gap" and row.applied and not terminal and row.pid is not None:
        return {"pid": row.pid}
    if spec.at == "completed" and terminal:
        return {"pid": row.pid}
    if spec.at == "parked" and row.state == "awaiting_approval":
        return {"approval_id": str(row.approval_id)}
    return None


def _published(live: Live) -> dict[str, Any] | None:
    """A result the relayer put on its turn's stream while its outbox row is unmarked."""
    with live.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, turn_id FROM callgate.outbox WHERE published_at IS NULL")
        ).all()
    unmarked: dict[str, set[str]] = {}
    for r in rows:
        unmarked.setdefault(str(r.turn_id), set()).add(str(r.id))
    for turn_id, ids in unmarked.items():
        stream = transport.results_stream(live.producer.settings.queue, turn_id)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = live.producer.redis.xrange(stream)  # type: ignore[assignment]
        for _entry, fields in entries:
            if fields.get(b"outbox_id", b"").decode() in ids:
                return {"turn_id": turn_id}
    return None


def inject(live: Live, fault: PlannedFault, point: dict[str, Any], window: float) -> dict[str, Any]:
    """Make the fault happen. Returns what was done, for the report."""
    spec = fault.spec
    done: dict[str, Any] = {"action": spec.action, "at": spec.at, **point}
    if spec.action == "duplicate":
        refs = [uuid.UUID(c.ref) for c in live.calls if spec.tool in (None, c.tool)]
        done["jobs"] = transport.enqueue_calls(live.producer.queue, refs * spec.copies, timeout=300)
    elif spec.action == "kill_worker":
        victims = _victims(live, fault, point)
        for name in victims:
            live.stack.signal(name, signal.SIGKILL)
        for name in victims:
            live.stack.procs[name].wait()
        done["killed"] = victims
        if spec.restart:
            for _ in victims:
                live.start_worker()
    elif spec.action == "stop_worker":
        done.update(_stop_past_lease(live, fault, point, window))
    elif spec.action in ("kill_relayer", "kill_sweeper"):
        name = spec.action.removeprefix("kill_")
        live.stack.signal(name, signal.SIGKILL)
        live.stack.procs[name].wait()
        done["killed"] = [name]
        if spec.restart:
            live.stack.start(name, [name], env={"CALLGATE_RELAYER_MARK_DELAY_MS": "0"})
    elif spec.action == "flush_redis":
        assert live.redis is not None
        live.redis.flush()
    elif spec.action == "restart_redis":
        assert live.redis is not None
        live.redis.kill()
        time.sleep(spec.seconds)
        live.redis.start()
    elif spec.action == "terminate_backends":
        done["terminated"] = terminate_backends(live.admin_url, live.database, CONTROL_APP)
    elif spec.action == "restart_postgres":
        assert live.postgres is not None
        live.postgres.restart()
    elif spec.action == "outage":
        seconds = spec.seconds if not spec.requests else 0.0
        with live.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO chaos.outages (tool_name, until, remaining)"
                    " VALUES (:t, clock_timestamp() + make_interval(secs => :s), :n)"
                    " ON CONFLICT (tool_name) DO UPDATE"
                    " SET until = EXCLUDED.until, remaining = EXCLUDED.remaining"
                ),
                {"t": spec.tool, "s": seconds, "n": spec.requests},
            )
        done.update({"tool": spec.tool, "seconds": seconds, "requests": spec.requests})
    elif spec.action == "freeze_replica":
        assert live.replicated is not None
        live.replicated.caught_up()
        live.replicated.freeze()
        done["ended_before"] = invariants.terminal_count(live.engine)
    elif spec.action == "fail_over":
        assert live.replicated is not None
        # The calls that ended after the freeze are open again on the promoted replica:
        # only their published results tell what happened.
        done["ended_before"] = invariants.terminal_count(live.engine)
        live.replicated.fail_over()
    elif spec.action == "approve":
        resumed = approvals.approve(
            live.engine, point["approval_id"], by=APPROVER, tenant=_tenant(live)
        )
        transport.enqueue_calls(live.producer.queue, resumed, timeout=300)
        done["resumed"] = len(resumed)
    return done


def _tenant(live: Live) -> str:
    with live.engine.connect() as conn:
        return str(conn.execute(text("SELECT tenant_id FROM callgate.turns LIMIT 1")).scalar())


def _victims(live: Live, fault: PlannedFault, point: dict[str, Any]) -> list[str]:
    alive = live.workers()
    if fault.spec.victim == "all":
        return alive
    if fault.spec.victim == "random":
        return [alive[int(fault.victim_draw * len(alive))]] if alive else []
    owner = live.name_of(int(point["pid"])) if point.get("pid") is not None else None
    if owner is None:
        raise PointNotReached(f"{fault.spec.action}: the call's owner is not a live worker")
    return [owner]


def _stop_past_lease(
    live: Live, fault: PlannedFault, point: dict[str, Any], window: float
) -> dict[str, Any]:
    """SIGSTOP the owner; a new worker takes the call over once the lease expires and
    finishes it; then SIGCONT the stale owner and wait for its write or its completion to be
    refused (by the downstream's fence, or by the completion's guard)."""
    (victim,) = _victims(live, fault, point)
    call = target(live, fault)
    assert call is not None
    live.stack.signal(victim, signal.SIGSTOP)
    live.start_worker()
    deadline = time.monotonic() + window
    while time.monotonic() < deadline and not _terminal(live.engine, call.ref):
        time.sleep(POLL)
    finished = _terminal(live.engine, call.ref)
    live.stack.signal(victim, signal.SIGCONT)
    refused: list[str] = []
    deadline = time.monotonic() + max(5.0, 3 * live.spec.lease_seconds)
    while time.monotonic() < deadline and not refused:
        refused = _stale_events(live.engine, call.ref)
        time.sleep(POLL)
    return {
        "stopped": [victim],
        "new_owner_finished": finished,
        "stale_owner_refused_by": refused,
    }


def _terminal(engine: Engine, ref: str) -> bool:
    with engine.connect() as conn:
        state = conn.execute(
            text("SELECT state FROM callgate.calls WHERE id = :r"), {"r": ref}
        ).scalar()
    return state in invariants.TERMINAL


def _stale_events(engine: Engine, ref: str) -> list[str]:
    with engine.connect() as conn:
        return [
            str(r[0])
            for r in conn.execute(
                text(
                    "SELECT event FROM callgate.trace_events WHERE call_ref = :r"
                    " AND event IN ('stale_fence_rejected', 'stale_completion_rejected')"
                ),
                {"r": ref},
            )
        ]
