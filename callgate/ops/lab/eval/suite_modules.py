"""Which modules a suite may name, decided before any of them is imported.

A suite's ``tools`` and ``doubles`` are Python modules that ``callgate eval run`` imports in
its own process and its workers: running a suite runs its code, with the privileges of
whoever runs it. So a ``suite.yaml`` may name only code that came with the suite: a module
whose file lies in the suite's folder, or callgate's generic stubs (an imported suite). The
file is found the way the import would find it (the meta path finders, on the current
import path), symlinks followed, and so is every package ``__init__`` the import would run
first; anything outside the folder (callgate's own packages aside) is refused with one
``invalid_input`` line, and nothing of it runs.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

import callgate
from callgate.core.errors import InputError
from callgate.ops.lab.eval import stubs

STUBS = stubs.__name__
CALLGATE = Path(callgate.__file__).resolve().parent


def check(folder: Path, *, tools: str | None, doubles: str, stubs_file: str | None) -> None:
    """Refuse a suite in ``folder`` whose ``tools`` registry (``module:attribute``, None when
    ``--tools`` replaces it), ``doubles`` module or ``stubs`` file lies outside it."""
    if tools is not None:
        resolve(folder, tools.split(":")[0], "tools")
    resolve(folder, doubles, "doubles")
    if stubs_file is not None:
        found = (folder / stubs_file).resolve()
        if not found.is_relative_to(folder.resolve()) or not found.is_file():
            raise InputError(
                f"{folder / 'suite.yaml'}: field /stubs: {stubs_file!r} is not a file in the "
                "suite folder"
            )


def resolve(folder: Path, module: str, field: str) -> Path:
    """The file ``module`` would be imported from, when a suite in ``folder`` may name it.

    Nothing is imported: each package on the way is looked up with the finders the import
    uses; one already imported is taken as it is (its code has run already)."""
    where = f"{folder / 'suite.yaml'}: field /{field}"
    if module == STUBS:
        return Path(stubs.__file__).resolve()
    root = folder.resolve()
    parts = module.split(".")
    search: list[str] | None = None  # None: the top level, sys.path
    file: Path | None = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        last = depth == len(parts)
        loaded = sys.modules.get(name)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else _find(name, search)
        if spec is None:
            raise InputError(
                f"{where}: no module {module!r} on the import path (the current folder, or "
                "callgate --path DIR)"
            )
        origin = Path(spec.origin).resolve() if spec.has_location and spec.origin else None
        if last:
            file = origin
        elif loaded is None and origin is not None and not _ours(origin, root):
            raise InputError(
                f"{where}: importing {module!r} would run {origin}, outside the suite folder "
                f"{root}; a suite names only modules of its own folder (or {STUBS})"
            )
        if not last:
            if spec.submodule_search_locations is None:
                raise InputError(f"{where}: no module {module!r} ({name} is not a package)")
            search = list(spec.submodule_search_locations)
    if file is None or not file.is_relative_to(root):
        shown = file if file is not None else "not a file"
        raise InputError(
            f"{where}: module {module!r} is {shown}, outside the suite folder {root}; a suite "
            f"names only modules of its own folder (or {STUBS})"
        )
    return file


def _ours(origin: Path, root: Path) -> bool:
    """A package ``__init__`` the suite may run: its own, or one of callgate's."""
    return origin.is_relative_to(root) or origin.is_relative_to(CALLGATE)


def _find(name: str, search: list[str] | None) -> ModuleSpec | None:
    """What ``import`` would find for ``name``, as its own lookup does, without loading it."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(name, search, None)
        if spec is not None:
            return spec  # type: ignore[no-any-return]
    return None
