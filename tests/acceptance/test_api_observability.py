"""What a new user sees of ``callgate api`` and of each process's /metrics (issue 24).

- The API serves /metrics on its own port; an approval decided through the API moves
  ``callgate_approvals_total{outcome="granted"}`` there, as the CLI's decision does.
- Listing and reading approval requests needs the approver role: a support or auditor key
  of the tenant gets 403 ``role_required``; an approver sees its tenant's request.
- The API logs a start line, one access line per request (status, key id, never the key)
  and a stop line.
- Each process serves only the families it moves: no worker family on the relayer or the
  sweeper, the worker's on the worker.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from callgate.ops.lab.chaos.services import free_port
from callgate.ops.stack import Stack, wait_for_workers
from tests.acceptance.api_server import ApiServer, api, env, make_key
from tests.acceptance.conftest import REFUND_O17
from tests.acceptance.prometheus_server import free_port_block

__all__ = ["api", "env"]  # fixtures, for pytest

pytestmark = pytest.mark.services


def scrape(port: int, timeout: float = 20.0) -> dict[str, dict[str, float]]:
    """``{family: {"name{labels}": value}}`` from http://127.0.0.1:port/metrics."""
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
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(body):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return out


def callgate_families(port: int) -> set[str]:
    return {name for name in scrape(port) if name.startswith("callgate_")}


@pytest.fixture
def stack(env: dict[str, str]) -> Iterator[Stack]:
    s = Stack(env=env, workers=1, metrics_port=free_port_block(3))
    with s:
        wait_for_workers(env["CALLGATE_REDIS_URL"], env["CALLGATE_QUEUE"], 1)
        yield s


WORKER_ONLY = {
    "callgate_worker_concurrency",
    "callgate_worker_calls_in_flight",
    "callgate_calls_taken",
    "callgate_handler_invocations",
    "callgate_results",
    "callgate_gate_seconds",
}


def test_each_process_serves_only_the_families_it_moves(stack: Stack) -> None:
    ports = stack.metrics_ports()
    worker, relayer, sweeper = (
        callgate_families(ports[n]) for n in ("worker-1", "relayer", "sweeper")
    )
    assert worker >= WORKER_ONLY
    # A worker sweeps too by default (CALLGATE_WORKER_SWEEP), so it serves the sweeper's.
    assert "callgate_sweeper_redispatches" in worker
    assert not WORKER_ONLY & sweeper, sweeper
    assert not WORKER_ONLY & relayer, relayer
    assert not [f for f in relayer | sweeper if f.startswith("callgate_worker_")]
    assert {"callgate_outbox_published", "callgate_relay_seconds"} <= relayer
    assert "callgate_outbox_published" not in worker | sweeper
    assert "callgate_sweeper_redispatches" in sweeper
    assert "callgate_sweeper_redispatches" not in relayer
    assert "callgate_calls_proposed" not in worker | relayer | sweeper


def _parked_approval(server: ApiServer, key: str) -> str:
    with server.client(key) as http:
        body = [{"call_id": "c1", "tool_name": "refund_payment", "arguments": REFUND_O17}]
        resp = http.post("/v1/turns", json=body)
        assert resp.status_code == 200, resp.text
        turn_id = resp.json()["turn_id"]
        for _ in range(12):
            doc = http.get(f"/v1/turns/{turn_id}/results", params={"wait": 10}).json()
            if doc["awaiting_approval"]:
                return str(doc["awaiting_approval"]["c1"])
    raise AssertionError("the refund never waited for an approval")


def test_the_api_serves_metrics_logs_requests_and_checks_roles(
    stack: Stack, env: dict[str, str], api: Callable[[dict[str, str]], ApiServer]
) -> None:
    metrics_port = free_port()
    server = api({**env, "CALLGATE_METRICS_PORT": str(metrics_port), "CALLGATE_LOG_LEVEL": "INFO"})
    support = make_key(env, "tenant-a", "user-17", "support")
    auditor = make_key(env, "tenant-a", "user-9", "auditor")
    approver = make_key(env, "tenant-a", "user-5", "approver")
    other = make_key(env, "tenant-b", "user-42", "approver")
    approval_id = _parked_approval(server, support["key"])

    before = scrape(metrics_port)
    assert not [f for f in before if f.startswith("callgate_worker_")]
    granted = 'callgate_approvals_total{outcome="granted",tool="refund_payment"}'
    assert before.get("callgate_approvals", {}).get(granted, 0) == 0

    for who in (support, auditor):
        with server.client(who["key"]) as http:
            for path, asked in (
                ("/v1/approvals", "listing approvals"),
                (f"/v1/approvals/{approval_id}", "reading an approval"),
            ):
                resp = http.get(path)
                assert resp.status_code == 403, resp.text
                assert resp.json()["code"] == "role_required"
                assert f"{asked} needs a key with the approver role" in resp.text, resp.text
            resp = http.post(f"/v1/approvals/{approval_id}/approve")
            assert resp.status_code == 403 and resp.json()["code"] == "role_required"
    with server.client(other["key"]) as http:
        listed = http.get("/v1/approvals", params={"state": "all"})
        assert listed.status_code == 200 and listed.json() == []
    with server.client(approver["key"]) as http:
        listed = http.get("/v1/approvals")
        assert listed.status_code == 200, listed.text
        assert [a["approval_id"] for a in listed.json()] == [approval_id]
        resp = http.post(f"/v1/approvals/{approval_id}/approve")
        assert resp.status_code == 200, resp.text

    after = scrape(metrics_port)
    assert after["callgate_approvals"][granted] == 1

    server.stop()
    time.sleep(0.5)  # the reader thread takes the last lines
    log = server.stderr()
    assert "api listening on http://127.0.0.1:" in log and f":{metrics_port}" in log, log
    assert "api stopped" in log, log
    access = [line for line in log.splitlines() if '"event": "request"' in line]
    approves = [line for line in access if f"/v1/approvals/{approval_id}/approve" in line]
    # Two refused (support, auditor) and one granted: one line each, with its status.
    assert sorted(" 403 " in line for line in approves) == [False, True, True], approves
    assert any(" 200 " in line and approver["key_id"] in line for line in approves), approves
    for made in (support, auditor, approver, other):
        assert made["key"] not in log
        secret = made["key"].rsplit(".", 1)[-1]
        assert secret not in log
    assert "Bearer " + "cgk" not in log and "authorization" not in log.lower()
