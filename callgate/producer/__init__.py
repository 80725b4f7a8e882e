"""Application side: record a turn, enqueue its calls, fan results in by call id.

from callgate.producer import Producer
producer = Producer.from_env()
turn = producer.submit(proposals, context)
fan_in = producer.collect(turn.turn_id, timeout=5)

The names are resolved on first use, so importing a pure submodule (``adapters``,
``validation``) loads no database driver, and no submodule depends on this file having run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The checkout's top-level producer/ is a link to this folder, kept for readers. Imported through
# it, every module would load a second time under another name, with its own exception
# classes, so the second path is refused.
if __name__ != "callgate.producer":
    raise ImportError(
        "import callgate.producer, not producer: "
        "the checkout's producer/ is a link kept for readers"
    )

if TYPE_CHECKING:
    from callgate.producer.async_producer import AsyncProducer
    from callgate.producer.producer import Collected, Producer

_HOME_OF = {
    "AsyncProducer": "callgate.producer.async_producer",
    "Collected": "callgate.producer.producer",
    "Producer": "callgate.producer.producer",
}

__all__ = ["AsyncProducer", "Collected", "Producer"]


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'callgate.producer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
