"""``callgate reconcile`` and ``callgate prune`` as an operator uses them, on a write whose
response was lost for real (its downstream committed, then the reply timed out)."""

from __future__ import annotations

import json
import time

from tests.acceptance.conftest import callgate, effects_for, requests_for, scalar
from tests.acceptance.private_stack import (
    code_of,
    database_url,
    env,
    key_of,
    make_producer,
    only_result,
    start,
    submit_one,
)
from tests.acceptance.processes import private_redis

__all__ = ["database_url", "env", "make_producer", "private_redis", "start"]  # fixtures


def test_a_person_settles_a_write_in_doubt_and_a_retry_gets_their_outcome(
    env, start, make_producer, engine
):
    start(workers=1, CALLGATE_TEST_LEGACY_RESPONSE_TIMEOUT="1")
    producer = make_producer()
    turn_id, ref, op = submit_one(producer, "charge_legacy", {"amount": 5})
    key = key_of(engine, op)
    assert code_of(only_result(producer, turn_id)) == "reconciliation_pending"

    listed = callgate("reconcile", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["operation_id"], row["idempotency_key"]) == (op, key)
    assert json.loads(callgate("reconcile", "list", "--tenant", "tenant-b", "--json", env=env)
                      .stdout) == []  # fmt: skip

    shown = callgate("reconcile", "show", op, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert [c["code"] for c in json.loads(shown.stdout)["calls"]] == ["reconciliation_pending"]

    settled = callgate(
        "reconcile", "resolve", op, "--outcome", "succeeded", "--by", "ops-anna",
        "--note", "charge ch_1 in the gateway's log", env=env,
    )  # fmt: skip
    assert settled.returncode == 0, settled.stderr
    assert f"reconciled {op} as succeeded by ops-anna" in settled.stdout
    twice = callgate("reconcile", "resolve", op, "--outcome", "failed", "--by", "x", env=env)
    assert twice.returncode == 2
    assert twice.stderr.startswith("callgate: not_awaiting_reconciliation: ")
    assert "Traceback" not in twice.stderr

    # The same logical write retried in a new turn: the person's outcome, not another charge.
    again, _, _ = submit_one(
        producer, "charge_legacy", {"amount": 5}, call_id="c2", operation_id=op
    )
    retried = only_result(producer, again)
    assert retried.status == "succeeded"
    assert retried.data["content"]["by"] == "ops-anna"
    assert requests_for(engine, key) == 1 and effects_for(engine, key) == 1

    # Retention: both turns are finished and published; nothing younger than a day goes.
    wait = callgate("prune", "--older-than", "1d", "--json", env=env)
    assert json.loads(wait.stdout)["turns"] == 0
    time.sleep(1.2)
    dry = callgate("prune", "--older-than", "1s", "--dry-run", env=env)
    assert dry.stdout.strip() == "would remove 2 turns, 2 calls, 0 API idempotency answers"
    pruned = callgate("prune", "--older-than", "1s", "--json", env=env)
    assert pruned.returncode == 0, pruned.stderr
    counts = json.loads(pruned.stdout)
    assert (counts["turns"], counts["calls"], counts["operations"]) == (2, 2, 1)
    assert scalar(engine, "SELECT count(*) FROM callgate.calls WHERE id = :r", r=ref) == 0


def test_bad_operator_input_gets_one_line_and_its_code(env) -> None:
    cases = [
        (("reconcile", "resolve", "op-x", "--outcome", "succeeded", "--by", "a"),
         "unknown_operation"),
        (("reconcile", "show", "op-x"), "unknown_operation"),
        (("prune", "--older-than", "soon"), "invalid_input"),
    ]  # fmt: skip
    for args, code in cases:
        done = callgate(*args, env=env)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith(f"callgate: {code}: ") and "Traceback" not in done.stderr
    wrong = callgate("reconcile", "resolve", "op-x", "--outcome", "maybe", "--by", "a", env=env)
    assert wrong.returncode == 2 and "'maybe' is not one of" in wrong.stderr
