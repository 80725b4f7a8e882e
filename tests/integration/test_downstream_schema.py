"""A registry names the downstream schema its tools need, and `callgate up`'s migration step
installs exactly that one: the demo's tools declare theirs; any other registry gets callgate's
tables alone. Nothing guesses from the module path CALLGATE_TOOLS names."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

import psycopg

from callgate.core.settings import Settings
from callgate.ops.cli.common import DOWNSTREAMS, apply_migrations
from callgate.ops.lab.demo.tools import demo_registry
from callgate.tools import registry
from callgate.tools.registry import READ_ONLY, Registry, Tool


def application_registry() -> Registry:
    """An application's own tools, with no downstream schema for callgate to install."""
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    echo = Tool("echo", "Echo nothing.", schema, "read", lambda args, ctx: {}, effect=READ_ONLY)
    return Registry.of([echo], {"user": ["echo"]})


def _schemas(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace").fetchall()
    return {name for (name,) in rows}


def test_the_demo_registry_declares_an_installed_schema_and_keeps_it() -> None:
    declared = demo_registry().downstream_schema
    assert declared is not None
    assert metadata.entry_points(group=DOWNSTREAMS, name=declared)
    narrowed = demo_registry().with_allowlist({"viewer": ["get_weather"]})
    assert narrowed.downstream_schema == declared
    assert application_registry().downstream_schema is None


def test_up_installs_the_schema_the_named_registry_declares(
    make_database: Callable[..., str],
) -> None:
    for spec, expected in (
        ("callgate.ops.lab.demo.tools:demo_registry", True),
        (f"{__name__}:application_registry", False),
    ):
        url = make_database()
        settings = Settings.from_env({"CALLGATE_DATABASE_URL": url, "CALLGATE_TOOLS": spec})
        tools = registry.from_settings(settings)
        apply_migrations(settings, downstream=tools.downstream_schema)
        schemas = _schemas(url)
        assert "callgate" in schemas
        assert ("downstream" in schemas) is expected, (spec, schemas)
