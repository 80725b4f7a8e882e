"""The documentation under docs/ stands alone and stays true to the code.

- every error code of ``ErrorCode`` has its own row in docs/errors.md, and every row names a code
  that exists;
- every ``CALLGATE_…`` variable the package mentions is documented in docs/configuration.md,
  and every variable documented there is still read somewhere;
- every SQL block quoted from the code (first line ``-- callgate.module.CONSTANT``, or
  ``-- excerpt of callgate.module.CONSTANT``) still matches that constant;
- every relative link in README.md and docs/*.md resolves to a file, and its anchor to a heading;
- every page of docs/ is listed in the index (docs/README.md) and in README.md's short list;
- nothing points to a document the repository does not contain.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import callgate
from callgate.core.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PACKAGE = Path(callgate.__file__).resolve().parent


def _pages() -> list[Path]:
    return [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def _python_sources(top: Path) -> Iterator[Path]:
    # The code is all under callgate/ (the checkout's top-level folders are links into it).
    for folder, _dirs, files in os.walk(top):
        for name in files:
            if name.endswith(".py"):
                yield Path(folder) / name


def _without_code(text: str) -> str:
    """Markdown with fenced blocks and inline code removed (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


# --- error codes -------------------------------------------------------------------------------

_CODE_ROW = re.compile(r"^\| `([a-z_]+)` \|", re.M)


def test_every_error_code_has_a_row_in_errors_md() -> None:
    documented = set(_CODE_ROW.findall((DOCS / "errors.md").read_text()))
    missing = sorted(c.value for c in ErrorCode if c.value not in documented)
    assert missing == [], f"document these codes in docs/errors.md: {missing}"


def test_errors_md_documents_only_codes_that_exist() -> None:
    documented = set(_CODE_ROW.findall((DOCS / "errors.md").read_text()))
    stale = sorted(documented - {c.value for c in ErrorCode})
    assert stale == [], f"docs/errors.md documents codes ErrorCode no longer has: {stale}"


# --- settings ----------------------------------------------------------------------------------

_SETTING = re.compile(r"CALLGATE_[A-Z0-9]+(?:_[A-Z0-9]+)*")


def _settings_in(paths: Iterator[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        found.update(_SETTING.findall(path.read_text(encoding="utf-8")))
    return found


def _documented_settings() -> set[str]:
    text = (DOCS / "configuration.md").read_text()
    return set(re.findall(r"`(CALLGATE_[A-Z0-9_]+)`", text))


def test_every_setting_the_code_reads_is_documented() -> None:
    read = _settings_in(_python_sources(PACKAGE))
    assert read, "found no CALLGATE_ setting in the package: is the scan broken?"
    missing = sorted(read - _documented_settings())
    assert missing == [], f"document these settings in docs/configuration.md: {missing}"


# --- quoted SQL --------------------------------------------------------------------------------

_QUOTE = re.compile(
    r"^```sql\n-- (excerpt of )?(callgate(?:\.\w+)+)\.([A-Z][A-Z0-9_]*)\n(.*?)^```", re.S | re.M
)


def _squash(sql: str) -> str:
    return " ".join(sql.split())


def _quotes() -> list[tuple[str, bool, str, str, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for m in _QUOTE.finditer(page.read_text()):
            found.append((page.name, bool(m.group(1)), m.group(2), m.group(3), m.group(4)))
    return found


def test_the_guarantee_statements_are_quoted() -> None:
    quoted = {f"{m}.{n}" for page, _, m, n, _ in _quotes() if page == "guarantees.md"}
    for name in (
        "callgate.store.endings.END_READS_SQL",
        "callgate.store.reservations.RESERVE_SQL",
        "callgate.store.reservations.RENEW_SQL",
        "callgate.store.completions.COMPLETE_MANY_SQL",
        "callgate.store.completions.COMPLETE_SQL",
        "callgate.store.reservations.CONCLUDE_SQL",
        "callgate.store.reservations.ABANDON_SQL",
        "callgate.store.sweeps.DUE_SQL",
        "callgate.store.sweeps.MARK_SQL",
        "callgate.store.outbox.CLAIM_SQL",
        "callgate.store.outbox.MARK_SQL",
    ):
        assert name in quoted, f"docs/guarantees.md should quote {name}"


@pytest.mark.parametrize(
    ("page", "excerpt", "module", "name", "quoted"),
    _quotes(),
    ids=[f"{q[0]}:{q[3]}" for q in _quotes()],
)
def test_quoted_sql_matches_the_code(
    page: str, excerpt: bool, module: str, name: str, quoted: str
) -> None:
    constant = getattr(importlib.import_module(module), name, None)
    assert isinstance(constant, str), f"docs/{page} quotes {module}.{name}, which is gone"
    if excerpt:
        assert _squash(quoted) in _squash(constant), f"docs/{page}: {name} changed; re-quote it"
    else:
        assert _squash(quoted) == _squash(constant), f"docs/{page}: {name} changed; re-quote it"


# --- links -------------------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return found


def _links() -> list[tuple[Path, str]]:
    out = []
    for page in _pages():
        for m in _LINK.finditer(_without_code(page.read_text())):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            out.append((page, target))
    return out


def test_pages_have_links_to_check() -> None:
    assert len(_links()) > 20


@pytest.mark.parametrize(("page", "target"), _links(), ids=[f"{p.name}->{t}" for p, t in _links()])
def test_relative_link_resolves(page: Path, target: str) -> None:
    path_part, _, anchor = target.partition("#")
    resolved = (page.parent / path_part).resolve() if path_part else page
    assert resolved.exists(), f"{page.name}: link {target!r} points to a missing file"
    if anchor:
        assert resolved.suffix == ".md", f"{page.name}: anchor on a non-Markdown target {target!r}"
        assert anchor in anchors(resolved), f"{page.name}: no heading for anchor {target!r}"
    assert ROOT in resolved.parents or resolved == ROOT, f"{page.name}: {target!r} leaves the repo"


# --- the index ---------------------------------------------------------------------------------


def _targets(page: Path) -> set[Path]:
    found = set()
    for m in _LINK.finditer(_without_code(page.read_text())):
        target = (m.group(1) or m.group(2)).partition("#")[0]
        if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target):
            found.add((page.parent / target).resolve())
    return found


@pytest.mark.parametrize("index", [DOCS / "README.md", README], ids=["docs/README.md", "README.md"])
def test_every_docs_page_is_in_the_index(index: Path) -> None:
    listed = _targets(index)
    missing = [
        str(p.relative_to(ROOT))
        for p in sorted(DOCS.rglob("*.md"))
        if p.resolve() not in listed and p != index and p.name != "README.md"
    ]
    assert missing == [], f"{index.relative_to(ROOT)} does not link to {missing}"


# --- standing alone ----------------------------------------------------------------------------


def _all_doc_pages() -> list[Path]:
    return [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", _all_doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_to_a_document_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert not re.search(r"\bSPEC\b", text), f"{page.name} mentions SPEC"
    assert "§" not in text, f"{page.name} uses a section mark"
    assert not re.search(r"\bthe seed\b|\bseed's\b", text, re.I), f"{page.name} cites the seed"
