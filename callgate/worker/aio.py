"""One asyncio event loop per worker process, for tools whose handler is ``async def``.

Each in-flight call runs on a thread of its own (the executor's statements are blocking);
an async handler is handed to this loop, so its awaits on slow I/O overlap with every other
call's, and the call's thread waits for the result.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="tool-event-loop", daemon=True).start()
            _loop = loop
        return _loop


def call(handler: Callable[..., Any], *args: Any) -> Any:
    """Call ``handler(*args)``; if it is a coroutine function, await it on the loop."""
    if inspect.iscoroutinefunction(handler):
        return asyncio.run_coroutine_threadsafe(handler(*args), _running_loop()).result()
    return handler(*args)
