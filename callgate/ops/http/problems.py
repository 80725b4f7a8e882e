"""RFC 9457 problem details carrying callgate's stable error codes.

Every error the API answers is ``application/problem+json`` with ``code`` (an ``ErrorCode``
value) beside the RFC's members. Expected errors keep their message; anything unexpected is
logged with its traceback and answered as a bare ``execution_failed`` problem.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from callgate.core.errors import AccessError, CallgateError, ErrorCode
from callgate.ops import http_framing

log = logging.getLogger("callgate.api")

PROBLEM_TYPE = "application/problem+json"


# The HTTP status of each code the API can answer; any other code is a 400 (the request
# must change).
_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.ROLE_REQUIRED: 403,
    ErrorCode.APPROVAL_FORBIDDEN: 403,
    ErrorCode.CSRF_FAILED: 403,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.UNKNOWN_TURN: 404,
    ErrorCode.TURN_LOST: 410,
    ErrorCode.UNKNOWN_APPROVAL: 404,
    ErrorCode.UNKNOWN_OPERATION: 404,
    ErrorCode.UNKNOWN_API_KEY: 404,
    ErrorCode.UNKNOWN_ROUTE: 404,
    ErrorCode.APPROVAL_NOT_PENDING: 409,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.OPERATION_IN_PROGRESS: 409,
    ErrorCode.MISSING_RESULT: 409,
    ErrorCode.BODY_TIMEOUT: 408,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.TOO_MANY_WAITS: 429,
    ErrorCode.EXECUTION_FAILED: 500,
    ErrorCode.INVALID_CONFIGURATION: 500,
    ErrorCode.EMBEDDED_SERVICE_FAILED: 503,
    ErrorCode.DATABASE_UNAVAILABLE: 503,
    ErrorCode.REDIS_UNAVAILABLE: 503,
}


class Problem(BaseModel):
    """An RFC 9457 problem with callgate's stable ``code`` (see docs/errors.md)."""

    type: str = Field(description="urn:callgate:error:CODE")
    title: str = Field(description="The code, as a short title")
    status: int
    detail: str = Field(description="What went wrong and what to do; never a secret")
    code: str = Field(description="A stable callgate error code (ErrorCode)")
    details: list[dict[str, Any]] = Field(default_factory=list)


def status_of(code: ErrorCode) -> int:
    return _STATUS.get(code, 400)


def problem(
    code: ErrorCode,
    detail: str,
    *,
    details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    status: int | None = None,
) -> JSONResponse:
    status = status or status_of(code)
    body = Problem(
        type=f"urn:callgate:error:{code.value}",
        title=code.value.replace("_", " "),
        status=status,
        detail=detail,
        code=code.value,
        details=details or [],
    )
    return JSONResponse(
        body.model_dump(), status_code=status, media_type=PROBLEM_TYPE, headers=headers
    )


def from_error(exc: CallgateError) -> JSONResponse:
    headers: dict[str, str] = {}
    if isinstance(exc, AccessError) and exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, int(exc.retry_after + 0.999)))
    if exc.code == ErrorCode.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="callgate"'
    if exc.code == ErrorCode.OPERATION_IN_PROGRESS:
        headers["Retry-After"] = "1"
    return problem(exc.code, exc.message, details=exc.details, headers=headers or None)


# Documented on every route, so the OpenAPI document names every status the API answers.
def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        s: {"model": Problem, "content": {PROBLEM_TYPE: {}}, "description": "A problem"}
        for s in statuses
    }


COMMON = (400, 401, 403, 404, 405, 408, 409, 413, 429, 500, 503)


def install(app: FastAPI) -> None:
    """Answer every error as a problem: callgate's own, FastAPI's validation, unknown routes
    and methods, driver errors that escaped a translation, and anything unexpected."""

    @app.exception_handler(CallgateError)
    async def _callgate(request: Request, exc: CallgateError) -> JSONResponse:
        if status_of(exc.code) >= 500:
            log.warning("api %s: %s", exc.code, exc.message)
        return from_error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        where = "/".join(str(p) for p in errors[0]["loc"]) if errors else "(request)"
        message = str(errors[0]["msg"]) if errors else "invalid request"
        return problem(
            ErrorCode.INVALID_INPUT,
            f"{where}: {message}",
            details=[
                {"path": "/".join(str(p) for p in e["loc"]), "code": str(e["type"])}
                for e in errors[:20]
            ],
        )

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # The connection ended before the body was whole: the body timeout closed it (the
        # client got its 408 from the server: callgate.ops.http_server), or the client hung
        # up. Nobody reads this answer; the access log records it, and it is no fault.
        seconds = request.app.state.services.api.body_timeout
        return problem(ErrorCode.BODY_TIMEOUT, http_framing.body_timeout_detail(seconds))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return problem(ErrorCode.UNKNOWN_ROUTE, f"no route {request.url.path}")
        if exc.status_code == 405:
            return problem(
                ErrorCode.UNKNOWN_ROUTE,
                f"{request.method} is not allowed on {request.url.path}",
                status=405,
            )
        return problem(ErrorCode.INVALID_INPUT, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        translated = _driver_error(exc)
        if translated is not None:
            return from_error(translated)
        log.error("api: unexpected error on %s", request.url.path, exc_info=exc)
        return problem(ErrorCode.EXECUTION_FAILED, "an unexpected error; see the API's log")


def _driver_error(exc: Exception) -> CallgateError | None:
    """A driver error that escaped a narrower translation: still the service's code."""
    import redis

    from callgate.store import db

    if db.is_operational_error(exc):
        return CallgateError("cannot reach PostgreSQL", code=ErrorCode.DATABASE_UNAVAILABLE)
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return CallgateError("cannot reach Redis", code=ErrorCode.REDIS_UNAVAILABLE)
    return None


def tidy_openapi(doc: dict[str, Any]) -> dict[str, Any]:
    """Errors are documented as what they are: ``application/problem+json`` with the
    ``Problem`` schema (FastAPI would also list ``application/json``), and no 422 (a
    request FastAPI cannot validate is answered 400 ``invalid_input``, a problem too)."""
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            answers = operation.get("responses", {})
            answers.pop("422", None)
            for status, answer in answers.items():
                content = answer.get("content", {})
                if int(status) >= 400 and PROBLEM_TYPE in content:
                    schema = content.pop("application/json", {}).get("schema")
                    content[PROBLEM_TYPE] = {"schema": schema} if schema else {}
    schemas = doc.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return doc
