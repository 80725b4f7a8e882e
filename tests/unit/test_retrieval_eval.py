"""The retrieval measurement (callgate.ops.lab.eval.retrieval) on a BFCL-format suite.

The suite, tests/fixtures/bfcl/retrieval/, is the first 120 entries of BFCL's
``BFCL_v4_multiple.json`` and their possible answers, as BFCL publishes them (its README says
where from). Every question's tools join one catalog of 294 tools; the floors below are
what BM25 measured on it, a little under, so a change that loses recall fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from callgate.core.errors import InputError
from callgate.ops.lab.eval import retrieval as retrieval_eval
from callgate.ops.lab.eval.retrieval import approx_tokens, recall_at_k

SUITE = Path(__file__).parents[1] / "fixtures" / "bfcl" / "retrieval" / "BFCL_v4_multiple.json"
# Measured: recall@5 0.975 (117 of 120), recall@1 0.833, with every one of the 294 tools a
# candidate.
RECALL_AT_5_FLOOR = 0.95
RECALL_AT_1_FLOOR = 0.80


def test_recall_at_k() -> None:
    assert recall_at_k(["a"], ["a", "b"], 1) == 1.0
    assert recall_at_k(["b"], ["a", "b"], 1) == 0.0
    assert recall_at_k(["b"], ["a", "b"], 2) == 1.0
    assert recall_at_k(["a", "c"], ["a", "b", "c"], 2) == 0.5
    assert recall_at_k(["a", "a"], ["a"], 5) == 1.0  # an expected tool counts once
    with pytest.raises(ValueError):
        recall_at_k([], ["a"], 1)
    with pytest.raises(ValueError):
        recall_at_k(["a"], ["a"], 0)


def test_tokens_are_words_and_punctuation() -> None:
    # {  "  name  "  :  "  get_weather  "  }
    assert approx_tokens('{"name": "get_weather"}') == 9
    assert approx_tokens("") == 0


def test_bfcl_types_become_json_schema() -> None:
    bfcl = {
        "type": "dict",
        "properties": {
            "radius": {"type": "float"},
            "point": {"type": "tuple", "items": {"type": "float"}},
            "extra": {"type": "any", "description": "anything"},
        },
        "required": ["radius"],
    }
    assert retrieval_eval.json_schema(bfcl) == {
        "type": "object",
        "properties": {
            "radius": {"type": "number"},
            "point": {"type": "array", "items": {"type": "number"}},
            "extra": {"description": "anything"},
        },
        "required": ["radius"],
    }


def test_the_suite_has_200_tools_and_50_questions_with_their_tool() -> None:
    suite = retrieval_eval.load_bfcl(SUITE)
    assert len(suite.catalog.tools) >= 200
    assert len(suite.questions) >= 50
    for q in suite.questions:
        assert q.expected and set(q.expected) <= suite.catalog.tools.keys()


def test_recall_and_tokens_on_the_suite() -> None:
    measured = retrieval_eval.measure(retrieval_eval.load_bfcl(SUITE))
    assert measured.tools == 294 and measured.questions == 120
    assert measured.recall[5] >= RECALL_AT_5_FLOOR, measured.misses[5]
    assert measured.recall[1] >= RECALL_AT_1_FLOOR, measured.misses[1]
    assert measured.recall[1] <= measured.recall[3] <= measured.recall[5] <= measured.recall[10]
    # Five definitions instead of 294: far fewer tokens per request.
    assert measured.tokens_top[5] < measured.tokens_all / 20
    assert measured.saving(5) > 0.95


def test_a_question_whose_tool_is_not_offered_is_refused(tmp_path: Path) -> None:
    (tmp_path / "possible_answer").mkdir()
    question = {
        "id": "multiple_0",
        "question": [[{"role": "user", "content": "Weather in Seoul?"}]],
        "function": [{"name": "get_news", "description": "News.", "parameters": {}}],
    }
    answer = {"id": "multiple_0", "ground_truth": [{"get_weather": {"city": ["Seoul"]}}]}
    (tmp_path / "q.json").write_text(json.dumps(question) + "\n")
    (tmp_path / "possible_answer" / "q.json").write_text(json.dumps(answer) + "\n")
    with pytest.raises(InputError, match="get_weather"):
        retrieval_eval.load_bfcl(tmp_path / "q.json")


def test_the_command_prints_recall_and_the_token_saving() -> None:
    """``callgate eval retrieval`` as a process."""
    command = [sys.executable, "-m", "callgate", "eval", "retrieval"]
    run = subprocess.run(
        [*command, str(SUITE), "--k", "1,5", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["tools"] == 294 and doc["questions"] == 120
    assert set(doc["recall"]) == {"1", "5"}
    assert doc["recall"]["5"] >= RECALL_AT_5_FLOOR
    assert "regex" in doc["token_count"]
    text = subprocess.run([*command, str(SUITE)], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert "recall@k" in text.stdout and "saving" in text.stdout
