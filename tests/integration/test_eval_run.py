"""``callgate eval run`` end to end on the built-in suite: real workers, relayer and fan-in
on a scratch database. The bad answers move only the model's table; a broken executor
double (its writes ignore the idempotency key) moves only the executor's; compare flags it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from callgate.ops.lab.eval.cli import eval_group

BROKEN = "tests.integration.eval_broken_tools:registry"


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
