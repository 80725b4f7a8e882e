"""The approval console: one HTML page and a little vanilla JS, served by ``callgate api``.

Sign-in posts an approver's key once; the answer is a session cookie (HttpOnly,
SameSite=Strict, Secure over HTTPS) naming the key id, never the key, which is not kept or
shown again. The session lives on the server too (one per key): signing out ends it, and a
new sign-in with the key replaces it. Every state-changing request carries the session's
CSRF token in ``X-CSRF-Token``. The page polls the tenant's requests every two seconds, so a request
decided elsewhere, or superseded by a changed intent, updates without a reload.
"""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Cookie, Header, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from callgate.core.errors import AccessError
from callgate.ops.http import access, auth, models, routes
from callgate.store import api_keys, turns
from callgate.store.api_keys import KeyHolder

router = APIRouter(prefix="/console", include_in_schema=False)

STATIC = FilePath(__file__).with_name("static")
# The page loads only its own script and style, and talks only to its own origin.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
RECENT = 20  # decided requests shown under the pending ones

SessionCookie = Annotated[str | None, Cookie(alias=auth.SESSION_COOKIE)]
CsrfHeader = Annotated[str | None, Header(alias="X-CSRF-Token")]


def _static(name: str, media_type: str) -> FileResponse:
    return FileResponse(
        STATIC / name,
        media_type=media_type,
        headers={
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        },
    )


@router.get("")
def page() -> FileResponse:
    return _static("console.html", "text/html; charset=utf-8")


@router.get("/console.js")
def script() -> FileResponse:
    return _static("console.js", "text/javascript; charset=utf-8")


@router.get("/console.css")
def style() -> FileResponse:
    return _static("console.css", "text/css; charset=utf-8")


def _signed_in(request: Request, cookie: str | None) -> KeyHolder:
    s = routes.services(request)
    key_id, nonce = auth.session_of(s.api.session_secret, cookie)
    principal = api_keys.session_principal(s.engine, key_id, nonce)
    request.scope.setdefault("state", {})[access.KEY_ID_STATE] = principal.key_id
    auth.require_approver(principal)
    s.limiter.take(principal)
    return principal


def _session(request: Request, principal: KeyHolder, cookie: str) -> dict[str, str]:
    return {
        "tenant_id": principal.tenant_id,
        "user_id": principal.user_id,
        "csrf_token": auth.csrf_token(routes.services(request).api.session_secret, cookie),
    }


@router.post("/session", response_model=models.Session)
def sign_in(request: Request, response: Response, body: models.SignIn) -> dict[str, str]:
    """Exchange an approver's key for a session cookie; the key is not kept."""
    s = routes.services(request)
    principal = api_keys.authenticate(s.engine, body.key)
    request.scope.setdefault("state", {})[access.KEY_ID_STATE] = principal.key_id
    auth.require_approver(principal, "signing in to the approval console")
    s.limiter.take(principal)
    cookie, nonce = auth.new_session(s.api.session_secret, principal.key_id, s.api.session_seconds)
    # Replaces the key's earlier session, if any: one session per key.
    api_keys.open_session(s.engine, principal.key_id, nonce, s.api.session_seconds)
    response.set_cookie(
        auth.SESSION_COOKIE,
        cookie,
        max_age=int(s.api.session_seconds),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/console",
    )
    return _session(request, principal, cookie)


@router.get("/session", response_model=models.Session)
def current(request: Request, session: SessionCookie = None) -> dict[str, str]:
    principal = _signed_in(request, session)
    assert session is not None
    return _session(request, principal, session)


@router.delete("/session", status_code=204)
def sign_out(request: Request, session: SessionCookie = None, csrf: CsrfHeader = None) -> Response:
    s = routes.services(request)
    auth.check_csrf(s.api.session_secret, session, csrf)
    try:
        key_id, nonce = auth.session_of(s.api.session_secret, session)
    except AccessError:
        pass  # expired already: nothing on the server to end
    else:
        # On the server, so the cookie's value, wherever it was copied, is refused next.
        api_keys.end_session(s.engine, key_id, nonce)
    out = Response(status_code=204)
    out.delete_cookie(auth.SESSION_COOKIE, path="/console", httponly=True, samesite="strict")
    return out


def _board(request: Request, principal: KeyHolder) -> dict[str, Any]:
    s = routes.services(request)
    every = routes._views(s, principal, None)
    pending = [v for v in every if v["state"] == "pending"]
    decided = sorted(
        (v for v in every if v["state"] != "pending"),
        key=lambda v: v["decided_at"] or v["created_at"],
        reverse=True,
    )[:RECENT]
    for view in (*pending, *decided):
        view["calls"] = turns.calls_of_approval(s.engine, view["approval_id"])
    return {"pending": pending, "recent": decided}


@router.get("/approvals")
async def board(request: Request, session: SessionCookie = None) -> dict[str, Any]:
    principal = await run_in_threadpool(_signed_in, request, session)
    return await run_in_threadpool(_board, request, principal)


@router.post("/approvals/{approval_id}/{verdict}", response_model=models.Decision)
def decide(
    request: Request,
    approval_id: Annotated[str, Path(max_length=100)],
    verdict: Literal["approve", "deny"],
    session: SessionCookie = None,
    csrf: CsrfHeader = None,
) -> dict[str, Any]:
    s = routes.services(request)
    auth.check_csrf(s.api.session_secret, session, csrf)
    principal = _signed_in(request, session)
    return routes.decide(
        s, principal, approval_id, "approved" if verdict == "approve" else "denied"
    )
