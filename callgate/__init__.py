"""callgate: every proposed tool call ends in one correlated result; every write reaches its
downstream at most once.

The public API is importable from here::

    from callgate import Producer, Registry, Tool

Submodules live under ``callgate.producer`` (adapters, submit, fan-in), ``callgate.tools``
(the registry, ``@tool``, the gate's layers, safe results), ``callgate.worker`` (consumer,
executor, sandbox, MCP tools), ``callgate.daemons`` (relayer, sweeper), ``callgate.store``
(Postgres: schema, every statement), ``callgate.queue`` (Redis) and ``callgate.ops`` (CLI,
HTTP API, embedded services; ``ops.lab``: demo, chaos, bench, eval); docs/architecture.md
draws the layers. Names are resolved on first use, so ``import callgate`` stays cheap and loads
no database driver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from callgate.core.errors import (
        ApprovalError,
        CallgateError,
        ConfigurationError,
        CorrelationError,
        ErrorCode,
        InputError,
        ServiceUnavailable,
        StaleFence,
        ToolError,
        TurnLost,
        UnknownTurn,
    )
    from callgate.core.types import (
        AppError,
        CallContext,
        CorrelatedResult,
        FailedRetryable,
        FailedTerminal,
        ProposedCall,
        SafeErrorDetail,
        Succeeded,
        Turn,
        TurnCall,
    )
    from callgate.producer.async_producer import AsyncProducer
    from callgate.producer.producer import Collected, Producer
    from callgate.tools.decorator import tool
    from callgate.tools.registry import (
        READ_ONLY,
        Downstream,
        ExecutionContext,
        Facts,
        Principal,
        Registry,
        ResultLimits,
        SideEffect,
        Tool,
    )

_HOMES = {
    "callgate.producer.async_producer": ("AsyncProducer",),
    "callgate.producer.producer": ("Collected", "Producer"),
    "callgate.core.errors": (
        "ApprovalError",
        "CallgateError",
        "ConfigurationError",
        "CorrelationError",
        "ErrorCode",
        "InputError",
        "ServiceUnavailable",
        "StaleFence",
        "ToolError",
        "TurnLost",
        "UnknownTurn",
    ),
    "callgate.core.types": (
        "AppError",
        "CallContext",
        "CorrelatedResult",
        "FailedRetryable",
        "FailedTerminal",
        "ProposedCall",
        "SafeErrorDetail",
        "Succeeded",
        "Turn",
        "TurnCall",
    ),
    "callgate.tools.decorator": ("tool",),
    "callgate.tools.registry": (
        "READ_ONLY",
        "Downstream",
        "ExecutionContext",
        "Facts",
        "Principal",
        "Registry",
        "ResultLimits",
        "SideEffect",
        "Tool",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "READ_ONLY",
    "AppError",
    "ApprovalError",
    "AsyncProducer",
    "CallContext",
    "CallgateError",
    "Collected",
    "ConfigurationError",
    "CorrelatedResult",
    "CorrelationError",
    "Downstream",
    "ErrorCode",
    "ExecutionContext",
    "Facts",
    "FailedRetryable",
    "FailedTerminal",
    "InputError",
    "Principal",
    "Producer",
    "ProposedCall",
    "Registry",
    "ResultLimits",
    "SafeErrorDetail",
    "ServiceUnavailable",
    "SideEffect",
    "StaleFence",
    "Succeeded",
    "Tool",
    "ToolError",
    "Turn",
    "TurnCall",
    "TurnLost",
    "UnknownTurn",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'callgate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
