"""Figures from the systems' own clocks: Postgres timestamps for callgate, RQ's job
timestamps for bare RQ. Nothing here trusts the bench's own wall clock for throughput."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from redis import Redis
from rq.job import Job
from rq.serializers import JSONSerializer
from sqlalchemy import Engine, text

from callgate.ops.lab.bench.procs import BenchError

# When a read started running: a read has no reservation, and its audit on the call row
# says how long its handler ran before the completion.
READ_STARTED = (
    "c.completed_at - make_interval(secs => CAST(c.audit ->> 'duration_ms' AS float8) / 1000)"
)

# Over the calls of the given turns: how many, how many ended, the first reservation (or
# the first read's start), the last completion, the last publish and the last trace event (a
# duplicate delivery may come after the completion it duplicates).
WINDOW_SQL = f"""
SELECT count(*) AS calls,
       count(*) FILTER (WHERE c.state IN ('succeeded', 'failed_retryable', 'failed_terminal'))
           AS terminal,
       count(*) FILTER (WHERE c.state = 'succeeded') AS succeeded,
       least((SELECT min(e.at) FROM callgate.trace_events AS e
               WHERE e.turn_id = ANY(CAST(:turns AS uuid[])) AND e.event = 'reserved'),
             min({READ_STARTED}) FILTER (WHERE c.audit ? 'duration_ms'))
           AS first_reserved,
       max(c.completed_at) AS last_completed,
       (SELECT max(o.published_at) FROM callgate.outbox AS o
         WHERE o.turn_id = ANY(CAST(:turns AS uuid[])))
           AS last_published,
       (SELECT count(*) FROM callgate.outbox AS o
         WHERE o.turn_id = ANY(CAST(:turns AS uuid[])) AND o.published_at IS NULL)
           AS unpublished,
       greatest((SELECT max(e.at) FROM callgate.trace_events AS e
                  WHERE e.turn_id = ANY(CAST(:turns AS uuid[]))),
                max(c.completed_at))
           AS last_event,
       (SELECT count(*) FROM callgate.trace_events AS e
         WHERE e.turn_id = ANY(CAST(:turns AS uuid[]))
           AND e.event = 'duplicate_delivery') AS duplicates
  FROM callgate.calls AS c
 WHERE c.turn_id = ANY(CAST(:turns AS uuid[]))
"""


@dataclass(frozen=True)
class Window:
    calls: int
    terminal: int
    succeeded: int
    first_reserved: datetime
    last_completed: datetime
    last_published: datetime | None
    unpublished: int
    last_event: datetime
    duplicates: int

    def per_second(self, *, until_last_event: bool = False) -> float:
        end = self.last_event if until_last_event else self.last_completed
        return self.calls / max((end - self.first_reserved).total_seconds(), 1e-6)


def window(engine: Engine, turns: Sequence[str]) -> Window:
    with engine.connect() as conn:
        row = conn.execute(text(WINDOW_SQL), {"turns": list(turns)}).mappings().one()
    if row["first_reserved"] is None or row["last_completed"] is None:
        raise BenchError(f"no call of {len(turns)} turn(s) was reserved and completed")
    return Window(**dict(row))


def unpublished(engine: Engine, turns: Sequence[str]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM callgate.outbox"
                    " WHERE turn_id = ANY(CAST(:turns AS uuid[])) AND published_at IS NULL"
                ),
                {"turns": list(turns)},
            ).scalar_one()
        )


STAGES_SQL = f"""
SELECT c.created_at AS submitted, coalesce(r.at, {READ_STARTED}) AS reserved,
       c.completed_at AS completed, o.published_at AS published
  FROM callgate.calls AS c
  JOIN LATERAL (SELECT min(e.at) AS at FROM callgate.trace_events AS e
                 WHERE e.call_ref = c.id AND e.event = 'reserved') AS r ON true
  JOIN callgate.outbox AS o ON o.call_ref = c.id
 WHERE c.turn_id = ANY(CAST(:turns AS uuid[]))
"""


def stages(engine: Engine, turns: Sequence[str]) -> dict[str, list[float]]:
    """Per call, milliseconds spent in each stage, from Postgres' timestamps."""
    with engine.connect() as conn:
        rows = conn.execute(text(STAGES_SQL), {"turns": list(turns)}).mappings().all()
    out: dict[str, list[float]] = {
        "submit→reserved": [],
        "reserved→completed": [],
        "completed→published": [],
        "submit→published": [],
    }
    for r in rows:
        out["submit→reserved"].append(_ms(r["submitted"], r["reserved"]))
        out["reserved→completed"].append(_ms(r["reserved"], r["completed"]))
        out["completed→published"].append(_ms(r["completed"], r["published"]))
        out["submit→published"].append(_ms(r["submitted"], r["published"]))
    return out


def _ms(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() * 1000


def rq_per_second(connection: Redis, job_ids: Sequence[str]) -> float:
    """Jobs per second from RQ's own timestamps: first start → last end."""
    jobs = Job.fetch_many(list(job_ids), connection=connection, serializer=JSONSerializer)
    done = [j for j in jobs if j is not None and j.started_at and j.ended_at]
    failed = [j for j in done if j.get_status() != "finished"]
    if len(done) != len(job_ids) or failed:
        raise BenchError(
            f"bare RQ: {len(done)} of {len(job_ids)} jobs ran, {len(failed)} did not finish"
        )
    first = min(j.started_at for j in done if j.started_at)
    last = max(j.ended_at for j in done if j.ended_at)
    return len(done) / max((last - first).total_seconds(), 1e-6)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 (nearest rank, so every figure is one that was measured)."""
    if not values:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan")}
    ordered = sorted(values)

    def rank(p: int) -> float:
        return round(ordered[max(0, math.ceil(len(ordered) * p / 100) - 1)], 1)

    return {"p50": rank(50), "p95": rank(95), "p99": rank(99)}
