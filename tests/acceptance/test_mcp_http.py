"""Streamable HTTP: callgate as a client of an HTTP MCP server (with the configured headers),
and the gateway served with ``--http``, read by the SDK's own HTTP client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from callgate.core.settings import Settings
from callgate.ops.lab.chaos.services import free_port
from callgate.tools.registry import ExecutionContext
from callgate.worker import aio, runtime
from callgate.worker.mcp import hub
from tests.acceptance.mcp_world import recording_http_server, wait_for_port


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    with recording_http_server(tmp_path) as server:
        yield server


def test_an_http_server_s_tools_are_discovered_and_called(
    http_server: tuple[int, Path], tmp_path: Path
) -> None:
    port, record = http_server
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "web": {
                        "url": f"http://127.0.0.1:{port}/mcp",
                        "headers": {"X-Team": "tests"},
                        "roles": ["r"],
                    }
                }
            }
        )
    )
    settings = Settings.from_env(
        {
            "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
            "CALLGATE_MCP_CONFIG": str(config),
        }
    )
    tools, _ = runtime.load_registry(settings)
    assert {"web__echo", "web__note", "web__wipe"} <= tools.allowed_for(["r"])
    assert tools.require("web__echo").kind == "read"
    ctx = ExecutionContext(
        tenant_id="t",
        user_id="u",
        operation_id="op-http",
        idempotency_key="k",
        fencing_token=1,
        request_id="r",
    )
    answer: dict[str, Any] = aio.call(
        tools.require("web__echo").handler, {"text": "over http"}, ctx
    )
    assert answer["structuredContent"] == {"echo": "over http"}
    (line,) = [json.loads(x) for x in record.read_text().splitlines()]
    assert line["tool"] == "echo" and line["arguments"] == {"text": "over http"}
    hub.close_all()  # end the HTTP session while its server still listens


def test_the_gateway_over_http_lists_the_principal_s_tools(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.acceptance.api_server import make_key

    port = free_port()
    # Over HTTP the principal is the key's (tests/acceptance/test_mcp_gateway_auth.py).
    key = make_key(service_env, "tenant-a", "u", "viewer")["key"]
    gateway = subprocess.Popen(
        [sys.executable, "-m", "callgate.ops.cli", "mcp-gateway"],
        env={
            **service_env,
            "PATH": "/usr/bin:/bin",
            "CALLGATE_ALLOWLIST": '{"viewer": ["get_weather", "read_email"]}',
            "CALLGATE_MCP_GATEWAY_PORT": str(port),
        },
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    async def main() -> tuple[set[str], int]:
        async with (
            create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http,
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (
                read,
                write,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
            try:
                await session.call_tool("refund_payment", {})
            except MCPError as exc:
                return names, exc.code
            return names, 0

    try:
        wait_for_port(port)
        names, code = anyio.run(main)
    finally:
        gateway.terminate()
        _, stderr = gateway.communicate(timeout=10)
    assert names == {"get_weather", "read_email"}
    assert code == -32602
    assert b"Traceback" not in stderr
