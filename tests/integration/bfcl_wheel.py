"""The reference the BFCL tests check against: the ``bfcl-eval`` wheel, fetched without its
dependencies (they include torch and pinned numpy; its checkers and decoders need none of
them) and unzipped, so its code and data are read from the package BFCL publishes."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

BFCL_EVAL = "bfcl-eval==2026.3.23"


def fetch(folder: Path) -> Path:
    """Download the wheel into ``folder`` and unzip it; the unzipped tree."""
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", BFCL_EVAL, "--no-deps", "-q", "-d", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fetched.returncode == 0, f"could not fetch {BFCL_EVAL}: {fetched.stderr[-1000:]}"
    (wheel,) = folder.glob("bfcl_eval-*.whl")
    unpacked = folder / "wheel"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    return unpacked
