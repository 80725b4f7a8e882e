"""A misbehaving MCP server (stdio, raw JSON-RPC lines, no SDK) for the protocol faults a
real SDK server never makes. Its tools (all read-only):

- ``mismatch``: answers the call under another request id;
- ``invalid``: a JSON-RPC error ``-32602`` (invalid params);
- ``broken``: a JSON-RPC error ``-32603`` (internal error);
- ``garbled``: a result whose ``content`` is not a list;
- ``fine``: a normal result;
- ``mismatch_write``: a write (not read-only, not destructive, not idempotent) answered under
  another request id.

Each ``tools/call`` it receives (its tool, request id and ``params._meta``) is appended to
``RAW_RECORD_FILE`` when set.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TOOLS = ["mismatch", "invalid", "broken", "garbled", "fine"]
WRITES = ["mismatch_write"]


def tool(name: str) -> dict[str, Any]:
    annotations = (
        {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False}
        if name in WRITES
        else {"readOnlyHint": True}
    )
    return {
        "name": name,
        "description": f"{name} (misbehaves on purpose)",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": annotations,
    }


def answer(request: dict[str, Any]) -> dict[str, Any] | None:
    method, rid = request.get("method"), request.get("id")
    if rid is None:
        return None  # a notification
    if method == "initialize":
        return {
            "jsonrpc": "2.0",
            "id": rid,
            "result": {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "0.1"},
            },
        }
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": rid, "result": {"tools": [tool(t) for t in TOOLS + WRITES]}}
    if method != "tools/call":
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}}
    name = request["params"]["name"]
    record = os.environ.get("RAW_RECORD_FILE")
    if record:
        with open(record, "a") as f:
            meta = request["params"].get("_meta")  # the trace context callgate sent, if any
            f.write(json.dumps({"tool": name, "id": rid, "meta": meta}) + "\n")
    if name in ("mismatch", "mismatch_write"):
        return {"jsonrpc": "2.0", "id": f"{rid}-other", "result": {"content": []}}
    if name == "invalid":
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "bad params"}}
    if name == "broken":
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": "internal"}}
    if name == "garbled":
        return {"jsonrpc": "2.0", "id": rid, "result": {"content": "not a list"}}
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "result": {"content": [{"type": "text", "text": "fine"}]},
    }


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
