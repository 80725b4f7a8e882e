"""``CALLGATE_MCP_CONFIG``: the MCP servers to connect to, in the format MCP hosts use.

::

    {"mcpServers": {
        "time": {"command": "mcp-server-time", "args": [], "env": {}, "roles": ["support"]},
        "tickets": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "…"},
                    "tools": {"close_ticket": {"destructiveHint": false}}}
    }}

A server is stdio (``command``, optional ``args``, ``env``, ``cwd``) or streamable HTTP
(``url``, optional ``headers``); ``type`` may say which (``stdio``, ``http`` or
``streamable-http``). callgate's own keys, all optional: ``roles`` (roles allowed every tool
of the server unless ``CALLGATE_ALLOWLIST`` is set), ``timeout`` (seconds one ``tools/call``
may take, default 30), ``connectTimeout`` (seconds to start and initialise, default 30) and
``tools`` (per tool: ``readOnlyHint``, ``destructiveHint``, ``idempotentHint`` override the
server's annotations; ``approval`` forces an approval on or off). Anything else is refused
with ``invalid_configuration`` naming the field. Pure apart from reading the file.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from callgate.core.errors import ConfigurationError

SETTING = "CALLGATE_MCP_CONFIG"
# Tool names become NAME__TOOL: the server's name must not hold the separator itself.
SEPARATOR = "__"
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_ROLE = re.compile(r"^\S(.{0,198}\S)?$")
DEFAULT_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 30.0
MAX_TIMEOUT = 3600.0

_STDIO_KEYS = {"command", "args", "env", "cwd"}
_HTTP_KEYS = {"url", "headers"}
_OWN_KEYS = {"type", "roles", "timeout", "connectTimeout", "tools"}
_OVERRIDE_KEYS = {"readOnlyHint", "destructiveHint", "idempotentHint", "approval"}
_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http"}


@dataclass(frozen=True)
class ToolOverride:
    """What the configuration says about one tool, over the server's annotations."""

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    approval: bool | None = None


@dataclass(frozen=True)
class ServerConfig:
    """One MCP server: how to reach it and callgate's policy for its tools."""

    name: str
    transport: Literal["stdio", "http"]
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    roles: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    tools: Mapping[str, ToolOverride] = field(default_factory=dict)

    def tool_name(self, tool: str) -> str:
        """The name a model and the allowlist know the server's ``tool`` by."""
        return f"{self.name}{SEPARATOR}{tool}"


@dataclass(frozen=True)
class McpConfig:
    """Every configured server, by name, and the file they came from."""

    servers: Mapping[str, ServerConfig]
    source: str


def load(path: str) -> McpConfig:
    """Read and check the file ``CALLGATE_MCP_CONFIG`` names."""
    source = f"{SETTING} file {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{SETTING}={path!r}: cannot read the file ({exc})") from None
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{source} is not valid JSON: {exc.msg} at {exc.pos}") from None
    except ValueError as exc:
        raise ConfigurationError(f"{source} is not valid JSON: {exc}") from None
    return parse(doc, source=source)


def parse(doc: Any, *, source: str = SETTING) -> McpConfig:
    """Check a parsed configuration document; errors name the field that is wrong."""
    if not isinstance(doc, dict):
        raise _bad(source, "", 'must be a JSON object {"mcpServers": {...}}')
    unknown = set(doc) - {"mcpServers"}
    if unknown:
        raise _bad(source, sorted(unknown)[0], "is not a known field (expected mcpServers)")
    servers = doc.get("mcpServers")
    if not isinstance(servers, dict):
        raise _bad(source, "mcpServers", "must be an object {NAME: {...}}")
    parsed: dict[str, ServerConfig] = {}
    for name, raw in servers.items():
        parsed[name] = _server(source, name, raw)
    return McpConfig(servers=parsed, source=source)


def _server(source: str, name: str, raw: Any) -> ServerConfig:
    where = f"mcpServers.{name}"
    if not _SERVER_NAME.match(name) or SEPARATOR in name:
        raise _bad(
            source,
            where,
            "is not a usable server name: 1-32 letters, digits, '-' or '_', "
            f"starting with a letter or digit, without {SEPARATOR!r}",
        )
    if not isinstance(raw, dict):
        raise _bad(source, where, "must be an object")
    unknown = set(raw) - _STDIO_KEYS - _HTTP_KEYS - _OWN_KEYS
    if unknown:
        raise _bad(source, f"{where}.{sorted(unknown)[0]}", "is not a known field")
    declared = raw.get("type")
    if declared is not None and declared not in _TYPES:
        raise _bad(
            source,
            f"{where}.type",
            "must be 'stdio', 'http' or 'streamable-http' (SSE is not supported)",
        )
    has_command, has_url = "command" in raw, "url" in raw
    if has_command == has_url:
        raise _bad(source, where, "needs exactly one of 'command' (stdio) or 'url' (HTTP)")
    transport: Literal["stdio", "http"] = "stdio" if has_command else "http"
    if declared is not None and _TYPES[declared] != transport:
        raise _bad(source, f"{where}.type", f"says {declared!r} but the server is {transport}")
    common: dict[str, Any] = {
        "roles": _strings(source, f"{where}.roles", raw.get("roles", []), pattern=_ROLE),
        "timeout": _seconds(source, f"{where}.timeout", raw.get("timeout", DEFAULT_TIMEOUT)),
        "connect_timeout": _seconds(
            source, f"{where}.connectTimeout", raw.get("connectTimeout", DEFAULT_CONNECT_TIMEOUT)
        ),
        "tools": _overrides(source, f"{where}.tools", raw.get("tools", {})),
    }
    if transport == "stdio":
        stray = set(raw) & _HTTP_KEYS
        if stray:
            raise _bad(source, f"{where}.{sorted(stray)[0]}", "is for HTTP servers, not stdio")
        command = raw["command"]
        if not isinstance(command, str) or not command.strip():
            raise _bad(source, f"{where}.command", "must be a non-empty string")
        cwd = raw.get("cwd")
        if cwd is not None and (not isinstance(cwd, str) or not cwd):
            raise _bad(source, f"{where}.cwd", "must be a non-empty string")
        return ServerConfig(
            name=name,
            transport="stdio",
            command=command,
            args=_strings(source, f"{where}.args", raw.get("args", [])),
            env=_string_map(source, f"{where}.env", raw.get("env", {})),
            cwd=cwd,
            **common,
        )
    stray = set(raw) & _STDIO_KEYS
    if stray:
        raise _bad(source, f"{where}.{sorted(stray)[0]}", "is for stdio servers, not HTTP")
    url = raw["url"]
    if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
        raise _bad(source, f"{where}.url", "must be an http:// or https:// URL")
    return ServerConfig(
        name=name,
        transport="http",
        url=url,
        headers=_string_map(source, f"{where}.headers", raw.get("headers", {})),
        **common,
    )


def _overrides(source: str, where: str, raw: Any) -> dict[str, ToolOverride]:
    if not isinstance(raw, dict):
        raise _bad(source, where, "must be an object {TOOL: {...}}")
    out: dict[str, ToolOverride] = {}
    for tool, fields in raw.items():
        at = f"{where}.{tool}"
        if not isinstance(fields, dict):
            raise _bad(source, at, "must be an object")
        unknown = set(fields) - _OVERRIDE_KEYS
        if unknown:
            raise _bad(
                source,
                f"{at}.{sorted(unknown)[0]}",
                "is not a known field (readOnlyHint, destructiveHint, idempotentHint, approval)",
            )
        for key, value in fields.items():
            if not isinstance(value, bool):
                raise _bad(source, f"{at}.{key}", "must be true or false")
        out[tool] = ToolOverride(
            read_only=fields.get("readOnlyHint"),
            destructive=fields.get("destructiveHint"),
            idempotent=fields.get("idempotentHint"),
            approval=fields.get("approval"),
        )
    return out


def _strings(
    source: str, where: str, raw: Any, *, pattern: re.Pattern[str] | None = None
) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise _bad(source, where, "must be a list of strings")
    if pattern is not None:
        for value in raw:
            if not pattern.match(value):
                raise _bad(source, where, f"holds an unusable name {value!r}")
    return tuple(raw)


def _string_map(source: str, where: str, raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise _bad(source, where, "must be an object of strings")
    return dict(raw)


def _seconds(source: str, where: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise _bad(source, where, "must be a number of seconds")
    value = float(raw)
    if not math.isfinite(value) or value <= 0 or value > MAX_TIMEOUT:
        raise _bad(source, where, f"must be more than 0 and at most {MAX_TIMEOUT:g} seconds")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _bad(source: str, where: str, problem: str) -> ConfigurationError:
    field_name = where or "the document"
    return ConfigurationError(f"{source}: {field_name} {problem}")
