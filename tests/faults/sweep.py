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

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.store import transport
from callgate.store.db import libpq_url
from callgate.store.errors import CallgateError
from callgate.store.settings import Settings
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


def _redis(command: str, args: Callable[[Ids], str] | None = None, nth: int = 1) -> Any:
    def build(kind: FaultKind, seconds: float, ids: Ids) -> Fault:
        return command_fault(
            kind, command, args=args(ids) if args else None, seconds=seconds, nth=nth
        )

    return build


def _take(kind: FaultKind, seconds: float, ids: Ids) -> Fault:
    return script_fault(kind, transport.TAKE_LUA, seconds=seconds, label="take script")


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
            "complete (keyed write)",
            "postgres",
            _pg(r"SET state = \$\d+,\s+result = CASE", WORKER, lambda ids: re.escape(ids.keyed_op)),
        ),
        RoundTripSpec(
            "complete (unkeyed write)",
            "postgres",
            _pg(
                r"SET state = \$\d+,\s+result = CASE", WORKER, lambda ids: re.escape(ids.unkeyed_op)
            ),
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
            "relay publish",
            "redis",
            _redis("XADD", lambda ids: re.escape(ids.unkeyed_call)),
        ),
        RoundTripSpec(
            "relay mark", "postgres", _pg(r"UPDATE callgate\.outbox SET published_at", RELAYER)
        ),
    ]
}

# Cells expected to hold on today's code, run by default (the rest under -m slow).
FAST = (
    ("reserve (keyed write)", LOSE_REPLY),
    ("complete (keyed write)", LOSE_REPLY),
    ("relay publish", LOSE_REPLY),
    ("relay mark", CUT),
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
            (self.pg if self.spec.server == "postgres" else self.redis).arm(fault)
            submit_errors = self._submit(producer, ids, result)
            if self.spec.stack_after_submit:
                self._start(stack, queue)
            if self.spec.late_worker:
                # Redis loses the queued jobs (as a flush of that key would): only a lost
                # job is dispatched again.
                lose = transport.connect(self.redis_url)
                try:
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
        return result

    def _start(self, stack: Stack, queue: str) -> None:
        stack.__enter__()
        if stack.workers:
            wait_for_workers(self.redis_url, queue, stack.workers)

    def _proposals(self, ids: Ids) -> list[dict[str, Any]]:
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
                "arguments": {"note": ids.unkeyed_note},
            },
        ]

    def _submit(self, producer: Producer, ids: Ids, result: CellResult) -> list[CallgateError]:
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
                    self._proposals(ids),
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

    def _wait_ended(self, ids: Ids) -> bool:
        deadline = time.monotonic() + END_WITHIN_SECONDS
        while time.monotonic() < deadline:
            calls = self._calls(ids)
            if calls and all(c["state"] in TERMINAL for c in calls):
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
            if c["operation_id"] not in ran and c["state"] == "failed_terminal":
                result.broken.append(
                    f"{where}: never ran, but ended failed_terminal/{c['code']} (failed for good)"
                )
