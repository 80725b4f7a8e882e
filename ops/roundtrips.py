"""Counts Postgres and Redis traffic per call, by phase.

Run as ``python -m callgate.ops.roundtrips``.

The counting lives in ``callgate.ops.bench.roundtrips``; ``callgate bench`` reports the
same figures.
"""

from __future__ import annotations

from callgate.ops.bench.roundtrips import main

if __name__ == "__main__":
    main()
