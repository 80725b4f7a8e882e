"""Imported after ``dramatiq_worker`` by the dramatiq runs of the minimum durable work: each
worker thread connects to Postgres when it starts, as callgate's workers do."""

from __future__ import annotations

from callgate.ops.lab.bench.dramatiq_worker import ConnectEachThread, broker

broker.add_middleware(ConnectEachThread())
