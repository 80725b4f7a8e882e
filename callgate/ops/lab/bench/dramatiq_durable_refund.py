"""Imported after ``dramatiq_worker`` by the dramatiq runs of the write ceiling: each worker
thread connects to Postgres and to the payments provider when it starts, so no connect falls
inside the window."""

from __future__ import annotations

from callgate.ops.lab.bench.dramatiq_worker import ConnectEachThread, broker

broker.add_middleware(ConnectEachThread(downstream=True))
