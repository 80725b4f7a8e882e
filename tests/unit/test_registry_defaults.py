"""Unsafe is the default: an undeclared effect is the most dangerous kind, and a missing
registry is a configuration error, never a silent fallback to the demo tools."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.ops.lab.demo.tools import READS, WRITES, demo_registry
from callgate.tools import registry
from callgate.tools.registry import READ_ONLY, SideEffect, Tool

SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}


def _noop(args: Any, ctx: Any) -> dict[str, Any]:
    return {}


def test_a_write_declared_without_an_effect_is_irreversible_and_not_idempotent() -> None:
    tool = Tool("charge", "Charge a card.", SCHEMA, "write", _noop)
    assert (tool.effect.idempotent, tool.effect.reversible) == (False, False)
    assert SideEffect() == SideEffect(idempotent=False, reversible=False)


def test_reads_say_so_explicitly() -> None:
    assert (READ_ONLY.idempotent, READ_ONLY.reversible) == (True, True)
    tools = demo_registry().tools
    assert all(tools[name].effect == READ_ONLY for name in READS)
    # Every demo write declares its effect; none relies on the default.
    assert tools["refund_payment"].effect == SideEffect(idempotent=False, reversible=False)
    assert tools["delete_emails"].effect == SideEffect(idempotent=True, reversible=True)
    assert set(WRITES) <= tools.keys()


@pytest.mark.parametrize("env", [{}, {"CALLGATE_TOOLS": ""}, {"CALLGATE_ALLOWLIST": "{}"}])
def test_no_registry_is_a_configuration_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError) as info:
        registry.from_env(env)
    assert info.value.code == ErrorCode.INVALID_CONFIGURATION
    message = info.value.message
    assert "CALLGATE_TOOLS" in message and "module:attribute" in message
    assert "callgate.ops.lab.demo.tools:demo_registry" in message
    assert "\n" not in message
    with pytest.raises(ConfigurationError):
        registry.load(None)


def test_the_demo_registry_loads_only_when_named() -> None:
    loaded = registry.from_env({"CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry"})
    assert loaded.tools.keys() == demo_registry().tools.keys()


@pytest.mark.parametrize(
    "declared",
    [
        {"lookup": lambda args, ctx: None},
        {"downstream": registry.Downstream(idempotency_keys=True)},
        {"downstream": registry.Downstream(fencing=True)},
        {"downstream": registry.Downstream(status_lookup=True)},
    ],
    ids=["lookup", "idempotency_keys", "fencing", "status_lookup"],
)
def test_a_read_that_declares_a_writes_contract_is_refused(declared: dict[str, Any]) -> None:
    # A read may run twice and gets no key, fence or lookup: a tool that counts on one is a
    # write, and registering it as a read would lose at-most-once without a word.
    with pytest.raises(ConfigurationError) as info:
        Tool("peek", "Look, maybe change.", SCHEMA, "read", _noop, effect=READ_ONLY, **declared)
    assert info.value.code == ErrorCode.INVALID_CONFIGURATION
    assert "kind='write'" in info.value.message and "\n" not in info.value.message
    # The same declarations on a write are its contract.
    Tool("peek", "Look, maybe change.", SCHEMA, "write", _noop, **declared)
