"""A BFCL multi-turn result file read into calls by BFCL's own decoders, and guarded before
any of it reaches BFCL's ``eval``. Pure: the decoders are passed in (``backend.decoders``).

A result line is ``{"id", "result"}`` where ``result`` holds, per turn, the model's steps.
BFCL's evaluation (``_evaluate_single_multi_turn_entry``) decodes each step with the model's
handler, ``convert_to_function_call`` for a function-calling model and
``default_decode_execute_prompting`` for a prompting one; a step whose decode raises, or
decodes to nothing, is skipped. ``decode_result`` is that loop. The decoded form is BFCL's:
each call a Python call string, the input of its ``multi_turn_checker``.

A results file is untrusted input (it comes from a model, or from a colleague), and BFCL's
executor runs each call string with ``eval``. ``guard`` therefore lets a call through only
when it is a call of a public method of the entry's involved classes (the names BFCL itself
binds to their instances), named after NFKC normalization (Python's parser applies it, so
``ｅｘｉｔ`` is ``exit``), with literal arguments; the string that goes on
is rebuilt from the parsed literals and checked again. Anything else becomes ``REFUSED``, a
call BFCL's executor answers with its own "not allowed" error before its ``eval``: the step
keeps its place (BFCL would have executed something there), and nothing the model wrote runs.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

Decoded = list[list[list[str]]]  # turn → step → call strings
Style = Literal["fc", "prompt"]
STYLES: tuple[Style, ...] = ("fc", "prompt")
# BFCL's executor checks a call's function name against its deny list (kill, exit, quit,
# ...) and raises before ``eval``: this string never reaches it. ``backend.use`` checks
# that the installed BFCL still answers it so.
REFUSED = "kill()"
REFUSED_RESPONSE = "Error during execution: Function call kill is not allowed."
_MAX_CALL_CHARS = 100_000


class NotCalls(ValueError):
    """A call string that may not reach BFCL's execution."""


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]
    positional: tuple[Any, ...] = ()  # BFCL's decoders write none; its ground truth does

    def written(self) -> str:
        shown = [repr(v) for v in self.positional]
        shown += [f"{k}={v!r}" for k, v in self.arguments.items()]
        return f"{self.name}({', '.join(shown)})"


@dataclass(frozen=True)
class Refusal:
    turn: int
    step: int
    index: int
    text: str
    reason: str


@dataclass(frozen=True)
class Decoders:
    """BFCL's ``decode_execute`` of each model style, and its empty-response test."""

    fc: Callable[[Any], list[str]]
    prompt: Callable[[Any], list[str]]
    is_empty: Callable[[list[str]], bool]

    def of(self, style: Style) -> Callable[[Any], list[str]]:
        return self.fc if style == "fc" else self.prompt


def decode_result(result: Any, decode: Callable[[Any], list[str]], decoders: Decoders) -> Decoded:
    """Every turn's decodable steps, as BFCL's evaluation loop keeps them; ``ValueError``
    when ``result`` is not a list of turns, each a list of steps (BFCL: ``inference_error``)."""
    if not isinstance(result, list):
        raise ValueError("the result is not a list of turns")
    decoded: Decoded = []
    for turn in result:
        if not isinstance(turn, list | str | dict):
            # BFCL iterates a turn as Python does, and stops with a TypeError on anything
            # else; here that entry is invalid.
            raise ValueError(f"a turn is a {type(turn).__name__}, not a list of steps")
        steps = []
        for step in turn:
            try:
                calls = decode(step)
            except Exception:  # BFCL skips a step whose decode raises, whatever it raises
                continue
            if not isinstance(calls, list) or decoders.is_empty(calls):
                continue
            steps.append([str(c) for c in calls])
        decoded.append(steps)
    return decoded


# The shape of a file's steps, to tell its model style -------------------------------------


@dataclass(frozen=True)
class Shapes:
    """How many steps of a file are function-calling answers (a list of ``{name: args}``),
    and how many are text that BFCL's prompting decoder reads as calls."""

    fc: int
    prompt: int

    @property
    def mixed(self) -> bool:
        return self.fc > 0 and self.prompt > 0

    def style(self) -> Style:
        return "fc" if self.fc else "prompt"


def shapes(results: Iterable[Any], decoders: Decoders) -> Shapes:
    fc = prompt = 0
    for result in results:
        for turn in result if isinstance(result, list) else []:
            for step in turn if isinstance(turn, list) else []:
                if isinstance(step, dict) or (
                    isinstance(step, list) and step and all(isinstance(c, dict) for c in step)
                ):
                    fc += 1
                elif isinstance(step, str) and _decodes(decoders.prompt, step, decoders):
                    prompt += 1
    return Shapes(fc, prompt)


def _decodes(decode: Callable[[Any], list[str]], step: Any, decoders: Decoders) -> bool:
    try:
        calls = decode(step)
    except Exception:  # BFCL's decoders raise anything on text that is no call
        return False
    return isinstance(calls, list) and not decoders.is_empty(calls)


# The guard before BFCL's eval -------------------------------------------------------------


def guard(decoded: Decoded, methods: frozenset[str]) -> tuple[Decoded, list[Refusal]]:
    """``decoded`` with every call that is not a literal call of one of ``methods`` replaced
    by ``REFUSED``, and what was refused, with why."""
    out: Decoded = []
    refused: list[Refusal] = []
    for t, turn in enumerate(decoded):
        steps = []
        for s, step in enumerate(turn):
            calls = []
            for i, text in enumerate(step):
                try:
                    calls.append(safe_call(text, methods))
                except NotCalls as exc:
                    calls.append(REFUSED)
                    refused.append(Refusal(t, s, i, text[:200], str(exc)))
            steps.append(calls)
        out.append(steps)
    return out, refused


def safe_call(text: str, methods: frozenset[str]) -> str:
    """``text`` rebuilt as ``method(literal, ..., k=literal, ...)``; ``NotCalls`` unless it is
    a call of one of ``methods`` (after NFKC) with literal arguments only."""
    call = parse_call(text)
    if call.name not in methods:
        raise NotCalls(f"{call.name!r} is not a method of the entry's classes (never run)")
    rebuilt = call.written()
    # repr() of a literal is a literal, but for values such as inf and nan: parsed again.
    try:
        same = parse_call(rebuilt) == call
    except NotCalls:
        same = False
    if not same:
        raise NotCalls(f"{call.name}: an argument does not survive being written back")
    return rebuilt


def parse_call(text: str) -> Call:
    """``name(literal, ..., k=literal, ...)``: the name (NFKC, as Python reads it) and the
    literal arguments. ``NotCalls`` for anything else: an expression, an attribute, ``*`` or
    ``**``, a value that is not a literal."""
    if len(text) > _MAX_CALL_CHARS:
        raise NotCalls(f"a call of {len(text)} characters (at most {_MAX_CALL_CHARS})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an invalid escape only warns, as in BFCL's run
            node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise NotCalls(f"{text[:80]!r} is not a Python call") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise NotCalls(f"{text[:80]!r} is not a call of a function by name")
    name = node.func.id
    positional = []
    for argument in node.args:
        try:
            positional.append(ast.literal_eval(argument))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise NotCalls(f"{name}: a positional argument is not a literal (never run)") from None
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise NotCalls(f"{name}: **arguments are not taken")
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise NotCalls(f"{name}: {keyword.arg} is not a literal (never run)") from None
    return Call(name, arguments, tuple(positional))


def plain(value: Any) -> Any:
    """Tuples as lists: the arguments travel as JSON."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
