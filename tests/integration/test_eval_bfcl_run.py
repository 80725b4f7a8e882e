"""``callgate eval import-bfcl`` then ``callgate eval run`` end to end: a prompting model's
recorded BFCL results through real workers on a scratch database. Every call runs on its
read-only stub and makes no effect (counted in the ledger); the model's mistakes show in the
model's table only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from callgate.ops.lab.eval.cli import eval_group

FILES = Path(__file__).parents[1] / "fixtures" / "bfcl" / "import"


@pytest.mark.timeout(180)
def test_imported_bfcl_results_score_through_the_real_pipeline(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    runner = CliRunner()
    suite = tmp_path / "bfcl-simple"
    imported = runner.invoke(
        eval_group,
        [
            "import-bfcl",
            str(FILES / "BFCL_v4_simple_python.json"),
            "--results",
            str(FILES / "result" / "prompt-model" / "BFCL_v4_simple_python_result.json"),
            "--name",
            "prompted",
            "--out",
            str(suite),
        ],
        catch_exceptions=False,
    )
    assert imported.exit_code == 0, imported.output

    env = {"CALLGATE_DATABASE_URL": database_url, "CALLGATE_REDIS_URL": redis_url}
    out = tmp_path / "report"
    ran = runner.invoke(
        eval_group,
        ["run", str(suite), "--answers", "prompted", "--out", str(out)],
        env=env,
        catch_exceptions=False,
    )
    assert ran.exit_code == 0, ran.output
    report = json.loads((out / "eval-prompted.json").read_text())
    metrics = report["metrics"]
    # The model: right tool in 3 of 4 (one prose answer), right values in 1 of 4.
    assert metrics["selection_accuracy"]["value"] == pytest.approx(3 / 4)
    assert metrics["argument_accuracy"]["value"] == pytest.approx(1 / 4)
    assert metrics["argument_validity"]["value"] == 1.0
    # The executor: every proposed call ran on its stub and succeeded, with zero effects.
    assert metrics["outcome_accuracy"]["value"] == 1.0
    assert metrics["outcome_accuracy"]["total"] == 3
    # Counted from the ledger rows of each call's operation, never from a returned value.
    assert metrics["side_effect_exactness"]["value"] == 1.0
    assert metrics["side_effect_exactness"]["total"] == 3
    assert all(f["table"] == "model" for f in report["failures"])
