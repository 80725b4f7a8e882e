"""A registry for tests: ``charge_legacy`` as an application might forget to declare it.

The same handler and downstream as ``tests.acceptance.legacy_tools`` (no idempotency key, no
fencing, no status lookup), but with no ``effect=``: what callgate assumes about a write that
says nothing about itself. Workers load it with
``CALLGATE_TOOLS=tests.acceptance.undeclared_tools:registry``.
"""

from __future__ import annotations

from callgate.tools.registry import Registry, Tool
from tests.acceptance import legacy_tools


def registry() -> Registry:
    base = legacy_tools.registry()
    declared = base.tools["charge_legacy"]
    undeclared = Tool(
        declared.name,
        declared.description,
        declared.arguments,
        declared.kind,
        declared.handler,
        downstream=declared.downstream,
    )
    others = [t for name, t in base.tools.items() if name != declared.name]
    return Registry.of([*others, undeclared], base.allowlist)
