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
  whose headers arrive in two pieces inside the timeout is answered.
"""

from __future__ import annotations

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
