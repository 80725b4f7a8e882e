"""MCP tool snapshots: one version per published definition, agreed on by racing processes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine

from callgate.store import mcp_catalog
from callgate.store.mcp_catalog import Definition, ServerInfo

INFO = ServerInfo(name="srv", version="1.0", protocol_version="2025-11-25")


def _definition(tool: str, digest: str, required: list[str]) -> Definition:
    return Definition(
        tool=tool,
        digest=digest,
        description="d",
        input_schema={"type": "object", "required": required},
        output_schema=None,
        annotations={"readOnlyHint": True},
    )


def test_a_changed_definition_is_the_next_version_and_a_known_one_keeps_its_own(
    engine: Engine,
) -> None:
    server = "cat-a"
    v1 = _definition("echo", "digest-1", ["text"])
    v2 = _definition("echo", "digest-2", ["message"])
    assert mcp_catalog.record(engine, server, INFO, [v1]) == {"echo": 1}
    assert mcp_catalog.record(engine, server, INFO, [v1]) == {"echo": 1}
    assert mcp_catalog.record(engine, server, INFO, [v2]) == {"echo": 2}
    assert mcp_catalog.record(engine, server, INFO, [v1]) == {"echo": 1}  # it came back
    (latest,) = mcp_catalog.latest(engine, server)
    assert latest["version"] == 2 and latest["input_schema"]["required"] == ["message"]
    assert latest["server_version"] == "1.0" and latest["protocol_version"] == "2025-11-25"


def test_processes_discovering_at_once_agree_on_the_numbers(engine: Engine) -> None:
    server = "cat-race"
    definitions = [_definition("t", f"digest-{i % 3}", [str(i % 3)]) for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        versions = list(
            pool.map(lambda d: mcp_catalog.record(engine, server, INFO, [d])["t"], definitions)
        )
    by_digest: dict[str, set[int]] = {}
    for d, v in zip(definitions, versions, strict=True):
        by_digest.setdefault(d.digest, set()).add(v)
    assert all(len(v) == 1 for v in by_digest.values())  # one version per definition
    assert sorted(next(iter(v)) for v in by_digest.values()) == [1, 2, 3]
