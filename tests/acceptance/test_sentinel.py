"""callgate behind Redis Sentinel (``redis+sentinel://``), through a real failover.

A primary, a replica and three Sentinels (tests/sentinel.py). The stack runs reads and keyed
writes through the Sentinel URL; the primary is SIGKILLed mid-run, after writes the replica
never received; the Sentinels promote the replica. Every call still ends with one result and
one downstream effect, and the jobs the new primary lacks are dispatched again from Postgres
by the sweeper's epoch rule (the replication id changed), not by the stale rule (set far
beyond the test's length).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from sqlalchemy import Engine

from callgate.core.settings import Settings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.producer.async_producer import AsyncProducer
from callgate.producer.producer import Collected
from callgate.queue import rq_format, sentinel
from tests.acceptance.conftest import SUPPORT_A, callgate, scalar, side_effects, wait_until
from tests.acceptance.test_cli_input import NEWS, one_clear_line, submit_text
from tests.sentinel import Sentinels

DELAYS = "send_email=0:300,get_stock=100"


def _turn(i: int) -> list[dict[str, Any]]:
    """A read and a keyed write (one e-mail to its own recipient)."""
    return [
        {"call_id": f"read-{i}", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}},
        {
            "call_id": f"write-{i}",
            "tool_name": "send_email",
            "arguments": {"to": f"s{i}@x.test", "template": "hi"},
        },
    ]


def _states(engine: Engine, refs: list[str]) -> dict[str, int]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT state, count(*) FROM callgate.calls WHERE id = ANY(CAST(:r AS uuid[]))"
                " GROUP BY state"
            ),
            {"r": refs},
        )
        return {state: n for state, n in rows}


def test_a_failover_loses_no_call_and_repeats_no_effect(
    service_env: dict[str, str],
    engine: Engine,
    redis_sentinels: Sentinels,
    tmp_path: Path,
) -> None:
    sentinels = redis_sentinels
    assert sentinels.primary_port_now() == sentinels.relay_port, "the set starts as built"
    # What the bench gives bare RQ's worker, whose command line reads only a plain URL.
    assert sentinel.primary_url(sentinels.url) == f"redis://127.0.0.1:{sentinels.relay_port}/0"
    env = {
        **service_env,
        "CALLGATE_REDIS_URL": sentinels.url,
        "CALLGATE_SWEEP_SECONDS": "0.2",
        # Only the epoch rule may bring the lost jobs back within the test.
        "CALLGATE_STALE_SECONDS": "600",
        "CALLGATE_DEMO_DELAY_MS": DELAYS,
    }
    log = tmp_path / "stack.log"
    producer = Producer.from_env(Settings.from_env(env))
    turns: list[Any] = []
    with Stack(env=env, workers=2, log_path=str(log)) as stack:
        wait_for_workers(sentinels.url, env["CALLGATE_QUEUE"], 2)
        # Let every sweeper see the epoch (and the replication id) it will compare with.
        time.sleep(1.0)
        turns += [producer.submit(_turn(i), SUPPORT_A) for i in range(8)]
        early = [c.ref for t in turns for c in t.calls]
        wait_until(lambda: _states(engine, early).get("succeeded", 0) >= 2, what="a few ends")
        assert _states(engine, early).get("succeeded", 0) < len(early), "not mid-run"

        # The replica stops receiving; the stack is frozen so nothing takes or re-sends the
        # jobs enqueued now: they exist on the primary alone when it dies.
        sentinels.relay.hold()
        for name in stack.alive():
            stack.signal(name, signal.SIGSTOP)
        lost_turns = [producer.submit(_turn(100 + i), SUPPORT_A) for i in range(5)]
        turns += lost_turns
        lost = [c.ref for t in lost_turns for c in t.calls]
        primary = sentinels.server(sentinels.primary_port)
        assert all(primary.exists(rq_format.job_key(r)) for r in lost)
        killed_at = time.monotonic()
        sentinels.kill(sentinels.primary_port)
        sentinels.relay.cut()
        wait_until(
            lambda: all(sentinels.primary_port_now(i) == sentinels.replica_port for i in range(3)),
            timeout=30,
            what="the Sentinels to promote the replica",
        )
        failover_seconds = time.monotonic() - killed_at
        # The new primary has never seen those jobs (so the test cannot pass vacuously).
        promoted = sentinels.server(sentinels.replica_port)
        lacking = sum(not promoted.exists(rq_format.job_key(r)) for r in lost)
        assert lacking == len(lost)
        assert promoted.exists(f"callgate:{env['CALLGATE_QUEUE']}:epoch")  # replicated long ago
        for name in stack.alive():
            stack.signal(name, signal.SIGCONT)

        # New work goes to the new primary, once the producer's client has found it.
        wait_until(lambda: _pings(producer), timeout=10, what="the producer to reach Redis")
        turns += [producer.submit(_turn(200 + i), SUPPORT_A) for i in range(3)]
        # And an asyncio application's producer (its fan-in reads the new primary's streams).
        async_turn, async_collected = asyncio.run(_async_round(env))
        assert async_collected.complete, async_collected.pending
        # And the command line's submit and collect.
        submitted = submit_text(tmp_path, env, NEWS)
        assert submitted.returncode == 0, submitted.stderr
        cli_turn = json.loads(submitted.stdout)["turn_id"]
        collected_cli = callgate("collect", cli_turn, "--timeout", "20", "--json", env=env)
        assert collected_cli.returncode == 0, collected_cli.stderr
        assert json.loads(collected_cli.stdout)["complete"] is True

        everything = [c.ref for t in turns for c in t.calls]
        try:
            wait_until(
                lambda: _states(engine, everything).get("succeeded", 0) == len(everything),
                timeout=30,
                what="every call to succeed",
            )
        except AssertionError:
            open_calls = scalar(
                engine,
                "SELECT string_agg(call_id || ':' || dispatches, ' ') FROM callgate.calls"
                " WHERE id = ANY(CAST(:r AS uuid[])) AND state <> 'succeeded'",
                r=everything,
            )
            raise AssertionError(f"calls still open (call id: dispatches): {open_calls}") from None
        all_done = time.monotonic() - killed_at
        redispatched = scalar(
            engine,
            "SELECT count(*) FROM callgate.calls WHERE id = ANY(CAST(:r AS uuid[]))"
            " AND dispatches > 1",
            r=lost,
        )
    print(
        f"\nsentinel failover: promoted {failover_seconds:.2f}s after the SIGKILL; "
        f"{lacking} job(s) missing on the new primary, {redispatched} re-dispatched; "
        f"{len(everything)} calls, all ended {all_done:.1f}s after the SIGKILL"
    )
    assert redispatched == len(lost)
    assert "changed history" in log.read_text()
    assert len(side_effects(engine, async_turn.calls[1].operation_id)) == 1
    for turn in turns:
        collected = producer.collect(turn.turn_id, timeout=10)
        assert collected.complete and not collected.pending
        assert sorted(r.call_id for r in collected.results) == sorted(c.call_id for c in turn.calls)
        for call in turn.calls:
            assert (
                scalar(
                    engine, "SELECT count(*) FROM callgate.outbox WHERE call_ref = :r", r=call.ref
                )
                == 1
            )
            if call.call_id.startswith("write-"):
                assert len(side_effects(engine, call.operation_id)) == 1, call.call_id
    producer.close()


async def _async_round(env: dict[str, str]) -> tuple[Any, Collected]:
    async with AsyncProducer.from_env(Settings.from_env(env)) as producer:
        assert isinstance(producer.redis.connection_pool, AsyncSentinelPool)
        turn = await producer.submit(_turn(300), SUPPORT_A)
        return turn, await producer.collect(turn.turn_id, timeout=20)


def _pings(producer: Producer) -> bool:
    try:
        return bool(producer.redis.ping())
    except redis_lib.RedisError:
        return False


def test_a_bad_sentinel_url_is_one_clear_line(service_env: dict[str, str]) -> None:
    env = {**service_env, "CALLGATE_REDIS_URL": "redis+sentinel://127.0.0.1:26379"}
    proc = callgate("sweeper", env=env)
    one_clear_line(proc, "invalid_configuration")
    assert "service name" in proc.stderr


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1,127.0.0.1:2/callgate"]
)
def test_unreachable_sentinels_are_redis_unavailable_as_an_unreachable_redis(
    service_env: dict[str, str], tmp_path: Path, url: str
) -> None:
    # Nothing listens on ports 1 and 2: every Sentinel refuses, as an unreachable Redis does.
    proc = submit_text(tmp_path, {**service_env, "CALLGATE_REDIS_URL": url}, NEWS)
    one_clear_line(proc, "redis_unavailable")
