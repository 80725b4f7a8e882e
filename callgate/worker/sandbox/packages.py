"""Which installed files the sandbox sees: the interpreter, its standard library, and the
top-level folders of the packages the tool names (with what they require).

Packages are bound one folder at a time under ``/opt/site``, never a whole site-packages
(which holds callgate, its drivers and whatever else the worker runs on).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from importlib import metadata
from pathlib import Path

from callgate.core.errors import ConfigurationError

# Visible by default where installed: the usual analysis stack.
DEFAULT_PACKAGES = ("numpy", "pandas", "matplotlib")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _requirements(dist: metadata.Distribution) -> list[str]:
    """The names a distribution requires, leaving out those only an extra asks for. A
    requirement for another platform that happens to be installed is bound too: harmless,
    it is read-only."""
    names = []
    for line in dist.requires or []:
        requirement, _, marker = line.partition(";")
        if "extra" in marker:
            continue
        found = _NAME.match(requirement)
        if found:
            names.append(found.group(1))
    return names


def _top_level(dist: metadata.Distribution) -> set[Path]:
    """The top-level files and folders a distribution installed into its site-packages."""
    site = Path(str(dist.locate_file(""))).resolve()
    tops: set[Path] = set()
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith(".dist-info"):
            continue
        if parts[0].endswith((".pth", ".egg-link")):
            continue
        top = site / parts[0]
        if top.exists():
            tops.add(top)
    return tops


def resolve(packages: tuple[str, ...] | None) -> dict[str, Path]:
    """``/opt/site`` entry name → the host path bound there, read-only.

    ``None`` is ``DEFAULT_PACKAGES`` where installed; a package named explicitly must be
    installed (``ConfigurationError`` otherwise). Requirements follow, where installed."""
    named = DEFAULT_PACKAGES if packages is None else packages
    pending: list[str] = []
    for name in named:
        if _installed(name) is not None:
            pending.append(name)
        elif packages is not None:
            raise ConfigurationError(
                f"run_python: package {name!r} is not installed in this worker's environment "
                f"({sys.prefix}); install it or leave it out of packages="
            )
    seen: set[str] = set()
    binds: dict[str, Path] = {}
    while pending:
        name = pending.pop()
        if _normal(name) in seen:
            continue
        seen.add(_normal(name))
        dist = _installed(name)
        if dist is None:
            continue
        for top in _top_level(dist):
            binds.setdefault(top.name, top)
        pending.extend(_requirements(dist))
    return binds


def readable_by(path: Path, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` (not root) can open ``path``: every folder on the way
    searchable, the file itself readable (a folder also searchable)."""
    path = Path(os.path.abspath(path))
    chain = [*reversed(path.parents), path]
    for i, step in enumerate(chain):
        try:
            st = step.stat()
        except OSError:
            return False
        if st.st_uid == uid:
            bits = (st.st_mode >> 6) & 7
        elif st.st_gid == gid:
            bits = (st.st_mode >> 3) & 7
        else:
            bits = st.st_mode & 7
        last = i == len(chain) - 1
        need = 1 if not last else (5 if stat.S_ISDIR(st.st_mode) else 4)
        if bits & need != need:
            return False
    return True
