"""A real Prometheus (Debian's binary) scrapes real worker, relayer and sweeper processes
every second, evaluates ops/prometheus/rules, and is asked over its HTTP API.

The run: a refund whose worker is SIGKILLed while its handler runs (the sweeper
re-dispatches it once the lease expires, and a second worker takes it over), and a batch
delete parked for an approval. What Prometheus reports must match what happened.
``side_effect_counts`` reads the side-effect recording rules, for the assertions on them.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine

from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from tests.acceptance.conftest import REFUND_O17, SUPPORT_A, scalar, wait_until
from tests.acceptance.prometheus_server import Prometheus, free_port_block

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

FAST = {
    "CALLGATE_LEASE_SECONDS": "1",
    "CALLGATE_SWEEP_SECONDS": "0.2",
    "CALLGATE_STALE_SECONDS": "1",
}
WORKERS = 3  # worker-1 is killed; worker-2 and worker-3 may start later


@pytest.fixture
def database_url(make_own_database: Callable[[], str]) -> str:
    """Its own database: the gauges count every open row, the sweeper re-dispatches any."""
    return make_own_database()


@pytest.fixture
def prometheus() -> Iterator[Callable[[dict[str, list[int]]], Prometheus]]:
    """Start a Prometheus scraping the given targets (job -> ports); stopped after."""
    started: list[Prometheus] = []

    def start(targets: dict[str, list[int]]) -> Prometheus:
        p = Prometheus(targets)
        started.append(p)
        p.start()
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def observed(
    service_env: dict[str, str], prometheus: Callable[[dict[str, list[int]]], Prometheus]
) -> Iterator[tuple[Stack, Prometheus]]:
    """Relayer, sweeper and one slow worker serving /metrics, and a Prometheus scraping
    them (and the ports of the workers a test starts later)."""
    stack = Stack(
        env={**service_env, **FAST},
        workers=1,
        metrics_port=free_port_block(2 + WORKERS),
    )
    ports = {f"worker-{i}": stack.port_of(f"worker-{i}") for i in range(1, WORKERS + 1)}
    prom = prometheus(
        {
            "callgate-worker": sorted(ports.values()),
            "callgate-relayer": [stack.port_of("relayer")],
            "callgate-sweeper": [stack.port_of("sweeper")],
        }
    )
    # worker-1's refund handler waits 4 s before the downstream write: time to kill it.
    stack.env = {**stack.env, "CALLGATE_DEMO_DELAY_MS": "refund_payment=4000"}
    with stack:
        wait_for_workers(service_env["CALLGATE_REDIS_URL"], service_env["CALLGATE_QUEUE"], 1)
        stack.env = {**stack.env, "CALLGATE_DEMO_DELAY_MS": ""}
        yield stack, prom


def side_effect_counts(prom: Prometheus, tool: str) -> dict[str, float]:
    """The side-effect recording rules for ``tool`` over the last 15 minutes."""
    return {
        name: prom.value(f'round(tool:callgate_{name}:increase15m{{tool="{tool}"}})') or 0.0
        for name in ("side_effects", "write_operations", "write_handler_invocations")
    }


def wait_scraped(prom: Prometheus, jobs: dict[str, int]) -> None:
    """Until Prometheus has scraped ``jobs`` (job -> how many targets up)."""

    def ready() -> bool:
        health = prom.targets_health()
        return all(
            sum(1 for k, v in health.items() if k.startswith(job + "/") and v == "up") >= n
            for job, n in jobs.items()
        )

    wait_until(ready, timeout=30, what=f"targets up: {jobs}")


def test_prometheus_sees_the_run(
    observed: tuple[Stack, Prometheus], producer: Producer, engine: Engine
) -> None:
    stack, prom = observed
    wait_scraped(prom, {"callgate-worker": 1, "callgate-relayer": 1, "callgate-sweeper": 1})
    assert {
        "tool:callgate_side_effects_per_write_operation:ratio_rate5m",
        "tool:callgate_side_effects_per_handler_invocation:ratio_rate5m",
        "tool:callgate_side_effects_excess:increase15m",
        "CallgateDuplicateSideEffect",
    } <= prom.rule_names()
    prom.wait_for("max(callgate_state_source_up)", lambda v: v == 1, what="state gauges")
    prom.wait_for("min(callgate_state_source_up)", lambda v: v == 1, what="state gauges")

    # A batch delete of 50 e-mails waits for an approval: the gauge shows it.
    parked = producer.submit(
        [{"call_id": "del", "tool_name": "delete_emails", "arguments": {"query": "policy update"}}],
        SUPPORT_A,
    )
    prom.wait_for("callgate:approvals_pending:max", lambda v: v == 1, what="approval pending")
    prom.wait_for(
        'state_age:callgate_calls_open:max{state="awaiting_approval",age="under_1m"}',
        lambda v: v == 1,
        what="the parked call",
    )

    # The refund's worker dies while its handler runs; the sweeper re-dispatches it.
    turn = producer.submit(
        [{"call_id": "refund", "tool_name": "refund_payment", "arguments": REFUND_O17}],
        SUPPORT_A,
    )
    (call,) = turn.calls
    wait_until(
        lambda: (
            scalar(engine, "SELECT state FROM callgate.calls WHERE id = :r", r=call.ref)
            == "started"
        ),
        what="the refund started",
    )
    prom.wait_for(
        'state_age:callgate_calls_open:max{state="started",age="under_1m"}',
        lambda v: v == 1,
        what="the started refund",
    )
    killed = f"127.0.0.1:{stack.port_of('worker-1')}"
    stack.signal("worker-1", signal.SIGKILL)
    stack.start_worker("worker-2")
    collected = producer.collect(turn.turn_id, timeout=60)
    assert collected.complete, collected.pending
    assert collected.results[0].status == "succeeded"

    prom.wait_for(
        'sum(callgate_sweeper_redispatches_total{reason="lease_expired"})',
        lambda v: v >= 1,
        what="the sweeper's re-dispatch after the kill",
    )
    prom.wait_for(
        f'up{{job="callgate-worker",instance="{killed}"}}', lambda v: v == 0, what="worker-1 down"
    )
    wait_scraped(prom, {"callgate-worker": 1})
    prom.wait_for(
        'state_age:callgate_calls_open:max{state="started",age="under_1m"}',
        lambda v: v == 0,
        what="no call left started",
    )
    prom.wait_for("callgate:outbox_oldest_unpublished_age_seconds:max", lambda v: v == 0)
    assert prom.value("callgate:calls_past_recovery_window:max") == 0
    assert prom.value("callgate:queue_depth:max") == 0
    assert prom.value("max(callgate_recovery_window_seconds)") == pytest.approx(10 * 1.2 + 300)

    # Every write tool has its side-effect series from the start (declared at zero).
    counts = side_effect_counts(prom, "refund_payment")
    assert set(counts) == {"side_effects", "write_operations", "write_handler_invocations"}
    # Nothing fires; the duplicate-side-effect alert is not even pending. (The idle-fleet
    # alert may be pending for a moment: a job can sit on the queue at a scrape.)
    assert [a for a in prom.alerts() if a["state"] == "firing"] == []
    assert not [
        a for a in prom.alerts() if a["labels"]["alertname"] == "CallgateDuplicateSideEffect"
    ]
    assert parked.calls[0].call_id == "del"
