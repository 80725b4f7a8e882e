"""The RQ job entry point. Jobs carry a call's ref only; everything else is in Postgres."""

from __future__ import annotations

import uuid

from callgate.worker import executor, runtime


def run_call(call_ref: str) -> str:
    return executor.execute(runtime.current(), uuid.UUID(call_ref))
