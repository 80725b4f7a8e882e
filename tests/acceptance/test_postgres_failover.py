"""A failover to an asynchronous streaming replica, for real: a primary and a replica made
with ``pg_basebackup -R`` (tests/integration/replication.py), the replica stopped at a chosen
moment (the lag), the primary killed with ``pg_ctl stop -m immediate`` and the replica
promoted on the primary's port, under a worker, relayer and sweeper that keep running. Effects
are counted in a ledger on another server, which the failover does not touch.

Each row of the failover table: what the replica had when it was promoted. Whatever it
lacked, a write takes effect once (or ends ``reconciliation_pending`` when callgate cannot
know), a call has one terminal result on ``collect`` and on its stream, and no fencing token
repeats.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
from sqlalchemy import Engine, text

from callgate.core.errors import TurnLost
from callgate.core.settings import Settings
from callgate.ops.lab.replicated import Replicated
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db, migrate
from tests.acceptance.conftest import wait_until
from tests.faults import tools

pytestmark = pytest.mark.services

CONTEXT = {"tenant_id": "tenant-f", "user_id": "user-f", "roles": ["support"]}
FAST = {
    "CALLGATE_LEASE_SECONDS": "3",
    "CALLGATE_SWEEP_SECONDS": "0.2",
    "CALLGATE_STALE_SECONDS": "2",
    "CALLGATE_SUCCESSOR_GRACE_SECONDS": "1",
}
# Longer than a lease and a stale period: a call that were to run again would have by then.
SETTLE_SECONDS = 8.0


class World:
    def __init__(self, cluster: Replicated, ledger: Engine, env: dict[str, str], log: Path):
        self.cluster = cluster
        self.ledger = ledger
        self.env = env
        self.log = log
        self.stacks: list[Stack] = []
        self.redis = redis_lib.Redis.from_url(env["CALLGATE_REDIS_URL"])
        settings = Settings.from_env(env)
        self.producer = Producer(
            settings=settings,
            engine=db.create(cluster.url),
            redis_connection=transport.connect(env["CALLGATE_REDIS_URL"]),
            registry=tools.registry(),
        )

    def start(self, *, relayer: bool = True) -> Stack:
        s = Stack(env=self.env, workers=1, relayer=relayer, sweeper=True, log_path=str(self.log))
        s.__enter__()
        self.stacks.append(s)
        wait_for_workers(self.env["CALLGATE_REDIS_URL"], self.env["CALLGATE_QUEUE"], 1, stack=s)
        return s

    def submit(self, tool: str, *, operation_id: str | None = None, hold: float = 0.0) -> Any:
        turn = self.producer.submit(
            [
                {
                    "call_id": "c1",
                    "tool_name": tool,
                    "arguments": {"note": "n", "hold_seconds": hold},
                }
            ],
            {**CONTEXT, "request_id": f"r-{uuid.uuid4().hex[:8]}"},
            operation_ids={"c1": operation_id} if operation_id else None,
        )
        (call,) = turn.calls
        return turn.turn_id, call.operation_id

    def result(self, turn_id: str, timeout: float = 30.0) -> dict[str, Any]:
        done = self.producer.collect(turn_id, timeout=timeout)
        assert done.complete, (done, self.tail())
        (only,) = done.as_json()["results"]
        return dict(only)

    def on_primary(self, sql: str, **params: Any) -> Any:
        engine = db.create(self.cluster.url)
        try:
            with engine.connect() as conn:
                return conn.execute(text(sql), params).first()
        finally:
            engine.dispose()

    def effects(self, operation_id: str) -> int:
        with self.ledger.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM faults.effects WHERE operation_id = :o"),
                    {"o": operation_id},
                ).scalar_one()
            )

    def fences(self, operation_id: str) -> list[int]:
        with self.ledger.connect() as conn:
            rows = conn.execute(
                text("SELECT fence FROM faults.runs WHERE operation_id = :o ORDER BY id"),
                {"o": operation_id},
            ).all()
        return [int(r.fence) for r in rows]

    def published(self, turn_id: str) -> list[dict[str, Any]]:
        """Every distinct result on the turn's stream (a republish of one result is one)."""
        stream = transport.results_stream(self.env["CALLGATE_QUEUE"], turn_id)
        seen: dict[str, dict[str, Any]] = {}
        for _, fields in self.redis.xrange(stream):
            result = json.loads(fields[b"result"])
            seen[json.dumps(result, sort_keys=True)] = result
        return list(seen.values())

    def reconciled(self, epoch: int = 1) -> Any:
        """The history ``epoch`` once a sweeper has reconciled it."""

        def done() -> Any:
            try:
                row = self.on_primary(
                    "SELECT * FROM callgate.histories WHERE epoch = :e AND reconciled_at "
                    "IS NOT NULL",
                    e=epoch,
                )
            except Exception:  # the promoted server is still starting
                return None
            return row

        return wait_until(done, timeout=30, what=f"history {epoch} reconciled\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""

    def close(self) -> None:
        for s in self.stacks:
            s.stop()
        self.producer.close()
        self.redis.close()


@pytest.fixture
def world(
    make_own_database: Callable[[], str], redis_url: str, queue_name: str, tmp_path: Path
) -> Iterator[World]:
    ledger_url = make_own_database()
    tools.install(ledger_url)
    ledger = db.create(ledger_url)
    with Replicated() as cluster:
        engine = db.create(cluster.url)
        migrate.upgrade(engine)
        engine.dispose()
        cluster.replicate()
        env = {
            "CALLGATE_DATABASE_URL": cluster.url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
            "CALLGATE_TOOLS": "tests.faults.tools:registry",
            "CALLGATE_DOWNSTREAM_DATABASE_URL": ledger_url,
            **FAST,
        }
        w = World(cluster, ledger, env, tmp_path / "stack.log")
        try:
            yield w
        finally:
            w.close()
            ledger.dispose()


def _assert_one_result(w: World, turn_id: str, expected: dict[str, Any]) -> None:
    assert w.result(turn_id) == expected
    (published,) = w.published(turn_id)
    assert published["status"] == expected["status"]


def test_the_replica_had_the_turn_not_the_reservation(world: World) -> None:
    """The old primary ran and published the write; the replica had only the turn. The call
    keeps the result already published and the write does not run again."""
    turn_id, op = world.submit("fault_unkeyed")
    world.cluster.caught_up()
    world.cluster.freeze()
    world.start()
    before = world.result(turn_id)
    assert before["status"] == "succeeded" and world.effects(op) == 1

    world.cluster.fail_over()
    history = world.reconciled()
    assert (history.doubted, history.adopted) == (1, 1)
    time.sleep(SETTLE_SECONDS)

    _assert_one_result(world, turn_id, before)
    assert world.effects(op) == 1
    assert world.fences(op) == [1]


def test_nothing_published_a_keyed_write_is_sent_again_an_unkeyed_one_is_not(
    world: World,
) -> None:
    """The old primary ran both writes and recorded their results, but no relayer published
    them before it died; the replica had only the turns. The keyed write is sent again with
    its key (the downstream replays it: one effect) under a fencing token larger than the
    first; the unkeyed one cannot be known and ends reconciliation_pending, run once."""
    keyed_turn, keyed = world.submit("fault_keyed")
    unkeyed_turn, unkeyed = world.submit("fault_unkeyed")
    world.cluster.caught_up()
    world.cluster.freeze()
    s = world.start(relayer=False)
    wait_until(
        lambda: world.effects(keyed) == 1 and world.effects(unkeyed) == 1,
        what=f"both writes applied\n{world.tail()}",
    )
    wait_until(
        lambda: (
            world.on_primary(
                "SELECT count(*) AS n FROM callgate.calls WHERE completed_at IS NOT NULL"
            ).n
            == 2
        ),
        what="both calls ended on the old primary",
    )

    world.cluster.fail_over()
    s.start("relayer-after", ["relayer"])
    history = world.reconciled()
    assert (history.doubted, history.adopted) == (2, 0)

    keyed_result = world.result(keyed_turn)
    assert keyed_result["status"] == "succeeded", keyed_result
    assert keyed_result["data"]["content"]["replayed"] is True, keyed_result
    unkeyed_result = world.result(unkeyed_turn)
    assert unkeyed_result["status"] == "failed_terminal", unkeyed_result
    assert unkeyed_result["error"]["code"] == "reconciliation_pending"
    time.sleep(SETTLE_SECONDS)

    assert (world.effects(keyed), world.effects(unkeyed)) == (1, 1)
    assert world.fences(keyed) == [1, 2**32 + 1]  # never repeated, larger after the failover
    assert world.fences(unkeyed) == [1]
    for turn_id in (keyed_turn, unkeyed_turn):
        assert len(world.published(turn_id)) == 1


def test_the_replica_had_the_reservation_not_the_completion(world: World) -> None:
    """The replica had the call in progress; the old primary then completed and published it.
    The call ends once, with that result, and is not taken over after the lease."""
    world.start()
    turn_id, op = world.submit("fault_unkeyed", hold=6.0)
    wait_until(
        lambda: world.on_primary(
            "SELECT 1 FROM callgate.operations WHERE operation_id = :o AND state = 'in_progress'",
            o=op,
        ),
        what="the write reserved",
    )
    world.cluster.caught_up()
    world.cluster.freeze()
    before = world.result(turn_id)
    assert before["status"] == "succeeded"

    world.cluster.fail_over()
    history = world.reconciled()
    assert history.adopted == 1
    time.sleep(SETTLE_SECONDS)

    _assert_one_result(world, turn_id, before)
    assert world.effects(op) == 1
    assert world.fences(op) == [1]


def test_the_replica_lacked_the_turn(world: World) -> None:
    """A turn a submit returned, then lost: collect says so (turn_lost, naming its write), and
    a submit again under the same operation id is not run as new."""
    world.cluster.freeze()
    world.start()
    turn_id, op = world.submit("fault_unkeyed")
    assert world.result(turn_id)["status"] == "succeeded"

    world.cluster.fail_over()
    history = world.reconciled()
    assert history.adopted == 0
    with pytest.raises(TurnLost) as lost:
        world.producer.collect(turn_id, timeout=5)
    assert op in lost.value.message

    again, same_op = world.submit("fault_unkeyed", operation_id=op)
    assert same_op == op
    retried = world.result(again)
    assert retried["status"] == "failed_terminal", retried
    assert retried["error"]["code"] == "reconciliation_pending"
    time.sleep(SETTLE_SECONDS)
    assert world.effects(op) == 1
    assert world.fences(op) == [1]


def test_synchronous_replication_needs_no_reconciliation(world: World) -> None:
    """The control: with a synchronous standby nothing committed is lost, so the new history
    puts nothing in doubt and adopts nothing."""
    world.cluster.synchronous(True)
    world.start()
    turn_id, op = world.submit("fault_unkeyed")
    before = world.result(turn_id)
    assert before["status"] == "succeeded"
    wait_until(
        lambda: world.on_primary(
            "SELECT 1 FROM callgate.outbox WHERE turn_id = :t AND published_at IS NOT NULL",
            t=turn_id,
        ),
        what="the result marked published",
    )
    world.cluster.freeze()  # no write after this: a commit would wait for the standby forever

    world.cluster.fail_over()
    history = world.reconciled()
    assert (history.doubted, history.adopted) == (0, 0)
    time.sleep(SETTLE_SECONDS)

    _assert_one_result(world, turn_id, before)
    assert world.effects(op) == 1
    assert world.fences(op) == [1]
