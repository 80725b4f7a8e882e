"""``callgate eval run`` end to end on the built-in suite: real workers, relayer and fan-in
on a scratch database. The bad answers move only the model's table; a broken executor
double (its writes ignore the idempotency key) moves only the executor's; compare flags it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from callgate.core.settings import Settings
from callgate.ops.lab.eval import report
from callgate.ops.lab.eval.cli import eval_group
from callgate.ops.lab.eval.fixture import load_suite
from callgate.ops.lab.eval.runner import Options, run_suite

BROKEN = "tests.integration.eval_broken_tools:registry"
ADMIN_URL = os.environ.get("CALLGATE_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _values(report: dict[str, object], table: str) -> dict[str, object]:
    metrics = report["metrics"]
    assert isinstance(metrics, dict)
    return {k: m["value"] for k, m in metrics.items() if m["table"] == table}


@pytest.mark.timeout(300)
def test_good_bad_and_broken_executor_move_their_own_tables_only(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    env = {"CALLGATE_DATABASE_URL": database_url, "CALLGATE_REDIS_URL": redis_url}
    runner = CliRunner()
    ran = runner.invoke(
        eval_group,
        ["run", "builtin", "--answers", "good", "--answers", "bad", "--out", str(tmp_path / "a")],
        env=env,
        catch_exceptions=False,
    )
    assert ran.exit_code == 0, ran.output
    assert "Model" in ran.output and "Executor" in ran.output
    assert "tool selection accuracy" in ran.output and "policy catch rate" in ran.output
    good = json.loads((tmp_path / "a" / "eval-good.json").read_text())
    bad = json.loads((tmp_path / "a" / "eval-bad.json").read_text())

    # The good answers pass everything: every fixture's both sides.
    assert good["failures"] == []
    assert good["metrics"]["side_effect_exactness"]["total"] > 0
    assert good["metrics"]["policy_catch_rate"]["total"] > 0
    # The bad answers: the model's table falls, the executor's stays whole (it stops them).
    model_good, model_bad = _values(good, "model"), _values(bad, "model")
    assert model_bad["selection_accuracy"] < model_good["selection_accuracy"]
    assert model_bad["argument_accuracy"] < model_good["argument_accuracy"]
    assert model_bad["hallucinated_tool_rate"] > 0
    assert model_bad["irrelevance_accuracy"] == 0
    executor_bad = _values(bad, "executor")
    assert {k: v for k, v in executor_bad.items() if v is not None} == {
        k: 0.0 if good["metrics"][k]["lower_is_better"] else 1.0
        for k, v in executor_bad.items()
        if v is not None
    }
    assert (
        bad["metrics"]["policy_catch_rate"]["total"] > good["metrics"]["policy_catch_rate"]["total"]
    )
    assert all(f["table"] != "executor" for f in bad["failures"])

    # The broken executor double under the good answers: only the executor's table moves.
    broke = runner.invoke(
        eval_group,
        ["run", "builtin", "--tools", BROKEN, "--out", str(tmp_path / "b")],
        env=env,
        catch_exceptions=False,
    )
    assert broke.exit_code == 0, broke.output
    broken = json.loads((tmp_path / "b" / "eval-good.json").read_text())
    assert _values(broken, "model") == model_good
    assert broken["metrics"]["side_effect_exactness"]["value"] < 1.0
    twice = [f for f in broken["failures"] if f["metric"] == "side_effect_exactness"]
    assert {f["fixture"] for f in twice} == {"refund-after-timeout"}
    assert all("2 effect(s)" in f["actual"] and f["trace"] != "-" for f in twice)
    assert all(f["table"] == "executor" for f in broken["failures"])

    # compare: the broken executor is a regression (exit 1); a report against itself is not.
    base, new = str(tmp_path / "a" / "eval-good.json"), str(tmp_path / "b" / "eval-good.json")
    flagged = runner.invoke(eval_group, ["compare", base, new])
    assert flagged.exit_code == 1, flagged.output
    assert "REGRESSION" in flagged.output and "side_effect_exactness" in flagged.output
    same = runner.invoke(eval_group, ["compare", base, base])
    assert same.exit_code == 0, same.output
    assert "no regression" in same.output


@pytest.mark.timeout(300)
def test_live_answers_come_from_the_sdk_and_are_scored_like_recorded_ones(
    database_url: str, redis_url: str
) -> None:
    """--live through the Anthropic SDK over a mock transport that answers as the good
    recordings do: the conversation carries the results back, turn after turn."""
    anthropic = pytest.importorskip("anthropic")
    httpx = pytest.importorskip("httpx2")
    suite = load_suite(Path("builtin"))
    surface = "anthropic-messages"
    by_request: dict[str, tuple[Any, Any]] = {}
    for fixture in suite.fixtures:
        for index, turn in enumerate(fixture.turns):
            text = fixture.request if index == 0 else turn.request
            final = turn.final.answers["good"][surface] if turn.final else None
            by_request[str(text)] = (turn.answers["good"][surface], final)
    asked: list[dict[str, Any]] = []
    last_final: list[Any] = [None]

    def handle(request: Any) -> Any:
        body = json.loads(request.content)
        asked.append(body)
        last = body["messages"][-1]
        if isinstance(last["content"], str):
            answer, last_final[0] = by_request[last["content"]]
            return httpx.Response(200, json=answer)
        done = {
            "id": "msg_done",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "완료했습니다."}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        return httpx.Response(200, json=last_final[0] or done)

    client = anthropic.Anthropic(
        api_key="test", http_client=httpx.Client(transport=httpx.MockTransport(handle))
    )
    settings = Settings.from_env(
        {"CALLGATE_DATABASE_URL": database_url, "CALLGATE_REDIS_URL": redis_url}
    )
    options = Options(
        answers=("claude-test",),
        surfaces=frozenset({surface}),
        live="claude-test",
        live_client=client,
    )
    [run] = run_suite(settings, suite, options, io.StringIO())
    doc = report.build(suite.config.name, run.answer, run.turns)
    assert doc["failures"] == []
    assert doc["metrics"]["final_answer_correctness"]["total"] == 1
    assert doc["fixtures"] == len(suite.fixtures)
    # The second turn of the address change saw the first turn's result.
    shipment = next(
        b for b in asked if b["messages"][-1]["content"] == "이제 그 주문 배송 시작해줘"
    )
    results = [
        m for m in shipment["messages"] if m["role"] == "user" and isinstance(m["content"], list)
    ]
    assert results and results[0]["content"][0]["type"] == "tool_result"
    sent = json.loads(results[0]["content"][0]["content"])
    assert sent["data"]["content"]["version"] == 2


def _scratch_databases() -> set[str]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'callgate_eval_%'")
        return {r[0] for r in rows}


def _eval_process(
    args: list[str], env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "callgate", "eval", "run", *args],
        cwd=Path(__file__).resolve().parents[2],
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _one_line(run: subprocess.CompletedProcess[str], code: str) -> str:
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"callgate: {code}: "), run.stderr
    return lines[0]


@pytest.mark.timeout(300)
def test_workers_that_do_not_start_in_time_are_one_line_and_leave_nothing(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    """A start timeout no worker can meet (10 ms): the run stops with the setting's name,
    and the scratch database it created is dropped."""
    before = _scratch_databases()
    env = {
        "CALLGATE_DATABASE_URL": database_url,
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_EVAL_START_SECONDS": "0.01",
    }
    run = _eval_process(["builtin", "--out", str(tmp_path / "out")], env, tmp_path)
    line = _one_line(run, "embedded_service_failed")
    assert "did not start" in line and "CALLGATE_EVAL_START_SECONDS" in line
    assert _scratch_databases() - before == set()


@pytest.mark.timeout(300)
def test_workers_that_exit_at_start_are_reported_with_their_log(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    """Workers that cannot import the registry exit at once: the run says so and where
    their log is, and that log holds the reason."""
    env = {"CALLGATE_DATABASE_URL": database_url, "CALLGATE_REDIS_URL": redis_url}
    out = tmp_path / "out"
    args = ["builtin", "--tools", "no_such_module_for_eval:registry", "--out", str(out)]
    line = _one_line(_eval_process(args, env, tmp_path), "embedded_service_failed")
    log = out / "eval-processes.log"
    assert "exited" in line and str(log) in line
    assert "no_such_module_for_eval" in log.read_text()


@pytest.mark.timeout(300)
def test_the_scratch_database_takes_the_prefix_it_is_given(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    """On a shared server the scratch databases are named by a prefix of one's own; a prefix
    Postgres could not take unquoted is one line, and nothing is created."""
    prefix = f"team_{uuid.uuid4().hex[:6]}_"
    env = {
        "CALLGATE_DATABASE_URL": database_url,
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_EVAL_START_SECONDS": "0.01",  # stops right after the database is made
        "CALLGATE_EVAL_SCRATCH_PREFIX": prefix,
    }
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(d for d in _databases() if d.startswith(prefix))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run = _eval_process(["builtin", "--out", str(tmp_path / "out")], env, tmp_path)
    finally:
        stop.set()
        watcher.join()
    _one_line(run, "embedded_service_failed")
    assert len(seen) == 1 and len(next(iter(seen))) == len(prefix) + 16, seen
    assert not any(d.startswith(prefix) for d in _databases())  # dropped at the end

    before = _databases()
    bad = _eval_process(
        ["builtin", "--out", str(tmp_path / "bad")],
        {**env, "CALLGATE_EVAL_SCRATCH_PREFIX": "Team-A"},
        tmp_path,
    )
    line = _one_line(bad, "invalid_configuration")
    assert "CALLGATE_EVAL_SCRATCH_PREFIX='Team-A'" in line
    assert _databases() == before


def _databases() -> set[str]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
