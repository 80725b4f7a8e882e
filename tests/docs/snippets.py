"""The fenced code blocks of the README and docs/, with the marker each carries.

A marker is an HTML comment on the line before a block's opening fence (blank lines between
are allowed): ``<!-- snippet: services -->``, ``<!-- snippet: continues -->``,
``<!-- snippet: run -->``, ``<!-- snippet: background -->`` or
``<!-- snippet: not run: REASON -->``. Markers combine with commas
(``<!-- snippet: services, continues -->``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*snippet:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marks: frozenset[str]
    reason: str | None  # the "not run:" reason

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def checkout_pythonpath(current: str | None) -> str:
    """PYTHONPATH with this checkout first, as absolute paths: a relative or empty entry
    would mean whatever directory the subprocess runs in."""
    entries = [str(ROOT), *(os.path.abspath(p) for p in (current or "").split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(entries))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = len(opening["indent"])
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        marks, reason = _marker(lines, i)
        found.append(
            Block(
                page=str(page.relative_to(ROOT)),
                line=i + 1,
                lang=opening["lang"],
                code=code,
                marks=marks,
                reason=reason,
            )
        )
        i = end + 1
    return found


def _marker(lines: list[str], fence: int) -> tuple[frozenset[str], str | None]:
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    found = MARKER.match(lines[j].strip()) if j >= 0 else None
    if found is None:
        return frozenset(), None
    body = found["body"]
    if body.startswith("not run:"):
        return frozenset({"not run"}), body.removeprefix("not run:").strip()
    return frozenset(m.strip() for m in body.split(",") if m.strip()), None


def every_block() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]
