"""The /v1 routes: the same code paths as ``callgate submit``, ``collect``, ``tools``,
``approvals`` and ``trace``, for the principal of the request's key."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from callgate.core import values
from callgate.core.errors import (
    CallgateError,
    ErrorCode,
    InputError,
    JSONValueError,
    ServiceUnavailable,
    UnknownTurn,
)
from callgate.ops.http import access, models, problems, views
from callgate.ops.http.auth import bearer_key, require_approver
from callgate.ops.http.services import Services
from callgate.ops.http.settings import MAX_BODY_BYTES
from callgate.producer import intake
from callgate.producer.validation import MAX_ID_LENGTH, check_id, check_timeout
from callgate.queue import transport
from callgate.store import api_keys, approvals, audit, db, turns
from callgate.store.api_keys import KeyHolder
from callgate.tools import retrieval

router = APIRouter()

# A request's text to choose tools for; longer texts add nothing to the ranking but work.
MAX_QUERY_LENGTH = 4_000

_bearer = HTTPBearer(auto_error=False, description="An API key: callgate keys create")


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def _check_key(s: Services, key: str, state: dict[str, Any]) -> KeyHolder:
    principal = api_keys.authenticate(s.engine, key)
    # Before the rate limit, so the access line of a refused request names its key too.
    state[access.KEY_ID_STATE] = principal.key_id
    s.limiter.take(principal)
    return principal


async def authenticated(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> KeyHolder:
    """The principal of the request's key, after one token of its rate limit. The check
    runs on threads of its own (``KEY_CHECK_THREADS``), never the routes' shared pool."""
    s = services(request)
    key = bearer_key(request.headers.get("authorization"))
    state = request.scope.setdefault("state", {})
    principal: KeyHolder = await anyio.to_thread.run_sync(
        _check_key, s, key, state, limiter=s.key_checks
    )
    return principal


Who = Annotated[KeyHolder, Depends(authenticated)]
ProviderQuery = Annotated[
    models.Surface | None, Query(description="A provider API surface (five are accepted)")
]
_ERRORS = problems.responses(*problems.COMMON)

_SUBMIT_BODY = {
    "requestBody": {
        "required": True,
        "description": "A JSON list of proposals, or (with ?provider=SURFACE) that provider's "
        "raw response (with &stream=true, the list of its stream events).",
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"type": "array", "items": models.Proposal.model_json_schema()},
                        {"type": "object"},
                    ]
                }
            }
        },
    }
}


async def _body(request: Request) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise InputError(f"the body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(body: bytes) -> Any:
    try:
        raw = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("the body is not UTF-8 text") from None
    try:
        return values.loads(raw, check_values=False)
    except JSONValueError as exc:
        raise InputError(f"the body is not valid JSON: {exc.message}") from None


def _operation_ids(proposals: list[Any], principal: KeyHolder, idem: str) -> dict[str, str]:
    """Operation ids derived from the Idempotency-Key: a repeat whose first answer was lost
    reuses the first attempt's operations, so its writes never run twice."""
    derived: dict[str, str] = {}
    for p in proposals:
        call_id = p.get("call_id") if isinstance(p, dict) else getattr(p, "call_id", None)
        tool = p.get("tool_name") if isinstance(p, dict) else getattr(p, "tool_name", None)
        own = p.get("operation_id") if isinstance(p, dict) else getattr(p, "operation_id", None)
        if own is not None:
            continue  # the application named this operation itself
        try:
            check_id(call_id, "call id")
        except InputError:
            continue  # refused by submit's own checks, with their message
        key = json.dumps(["api", principal.tenant_id, principal.key_id, idem, str(tool), call_id])
        derived[str(call_id)] = "op-api-" + hashlib.sha256(key.encode()).hexdigest()[:40]
    return derived


def _scoped(proposals: list[Any], principal: KeyHolder) -> tuple[list[Any], dict[str, str]]:
    """The proposals with each operation id the application named scoped to the key's
    tenant, and each scoped id's own name. Operation ids are one namespace in PostgreSQL, so
    an id another tenant holds would be refused, telling this tenant that it exists; scoped,
    it is answered as an id no one holds (recorded, run as this tenant's), and the tenant's
    own reuse still names its one operation."""
    names: dict[str, str] = {}
    scoped: list[Any] = []
    for p in proposals:
        own = p.get("operation_id") if isinstance(p, dict) else None
        try:
            check_id(own, "operation_id")
        except InputError:
            scoped.append(p)  # none, or refused by submit's own checks, with their message
            continue
        key = json.dumps(["api-operation", principal.tenant_id, own])
        internal = "op-app-" + hashlib.sha256(key.encode()).hexdigest()[:40]
        names[internal] = str(own)
        scoped.append({**p, "operation_id": internal})
    return scoped, names


def _named(answer: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """The answer with each scoped operation id as the application named it: the name it
    sends again for the same write."""
    calls = [
        {**c, "operation_id": names.get(c["operation_id"], c["operation_id"])}
        for c in answer["calls"]
    ]
    return {**answer, "calls": calls}


def _renamed(exc: CallgateError, names: dict[str, str]) -> None:
    # A refusal names the operation as the application did (the same tenant's id reused for
    # another tool, say), never its scoped form.
    for internal, own in names.items():
        exc.message = exc.message.replace(internal, own)
    exc.args = (exc.message,)


def _submit_key(principal: KeyHolder, idem: str) -> str:
    """The producer's submit key for an Idempotency-Key: scoped by the API key, as the
    answers in ``api_idempotency`` are (the producer scopes it by tenant too)."""
    raw = json.dumps(["api", principal.key_id, idem])
    return "api-" + hashlib.sha256(raw.encode()).hexdigest()[:40]


def _submit(
    s: Services,
    who: KeyHolder,
    body: bytes,
    query: str,
    provider: str | None,
    stream: bool,
    conversation_id: str | None,
    idem: str | None,
) -> dict[str, Any]:
    if idem is not None:
        check_id(idem, "Idempotency-Key")
        claim = api_keys.claim(s.engine, who.key_id, idem, api_keys.request_hash(body, query))
        if not claim.claimed:
            if claim.response is not None:
                return claim.response
            raise CallgateError(
                f"a request with Idempotency-Key {idem!r} is still running; retry shortly",
                code=ErrorCode.OPERATION_IN_PROGRESS,
            )
    # Without an Idempotency-Key the request gets one of its own, used exactly as a given
    # one would be: should the outcome be unknown (the connection lost during COMMIT), the
    # answer names it, and a repeat under it returns the turn if it was recorded.
    key = idem if idem is not None else uuid.uuid4().hex
    names: dict[str, str] = {}
    try:
        raw = _parse(body)
        proposals = intake.proposals_from(
            raw, provider=provider, stream=stream, known_tools=s.producer.registry.tools.keys()
        )
        proposals, names = _scoped(proposals, who)
        if provider and not proposals:
            answer = dict(intake.NO_CALLS)
        else:
            context = {
                # The principal comes from the key; nothing in the body can name another.
                "request_id": f"api-{key}",
                "tenant_id": who.tenant_id,
                "user_id": who.user_id,
                "roles": list(who.roles),
                "conversation_id": conversation_id,
            }
            turn = s.producer.submit(
                proposals,
                context,
                operation_ids=_operation_ids(proposals, who, key),
                submit_key=_submit_key(who, key),
            )
            answer = _named(intake.submitted(turn), names)
    except CallgateError as exc:
        _renamed(exc, names)
        if idem is not None:
            api_keys.release(s.engine, who.key_id, idem)
        if isinstance(exc, ServiceUnavailable) and exc.recorded is not True:
            raise _unknown_or_not(exc, key) from exc
        raise
    if idem is not None:
        api_keys.answer(s.engine, who.key_id, idem, answer)
    return answer


def _unknown_or_not(exc: ServiceUnavailable, key: str) -> ServiceUnavailable:
    """The producer's answer about the turn, with the Idempotency-Key to repeat under
    (the producer's own submit key means nothing to an HTTP client)."""
    if exc.recorded is None:
        message = (
            f"submit: cannot reach PostgreSQL while committing the turn: outcome unknown, "
            f"the turn may be recorded. Repeat the request with Idempotency-Key {key!r}: "
            "it returns that turn, or records it once"
        )
    else:
        message = exc.message  # nothing was recorded
    return ServiceUnavailable(
        message,
        code=exc.code,
        details=[{"code": "submit_outcome", "recorded": exc.recorded, "idempotency_key": key}],
        recorded=exc.recorded,
    )


@router.post(
    "/v1/turns",
    response_model=models.Submitted,
    responses=_ERRORS,
    openapi_extra=_SUBMIT_BODY,
    summary="Record and enqueue a turn",
    tags=["turns"],
)
async def submit_turn(
    request: Request,
    who: Who,
    provider: ProviderQuery = None,
    stream: Annotated[bool, Query(description="The body is the provider's stream events")] = False,
    conversation_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=MAX_ID_LENGTH,
            description="A repeat with the same key and body gets the first answer",
        ),
    ] = None,
) -> Any:
    """What `callgate submit --json` does and prints, for the key's principal. A provider
    response is read whole before anything is recorded; a malformed one is refused with its
    adapter code; a final answer records nothing (`turn_id` null)."""
    body = await _body(request)
    return await run_in_threadpool(
        _submit,
        services(request),
        who,
        body,
        str(request.url.query),
        provider,
        stream,
        conversation_id,
        idempotency_key,
    )


def _own_turn(s: Services, who: KeyHolder, turn_id: str) -> None:
    # Another principal's turn answers exactly like a missing one.
    with db.translate_errors("collect"):
        found = turns.owner(s.engine, turn_id)
    if found != (who.tenant_id, who.user_id):
        raise UnknownTurn(f"no turn {turn_id}")


async def _collect_unless_gone(request: Request, s: Services, turn_id: str, wait: float) -> Any:
    """``collect`` for up to ``wait`` seconds, ended early (None) if the client hangs up: a
    wait nobody will read gives its slot (and its Redis read) back at once."""

    async def hung_up() -> None:
        # The request has no body: the next message is the disconnect, when it comes.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    collecting = asyncio.ensure_future(s.collector.collect(turn_id, wait))
    watching = asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (watching, collecting):
            if not task.done():
                task.cancel()
        await asyncio.gather(watching, collecting, return_exceptions=True)
    if collecting.cancelled():
        return None  # the client is gone
    return collecting.result()


@router.get(
    "/v1/turns/{turn_id}/results",
    response_model=models.CollectedTurn | list[dict[str, Any]] | dict[str, Any],
    responses=_ERRORS,
    summary="Wait for a turn's results",
    tags=["turns"],
)
async def turn_results(
    request: Request,
    who: Who,
    turn_id: Annotated[str, Path(max_length=100)],
    wait: Annotated[float, Query(ge=0, description="Seconds to wait for the last result")] = 0,
    provider: ProviderQuery = None,
) -> Any:
    """What `callgate collect --json` prints (or, with `provider`, that surface's tool-result
    message, which needs every result: `missing_result` until then). Returns as soon as the
    last result lands, or after `wait` seconds (at most CALLGATE_API_MAX_WAIT). A key has at
    most CALLGATE_API_MAX_WAITS_PER_KEY waits at once, the API process at most
    CALLGATE_API_MAX_WAITS (`too_many_waits` past either; `wait=0` is never refused)."""
    s = services(request)
    check_timeout(wait, "wait")
    wait = min(wait, s.api.max_wait)
    await run_in_threadpool(_own_turn, s, who, turn_id)
    # The wait awaits the turn's Redis stream on the event loop: it holds no thread, so
    # long-polls never starve other requests of the pool; its slot bounds what it does hold.
    if wait > 0:
        s.waits.take(who.key_id, who.tenant_id)
        try:
            collected = await _collect_unless_gone(request, s, turn_id, wait)
        finally:
            s.waits.give(who.key_id, who.tenant_id)
        if collected is None:
            return Response(status_code=204)  # to a closed connection: nobody reads it
    else:
        collected = await s.collector.collect(turn_id, 0)
    if provider:
        return JSONResponse(collected.provider_message(provider))
    return JSONResponse(collected.as_json())


@router.get(
    "/v1/tools",
    response_model=list[dict[str, Any]],
    responses=_ERRORS,
    summary="The tools the key's roles may be shown",
    tags=["tools"],
)
def list_tools(
    request: Request,
    who: Who,
    provider: ProviderQuery = None,
    query: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_QUERY_LENGTH,
            description="The request's text: only the allowed tools that best match it, best "
            "first (BM25 over names, descriptions and arguments)",
        ),
    ] = None,
    top: Annotated[
        int | None,
        Query(
            ge=1,
            le=retrieval.MAX_TOP,
            description=f"With `query`: how many tools (default {retrieval.DEFAULT_TOP})",
        ),
    ] = None,
) -> Any:
    """The allowlisted tool definitions of the key's roles, as `callgate tools` prints them;
    with `query`, the `top` of them that best match it, best first. A tool the key's roles
    may not use is never listed, whatever the query."""
    catalog = services(request).producer.registry
    if query is None:
        if top is not None:
            raise InputError("top needs query: the request's text to choose tools for")
        definitions = catalog.definitions_for(who.roles)
    else:
        chosen = catalog.select(query, who.roles, top or retrieval.DEFAULT_TOP)
        definitions = [t.definition() for t in chosen]
    return JSONResponse(intake.tool_definitions(definitions, provider))


def _views(s: Services, who: KeyHolder, state: str | None) -> list[dict[str, Any]]:
    with db.translate_errors("approvals"):
        every = approvals.requests(s.engine, tenant=who.tenant_id)
    shown = views.approval_views(every, datetime.now(UTC))
    return [v for v in shown if state is None or v["state"] == state]


@router.get(
    "/v1/approvals",
    response_model=list[models.Approval],
    responses=_ERRORS,
    summary="Approval requests of the key's tenant",
    tags=["approvals"],
)
def list_approvals(
    request: Request, who: Who, state: models.ApprovalState = "pending"
) -> list[dict[str, Any]]:
    """The tenant's requests, oldest first (needs the approver role)."""
    require_approver(who, "listing approvals")
    return _views(services(request), who, None if state == "all" else state)


def approval_detail(s: Services, who: KeyHolder, approval_id: str) -> dict[str, Any]:
    with db.translate_errors("approvals"):
        found = approvals.show(s.engine, approval_id, tenant=who.tenant_id)  # unknown_approval
        calls = turns.calls_of_approval(s.engine, approval_id)
    (view,) = [v for v in _views(s, who, None) if v["approval_id"] == found["approval_id"]]
    return {**view, "calls": calls}


@router.get(
    "/v1/approvals/{approval_id}",
    response_model=models.ApprovalDetail,
    responses=_ERRORS,
    summary="One request with its server-computed impact",
    tags=["approvals"],
)
def show_approval(
    request: Request, who: Who, approval_id: Annotated[str, Path(max_length=100)]
) -> dict[str, Any]:
    """One request of the tenant, its impact and the calls parked on it; another tenant's
    is `unknown_approval`, like a missing one (needs the approver role)."""
    require_approver(who, "reading an approval")
    return approval_detail(services(request), who, approval_id)


def decide(s: Services, who: KeyHolder, approval_id: str, verdict: str) -> dict[str, Any]:
    """Approve or deny as the key's user, for the key's tenant; never one's own request
    (four eyes, in the deciding statement itself)."""
    require_approver(who)
    with db.translate_errors("approvals"):
        if verdict == "approved":
            resumed = approvals.approve(s.engine, approval_id, by=who.user_id, tenant=who.tenant_id)
            count, runnable = len(resumed), resumed
        else:
            finished = approvals.deny(s.engine, approval_id, by=who.user_id, tenant=who.tenant_id)
            count, runnable = finished.finished, finished.successors
    s.dispatch(runnable)
    return {
        "approval_id": str(uuid.UUID(approval_id)),
        "state": verdict,
        "decided_by": who.user_id,
        "calls": count,
    }


@router.post(
    "/v1/approvals/{approval_id}/approve",
    response_model=models.Decision,
    responses=_ERRORS,
    summary="Grant a pending request",
    tags=["approvals"],
)
def approve(
    request: Request, who: Who, approval_id: Annotated[str, Path(max_length=100)]
) -> dict[str, Any]:
    """Grant it; its calls resume through the queue (needs the approver role; never the
    requester: `approval_forbidden`)."""
    return decide(services(request), who, approval_id, "approved")


@router.post(
    "/v1/approvals/{approval_id}/deny",
    response_model=models.Decision,
    responses=_ERRORS,
    summary="Refuse a pending request",
    tags=["approvals"],
)
def deny(
    request: Request, who: Who, approval_id: Annotated[str, Path(max_length=100)]
) -> dict[str, Any]:
    """Refuse it; its calls end `approval_denied` (same rules as approve)."""
    return decide(services(request), who, approval_id, "denied")


@router.get(
    "/v1/calls/{call}/trace",
    response_model=list[models.TraceEvent],
    responses=_ERRORS,
    summary="The audit trace of a call or a turn",
    tags=["trace"],
)
def call_trace(
    request: Request, who: Who, call: Annotated[str, Path(max_length=200)]
) -> list[dict[str, Any]]:
    """`callgate trace --json` for a call ref, a provider call id or a turn id of the key's
    own user (of its whole tenant with the `approver` or `auditor` role; another's answers
    like a missing one): every layer's verdict, never arguments, results or owner tokens."""
    user = None if who.reads_tenant_traces else who.user_id
    with db.translate_errors("trace"):
        events = audit.events(services(request).engine, call, tenant=who.tenant_id, user=user)
    return intake.redacted_trace(events)


@router.get("/healthz", response_model=models.Health, tags=["health"])
async def healthz() -> dict[str, str]:
    """The process answers (on the event loop itself: never queued behind requests)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=models.Ready,
    responses=problems.responses(503),
    tags=["health"],
)
async def readyz(request: Request) -> dict[str, Any]:
    """Postgres and Redis answer (503 `database_unavailable` / `redis_unavailable` if not).
    The checks run on a thread of their own, never queued behind requests."""
    s = services(request)
    await anyio.to_thread.run_sync(_ready, s, limiter=s.readiness)
    return {"status": "ready", "postgres": True, "redis": True}


def _ready(s: Services) -> None:
    with db.translate_errors("readyz"):
        db.ping(s.engine)
    with transport.translate_errors("readyz"):
        s.producer.redis.ping()
