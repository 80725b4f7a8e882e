"""A small MCP server (stdio) of the tests' own, on the official SDK: it records every
``tools/call`` it receives, so a test can count what reached the server.

Environment:

- ``RECORD_FILE``: every ``tools/call`` appends ``{"pid", "tool", "arguments"}`` as a line,
  before it is handled;
- ``SCHEMA_FILE`` (optional): the ``echo`` tool's input schema, read at each ``tools/list``;
  when the file changes, the server sends ``notifications/tools/list_changed``;
- ``NOTES_FILE`` (optional): where ``note`` appends its text.

With ``--http PORT`` it serves streamable HTTP instead of stdio.

``tools/list`` answers two tools per page, so a client must follow ``nextCursor``. Every
call also writes noise to stderr (including a line that looks like JSON-RPC): a client that
mixed stderr into the protocol stream would break.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server

PAGE = 2
ECHO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 40}},
    "required": ["text"],
    "additionalProperties": False,
}
READ = types.ToolAnnotations(read_only_hint=True, idempotent_hint=True)


def _schema_file() -> Path | None:
    value = os.environ.get("SCHEMA_FILE")
    return Path(value) if value else None


def echo_schema() -> dict[str, Any]:
    path = _schema_file()
    if path is not None and path.exists():
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    return ECHO_SCHEMA


def tools() -> list[types.Tool]:
    number = {"type": "number", "minimum": 0, "maximum": 60}
    return [
        types.Tool(
            name="echo",
            description="Echo the text back.",
            input_schema=echo_schema(),
            output_schema={
                "type": "object",
                "properties": {"echo": {"type": "string"}},
                "required": ["echo"],
            },
            annotations=READ,
        ),
        types.Tool(
            name="slow",
            description="Wait, then answer.",
            input_schema={
                "type": "object",
                "properties": {"seconds": number},
                "required": ["seconds"],
            },
            annotations=READ,
        ),
        types.Tool(
            name="note",
            description="Append a note (not idempotent).",
            input_schema={
                "type": "object",
                "properties": {"text": {"type": "string"}, "seconds": number},
                "required": ["text"],
            },
            annotations=types.ToolAnnotations(
                read_only_hint=False, destructive_hint=False, idempotent_hint=False
            ),
        ),
        types.Tool(
            name="wipe",
            description="Delete everything (destructive).",
            input_schema={
                "type": "object",
                "properties": {"target": {"type": "string"}},
                "required": ["target"],
            },
            annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
        ),
        types.Tool(
            name="fail",
            description="Fail as a tool, with the stable code asked for.",
            input_schema={
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
            annotations=READ,
        ),
        types.Tool(
            name="bad_output",
            description="Answer structured content that does not match the output schema.",
            input_schema={"type": "object", "properties": {}},
            output_schema={
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
            },
            annotations=READ,
        ),
    ]


SESSIONS: list[Any] = []


async def list_tools(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    SESSIONS[:] = [ctx.session]  # one client per server process: the latest session
    start = int(params.cursor) if params is not None and params.cursor else 0
    everything = tools()
    page = everything[start : start + PAGE]
    following = start + PAGE
    return types.ListToolsResult(
        tools=page, next_cursor=str(following) if following < len(everything) else None
    )


def _text(text: str, structured: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=structured
    )


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = dict(params.arguments or {})
    with open(os.environ["RECORD_FILE"], "a") as record:
        meta = dict(params.meta) if params.meta else None  # what `_meta` carried (trace context)
        line = {"pid": os.getpid(), "tool": params.name, "arguments": args, "meta": meta}
        record.write(json.dumps(line))
        record.write("\n")
    print(f"handling {params.name}", file=sys.stderr, flush=True)
    print('{"jsonrpc": "2.0", "id": 1, "result": {}}', file=sys.stderr, flush=True)
    if params.name == "echo":
        return _text(str(args.get("text")), {"echo": str(args.get("text"))})
    if params.name == "slow":
        await anyio.sleep(float(args["seconds"]))
        return _text("done", None)
    if params.name == "note":
        await anyio.sleep(float(args.get("seconds", 0)))
        notes = os.environ.get("NOTES_FILE")
        if notes:
            with open(notes, "a") as out:
                out.write(str(args["text"]) + "\n")
        return _text("noted", None)
    if params.name == "wipe":
        return _text(f"wiped {args['target']}", None)
    if params.name == "fail":
        code = str(args["code"])
        structured: dict[str, Any] = {"errorCode": code}
        if code == "upstream_unavailable":
            structured["retryAfterMs"] = 250
        return types.CallToolResult(
            content=[
                types.TextContent(type="text", text=f"failed as asked: {code}; password=hunter2")
            ],
            structured_content=structured,
            is_error=True,
        )
    if params.name == "bad_output":
        return _text("{}", {"n": "not a number"})
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"no tool {params.name}")], is_error=True
    )


async def watch_schema() -> None:
    """Tell connected clients when the schema file changes."""
    path = _schema_file()
    if path is None:
        return
    seen = path.read_text() if path.exists() else None
    while True:
        await anyio.sleep(0.05)
        now = path.read_text() if path.exists() else None
        if now != seen:
            seen = now
            for session in list(SESSIONS):
                await session.send_tool_list_changed()


async def main() -> None:
    server: Server[Any] = Server(
        "recording", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool
    )
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    async with stdio_server() as (read, write), anyio.create_task_group() as tasks:
        tasks.start_soon(watch_schema)
        await server.run(read, write, options)
        tasks.cancel_scope.cancel()


def main_http(port: int) -> None:
    """The same server over streamable HTTP on 127.0.0.1:PORT (path /mcp)."""
    import uvicorn

    server: Server[Any] = Server(
        "recording", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool
    )
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        main_http(int(sys.argv[2]))
    else:
        anyio.run(main)
