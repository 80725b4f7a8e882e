"""Shared setup of the MCP acceptance tests: a configuration naming the real
``mcp-server-time`` and ``mcp-server-git``, the tests' recording server (twice: one entry
with a short timeout) and the misbehaving raw server, a git repository to work on, and
helpers to read what the servers received."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from callgate.ops.lab.chaos.services import free_port

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
SUPPORT = {"request_id": "req-mcp", "tenant_id": "tenant-a", "user_id": "user-17"}


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


@contextmanager
def recording_http_server(root: Path) -> Iterator[tuple[int, Path]]:
    """The recording server over streamable HTTP on a free port, until the block ends:
    its port and the file it records each ``tools/call`` to."""
    port = free_port()
    record = root / "received.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "mcp_recording_server.py"), "--http", str(port)],
        env={"RECORD_FILE": str(record), "PATH": "/usr/bin:/bin"},
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield port, record
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass(frozen=True)
class World:
    root: Path
    config: Path
    record: Path
    raw_record: Path
    schema: Path
    notes: Path
    repo: Path

    def received(self, tool: str | None = None) -> list[dict[str, Any]]:
        """Every ``tools/call`` the recording servers received (of ``tool``, if given)."""
        if not self.record.exists():
            return []
        lines = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [r for r in lines if tool is None or r["tool"] == tool]


def make_world(
    root: Path, *, roles: tuple[str, ...] = ("support",), servers: tuple[str, ...] | None = None
) -> World:
    """Write the configuration (of ``servers``, default all) and the files the servers use
    under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    world = World(
        root=root,
        config=root / "mcp.json",
        record=root / "received.jsonl",
        raw_record=root / "raw-received.jsonl",
        schema=root / "echo-schema.json",
        notes=root / "notes.txt",
        repo=root / "repo",
    )
    _git_repo(world.repo)
    recording = {
        "command": sys.executable,
        "args": [str(HERE / "mcp_recording_server.py")],
        "env": {
            "RECORD_FILE": str(world.record),
            "SCHEMA_FILE": str(world.schema),
            "NOTES_FILE": str(world.notes),
        },
        "roles": list(roles),
    }
    config = {
        "mcpServers": {
            "time": {"command": str(BIN / "mcp-server-time"), "roles": list(roles)},
            "git": {"command": str(BIN / "mcp-server-git"), "roles": list(roles)},
            "rec": {**recording, "timeout": 20},
            "hung": {**recording, "timeout": 1},
            "raw": {
                "command": sys.executable,
                "args": [str(HERE / "mcp_raw_server.py")],
                "env": {"RAW_RECORD_FILE": str(world.raw_record)},
                "roles": list(roles),
                "timeout": 5,
            },
        }
    }
    if servers is not None:
        config["mcpServers"] = {k: v for k, v in config["mcpServers"].items() if k in servers}
    world.config.write_text(json.dumps(config))
    return world


def _git_repo(repo: Path) -> None:
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("config", "user.email", "tests@example.com")
    git("config", "user.name", "tests")
    (repo / "README").write_text("hello\n")
    git("add", "README")
    git("commit", "-q", "-m", "first")


def call_id() -> str:
    return f"call-{uuid.uuid4().hex[:8]}"
