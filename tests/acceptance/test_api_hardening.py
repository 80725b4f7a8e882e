"""A real ``callgate api`` process: revoking by the whole key, the headers of every answer,
``/docs`` off by default, and connections that never finish their headers.

- ``callgate keys revoke cgk.ID.SECRET`` revokes the key (its next request is 401) and prints
  no secret, neither on success nor on a refusal;
- every answer (API, console, problems, health, the OpenAPI document) carries
  ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY`` and a CSP with
  ``frame-ancestors 'none'``; ``/v1/*`` and ``/console/*`` carry ``Cache-Control: no-store``;
- ``/docs`` (Swagger UI from a public CDN) is not served unless ``CALLGATE_API_DOCS`` turns it
  on; ``/openapi.json`` still is;
- 100 sockets that send part of their headers, one that sends nothing, and one idle after a
  whole request are all closed by the server within the configured timeouts, while a client
  whose headers arrive in two pieces inside the timeout is answered;
- a body trickled a byte at a time is answered ``408 body_timeout`` once
  ``CALLGATE_API_BODY_TIMEOUT`` passes, and a request without a key that declares a body is
  answered 401 and closed without the server waiting for any of it.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable

from tests.acceptance.api_server import ApiServer, api, env, make_key
from tests.acceptance.conftest import callgate

__all__ = ["api", "env"]  # fixtures, for pytest

HEADER_TIMEOUT = 2.0
KEEP_ALIVE = 2


def test_revoking_with_the_whole_key_revokes_it_and_never_prints_the_secret(
    api: Callable[[dict[str, str]], ApiServer], env: dict[str, str]
) -> None:
    server = api(env)
    made = make_key(env, "tenant-a", "user-17", "support")
    key, key_id = made["key"], made["key_id"]
    secret = key.split(".")[2]
    with server.client(key) as http:
        assert http.get("/v1/tools").status_code == 200

    out = callgate("keys", "revoke", key, env=env)
    assert out.returncode == 0, out.stderr
    assert secret not in out.stdout + out.stderr
    assert key_id in out.stdout
    with server.client(key) as http:
        resp = http.get("/v1/tools")
        assert resp.status_code == 401
        assert secret not in resp.text

    # Revoking it again is refused, and the refusal names the id, never the secret.
    again = callgate("keys", "revoke", key, env=env)
    assert again.returncode == 2
    assert "unknown_api_key" in again.stderr and key_id in again.stderr
    assert secret not in again.stdout + again.stderr
    # Something that is neither a key id nor a whole key is not echoed either.
    pasted = "cgk." + secret  # a key cut short: two parts, one of them the secret
    odd = callgate("keys", "revoke", pasted, env=env)
    assert odd.returncode == 2
    assert secret not in odd.stdout + odd.stderr


def _check_common(resp: object, where: str) -> None:
    headers = resp.headers  # type: ignore[attr-defined]
    assert headers.get("x-content-type-options") == "nosniff", where
    assert headers.get("x-frame-options") == "DENY", where
    assert "frame-ancestors 'none'" in headers.get("content-security-policy", ""), where


def test_every_answer_carries_the_security_headers(
    api: Callable[[dict[str, str]], ApiServer], env: dict[str, str]
) -> None:
    server = api(env)
    key = make_key(env, "tenant-a", "user-17", "support")["key"]
    with server.client(key) as http:
        no_store = {
            "GET /v1/tools": http.get("/v1/tools"),
            "GET /v1/approvals": http.get("/v1/approvals"),
            "GET /v1/turns/x/results (404)": http.get(
                "/v1/turns/00000000-0000-0000-0000-000000000000/results"
            ),
            "POST /v1/turns (400)": http.post("/v1/turns", content=b"{"),
            "GET /console": http.get("/console"),
            "GET /console/session (401)": http.get("/console/session"),
            "GET /console/approvals (401)": http.get("/console/approvals"),
            "POST /console/session (401)": http.post("/console/session", json={"key": "x"}),
        }
        others = {
            "GET /healthz": http.get("/healthz"),
            "GET /readyz": http.get("/readyz"),
            "GET /openapi.json": http.get("/openapi.json"),
            "GET /nowhere (404)": http.get("/nowhere"),
        }
    with server.client() as anonymous:
        no_store["GET /v1/tools (401)"] = anonymous.get("/v1/tools")
    for where, resp in {**no_store, **others}.items():
        _check_common(resp, where)
    for where, resp in no_store.items():
        assert resp.headers.get("cache-control") == "no-store", where
    assert others["GET /openapi.json"].status_code == 200
    assert others["GET /openapi.json"].json()["paths"]


def test_the_docs_page_is_off_unless_turned_on(
    api: Callable[[dict[str, str]], ApiServer], env: dict[str, str]
) -> None:
    off = api(env)
    with off.client() as http:
        resp = http.get("/docs")
        assert resp.status_code == 404
        _check_common(resp, "/docs off")
        assert http.get("/openapi.json").status_code == 200
    on = api({**env, "CALLGATE_API_DOCS": "on"})
    with on.client() as http:
        resp = http.get("/docs")
        assert resp.status_code == 200 and "swagger" in resp.text.lower()
        _check_common(resp, "/docs on")


def _closed_within(socks: list[socket.socket], seconds: float) -> int:
    """How many of ``socks`` the server closed (EOF or reset) within ``seconds``."""
    open_ = {s.fileno(): s for s in socks}
    closed = 0
    deadline = time.monotonic() + seconds
    while open_ and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_), [], [], 0.5)
        for fd in ready:
            s = open_[fd]
            try:
                data = s.recv(65536)
            except (ConnectionResetError, OSError):
                data = b""
            if not data:
                closed += 1
                del open_[fd]
    return closed


def test_connections_that_never_finish_their_headers_are_closed(
    api: Callable[[dict[str, str]], ApiServer], env: dict[str, str]
) -> None:
    server = api(
        {
            **env,
            "CALLGATE_API_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
            "CALLGATE_API_KEEP_ALIVE": str(KEEP_ALIVE),
        }
    )
    address = ("127.0.0.1", server.port)
    slow: list[socket.socket] = []
    try:
        for i in range(100):
            s = socket.create_connection(address, timeout=10)
            s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-{i}: ".encode())
            slow.append(s)
        silent = socket.create_connection(address, timeout=10)  # sends nothing at all
        idle = socket.create_connection(address, timeout=10)  # a whole request, then quiet
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = idle.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        # A second request begun on the same connection and never finished.
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 1")
        slow += [silent, idle]

        # A client whose headers come in two pieces, well inside the timeout, is answered.
        with socket.create_connection(address, timeout=30) as honest:
            honest.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            time.sleep(HEADER_TIMEOUT / 4)
            honest.sendall(b"Connection: close\r\n\r\n")
            assert honest.recv(65536).startswith(b"HTTP/1.1 200")

        # Generous: the timeouts are 2 s; a loaded machine gets 20 s more.
        closed = _closed_within(slow, HEADER_TIMEOUT + 20)
        assert closed == len(slow), f"{closed} of {len(slow)} stalled connections were closed"
        with server.client() as http:  # the server still serves
            assert http.get("/healthz").status_code == 200
    finally:
        for s in slow:
            s.close()


def _exchange(port: int, raw: bytes) -> tuple[bytes, bytes, bool]:
    """Send ``raw`` exactly as written on a connection of its own; the answer's status line,
    its body, and whether the server closed the connection after it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(raw)
        answer = b""
        closed = False
        while True:
            head, sep, body = answer.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")[1:]
                    if line.lower().startswith(b"content-length:")
                ),
                None,
            )
            if sep and length is not None and len(body) >= length:
                break  # whole: see whether the server hangs up after it
            data = sock.recv(65536)
            if not data:
                closed = True
                break
            answer += data
        if not closed:
            sock.settimeout(5)
            try:
                closed = sock.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed = False
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body, closed


def _turns_of(env: dict[str, str], user: str) -> int:
    from sqlalchemy import text

    from callgate.store import db

    engine = db.create(env["CALLGATE_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT count(*) FROM callgate.turns WHERE user_id = :u"), {"u": user}
            ).scalar_one()
    finally:
        engine.dispose()
    return int(found)


def test_ambiguous_http_is_refused_before_the_app_sees_it(
    api: Callable[[dict[str, str]], ApiServer], env: dict[str, str]
) -> None:
    """Requests two parsers could read two ways are answered 400 and the connection closed,
    never served by one reading: a second ``Authorization`` (the first one a valid key),
    ``Content-Length`` beside ``Transfer-Encoding: chunked`` (a real turn in the chunked
    body), ``Transfer-Encoding`` in HTTP/1.0, head lines ending in a bare LF, and a header
    folded onto a continuation line. The same requests written plainly are served."""
    import json

    server = api(env)
    key = make_key(env, "tenant-a", "user-17", "support")["key"]
    turn = json.dumps(
        [{"call_id": "w1", "tool_name": "get_weather", "arguments": {"city": "Seoul"}}]
    ).encode()
    chunked = f"{len(turn):x}\r\n".encode() + turn + b"\r\n0\r\n\r\n"
    auth = f"Authorization: Bearer {key}".encode()
    tools = b"GET /v1/tools HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    submit = b"POST /v1/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    ambiguous = {
        "two Authorization": tools + auth + b"\r\nAuthorization: Bearer cgk.x.y\r\n\r\n",
        "Content-Length and chunked": submit
        + auth
        + f"\r\nContent-Length: {len(chunked)}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + chunked,
        "HTTP/1.0 chunked": submit.replace(b"HTTP/1.1", b"HTTP/1.0")
        + auth
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked,
        "bare LF": (tools + auth + b"\r\n\r\n").replace(b"\r\n", b"\n"),
        "one bare LF": tools + auth + b"\nAccept: */*\r\n\r\n",
        "obs-fold": tools + auth + b"\r\nAccept: text/plain,\r\n application/json\r\n\r\n",
    }
    plain = {
        "one Authorization": tools + auth + b"\r\n\r\n",
        "chunked alone": submit + auth + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
    }
    for name, raw in plain.items():
        status, body, _ = _exchange(server.port, raw)
        assert status.startswith(b"HTTP/1.1 200"), (name, status, body)
    assert _turns_of(env, "user-17") == 1  # the chunked submit written plainly

    answered = {name: _exchange(server.port, raw) for name, raw in ambiguous.items()}
    statuses = {name: status.decode() for name, (status, _, _) in answered.items()}
    assert all(s.startswith("HTTP/1.1 400") for s in statuses.values()), statuses
    for name, (_, body, closed) in answered.items():
        problem = json.loads(body)
        assert problem["code"] == "invalid_input" and problem["status"] == 400, (name, problem)
        assert closed, f"{name}: the connection stayed open after the 400"
    # Neither ambiguous submit recorded a turn.
    assert _turns_of(env, "user-17") == 1
    with server.client(key) as http:  # and the server still serves
        assert http.get("/v1/tools").status_code == 200


BODY_TIMEOUT = 2.0


def _until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, float | None]:
    """Everything ``sock`` receives for up to ``seconds``, and when (seconds from now) the
    server closed it; None when it stayed open."""
    t0 = time.monotonic()
    received = b""
    while time.monotonic() - t0 < seconds:
        ready, _, _ = select.select([sock], [], [], 0.1)
        if not ready:
            continue
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            return received, time.monotonic() - t0
        received += data
    return received, None


def test_a_trickled_body_is_answered_408(
    api: Callable[[dict[str, str]], ApiServer], env: dict[str, str]
) -> None:
    """With ``CALLGATE_API_BODY_TIMEOUT=2``, a turn whose body arrives a byte every 0.2 s
    (16 s in all) is answered ``408 body_timeout`` (a problem) and its connection closed
    about 2 s after its head."""
    server = api({**env, "CALLGATE_API_BODY_TIMEOUT": str(BODY_TIMEOUT)})
    key = make_key(env, "tenant-a", "user-17", "support")["key"]
    address = ("127.0.0.1", server.port)
    body = b'[{"call_id": "c1", "tool_name": "get_weather", "arguments": {"city": "Seoul"}}]'
    head = (
        f"POST /v1/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(address, timeout=10) as slow:
        slow.sendall(head)
        t0 = time.monotonic()
        answer = b""
        for i in range(len(body)):  # 16 s of trickle, unless the server hangs up first
            try:
                slow.sendall(body[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            more, closed = _until_closed(slow, 0.2)
            answer += more
            if closed is not None:
                break
        took = time.monotonic() - t0
    print(f"\ntrickled body: {answer.split(b' ', 2)[1:2]} after {took:.2f} s")
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    head, _, problem = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower(), answer
    assert json.loads(problem)["code"] == "body_timeout", answer
    assert BODY_TIMEOUT - 0.1 < took < BODY_TIMEOUT + 3, took
    server.stop()
    time.sleep(0.5)  # the reader thread takes the last lines
    log = server.stderr()
    # The app's read of the body ended by the timeout is no fault: no error, no traceback.
    assert "Traceback" not in log and '"level": "error"' not in log, log


def test_the_body_of_a_request_without_a_key_is_never_read(
    api: Callable[[dict[str, str]], ApiServer], env: dict[str, str]
) -> None:
    """A request without a key that declares a body and sends none of it is answered 401
    (``Connection: close``) and closed at once: the server waits for none of its body, not
    even the body timeout's 2 s."""
    server = api({**env, "CALLGATE_API_BODY_TIMEOUT": str(BODY_TIMEOUT)})
    address = ("127.0.0.1", server.port)
    with socket.create_connection(address, timeout=10) as anonymous:
        anonymous.sendall(
            b"POST /v1/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 60000\r\n\r\n"
        )
        answer, closed = _until_closed(anonymous, BODY_TIMEOUT + 5)
    print(f"unauthenticated, body never sent: closed after {closed} s")
    assert answer.startswith(b"HTTP/1.1 401 "), answer
    assert b"connection: close" in answer.lower(), answer
    assert closed is not None and closed < BODY_TIMEOUT / 2, closed
