"""Requests that two HTTP parsers could read two ways are refused before anything reads them.

A proxy in front and callgate must agree on where a request ends and what it says, or a
request can be smuggled past the proxy's checks inside another (RFC 9112 §11.2). h11, the
parser ``callgate api`` and ``mcp-gateway --http`` run on, accepts each of these quietly,
so ``StrictConnection`` refuses them first:

- a head line that ends in a bare LF, not CRLF (RFC 9112 §2.2 lets a server accept one; a
  proxy that does not splits the head elsewhere);
- a header folded onto a continuation line (obs-fold, RFC 9112 §5.2);
- ``Content-Length`` beside ``Transfer-Encoding`` (§6.1: h11 goes by the chunks, a proxy
  may go by the length), and ``Transfer-Encoding`` in an HTTP/1.0 request (§6.1: faulty);
- a second ``Authorization``: the first one wins in the app, another reader may take the
  last, so whose request it is would depend on who reads it. (A second ``Host`` and
  differing ``Content-Length`` values h11 refuses itself.)

Each is answered 400 ``invalid_input`` (a problem, like every error of the API) and the
connection is closed, so nothing after the refused head is read as a request either.
"""

from __future__ import annotations

import json
import re
from typing import Any

import h11

from callgate.core.errors import ErrorCode

# Where h11 ends a request head: the first empty line, LF or CRLF terminated.
_HEAD_END = re.compile(rb"\n\r?\n")
# Headers that name whose request it is: one each, or the request is refused.
_ONE_ONLY = (b"authorization",)


class Refused(h11.RemoteProtocolError):
    """A request refused for its framing; the message says which rule and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_status_hint=400)


def check_head(buffered: bytes) -> None:
    """Refuse a whole request head at the start of ``buffered`` that ends a line in a bare LF
    or folds a header; a head not yet whole is left to arrive (and to h11's size cap)."""
    end = _HEAD_END.search(buffered)
    if end is None:
        return
    head = buffered[: end.end()]
    if head.count(b"\n") != head.count(b"\r\n"):
        raise Refused("a line of the request head ends in a bare LF; end every line with CRLF")
    if b"\r\n " in head or b"\r\n\t" in head:
        raise Refused(
            "a header is folded onto a continuation line (obs-fold); send each on one line"
        )


def check_request(request: h11.Request) -> None:
    """Refuse a parsed head whose framing or principal is ambiguous."""
    names = [name for name, _ in request.headers]  # h11 lower-cases them
    if b"transfer-encoding" in names:
        if b"content-length" in names:
            raise Refused(
                "Content-Length and Transfer-Encoding together frame the body two ways; "
                "send one of them"
            )
        if request.http_version == b"1.0":
            raise Refused("HTTP/1.0 has no Transfer-Encoding; send Content-Length")
    for name in _ONE_ONLY:
        if names.count(name) > 1:
            raise Refused(f"{name.decode().title()} is sent more than once; send it once")


class StrictConnection(h11.Connection):
    """h11's server connection with the checks above, run before h11 reads a head and on
    the head it parsed. ``refused`` keeps the last refusal for the answer."""

    refused: Refused | None = None

    def next_event(self) -> Any:
        try:
            if self.their_state is h11.IDLE:
                check_head(self.trailing_data[0])
            event = super().next_event()
            if isinstance(event, h11.Request):
                check_request(event)
        except Refused as exc:
            self.refused = exc
            raise
        return event


def body_timeout_detail(seconds: float) -> str:
    return (
        f"the request body was not whole within {seconds:g} s of its head "
        "(CALLGATE_API_BODY_TIMEOUT); send the body at once, or ask for a longer timeout"
    )


def answer_400(conn: h11.Connection) -> bytes:
    """The bytes of a ``400 invalid_input`` problem closing the connection: the refusal's own
    message, or h11's malformed-request one."""
    refused = conn.refused if isinstance(conn, StrictConnection) else None
    detail = str(refused) if refused is not None else "the request is not valid HTTP/1.1"
    return answer(conn, 400, ErrorCode.INVALID_INPUT, detail)


def answer(conn: h11.Connection, status: int, code: ErrorCode, detail: str) -> bytes:
    """The bytes of a problem closing the connection, written by the server itself (the app
    never saw the request, or no longer may answer it)."""
    body = json.dumps(
        {
            "type": f"urn:callgate:error:{code.value}",
            "title": code.value.replace("_", " "),
            "status": status,
            "detail": detail,
            "code": code.value,
            "details": [],
        }
    ).encode()
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-content-type-options", b"nosniff"),
        (b"cache-control", b"no-store"),
    ]
    events = [
        h11.Response(status_code=status, headers=headers, reason=_REASONS[status]),
        h11.Data(data=body),
        h11.EndOfMessage(),
    ]
    return b"".join(conn.send(event) or b"" for event in events)


_REASONS = {400: b"Bad Request", 408: b"Request Timeout"}
