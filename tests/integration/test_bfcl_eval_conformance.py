"""``import-bfcl``'s verdicts against BFCL's own checker, run now, on a held-out set.

The unit test (tests/unit/test_eval_bfcl_conformance.py) compares against verdicts BFCL's
checker gave once, stored with the fixture. This one fetches the reference itself: the
``bfcl-eval`` wheel, without its dependencies (they include torch and pinned numpy; its
checker and decoders need none of them), generates answers to other questions than the
stored set's (12 per category instead of 4, spaced through each file), lets BFCL's checker
judge each, and requires callgate's verdict to be the same on every one, in each of the
thirteen categories (Java, JavaScript and relevance among them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration import bfcl_wheel
from tests.unit.test_eval_bfcl_conformance import agreement, load_cases

pytestmark = pytest.mark.slow

GENERATE = Path(__file__).parents[1] / "fixtures" / "bfcl" / "conformance" / "generate.py"


@pytest.mark.timeout(900)
def test_every_verdict_equals_bfcl_evals_on_a_held_out_set(tmp_path: Path) -> None:
    unpacked = bfcl_wheel.fetch(tmp_path)

    verdicts = tmp_path / "verdicts-12.json"
    made = subprocess.run(
        [sys.executable, str(GENERATE), str(unpacked), str(verdicts), "--per", "12"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr[-2000:]

    agreed, disagreed = agreement(verdicts)
    assert agreed > 1000, f"only {agreed} cases: is the generator broken?"
    outcomes: dict[str, set[bool]] = {}
    for case in load_cases(verdicts):
        outcomes.setdefault(case["category"], set()).add(case["bfcl"])
    assert len(outcomes) == 13, sorted(outcomes)
    assert all(seen == {True, False} for seen in outcomes.values()), outcomes
    assert disagreed == [], [
        (c["id"], c["style"], c["kind"], c["bfcl"], c["result"]) for c in disagreed[:10]
    ]
