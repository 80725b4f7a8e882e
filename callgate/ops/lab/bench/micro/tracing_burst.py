"""One no-op burst through real processes: N reads submitted, then drained by W
``callgate worker --burst`` processes at K = 8 and one relayer; prints calls per second
(first reservation to last completion). Not a test; run by hand, interleaving the sides
you compare (it checks only that every call ended):

    python -m callgate.ops.lab.bench.micro.tracing_burst 1000 2

and again with ``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318`` set (the SDK exporting).

For an older commit, run the same file with ``PYTHONPATH`` at that commit's checkout and a
database of its own (its migrations differ). Uses CALLGATE_DATABASE_URL and
CALLGATE_REDIS_URL.
"""

from __future__ import annotations

import sys

from callgate.core.settings import Settings
from callgate.ops.lab.bench import pipeline, workload
from callgate.ops.lab.bench.services import Services


def main(calls: int, workers: int) -> None:
    services = Services.prepare(Settings.from_env())
    run = pipeline.burst(
        services, workload.reads(calls), workers=workers, CALLGATE_WORKER_CONCURRENCY="8"
    )
    print(f"W={workers} {run.window.per_second():.1f}/s", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
