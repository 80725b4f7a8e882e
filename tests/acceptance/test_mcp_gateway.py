"""``callgate mcp-gateway`` driven by the official ``mcp`` SDK's own stdio client, with a
real worker behind it: list, call, a refusal, an unknown tool, an approval."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from callgate.ops.stack import Stack, wait_for_workers
from tests.acceptance.conftest import callgate
from tests.acceptance.mcp_world import World, make_world

ROLE = "mcp-user"
SLOW_START = 90.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return make_world(tmp_path_factory.mktemp("gw"), roles=(ROLE,), servers=("time", "git", "rec"))


@pytest.fixture(scope="module")
def gw_env(world: World, make_own_database: Callable[[], str], redis_url: str) -> dict[str, str]:
    return {
        "CALLGATE_DATABASE_URL": make_own_database(),
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": f"t-gw-{uuid.uuid4().hex[:8]}",
        "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
        "CALLGATE_MCP_CONFIG": str(world.config),
    }


@pytest.fixture(scope="module")
def workers(gw_env: dict[str, str], world: World) -> Iterator[Stack]:
    stack = Stack(env=gw_env, workers=1, log_path=str(world.root / "stack.log"))
    stack.__enter__()
    try:
        wait_for_workers(
            gw_env["CALLGATE_REDIS_URL"], gw_env["CALLGATE_QUEUE"], 1, timeout=SLOW_START
        )
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def context_file(world: World) -> Path:
    path = world.root / "context.json"
    path.write_text(
        json.dumps(
            {"request_id": "req-gw", "tenant_id": "tenant-a", "user_id": "user-17", "roles": [ROLE]}
        )
    )
    return path


def through_gateway(
    env: dict[str, str], context: Path, steps: Callable[[ClientSession], Any]
) -> Any:
    """Start the gateway as a host would (a subprocess on stdio), run ``steps`` on a session."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "callgate.ops.cli", "mcp-gateway", "--context", str(context), "--wait", "60"],
        env={**env, "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
    )

    async def main() -> Any:
        with open(context.parent / "gateway.stderr", "a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                with anyio.fail_after(SLOW_START):
                    await session.initialize()
                return await steps(session)

    return anyio.run(main)


def body(result: Any) -> dict[str, Any]:
    structured: dict[str, Any] = result.structured_content
    assert json.loads(result.content[0].text) == structured
    return structured


def test_a_host_lists_calls_and_is_refused_through_the_gateway(
    workers: Stack, gw_env: dict[str, str], context_file: Path, world: World
) -> None:
    async def steps(session: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["tools"] = (await session.list_tools()).tools
        out["time"] = await session.call_tool(
            "time__get_current_time", {"timezone": "Europe/Paris"}
        )
        out["refused"] = await session.call_tool("rec__echo", {"text": 7})
        for name in ("no_such_tool", "refund_payment"):  # unknown; exists, not allowed
            try:
                await session.call_tool(name, {})
            except MCPError as exc:
                out[name] = exc.code
        return out

    before = len(world.received("echo"))
    out = through_gateway(gw_env, context_file, steps)

    listed = {t.name for t in out["tools"]}
    shown = callgate("tools", "--role", ROLE, env=gw_env)
    assert listed == {d["name"] for d in json.loads(shown.stdout)}  # exactly the allowlist
    assert "time__get_current_time" in listed and "refund_payment" not in listed
    reset = next(t for t in out["tools"] if t.name == "git__git_reset")
    assert reset.annotations.destructive_hint is True and reset.annotations.read_only_hint is False

    assert out["time"].is_error is False
    answer = body(out["time"])
    assert answer["trust"] == "untrusted_tool_output"
    assert answer["content"]["structuredContent"]["timezone"] == "Europe/Paris"

    assert out["refused"].is_error is True
    refusal = body(out["refused"])
    assert refusal["status"] == "failed_terminal"
    assert refusal["error"]["code"] == "invalid_arguments"
    assert len(world.received("echo")) == before  # the gate refused it: never sent

    assert out["no_such_tool"] == -32602
    assert out["refund_payment"] == -32602


def test_a_destructive_call_waits_for_approval_and_the_same_call_continues_it(
    workers: Stack, gw_env: dict[str, str], context_file: Path, world: World
) -> None:
    (world.repo / "README").write_text("staged change\n")
    subprocess.run(["git", "add", "README"], cwd=world.repo, check=True)
    args = {"repo_path": str(world.repo)}

    def staged() -> str:
        out = subprocess.run(
            ["git", "diff", "--cached", "--name-only"],
            cwd=world.repo,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    async def steps(session: ClientSession) -> list[Any]:
        first = await session.call_tool("git__git_reset", args)
        waiting = body(first)
        assert staged() == "README"  # parked: nothing ran
        decided = await anyio.to_thread.run_sync(
            lambda: callgate(
                "approvals",
                "approve",
                waiting["approval_id"],
                "--by",
                "user-99",
                "--tenant",
                "tenant-a",
                env=gw_env,
            )
        )
        assert decided.returncode == 0, decided.stderr
        # The host asks again, as a person told it to: the same operation goes on.
        second = await session.call_tool("git__git_reset", args)
        return [first, second]

    first, second = through_gateway(gw_env, context_file, steps)
    assert first.is_error is True
    waiting = body(first)
    assert waiting["status"] == "awaiting_approval"
    assert waiting["error"]["code"] == "approval_required"
    assert waiting["impact"]["mcp_tool"] == "git_reset" and waiting["impact"]["destructive"]
    assert second.is_error is False, body(second)
    assert body(second)["trust"] == "untrusted_tool_output"
    assert staged() == ""
