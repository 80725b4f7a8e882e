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

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from callgate.ops.lab.bench.config import Config as Config
    from callgate.ops.lab.bench.procs import BenchError as BenchError
    from callgate.ops.lab.bench.suite import run as run

# Until the bench command imports ``suite``, ``config`` and ``procs`` itself (it lives in
# callgate/ops/cli.py today and reads ``bench.run``, ``bench.Config``, ``bench.BenchError``):
# resolved on first use, so importing this package still imports none of its modules.
_MOVED = {
    "run": ("callgate.ops.lab.bench.suite", "run"),
    "Config": ("callgate.ops.lab.bench.config", "Config"),
    "BenchError": ("callgate.ops.lab.bench.procs", "BenchError"),
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attribute = _MOVED[name]
    return getattr(importlib.import_module(module), attribute)
