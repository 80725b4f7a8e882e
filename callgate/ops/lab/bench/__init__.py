"""``callgate bench``: callgate against bare RQ, on the real Postgres and Redis.

Every figure is a ratio against a baseline measured in the same run, interleaved, median of
the repeats; throughput comes from the systems' own timestamps (Postgres for callgate, RQ's
job timestamps for bare RQ), never from the bench's clock. Correctness checks inside it
(every call ended, one side effect per redelivered write) fail the bench when they do not
hold.

``suite.run`` is the whole bench, ``config.Config`` what it measures, ``procs.BenchError`` a
result that cannot be trusted. This package imports none of its modules: each imports the
others by name, so importing one never runs the rest.
"""
