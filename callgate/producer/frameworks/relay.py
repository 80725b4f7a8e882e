"""What the agent-framework integrations share: one model turn's tool calls submitted as one
callgate turn, each call's outcome awaited, and each outcome said the way a model is shown it.

A framework hands over the calls its model proposed (the framework's tool call id is the
call id); ``TurnRelay`` submits them through ``AsyncProducer`` with the server-trusted
``CallContext`` it was made with, so the gate, the queue, the workers and every guarantee
apply as for any other turn. A call ends in one of three outcomes:

- ``Done``: its terminal result. ``body`` is what the model sees, the same body every
  provider adapter writes: the redacted, labelled data of a success, or ``{status, error:
  {code, details, retry_after_ms?}, trust}`` for a refusal or a failure.
- ``Parked``: the gate parked it for a person's approval (``approval_required``), with the
  approval id and the impact the server computed. An approver of the tenant other than the
  requester decides it (``callgate approvals approve``); the call then resumes on its own.
- ``Running``: no result within the wait. The call goes on; its body is the retryable
  ``operation_in_progress``.

**A call id names one logical call per request.** Each call's operation id is derived from
the tenant, the context's ``request_id``, the tool and the call id. A framework that runs a
call again (LangGraph re-runs a node when a graph resumes after an interrupt; a resumed
pydantic-ai or Agents SDK run invokes an approved tool, maybe in another process) submits it
again under the same operation: a finished call's result is reused, a parked one waits on
the same approval request, a running one is joined. Nothing runs twice. Keep the
``request_id`` of a request when resuming it, and never reuse one for another request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from callgate.core.errors import ConfigurationError, ErrorCode, InputError
from callgate.core.types import TRUST_LABEL, CallContext, ProposedCall, Succeeded, Turn
from callgate.producer.adapters import names
from callgate.producer.adapters.results import body as result_body
from callgate.producer.async_producer import AsyncProducer
from callgate.producer.fanin import Result
from callgate.store import approvals, db, turns

# How long a watch waits on the turn's results before it looks for newly parked calls.
PARKED_RECHECK_SECONDS = 0.3
DEFAULT_TIMEOUT_SECONDS = 60.0
# Tool names every framework here can pass to any provider: OpenAI's and Anthropic's rule
# (``^[a-zA-Z0-9_-]{1,64}$``); other names are encoded reversibly as ``cg-…``.
NAME_SURFACE = "openai-chat"


@dataclass(frozen=True)
class Done:
    """A call's terminal result."""

    result: Result

    @property
    def call_id(self) -> str:
        return self.result.call_id

    @property
    def ok(self) -> bool:
        return isinstance(self.result, Succeeded)

    @property
    def code(self) -> str | None:
        """The error code of a refusal or failure; None for a success."""
        return None if isinstance(self.result, Succeeded) else str(self.result.error.code)

    @property
    def body(self) -> dict[str, Any]:
        """What the model sees: ``{status, data}`` or ``{status, error, trust}``."""
        return result_body(self.result)


@dataclass(frozen=True)
class Parked:
    """A call waiting for a person's approval: nothing has run."""

    call_id: str
    tool_name: str
    approval_id: str
    impact: Mapping[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> str:
        return ErrorCode.APPROVAL_REQUIRED.value

    @property
    def body(self) -> dict[str, Any]:
        """``approval_required`` with the approval id and the server-computed impact."""
        return {
            "status": "awaiting_approval",
            "error": {
                "code": ErrorCode.APPROVAL_REQUIRED.value,
                "details": [
                    {
                        "code": "awaiting_approval",
                        "message": "a person must approve this action; it runs once approved",
                    }
                ],
            },
            "approval_id": self.approval_id,
            "impact": dict(self.impact),
            "trust": TRUST_LABEL,
        }

    @property
    def metadata(self) -> dict[str, Any]:
        """The approval request as a framework's deferred-call metadata."""
        return {"approval_id": self.approval_id, "impact": dict(self.impact)}


@dataclass(frozen=True)
class Running:
    """A call without a result yet (the wait ran out); it goes on in callgate."""

    call_id: str
    tool_name: str

    @property
    def code(self) -> str:
        return ErrorCode.OPERATION_IN_PROGRESS.value

    @property
    def body(self) -> dict[str, Any]:
        return {
            "status": "failed_retryable",
            "error": {"code": ErrorCode.OPERATION_IN_PROGRESS.value, "retry_after_ms": 1000},
            "trust": TRUST_LABEL,
        }


CallOutcome = Done | Parked | Running


def body_text(outcome: CallOutcome) -> str:
    """An outcome's body as compact JSON text, for tool results that are strings."""
    return json.dumps(outcome.body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def operation_id_for(context: CallContext, tool_name: str, call_id: str) -> str:
    """The operation a framework's call runs under: one per (tenant, request, tool, call id)."""
    key = json.dumps(["framework-call", context.tenant_id, context.request_id, tool_name, call_id])
    return "op-fw-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def as_context(context: object) -> CallContext:
    """The server-trusted context, checked: ``invalid_input`` when it is not one."""
    if isinstance(context, CallContext):
        return context
    if not isinstance(context, Mapping):
        raise InputError(
            "a framework integration needs the server-trusted CallContext (or its mapping), "
            f"not {type(context).__name__}"
        )
    try:
        return CallContext.model_validate(dict(context))
    except ValueError as exc:
        raise InputError(f"the call context is not valid: {_first_line(exc)}") from None


def arguments_of(raw: object) -> dict[str, Any] | str:
    """A framework's arguments as callgate takes them: a JSON object, or the model's raw
    JSON text, which the gate parses (and refuses as ``invalid_arguments_json``)."""
    if isinstance(raw, str | dict):
        return raw
    if raw is None:
        return {}
    raise InputError(
        f"tool call arguments must be a JSON object or its text, not {type(raw).__name__}"
    )


class TurnRelay:
    """Relays a framework's tool calls to callgate for one principal, and their outcomes
    back: it submits and waits; callgate's workers run the calls.

    ``context`` is the server-trusted ``CallContext`` of the request (from your session,
    never from the model); the tools a model is shown are the registry's allowlist for its
    roles. ``timeout`` bounds each wait for a result (seconds, finite).
    """

    def __init__(
        self,
        producer: AsyncProducer,
        context: CallContext | Mapping[str, Any],
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        if not isinstance(producer, AsyncProducer):
            raise InputError(
                f"a framework integration needs an AsyncProducer, not {type(producer).__name__}"
            )
        self.producer = producer
        self.context = as_context(context)
        self.timeout = checked_timeout(timeout)
        # call id → the submission of its turn (done, or under way)
        self._turn_of: dict[str, asyncio.Future[Turn]] = {}
        self._watches: dict[str, _Watch] = {}
        self._tool_of: dict[str, str] = {}  # call id → callgate tool name

    # --- tools ------------------------------------------------------------------------

    def definitions(self) -> list[dict[str, Any]]:
        """``{name, description, parameters}`` of each tool the context's roles may use,
        named as a provider accepts (``wire_name``)."""
        registry = self.producer.producer.registry
        return [
            {**d, "name": wire_name(d["name"])}
            for d in registry.definitions_for(self.context.roles)
        ]

    # --- submit and wait --------------------------------------------------------------

    async def submit(self, calls: Sequence[ProposedCall]) -> Turn | None:
        """Record and enqueue ``calls`` as one turn (reads at once, writes in this order).

        Calls already submitted (or being submitted) by this relay are left out; None when
        none is left. Input errors (``invalid_input``, ``invalid_arguments_json``) come from
        ``AsyncProducer.submit`` and record nothing.
        """
        fresh = [c for c in calls if c.call_id not in self._turn_of]
        if not fresh:
            return None
        # Registered before the first await: a sibling call of the same model response that
        # arrives meanwhile waits for this turn instead of submitting its own.
        submission = asyncio.ensure_future(
            self.producer.submit(
                fresh,
                self.context,
                operation_ids={
                    c.call_id: operation_id_for(self.context, c.tool_name, c.call_id) for c in fresh
                },
            )
        )
        for c in fresh:
            self._turn_of[c.call_id] = submission
            self._tool_of[c.call_id] = c.tool_name
        try:
            return await asyncio.shield(submission)
        except Exception:
            for c in fresh:  # nothing was recorded: a later call may submit them again
                self._turn_of.pop(c.call_id, None)
            raise

    def submitted(self, call_id: str) -> bool:
        return call_id in self._turn_of

    async def outcome(
        self, call_id: str, *, until_parked: bool = True, timeout: float | None = None
    ) -> CallOutcome:
        """Wait for one submitted call: its result, or (``until_parked``) the moment it is
        parked for approval, or ``timeout`` (default: the relay's) seconds."""
        submission = self._turn_of.get(call_id)
        if submission is None:
            raise InputError(f"call {call_id!r} was not submitted through this relay")
        watch = self._watch(await asyncio.shield(submission))
        wait = self.timeout if timeout is None else checked_timeout(timeout)
        result, approval_id = await watch.wait(call_id, until_parked=until_parked, timeout=wait)
        if result is not None:
            return Done(result)
        tool_name = self._tool_of[call_id]
        if approval_id is None:
            return Running(call_id=call_id, tool_name=tool_name)
        impact = await self._impact(approval_id)
        return Parked(call_id=call_id, tool_name=tool_name, approval_id=approval_id, impact=impact)

    async def run(self, calls: Sequence[ProposedCall]) -> list[CallOutcome]:
        """Submit ``calls`` as one turn (if not yet) and wait until each has a result or is
        parked. A write behind a parked write cannot start before it: it is not waited for
        (``Running``)."""
        await self.submit(calls)
        registry = self.producer.producer.registry
        outcomes: list[CallOutcome] = []
        write_parked = False
        for call in calls:
            write = registry.kind_of(call.tool_name) == "write"
            if write and write_parked:
                outcomes.append(Running(call_id=call.call_id, tool_name=call.tool_name))
                continue
            outcome = await self.outcome(call.call_id)
            write_parked = write_parked or (write and isinstance(outcome, Parked))
            outcomes.append(outcome)
        return outcomes

    async def _impact(self, approval_id: str) -> dict[str, Any]:
        engine = self.producer.producer.engine
        tenant = self.context.tenant_id

        def show() -> dict[str, Any]:
            with db.translate_errors("approvals"):
                return approvals.show(engine, approval_id, tenant=tenant)

        request = await asyncio.to_thread(show)
        impact = request.get("impact")
        return dict(impact) if isinstance(impact, Mapping) else {}

    def _watch(self, turn: Turn) -> _Watch:
        watch = self._watches.get(turn.turn_id)
        if watch is None:
            calls = [c.call_id for c in turn.calls]
            watch = self._watches[turn.turn_id] = _Watch(self.producer, turn.turn_id, calls)
        return watch


class _Watch:
    """One turn followed for the calls waiting on it: results as they land (fan-in), and
    every ``PARKED_RECHECK_SECONDS`` the calls parked for approval. One follower task per
    turn, however many calls wait; it stops when nobody waits."""

    def __init__(self, producer: AsyncProducer, turn_id: str, calls: Iterable[str]) -> None:
        self.producer = producer
        self.turn_id = turn_id
        self.calls = frozenset(calls)
        self.results: dict[str, Result] = {}
        self.parked: dict[str, str] = {}
        self.parked_seen_at = float("-inf")  # loop time the last look at parked calls began
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._waiters = 0

    async def wait(
        self, call_id: str, *, until_parked: bool, timeout: float
    ) -> tuple[Result | None, str | None]:
        """Wait up to ``timeout`` seconds for the call's result or (``until_parked``) for it
        to be seen parked. Returns the result, or the approval id it is parked on (as seen
        by a look taken after this wait began: an approval may have released it since an
        older one), or neither."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + timeout

        def parked_on() -> str | None:
            return self.parked.get(call_id) if self.parked_seen_at >= began else None

        self._waiters += 1
        try:
            while call_id not in self.results and not (until_parked and parked_on()):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                task = self._task
                if task is None or task.done():
                    task = self._task = asyncio.create_task(self._follow())
                    # The follower may outlive every waiter by a recheck period and end with
                    # an error nobody awaits (the producer closed meanwhile): a waiter that
                    # sees it raises it; otherwise it is not asyncio's to print.
                    task.add_done_callback(_retrieved)
                changed = asyncio.ensure_future(self._changed.wait())
                await asyncio.wait(
                    [changed, task], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                changed.cancel()
                if task.done() and not task.cancelled():
                    error = task.exception()
                    if error is not None:  # Postgres or Redis unreachable: say so
                        raise error
        finally:
            self._waiters -= 1
        result = self.results.get(call_id)
        return result, None if result is not None else parked_on()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _follow(self) -> None:
        engine = self.producer.producer.engine
        turn = uuid.UUID(self.turn_id)

        def parked_now() -> dict[str, str]:
            with db.translate_errors("collect"):
                return turns.awaiting_approval(engine, turn)

        while self._waiters:
            # Ends when every call of the turn has a result, or after the recheck period. No
            # span per round (one every 0.3 s): the framework's own tool span is the wait.
            rounds = self.producer._results(self.turn_id, PARKED_RECHECK_SECONDS, traced=False)
            async for result in rounds:
                if result.call_id not in self.results:
                    self.results[result.call_id] = result
                    self._notify()
            looked_at = asyncio.get_running_loop().time()
            parked = await asyncio.to_thread(parked_now)
            self.parked = {c: a for c, a in parked.items() if c not in self.results}
            self.parked_seen_at = looked_at
            self._notify()
            if self.calls and self.calls <= self.results.keys():
                return


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def wire_name(name: str) -> str:
    """A callgate tool's name as a model is shown it (``cg-…`` when a provider would refuse
    it)."""
    return names.wire_name(NAME_SURFACE, name)


def tool_name(wire: str) -> str:
    """The callgate tool behind a name the model used. A name that is no canonical spelling
    of any name is passed on unchanged, and the gate refuses it as ``unknown_tool``."""
    return names.tool_name(NAME_SURFACE, wire) or wire


def proposals(calls: Iterable[tuple[str, str, object]]) -> list[ProposedCall]:
    """``(call_id, name the model used, arguments)`` as callgate proposals."""
    out: list[ProposedCall] = []
    for call_id, name, arguments in calls:
        try:
            out.append(
                ProposedCall(
                    call_id=call_id, tool_name=tool_name(name), arguments=arguments_of(arguments)
                )
            )
        except ValueError as exc:
            raise InputError(f"a tool call is malformed: {_first_line(exc)}") from None
    return out


def checked_timeout(timeout: float) -> float:
    """A finite number of seconds, 0 or more (``invalid_input`` otherwise)."""
    if not isinstance(timeout, int | float) or not 0 <= float(timeout) < float("inf"):
        raise InputError(f"timeout must be a finite number of seconds, 0 or more: {timeout!r}")
    return float(timeout)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def require(module: str, extra: str, integration: str) -> None:
    """Refuse (``invalid_configuration``) to load an integration whose framework is not
    installed, naming the extra that installs it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigurationError(
            f"{integration} needs the {module!r} package: pip install 'callgate[{extra}]'"
        )
