"""``callgate mcp-gateway --http``: every request needs an API key, and acts as its principal.

A real gateway process over streamable HTTP, a real worker behind it and real keys made with
``callgate keys create``:

- no key, a malformed key, a wrong secret or a revoked key: 401 (``WWW-Authenticate: Bearer``),
  before any MCP message is read, and nothing is recorded;
- a valid key initialises, lists its own roles' tools and runs a refund recorded in Postgres
  as the key's tenant and user;
- another key cannot use a session that key opened;
- the DNS-rebinding filter takes the hosts it is told: with ``--host 0.0.0.0`` a client
  sending an allowed Host gets in with its key, a forged ``Host: 127.0.0.1:PORT`` still needs
  one, and a Host not allowed is 421.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from sqlalchemy import Engine

from callgate.ops.lab.chaos.services import free_port
from callgate.ops.stack import Stack, wait_for_workers
from tests.acceptance.api_server import engine, env, make_key
from tests.acceptance.conftest import callgate, scalar
from tests.acceptance.mcp_world import wait_for_port

__all__ = ["engine", "env"]  # fixtures, for pytest

REFUND = {"order_id": "O-17", "amount": 500, "currency": "KRW"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


@pytest.fixture
def workers(env: dict[str, str]) -> Iterator[Stack]:
    stack = Stack(env=env, workers=1)
    stack.__enter__()
    try:
        wait_for_workers(env["CALLGATE_REDIS_URL"], env["CALLGATE_QUEUE"], 1, timeout=90)
        yield stack
    finally:
        stack.stop()


class Gateway:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> bytes:
        if self.proc.poll() is None:
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=15)
        return err


@pytest.fixture
def gateway(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def start(*args: str, port: int | None = None, **extra_env: str) -> Gateway:
        port = port or free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "callgate.ops.cli", "mcp-gateway", "--http", str(port), *args],
            env={**os.environ, **env, **extra_env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        gw = Gateway(proc, port)
        started.append(gw)
        wait_for_port(port, timeout=60)
        return gw

    yield start
    for gw in started:
        assert b"Traceback" not in gw.stop()


def _session(url: str, key: str | None, steps: Callable[[ClientSession], Any]) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def main() -> Any:
        async with (
            create_mcp_http_client(headers=headers) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            with anyio.fail_after(90):
                await session.initialize()
                return await steps(session)

    return anyio.run(main)


def _turns(engine: Engine) -> list[str]:
    return list(
        scalar(
            engine,
            "SELECT coalesce(array_agg(tenant_id || '|' || user_id ORDER BY created_at),"
            " '{}') FROM callgate.turns",
        )
    )


def _post(url: str, key: str | None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **headers}, timeout=30)


def test_a_client_without_a_valid_key_is_refused(
    workers: Stack, env: dict[str, str], engine: Engine, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway()
    good = make_key(env, "tenant-a", "user-17", "support")
    revoked = make_key(env, "tenant-a", "user-17", "support")
    assert callgate("keys", "revoke", revoked["key_id"], env=env).returncode == 0
    key_id, secret = good["key"].split(".")[1:]
    refused = {
        "none": None,
        "malformed": "not-a-key",
        "wrong secret": f"cgk.{key_id}.{secret[::-1]}",
        "unknown id": f"cgk.ak0000000000000000.{secret}",
        "revoked": revoked["key"],
    }
    for what, key in refused.items():
        resp = _post(gw.url, key)
        assert resp.status_code == 401, (what, resp.status_code, resp.text)
        assert resp.headers["www-authenticate"].lower().startswith("bearer"), what
        assert "mcp-session-id" not in resp.headers, what
        assert secret not in resp.text

    # The SDK's own client, without a key, cannot even initialise.
    async def run_refund(session: ClientSession) -> Any:
        return await session.call_tool("refund_payment", REFUND)

    with pytest.raises(Exception):  # noqa: B017 — the SDK raises its transport error
        _session(gw.url, None, run_refund)
    assert _turns(engine) == []  # nothing was recorded for anyone


def test_a_valid_key_acts_as_its_own_principal(
    workers: Stack, env: dict[str, str], engine: Engine, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway()
    b = make_key(env, "tenant-b", "user-42", "support")["key"]
    viewer = make_key(env, "tenant-a", "user-6", "viewer")["key"]

    async def steps(session: ClientSession) -> dict[str, Any]:
        names = {t.name for t in (await session.list_tools()).tools}
        result = await session.call_tool("refund_payment", REFUND)
        return {"names": names, "result": result.structured_content}

    out = _session(gw.url, b, steps)
    assert "refund_payment" in out["names"]
    # tenant-b may use the tool, but O-17 is tenant-a's: the gate judged the key's principal.
    assert out["result"]["error"]["code"] == "permission_denied", out
    assert _turns(engine) == ["tenant-b|user-42"]

    # A key whose roles do not allow the tool is shown none of it and cannot call it.
    async def as_viewer(session: ClientSession) -> set[str]:
        return {t.name for t in (await session.list_tools()).tools}

    assert "refund_payment" not in _session(gw.url, viewer, as_viewer)


def test_a_session_opened_with_one_key_cannot_be_used_with_another(
    workers: Stack, env: dict[str, str], engine: Engine, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway()
    a = make_key(env, "tenant-a", "user-17", "support")["key"]
    b = make_key(env, "tenant-b", "user-42", "support")["key"]
    opened = _post(gw.url, a)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "refund_payment", "arguments": REFUND},
    }
    resp = httpx.post(
        gw.url,
        json=call,
        headers={
            **MCP_HEADERS,
            "Authorization": f"Bearer {b}",
            "mcp-session-id": session,
            "mcp-protocol-version": "2025-06-18",
        },
        timeout=30,
    )
    assert resp.status_code == 404, resp.text  # answered as an unknown session
    assert _turns(engine) == []


def test_the_hosts_the_rebinding_filter_allows_are_configurable(
    env: dict[str, str], gateway: Callable[..., Gateway]
) -> None:
    key = make_key(env, "tenant-a", "user-17", "support")["key"]
    port = free_port()
    # Listening on every address with only the loopback names allowed would turn honest
    # remote clients away (421) while a forged loopback Host got in: refused at start.
    refused = callgate("mcp-gateway", "--http", str(port), "--host", "0.0.0.0", env=env)
    assert refused.returncode == 2
    assert "--allowed-hosts" in refused.stderr and "Traceback" not in refused.stderr
    # --context belongs to stdio: over HTTP the key names the principal.
    ctx = '{"request_id": "r", "tenant_id": "tenant-a", "user_id": "user-17", "roles": ["x"]}'
    with_context = callgate(
        "mcp-gateway", "--http", str(port), "--context", "-", env=env, stdin=ctx
    )
    assert with_context.returncode == 2 and "--context is for stdio" in with_context.stderr

    gw = gateway(
        "--host",
        "0.0.0.0",
        port=port,
        CALLGATE_MCP_GATEWAY_ALLOWED_HOSTS=f"gw.example.test:{port}, 127.0.0.1:*",
        CALLGATE_MCP_GATEWAY_ALLOWED_ORIGINS="https://app.example.test",
    )
    honest = {"Host": f"gw.example.test:{port}"}
    assert _post(gw.url, key, **honest).status_code == 200
    assert _post(gw.url, None, **honest).status_code == 401
    forged = {"Host": f"127.0.0.1:{port}"}
    assert _post(gw.url, None, **forged).status_code == 401  # a loopback Host needs a key too
    assert _post(gw.url, key, Host=f"elsewhere.test:{port}").status_code == 421
    assert _post(gw.url, key, Origin="https://app.example.test", **honest).status_code == 200
    assert _post(gw.url, key, Origin="https://evil.test", **honest).status_code == 403
