"""Counts Postgres and Redis traffic per call, by phase.

Run as ``python -m callgate.ops.lab.roundtrips``.

The counting lives in ``callgate.ops.lab.bench.roundtrips``; ``callgate bench`` reports the
same figures.
"""

from __future__ import annotations

from callgate.ops.lab.bench.roundtrips import main

if __name__ == "__main__":
    main()
