"""Idempotency keys and intent hashes. Pure functions, no I/O."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept, floats as JSON numbers."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def idempotency_key(tenant_id: str, tool_name: str, operation_id: str) -> str:
    """``hash(tenant : tool : operation_id)``: server-owned, never a provider call id."""
    # Encoded as a JSON list, not joined with ':', so no part can shift another's boundary.
    raw = canonical_json([tenant_id, tool_name, operation_id]).encode()
    return hashlib.sha256(raw).hexdigest()


def intent_hash(
    *,
    arguments: Mapping[str, Any],
    tenant_id: str,
    user_id: str,
    tool_name: str,
    tool_version: str,
    schema_version: str,
    resource: Mapping[str, Any] | None = None,
    scope: str = "",
) -> str:
    """Fingerprint of what a write means: validated arguments plus server-owned facts.

    Key order and representation of ``arguments`` do not matter; tokens and secrets must
    not be passed in (they are not part of what the write means).
    """
    doc = {
        "arguments": dict(arguments),
        "tenant": tenant_id,
        "principal": user_id,
        "tool": tool_name,
        "tool_version": tool_version,
        "schema_version": schema_version,
        "resource": dict(resource or {}),
        "scope": scope,
    }
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()
