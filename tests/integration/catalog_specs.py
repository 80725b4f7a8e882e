"""A tool module without handlers, for a producer: ``Catalog`` of ``ToolSpec``s only.

The fault tools' specs (``tests.faults.tools``) written out as JSON Schema; nothing here
imports their handlers. A producer loads it with
``CALLGATE_TOOLS=tests.integration.catalog_specs:catalog``.
"""

from __future__ import annotations

from callgate.tools.registry import READ_ONLY, Catalog, SideEffect, ToolSpec

_WRITE_ARGS = {
    "type": "object",
    "properties": {"note": {"type": "string"}, "hold_seconds": {"type": "number"}},
    "required": ["note"],
}

catalog = Catalog.of_specs(
    [
        ToolSpec(
            name="fault_read",
            description="A read that records its run.",
            arguments={"type": "object", "properties": {"n": {"type": "integer"}}},
            kind="read",
            effect=READ_ONLY,
        ),
        ToolSpec(
            name="fault_keyed",
            description="A write; its downstream honours idempotency keys.",
            arguments=_WRITE_ARGS,
            kind="write",
            effect=SideEffect(),
        ),
    ],
    {"support": ["fault_read", "fault_keyed"]},
)
