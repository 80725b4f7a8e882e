"""Every fenced code block of README.md and docs/**/*.md runs as written, or says why not.

The rule, by the block's language (its fence's tag) and the marker on the line before it
(see ``snippets.py`` for the marker syntax):

- ``python``: run, one subprocess per block, in an empty directory of its own. Marked
  ``services``, it runs against a migrated database of its own, the test Redis, and one
  worker and relayer serving the demo tools (``CALLGATE_TOOLS`` names them). Marked
  ``continues``, the previous block of the page runs first in the same script.
- ``sh``, ``console``, ``bash``, ``shell``: a command needs a marker: ``run`` (or
  ``services``) runs it with bash (``set -e``), ``callgate`` being this checkout's CLI;
  ``not run: REASON`` says why it cannot run alone (a long-running process, an install, a
  placeholder), and ``background`` marks long-running processes another test starts.
- ``sql``: quoted from the code; tests/unit/test_docs.py checks each against its constant.
- ``json``: must parse (configuration and output examples are shown, not run).
- ``text``, no tag, ``nginx``, ``toml``, ``yaml``, ``ini``: output samples, diagrams and other
  programs' configuration; not run.
- ``python`` may also say ``not run: REASON``. Any other language fails until this rule
  names it.

docs/first-tool.md is followed from start to end, in order, by test_first_tool.py (slow);
here its blocks only have to follow the rule.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from callgate.ops.stack import Stack, wait_for_workers
from tests.docs.snippets import ROOT, Block, blocks, checkout_pythonpath, every_block, pages

SHELLS = {"sh", "console", "bash", "shell"}
SHOWN = {"text", "", "nginx", "toml", "yaml", "ini"}
RUNS = {"run", "services"}
KNOWN_MARKS = {"run", "services", "continues", "background", "not run"}
FOLLOWED = "docs/first-tool.md"
DEMO_TOOLS = "callgate.ops.lab.demo.tools:demo_registry"

BLOCKS = every_block()


def verdict(block: Block) -> str:
    """'run', 'not run', 'checked' (sql, json) or 'shown'; raises for a block the rule
    cannot place."""
    unknown = block.marks - KNOWN_MARKS
    assert not unknown, f"{block.id}: unknown snippet marker {sorted(unknown)}"
    if "not run" in block.marks:
        assert block.reason, f"{block.id}: 'not run:' needs a reason"
        return "not run"
    if block.lang == "python":
        return "run"
    if block.lang in SHELLS:
        if "background" in block.marks:
            return "not run"
        assert block.marks & RUNS, (
            f"{block.id}: a {block.lang} block needs <!-- snippet: run --> (or services) "
            "or <!-- snippet: not run: REASON -->"
        )
        return "run"
    if block.lang in ("sql", "json"):
        return "checked"
    assert block.lang in SHOWN, f"{block.id}: no rule for language {block.lang!r}"
    return "shown"


def test_the_pages_have_blocks() -> None:
    assert len(pages()) >= 10
    assert len(BLOCKS) >= 40


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_every_block_follows_the_rule(block: Block) -> None:
    if verdict(block) == "checked" and block.lang == "json":
        json.loads(block.code)


def _script(block: Block) -> str:
    """The block's code, after the blocks it continues."""
    if "continues" not in block.marks:
        return block.code
    page = blocks(ROOT / block.page)
    earlier = [b for b in page if b.line < block.line and b.lang == block.lang]
    assert earlier, f"{block.id}: continues, but no earlier {block.lang} block"
    return _script(earlier[-1]) + block.code


def _needs_services(block: Block) -> bool:
    if "services" in block.marks:
        return True
    if "continues" in block.marks:
        page = blocks(ROOT / block.page)
        earlier = [b for b in page if b.line < block.line and b.lang == block.lang]
        return bool(earlier) and _needs_services(earlier[-1])
    return False


def _runnable() -> list[Block]:
    found = []
    for b in BLOCKS:
        if b.page == FOLLOWED:
            continue
        try:
            if verdict(b) == "run":
                found.append(b)
        except AssertionError:
            continue  # test_every_block_follows_the_rule reports it
    return found


RUNNABLE = _runnable()


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``callgate`` and ``python`` as a user's shell finds them, for this checkout."""
    directory = tmp_path_factory.mktemp("bin")
    pythonpath = checkout_pythonpath(os.environ.get("PYTHONPATH"))
    for name, command in (
        ("callgate", f'exec "{sys.executable}" -P -m callgate.ops.cli "$@"'),
        ("python", f'exec "{sys.executable}" "$@"'),
    ):
        path = directory / name
        path.write_text(f'#!/bin/sh\nPYTHONPATH="{pythonpath}" {command}\n')
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return directory


@pytest.fixture(scope="module")
def snippet_services(
    make_own_database: Callable[[], str], redis_url: str
) -> Iterator[dict[str, str]]:
    """A database of this module's own with a worker and a relayer serving the demo tools."""
    env = {
        "CALLGATE_DATABASE_URL": make_own_database(),
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": f"snip-{uuid.uuid4().hex[:10]}",
        "CALLGATE_TOOLS": DEMO_TOOLS,
    }
    stack = Stack(env=env, workers=1, relayer=True, sweeper=False)
    stack.__enter__()
    try:
        wait_for_workers(redis_url, env["CALLGATE_QUEUE"], 1)
        yield env
    finally:
        stack.stop()


def _clean_env() -> dict[str, str]:
    """This process's environment without callgate's own variables: a block sees only what
    it, or its marker, sets."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}


@pytest.mark.services
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_block_runs(
    block: Block, tmp_path: Path, bin_dir: Path, request: pytest.FixtureRequest
) -> None:
    env = _clean_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = checkout_pythonpath(env.get("PYTHONPATH"))
    if _needs_services(block):
        env.update(request.getfixturevalue("snippet_services"))
    script = _script(block)
    if block.lang == "python":
        (tmp_path / "snippet.py").write_text(script)
        argv = [sys.executable, "snippet.py"]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", script]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    print(done.stdout)  # shown with -s, or on a failure
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}\n--- code\n{script}\n--- stdout\n{done.stdout}"
        f"\n--- stderr\n{done.stderr}"
    )
