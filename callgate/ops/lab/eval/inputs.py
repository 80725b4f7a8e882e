"""Reading the files ``callgate eval`` is given (suites, fixtures, responses, reports, BFCL's
files) under two bounds, so a hostile or broken file is one ``invalid_input`` line rather
than a traceback or a process that fills memory:

- a size cap, ``CALLGATE_EVAL_MAX_FILE_BYTES`` (``--max-file-bytes``): a file is refused from
  its size before any of it is read, and a read never takes more than the cap (a device or a
  file that grows while it is read);
- a nesting cap, ``MAX_DEPTH`` containers, checked before the parser recurses: Python's JSON
  and PyYAML's composer recurse once per level and fail near a few hundred levels. In YAML a
  chain of aliases nests as deep as text does, and aliases of aliases can stand for
  exponentially many values, so both are counted as the document is composed.
"""

from __future__ import annotations

import itertools
import operator
import os
import re
import stat
from functools import cache
from pathlib import Path
from typing import Any

import click

from callgate.core.errors import ConfigurationError, InputError
from callgate.ops.flags import setting_option
from callgate.ops.lab.settings import EvalSettings

# Real fixtures and BFCL's files nest 10 to 15 levels; a recorded response carrying tool
# arguments at callgate's own limit (64) stays under this. PyYAML fails near 400 levels.
MAX_DEPTH = 100
# Values an aliased YAML document may stand for, per character of its text: without aliases
# every value takes at least one character, so only alias expansion can go past this.
VALUES_PER_CHAR = 4

CAP_SETTING = f"--max-file-bytes, {EvalSettings.env_name('max_file_bytes')}"

# Every eval command that reads a file takes the same cap.
max_file_bytes_option = setting_option(
    "--max-file-bytes",
    "max_bytes",
    variable="CALLGATE_EVAL_MAX_FILE_BYTES",
    type=click.IntRange(min=1),
    help="Largest input file read, in bytes; a larger one is refused before it is read.",
)


def max_file_bytes(limit: int | None = None) -> int:
    """``limit``, or the declared setting when the caller passes none."""
    return EvalSettings.from_env().max_file_bytes if limit is None else limit


def read_text(path: Path, limit: int | None = None) -> str:
    """``path``'s UTF-8 text, refused past ``limit`` bytes (default: the setting)."""
    cap = max_file_bytes(limit)
    try:
        with path.open("rb") as stream:
            found = os.fstat(stream.fileno())
            if stat.S_ISREG(found.st_mode) and found.st_size > cap:
                raise too_large(path, cap, found.st_size)
            data = stream.read(cap + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > cap:
        raise too_large(path, cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def too_large(path: Path, cap: int, size: int | None = None) -> InputError:
    said = f"{size} bytes" if size is not None else "larger"
    return InputError(
        f"{path}: {said}, more than the {cap} bytes callgate eval reads; raise the cap with "
        f"{CAP_SETTING}"
    )


# JSON ------------------------------------------------------------------------------------

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
# An opening bracket counts 2, a closing one 0, every other byte is dropped: the running sum
# minus the count so far is the depth, computed by C code (bytes.translate, accumulate)
# rather than a Python loop over every character.
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(text: str) -> int:
    """How deep ``text``'s brackets nest outside its strings (for text that is not JSON,
    an estimate: the parser refuses that text anyway)."""
    outside = _STRING.sub("", text).encode("utf-8", "replace")
    steps = outside.translate(_STEPS, _NOT_BRACKETS)
    if not steps:
        return 0
    depth: int = max(map(operator.sub, itertools.accumulate(steps), itertools.count(1)))
    return depth


def check_json_depth(text: str, where: str) -> None:
    """Refuse JSON nested past ``MAX_DEPTH``, before ``json.loads`` recurses into it."""
    if text.count("[") + text.count("{") > MAX_DEPTH and json_depth(text) > MAX_DEPTH:
        raise InputError(f"{where}: nesting deeper than {MAX_DEPTH} levels")


# YAML ------------------------------------------------------------------------------------


class _Refused(Exception):
    def __init__(self, problem: str, line: int) -> None:
        super().__init__(problem)
        self.problem = problem
        self.line = line


@cache
def _loader() -> Any:
    try:
        import yaml
        from yaml.events import MappingStartEvent, SequenceStartEvent
        from yaml.nodes import MappingNode, SequenceNode
    except ImportError:
        raise ConfigurationError(
            "callgate eval reads YAML with PyYAML: pip install 'callgate[eval]'"
        ) from None

    class Bounded(yaml.SafeLoader):  # type: ignore[misc]
        """SafeLoader whose composer counts, for every node, how deep it nests and how many
        values it stands for (aliases expanded), and stops at the caps."""

        def __init__(self, text: str) -> None:
            super().__init__(text)
            self.depth = 0
            self.budget = VALUES_PER_CHAR * len(text) + 64
            self.measured: dict[int, tuple[int, int]] = {}  # id(node) → (height, values)

        def compose_node(self, parent: Any, index: Any) -> Any:
            opens = self.check_event(SequenceStartEvent, MappingStartEvent)
            if opens:
                self.depth += 1
                if self.depth > MAX_DEPTH:
                    line = self.peek_event().start_mark.line + 1
                    raise _Refused(f"nesting deeper than {MAX_DEPTH} levels", line)
            try:
                node = super().compose_node(parent, index)
            finally:
                if opens:
                    self.depth -= 1
            self._measure(node)
            return node

        def _measure(self, node: Any) -> None:
            if id(node) in self.measured:
                return  # an alias of a node measured when it was composed
            if isinstance(node, SequenceNode):
                children = list(node.value)
            elif isinstance(node, MappingNode):
                children = [part for pair in node.value for part in pair]
            else:
                self.measured[id(node)] = (0, 1)
                return
            sizes = [self.measured.get(id(child), (0, 1)) for child in children]
            height = 1 + max((h for h, _ in sizes), default=0)
            values = 1 + sum(v for _, v in sizes)
            line = node.start_mark.line + 1
            if height > MAX_DEPTH:
                raise _Refused(f"nesting deeper than {MAX_DEPTH} levels (through aliases)", line)
            if values > self.budget:
                raise _Refused(f"its aliases stand for more than {self.budget} values", line)
            self.measured[id(node)] = (height, values)

    return Bounded


def load_yaml(text: str, file: Path) -> Any:
    """``text`` (read from ``file``) as PyYAML's ``safe_load`` reads it, within the caps."""
    loader = _loader()(text)
    import yaml

    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise InputError(f"{file}: {exc.problem} (line {exc.line})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise InputError(f"{file}: not valid YAML{line}") from None
    finally:
        loader.dispose()
