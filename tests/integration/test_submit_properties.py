"""Property (issue 8, "Done when"): anything handed to ``Producer.submit`` ends either in a
stored turn with one row per proposal, or in a ``CallgateError`` with a stable code, a
one-line message and nothing stored. Real Postgres and Redis; no workers (the calls' ends
are covered where workers run)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from sqlalchemy import Engine, text

from callgate.core.errors import CallgateError, ErrorCode
from callgate.producer import Producer
from tests import hostile
from tests.integration.conftest import stored


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(submission=hostile.submissions())
def test_submit_ends_in_a_stored_turn_or_a_coded_one_line_error(
    producer: Producer,
    engine: Engine,
    submission: tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]],
) -> None:
    proposals, context, operation_ids = submission
    before = stored(engine)
    try:
        turn = producer.submit(proposals, context, operation_ids=operation_ids)
    except CallgateError as exc:
        event(f"refused: {exc.code}")
        assert exc.code in set(ErrorCode)
        assert "\n" not in str(exc) and len(str(exc)) < 500
        str(exc).encode("utf-8")  # printable on any terminal
        assert stored(engine) == before
        return
    event("stored")
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT call_id FROM callgate.calls WHERE turn_id = :t ORDER BY position"),
            {"t": turn.turn_id},
        ).scalars()
        assert list(rows) == [p["call_id"] for p in proposals]
    assert len(turn.calls) == len(proposals) >= 1
