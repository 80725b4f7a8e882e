"""The redaction corpus through real workers, a real ``callgate api`` and exported spans:
every planted secret is searched for in every place a result, a failure, a trace, a span or
a log goes, and every ordinary value must survive.

Places: ``collect --json``; the tool-result message of all five provider surfaces; the
``calls.result`` column (the one copy of a result: a read's operation holds none, and an
outbox row only points at its call; both are still searched, for leaks); the Redis result
stream; the API's results; ``trace_events.detail``; ``callgate trace`` (table and JSON); the
API's trace; the spans every process exported over OTLP/HTTP, with the call's arguments
recorded (``CALLGATE_TRACE_ARGUMENTS=redacted``); the workers' and the API's logs. The turn
is submitted through the API, as an application would.

Counts are per (plant, place): ``leaked`` (a marker of the plant is there), ``redacted`` (none
is), and ``over_redacted`` (an ordinary value is missing where it should be). With
``CALLGATE_TEST_CORPUS_REPORT=path`` the counts are also written there as JSON.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.producer.adapters import SURFACES
from callgate.queue import transport
from tests.acceptance.api_server import ApiServer, make_key, start_api
from tests.acceptance.conftest import SUPPORT_A, callgate, wait_until
from tests.acceptance.corpus_tools import CORPUS
from tests.acceptance.otlp_receiver import Receiver, receiver
from tests.redaction_corpus import Plant

__all__ = ["receiver"]  # a fixture, for pytest

pytestmark = pytest.mark.services

TOOLS = "tests.acceptance.corpus_tools:registry"
# Places a model (or the application handing results to one) reads: ordinary values must
# survive in all of them.
MODEL_FACING = (
    "collect --json",
    *(f"provider:{s}" for s in SURFACES),
    "calls.result",
    "redis.stream",
    "api results",
)
TRACE = ("trace_events.detail", "callgate trace", "api trace")
SPANS = "spans"
# The call whose arguments carry the argument plants. It names fields corpus_values does not
# take, so the gate refuses it; its span records the arguments before the gate runs.
ARGS_CALL = "args"


def _named_spans(receiver: Receiver) -> list[tuple[str, dict[str, str]]]:
    """Each exported span's name and its string attributes."""
    return [
        (s["name"], {k: v for k, v in s["attributes"].items() if isinstance(v, str)})
        for s in receiver.received()
    ]


@pytest.fixture
def corpus_env(service_env: dict[str, str], receiver: Receiver) -> dict[str, str]:
    return {
        **service_env,
        "CALLGATE_TOOLS": TOOLS,
        "CALLGATE_LOG_LEVEL": "INFO",
        "CALLGATE_TRACE_ARGUMENTS": "redacted",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


@pytest.fixture
def corpus_stack(corpus_env: dict[str, str], tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(env=corpus_env, workers=2, log_path=str(tmp_path / "stack.log"))
    stack.__enter__()
    try:
        wait_for_workers(corpus_env["CALLGATE_REDIS_URL"], corpus_env["CALLGATE_QUEUE"], 2)
        yield stack
    finally:
        stack.stop()


def _calls() -> list[dict[str, Any]]:
    calls = [
        {"call_id": f"values-{part}", "tool_name": "corpus_values", "arguments": {"part": part}}
        for part in CORPUS.results
    ]
    calls += [
        {"call_id": f"fail-{part}", "tool_name": "corpus_fail", "arguments": {"part": part}}
        for part in CORPUS.failures
    ]
    calls += [
        {"call_id": name, "tool_name": f"corpus_{name}", "arguments": {}}
        for name in ("schema", "audit", "crash", "lookup")
    ]
    calls.append(
        {"call_id": ARGS_CALL, "tool_name": "corpus_values", "arguments": CORPUS.arguments}
    )
    return calls


def _places(
    turn_id: str,
    env: dict[str, str],
    engine: Engine,
    stack: Stack,
    log_path: Path,
    api: tuple[ApiServer, str],
    receiver: Receiver,
) -> dict[str, str]:
    places: dict[str, str] = {}
    server, key = api
    with server.client(key) as http:
        results = http.get(f"/v1/turns/{turn_id}/results")
        trace = http.get(f"/v1/calls/{turn_id}/trace")
    assert results.status_code == trace.status_code == 200, results.text + trace.text
    places["api results"] = results.text
    places["api trace"] = trace.text
    out = callgate("collect", turn_id, "--json", "--timeout", "30", env=env)
    assert out.returncode == 0, out.stderr
    places["collect --json"] = out.stdout
    for surface in SURFACES:
        out = callgate("collect", turn_id, "--provider", surface, "--timeout", "30", env=env)
        assert out.returncode == 0, out.stderr
        places[f"provider:{surface}"] = out.stdout
    with engine.connect() as conn:

        def rows(sql: str, *, may_be_empty: bool = False) -> str:
            found = conn.execute(text(sql), {"t": uuid.UUID(turn_id)}).scalars().all()
            assert found or may_be_empty, sql
            return "\n".join(str(r) for r in found if r is not None)

        places["calls.result"] = rows("SELECT result::text FROM callgate.calls WHERE turn_id = :t")
        # No copy of a read's result is kept here: searched for leaks only.
        places["operations.result"] = rows(
            "SELECT o.result::text FROM callgate.operations o"
            " JOIN callgate.calls c ON c.operation_id = o.operation_id WHERE c.turn_id = :t",
            may_be_empty=True,
        )
        places["outbox.payload"] = rows(
            "SELECT payload::text FROM callgate.outbox WHERE turn_id = :t", may_be_empty=True
        )
        places["trace_events.detail"] = rows(
            "SELECT detail::text FROM callgate.trace_events e WHERE e.turn_id = :t"
            " OR e.call_ref IN (SELECT id FROM callgate.calls WHERE turn_id = :t)"
            # a read's audit is stored on its call row, not in a trace_events row
            " UNION ALL SELECT audit::text FROM callgate.calls"
            " WHERE turn_id = :t AND audit IS NOT NULL"
        )
    redis = transport.connect(env["CALLGATE_REDIS_URL"])
    stream = transport.results_stream(env["CALLGATE_QUEUE"], turn_id)
    entries = redis.xrange(stream)
    assert entries
    places["redis.stream"] = "\n".join(v.decode() for _, fields in entries for v in fields.values())
    table = callgate("trace", turn_id, env=env)
    as_json = callgate("trace", turn_id, "--json", env=env)
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    places["callgate trace"] = table.stdout + as_json.stdout
    stack.stop()  # every worker has flushed its last log line and its last spans
    places["worker logs"] = log_path.read_text(errors="replace")
    server.stop()
    places["api logs"] = server.stderr()
    places[SPANS] = json.dumps(_named_spans(receiver))
    return places


def _leaked(plant: Plant, place: str) -> bool:
    return any(marker in place for marker in plant.markers)


def count(places: dict[str, str]) -> dict[str, Any]:
    """leaked / redacted / over-redacted per place, and the names of what went wrong.

    A leak is counted for any planted secret found anywhere. ``redacted`` counts the plants
    that flow to a place unredacted if nothing stops them (results and failures to the
    model-facing places, audit ids to the trace, a call's arguments to its span, exception
    texts to the workers' logs) and are not there; ``over_redacted`` the ordinary values
    missing where they should be.
    """
    secrets = [*CORPUS.plants, *CORPUS.audit_plants, *CORPUS.log_plants, *CORPUS.argument_plants]
    report: dict[str, Any] = {"places": {}, "leaks": [], "over_redactions": []}
    for name, content in places.items():
        leaked = {p.id for p in secrets if _leaked(p, content)}
        if name in MODEL_FACING:
            exposed, expected = [*CORPUS.plants, *CORPUS.audit_plants], CORPUS.ordinary
        elif name in TRACE:
            exposed, expected = CORPUS.audit_plants, CORPUS.audit_ordinary
        elif name == SPANS:
            exposed, expected = CORPUS.argument_plants, CORPUS.argument_ordinary
        elif name == "worker logs":
            exposed, expected = CORPUS.log_plants, []
        else:
            exposed, expected = [], []
        missing = [p.id for p in expected if not _leaked(p, content)]
        report["places"][name] = {
            "leaked": len(leaked),
            "redacted": sum(p.id not in leaked for p in exposed),
            "over_redacted": len(missing),
            "exposed": len(exposed),
            "ordinary": len(expected),
        }
        report["leaks"] += [f"{name}: {p}" for p in sorted(leaked)]
        report["over_redactions"] += [f"{name}: {p}" for p in missing]
    totals = {
        k: sum(v[k] for v in report["places"].values())
        for k in ("leaked", "redacted", "over_redacted", "exposed", "ordinary")
    }
    report["totals"] = {**totals, "plants": len(secrets), "places": len(places)}
    return report


def test_no_planted_secret_reaches_any_place_and_ordinary_values_survive(
    corpus_env: dict[str, str],
    corpus_stack: Stack,
    engine: Engine,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    server = start_api(corpus_env)
    try:
        # The key of SUPPORT_A's principal: the API records the turn for it.
        key = make_key(corpus_env, "tenant-a", "user-17", "support")["key"]
        with server.client(key) as http:
            submitted = http.post("/v1/turns", json=_calls())
            assert submitted.status_code == 200, submitted.text
            turn_id = submitted.json()["turn_id"]
            doc = _api_results(http, turn_id)
        statuses = {r["call_id"]: r["status"] for r in doc["results"]}

        def spans_of_every_call() -> bool:
            tools = [a for n, a in _named_spans(receiver) if n.startswith("execute_tool ")]
            return {a.get("callgate.turn_id") for a in tools} == {turn_id} and len(
                {a["gen_ai.tool.call.id"] for a in tools}
            ) == len(statuses)

        wait_until(spans_of_every_call, timeout=30, what="an execute_tool span of every call")
        places = _places(
            turn_id,
            corpus_env,
            engine,
            corpus_stack,
            tmp_path / "stack.log",
            (server, key),
            receiver,
        )
    finally:
        server.stop()
    # The eleven places, with all five provider surfaces, the API's results and trace, the
    # spans and the API's logs.
    assert len(places) == 17
    # The span really recorded the arguments: redacted, not left out.
    (recorded,) = [
        a["gen_ai.tool.call.arguments"]
        for n, a in _named_spans(receiver)
        if n == "execute_tool corpus_values" and a["gen_ai.tool.call.id"] == ARGS_CALL
    ]
    assert set(json.loads(recorded)) == set(CORPUS.arguments)
    report = count(places)
    summary = json.dumps(report["totals"]) + "\n" + json.dumps(report["places"], indent=1)
    print(summary)
    if path := os.environ.get("CALLGATE_TEST_CORPUS_REPORT"):
        Path(path).write_text(json.dumps(report, indent=1))
    # The corpus reached the workers: the statuses are what the tools meant.
    assert statuses[ARGS_CALL] == "failed_terminal"
    assert statuses["crash"] == "failed_terminal" and statuses["lookup"] == "failed_retryable"
    assert all(statuses[f"fail-{p}"] == "failed_terminal" for p in CORPUS.failures)
    assert all(statuses[f"values-{p}"] == "succeeded" for p in CORPUS.results)
    assert report["totals"]["leaked"] == 0, "\n".join(report["leaks"][:60])
    assert report["totals"]["over_redacted"] == 0, "\n".join(report["over_redactions"][:60])


def _api_results(http: Any, turn_id: str) -> dict[str, Any]:
    for _ in range(12):
        resp = http.get(f"/v1/turns/{turn_id}/results", params={"wait": 10})
        assert resp.status_code == 200, resp.text
        doc: dict[str, Any] = resp.json()
        if doc["complete"]:
            return doc
    raise AssertionError(f"turn {turn_id} never completed: {doc}")


def _run(env: dict[str, str], calls: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    producer = Producer.from_env(Settings.from_env(env))
    try:
        turn = producer.submit(calls, SUPPORT_A)
        collected = producer.collect(turn.turn_id, timeout=30)
    finally:
        producer.close()
    assert collected.complete, collected.pending
    return turn.turn_id, {r.call_id: r for r in collected.results}


def test_the_trace_holds_no_raw_resource_id(
    corpus_env: dict[str, str], corpus_stack: Stack, engine: Engine
) -> None:
    turn_id, results = _run(
        corpus_env, [{"call_id": "audit", "tool_name": "corpus_audit", "arguments": {}}]
    )
    assert results["audit"].status == "succeeded"
    with engine.connect() as conn:
        stored = "\n".join(
            conn.execute(
                text(
                    "SELECT detail::text FROM callgate.trace_events WHERE call_ref IN"
                    " (SELECT id FROM callgate.calls WHERE turn_id = :t)"
                    # a read's audit is stored on its call row
                    " UNION ALL SELECT audit::text FROM callgate.calls"
                    " WHERE turn_id = :t AND audit IS NOT NULL"
                ),
                {"t": uuid.UUID(turn_id)},
            )
            .scalars()
            .all()
        )
    shown = callgate("trace", turn_id, env=corpus_env).stdout
    for place in (stored, shown):
        leaked = [p.id for p in CORPUS.audit_plants if _leaked(p, place)]
        kept = [p.id for p in CORPUS.audit_ordinary if _leaked(p, place)]
        assert (len(leaked), len(kept)) == (0, len(CORPUS.audit_ordinary)), (leaked, place)


def test_handler_exceptions_reach_the_logs_redacted(
    corpus_env: dict[str, str], corpus_stack: Stack, tmp_path: Path
) -> None:
    _, results = _run(
        corpus_env,
        [
            {"call_id": "crash", "tool_name": "corpus_crash", "arguments": {}},
            {"call_id": "lookup", "tool_name": "corpus_lookup", "arguments": {}},
        ],
    )
    assert results["crash"].status == "failed_terminal"
    assert results["lookup"].status == "failed_retryable"
    corpus_stack.stop()
    logs = (tmp_path / "stack.log").read_text(errors="replace")
    leaked = [p.id for p in CORPUS.log_plants if _leaked(p, logs)]
    assert leaked == []
    # The operator still gets the traceback and the exception's type, with the secrets out.
    assert logs.count("Traceback (most recent call last)") >= 1
    assert logs.count("RuntimeError: could not connect to postgresql://[redacted]@") == 1


@pytest.mark.parametrize("part", ["bytes", "set"])
def test_a_result_json_cannot_carry_ends_the_call(
    part: str, corpus_env: dict[str, str], corpus_stack: Stack, engine: Engine
) -> None:
    turn_id, results = _run(
        corpus_env, [{"call_id": "c", "tool_name": "corpus_bytes", "arguments": {"part": part}}]
    )
    result = results["c"]
    assert result.status == "failed_terminal"
    assert result.error.code == "execution_failed"
    assert [d.message for d in result.error.details] == ["the result cannot be stored"]
    with engine.connect() as conn:
        states = (
            conn.execute(
                text(
                    "SELECT c.state || '/' || o.state FROM callgate.calls c JOIN"
                    " callgate.operations o USING (operation_id) WHERE c.turn_id = :t"
                ),
                {"t": uuid.UUID(turn_id)},
            )
            .scalars()
            .all()
        )
    # A read ends on its call row alone: its operation stays untouched (pending).
    assert states == ["failed_terminal/pending"]
