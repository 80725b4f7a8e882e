"""The bench's baselines on a tiny run: each system really ran every message, and the minimum
durable work left one winner, one result row and one outbox row per call (counted in
Postgres, not taken from the bench's own checks)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from callgate.ops.lab.bench import bare, durable, threaded
from callgate.ops.lab.bench.services import Services

pytestmark = pytest.mark.services

CALLS = 40


@pytest.fixture
def services(database_url: str, redis_url: str) -> Iterator[Services]:
    found = Services(database_url, redis_url)
    durable.install(found.engine)
    yield found
    found.engine.dispose()


@pytest.fixture
def kept_rows(monkeypatch: pytest.MonkeyPatch, services: Services) -> Iterator[list[str]]:
    """Keep each run's rows for the test to count (deleted after it instead)."""
    runs: list[str] = []
    monkeypatch.setattr(durable, "delete", lambda engine, run: runs.append(run))
    yield runs
    monkeypatch.undo()
    for run in runs:
        durable.delete(services.engine, run)


def _count(services: Services, run: str) -> dict[str, int]:
    sql = f"""
    SELECT (SELECT count(*) FROM {durable.SCHEMA}.calls WHERE run = :run) AS calls,
           (SELECT count(*) FROM {durable.SCHEMA}.calls
             WHERE run = :run AND state = 'succeeded' AND generation = 1) AS won_once,
           (SELECT count(*) FROM {durable.SCHEMA}.results AS r
              JOIN {durable.SCHEMA}.calls AS c ON c.id = r.call_id
             WHERE c.run = :run AND r.generation = 1) AS results,
           (SELECT count(*) FROM {durable.SCHEMA}.outbox AS o
              JOIN {durable.SCHEMA}.calls AS c ON c.id = o.call_id
             WHERE c.run = :run AND o.generation = 1) AS outbox,
           (SELECT count(DISTINCT o.call_id) FROM {durable.SCHEMA}.outbox AS o
              JOIN {durable.SCHEMA}.calls AS c ON c.id = o.call_id
             WHERE c.run = :run) AS outbox_calls
    """
    with services.engine.connect() as conn:
        return dict(conn.execute(text(sql), {"run": run}).mappings().one())


@pytest.mark.timeout(120)
def test_dramatiq_runs_every_message_on_every_process(services: Services) -> None:
    noops = threaded.noops(services, CALLS, processes=2, threads=4)
    assert (noops.processes, noops.messages) == (2, CALLS)
    assert noops.per_second() > 0
    sleeps = threaded.sleeps(services, 16, 50, processes=1, threads=8)
    assert (sleeps.processes, sleeps.messages) == (1, 16)
    # 16 sleeps of 50 ms on 8 threads: at least two rounds, however fast the machine.
    assert sleeps.last - sleeps.first >= 0.1
    assert not list(services.redis.scan_iter(match=f"{threaded.namespace('benchdq')}*"))


@pytest.mark.timeout(180)
def test_the_minimum_durable_work_leaves_one_result_and_one_outbox_row_per_call(
    services: Services, kept_rows: list[str]
) -> None:
    rq = bare.durable_burst(services, CALLS, workers=2)
    dq = threaded.durable_burst(services, CALLS, processes=2, threads=4)
    assert len(kept_rows) == 2
    for run in kept_rows:
        assert _count(services, run) == {
            "calls": CALLS,
            "won_once": CALLS,
            "results": CALLS,
            "outbox": CALLS,
            "outbox_calls": CALLS,
        }
    for found in (rq, dq):
        assert found.per_second() > 0
        assert found.first_reserved is not None and found.last_completed is not None
        assert found.first_reserved < found.last_completed


def test_two_deliveries_of_each_call_make_one_winner(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALLGATE_DATABASE_URL", services.database_url)
    run, ids = durable.seed(services.engine, 20)
    won: list[bool] = []
    try:

        def deliver() -> None:
            try:
                won.extend(durable.work(call_id) for call_id in ids)
            finally:
                durable.close()

        copies = [threading.Thread(target=deliver) for _ in range(2)]
        for t in copies:
            t.start()
        for t in copies:
            t.join()
        assert sorted(won) == [False] * 20 + [True] * 20
        counted = _count(services, run)
        assert counted["won_once"] == counted["results"] == counted["outbox"] == 20
    finally:
        durable.delete(services.engine, run)
