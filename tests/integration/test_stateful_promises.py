"""The two promises under interleavings: a Hypothesis state machine drives the store's own
guarantee functions (record, reserve, renew, complete alone and in batches, reuse, the
sweeper) on one database, with owners that die (stop renewing: their lease really expires)
and wire faults on the statements (tests/faults: a cut before send, a lost reply, refused
connects). After every step it checks, from the database's own rows:

- every ended call has exactly one terminal result (its result and one outbox row), and an
  open call none;
- at most one effect per operation;
- a call whose write applied never ends as if it had not (``succeeded``, or
  ``reconciliation_pending`` when its owner died: "may have applied"). The effect belongs to
  the call whose owner applied it: two calls may share an operation (the application's retry
  under its id), and one that ended ``failed_retryable`` before the other applied told the
  truth;
- no call that nobody ever took ends ``delivery_exhausted`` (a backlog ends nothing).

Effects are rows in the downstream's table written by the owner's "handler" (a step), so
they are counted, never inferred. 25 examples in the default run, 200 under ``-m slow``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import Engine

from callgate.core.types import CallContext, ProposedCall
from callgate.daemons import sweeper
from callgate.queue import transport
from callgate.store import completions, db, reservations, turns
from tests.faults import tools
from tests.faults.core import CUT, LOSE_REPLY, REFUSE
from tests.faults.pgproxy import PgProxy, sql_fault

LEASE = 0.4
APP = "stateful-store"
CONTEXT = CallContext(request_id="req-sm", tenant_id="tenant-s", user_id="user-s", roles=("w",))
TERMINAL = ("succeeded", "failed_retryable", "failed_terminal")
PICK = st.integers(min_value=0, max_value=1_000)  # an index into whatever exists then
STATEMENTS = {
    "reserve": r"reserved_from = state",
    "complete": r"SET state = (?:w\.op_state|\$\d+,\s+result = CASE)",
    "renew": r"FOR UPDATE OF o",
    "record": r"^\s*COMMIT\b",
}


@dataclass
class Owner:
    """A worker's delivery holding a lease."""

    call: uuid.UUID
    lease: reservations.Lease
    # When the lease runs out by this worker's own clock (its last renewal + the lease):
    # a worker runs the handler only before it (``ctx.lease_lost``).
    deadline: float = 0.0
    applied: bool = False
    alive: bool = True


@dataclass
class World:
    direct: Engine  # for the checks: never through the proxy
    store: Engine  # the store's statements: through the proxy
    proxy: PgProxy
    queue: Any
    database_url: str
    stale_seconds: float
    # Errors that left a store function (by type), for the report: a transient failure that
    # escaped its retry shows up here.
    escapes: dict[str, int] = field(default_factory=dict)

    def escaped(self, exc: BaseException) -> None:
        name = f"{type(exc).__module__}.{type(exc).__name__}"
        self.escapes[name] = self.escapes.get(name, 0) + 1


def _checks(
    conn: psycopg.Connection[Any],
    refs: list[uuid.UUID],
    taken: set[uuid.UUID],
    applied: set[uuid.UUID],
) -> None:
    rows = conn.execute(
        "SELECT c.id, c.state, c.operation_id, c.result IS NOT NULL AS has_result,"
        "       c.result #>> '{error,code}' AS code,"
        "       (SELECT count(*) FROM callgate.outbox o WHERE o.call_ref = c.id) AS outboxed,"
        "       (SELECT count(*) FROM faults.effects e"
        "         WHERE e.operation_id = c.operation_id) AS effects"
        "  FROM callgate.calls c WHERE c.id = ANY(%s)",
        (refs,),
    ).fetchall()
    for ref, state, op, has_result, code, outboxed, effects in rows:
        what = f"call {ref} (operation {op}) is {state}/{code}"
        assert effects <= 1, f"{what}: {effects} effects for one operation"
        if state in TERMINAL:
            assert has_result and outboxed == 1, (
                f"{what}: an ended call needs exactly one terminal result; "
                f"result={has_result}, outbox rows={outboxed}"
            )
            if ref in applied:
                assert state == "succeeded" or code == "reconciliation_pending", (
                    f"{what}: its write applied, but it ended as if it had not"
                )
            if code == "delivery_exhausted":
                assert ref in taken, f"{what}: nobody ever took it, yet it ended by a backlog"
        else:
            assert outboxed == 0, f"{what}: open, but has {outboxed} published results"


def machine(world: World) -> type[RuleBasedStateMachine]:
    class Promises(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[uuid.UUID] = []
            self.turn_of: dict[uuid.UUID, uuid.UUID] = {}
            self.op_of: dict[uuid.UUID, str] = {}
            self.ops: list[str] = []
            self.owners: list[Owner] = []
            self.taken: set[uuid.UUID] = set()
            self.applied: set[uuid.UUID] = set()  # calls whose owner's handler applied
            world.proxy.disarm()

        def teardown(self) -> None:
            world.proxy.disarm()

        # --- the producer ---------------------------------------------------------------
        @rule(reuse=st.booleans())
        def submit(self, reuse: bool) -> None:
            op = self.ops[-1] if reuse and self.ops else f"op-{uuid.uuid4().hex[:12]}"
            ref = uuid.uuid4()
            planned = turns.PlannedCall(
                ref=ref,
                proposal=ProposedCall(call_id="c1", tool_name="fault_unkeyed", arguments={}),
                kind="write",
                operation_id=op,
                idempotency_key=f"key-{op}",
                after=None,
            )
            try:
                turn_id, _ = turns.record(world.store, CONTEXT, [planned])
            except Exception:
                return  # a fault on the submit: the application learns it failed
            self.turn_of[ref] = turn_id
            self.op_of[ref] = op
            self.calls.append(ref)
            if op not in self.ops:
                self.ops.append(op)

        # --- a worker's delivery ------------------------------------------------------------
        @rule(pick=PICK)
        def take(self, pick: int) -> None:
            if not self.calls:
                return
            ref = self.calls[pick % len(self.calls)]
            self.taken.add(ref)
            op = self.op_of[ref]
            token = uuid.uuid4()
            intent = f"intent-{op}"
            started = time.monotonic()
            try:
                got = reservations.reserve(
                    world.store,
                    operation_id=op,
                    call_ref=ref,
                    turn_id=self.turn_of[ref],
                    owner_token=token,
                    intent_hash=intent,
                    lease_seconds=LEASE,
                )
            except Exception as exc:
                # The delivery failed: the call stays open, the sweeper's to redo.
                world.escaped(exc)
                return
            if isinstance(got, reservations.Reserved):
                lease = reservations.Lease(op, token, got.generation, intent)
                owner = Owner(ref, lease, deadline=started + LEASE)
                self.owners.append(owner)
                if got.takeover:
                    # The previous owner may have applied: an unkeyed write is not repeated.
                    self._complete(owner, "failed_terminal", {"code": "reconciliation_pending"})
            elif got.reason == "done":
                with contextlib.suppress(Exception):
                    reservations.reuse(world.store, call_ref=ref, intent_hash=intent)

        def _live(self) -> list[Owner]:
            return [o for o in self.owners if o.alive]

        @rule(pick=PICK)
        def apply_effect(self, pick: int) -> None:
            """The handler runs: its downstream applies the write (counted in its table)."""
            running = [o for o in self._live() if not o.applied]
            if not running:
                return
            owner = running[pick % len(running)]
            if time.monotonic() > owner.deadline - 0.05:
                owner.alive = False  # it knows its lease ran out: it stops
                return
            with world.direct.begin() as conn:
                conn.exec_driver_sql(
                    "INSERT INTO faults.effects (tool, operation_id, note)"
                    " VALUES ('fault_unkeyed', %(op)s, 'sm')",
                    {"op": owner.lease.operation_id},
                )
            owner.applied = True
            self.applied.add(owner.call)

        def _complete(self, owner: Owner, status: str, payload: dict[str, Any]) -> None:
            try:
                completions.complete(world.store, owner.lease, status=status, payload=payload)
            except Exception:
                return  # out of retries: the owner keeps its lease until it expires
            owner.alive = False

        @rule(pick=PICK, outcome=st.sampled_from(["succeeded", "failed_retryable"]))
        def complete(self, pick: int, outcome: str) -> None:
            live = self._live()
            if not live:
                return
            owner = live[pick % len(live)]
            if owner.applied:
                self._complete(owner, "succeeded", {"ok": True})
            elif outcome == "failed_retryable":
                self._complete(owner, "failed_retryable", {"code": "upstream_unavailable"})

        @rule(picks=st.lists(PICK, min_size=2, max_size=4))
        def complete_together(self, picks: list[int]) -> None:
            """Owners finishing together: one batch, each row fenced on its own lease (a
            worker's group commit), stale owners included."""
            live = self._live()
            if not live:
                return
            chosen = {id(o): o for o in (live[p % len(live)] for p in picks)}.values()
            batch = [
                (
                    o,
                    completions.completion(o.lease, "succeeded", {"ok": True})
                    if o.applied
                    else completions.completion(
                        o.lease, "failed_retryable", {"code": "upstream_unavailable"}
                    ),
                )
                for o in chosen
            ]
            try:
                completions.complete_many(world.store, [c for _, c in batch])
            except Exception:
                return  # out of retries: each owner keeps its lease until it expires
            for o, _ in batch:
                o.alive = False

        @rule()
        def renew(self) -> None:
            live = self._live()
            if not live:
                return
            started = time.monotonic()
            try:
                with db.raw_autocommit(world.store) as conn:
                    held = reservations.renew_many(conn, [(o.lease, LEASE) for o in live])
            except Exception:
                return
            for o in live:
                lease = o.lease
                key = (lease.operation_id, lease.owner_token, lease.generation)
                if key in held.renewed:
                    o.deadline = started + LEASE
                elif key not in held.busy:
                    o.alive = False  # lost its lease: a worker stops counting on it

        @rule(pick=PICK)
        def die(self, pick: int) -> None:
            """The owner's process dies: it never renews nor completes again."""
            live = self._live()
            if live:
                live[pick % len(live)].alive = False

        @rule()
        def time_passes(self) -> None:
            time.sleep(LEASE + 0.1)  # every lease not renewed meanwhile expires for real

        @rule(rounds=st.integers(min_value=1, max_value=4))
        def sweep(self, rounds: int) -> None:
            """The sweeper runs ``rounds`` times, a stale window apart (at most 0.1 s)."""
            for n in range(rounds):
                if n:
                    time.sleep(min(world.stale_seconds, 0.1))
                with contextlib.suppress(Exception):
                    sweeper.sweep_once(
                        world.store,
                        world.queue,
                        stale_seconds=world.stale_seconds,
                        job_timeout=60,
                        max_dispatches=3,
                    )

        @rule(
            kind=st.sampled_from([CUT, LOSE_REPLY, REFUSE]),
            statement=st.sampled_from(sorted(STATEMENTS)),
        )
        def fault(self, kind: str, statement: str) -> None:
            world.proxy.disarm()
            world.proxy.arm(
                sql_fault(kind, STATEMENTS[statement], application=APP, seconds=0.3)  # type: ignore[arg-type]
            )

        @invariant()
        def promises_hold(self) -> None:
            if not self.calls:
                return
            with psycopg.connect(db.libpq_url(world.database_url), autocommit=True) as conn:
                _checks(conn, self.calls, self.taken, self.applied)

    return Promises


@pytest.fixture
def world_factory(
    make_own_database: Callable[[], str], redis_url: str, pg_proxy: PgProxy
) -> Iterator[Callable[[float], World]]:
    made: list[World] = []
    connection = redis.Redis.from_url(redis_url)

    def make(stale_seconds: float) -> World:
        url = make_own_database()
        tools.install(url)
        queue = transport.job_queue(connection, f"sm-{uuid.uuid4().hex[:8]}")
        w = World(
            direct=db.create(url),
            store=db.create(pg_proxy.url(url), application_name=APP),
            proxy=pg_proxy,
            queue=queue,
            database_url=url,
            stale_seconds=stale_seconds,
        )
        made.append(w)
        return w

    yield make
    for w in made:
        w.queue.empty()
        w.direct.dispose()
        w.store.dispose()


def _settings(request: pytest.FixtureRequest) -> settings:
    slow = request.node.get_closest_marker("slow") is not None
    return settings(
        max_examples=200 if slow else 25,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=not slow,
        database=None,
    )


def _run(world: World, request: pytest.FixtureRequest) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    try:
        run_state_machine_as_test(machine(world), settings=_settings(request))
    finally:
        print(f"store errors that escaped a delivery: {world.escapes}")


# A stale window longer than any example: the sweeper acts only on expired leases and on
# calls out of dispatches, as in production where a turn takes far less than a minute.
@pytest.mark.timeout(900)
def test_promises_hold_across_interleavings(
    world_factory: Callable[[float], World], request: pytest.FixtureRequest
) -> None:
    _run(world_factory(600.0), request)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_promises_hold_across_interleavings_at_length(
    world_factory: Callable[[float], World], request: pytest.FixtureRequest
) -> None:
    _run(world_factory(600.0), request)


# A stale window shorter than the steps: untaken calls look like a backlog to the sweeper.
@pytest.mark.timeout(900)
def test_a_backlog_never_ends_a_call(
    world_factory: Callable[[float], World], request: pytest.FixtureRequest
) -> None:
    _run(world_factory(0.05), request)
