"""The bench's baselines on a tiny run: each system really ran every message, the minimum
durable work left one winner, one result row and one outbox row per call, and the write
ceiling one refund per call at the payments provider (counted in Postgres, not taken from
the bench's own checks)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from callgate.ops.lab.bench import bare, durable, threaded, workload
from callgate.ops.lab.bench.procs import BenchError
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


def _count_refunds(services: Services, run: str) -> dict[str, Any]:
    """The provider's own tables, per call of the run (by the call's key): requests, refund
    rows, side effects and their fences, rejections; and each payment's refunded total."""
    per_call = f"""
    SELECT c.id::text AS call_id, c.generation,
           (SELECT count(*) FROM downstream.requests AS q
             WHERE q.idempotency_key = 'bench-min-' || c.id::text) AS requests,
           (SELECT count(*) FROM downstream.refunds AS r
             WHERE r.idempotency_key = 'bench-min-' || c.id::text) AS refunds,
           (SELECT array_agg(e.fencing_token) FROM downstream.side_effects AS e
             WHERE e.idempotency_key = 'bench-min-' || c.id::text) AS fences,
           (SELECT count(*) FROM downstream.rejections AS j
             WHERE j.idempotency_key = 'bench-min-' || c.id::text) AS rejections,
           (SELECT r.payment_id FROM downstream.refunds AS r
             WHERE r.idempotency_key = 'bench-min-' || c.id::text) AS payment_id,
           (SELECT r.amount FROM downstream.refunds AS r
             WHERE r.idempotency_key = 'bench-min-' || c.id::text) AS amount,
           (SELECT p.refunded FROM downstream.payments AS p JOIN downstream.refunds AS r
              ON r.payment_id = p.payment_id
             WHERE r.idempotency_key = 'bench-min-' || c.id::text) AS payment_refunded
      FROM {durable.SCHEMA}.calls AS c
     WHERE c.run = :run
    """
    with services.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(text(per_call), {"run": run}).mappings()]
    payments: dict[str, list[int]] = {}
    for r in rows:
        payments.setdefault(r["payment_id"], []).append(r["amount"])
    return {
        "per_call": {
            (r["requests"], r["refunds"], tuple(r["fences"] or ()), r["rejections"]) for r in rows
        },
        "calls": len(rows),
        "amounts": sorted(r["amount"] for r in rows),
        # Turns of 20 calls, one new payment each; each refunded exactly its calls' amounts.
        "turn_sizes": sorted(len(a) for a in payments.values()),
        "refunded_as_sent": all(
            r["payment_refunded"] == sum(payments[r["payment_id"]]) for r in rows
        ),
    }


@pytest.mark.timeout(240)
def test_the_write_ceiling_refunds_each_call_once_at_the_provider(
    services: Services, kept_rows: list[str]
) -> None:
    rq = bare.durable_refunds(services, CALLS, workers=2)
    dq = threaded.durable_refunds(services, CALLS, processes=2, threads=4)
    assert len(kept_rows) == 2
    for run in kept_rows:
        assert _count(services, run) == {
            "calls": CALLS,
            "won_once": CALLS,
            "results": CALLS,
            "outbox": CALLS,
            "outbox_calls": CALLS,
        }
        # Every call: one request, one refund, one side effect fenced with its generation
        # (1: reserved once), no rejection; the same amounts and turns as the write scenario.
        assert _count_refunds(services, run) == {
            "per_call": {(1, 1, (1,), 0)},
            "calls": CALLS,
            "amounts": list(range(1, CALLS + 1)),
            "turn_sizes": [workload.TURN] * (CALLS // workload.TURN),
            "refunded_as_sent": True,
        }
    for found in (rq, dq):
        assert found.per_second() > 0
        assert found.first_reserved is not None and found.last_completed is not None


def test_the_write_ceilings_check_counts_the_providers_rows(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refund missing at the provider, or sent twice, fails the check."""
    monkeypatch.setenv("CALLGATE_DATABASE_URL", services.database_url)
    run, plan = durable.seed_refunds(services.engine, 3)
    try:
        try:
            for args in plan[:2]:
                assert durable.refund(*args)
            assert durable.work(plan[2][0])  # completed, but never refunded
            # The first call's refund delivered again, as a second delivery that ignored
            # its lost reservation would: the provider replays it, but counts the request.
            durable._payments().refund(
                key=durable.refund_key(plan[0][0]),
                fence=1,
                tenant_id=plan[0][1],
                payment_id=plan[0][2],
                amount=plan[0][3],
                currency=durable.CURRENCY,
            )
        finally:
            durable.close()
        durable.read(services.engine, run).check("rows")  # the calls' own rows all hold
        found = durable.read_refunds(services.engine, run)
        assert (found.calls, found.requests, found.refunds, found.fenced) == (3, 3, 2, 2)
        with pytest.raises(BenchError, match="3 requests, made 2 refunds for 2 calls"):
            durable.checked(services.engine, run, "write ceiling", refunds=True)
    finally:
        durable.delete(services.engine, run)


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
