"""Vertex AI's streamed function-call arguments, put back together into whole calls.

With ``functionCallingConfig.streamFunctionCallArguments`` (Vertex AI only) one call is spread
over several stream chunks:

- a ``functionCall`` part with the ``name`` (and ``id``, if any) and ``willContinue: true``
  opens it;
- following ``functionCall`` parts carry ``partialArgs``: each names one argument by a JSON
  Path (``$.city``, ``$.items[0].sku``, ``$['odd key']``) and holds one value
  (``stringValue``, ``numberValue``, ``boolValue`` or ``nullValue``). A string may arrive in
  several pieces of one path, every piece but the last with its own ``willContinue: true``;
- the first ``functionCall`` part without ``willContinue: true`` closes the call.

The closed call becomes one ordinary ``functionCall`` part with ``args``, so the
GenerateContent reader checks it like any other. Anything that does not fit (a second call
opening before the first closed, a string interrupted by another path, a path set twice, a
hole in an array) is ``malformed_tool_calls``; a call still open when the stream ends is cut
off and refused (``invalid_provider_envelope``) — its arguments are incomplete by definition.
Numbers come as doubles: an integral one becomes an int, as the non-streamed ``args`` has it.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from callgate.core.errors import ErrorCode
from callgate.producer.adapters.base import MAX_JSON_DEPTH, arr, fail, get, obj, text

# One step of a normalised JSON Path: .name, [index], ['name'] or ["name"].
_STEP = re.compile(
    r"""\.(?P<dot>[^.\[\]'"]+)|\[(?P<index>\d{1,6})\]|\['(?P<sq>(?:[^'\\]|\\.)*)'\]"""
    r"""|\["(?P<dq>(?:[^"\\]|\\.)*)"\]"""
)
_ESCAPE = re.compile(r"\\(.)")
_VALUES = (
    ("stringValue", "string_value"),
    ("numberValue", "number_value"),
    ("boolValue", "bool_value"),
    ("nullValue", "null_value"),
)


def _path(raw: object, at: str) -> list[str | int]:
    path = text(raw, "a partial argument's jsonPath", f"{at}.jsonPath", max_length=10_000)
    if not path.startswith("$"):
        fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument's jsonPath is not $-rooted", at)
    steps: list[str | int] = []
    position = 1
    while position < len(path):
        match = _STEP.match(path, position)
        if match is None or len(steps) >= MAX_JSON_DEPTH:
            fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument's jsonPath is not simple", at)
        if match["index"] is not None:
            steps.append(int(match["index"]))
        else:
            name = match["dot"] or match["sq"] or match["dq"] or ""
            steps.append(_ESCAPE.sub(r"\1", name))
        position = match.end()
    if not steps or not isinstance(steps[0], str):
        fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument does not name an argument", at)
    return steps


def _continues(holder: dict[str, object], at: str) -> bool:
    flag = get(holder, "willContinue", "will_continue")
    if flag is not None and not isinstance(flag, bool):
        fail(ErrorCode.MALFORMED_TOOL_CALLS, "willContinue is not a boolean", at)
    return flag is True


def _value(arg: dict[str, object], at: str) -> tuple[str | None, object]:
    """(kind, value) of a partial argument; kind None when it holds no value."""
    found = [(names[0], arg[name]) for names in _VALUES for name in names if name in arg]
    found = [(kind, value) for kind, value in found if value is not None]
    if not found:
        return None, None
    if len(found) > 1:
        fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument holds two values", at)
    kind, value = found[0]
    if kind == "stringValue" and not isinstance(value, str):
        fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument's stringValue is not text", at)
    if kind == "boolValue" and not isinstance(value, bool):
        fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument's boolValue is not a boolean", at)
    if kind == "nullValue":
        return kind, None
    if kind == "numberValue":
        if isinstance(value, bool) or not isinstance(value, int | float):
            fail(
                ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument's numberValue is no number", at
            )
        if isinstance(value, float):
            if not math.isfinite(value):
                fail(
                    ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument's number is not finite", at
                )
            if value.is_integer() and abs(value) < 2**53:
                return kind, int(value)
    return kind, value


class _Call:
    """One streamed call while it is open."""

    def __init__(self, part: dict[str, object], call: dict[str, object]) -> None:
        self.part = part
        self.name = call.get("name")
        self.call_id = call.get("id")
        self.args: dict[str, Any] = {}
        self.set: set[tuple[str | int, ...]] = set()
        self.continuing: tuple[str | int, ...] | None = None  # a string still arriving

    def apply(self, raw: object, at: str) -> None:
        arg = obj(raw, ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument", at)
        path = tuple(_path(get(arg, "jsonPath", "json_path"), at))
        kind, value = _value(arg, at)
        more = _continues(arg, at)
        if self.continuing is not None:  # the next piece of a string
            if path != self.continuing:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a streamed string stopped before its end", at)
            if kind not in ("stringValue", None):
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a streamed string went on as no string", at)
            container, key = self._slot(path, at)
            so_far = container[str(key)] if isinstance(container, dict) else container[-1]
            self._put(container, key, f"{so_far}{value or ''}", at)
        else:
            if path in self.set:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument is set twice", at)
            if kind is None:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument holds no value", at)
            if more and kind != "stringValue":
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "only a string continues over pieces", at)
            container, key = self._slot(path, at)
            self._put(container, key, value, at)
            self.set.add(path)
        self.continuing = path if more else None

    def _slot(
        self, path: tuple[str | int, ...], at: str
    ) -> tuple[dict[str, Any] | list[Any], str | int]:
        """The container the last step of ``path`` is in, creating the ones before it."""
        node: dict[str, Any] | list[Any] = self.args
        for step, following in itertools.pairwise(path):
            node = self._child(node, step, {} if isinstance(following, str) else [], at)
        last = path[-1]
        if isinstance(node, list):
            if (
                not isinstance(last, int)
                or last > len(node)
                or (last < len(node) and self.continuing is None)
            ):
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument leaves an array hole", at)
        elif not isinstance(last, str):
            fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument indexes an object", at)
        elif last in node and self.continuing is None:
            fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument is set twice", at)
        return node, last

    @staticmethod
    def _put(container: dict[str, Any] | list[Any], key: str | int, value: object, at: str) -> None:
        if isinstance(container, dict):
            container[str(key)] = value
        elif isinstance(key, int) and key == len(container):
            container.append(value)
        elif isinstance(key, int) and key == len(container) - 1:
            container[key] = value
        else:
            fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument leaves an array hole", at)

    @staticmethod
    def _child(
        node: dict[str, Any] | list[Any],
        step: str | int,
        empty: dict[str, Any] | list[Any],
        at: str,
    ) -> dict[str, Any] | list[Any]:
        if isinstance(node, dict) and isinstance(step, str):
            child = node.setdefault(step, empty)
        elif isinstance(node, list) and isinstance(step, int) and step <= len(node):
            if step == len(node):
                node.append(empty)
            child = node[step]
        else:
            fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument's path does not fit", at)
        if type(child) is not type(empty):
            fail(ErrorCode.MALFORMED_TOOL_CALLS, "a partial argument's path does not fit", at)
        return child

    def close(self, at: str) -> dict[str, object]:
        if self.continuing is not None:
            fail(ErrorCode.MALFORMED_TOOL_CALLS, "a streamed string never ended", at)
        call: dict[str, object] = {"name": self.name, "args": self.args}
        if self.call_id is not None:
            call["id"] = self.call_id
        part = {k: v for k, v in self.part.items() if k not in ("functionCall", "function_call")}
        return {**part, "functionCall": call}


class PartialCalls:
    """Feed a stream's parts in order; whole parts come back out, streamed calls once closed."""

    def __init__(self) -> None:
        self._open: _Call | None = None

    def part(self, raw: object, at: str) -> list[object]:
        if not isinstance(raw, dict):
            return [raw]  # the reader refuses it
        raw_call = get(raw, "functionCall", "function_call")
        if raw_call is None:
            return [raw]
        call = obj(raw_call, ErrorCode.MALFORMED_TOOL_CALLS, "functionCall", at)
        partial = get(call, "partialArgs", "partial_args")
        more = _continues(call, at)
        if self._open is None:
            if not more and partial is None:
                return [raw]  # an ordinary whole call
            self._open = _Call(raw, call)
        else:
            for key in ("name", "id"):
                value = call.get(key)
                known = self._open.name if key == "name" else self._open.call_id
                if value not in (None, "") and value != known:
                    fail(
                        ErrorCode.MALFORMED_TOOL_CALLS,
                        "a function call started before the streamed one before it ended",
                        at,
                    )
            if get(call, "args") not in (None, {}):
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a streamed function call got whole args", at)
        if partial is not None:
            for index, arg in enumerate(
                arr(partial, ErrorCode.MALFORMED_TOOL_CALLS, "partialArgs", f"{at}.partialArgs")
            ):
                self._open.apply(arg, f"{at}.partialArgs[{index}]")
        if more:
            return []
        closed = self._open.close(at)
        self._open = None
        return [closed]

    def finish(self) -> None:
        """Refuse a call the stream never closed: its arguments are incomplete."""
        if self._open is not None:
            fail(
                ErrorCode.INVALID_PROVIDER_ENVELOPE,
                "the stream ended inside a function call whose arguments were still arriving"
                " (willContinue)",
            )
