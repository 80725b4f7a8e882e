"""Every long-running process serves /metrics on its own port (--metrics-port,
CALLGATE_METRICS_PORT); the sweeper adds the gauges read from Postgres and Redis. A bad or
taken port stops the process with one line and invalid_configuration."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from callgate.ops.stack import Stack, wait_for_workers
from tests.acceptance.conftest import callgate
from tests.acceptance.prometheus_server import free_port_block

pytestmark = pytest.mark.services


@pytest.fixture
def database_url(make_own_database: Callable[[], str]) -> str:
    """A database of its own: its sweeper must not re-dispatch other tests' calls."""
    return make_own_database()


def scrape(port: int, timeout: float = 20.0) -> dict[str, float]:
    """``{"name{labels}": value}`` from http://127.0.0.1:port/metrics, once it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                body = r.read().decode()
            break
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


@pytest.fixture
def metrics_stack(service_env: dict[str, str]) -> Iterator[Stack]:
    s = Stack(env=service_env, workers=1, metrics_port=free_port_block(3))
    with s:
        wait_for_workers(service_env["CALLGATE_REDIS_URL"], service_env["CALLGATE_QUEUE"], 1)
        yield s


def test_each_process_serves_its_own_metrics(metrics_stack: Stack) -> None:
    ports = metrics_stack.metrics_ports()
    assert ports == {
        "worker-1": metrics_stack.metrics_port + 2,
        "relayer": metrics_stack.metrics_port + 1,
        "sweeper": metrics_stack.metrics_port,
    }
    worker, relayer, sweeper = (scrape(ports[n]) for n in ("worker-1", "relayer", "sweeper"))
    # A worker creates its tools' series at zero and says how many calls it may run.
    assert worker['callgate_handler_invocations_total{kind="write",tool="refund_payment"}'] == 0
    assert worker['callgate_side_effects_total{tool="refund_payment"}'] == 0
    assert worker["callgate_worker_concurrency"] == 8
    # Only the sweeper serves the gauges read from Postgres and Redis: no series twice.
    assert sweeper['callgate_state_source_up{source="postgres"}'] == 1
    assert sweeper['callgate_state_source_up{source="redis"}'] == 1
    assert sweeper["callgate_queue_depth"] == 0
    assert sweeper['callgate_sweeper_redispatches_total{reason="lease_expired"}'] == 0
    for other in (worker, relayer):
        assert not [k for k in other if k.startswith(("callgate_calls_open", "callgate_state"))]
    assert "callgate_outbox_published_total" in relayer
    assert not [k for k in worker if k.endswith("_created")]


def test_state_metrics_are_served_by_any_process_when_asked(
    service_env: dict[str, str],
) -> None:
    port = free_port_block(1)
    s = Stack(env=service_env, workers=0, sweeper=False, relayer=False)
    with s:
        s.start("relayer", ["relayer", "--metrics-port", str(port), "--state-metrics"])
        assert scrape(port)['callgate_state_source_up{source="postgres"}'] == 1


def test_a_port_that_is_not_a_number_is_invalid_configuration(
    service_env: dict[str, str],
) -> None:
    for args, env in (
        (["relayer"], {"CALLGATE_METRICS_PORT": "metrics"}),
        (["sweeper", "--metrics-port", "70000"], {}),
        (["worker", "--metrics-port", "x"], {}),
    ):
        done = callgate(*args, env={**service_env, **env})
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("callgate: invalid_configuration: "), lines
        assert "metrics" in lines[0].lower()


def test_a_taken_port_is_invalid_configuration(service_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args in (["sweeper"], ["relayer"], ["worker"], ["up", "--workers", "1"]):
            done = callgate(*args, "--metrics-port", str(port), env=service_env)
            assert done.returncode == 2, (args, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, lines
            assert lines[0].startswith("callgate: invalid_configuration: metrics port "), lines
            assert str(port) in lines[0] and "Traceback" not in done.stderr


def test_children_never_inherit_one_port(service_env: dict[str, str]) -> None:
    """A port in the parent's environment is not handed to every child: without a base
    they serve none, with one each gets its own."""
    s = Stack(env={**service_env, "CALLGATE_METRICS_PORT": "9"}, workers=2)
    assert s.metrics_ports() == {}
    s = Stack(env=service_env, workers=2, metrics_port=20000)
    assert s.metrics_ports() == {
        "worker-1": 20002,
        "worker-2": 20003,
        "relayer": 20001,
        "sweeper": 20000,
    }
    assert s.port_of("worker-extra") == 20004
    assert s.port_of("worker-2") == 20003  # the same port when it is restarted
