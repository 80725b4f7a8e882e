"""The planted corpus (``tests/redaction_planted.py``) through the redactor's two walks: the
one results take (``results.bounded_value``) and the one failure details, trace details and a
span's arguments take (``redaction.redact_value``). No planted secret may come out, and no
ordinary value may be changed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.tools import redaction, results
from callgate.tools.registry import ResultLimits
from tests.redaction_planted import KEEPS, PLANTS, Keep, Plant


def _walks(value: Any) -> dict[str, str]:
    wrapped = {"item": value}
    return {
        "result": json.dumps(
            results.bounded_value(wrapped, ResultLimits(), []), ensure_ascii=False
        ),
        "value": json.dumps(redaction.redact_value(wrapped), ensure_ascii=False),
    }


@pytest.mark.parametrize("plant", PLANTS, ids=[p.id for p in PLANTS])
def test_no_planted_secret_comes_out(plant: Plant) -> None:
    for walk, out in _walks(plant.value).items():
        leaked = [m for m in plant.markers if m in out]
        assert leaked == [], f"{walk}: {out}"


@pytest.mark.parametrize("kept", KEEPS, ids=[k.id for k in KEEPS])
def test_ordinary_values_come_out_unchanged(kept: Keep) -> None:
    for walk, out in _walks(kept.value).items():
        assert "[redacted]" not in out, f"{walk}: {out}"
        assert all(json.dumps(p, ensure_ascii=False)[1:-1] in out for p in kept.parts), out
