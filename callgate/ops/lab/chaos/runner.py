"""Runs one scenario: a fresh database and queue, real worker, relayer and sweeper
processes, the workload through ``Producer``, the faults at their points, a recovery window,
then the invariants from the database."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Engine, create_engine, text

from callgate.core.errors import CallgateError
from callgate.core.settings import Settings
from callgate.ops.lab.chaos import faults, invariants, tools
from callgate.ops.lab.chaos.faults import Call, Live, PlannedFault, PointNotReached
from callgate.ops.lab.chaos.scenario import Scenario, StackSpec
from callgate.ops.lab.chaos.services import (
    Services,
    copy_history,
    database_name,
    redis_binary,
)
from callgate.ops.lab.replicated import Replicated, server_programs
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db, migrate

CONTEXT = {"tenant_id": "tenant-a", "user_id": "user-17", "roles": ["support"]}
FAN_IN_SECONDS = 10.0
SETTLE_SECONDS = 1.0


@dataclass
class Report:
    """One scenario's row: what was injected, what the database shows, the verdict.

    ``violations`` are broken promises (a write applied twice, a call without exactly one
    result, a call left open, fan-in incomplete, a fault that could not be injected);
    ``unexpected`` are outcomes or counts the scenario did not expect. Either fails it.
    """

    name: str
    summary: str
    verdict: str  # pass | fail | not applicable
    faults: list[dict[str, Any]] = field(default_factory=list)
    schedule: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    recovery_seconds: float | None = None
    violations: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0
    log: str | None = None

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.name,
            "summary": self.summary,
            "verdict": self.verdict,
            "reason": self.reason,
            "faults_injected": self.faults,
            "schedule": self.schedule,
            "counts": self.counts,
            "outcomes": self.outcomes,
            "recovery_seconds": self.recovery_seconds,
            "violations": self.violations,
            "unexpected": self.unexpected,
            "elapsed_seconds": round(self.seconds, 1),
            "log": self.log,
        }


def scenario_rng(seed: int, name: str) -> random.Random:
    """The fault schedule's randomness: the same seed and scenario replay the same draws."""
    return random.Random(f"callgate-chaos:{seed}:{name}")


def not_applicable(scenario: Scenario, services: Services) -> str | None:
    if scenario.stack.own_postgres and services.postgres is None:
        return "needs a PostgreSQL the runner owns (embedded: leave CALLGATE_DATABASE_URL unset)"
    if scenario.stack.own_redis and redis_binary() is None:
        return "needs a redis-server binary the runner can start"
    if scenario.stack.replicated and server_programs() is None:
        return (
            "needs PostgreSQL's server programs (initdb, pg_ctl, pg_basebackup) for a "
            "primary and replica of its own: the postgresql package, or the demo extra"
        )
    return None


def control_engine(url: str) -> Engine:
    """The runner's own connections: pre-pinged (they outlive restarts), never terminated."""
    return create_engine(
        db.sqlalchemy_url(url),
        pool_size=2,
        pool_pre_ping=True,
        connect_args={"application_name": faults.CONTROL_APP, "connect_timeout": 5},
    )


def prepare_live(
    services: Services,
    name: str,
    spec: StackSpec,
    log_dir: Path | None,
    *,
    own_redis: bool,
    own_postgres: bool = True,
) -> Live:
    """The stack (not started yet), producer and control connection of one scenario run,
    on its own database (and its own redis-server when ``own_redis`` and the runner may
    start one)."""
    database_url = services.database(name)
    pair = replicated_store(name) if spec.replicated else None
    ledger_url = database_url
    if pair is not None:
        database_url = pair.url
    owned = services.owned_redis() if own_redis else None
    redis_url = owned.url if owned is not None else services.redis_url
    assert redis_url is not None
    log = str(log_dir / f"{name}.log") if log_dir is not None else None
    env = process_env(database_url, redis_url, name, spec)
    if pair is not None:
        env["CALLGATE_DOWNSTREAM_DATABASE_URL"] = ledger_url
    producer = Producer(
        settings=Settings.from_env(env),
        engine=db.create(database_url, application_name="callgate-producer"),
        redis_connection=transport.connect(redis_url),
        registry=tools.chaos_registry(),
    )
    return Live(
        stack=Stack(env=env, workers=spec.workers, sweeper=spec.sweeper, log_path=log),
        spec=spec,
        engine=control_engine(database_url),
        producer=producer,
        env=env,
        admin_url=services.admin_url,
        database=database_name(database_url),
        redis=owned,
        postgres=services.postgres if own_postgres else None,
        replicated=pair,
        ledger=control_engine(ledger_url) if pair is not None else None,
    )


def replicated_store(label: str) -> Replicated:
    """callgate's database on a primary of the runner's own, migrated, with a streaming
    replica caught up with it."""
    pair = Replicated(database=f"callgate_chaos_{label.replace('-', '_')[:30]}")
    try:
        pair.start()
        engine = db.create(pair.url, application_name="callgate-chaos")
        try:
            with db.translate_errors("chaos: migrate the replicated primary"):
                migrate.upgrade(engine)
        finally:
            engine.dispose()
        pair.replicate()
    except BaseException:
        pair.close()
        raise
    return pair


def run_scenario(
    scenario: Scenario,
    services: Services,
    *,
    seed: int,
    workers: int | None = None,
    log_dir: Path | None = None,
) -> Report:
    """Run one scenario of the catalogue and judge it from its database."""
    started = time.monotonic()
    schedule = faults.plan(scenario.faults, scenario_rng(seed, scenario.name))
    report = Report(
        scenario.name,
        scenario.summary,
        "pass",
        schedule=[p.as_json() for p in schedule],
    )
    skip = not_applicable(scenario, services)
    if skip is not None:
        report.verdict, report.reason = "not applicable", skip
        return report
    spec = scenario.stack if workers is None else replace(scenario.stack, workers=workers)
    live = prepare_live(services, scenario.name, spec, log_dir, own_redis=spec.own_redis)
    report.log = live.stack.log_path
    stack, engine, producer, owned = live.stack, live.engine, live.producer, live.redis
    redis_url, settings = live.env["CALLGATE_REDIS_URL"], producer.settings
    last_fault_at: Any = None
    try:
        stack.__enter__()
        wait_for_workers(redis_url, settings.queue, spec.workers)
        before = [p for p in schedule if p.spec.at == "start"]
        for planned in before:
            last_fault_at = _inject(live, planned, scenario.recovery_seconds, report)
        submit(live, scenario)
        for planned in schedule:
            if planned not in before:
                last_fault_at = _inject(live, planned, scenario.recovery_seconds, report)
        if last_fault_at is None:
            last_fault_at = _now(engine)
        _wait_settled(live, scenario.recovery_seconds)
        report.violations.extend(fan_in(live))
        report.violations.extend(
            one_result_per_call(producer.redis, settings.queue, (c.turn_id for c in live.calls))
        )
    except CallgateError as exc:
        report.violations.append(f"the runner's own call failed: {exc}")
    finally:
        stack.stop()
        producer.close()
        if owned is not None:
            owned.stop()
    try:
        judged = engine
        if live.replicated is not None and live.ledger is not None:
            # The invariants join callgate's rows with the downstream's: bring the history
            # that survived next to the ledger.
            copy_history(live.replicated.url, live.ledger.url.render_as_string(hide_password=False))
            judged = live.ledger
        judge(report, scenario, judged, last_fault_at)
    finally:
        engine.dispose()
        if live.ledger is not None:
            live.ledger.dispose()
        if live.replicated is not None:
            live.replicated.close()
    report.seconds = time.monotonic() - started
    return report


def process_env(database_url: str, redis_url: str, label: str, spec: StackSpec) -> dict[str, str]:
    """The environment of every process of one scenario (and of its producer)."""
    return {
        "CALLGATE_DATABASE_URL": database_url,
        "CALLGATE_DOWNSTREAM_DATABASE_URL": "",
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": f"chaos-{label}-{uuid.uuid4().hex[:6]}",
        "CALLGATE_TOOLS": tools.CHAOS_TOOLS,
        "CALLGATE_ALLOWLIST": "",
        "CALLGATE_LEASE_SECONDS": str(spec.lease_seconds),
        "CALLGATE_SWEEP_SECONDS": str(spec.sweep_seconds),
        "CALLGATE_STALE_SECONDS": str(spec.stale_seconds),
        "CALLGATE_DEMO_DELAY_MS": spec.delays,
        "CALLGATE_DEMO_APPROVAL_AMOUNT": str(spec.approval_amount),
        "CALLGATE_RELAYER_MARK_DELAY_MS": str(spec.relayer_mark_delay_ms),
    }


def submit(live: Live, scenario: Scenario) -> None:
    """Submit the workload's turns; "{turn}" in a string argument is the turn's number."""
    for n in range(scenario.workload.turns):
        proposals = [
            {
                "call_id": f"t{n}-c{i}-{c.tool}",
                "tool_name": c.tool,
                "arguments": _fill(c.arguments, n),
            }
            for i, c in enumerate(scenario.workload.calls)
        ]
        submit_turn(live, proposals, f"chaos-{scenario.name}-{n}")


def submit_turn(live: Live, proposals: list[dict[str, Any]], request_id: str) -> None:
    """Submit one turn through ``Producer`` and remember its calls (targets of faults)."""
    turn = live.producer.submit(proposals, {**CONTEXT, "request_id": request_id})
    live.calls.extend(
        Call(turn.turn_id, c.ref, c.call_id, str(p["tool_name"]), c.operation_id)
        for c, p in zip(turn.calls, proposals, strict=True)
    )


def _fill(value: Any, turn: int) -> Any:
    if isinstance(value, str):
        return value.replace("{turn}", str(turn))
    if isinstance(value, dict):
        return {k: _fill(v, turn) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, turn) for v in value]
    return value


def _inject(live: Live, planned: PlannedFault, window: float, report: Report) -> Any:
    """Wait for the fault's point and inject it; returns when it happened (Postgres' clock)."""
    try:
        point = faults.wait_for_point(live, planned, window)
        if planned.jitter_s:
            time.sleep(planned.jitter_s)
        at = _now(live.engine)
        done = faults.inject(live, planned, point, window)
    except PointNotReached as exc:
        report.violations.append(f"fault not injected: {exc}")
        return _now(live.engine)
    if planned.spec.action != "approve":
        report.faults.append(done)
    return at


def _now(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar()


def _wait_settled(live: Live, window: float) -> None:
    """Until every call is terminal, every job delivered (duplicates included) and every
    result published by the relayer, or the recovery window ends; then a moment for
    deliveries in flight to leave their trace."""
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        if invariants.terminal_count(live.engine) >= len(live.calls):
            break
        time.sleep(0.05)
    while time.monotonic() < deadline:
        try:
            if live.producer.queue.count == 0:
                break
        except Exception:  # Redis down for good: nothing more will be delivered
            break
        time.sleep(0.05)
    while time.monotonic() < deadline and invariants.unpublished(live.engine):
        time.sleep(0.05)
    time.sleep(SETTLE_SECONDS)


def fan_in(live: Live) -> list[str]:
    """Producer.collect for every turn: complete, one result per proposed call."""
    problems = []
    turns = sorted({c.turn_id for c in live.calls})
    for turn_id in turns:
        expected = sum(1 for c in live.calls if c.turn_id == turn_id)
        try:
            collected = live.producer.collect(turn_id, timeout=FAN_IN_SECONDS)
        except CallgateError as exc:
            problems.append(f"fan-in of turn {turn_id} raised {exc}")
            continue
        if not collected.complete or len(collected.results) != expected:
            problems.append(
                f"fan-in of turn {turn_id} incomplete: {len(collected.results)}/{expected}"
                f" results, pending {collected.pending}"
            )
    return problems


def one_result_per_call(connection: redis.Redis, queue: str, turns: Iterable[str]) -> list[str]:
    """Every copy of a call's result on its turn's stream is the same result: a
    republished copy is allowed, a second, different ending never."""
    problems: list[str] = []
    for turn_id in sorted(set(turns)):
        stream = transport.results_stream(queue, turn_id)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = connection.xrange(stream)  # type: ignore[assignment]
        seen: dict[str, set[str]] = {}
        for _entry, fields in entries:
            raw = fields.get(b"result")
            if raw is None:
                continue
            result = json.loads(raw)
            seen.setdefault(str(result.get("call_id")), set()).add(
                json.dumps(result, sort_keys=True)
            )
        problems.extend(
            f"call {call_id} has {len(results)} different results on its turn's stream (one)"
            for call_id, results in sorted(seen.items())
            if len(results) > 1
        )
    return problems


def judge(report: Report, scenario: Scenario, engine: Engine, last_fault_at: Any) -> None:
    """Fill in the counts and the verdict, from the database only."""
    report.counts = invariants.counts(engine)
    report.counts["faults"] = len(report.faults)
    report.outcomes = invariants.outcomes(engine)
    if last_fault_at is not None:
        report.recovery_seconds = invariants.recovery_seconds(engine, last_fault_at)
    report.violations.extend(invariants.violations(engine))
    report.unexpected.extend(
        invariants.expectations(scenario.expect, report.counts, report.outcomes)
    )
    if report.violations or report.unexpected:
        report.verdict = "fail"
