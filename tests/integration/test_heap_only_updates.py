"""A call's way through the guarantee statements adds as few index entries as it can.

Counted by PostgreSQL itself: ``pg_stat_get_xact_tuples_hot_updated`` is this transaction's
number of heap-only (HOT) updates of a table, which add no index entry. The reservation and
the completion run in one transaction here (each is one statement; in a worker each is its
own transaction), so the counts are exactly theirs.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Connection, Engine, text

from callgate.store import completions, endings, reservations

from .test_reservations import _record, _scalar

COUNTS = """
SELECT pg_stat_get_xact_tuples_updated(CAST(:t AS regclass)) AS updated,
       pg_stat_get_xact_tuples_hot_updated(CAST(:t AS regclass)) AS hot
"""


def _counts(conn: Connection, table: str) -> tuple[int, int]:
    row = conn.execute(text(COUNTS), {"t": f"callgate.{table}"}).one()
    return row.updated, row.hot


def test_reserve_and_complete_update_their_rows_in_place(engine: Engine) -> None:
    p = _record(engine)
    turn_id = _scalar(engine, "SELECT turn_id FROM callgate.calls WHERE id = :r", r=p.ref)
    owner = uuid.uuid4()
    with engine.begin() as conn:
        generation = conn.execute(
            text(reservations.RESERVE_SQL),
            {
                "operation_id": p.operation_id,
                "call_ref": p.ref,
                "turn_id": turn_id,
                "owner_token": owner,
                "intent_hash": "intent-1",
                "canonical": "{}",
                "lease_seconds": 30,
                "detail": "{}",
            },
        ).scalar_one()
        one = completions.Completion(
            reservations.Lease(p.operation_id, owner, generation, "intent-1"),
            "succeeded",
            endings.result_body("succeeded", {"sent": True}),
            {},
        )
        finished = conn.execute(
            text(completions.COMPLETE_MANY_SQL),
            {"completions": completions.document([one])},
        ).one()
        assert (len(finished.won), finished.finished) == (1, 1)
        calls = _counts(conn, "calls")
        operations = _counts(conn, "operations")
    # The operation: pending → in_progress → succeeded, both in place (no index reads
    # its state). The call: proposed → started in place (it stays open); started →
    # succeeded leaves the open-calls index, so that one update cannot be.
    assert operations == (2, 2)
    assert calls == (2, 1)
