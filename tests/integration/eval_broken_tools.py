"""A deliberately broken executor double for the eval's tests: the built-in suite's tools,
whose downstream doubles apply a write again even when its idempotency key was applied."""

from __future__ import annotations

from callgate.ops.lab.eval.suites.builtin.tools import registry as builtin_registry
from callgate.tools.registry import Registry


def registry() -> Registry:
    return builtin_registry(honour_keys=False)
