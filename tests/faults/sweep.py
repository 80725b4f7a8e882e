"""The sweep: one turn (a read, a keyed write, an unkeyed write) through real worker, relayer
and sweeper processes whose Postgres and Redis traffic passes through the fault proxies, one
fault armed on one round trip of the call's path; then both promises are checked from the
database's own rows.

Promises checked for every cell (``check``):
- every call ends, with its true outcome: a write whose effect applied never ends as if it
  had not (``failed_*`` other than ``reconciliation_pending``, which says "may have applied";
  that is accepted only where a stall outlived the lease, the one case where callgate can
  honestly not know); a call that never ran never ends ``failed_terminal``;
- at most one effect per operation, and per logical write (the application's retry of a
  failed submit included);
- no error from ``submit`` that claims nothing was recorded (``invalid_input``, or any error
  that does not say the turn may be recorded) when the turn was recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from callgate.core.errors import CallgateError
from callgate.core.settings import Settings
from callgate.ops.lab.chaos.runner import one_result_per_call
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.queue import deliveries, results, transport
from callgate.store.db import libpq_url
from tests.faults import tools
from tests.faults.core import CUT, LOSE_REPLY, REFUSE, STALL, Fault, FaultKind
from tests.faults.pgproxy import PgProxy, sql_fault
from tests.faults.redisproxy import RedisProxy, command_fault, script_fault

LEASE_SECONDS = 3.0
REFUSE_SECONDS = 3.0  # shorter than the documented 10 s reconnect window
# A refusal is an outage shorter than the lease (as a PostgreSQL restart is against the 30 s
# default): the owner keeps its lease and stores its own result. An outage longer than the
# lease is a stall past it: a takeover then settles the call (the stall cells).
REFUSE_LEASE_SECONDS = 3 * REFUSE_SECONDS
STALL_SECONDS = LEASE_SECONDS + 2.5  # past the lease
END_WITHIN_SECONDS = 60.0
FAULTS: tuple[FaultKind, ...] = (CUT, LOSE_REPLY, REFUSE, STALL)
FAULT_NAMES = {
    CUT: "before send",
    LOSE_REPLY: "reply lost",
    REFUSE: "connect refused",
    STALL: "stalled past lease",
}
TERMINAL = ("succeeded", "failed_retryable", "failed_terminal")

WORKER = "callgate-worker"
PRODUCER = "callgate-producer"
RELAYER = "callgate-relayer"
SWEEPER = "callgate-sweeper"


@dataclass(frozen=True)
class Ids:
    """What one cell's turn is made of; operation ids are passed to submit only when the
    round trip under test is not submit's own (an application's retry of a failed submit
    must not be rescued by reusing them: that is what the submit cells test)."""

    tag: str
    request_id: str
    read_op: str
    keyed_op: str
    unkeyed_op: str
    keyed_note: str
    unkeyed_note: str
    keyed_call: str = "c-keyed"
    unkeyed_call: str = "c-unkeyed"

    @classmethod
    def new(cls) -> Ids:
        tag = uuid.uuid4().hex[:10]
        return cls(
            tag=tag,
            request_id=f"req-{tag}",
            read_op=f"op-read-{tag}",
            keyed_op=f"op-keyed-{tag}",
            unkeyed_op=f"op-unkeyed-{tag}",
            keyed_note=f"keyed-{tag}",
            unkeyed_note=f"unkeyed-{tag}",
        )


# A write's completion: alone (``COMPLETE_SQL``) or in a batch (``COMPLETE_MANY_SQL``).
COMPLETE = r"SET state = (?:w\.op_state|\$\d+,\s+result = CASE)"


def _pg(pattern: str, application: str, params: Callable[[Ids], str] | None = None) -> Any:
    def build(kind: FaultKind, seconds: float, ids: Ids) -> Fault:
        return sql_fault(
            kind,
            pattern,
            params=params(ids) if params else None,
            application=application,
            seconds=seconds,
        )

    return build


@dataclass(frozen=True)
class RoundTripSpec:
    """A round trip on the call's path: where it is sent from and how to fault it."""

    name: str
    server: str  # "postgres" or "redis"
    build: Callable[[FaultKind, float, Ids], Fault]
    # Start the processes only after the submit: for round trips a fault can only single
    # out as "the first one" (the take script carries no call ids).
    stack_after_submit: bool = False
    pass_operation_ids: bool = True
    hold_seconds: float = 0.0  # the keyed write's handler runs this long (renewals)
    # A fault on the downstream's own round trip leaves the handler itself unable to tell
    # whether its write applied: ``reconciliation_pending`` is then the true outcome.
    handler_cannot_tell: bool = False
    # No worker until the fault fired, and the turn's jobs lost from Redis after the
    # submit (a job still queued is a backlog, never dispatched again): past the stale
    # window the sweeper's re-dispatch is the round trip under test.
    late_worker: bool = False
    # With late_worker: Redis loses the epoch key too (as a flush would), and the fault is
    # armed only once the sweeper has recorded the epoch it first saw, so the round trip
    # under test is the record of the new epoch, the loss's.
    lose_epoch: bool = False
    # Armed with the stack up and idle, and the turn submitted only once the fault has met
    # its round trip (a worker's blocking wait for a job: the one that then moves the job).
    fire_before_submit: bool = False
    # An operator's round trip after the turn ran (``ACTIONS``): the action arms the fault
    # itself, at the moment the round trip is due, and checks its own promises.
    action: str | None = None
    # Extra arguments of the turn's unkeyed write (needs_approval, doubt).
    unkeyed_args: tuple[tuple[str, Any], ...] = ()
    kinds: tuple[FaultKind, ...] = FAULTS


def _redis(command: str, args: Callable[[Ids], str] | None = None, nth: int = 1) -> Any:
    def build(kind: FaultKind, seconds: float, ids: Ids) -> Fault:
        return command_fault(
            kind, command, args=args(ids) if args else None, seconds=seconds, nth=nth
        )

    return build


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


def _take(kind: FaultKind, seconds: float, ids: Ids) -> Fault:
    return script_fault(kind, deliveries.TAKE_LUA, seconds=seconds, label="take script")


# The operator commands' connections (ops/cli/common.py OPS_APPLICATION).
OPS = "callgate-ops"
# Whoever reconciles a new PostgreSQL history: the sweeper, or a worker's sweeping thread.
RECONCILERS = "callgate-(worker-)?sweeper"
APPROVER = "approver-f"
RECONCILER = "reconciler-f"
# A whole Redis that answers nothing for longer than the lease and the liveness TTL.
REDIS_STALL_SECONDS = max(LEASE_SECONDS, deliveries.LIVENESS_TTL_SECONDS) + 3.0


def _whole_redis_stall(kind: FaultKind, seconds: float, ids: Ids) -> Fault:
    return command_fault(
        STALL,
        "BLMOVE",
        seconds=REDIS_STALL_SECONDS,
        stall_all=True,
        label="BLMOVE, then all Redis traffic",
    )


ROUND_TRIPS: dict[str, RoundTripSpec] = {
    s.name: s
    for s in [
        RoundTripSpec(
            "submit COMMIT",
            "postgres",
            _pg(r"^\s*COMMIT\b", PRODUCER),
            pass_operation_ids=False,
        ),
        RoundTripSpec(
            # The first of the enqueue's two round trips: the turn noted for lost-turn
            # detection after a failover, and which jobs already wait.
            "submit note turn",
            "redis",
            _redis("ZADD", lambda ids: r"^callgate:[^ ]*:recent_turns"),
            pass_operation_ids=False,
        ),
        RoundTripSpec(
            "submit enqueue",
            "redis",
            _redis("RPUSH", lambda ids: r"^rq:queue:"),
            pass_operation_ids=False,
        ),
        RoundTripSpec("take", "redis", _take, stack_after_submit=True),
        RoundTripSpec(
            "load", "postgres", _pg(r"AS queue_wait_seconds", WORKER), stack_after_submit=True
        ),
        RoundTripSpec(
            "reserve (keyed write)",
            "postgres",
            _pg(r"reserved_from = state", WORKER, lambda ids: re.escape(ids.keyed_op)),
        ),
        RoundTripSpec(
            "reserve (unkeyed write)",
            "postgres",
            _pg(r"reserved_from = state", WORKER, lambda ids: re.escape(ids.unkeyed_op)),
        ),
        RoundTripSpec(
            "renew",
            "postgres",
            _pg(
                r"lease_expires_at = now\(\) \+ make_interval",
                WORKER,
                lambda ids: re.escape(ids.keyed_op),
            ),
            hold_seconds=LEASE_SECONDS * 1.5,
        ),
        RoundTripSpec(
            "downstream write (unkeyed)",
            "postgres",
            _pg(
                r"INSERT INTO faults\.effects",
                "faults-downstream",
                lambda ids: re.escape(ids.unkeyed_op),
            ),
            handler_cannot_tell=True,
        ),
        RoundTripSpec(
            # A read ends with no reservation, in one statement (its audit names the turn's
            # request id, which singles out this cell's read).
            "end read",
            "postgres",
            _pg(r"AS e\(id uuid, status text", WORKER, lambda ids: re.escape(ids.request_id)),
        ),
        RoundTripSpec(
            "complete (keyed write)",
            "postgres",
            _pg(COMPLETE, WORKER, lambda ids: re.escape(ids.keyed_op)),
        ),
        RoundTripSpec(
            "complete (unkeyed write)",
            "postgres",
            _pg(COMPLETE, WORKER, lambda ids: re.escape(ids.unkeyed_op)),
        ),
        RoundTripSpec(
            "dispatch next write",
            "redis",
            # The producer's enqueue is the first RPUSH to the queue; the worker's enqueue
            # of the unkeyed write, once the keyed one completed, the second.
            _redis("RPUSH", lambda ids: r"^rq:queue:", nth=2),
        ),
        RoundTripSpec(
            "sweep re-dispatch",
            "postgres",
            _pg(r"SET dispatched_at = now\(\), dispatches = dispatches \+ 1", SWEEPER),
            late_worker=True,
        ),
        RoundTripSpec(
            "record Redis epoch",
            "postgres",
            _pg(r"INSERT INTO callgate\.redis_epochs", SWEEPER),
            late_worker=True,
            lose_epoch=True,
        ),
        RoundTripSpec(
            "relay publish",
            "redis",
            _redis(
                "EVALSHA",
                lambda ids: f"^{_sha(results.PUBLISH_LUA)}.*{re.escape(ids.unkeyed_call)}",
            ),
        ),
        RoundTripSpec(
            "relay mark", "postgres", _pg(r"UPDATE callgate\.outbox SET published_at", RELAYER)
        ),
        RoundTripSpec(
            "take wait (BLMOVE)",
            "redis",
            _redis("BLMOVE", lambda ids: r"^rq:queue:"),
            fire_before_submit=True,
        ),
        RoundTripSpec(
            "approve",
            "postgres",
            _pg(r"SET state = 'approved', decided_by", OPS),
            action="approve",
            unkeyed_args=(("needs_approval", True),),
        ),
        RoundTripSpec(
            "deny",
            "postgres",
            _pg(r"SET state = 'denied', decided_by", OPS),
            action="deny",
            unkeyed_args=(("needs_approval", True),),
        ),
        RoundTripSpec(
            "reconcile resolve",
            "postgres",
            _pg(r"WITH settled AS", OPS),
            action="reconcile",
            unkeyed_args=(("doubt", True),),
            handler_cannot_tell=True,
        ),
        RoundTripSpec(
            "prune",
            "postgres",
            _pg(r"DELETE FROM callgate\.calls AS c USING doomed", OPS),
            action="prune",
            unkeyed_args=(("needs_approval", True),),
        ),
        *(
            RoundTripSpec(name, server, build, action="failover")
            for name, server, build in (
                (
                    "failover: record history",
                    "postgres",
                    _pg(r"INSERT INTO callgate\.histories", RECONCILERS),
                ),
                (
                    "failover: doubt writes",
                    "postgres",
                    _pg(r"WITH doubted AS \(\s*UPDATE", RECONCILERS),
                ),
                (
                    "failover: raise fence",
                    "redis",
                    _redis("EVALSHA", lambda ids: f"^{_sha(results.RAISE_FENCE_LUA)}"),
                ),
                ("failover: adopt results", "postgres", _pg(r"WITH adopted AS", RECONCILERS)),
                (
                    "failover: finish",
                    "postgres",
                    _pg(r"UPDATE callgate\.histories\s+SET reconciled_at", RECONCILERS),
                ),
            )
        ),
        RoundTripSpec(
            "take (whole Redis stalled)",
            "redis",
            _whole_redis_stall,
            action="redis_stall",
            kinds=(STALL,),
            hold_seconds=REDIS_STALL_SECONDS + 4.0,
        ),
    ]
}

# Cells expected to hold on today's code, run by default (the rest under -m slow).
FAST = (
    ("end read", LOSE_REPLY),
    ("reserve (keyed write)", LOSE_REPLY),
    ("complete (keyed write)", LOSE_REPLY),
    ("relay publish", LOSE_REPLY),
    ("relay mark", CUT),
    ("approve", LOSE_REPLY),
    ("reconcile resolve", LOSE_REPLY),
    ("failover: adopt results", LOSE_REPLY),
)


@dataclass
class CellResult:
    round_trip: str
    fault: str
    verdict: str  # "held", "BROKE", "not hit"
    broken: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # accepted, but worth a look
    evidence: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def message(self) -> str:
        lines = [
            f"round trip {self.round_trip!r} × fault {self.fault!r}: {self.verdict}",
            *[f"  - {b}" for b in self.broken],
            *[f"  note: {n}" for n in self.notes],
            f"  evidence: {json.dumps(self.evidence, default=str, sort_keys=True)}",
        ]
        return "\n".join(lines)


def _says_recorded(err: CallgateError) -> bool:
    """The error states that the turn is recorded (nothing to submit again)."""
    return re.search(r"\bis recorded\b", err.message) is not None


def _says_maybe_recorded(err: CallgateError) -> bool:
    text = f"{err.message} {json.dumps(getattr(err, 'details', None), default=str)}"
    return (
        re.search(r"(may|might|could) (have been|be|already be) recorded|is recorded", text)
        is not None
    )


# Every cell run in this session, for the matrix printed at its end.
RESULTS: list[CellResult] = []


def render(results: list[CellResult]) -> str:
    """The matrix as a Markdown table: round trip × fault → outcome."""
    faults = [FAULT_NAMES[k] for k in FAULTS]
    by_cell = {(r.round_trip, r.fault): r for r in results}
    lines = ["| round trip | " + " | ".join(faults) + " |", "|---|" + "---|" * len(faults)]
    for name in ROUND_TRIPS:
        row = []
        for f in faults:
            r = by_cell.get((name, f))
            if r is None:
                row.append("·")
            elif r.verdict == "held":
                row.append("held" + (f" ({'; '.join(r.notes)})" if r.notes else ""))
            else:
                row.append(f"**{r.verdict}**: " + "; ".join(r.broken)[:200])
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


@dataclass
class Cell:
    spec: RoundTripSpec
    kind: FaultKind
    database_url: str  # direct (the checks read here, never through the proxy)
    redis_url: str
    pg: PgProxy
    redis: RedisProxy
    log_path: Path

    def run(self) -> CellResult:
        started = time.monotonic()
        ids = Ids.new()
        tools.install(self.database_url)
        queue = f"fm-{ids.tag}"
        env = {
            "CALLGATE_DATABASE_URL": self.pg.url(self.database_url),
            "CALLGATE_DOWNSTREAM_DATABASE_URL": self.pg.url(self.database_url),
            "CALLGATE_REDIS_URL": self.redis.url(self.redis_url),
            "CALLGATE_QUEUE": queue,
            "CALLGATE_TOOLS": "tests.faults.tools:registry",
            "CALLGATE_LEASE_SECONDS": str(
                REFUSE_LEASE_SECONDS if self.kind == REFUSE else LEASE_SECONDS
            ),
            "CALLGATE_SWEEP_SECONDS": "0.5",
            "CALLGATE_STALE_SECONDS": "5",
            "CALLGATE_WORKER_GRACE_SECONDS": "2",
        }
        seconds = {REFUSE: REFUSE_SECONDS, STALL: STALL_SECONDS}.get(self.kind, 0.0)
        fault = self.spec.build(self.kind, seconds, ids)
        result = CellResult(self.spec.name, FAULT_NAMES[self.kind], "held")
        stack = Stack(
            env=env,
            workers=0 if self.spec.late_worker else 1,
            relayer=True,
            sweeper=True,
            log_path=str(self.log_path),
        )
        producer = Producer.from_env(Settings.from_env(env))
        try:
            if not self.spec.stack_after_submit:
                self._start(stack, queue)
            if self.spec.action is None and not self.spec.lose_epoch:
                self._proxy.arm(fault)
            if self.spec.fire_before_submit:
                deadline = time.monotonic() + 15.0
                while fault.hit is None and time.monotonic() < deadline:
                    time.sleep(0.02)
            submit_errors = self._submit(producer, ids, result)
            if self.spec.stack_after_submit:
                self._start(stack, queue)
            if self.spec.late_worker:
                # Redis loses the queued jobs (as a flush of that key would): only a lost
                # job is dispatched again.
                lose = transport.connect(self.redis_url)
                try:
                    if self.spec.lose_epoch:
                        self._wait_epoch_recorded(queue)
                        self._proxy.arm(fault)
                        lose.delete(deliveries.epoch_key(queue))
                    lose.delete(f"rq:queue:{queue}")
                finally:
                    lose.close()
                fault.wait(END_WITHIN_SECONDS / 2)
                if self.kind == REFUSE and fault.hit_at is not None:
                    # `callgate worker` exits when it cannot reach Postgres at start (not a
                    # promise about calls; noted in the report): start it after the window.
                    time.sleep(max(0.0, fault.hit_at + seconds - time.monotonic()))
                stack.start_worker("worker-1")
                wait_for_workers(self.redis_url, queue, 1)
            if self.spec.action is not None:
                ACTIONS[self.spec.action](Op(self, env, producer, ids, fault, result))
            ended = self._wait_ended(ids)
            if fault.hit_at is not None:  # a stalled round trip may still land: let it
                time.sleep(max(0.0, fault.hit_at + seconds + 1.0 - time.monotonic()))
            self._check(ids, fault, submit_errors, ended, result)
        finally:
            self.pg.disarm()
            self.redis.disarm()
            stack.stop()
            producer.close()
        result.seconds = round(time.monotonic() - started, 1)
        if fault.hit is None:
            result.verdict = "not hit"
            result.broken.insert(0, f"the fault never fired ({fault.describe()})")
        elif result.broken:
            result.verdict = "BROKE"
        result.evidence["fault"] = fault.describe()
        result.evidence["hit"] = fault.hit.text[:80] if fault.hit else None
        if fault.dropped:
            result.evidence["reply_lost"] = fault.dropped[:120].decode("utf-8", "replace")
        return result

    @property
    def _proxy(self) -> PgProxy | RedisProxy:
        return self.pg if self.spec.server == "postgres" else self.redis

    def _start(self, stack: Stack, queue: str) -> None:
        stack.__enter__()
        if stack.workers:
            wait_for_workers(self.redis_url, queue, stack.workers)

    def _proposals(
        self, ids: Ids, unkeyed_args: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        extra = dict(self.spec.unkeyed_args) if unkeyed_args is None else unkeyed_args
        return [
            {"call_id": "c-read", "tool_name": "fault_read", "arguments": {"n": 1}},
            {
                "call_id": ids.keyed_call,
                "tool_name": "fault_keyed",
                "arguments": {"note": ids.keyed_note, "hold_seconds": self.spec.hold_seconds},
            },
            {
                "call_id": ids.unkeyed_call,
                "tool_name": "fault_unkeyed",
                "arguments": {"note": ids.unkeyed_note, **extra},
            },
        ]

    def _submit(
        self,
        producer: Producer,
        ids: Ids,
        result: CellResult,
        unkeyed_args: dict[str, Any] | None = None,
    ) -> list[CallgateError]:
        """Submit as an application does: on an error, look whether the turn exists (the
        check), then submit again once unless the error says the turn is recorded. The
        repeat passes the submit key the error names (as docs/guarantees.md tells a caller
        to), so a repeat of a turn that was recorded must return it, not record another."""
        context = {
            "request_id": ids.request_id,
            "tenant_id": "tenant-f",
            "user_id": "user-f",
            "roles": ["support"],
        }
        operation_ids = (
            {"c-read": ids.read_op, ids.keyed_call: ids.keyed_op, ids.unkeyed_call: ids.unkeyed_op}
            if self.spec.pass_operation_ids
            else None
        )
        errors: list[CallgateError] = []
        submit_key: str | None = None
        for attempt in (1, 2):
            try:
                producer.submit(
                    self._proposals(ids, unkeyed_args),
                    context,
                    operation_ids=operation_ids,
                    submit_key=submit_key,
                )
                return errors
            except CallgateError as err:
                errors.append(err)
                recorded = self._turns(ids)
                result.evidence[f"submit_error_{attempt}"] = f"{err.code}: {err.message}"
                result.evidence[f"turns_after_error_{attempt}"] = len(recorded)
                says_not = getattr(err, "recorded", None) is False
                if recorded and (
                    err.code == "invalid_input" or says_not or not _says_maybe_recorded(err)
                ):
                    result.broken.append(
                        f"submit raised {err.code} ({err.message!r}), which does not say the "
                        f"turn may be recorded, but {len(recorded)} turn(s) of the request are"
                    )
                if _says_recorded(err) or getattr(err, "recorded", None) is True:
                    return errors
                submit_key = getattr(err, "submit_key", None)
        return errors

    def _wait_epoch_recorded(self, queue: str) -> None:
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            if self._rows("SELECT 1 FROM callgate.redis_epochs WHERE queue = %s", queue):
                return
            time.sleep(0.1)
        raise AssertionError("the sweeper never recorded Redis's epoch")

    def _rows(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        with psycopg.connect(libpq_url(self.database_url), autocommit=True) as conn:
            cur = conn.cursor(row_factory=dict_row)
            return list(cur.execute(sql, params).fetchall())

    def _turns(self, ids: Ids) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT turn_id FROM callgate.turns WHERE request_id = %s", ids.request_id
        )

    def _calls(self, ids: Ids) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT c.id, c.call_id, c.tool_name, c.operation_id, c.state, c.dispatches,"
            "       c.result #>> '{error,code}' AS code"
            "  FROM callgate.calls c JOIN callgate.turns t USING (turn_id)"
            " WHERE t.request_id = %s ORDER BY c.created_at, c.position",
            ids.request_id,
        )

    def _wait_ended(self, ids: Ids, *, settled: tuple[str, ...] = TERMINAL) -> bool:
        """Whether every call of the turn reached one of ``settled`` in time."""
        deadline = time.monotonic() + END_WITHIN_SECONDS
        while time.monotonic() < deadline:
            calls = self._calls(ids)
            if calls and all(c["state"] in settled for c in calls):
                return True
            time.sleep(0.25)
        return False

    def _check(
        self,
        ids: Ids,
        fault: Fault,
        submit_errors: list[CallgateError],
        ended: bool,
        result: CellResult,
    ) -> None:
        calls = self._calls(ids)
        runs = self._rows("SELECT tool, operation_id, note FROM faults.runs")
        effects = self._rows("SELECT tool, operation_id, note FROM faults.effects")
        result.evidence["calls"] = [
            f"{c['tool_name']}:{c['state']}{'/' + c['code'] if c['code'] else ''}"
            f" d={c['dispatches']}"
            for c in calls
        ]
        result.evidence["runs"] = len(runs)
        result.evidence["effects"] = [f"{e['tool']}:{e['operation_id'][-14:]}" for e in effects]
        if not calls and not submit_errors:
            result.broken.append("submit returned a turn, but no call of it is recorded")
        if not ended and calls:
            open_calls = [
                f"{c['tool_name']}={c['state']}" for c in calls if c["state"] not in TERMINAL
            ]
            result.broken.append(
                f"calls still open {END_WITHIN_SECONDS:.0f}s after the fault: {open_calls}"
            )
        by_op: dict[str, int] = {}
        by_note: dict[str, int] = {}
        for e in effects:
            by_op[e["operation_id"]] = by_op.get(e["operation_id"], 0) + 1
            by_note[e["note"]] = by_note.get(e["note"], 0) + 1
        for op, n in by_op.items():
            if n > 1:
                result.broken.append(f"{n} effects for operation {op}")
        for note, n in by_note.items():
            if n > 1 and by_op.get(note, 0) <= 1:
                result.broken.append(
                    f"{n} effects for one logical write ({note}) over "
                    f"{len({e['operation_id'] for e in effects if e['note'] == note})} operations"
                )
        ran = {r["operation_id"] for r in runs}
        applied = {e["operation_id"] for e in effects}
        for c in calls:
            where = f"{c['tool_name']} ({c['call_id']}, turn call {c['id']})"
            if c["state"] not in TERMINAL:
                continue
            if c["operation_id"] in applied and c["state"] != "succeeded":
                honest = c["code"] == "reconciliation_pending"
                if honest and (fault.kind == STALL or self.spec.handler_cannot_tell):
                    result.notes.append(f"{c['tool_name']}: applied, reconciliation_pending")
                else:
                    result.broken.append(
                        f"{where}: its write applied, but it ended {c['state']}/{c['code']}"
                    )
            if (
                c["operation_id"] not in ran
                and c["state"] == "failed_terminal"
                and c["code"] != "approval_denied"  # a person's verdict: its true outcome
            ):
                result.broken.append(
                    f"{where}: never ran, but ended failed_terminal/{c['code']} (failed for good)"
                )


# --- operator round trips: approve, reconcile, prune; and a whole Redis stalled ------------


@dataclass
class Op:
    """What an action needs of its cell."""

    cell: Cell
    env: dict[str, str]  # the processes' environment (through the proxies)
    producer: Producer
    ids: Ids
    fault: Fault
    result: CellResult

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``callgate ARGS`` as an operator runs it, its traffic through the proxies."""
        return subprocess.run(
            [sys.executable, "-m", "callgate", *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def arm(self) -> None:
        self.cell._proxy.arm(self.fault)

    def one(self, sql: str, *params: Any) -> dict[str, Any] | None:
        rows = self.cell._rows(sql, *params)
        return rows[0] if rows else None

    def count(self, sql: str, *params: Any) -> int:
        row = self.cell._rows(sql, *params)[0]
        return int(next(iter(row.values())))

    def unkeyed(self, ids: Ids | None = None) -> dict[str, Any]:
        ids = ids or self.ids
        (call,) = [c for c in self.cell._calls(ids) if c["call_id"] == ids.unkeyed_call]
        return call

    def wait_unkeyed(self, states: tuple[str, ...], ids: Ids | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + END_WITHIN_SECONDS
        while True:
            found = [c for c in self.cell._calls(ids or self.ids) if c["state"] in states]
            mine = [c for c in found if c["call_id"] == (ids or self.ids).unkeyed_call]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        call = self.unkeyed(ids)
        if call["state"] not in states:
            raise AssertionError(f"the unkeyed write is {call['state']}, not one of {states}")
        return call

    def shown(self, proc: subprocess.CompletedProcess[str]) -> str:
        return f"rc={proc.returncode} {(proc.stdout + proc.stderr).strip()[:300]}"


def _says_maybe(output: str) -> bool:
    """The command says its outcome is unknown (may have been recorded/applied)."""
    return (
        re.search(r"\b(may|might) have been (recorded|applied|removed|settled)", output) is not None
    )


def _approve(op: Op) -> None:
    """Approve the turn's parked write as an operator: once under the fault, then again
    (the operator's repeat). The decision is recorded once, the write runs once, the first
    command's error (if any) says the decision may be recorded when it is, and the repeat
    neither fails as if nothing happened nor resumes anything twice."""
    _decide(op, "approve")


def _deny(op: Op) -> None:
    """Deny it instead: recorded once, the write never runs and ends ``approval_denied``."""
    _decide(op, "deny")


def _decide(op: Op, verb: str) -> None:
    verdict, event = {"approve": ("approved", "approval_granted"),
                      "deny": ("denied", "approval_denied")}[verb]  # fmt: skip
    call = op.wait_unkeyed(("awaiting_approval",))
    row = op.one("SELECT approval_id FROM callgate.calls WHERE id = %s", call["id"])
    assert row is not None
    approval_id = str(row["approval_id"])
    who = ("approvals", verb, approval_id, "--by", APPROVER, "--tenant", "tenant-f")
    op.arm()
    first = op.cli(*who)
    op.fault.wait(5.0)
    decided = op.one(
        "SELECT state, decided_by FROM callgate.approvals WHERE approval_id = %s", approval_id
    )
    op.result.evidence[f"{verb}_1"] = op.shown(first)
    op.result.evidence["request_after_1"] = decided
    recorded = decided is not None and decided["state"] == verdict
    if first.returncode != 0 and recorded and not _says_maybe(first.stderr):
        op.result.broken.append(
            f"{verb} failed ({first.stderr.strip()[:160]!r}) without saying the decision may "
            "be recorded, but it is"
        )
    if first.returncode == 0 and not recorded:
        op.result.broken.append(f"{verb} succeeded, but the request is not {verdict}")
    told = re.search(r"(\d+) call\(s\)", first.stdout)
    if first.returncode == 0 and (told is None or int(told.group(1)) != 1):
        op.result.broken.append(
            f"{verb} said {first.stdout.strip()!r}, but it decided the one parked call"
        )
    second = op.cli(*who)
    op.result.evidence[f"{verb}_2"] = op.shown(second)
    if second.returncode != 0 and not re.search(rf"\bis {verdict}\b", second.stderr):
        op.result.broken.append(
            f"the repeated {verb} failed ({second.stderr.strip()[:160]!r}) without saying the "
            f"request is {verdict}"
        )
    op.cell._wait_ended(op.ids)
    decisions = op.count(
        "SELECT count(*) FROM callgate.trace_events WHERE call_ref = %s AND event = %s",
        call["id"],
        event,
    )
    runs = op.count(
        "SELECT count(*) FROM faults.runs WHERE operation_id = %s", call["operation_id"]
    )
    final = op.unkeyed()
    op.result.evidence["decision"] = {"events": decisions, "runs": runs, "call": final["state"]}
    if decisions != 1:
        op.result.broken.append(f"the request was {verdict} {decisions} times ({event} events)")
    expected = (
        (1, "succeeded", None) if verb == "approve" else (0, "failed_terminal", "approval_denied")
    )
    if (runs, final["state"], final["code"]) != expected:
        op.result.broken.append(
            f"the {verdict} write ran {runs} time(s) and ended {final['state']}/{final['code']}"
        )


def _reconcile(op: Op) -> None:
    """Resolve the turn's write that ended ``reconciliation_pending`` as an operator: once
    under the fault, then again. The operation is resolved once (one audit event), the
    first command's error says it may be resolved when it is, and the repeat is harmless."""
    call = op.wait_unkeyed(("failed_terminal",))
    operation = str(call["operation_id"])
    if call["code"] != "reconciliation_pending":
        op.result.broken.append(f"setup: the doubtful write ended {call['code']}")
        return
    who = ("reconcile", "resolve", operation, "--outcome", "succeeded", "--by", RECONCILER)
    op.arm()
    first = op.cli(*who)
    op.fault.wait(5.0)
    state = op.one(
        "SELECT state, result #>> '{error,code}' AS code FROM callgate.operations"
        " WHERE operation_id = %s",
        operation,
    )
    op.result.evidence["resolve_1"] = op.shown(first)
    op.result.evidence["operation_after_1"] = state
    resolved = state is not None and state["state"] == "succeeded"
    if first.returncode != 0 and resolved and not _says_maybe(first.stderr):
        op.result.broken.append(
            f"resolve failed ({first.stderr.strip()[:160]!r}) without saying the operation may "
            "be resolved, but it is"
        )
    second = op.cli(*who)
    op.result.evidence["resolve_2"] = op.shown(second)
    if second.returncode != 0 and not re.search(r"\bis succeeded\b", second.stderr):
        op.result.broken.append(
            f"the repeated resolve failed ({second.stderr.strip()[:160]!r}) without saying the "
            "operation is resolved"
        )
    audits = op.count(
        "SELECT count(*) FROM callgate.trace_events WHERE operation_id = %s"
        " AND event = 'reconciled'",
        operation,
    )
    final = op.one("SELECT state FROM callgate.operations WHERE operation_id = %s", operation)
    op.result.evidence["reconciled"] = {"audit_events": audits, "operation": final}
    if audits != 1 or final is None or final["state"] != "succeeded":
        op.result.broken.append(
            f"the operation was resolved {audits} time(s) and is {final and final['state']}"
        )


def _prune(op: Op) -> None:
    """Prune as an operator (``--older-than 1h``) under the fault, then again. History: this
    cell's turn A (its write parked for approval: open), an older finished turn B (its write
    in doubt: its operation awaits reconciliation) and a young finished turn C; A and B are
    made two hours old (their ``created_at`` moved back: the window is what is tested, not
    the clock). Only B's turn, calls, outbox and trace may go, never its operation awaiting
    reconciliation, nothing of A or C; the repeat removes all of B. Then A is approved
    and must still run to its end."""
    op.wait_unkeyed(("awaiting_approval",))
    older, young = Ids.new(), Ids.new()
    for ids, extra in ((older, {"doubt": True}), (young, {})):
        op.cell._submit(op.producer, ids, op.result, unkeyed_args=extra)
        if not op.cell._wait_ended(ids):
            op.result.broken.append(f"setup: turn {ids.tag} did not end")
            return
    b_op = str(op.unkeyed(older)["operation_id"])
    op.cell._rows(
        "UPDATE callgate.turns SET created_at = created_at - interval '2 hours'"
        " WHERE request_id IN (%s, %s) RETURNING 1",
        op.ids.request_id,
        older.request_id,
    )

    def rows(ids: Ids) -> dict[str, int]:
        turn = "(SELECT turn_id FROM callgate.turns WHERE request_id = %s)"
        return {
            "turns": op.count(
                "SELECT count(*) FROM callgate.turns WHERE request_id = %s", ids.request_id
            ),
            "calls": op.count(
                f"SELECT count(*) FROM callgate.calls WHERE turn_id IN {turn}", ids.request_id
            ),
            "outbox": op.count(
                f"SELECT count(*) FROM callgate.outbox WHERE turn_id IN {turn}", ids.request_id
            ),
            "trace": op.count(
                f"SELECT count(*) FROM callgate.trace_events WHERE turn_id IN {turn}",
                ids.request_id,
            ),
        }

    before = {"A": rows(op.ids), "B": rows(older), "C": rows(young)}
    op.arm()
    first = op.cli("prune", "--older-than", "1h", "--json")
    op.fault.wait(5.0)
    after_1 = {"A": rows(op.ids), "B": rows(older), "C": rows(young)}
    second = op.cli("prune", "--older-than", "1h", "--json")
    after_2 = {"A": rows(op.ids), "B": rows(older), "C": rows(young)}
    b_kept = op.count("SELECT count(*) FROM callgate.operations WHERE operation_id = %s", b_op)
    op.result.evidence["prune"] = {
        "before": before,
        "after_1": after_1,
        "after_2": after_2,
        "run_1": op.shown(first),
        "run_2": op.shown(second),
        "b_operation_kept": b_kept,
    }
    removed = before["B"]["turns"] - after_1["B"]["turns"]
    if first.returncode != 0 and removed and not _says_maybe(first.stderr):
        op.result.broken.append(
            f"prune failed ({first.stderr.strip()[:160]!r}) without saying rows may have been "
            f"removed, but it removed {removed} turn(s)"
        )
    if first.returncode == 0:
        told = json.loads(first.stdout)
        if told["turns"] < removed and not told.get("unknown_batches"):
            op.result.broken.append(
                f"prune said it removed {told['turns']} turn(s) (and no batch of unknown "
                f"outcome), but it removed {removed}"
            )
    for name, after in (("the faulted prune", after_1), ("the repeat", after_2)):
        for turn in ("A", "C"):
            if after[turn] != before[turn]:
                op.result.broken.append(
                    f"{name} removed rows of turn {turn} (open or young): "
                    f"{before[turn]} -> {after[turn]}"
                )
    if any(after_2["B"].values()):
        op.result.broken.append(f"the repeat left rows of the old finished turn: {after_2['B']}")
    if before["B"]["turns"] != 1 or before["B"]["calls"] != 3:
        op.result.broken.append(f"setup: turn B was not whole before the prune: {before['B']}")
    if b_kept != 1:
        op.result.broken.append("the prune removed an operation awaiting reconciliation")
    if second.returncode != 0:
        op.result.broken.append(f"the repeated prune failed: {second.stderr.strip()[:160]!r}")
    approval = op.one("SELECT approval_id FROM callgate.calls WHERE id = %s", op.unkeyed()["id"])
    assert approval is not None
    done = op.cli(
        "approvals", "approve", str(approval["approval_id"]), "--by", APPROVER,
        "--tenant", "tenant-f",
    )  # fmt: skip
    if done.returncode != 0:
        op.result.broken.append(f"after the prune, approving turn A failed: {op.shown(done)}")


def _redis_stall(op: Op) -> None:
    """The whole Redis stops answering (every connection held, none closed) for longer than
    the lease and the liveness TTL, from a worker's wait for a job, while that worker runs
    the keyed write (its handler holds past the stall). The worker's lease on it must stay
    renewed in Postgres throughout (no takeover: one run, one fence), and the worker,
    relayer and sweeper must go on once Redis answers: the turn ends and every result is
    published."""
    deadline = time.monotonic() + END_WITHIN_SECONDS
    keyed: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        keyed = next((c for c in op.cell._calls(op.ids) if c["call_id"] == op.ids.keyed_call), None)
        if keyed is not None and keyed["state"] == "started":
            break
        time.sleep(0.1)
    assert keyed is not None and keyed["state"] == "started", keyed
    op.arm()
    if not op.fault.wait(15.0):
        return
    lowest: float | None = None
    generations: set[int] = set()
    stalled_until = (op.fault.hit_at or time.monotonic()) + REDIS_STALL_SECONDS
    while time.monotonic() < stalled_until + 1.0:
        row = op.one(
            "SELECT generation, extract(epoch FROM lease_expires_at - now()) AS left"
            " FROM callgate.operations WHERE operation_id = %s",
            op.ids.keyed_op,
        )
        if row is not None and row["left"] is not None:
            left = float(row["left"])
            lowest = left if lowest is None else min(lowest, left)
            generations.add(int(row["generation"]))
        time.sleep(0.2)
    op.cell._wait_ended(op.ids)
    runs = op.count("SELECT count(*) FROM faults.runs WHERE operation_id = %s", op.ids.keyed_op)
    unpublished = op.count(
        "SELECT count(*) FROM callgate.outbox o JOIN callgate.turns t USING (turn_id)"
        " WHERE t.request_id = %s AND o.published_at IS NULL",
        op.ids.request_id,
    )
    op.result.evidence["redis_stall"] = {
        "stall_seconds": REDIS_STALL_SECONDS,
        "lowest_lease_left": None if lowest is None else round(lowest, 2),
        "generations": sorted(generations),
        "keyed_runs": runs,
        "unpublished_after": unpublished,
    }
    if lowest is None or lowest <= 0:
        op.result.broken.append(
            f"the keyed write's lease was not kept renewed while Redis stalled "
            f"(lowest time left {lowest})"
        )
    if len(generations) > 1 or runs != 1:
        op.result.broken.append(
            f"the keyed write was taken over (generations {sorted(generations)}, {runs} runs)"
        )
    if unpublished:
        op.result.broken.append(f"{unpublished} result(s) never published after Redis answered")
    if op.fault.kind != STALL:
        op.result.broken.append("this cell only stalls")


def _failover(op: Op) -> None:
    """The server becomes a promoted replica that had the turn but none of what followed:
    once every result is published, the turn's calls and operations are put back as they
    were before any worker took them, their outbox rows removed, and the recorded identity
    of the server's history changed (what callgate compares to notice a new history). The
    reconciliation, with the fault on one of its round trips, must end each call with exactly
    the result Redis already holds, run nothing again and leave the history reconciled."""
    if not op.cell._wait_ended(op.ids):
        op.result.broken.append("setup: the turn did not end before the failover")
        return
    turn = "(SELECT turn_id FROM callgate.turns WHERE request_id = %s)"
    deadline = time.monotonic() + END_WITHIN_SECONDS
    while (
        op.count(
            "SELECT count(*) FROM callgate.outbox"
            f" WHERE turn_id IN {turn} AND published_at IS NULL",
            op.ids.request_id,
        )
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    before = {c["call_id"]: (c["state"], c["code"]) for c in op.cell._calls(op.ids)}
    with psycopg.connect(libpq_url(op.cell.database_url)) as conn:
        conn.execute("SET LOCAL callgate.reconciling = 'on'")
        conn.execute(
            "UPDATE callgate.operations SET state = 'pending', result = NULL,"
            " owner_token = NULL, lease_expires_at = NULL, completed_at = NULL"
            " WHERE operation_id IN (SELECT operation_id FROM callgate.calls"
            f"  WHERE turn_id IN {turn} AND kind = 'write')",
            (op.ids.request_id,),
        )
        conn.execute(f"DELETE FROM callgate.outbox WHERE turn_id IN {turn}", (op.ids.request_id,))
        conn.execute(
            "UPDATE callgate.calls SET state = 'proposed', result = NULL, completed_at = NULL"
            f" WHERE turn_id IN {turn}",
            (op.ids.request_id,),
        )
        op.arm()
        conn.execute("UPDATE callgate.histories SET system_identifier = system_identifier + 1")
    if not op.fault.wait(END_WITHIN_SECONDS / 2):
        return
    op.cell._wait_ended(op.ids)
    deadline = time.monotonic() + END_WITHIN_SECONDS
    while (
        not op.count(
            "SELECT count(*) FROM callgate.histories WHERE epoch = 1 AND reconciled_at IS NOT NULL"
        )
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    after = {c["call_id"]: (c["state"], c["code"]) for c in op.cell._calls(op.ids)}
    history = op.one(
        "SELECT doubted, adopted, reconciled_at FROM callgate.histories WHERE epoch = 1"
    )
    runs = op.count(
        "SELECT count(*) FROM faults.runs WHERE operation_id IN (SELECT operation_id"
        f" FROM callgate.calls WHERE turn_id IN {turn})",
        op.ids.request_id,
    )
    streams = transport.connect(op.cell.redis_url)
    try:
        turns = [str(t["turn_id"]) for t in op.cell._turns(op.ids)]
        two = one_result_per_call(streams, op.env["CALLGATE_QUEUE"], turns)
    finally:
        streams.close()
    op.result.evidence["failover"] = {
        "before": before,
        "after": after,
        "history": history,
        "runs": runs,
    }
    if after != before:
        op.result.broken.append(f"the calls ended {after} after the failover, {before} before")
    if history is None or history["reconciled_at"] is None:
        op.result.broken.append(f"the new history was never reconciled: {history}")
    elif history["adopted"] != len(before):
        op.result.broken.append(
            f"{history['adopted']} result(s) adopted, {len(before)} published on the lost one"
        )
    if runs != len(before):
        op.result.broken.append(f"{runs} handler runs for {len(before)} calls: one ran again")
    op.result.broken.extend(two)


ACTIONS: dict[str, Callable[[Op], None]] = {
    "failover": _failover,
    "approve": _approve,
    "deny": _deny,
    "reconcile": _reconcile,
    "prune": _prune,
    "redis_stall": _redis_stall,
}
