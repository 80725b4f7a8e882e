"""The fault matrix: every round trip on a call's path × every wire fault, through real
worker, relayer and sweeper processes (tests/faults/sweep.py says what each cell checks).

The default run takes a few cells (``sweep.FAST``); ``-m slow`` the whole matrix, marked
``sweep`` too so CI's slow tier can leave it out (about 20 minutes on an idle machine). The
matrix is printed at the end of the run (tests/faults/fixtures.py) and written to
``<basetemp>/fault-matrix.md`` with each cell's evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults import sweep
from tests.faults.core import FaultKind
from tests.faults.pgproxy import PgProxy
from tests.faults.redisproxy import RedisProxy

pytestmark = pytest.mark.timeout(240)


def _cells() -> list[object]:
    """Every cell under ``-m slow`` (the whole matrix); the ``FAST`` ones also by default."""
    cells: list[object] = []
    for name, spec in sweep.ROUND_TRIPS.items():
        for kind in spec.kinds:
            cells.append(
                pytest.param(
                    name, kind, marks=[pytest.mark.slow, pytest.mark.sweep], id=f"{name}|{kind}"
                )
            )
            if (name, kind) in sweep.FAST:
                cells.append(pytest.param(name, kind, id=f"fast:{name}|{kind}"))
    return cells


@pytest.mark.parametrize(("round_trip", "kind"), _cells())
def test_cell(
    round_trip: str,
    kind: FaultKind,
    make_own_database: Callable[[], str],
    redis_url: str,
    pg_proxy: PgProxy,
    redis_proxy: RedisProxy,
    tmp_path: Path,
) -> None:
    cell = sweep.Cell(
        sweep.ROUND_TRIPS[round_trip],
        kind,
        make_own_database(),
        redis_url,
        pg_proxy,
        redis_proxy,
        tmp_path / "processes.log",
    )
    result = cell.run()
    sweep.RESULTS.append(result)
    assert result.verdict == "held", result.message()
