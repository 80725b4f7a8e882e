"""The tool catalogue: workers publish their tools' specs, a producer needs nothing else.

- A producer process with ``CALLGATE_TOOLS`` unset (or naming a module of specs, without
  handlers) submits and collects against a real worker process that has the handlers;
  neither the handlers' module nor ``callgate.worker`` is ever imported in it. The effects
  are counted at the downstream.
- Building a producer with ``CALLGATE_MCP_CONFIG`` set starts no MCP server (the server's
  command would leave a marker file) and still knows the MCP tools workers published.
- Publishers racing at start agree: one row per tool definition. A different definition
  under a published name and version is refused (``tool_definition_conflict``) and the row
  already there is kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.store import db, tool_catalog
from callgate.tools.registry import READ_ONLY, Catalog, ToolSpec
from tests.faults import tools as fault_tools

SUPPORT = {"request_id": "req-cat", "tenant_id": "t-cat", "user_id": "u-cat", "roles": ["support"]}

# Run in a producer process of its own: handler modules and the worker package are made
# unimportable, so any attempt to load them fails the submit.
PRODUCER_SCRIPT = """
import importlib.abc, json, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("tests.faults", "callgate.worker", "mcp")):
            raise ImportError(f"{name} must not be imported by a producer")
        return None

sys.meta_path.insert(0, Refuse())
from callgate import Producer

producer = Producer.from_env()
calls = [
    {"call_id": "r1", "tool_name": "fault_read", "arguments": {"n": 1}},
    {"call_id": "r2", "tool_name": "fault_read", "arguments": {"n": 2}},
    {"call_id": "w1", "tool_name": "fault_keyed", "arguments": {"note": "first"}},
    {"call_id": "w2", "tool_name": "fault_keyed", "arguments": {"note": "second"}},
]
turn = producer.submit(calls, json.loads(sys.argv[1]))
collected = producer.collect(turn.turn_id, timeout=30)
print(json.dumps({
    "kinds": {c: producer.registry.kind_of(t) for c, t in collected.proposals},
    "results": {r.call_id: r.status for r in collected.results},
    "operations": {c.call_id: c.operation_id for c in turn.calls},
    "loaded": sorted(m for m in sys.modules if m.startswith(("tests.faults", "callgate.worker"))),
}))
"""


@pytest.fixture
def own_env(
    make_own_database: Callable[[], str], redis_url: str, queue_name: str
) -> dict[str, str]:
    """A database of its own: its catalogue holds only what this test's workers publish."""
    url = make_own_database()
    fault_tools.install(url)
    return {
        "CALLGATE_DATABASE_URL": url,
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": queue_name,
    }


@pytest.fixture
def own_engine(own_env: dict[str, str]) -> Iterator[Engine]:
    engine = db.create(own_env["CALLGATE_DATABASE_URL"], pool_size=10)
    yield engine
    engine.dispose()


def _count(engine: Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar() or 0)


@pytest.mark.parametrize(
    "producer_tools", [None, "tests.integration.catalog_specs:catalog"], ids=["unset", "specs"]
)
def test_a_producer_without_handlers_submits_and_collects(
    own_env: dict[str, str], own_engine: Engine, producer_tools: str | None
) -> None:
    worker_env = {**own_env, "CALLGATE_TOOLS": "tests.faults.tools:registry"}
    with Stack(env=worker_env, workers=1, sweeper=False):
        wait_for_workers(own_env["CALLGATE_REDIS_URL"], own_env["CALLGATE_QUEUE"], 1)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
        env.update(own_env)
        if producer_tools:
            env["CALLGATE_TOOLS"] = producer_tools
        proc = subprocess.run(
            [sys.executable, "-c", PRODUCER_SCRIPT, json.dumps(SUPPORT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["loaded"] == []
    # The producer planned with the workers' kinds: the two writes ran in order, one each.
    assert out["kinds"] == {"r1": "read", "r2": "read", "w1": "write", "w2": "write"}
    assert out["results"] == dict.fromkeys(["r1", "r2", "w1", "w2"], "succeeded")
    ops = out["operations"]
    runs = "SELECT count(*) FROM faults.runs WHERE operation_id = :op"
    effects = "SELECT count(*) FROM faults.effects WHERE operation_id = :op"
    assert [_count(own_engine, runs, op=ops[c]) for c in ("r1", "r2", "w1", "w2")] == [1, 1, 1, 1]
    assert [_count(own_engine, effects, op=ops[c]) for c in ("w1", "w2")] == [1, 1]
    first, second = (
        _count(
            own_engine,
            "SELECT min(id) FROM faults.effects WHERE operation_id = :op",
            op=ops[c],
        )
        for c in ("w1", "w2")
    )
    assert first < second  # proposal order


def test_a_producer_with_an_mcp_config_starts_no_server(
    own_env: dict[str, str], own_engine: Engine, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    script = f"open({str(marker)!r}, 'a').write('started\\n')"
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "srv": {
                        "command": sys.executable,
                        "args": ["-c", script],
                        "roles": ["support"],
                        "connectTimeout": 2,
                    }
                }
            }
        )
    )
    # What a worker that started the server published for its tool.
    published = Catalog.of_specs(
        [
            ToolSpec(
                name="srv__erase",
                description="erase (MCP server srv)",
                arguments={"type": "object"},
                kind="write",
                version="0",
                schema_version="1",
            )
        ],
        {"support": ["srv__erase"]},
    )
    tool_catalog.publish(own_engine, published, sources={"srv__erase": "mcp:srv"})
    settings = Settings.from_env(
        {
            **own_env,
            "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
            "CALLGATE_MCP_CONFIG": str(config),
        }
    )
    producer = Producer.from_env(settings)
    try:
        assert producer.registry.kind_of("srv__erase") == "write"
        assert "srv__erase" in producer.registry.allowed_for(["support"])
        assert "refund_payment" in producer.registry.tools  # the application's own tools
    finally:
        producer.close()
    assert not marker.exists()  # no server was started: its first act writes the marker
    assert "callgate.worker.mcp.hub" not in sys.modules or not _hub_servers()


def _hub_servers() -> int:
    from callgate.worker.mcp import hub

    return sum(len(h.connections) for h in hub._hubs.values())


def _specs(version: str = "1", description: str = "reads") -> Catalog:
    return Catalog.of_specs(
        [
            ToolSpec("cat_read", description, {"type": "object"}, "read", version=version,
                     effect=READ_ONLY),
            ToolSpec("cat_write", "writes", {"type": "object"}, "write"),
        ],
        {"support": ["cat_read", "cat_write"]},
    )  # fmt: skip


def _rows(engine: Engine) -> list[tuple[str, int, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT tool, revision, version FROM callgate.tool_catalog ORDER BY 1, 2")
        )
        return [(r.tool, r.revision, r.version) for r in rows]


def test_publishers_racing_at_start_leave_one_row_per_definition(own_engine: Engine) -> None:
    publishers = 16
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda _: tool_catalog.publish(own_engine, _specs()), range(publishers))
        )
    assert _rows(own_engine) == [("cat_read", 1, "1"), ("cat_write", 1, "1")]
    assert all({p.revision for p in a} == {1} for a in answers)
    # A new version is the tool's next revision, and the producer reads it from then on.
    tool_catalog.publish(own_engine, _specs(version="2", description="reads, v2"))
    assert _rows(own_engine) == [("cat_read", 1, "1"), ("cat_read", 2, "2"), ("cat_write", 1, "1")]
    catalog = tool_catalog.read(own_engine)
    assert catalog.tools["cat_read"].description == "reads, v2"
    assert catalog.allowed_for(["support"]) == {"cat_read", "cat_write"}


def test_racing_versions_get_distinct_revisions(own_engine: Engine) -> None:
    versions = [str(v) for v in range(1, 11)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda v: tool_catalog.publish(own_engine, _specs(version=v)), versions))
    reads = [r for r in _rows(own_engine) if r[0] == "cat_read"]
    assert sorted(r[1] for r in reads) == list(range(1, 11))
    assert sorted(r[2] for r in reads) == sorted(versions)


def test_another_definition_under_a_published_version_is_refused(own_engine: Engine) -> None:
    tool_catalog.publish(own_engine, _specs())
    changed = _specs(description="reads, reworded without a new version")
    with pytest.raises(tool_catalog.ToolDefinitionConflict) as info:
        tool_catalog.publish(own_engine, changed)
    assert info.value.code == "invalid_configuration"
    (detail,) = info.value.details
    assert detail == {
        "code": "tool_definition_conflict",
        "tool": "cat_read",
        "version": "1",
        "schema_version": "1",
        "revision": 1,
    }
    assert _rows(own_engine) == [("cat_read", 1, "1"), ("cat_write", 1, "1")]
    assert tool_catalog.read(own_engine).tools["cat_read"].description == "reads"
