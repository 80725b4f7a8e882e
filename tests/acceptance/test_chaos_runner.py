"""``callgate chaos``: each catalogue scenario run through the runner as a user runs it
(``python -m callgate.ops.lab.chaos NAME --json``), with real worker, relayer and sweeper
processes, asserting the numbers the runner read from the scenario's database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.conftest import ADMIN_URL, REDIS_URL

SEED = "7"


def chaos(
    *args: str, timeout: float = 170, embedded: bool = False
) -> subprocess.CompletedProcess[str]:
    """The runner as a subprocess on the test services (it makes databases of its own), or
    with no service configured (it starts an embedded PostgreSQL and a redis-server)."""
    env = {
        **os.environ,
        "CALLGATE_DATABASE_URL": ADMIN_URL,
        "CALLGATE_REDIS_URL": REDIS_URL,
    }
    if embedded:
        del env["CALLGATE_DATABASE_URL"], env["CALLGATE_REDIS_URL"]
    return subprocess.run(
        [sys.executable, "-m", "callgate.ops.lab.chaos", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run(name: str, *extra: str, embedded: bool = False) -> tuple[int, dict[str, Any]]:
    done = chaos(name, "--seed", SEED, "--json", *extra, embedded=embedded)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    (row,) = doc["scenarios"]
    print(json.dumps(row, indent=1))
    return done.returncode, row


def passed(name: str, *, embedded: bool = False) -> dict[str, Any]:
    code, row = run(name, embedded=embedded)
    assert row["violations"] == [], row["violations"]
    assert row["unexpected"] == [], row["unexpected"]
    assert (code, row["verdict"]) == (0, "pass")
    return row


# --- redelivery ---------------------------------------------------------------------------


def test_duplicate_delivery_runs_each_write_once() -> None:
    row = passed("duplicate-delivery")
    c = row["counts"]
    assert row["faults_injected"][0]["jobs"] == 3 * c["calls"]
    # A write's handler runs once; a read takes no reservation and may run again for a
    # copy that arrives while it runs (its result is still committed and published once:
    # the runner's one-result-per-call invariant).
    assert c["write_invocations"] == c["writes"] == 9
    assert c["calls"] <= c["invocations"] <= c["writes"] + 4 * 3
    assert c["reservations"] == c["writes"] and c["takeovers"] == 0
    # one refund, one e-mail and one charge per turn: one change each downstream
    assert c["side_effects"] == c["writes"] == 9
    assert c["duplicates"] >= 1


def test_worker_killed_after_completion_then_redelivered_changes_nothing() -> None:
    row = passed("worker-kill-after-completion")
    c = row["counts"]
    assert row["faults_injected"][0]["killed"]
    assert (c["invocations"], c["side_effects"], c["takeovers"]) == (1, 1, 0)
    assert c["duplicates"] == 2


# --- worker crashes -----------------------------------------------------------------------


def test_worker_killed_before_the_downstream_call_is_taken_over_once() -> None:
    row = passed("worker-kill-before-downstream")
    c = row["counts"]
    # (a loaded machine may starve a 1 s lease into one more takeover: never another refund)
    assert c["takeovers"] >= 1 and (c["side_effects"], c["requests"]) == (1, 1)
    assert c["invocations"] >= 2  # the killed owner's handler, and the new owner's
    assert row["outcomes"] == {"refund_payment": {"succeeded": 1}}


def test_worker_killed_in_the_crash_gap_applies_each_write_once() -> None:
    row = passed("worker-kill-crash-gap")
    c = row["counts"]
    assert [f["action"] for f in row["faults_injected"]] == ["kill_worker", "kill_worker"]
    assert c["takeovers"] >= 2
    # each write was sent again by its new owner and replayed by its key
    assert c["requests"] >= 4 and c["side_effects"] == 2
    assert row["recovery_seconds"] is not None


def test_unkeyed_write_in_the_crash_gap_goes_to_reconciliation_and_is_never_resent() -> None:
    row = passed("unkeyed-write-crash-gap")
    c = row["counts"]
    assert row["outcomes"] == {"charge_unkeyed": {"reconciliation_pending": 1}}
    assert (c["requests"], c["side_effects"], c["invocations"]) == (1, 1, 1)
    assert c["takeovers"] >= 1 and c["duplicates"] >= 2


def test_approval_gated_refund_crossing_crashes_applies_once() -> None:
    row = passed("approval-crossing-crash")
    c = row["counts"]
    assert (c["approvals_granted"], c["side_effects"]) == (1, 1) and c["takeovers"] >= 1
    assert row["outcomes"] == {"refund_payment": {"succeeded": 1}}


# --- stale owners -------------------------------------------------------------------------


def test_owner_stopped_before_its_write_is_fenced_when_it_wakes() -> None:
    row = passed("worker-stop-before-write")
    (fault,) = row["faults_injected"]
    assert fault["new_owner_finished"] is True
    assert fault["stale_owner_refused_by"] == ["stale_fence_rejected"]
    c = row["counts"]
    assert c["takeovers"] >= 1 and c["fence_rejections"] >= 1 and c["side_effects"] == 1


def test_owner_stopped_in_the_crash_gap_has_its_completion_refused_when_it_wakes() -> None:
    row = passed("worker-stop-after-write")
    (fault,) = row["faults_injected"]
    assert fault["stale_owner_refused_by"] == ["stale_completion_rejected"]
    c = row["counts"]
    assert c["takeovers"] >= 1 and c["stale_completions"] >= 1 and c["side_effects"] == 1


def test_a_downstream_slower_than_the_lease_keeps_its_owner() -> None:
    row = passed("slow-downstream")
    c = row["counts"]
    # One reservation: the refund's (the read takes none), kept for 3.5 leases.
    assert (c["takeovers"], c["reservations"], c["requests"]) == (0, 1, 1)


# --- transport and results ----------------------------------------------------------------


def test_relayer_killed_between_publish_and_mark_loses_no_result() -> None:
    row = passed("relayer-kill-publish-mark")
    assert row["faults_injected"][0]["killed"] == ["relayer"]
    assert row["counts"]["calls"] == 6


def test_redis_flushed_twice_mid_run_loses_nothing() -> None:
    row = passed("redis-flushall")
    c = row["counts"]
    assert [f["action"] for f in row["faults_injected"]] == ["flush_redis", "flush_redis"]
    assert c["side_effects"] == c["writes"] == 8


def test_redis_killed_and_restarted_empty_mid_run_loses_nothing() -> None:
    row = passed("redis-restart")
    c = row["counts"]
    assert [f["action"] for f in row["faults_injected"]] == ["restart_redis"]
    assert c["side_effects"] == c["writes"] == 8
    assert c["invocations"] >= c["calls"]


def test_downstream_outage_refuses_before_applying() -> None:
    row = passed("downstream-outage")
    c = row["counts"]
    # The mail provider refused 2 requests, which the first e-mail's retries rode out; the
    # stock feed refused each of the 3 reads' 3 attempts for as long as it was down.
    assert c["outage_refusals"] == 2 + 3 * 3
    assert row["outcomes"]["send_email"] == {"succeeded": 3}
    assert row["outcomes"]["get_stock"] == {"upstream_unavailable": 3}
    # a refused request applied nothing: one change per write that succeeded
    assert c["side_effects"] == c["requests"] == c["writes"] == 6


# --- what the self-healing work must fix (reported as failing today) ---------------------


def test_sweeper_killed_loses_nothing() -> None:
    passed("sweeper-killed")


def test_postgres_backends_terminated_mid_run_lose_nothing() -> None:
    passed("postgres-terminate")


def test_embedded_postgres_restarted_mid_run_loses_nothing() -> None:
    passed("postgres-restart", embedded=True)


# --- topology -----------------------------------------------------------------------------


def test_postgres_failover_to_a_lagging_replica_doubles_nothing() -> None:
    """callgate's database on a primary whose asynchronous replica stops receiving WAL once
    the turns are in; the primary is killed at half the calls done and the replica
    promoted. The ledger and the downstreams live on the test server, so the effects that
    happened on the lost history are counted."""
    row = passed("postgres-failover")
    c = row["counts"]
    freeze, fail_over = row["faults_injected"]
    assert (freeze["action"], fail_over["action"]) == ("freeze_replica", "fail_over")
    assert fail_over["ended_before"] >= c["calls"] // 2 > freeze["ended_before"]
    assert c["failovers"] == 1 and c["lost_turns"] == 0
    # The calls that ended on the lost history are open again on the promoted replica:
    # those whose results the relayer had published are adopted, the others run again (a
    # read, a keyed refund) or are put in doubt (the unkeyed charge). How many of each
    # depends on the moment; the runner's invariants (one result per call on the streams
    # and in the database, at most one change per write downstream, every turn collected)
    # must hold whatever it is.
    assert c["adopted"] <= c["calls"]
    assert c["adopted"] + c["doubted"] >= 1
    assert c["writes"] == 8 and c["side_effects"] <= c["writes"]
    unkeyed = row["outcomes"]["charge_unkeyed"]
    assert set(unkeyed) <= {"succeeded", "reconciliation_pending"}
    assert unkeyed.get("reconciliation_pending", 0) <= c["doubted"]
