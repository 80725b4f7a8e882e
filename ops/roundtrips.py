"""Counts Postgres and Redis traffic per call, by phase (``python -m ops.roundtrips``).

The counting lives in ``ops.bench.roundtrips``; ``callgate bench`` reports the same figures.
"""

from __future__ import annotations

from ops.bench.roundtrips import main

if __name__ == "__main__":
    main()
