"""docs/operations.md's fleets are the load model's real output: each ``callgate bench model``
command there, run from the repository's root on docs/bench/costs.json, prints exactly the
text block that follows it. Re-measuring the costs file means regenerating those blocks."""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
import sys

import pytest

from tests.docs.snippets import ROOT, Block, blocks, checkout_pythonpath

PAGE = ROOT / "docs" / "operations.md"


def _fleets() -> list[tuple[Block, Block]]:
    page = blocks(PAGE)
    pairs = []
    for command, output in itertools.pairwise(page):
        if command.lang == "sh" and command.code.startswith("callgate bench model "):
            assert output.lang == "text", f"{command.id}: no output block after it"
            pairs.append((command, output))
    return pairs


FLEETS = _fleets()


def test_the_page_shows_several_fleets() -> None:
    assert len(FLEETS) >= 3


@pytest.mark.parametrize(("command", "output"), FLEETS, ids=[c.id for c, _ in FLEETS])
def test_a_fleet_shows_what_the_model_prints(command: Block, output: Block) -> None:
    argv = shlex.split(command.code)
    env = {**os.environ, "PYTHONPATH": checkout_pythonpath(os.environ.get("PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, "-m", "callgate", *argv[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == output.code
