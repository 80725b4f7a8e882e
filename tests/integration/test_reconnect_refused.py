"""A worker whose PostgreSQL connections are refused, for real, in the middle of a call.

The worker runs in this process (its consumer, executor and heartbeat as ``callgate worker``
runs them) with its engine behind a Postgres proxy (tests/faults/pgproxy.py) that the call's own
tool shuts at a chosen moment: a refused connect and every session cut, as a PostgreSQL
restart does. The proxy listens again after a few seconds. What is counted: handler invocations,
downstream rows, the call's and operation's rows; never a returned value.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, create_engine, text

from callgate.core.errors import ServiceUnavailable
from callgate.core.settings import Settings
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db
from callgate.tools.registry import READ_ONLY, ExecutionContext, Facts, Principal, Registry, Tool
from callgate.worker.consumer import Consumer
from callgate.worker.runtime import Runtime
from tests.faults.pgproxy import PgProxy

CONTEXT = {"request_id": "r", "tenant_id": "tenant-a", "user_id": "user-17", "roles": ["support"]}


class TokenArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    token: str


@dataclass
class Hooks:
    """What the tools do besides their work; each hook fires once."""

    invocations: list[str] = field(default_factory=list)
    before_reserve: Callable[[], None] | None = None  # from the status lookup
    after_effect: Callable[[], None] | None = None

    def fire(self, name: str) -> None:
        hook = getattr(self, name)
        setattr(self, name, None)
        if hook is not None:
            hook()


def _registry(hooks: Hooks, effects: Engine) -> Registry:
    def resolve(args: Any, principal: Principal) -> Facts:
        # Runs after the call is loaded and just before it is reserved.
        hooks.fire("before_reserve")
        return Facts()

    def probe(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        hooks.invocations.append(args.token)
        return {"token": args.token}

    def note(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        hooks.invocations.append(args.token)
        # The write's downstream is reached directly, not through the proxy: it applies.
        with effects.begin() as conn:
            conn.execute(
                text("INSERT INTO public.door_effects (token) VALUES (:t)"), {"t": args.token}
            )
        hooks.fire("after_effect")
        return {"token": args.token}

    tools = [
        Tool("probe", "A read.", TokenArgs, "read", probe, effect=READ_ONLY, resolve=resolve),
        # A write nothing downstream deduplicates and without a status lookup: a takeover
        # could only end it reconciliation_pending, so only its own completion can tell.
        Tool("note", "An un-keyed write.", TokenArgs, "write", note),
    ]
    return Registry.of(tools, {"support": ["probe", "note"]})


@dataclass
class World:
    pg: PgProxy
    direct: Engine
    producer: Producer
    hooks: Hooks

    def submit(self, tool: str) -> tuple[str, str]:
        token = uuid.uuid4().hex
        turn = self.producer.submit(
            [{"call_id": "c1", "tool_name": tool, "arguments": {"token": token}}], CONTEXT
        )
        return str(turn.calls[0].ref), token

    def wait_ended(self, ref: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            row = self.row(ref)
            if row["state"] not in ("proposed", "started") or time.monotonic() > deadline:
                return row
            time.sleep(0.05)

    def row(self, ref: str) -> dict[str, Any]:
        with self.direct.connect() as conn:
            return dict(
                conn.execute(
                    text(
                        "SELECT c.state, c.result #>> '{error,code}' AS code,"
                        " o.state AS op_state, o.generation, o.result #>> '{error,code}'"
                        " AS op_code FROM callgate.calls c JOIN callgate.operations o"
                        " USING (operation_id) WHERE c.id = :r"
                    ),
                    {"r": ref},
                )
                .mappings()
                .one()
            )

    def effects(self, token: str) -> int:
        with self.direct.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM public.door_effects WHERE token = :t"),
                    {"t": token},
                ).scalar_one()
            )


def _settings(database_url: str, redis_url: str, queue_name: str, **extra: str) -> Settings:
    return Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
            **extra,
        }
    )


@contextmanager
def _worker(
    settings: Settings, registry: Registry, direct: Engine, pg_proxy: PgProxy, concurrency: int
) -> Iterator[Producer]:
    """A consumer of ``concurrency`` in this process, its engine behind the proxy; a producer
    reaching PostgreSQL directly. On exit the proxy listens again and the consumer stops."""
    connection = transport.connect(settings.require_redis())
    producer = Producer(
        settings=settings, engine=direct, redis_connection=connection, registry=registry
    )
    behind = db.create(
        pg_proxy.url(settings.require_database()),
        pool_size=3,
        max_overflow=0,
        application_name="door-worker",
    )
    rt = Runtime(
        settings=settings,
        engine=behind,
        redis=redis.Redis.from_url(settings.require_redis()),
        queue=transport.job_queue(connection, settings.queue),
        registry=registry,
    )
    consumer = Consumer(rt, concurrency=concurrency, grace_seconds=5)
    worker = threading.Thread(target=consumer.run, daemon=True)
    worker.start()
    try:
        yield producer
    finally:
        pg_proxy.open()
        consumer.stop()
        worker.join(30)
        behind.dispose()


@pytest.fixture
def world(database_url: str, redis_url: str, queue_name: str, pg_proxy: PgProxy) -> Iterator[World]:
    settings = _settings(database_url, redis_url, queue_name)
    direct = db.create(database_url)
    with direct.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS public.door_effects (token text NOT NULL)"))
    hooks = Hooks()
    registry = _registry(hooks, direct)
    try:
        with _worker(settings, registry, direct, pg_proxy, concurrency=2) as producer:
            yield World(pg_proxy, direct, producer, hooks)
    finally:
        direct.dispose()


def test_a_reserve_that_meets_a_refused_connect_is_retried_and_runs_once(world: World) -> None:
    accepted: list[int] = []

    def restart() -> None:
        accepted.append(world.pg.connections)
        world.pg.shut_for(2.0, cut=True)

    world.hooks.before_reserve = restart
    ref, token = world.submit("probe")
    row = world.wait_ended(ref, timeout=30)
    assert (row["state"], row["code"]) == ("succeeded", None), row
    assert world.hooks.invocations == [token]
    assert accepted, "the proxy never refused"
    assert world.pg.connections > accepted[0]  # the reservation had to reconnect


def test_one_connect_turned_away_before_the_reserve_does_not_end_the_call(world: World) -> None:
    """One failed connect (the server turns it away, then serves again), met by the
    reservation after its pooled connection was cut: retried, not taken for a gate bug (which
    ended a call that never ran ``failed_terminal execution_failed``)."""
    world.hooks.before_reserve = lambda: world.pg.reset_next(1, cut=True)
    ref, token = world.submit("probe")
    row = world.wait_ended(ref, timeout=30)
    assert (row["state"], row["code"]) == ("succeeded", None), row
    assert world.hooks.invocations == [token]
    assert world.pg.reset == 1  # the reservation did meet the failed connect


def test_a_completion_that_meets_a_restart_stores_the_result_it_holds(world: World) -> None:
    """The write applied; PostgreSQL is down for 4 s as the worker completes it. The
    completion's retries ride the outage out: succeeded, one effect, no takeover."""
    world.hooks.after_effect = lambda: world.pg.shut_for(4.0, cut=True)
    ref, token = world.submit("note")
    row = world.wait_ended(ref, timeout=40)
    assert world.effects(token) == 1
    assert world.hooks.invocations == [token]
    assert (row["state"], row["code"], row["op_state"], row["op_code"]) == (
        "succeeded",
        None,
        "succeeded",
        None,
    ), row
    assert row["generation"] == 1  # completed by its owner, not by a takeover


def test_a_refusal_longer_than_the_retry_budget_delivers_the_call_again(world: World) -> None:
    """Refused for 13 s (past one statement's 10 s of retries) before the reservation: the
    worker delivers the call again itself; a call that never ran never ends failed."""
    world.hooks.before_reserve = lambda: world.pg.shut_for(13.0, cut=True)
    ref, token = world.submit("probe")
    row = world.wait_ended(ref, timeout=60)
    assert (row["state"], row["code"]) == ("succeeded", None), row
    assert world.hooks.invocations == [token]


def test_a_completion_outlasts_an_outage_longer_than_one_statements_retries(
    world: World,
) -> None:
    """Down 13 s (past the 10 s a statement is retried, inside the 30 s lease) as the worker
    completes an applied write: the completion keeps its result and stores it itself."""
    world.hooks.after_effect = lambda: world.pg.shut_for(13.0, cut=True)
    ref, token = world.submit("note")
    row = world.wait_ended(ref, timeout=60)
    assert world.effects(token) == 1
    assert world.hooks.invocations == [token]
    assert (row["state"], row["op_state"], row["op_code"], row["generation"]) == (
        "succeeded",
        "succeeded",
        None,
        1,
    ), row


def test_every_way_to_a_connection_names_a_refused_connect_an_outage(
    database_url: str, pg_proxy: PgProxy
) -> None:
    """The worker's pooled driver connections (load, reserve, renew, complete), SQLAlchemy's
    (sweeper, relayer, producer, API) and a transaction (submit, relayer claim): a refused
    connect is transient (retried, then delivered again) and reads as ``database_unavailable``,
    never as the driver's raw error a retry gives up on."""
    engine = db.create(pg_proxy.url(database_url))
    try:
        pg_proxy.shut_for(3600)
        ways: dict[str, Callable[[], Any]] = {
            "raw_autocommit": lambda: db.raw_autocommit(engine).__enter__(),
            "autocommit": lambda: db.autocommit(engine).__enter__(),
            "begin": lambda: engine.begin().__enter__(),
        }
        for name, way in ways.items():
            with pytest.raises(Exception) as caught:
                way()
            assert db.is_transient(caught.value), (name, caught.value)
            with pytest.raises(ServiceUnavailable), db.translate_errors(name):
                way()
    finally:
        engine.dispose()


def test_no_free_pooled_connection_is_an_outage_not_a_bug(database_url: str) -> None:
    """Every pooled connection busy past the pool's timeout: the call never ran, so the worker
    must deliver it again rather than end it as if its gate had failed."""
    engine = create_engine(
        db.sqlalchemy_url(database_url), pool_size=1, max_overflow=0, pool_timeout=0.2
    )
    try:
        with (
            db.raw_autocommit(engine),
            pytest.raises(Exception) as caught,
            db.raw_autocommit(engine),
        ):
            pass
        assert db.is_transient(caught.value), caught.value
    finally:
        engine.dispose()


class HoldArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    token: str
    hold: float


def test_a_read_delivered_again_after_an_outage_waits_for_a_slot(
    database_url: str, redis_url: str, queue_name: str, pg_proxy: PgProxy
) -> None:
    """K = 1. Read A's handler returns as PostgreSQL goes away for 13 s: its slot goes to
    read B with its ending, the ending's retries run out (10 s), and the worker delivers A
    again. B holds the slot until its handler is done; A's second run waits for it.
    (Without the wait, A's second run overlapped B's: two handlers at K = 1.)"""
    runs: list[tuple[str, float, float]] = []  # (token, started, ended), monotonic
    shut: list[Callable[[], None]] = []

    def probe(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        started = time.monotonic()
        time.sleep(args.hold)
        if shut:
            shut.pop()()
        runs.append((args.token, started, time.monotonic()))
        return {"token": args.token}

    tool = Tool("probe", "A read.", HoldArgs, "read", probe, effect=READ_ONLY)
    registry = Registry.of([tool], {"support": ["probe"]})
    # An ending is retried for a lease, and at least for a statement's 10 s.
    settings = _settings(database_url, redis_url, queue_name, CALLGATE_LEASE_SECONDS="2")
    direct = db.create(database_url)
    down = threading.Event()

    def restart() -> None:
        pg_proxy.shut_for(13.0, cut=True)
        down.set()

    def state(ref: str) -> str:
        with direct.connect() as conn:
            return str(
                conn.execute(
                    text("SELECT state FROM callgate.calls WHERE id = :r"), {"r": ref}
                ).scalar_one()
            )

    try:
        with _worker(settings, registry, direct, pg_proxy, concurrency=1) as producer:

            def submit(token: str, hold: float) -> str:
                arguments = {"token": token, "hold": hold}
                turn = producer.submit(
                    [{"call_id": "c1", "tool_name": "probe", "arguments": arguments}], CONTEXT
                )
                return str(turn.calls[0].ref)

            shut.append(restart)
            a = submit("A", 0.2)
            assert down.wait(10), "read A never ran"
            b = submit("B", 5.0)  # taken into A's slot while A's ending meets the outage
            deadline = time.monotonic() + 60
            while {state(a), state(b)} != {"succeeded"} and time.monotonic() < deadline:
                time.sleep(0.1)
            assert (state(a), state(b)) == ("succeeded", "succeeded")
    finally:
        direct.dispose()
    tokens = [token for token, _, _ in runs]
    assert sorted(tokens) == ["A", "A", "B"], runs  # A was delivered again, once
    ordered = sorted(runs, key=lambda r: r[1])
    for (_, _, ended), (_, started, _) in itertools.pairwise(ordered):
        assert started >= ended, ordered  # never two handlers at once
