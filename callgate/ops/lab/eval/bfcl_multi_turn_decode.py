"""A BFCL multi-turn result file read into calls, as BFCL's evaluation decodes it. Pure.

A result line is ``{"id", "result"}`` where ``result`` holds, per turn, the model's steps.
A step is either a function-calling answer, a list of ``{name: arguments}`` (arguments a
JSON string or an object), decoded as BFCL's ``convert_to_function_call`` does, or text
holding a Python list of calls (prompting models). Steps that decode to no call (the model's
prose at the end of a turn) are skipped, as BFCL's evaluation skips them. The decoded form is
BFCL's: each call a Python call string, the input of its ``multi_turn_checker``.

BFCL's checker runs those strings with ``eval``. A model's text is never run: a call reaches
it only as a function named by an identifier with literal arguments (``ast.literal_eval``
accepts each), written back from the parsed literals; anything else (an expression, an
attribute, ``**``) makes the step no call, with the reason. BFCL itself would evaluate
arithmetic in an argument (``x=2+3``); here such a step is skipped instead.

``parse_call`` turns one call string back into a name and literal arguments, which is what
callgate is proposed; positional arguments are bound to names by the method's signature.
"""

from __future__ import annotations

import ast
import inspect
import json
import keyword
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Decoded = list[list[list[str]]]  # turn → step → call strings


class NotCalls(ValueError):
    """A step that holds no call BFCL would execute."""


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


def decode_result(result: Any) -> Decoded:
    """Every turn's decodable steps; raises ``ValueError`` when ``result`` is not a list of
    turns, each a list of steps (BFCL's ``inference_error``)."""
    if not isinstance(result, list) or not all(isinstance(t, list) for t in result):
        raise ValueError("the result is not a list of turns, each a list of steps")
    decoded: Decoded = []
    for turn in result:
        steps = []
        for step in turn:
            try:
                calls = decode_step(step)
            except NotCalls:
                continue
            if calls and calls != [""]:
                steps.append(calls)
        decoded.append(steps)
    return decoded


def decode_step(step: Any) -> list[str]:
    if isinstance(step, str):
        return _prompted(step)
    if isinstance(step, dict):
        step = [step]
    if not isinstance(step, list) or not all(isinstance(c, dict) for c in step):
        raise NotCalls("neither text nor a list of function calls")
    out = []
    for invoked in step:
        for name, value in invoked.items():
            try:
                arguments = json.loads(value) if isinstance(value, str) else value
            except json.JSONDecodeError:
                raise NotCalls(f"{name}: arguments are not JSON") from None
            if not isinstance(arguments, dict):
                raise NotCalls(f"{name}: arguments are not an object")
            if not _identifier(name) or not all(
                isinstance(k, str) and _identifier(k) for k in arguments
            ):
                raise NotCalls(f"{name!r}: a function or argument name is not an identifier")
            # JSON values written with repr() are Python literals, nothing else.
            out.append(f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})")
    return out


def _prompted(text: str) -> list[str]:
    """A Python list of calls (brackets optional, code fences stripped), each kept as
    written: ``name(args)``."""
    body = text.strip("`\n ")
    if body.startswith("python"):
        body = body.removeprefix("python").strip()
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        raise NotCalls("not a Python list of calls") from None
    if not isinstance(tree, ast.List) or not all(
        isinstance(e, ast.Call) and isinstance(e.func, ast.Name) for e in tree.elts
    ):
        raise NotCalls("not a Python list of calls")
    return [_literal_call(e) for e in tree.elts if isinstance(e, ast.Call)]


def _literal_call(call: ast.Call) -> str:
    """``call`` written back from its literal arguments; ``NotCalls`` when one is not a
    literal (it would be run by BFCL's ``eval``)."""
    assert isinstance(call.func, ast.Name)
    try:
        positional = [ast.literal_eval(a) for a in call.args]
        named = [(k.arg, ast.literal_eval(k.value)) for k in call.keywords]
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise NotCalls(f"{call.func.id}: an argument is not a literal (never run)") from None
    if any(name is None for name, _ in named):
        raise NotCalls(f"{call.func.id}: **arguments are not taken")
    written = [repr(v) for v in positional] + [f"{k}={v!r}" for k, v in named]
    return f"{call.func.id}({', '.join(written)})"


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def parse_call(text: str, signature: Callable[[str], inspect.Signature | None]) -> Call:
    """``name(args)`` with literal arguments; positional ones named by ``signature(name)``.
    Raises ``ValueError`` for anything else (an expression, an unknown positional)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"{text!r} is not a Python call") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{text!r} is not a call of a function by name")
    name = node.func.id
    try:
        positional = [ast.literal_eval(a) for a in node.args]
        named = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except ValueError:
        raise ValueError(f"{text!r}: an argument is not a literal") from None
    if len(named) != len(node.keywords):
        raise ValueError(f"{text!r}: **arguments are not taken")
    if positional:
        found = signature(name)
        if found is None:
            raise ValueError(f"{text!r}: positional arguments of an unknown function")
        try:
            bound = found.bind_partial(*positional, **named)
        except TypeError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        named = dict(bound.arguments)
    return Call(name, _plain(named))


def _plain(value: Any) -> Any:
    """Tuples as lists: the arguments travel as JSON."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
