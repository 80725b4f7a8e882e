"""``callgate eval bfcl-multi-turn`` end to end: BFCL's own multi-turn entries, their
backend classes served as callgate tools by real worker processes on the session's
PostgreSQL and Redis, scored by BFCL's own checker from the ``bfcl-eval`` wheel (fetched
without its dependencies, as tests/integration/test_bfcl_eval_conformance.py does).

The ground truth answered as the model's result is valid for BFCL; an answer that makes the
wrong folder is not. Either way callgate's execution must be BFCL's: the instances the
workers leave in the state table equal BFCL's in-process ones, every response is BFCL's,
every call gets one result, and the writes stored (rows of the state table, one per handler
run that stored its instance) are exactly the ground truth's writes.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from callgate.ops.lab.eval import bfcl_multi_turn_backend as backend
from callgate.ops.lab.eval import bfcl_multi_turn_tools as tools
from callgate.ops.lab.eval.cli import eval_group
from tests.integration import bfcl_wheel

FILES = Path(__file__).parents[1] / "fixtures" / "bfcl" / "multi_turn"
QUESTIONS = FILES / "BFCL_v4_multi_turn_base.json"
DOCS = "bfcl_eval/data/multi_turn_func_doc"

# Two runs on scratch databases plus the wheel's download: past the default tier's budget.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bfcl_wheel.fetch(tmp_path_factory.mktemp("bfcl"))


def _run(tmp_path: Path, wheel: Path, results: str, env: dict[str, str]) -> dict[str, Any]:
    out = tmp_path / results
    ran = CliRunner().invoke(
        eval_group,
        [
            "bfcl-multi-turn",
            str(QUESTIONS),
            str(FILES / "result" / f"{results}.json"),
            "--bfcl",
            str(wheel),
            "--out",
            str(out),
        ],
        env=env,
        catch_exceptions=False,
    )
    assert ran.exit_code == 0, ran.output
    report: dict[str, Any] = json.loads((out / "bfcl-multi-turn.json").read_text())
    return report


def _called(call: str) -> str:
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), call
    return node.func.id


def _ground_truth_writes(wheel: Path) -> dict[str, int]:
    """Entry → the calls of its ground truth that are writes, from BFCL's function docs."""
    class_of = {}
    for class_name, (_, doc_file) in backend.CLASSES.items():
        for line in (wheel / DOCS / doc_file).read_text().splitlines():
            class_of[json.loads(line)["name"]] = class_name
    counted = {}
    for line in (FILES / "possible_answer" / QUESTIONS.name).read_text().splitlines():
        doc = json.loads(line)
        names = [_called(call) for turn in doc["ground_truth"] for call in turn]
        counted[doc["id"]] = sum(tools.kind_of(class_of[n], n) == "write" for n in names)
    return counted


def _executor_exact(entry: dict[str, Any]) -> None:
    assert entry["skipped"] is None, entry["skipped"]
    assert entry["state_equal"] is True, entry["state_differences"]
    assert entry["correlated"] is True
    assert entry["refusals"] == 0
    for call in entry["calls"]:
        assert call["outcome"] == "succeeded", call
        assert call["response"] == call["bfcl_response"], call
        # Reads run once here (no retries on a healthy stack) and never store.
        assert call["runs"] == 1, call
        assert call["effects"] == (1 if call["write"] else 0), call
    assert entry["executor_ok"] is True


@pytest.mark.timeout(600)
def test_bfcl_multi_turn_through_real_workers(
    tmp_path: Path, wheel: Path, database_url: str, redis_url: str
) -> None:
    env = {"CALLGATE_DATABASE_URL": database_url, "CALLGATE_REDIS_URL": redis_url}
    writes = _ground_truth_writes(wheel)

    right = _run(tmp_path, wheel, "ground-truth", env)
    assert right["summary"]["bfcl_valid"] == 4 and right["summary"]["bfcl_invalid"] == 0
    for entry in right["entries"]:
        assert entry["bfcl_valid"] is True, entry["bfcl_error"]
        _executor_exact(entry)
        stored = sum(c["effects"] for c in entry["calls"])
        assert stored == writes[entry["id"]] > 0, entry["id"]

    wrong = _run(tmp_path, wheel, "mutated", env)
    verdicts = {e["id"]: (e["bfcl_valid"], e["bfcl_error"]) for e in wrong["entries"]}
    assert verdicts.pop("multi_turn_base_0") == (False, "multi_turn:instance_state_mismatch")
    assert all(valid for valid, _ in verdicts.values()), verdicts
    # The model was wrong; the executor still ran exactly what it proposed, as BFCL does.
    for entry in wrong["entries"]:
        _executor_exact(entry)
    assert wrong["summary"]["executor_ok"] == 4
