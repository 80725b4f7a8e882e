"""The producer: records a turn in Postgres, enqueues its calls on Redis, fans results in."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis
from opentelemetry.trace import Span
from redis.client import Pipeline
from rq import Queue

import callgate.producer.adapters as adapters
import callgate.producer.validation as validation
from callgate.core.errors import CorrelationError, ErrorCode, ServiceUnavailable
from callgate.core.settings import Settings
from callgate.core.types import TRUST_LABEL, CallContext, ProposedCall, Turn
from callgate.observe import metrics, tracing
from callgate.producer.budgets import apply_budgets
from callgate.producer.fanin import (
    REDIS_AWAY,
    FanIn,
    Landed,
    ReadPostgres,
    ReadStream,
    Result,
    Sleep,
    advance,
    follow,
)
from callgate.producer.planning import arguments_hash, plan
from callgate.queue import deliveries, results, transport
from callgate.store import db, schema_version, tool_catalog, turns
from callgate.store.db import Engine
from callgate.tools import registry as tool_registry
from callgate.tools.intent import canonical_json

log = logging.getLogger("callgate.producer")


@dataclass(frozen=True)
class Collected:
    """The fan-in of one turn: one result per finished call, and the calls still pending."""

    turn_id: str
    complete: bool
    results: list[Result]
    pending: list[str]
    # (call_id, tool_name) of every proposed call, in proposal order.
    proposals: list[tuple[str, str]] = field(default_factory=list)
    # Pending calls parked for a person's decision: call id → approval id.
    awaiting_approval: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "complete": self.complete,
            "results": [_labelled(r) for r in self.results],
            "pending": self.pending,
            "awaiting_approval": self.awaiting_approval,
        }

    def provider_message(self, surface: str) -> Any:
        """The results as ``surface``'s tool-result message, ready to append to the
        conversation. Refused (``missing_result``) while a call is still pending: a partial
        turn is never padded."""
        if not self.complete:
            waiting = ", ".join([*self.pending, *self.awaiting_approval])
            raise CorrelationError(
                f"turn {self.turn_id} is not complete; still pending: {waiting}",
                code=ErrorCode.MISSING_RESULT,
            )
        calls = [ProposedCall(call_id=c, tool_name=t, arguments={}) for c, t in self.proposals]
        return adapters.write_results(surface, calls, self.results)


def recheck(engine: Engine, turn_id: uuid.UUID) -> list[dict[str, Any]] | None:
    """The turn's committed results, or None while PostgreSQL is away (results still
    arrive on Redis; the fan-in looks again later). The fan-in loops' safety net."""
    try:
        return turns.load_state(engine, str(turn_id)).results
    except Exception as exc:
        if not db.is_transient(exc):
            raise
        log.warning("collect: cannot reach PostgreSQL (%s); retrying", exc)
        return None


def first_read(engine: Engine, turn_id: str, timeout: float | None) -> turns.TurnState:
    """The turn as a fan-in starts from. The read changes nothing: after a lost connection
    it is sent again on a new one, within the timeout and at least ``db.RECONNECT_SECONDS``
    (without it nothing is known)."""
    seconds = db.RECONNECT_SECONDS if timeout is None else max(timeout, db.RECONNECT_SECONDS)
    with db.translate_errors("collect"):
        return db.retry_until(lambda: turns.load_state(engine, turn_id), seconds=seconds)


def collected(engine: Engine, state: turns.TurnState, fan: FanIn) -> Collected:
    """What a finished fan-in returns; a call still pending says if it awaits a person's
    approval (read again after a lost connection: the read changes nothing)."""
    awaiting: dict[str, str] = {}
    if not fan.complete:
        with db.translate_errors("collect"):
            awaiting = db.retry_until(lambda: turns.awaiting_approval(engine, state.turn_id))
    return Collected(
        turn_id=str(state.turn_id),
        complete=fan.complete,
        results=fan.ordered(),
        # Disjoint: a parked call is listed under awaiting_approval only.
        pending=[c for c in fan.pending if c not in awaiting],
        proposals=list(state.proposals),
        awaiting_approval={c: a for c, a in awaiting.items() if c in fan.pending},
    )


def fanned_in(state: turns.TurnState, fan: FanIn, loaded: float) -> None:
    """Observe the fan-in latency of a turn ``fan`` holds complete: its submit to now (its
    age when read at ``loaded``, on Postgres' clock, plus the wait since)."""
    if fan.complete and state.age_seconds is not None:
        metrics.fanned_in(state.age_seconds + (time.monotonic() - loaded))


def traced(span: Span, done: Collected) -> None:
    """A ``callgate.collect`` span's outcome: complete, and how many results and pending."""
    tracing.collected(
        span,
        complete=done.complete,
        results=len(done.results),
        pending=len(done.pending) + len(done.awaiting_approval),
    )


def proposals_of(recorded: turns.Recorded) -> list[tracing.Proposal]:
    """Each proposal of a recorded turn with its intake: enqueued now, waiting for the
    turn's previous write, refused at intake (its code), or a repeat's (which enqueues again
    only the calls still waiting for their first job)."""
    if recorded.repeat:
        again = set(recorded.undispatched)
        return [
            tracing.Proposal(
                tool_name=t,
                call_id=c,
                call_ref=str(ref),
                operation_id=op,
                outcome=tracing.QUEUED if ref in again else tracing.REPEAT,
            )
            for c, t, op, ref in recorded.calls
        ]
    out: list[tracing.Proposal] = []
    for p in recorded.planned:
        outcome, code = tracing.QUEUED, None
        if p.refusal is not None:
            outcome, code = tracing.REFUSED, str(p.refusal.get("code"))
        elif p.after is not None:
            outcome = tracing.WAITING
        out.append(
            tracing.Proposal(
                tool_name=p.proposal.tool_name,
                call_id=p.proposal.call_id,
                call_ref=str(p.ref),
                operation_id=p.operation_id,
                outcome=outcome,
                code=code,
            )
        )
    return out


def request_hash(checked: validation.Submission) -> str:
    """What makes two submits under one key the same request: the proposals (call id,
    tool, arguments, in order), the operation ids the caller gave, and who asked in which
    conversation. Not the request id: it names an attempt, not the request."""
    ctx = checked.context
    doc = {
        "calls": [[c.call_id, c.tool_name, arguments_hash(c.arguments)] for c in checked.calls],
        "operation_ids": dict(sorted(checked.operation_ids.items())),
        "user_id": ctx.user_id,
        "roles": sorted(ctx.roles),
        "conversation_id": ctx.conversation_id,
    }
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _labelled(result: Result) -> dict[str, Any]:
    """A result as JSON; a failure carries the trust label (a success's data has it)."""
    doc = result.model_dump(mode="json", exclude_none=True)
    if doc["status"] != "succeeded":
        doc["trust"] = TRUST_LABEL
    return doc


class Producer:
    """Embed this in an application: ``Producer.from_env().submit(proposals, context)``."""

    def __init__(
        self,
        *,
        settings: Settings,
        engine: Engine,
        redis_connection: redis.Redis,
        registry: tool_registry.Catalog,
    ) -> None:
        # Once, here, never per submit: an unmigrated database is refused before anything is
        # written (from_env has already checked this engine, and it is not asked again). The
        # connection is not kept: submit's first statement opens its own, as it always did.
        schema_version.require_current(engine, "producer", pooled=False)
        self.settings = settings
        self.engine = engine
        self.redis = redis_connection
        self.registry = registry
        self.queue: Queue = transport.job_queue(redis_connection, settings.queue)

    @classmethod
    def from_env(cls, settings: Settings | None = None) -> Producer:
        """Build from ``CALLGATE_DATABASE_URL``, ``CALLGATE_REDIS_URL`` and friends, or from
        ``settings`` read from them. The tools come from the catalogue workers publish, or
        from ``CALLGATE_TOOLS`` when set (``tool_catalog.for_producer``): no handler runs
        here and no MCP server is started."""
        settings = settings or Settings.from_env()
        engine = db.create(settings.require_database(), application_name="callgate-producer")
        try:
            schema_version.require_current(engine, "producer")
            registry = tool_catalog.for_producer(engine, settings)
            redis_connection = transport.connect(settings.require_redis())
        except BaseException:
            engine.dispose()
            raise
        return cls(
            settings=settings,
            engine=engine,
            redis_connection=redis_connection,
            registry=registry,
        )

    def submit(
        self,
        proposals: Sequence[ProposedCall | Mapping[str, Any]],
        context: CallContext | Mapping[str, Any],
        *,
        operation_ids: Mapping[str, str] | None = None,
        submit_key: str | None = None,
    ) -> Turn:
        """Record the turn, its calls and one operation per call, then enqueue the calls.

        ``operation_ids`` maps a call id to an operation id the application issued before
        (a retry of the same logical write in a new turn): that operation is reused.
        Reads are enqueued at once; of the writes only the first, the rest follow in order.

        ``submit_key`` makes the submit idempotent: a repeat with the same key (per tenant)
        and the same request (proposals, operation ids, user, roles, conversation) returns
        the turn the first one recorded, and records nothing; the same key with another
        request is ``idempotency_conflict``. Without one the producer picks a key itself,
        so its own retries after a lost COMMIT reply find the turn; a submit whose outcome
        it cannot know raises ``ServiceUnavailable`` naming that key (``exc.submit_key``,
        ``exc.recorded is None``): submit again with it.

        Input is checked before anything is recorded (producer/validation.py): a refusal is
        an ``InputError`` (``invalid_input``, or ``invalid_arguments_json`` for string
        arguments) and stores nothing. An operation id may appear once per turn.
        """
        if submit_key is not None:
            validation.check_id(submit_key, "submit key")
        checked = validation.check_submission(
            proposals, context, operation_ids, limits=validation.Limits.of(self.settings)
        )
        ctx = checked.context
        key = submit_key if submit_key is not None else f"auto-{uuid.uuid4().hex}"
        planned = plan(checked.calls, ctx, self.registry, checked.operation_ids)

        decided: list[turns.PlannedCall] = []

        def decide(facts: turns.ConversationFacts) -> list[turns.PlannedCall]:
            decided[:] = apply_budgets(
                planned,
                facts,
                turn_budget=self.settings.turn_call_budget,
                conversation_budget=self.settings.conversation_call_budget,
            )
            return list(decided)

        with tracing.submitting(len(planned)) as span:
            # The submit span's context, stored with the turn: the workers' spans continue it.
            carrier = tracing.carrier_of(span)
            recorded = self._record(ctx, planned, decide, key, request_hash(checked), carrier)
            tracing.submitted(span, recorded.turn_id, recorded.repeat)
            with tracing.proposing(span) as intake:
                if intake.on:
                    intake.recorded(recorded.turn_id, proposals_of(recorded))
                return self._enqueue(recorded, key, ctx)

    def _enqueue(self, recorded: turns.Recorded, key: str, ctx: CallContext) -> Turn:
        """Enqueue the calls a recorded turn dispatches now (a repeat's undispatched ones),
        after Redis notes the turn: a failover to a PostgreSQL replica that lacks it is then
        answered ``turn_lost``, and its writes' operation ids stay in doubt."""
        if not recorded.repeat:
            metrics.calls_proposed_all(
                (p.proposal.tool_name for p in recorded.planned), self.registry.tools
            )
        turn = recorded.as_turn()
        remember: Callable[[Pipeline], int] | None = None
        if not recorded.repeat:
            writes = tuple(
                (p.operation_id, p.proposal.tool_name, p.idempotency_key)
                for p in recorded.planned
                if p.kind == "write" and p.refusal is None
            )
            # Its tenant and user too: the lost turn's owner is answered turn_lost.
            submitted = results.Submitted(
                recorded.turn_id, ctx.tenant_id, time.time(), writes, ctx.user_id
            )
            remember = partial(results.remember, queue=self.settings.queue, turn=submitted)
        try:
            # One round trip notes the turn and asks which jobs already wait; the next
            # enqueues them.
            transport.enqueue_calls(
                self.queue,
                recorded.dispatch,
                timeout=self.settings.job_timeout_seconds,
                first=remember,
            )
        except ServiceUnavailable as exc:
            # The turn is recorded; the sweeper dispatches it once Redis is back.
            raise ServiceUnavailable(
                f"turn {turn.turn_id} is recorded but not yet enqueued ({exc.message}); "
                "the sweeper will dispatch it",
                code=exc.code,
                submit_key=key,
                recorded=True,
            ) from exc
        return turn

    def _record(
        self,
        ctx: CallContext,
        planned: list[turns.PlannedCall],
        decide: turns.Decide,
        key: str,
        content_hash: str,
        trace_context: Mapping[str, str] | None = None,
    ) -> turns.Recorded:
        """``turns.record_turn`` under ``key``, again after a lost connection (a PostgreSQL
        restart, a terminated backend) for up to ``db.RECONNECT_SECONDS``.

        Every attempt claims the turn under the key first, in its own transaction: after a
        failure during COMMIT (the reply lost, the turn committed) the next attempt finds
        that turn and returns it, and records nothing. So the retry is safe whatever the
        failed attempt did, and the error at the end says what is known: nothing recorded
        (every attempt failed before COMMIT), or outcome unknown.
        """
        progress = turns.RecordProgress()
        turn_id = uuid.uuid4()

        def attempt() -> turns.Recorded:
            return turns.record_turn(
                self.engine,
                ctx,
                planned,
                decide,
                turn_id=turn_id,
                submit_key=key,
                submit_hash=content_hash,
                progress=progress,
                trace_context=trace_context,
            )

        try:
            with db.translate_errors("submit"):
                return db.retry_until(attempt)
        except ServiceUnavailable as exc:
            if not progress.commit_sent:
                raise ServiceUnavailable(
                    f"{exc.message}; nothing was recorded", submit_key=key, recorded=False
                ) from exc
            raise ServiceUnavailable(
                f"{exc.message} while committing the turn: outcome unknown, the turn may be "
                f"recorded. Submit again with submit key {key!r} (a repeat returns that turn "
                "and records nothing twice)",
                submit_key=key,
                recorded=None,
            ) from exc

    def collect(self, turn_id: str, timeout: float) -> Collected:
        """Wait up to ``timeout`` seconds for one terminal result per proposed call.

        Returns as soon as the last result arrives. On timeout, ``pending`` names the calls
        without a result: nothing is invented for them. ``timeout`` must be finite and not
        negative (``InputError`` otherwise).
        """
        with tracing.collecting(turn_id) as span:
            done = self._collect(turn_id, timeout)
            traced(span, done)
            return done

    def _collect(self, turn_id: str, timeout: float) -> Collected:
        validation.check_timeout(timeout)
        deadline = time.monotonic() + timeout
        state = first_read(self.engine, turn_id, timeout)
        loaded = time.monotonic()
        fan = FanIn(state.proposals)
        stream = transport.results_stream(self.settings.queue, state.turn_id)
        loop = follow(fan, stream, state.results, deadline)
        request = advance(loop)
        while request is not None:
            answer: Any = None
            if isinstance(request, ReadPostgres):
                with db.translate_errors("collect"):
                    answer = recheck(self.engine, state.turn_id)
            elif isinstance(request, Sleep):
                time.sleep(request.seconds)
            elif isinstance(request, ReadStream):
                try:
                    answer = self.redis.xread(
                        {request.stream: request.last_id}, block=request.block_ms, count=500
                    )
                except REDIS_AWAY as exc:
                    request = advance(loop, error=exc)
                    continue
            else:
                assert isinstance(request, Landed)  # collect returns them all at the end
            request = advance(loop, answer)
        fanned_in(state, fan, loaded)
        return collected(self.engine, state, fan)

    def live_workers(self) -> list[str]:
        """The workers serving this queue now (listed, with a live liveness key): none means
        nothing runs a pending call until one starts."""
        with transport.translate_errors("worker lookup"):
            return deliveries.live_workers(self.redis, self.settings.queue)

    def close(self) -> None:
        self.engine.dispose()
        self.redis.close()
