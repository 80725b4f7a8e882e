"""``callgate bench``: callgate against bare RQ and a threaded queue (dramatiq), each alone and
with the minimum durable work per call (``durable``), on the real Postgres and Redis.

Every figure is a ratio against baselines measured in the same run, interleaved, median of
the repeats; throughput comes from the systems' own timestamps (Postgres for callgate and the
durable baselines, RQ's job timestamps for bare RQ, a worker middleware for dramatiq), never
from the bench's clock, first job start to last completion with every message enqueued
before the workers start. Correctness checks inside it (every call ended, every baseline ran
every message, one result and one outbox row per durable call, one side effect per
redelivered write) fail the bench when they do not hold.

``suite.run`` is the whole bench, ``config.Config`` what it measures, ``procs.BenchError`` a
result that cannot be trusted. This package imports none of its modules: each imports the
others by name, so importing one never runs the rest.
"""
