"""CALLGATE_MCP_CONFIG: the MCP hosts' format, each fault named by its field; and how a
tool's annotations (and the configuration's overrides) classify it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.store.mcp_catalog import Definition
from callgate.worker.mcp import config
from callgate.worker.mcp.config import ToolOverride
from callgate.worker.mcp.tools import classify


def test_stdio_and_http_servers_in_the_hosts_format() -> None:
    parsed = config.parse(
        {
            "mcpServers": {
                "time": {"command": "mcp-server-time", "args": ["--x"], "env": {"A": "1"}},
                "tickets": {
                    "type": "http",
                    "url": "https://mcp.example.com/mcp",
                    "headers": {"Authorization": "Bearer t"},
                    "roles": ["support"],
                    "timeout": 5,
                    "tools": {"close": {"destructiveHint": False, "approval": True}},
                },
            }
        }
    )
    time, tickets = parsed.servers["time"], parsed.servers["tickets"]
    assert time.transport == "stdio" and time.args == ("--x",) and time.env == {"A": "1"}
    assert time.tool_name("get_current_time") == "time__get_current_time"
    assert tickets.transport == "http" and tickets.headers == {"Authorization": "Bearer t"}
    assert tickets.roles == ("support",) and tickets.timeout == 5.0
    assert tickets.tools["close"] == ToolOverride(destructive=False, approval=True)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ([], "the document"),
        ({"servers": {}}, "servers"),
        ({"mcpServers": []}, "mcpServers"),
        ({"mcpServers": {"a__b": {"command": "x"}}}, "mcpServers.a__b"),
        ({"mcpServers": {"t": {}}}, "mcpServers.t"),
        ({"mcpServers": {"t": {"command": "x", "url": "http://h"}}}, "mcpServers.t"),
        ({"mcpServers": {"t": {"command": ""}}}, "mcpServers.t.command"),
        ({"mcpServers": {"t": {"command": "x", "args": "a b"}}}, "mcpServers.t.args"),
        ({"mcpServers": {"t": {"command": "x", "env": {"A": 1}}}}, "mcpServers.t.env"),
        ({"mcpServers": {"t": {"command": "x", "headers": {}}}}, "mcpServers.t.headers"),
        ({"mcpServers": {"t": {"url": "ftp://h"}}}, "mcpServers.t.url"),
        ({"mcpServers": {"t": {"url": "http://h", "type": "sse"}}}, "mcpServers.t.type"),
        ({"mcpServers": {"t": {"url": "http://h", "type": "stdio"}}}, "mcpServers.t.type"),
        ({"mcpServers": {"t": {"command": "x", "timeout": 0}}}, "mcpServers.t.timeout"),
        ({"mcpServers": {"t": {"command": "x", "timeout": True}}}, "mcpServers.t.timeout"),
        ({"mcpServers": {"t": {"command": "x", "roles": [" "]}}}, "mcpServers.t.roles"),
        ({"mcpServers": {"t": {"command": "x", "colour": 1}}}, "mcpServers.t.colour"),
        (
            {"mcpServers": {"t": {"command": "x", "tools": {"a": {"readOnly": True}}}}},
            "mcpServers.t.tools.a.readOnly",
        ),
        (
            {"mcpServers": {"t": {"command": "x", "tools": {"a": {"approval": "yes"}}}}},
            "mcpServers.t.tools.a.approval",
        ),
    ],
)
def test_bad_configuration_names_the_field(doc: Any, field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        config.parse(doc)
    assert caught.value.code == ErrorCode.INVALID_CONFIGURATION
    assert f": {field} " in caught.value.message


def test_the_file_must_exist_and_be_strict_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        config.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"mcpServers": {"t": {"command": "x", "timeout": NaN}}}')
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        config.load(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"mcpServers": {"t": {"command": "x"}}}))
    assert list(config.load(str(good)).servers) == ["t"]


def _definition(annotations: dict[str, Any] | None) -> Definition:
    return Definition(
        tool="t",
        digest="d",
        description="",
        input_schema={"type": "object"},
        output_schema=None,
        annotations=annotations,
    )


@pytest.mark.parametrize(
    ("annotations", "override", "expected"),
    [
        # readOnlyHint: a read, never destructive, safe to repeat.
        ({"readOnlyHint": True}, ToolOverride(), (True, False, True, False)),
        # Nothing declared: MCP's defaults (destructive, not idempotent) → an approval.
        (None, ToolOverride(), (False, True, False, True)),
        (
            {"readOnlyHint": False, "destructiveHint": False},
            ToolOverride(),
            (False, False, False, False),
        ),
        (
            {"destructiveHint": False, "idempotentHint": True},
            ToolOverride(),
            (False, False, True, False),
        ),
        ({"destructiveHint": True}, ToolOverride(approval=False), (False, True, False, False)),
        ({"readOnlyHint": True}, ToolOverride(read_only=False), (False, True, False, True)),
        ({}, ToolOverride(destructive=False, idempotent=True), (False, False, True, False)),
        ({"readOnlyHint": "yes"}, ToolOverride(), (False, True, False, True)),  # not a bool
    ],
)
def test_classification_from_annotations_and_overrides(
    annotations: dict[str, Any] | None, override: ToolOverride, expected: tuple[bool, ...]
) -> None:
    hints = classify(_definition(annotations), override)
    assert (
        hints["read_only"],
        hints["destructive"],
        hints["idempotent"],
        hints["approval"],
    ) == expected
