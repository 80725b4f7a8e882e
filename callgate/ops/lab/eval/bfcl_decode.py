"""A model's BFCL result decoded the way BFCL's own evaluation decodes it. Pure; nothing runs.

BFCL (``bfcl-eval`` 2026.3.23, ``bfcl_eval/model_handler/utils.py``) decodes a prompting
model's answer with ``default_decode_ast_prompting``: strip backticks, newlines and spaces,
wrap it in ``[...]``, strip ``'``, ``ast.parse`` it, and resolve each call's keyword arguments
with ``resolve_ast_by_type``. Function-calling handlers (OpenAI, Claude, ...) read a list of
``{name: arguments}``, the arguments a JSON string. A result BFCL cannot decode counts as no
call: it fails an AST category and passes irrelevance, as in BFCL.

``resolve_ast_by_type`` evaluates arithmetic with ``eval``. Here nothing is ever run: the
same cases are walked on the syntax tree, and Python's own operators are applied only to
values already reduced to numbers, strings, bytes, ``None`` and containers of them (which run
no code of the model's), with bounds on sizes so ``9**9**9`` cannot exhaust the machine.

Function names follow the model's convention (``convert_func_name``): a function-calling
model whose BFCL config says ``underscore_to_dot`` (OpenAI, Claude and Gemini FC among them)
is shown, and must write, ``math_hypot`` for ``math.hypot``; any other model the name as
defined.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

Style = Literal["prompt", "fc", "fc-underscore"]
STYLES: tuple[Style, ...] = ("fc-underscore", "fc", "prompt")
# A model's call: the name as written, and its arguments as BFCL decoded them (Python values:
# tuples stay tuples, dict keys may be any hashable).
Call = tuple[str, dict[Any, Any]]
# The key of a decoded ``**kwargs`` argument: BFCL stores it under ``None``, which is never a
# parameter; JSON needs a string, and no BFCL function declares a parameter named so.
KWARGS = "**"
# A value BFCL decodes but JSON cannot carry faithfully (a tuple outside a tuple parameter, a
# set, bytes, a complex number, a dict keyed by non-strings, inf or NaN, text that is no
# UTF-8, an integer past Python's JSON limit) can never equal one
# of BFCL's acceptable values, which come from JSON; it is written as this marker object,
# which fails every check too (no BFCL answer has this key).
UNREPRESENTABLE = "__python__"

_MAX_ITEMS = 100_000  # a bound on a sequence an arithmetic answer may build
_MAX_BITS = 100_000  # a bound on the integers it may build


class Undecodable(Exception):
    """BFCL's decoder would raise: the answer is no call."""


def visible_name(name: str, style: Style) -> str:
    """The name a model of ``style`` is shown and must write (BFCL's ``convert_func_name``)."""
    if style == "fc-underscore" and "." in name:
        return re.sub(r"\.", "_", name)
    return name


def decode(result: Any, style: Style) -> list[Call] | None:
    """The calls of a BFCL ``result``; ``None`` when BFCL's decoder for ``style`` fails or
    decodes no call (``[]``), or the decoded output is not BFCL's calling format."""
    if style == "prompt":
        calls = decode_prompt(result) if isinstance(result, str) else None
    else:
        calls = decode_fc(result)
    return calls or None


def decode_fc(result: Any) -> list[Call] | None:
    """A function-calling handler's decode: ``[{name: "{json}"}]``; arguments already an
    object are taken too (some handlers store them so). The first key of an item is its
    call, as BFCL's handlers take it; arguments that are not an object are not BFCL's
    calling format (``is_function_calling_format_output``)."""
    if not isinstance(result, list):
        return None  # text: BFCL's FC decoder fails on it
    calls: list[Call] = []
    for item in result:
        if not isinstance(item, dict) or not item:
            return None
        name, args = next(iter(item.items()))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        calls.append((str(name), args))
    return calls


def decode_prompt(text: str) -> list[Call] | None:
    """A prompting model's answer, ``"[f(a=1), pkg.g(b='x')]"``, decoded as BFCL's
    ``default_decode_ast_prompting`` does; ``None`` where it raises."""
    body = text.strip("`\n ")
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    body = body.strip().strip("'")
    try:
        with warnings.catch_warnings():
            # An invalid escape ("\d") only warns, as in BFCL's run: never an error here,
            # whatever the process's warning filters say.
            warnings.simplefilter("ignore")
            tree = ast.parse(body, mode="eval").body
        if isinstance(tree, ast.Call):
            nodes: Sequence[ast.expr] = [tree]
        elif isinstance(tree, ast.List | ast.Tuple | ast.Set):
            nodes = tree.elts
        else:
            return None
        if not all(isinstance(n, ast.Call) for n in nodes):
            return None
        return [_call(n) for n in nodes if isinstance(n, ast.Call)]
    except (SyntaxError, ValueError, MemoryError, RecursionError, Undecodable):
        return None


def _call(node: ast.Call) -> Call:
    """BFCL's ``resolve_ast_call``: the dotted name (attributes down to a name) and the
    keyword arguments; positional arguments are ignored, as BFCL ignores them."""
    parts: list[str] = []
    func = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    args: dict[Any, Any] = {}
    for kw in node.keywords:
        args[KWARGS if kw.arg is None else kw.arg] = _value(kw.value)
    return ".".join(reversed(parts)), args


def _value(node: ast.expr | None) -> Any:
    """BFCL's ``resolve_ast_by_type``, case by case, in its order."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        # BFCL negates the operand's ``.value`` whatever the operator (``+5`` is -5,
        # ``not True`` is -1); only a constant's value is a number it can negate.
        if not isinstance(node.operand, ast.Constant):
            raise Undecodable("unary operator on a non-constant")
        return _apply(operator.neg, node.operand.value)
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values, strict=True):
            key = _value(k)  # ``**mapping`` has no key: BFCL fails on it
            try:
                out[key] = _value(v)
            except TypeError:
                raise Undecodable("unhashable key") from None
        return out
    if isinstance(node, ast.BinOp):
        return _evaluate(node)  # BFCL: eval(ast.unparse(node))
    if isinstance(node, ast.Name):
        return node.id  # a bare name is its own text
    if isinstance(node, ast.Call):
        if not node.keywords:
            return ast.unparse(node)  # ``f(x)`` as an argument is its own text
        name, args = _call(node)
        return {name: args}
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    # Lambda (BFCL's handling of it always raises), f-strings, sets, comparisons, attributes…
    raise Undecodable(f"unsupported {type(node).__name__}")


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
    ast.MatMult: operator.matmul,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
    ast.Not: operator.not_,
}


def arithmetic(source: str, *_: object) -> Any:
    """What ``eval(source)`` gives for an expression of literals and operators, without
    eval; ``Undecodable`` for anything else. It stands in for ``eval`` where BFCL's own
    decoder calls it on a model's arithmetic."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise Undecodable("not an expression") from None
    return _evaluate(tree.body)


def _evaluate(node: ast.expr) -> Any:
    """What ``eval`` gives for an expression of literals and operators, without eval. An
    operand eval would look up or run (a name, a call, an attribute, a subscript) is not
    evaluated: the answer is undecodable (for names other than builtins, as in BFCL)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        return _bounded(_BINARY[type(node.op)], left, right)
    if isinstance(node, ast.UnaryOp):
        return _apply(_UNARY[type(node.op)], _evaluate(node.operand))
    if isinstance(node, ast.List):
        return [_evaluate(v) for v in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_evaluate(v) for v in node.elts)
    if isinstance(node, ast.Set):
        return _apply(set, [_evaluate(v) for v in node.elts])
    if isinstance(node, ast.Dict):
        pairs = []
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:
                raise Undecodable("** in a dict is not evaluated")
            pairs.append((_evaluate(k), _evaluate(v)))
        return _apply(dict, pairs)
    raise Undecodable(f"not evaluated: {type(node).__name__}")


def _apply(op: Callable[..., Any], *args: Any) -> Any:
    try:
        return op(*args)
    except (TypeError, ValueError, ArithmeticError, MemoryError):
        raise Undecodable("the operation fails in Python") from None


def _bounded(op: Callable[[Any, Any], Any], left: Any, right: Any) -> Any:
    """``op(left, right)`` unless it would build something huge (BFCL's eval would try)."""
    ints = all(type(v) is int or type(v) is bool for v in (left, right))
    if (
        op is operator.pow
        and ints
        and right > 0
        and max(abs(int(left)), 1).bit_length() * right > _MAX_BITS
    ):
        raise Undecodable("too large")
    if op is operator.lshift and ints and right > _MAX_BITS:
        raise Undecodable("too large")
    if op is operator.mul:
        for seq, count in ((left, right), (right, left)):
            sized = isinstance(seq, str | bytes | list | tuple) and type(count) in (int, bool)
            if sized and len(seq) * max(int(count), 0) > _MAX_ITEMS:
                raise Undecodable("too large")
    if op is operator.mod and isinstance(left, str | bytes):
        # printf-style formatting can pad to any width: not evaluated.
        raise Undecodable("string formatting is not evaluated")
    return _apply(op, left, right)


# Decoded values as JSON -----------------------------------------------------------------


def to_json(value: Any, declared: str | None) -> Any:
    """A decoded argument as the JSON the recorded response carries. A tuple given for a
    ``tuple`` parameter is a list (BFCL converts it so); anything else JSON cannot carry
    becomes the ``UNREPRESENTABLE`` marker, which fails as BFCL's check fails on it."""
    if declared == "tuple" and type(value) is tuple:
        value = list(value)
    return value if _representable(value) else {UNREPRESENTABLE: _shown(value)}


def _representable(value: Any) -> bool:
    if value is None or type(value) is bool:
        return True
    if type(value) is str:
        return _text(value)
    if type(value) is int:  # past this, Python's own JSON refuses to write it
        return bool(value.bit_length() < 13_000)
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return all(_representable(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _text(k) and _representable(v) for k, v in value.items())
    return False


def _text(value: str) -> bool:
    """Text JSON can carry: a lone surrogate (U+D800 alone) cannot be written as UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(value: Any) -> str:
    try:
        return repr(value)[:200]
    except (ValueError, RecursionError):  # an int past Python's str conversion limit
        return type(value).__name__


def arguments_json(args: Mapping[Any, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """Every argument as JSON; ``declared`` the function's ``properties`` (for tuples)."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        doc = declared.get(key) if isinstance(key, str) else None
        kind = doc.get("type") if isinstance(doc, Mapping) else None
        out[str(key) if isinstance(key, str) else KWARGS] = to_json(
            value, kind if isinstance(kind, str) else None
        )
    return out


# Java and JavaScript values ---------------------------------------------------------------
# BFCL's Java and JavaScript functions take every argument as a string of source text
# ("50L", "new int[]{1, 2}", "{'k': 1}"). Its checker converts that string with
# ``java_type_converter`` / ``js_type_converter`` (bfcl_eval/eval_checker/ast_eval/
# type_convertor) and then checks the converted value as it checks a Python one. The
# converters below are BFCL's, rule for rule, quirks included: text that does not fit a type's
# pattern stays a string, an array of Java Strings keeps its quotes, a Java ``char`` is never
# converted. Nothing is evaluated: they are regular expressions and ``int``/``float``.

Language = Literal["python", "java", "javascript"]
# BFCL's type tables (bfcl_eval/constants/type_mappings.py): the Python class a converted
# value must have.
JAVA_TYPES: dict[str, type] = {
    "byte": int,
    "short": int,
    "integer": int,
    "float": float,
    "double": float,
    "long": int,
    "boolean": bool,
    "char": str,
    "Array": list,
    "ArrayList": list,
    "Set": set,
    "HashMap": dict,
    "Hashtable": dict,
    "Queue": list,
    "Stack": list,
    "String": str,
    "any": str,
}
JS_TYPES: dict[str, type] = {
    "String": str,
    "integer": int,
    "float": float,
    "Bigint": int,
    "Boolean": bool,
    "dict": dict,
    "array": list,
    "any": str,
}
# The types whose items BFCL converts and checks one level deep.
NESTED_TYPES = ("Array", "ArrayList", "array")
# Java types BFCL's converter raises on (NotImplementedError): its checker crashes on them.
_JAVA_UNCONVERTED = ("Set", "Hashtable", "Queue", "Stack")


class Unconvertible(Exception):
    """BFCL's converter raises on this value: its checker crashes, no verdict."""


def convert(language: Language, text: str, kind: str, items: str | None = None) -> Any:
    """A Java or JavaScript argument's text as BFCL's checker converts it for type ``kind``
    (``items``: the declared item type of an array); ``Unconvertible`` where BFCL raises."""
    try:
        if language == "java":
            return java_value(text, kind, items)
        return js_value(text, kind, items)
    except (ValueError, NotImplementedError, RecursionError, IndexError) as exc:
        raise Unconvertible(str(exc)) from None


def java_value(value: str, kind: str, items: str | None = None) -> Any:
    """BFCL's ``java_type_converter``."""
    if kind not in JAVA_TYPES or kind in _JAVA_UNCONVERTED:
        raise ValueError(f"BFCL does not convert Java {kind}")
    if kind in ("byte", "short", "integer"):
        return int(value) if re.match(r"^-?\d+$", value) else str(value)
    if kind == "float":
        if not re.match(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$", value):
            return str(value)
        return float(re.sub(r"[fF]$", "", value))
    if kind == "double":
        if not re.match(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?$", value):
            return str(value)
        return float(value)
    if kind == "long":
        return int(re.sub(r"[lL]$", "", value)) if re.match(r"^-?\d+[lL]$", value) else str(value)
    if kind == "boolean":
        return value == "true" if value in ("true", "false") else str(value)
    if kind == "ArrayList":
        return _java_arraylist(value, items)
    if kind == "Array":
        return _java_array(value, items)
    if kind == "HashMap":
        return _java_hashmap(value)
    # String, any, and char (BFCL's char pattern, ^'.$', can never match: it stays text).
    return str(value)


def _java_element(text: str, items: str | None) -> Any:
    if items in ("char", "String"):
        return text[1:-1]  # BFCL drops the quotes whatever they are
    return java_value(text, items) if items else _java_literal(text)


def _java_arraylist(text: str, items: str | None) -> Any:
    listed = re.search(r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)", text)
    if listed:
        return [_java_element(e.strip(), items) for e in listed.group(1).split(",")]
    added = re.search(r"new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}", text, re.DOTALL)
    if added:
        return [
            _java_element(m.strip(), items) for m in re.findall(r"add\((.+?)\)", added.group(1))
        ]
    if re.search(r"new\s+ArrayList<\w*>\(\)", text):
        return []
    return text


def _java_array(text: str, items: str | None) -> Any:
    found = re.search(r"new\s+\w+\[\]\s*\{(.*?)\}", text)
    if not found:
        return text
    parts = [x.strip() for x in found.group(1).split(",") if x.strip()]
    # Unlike an ArrayList's, an array's String items keep their quotes (BFCL's converter).
    return [java_value(x, items) if items else _java_literal(x) for x in parts]


def _java_hashmap(text: str) -> Any:
    found = re.search(r"new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}", text, re.DOTALL)
    if found:
        pairs = re.findall(r"put\(\"(.*?)\",\s*(.*?)\)", found.group(1))
        return {key: _java_literal(raw.strip()) for key, raw in pairs}
    if re.search(r"new\s+HashMap<.*?>\s*\(\)", text):
        return {}
    return text


def _java_literal(text: str) -> Any:
    """BFCL's ``parse_java_value``: a literal read without its declared type."""
    if text in ("true", "false"):
        return text == "true"
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    if re.match(r"^-?\d+[lL]$", text):
        return int(text[:-1])
    if re.match(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$", text):
        return float(re.sub(r"[fF]$", "", text))
    return _number_or_text(text)


def _number_or_text(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def js_value(value: str, kind: str, items: str | None = None) -> Any:
    """BFCL's ``js_type_converter``."""
    if kind not in JS_TYPES:
        raise ValueError(f"BFCL does not convert JavaScript {kind}")
    if kind == "String":
        quoted = (value.startswith('"') and value.endswith('"')) or (
            value.startswith("'") and value.endswith("'")
        )
        return value[1:-1] if quoted else str(value)
    if kind == "integer":
        return int(value) if re.match(r"^-?\d+$", value) else str(value)
    if kind == "float":
        return float(value) if re.match(r"^-?\d+(\.\d+)?$", value) else str(value)
    if kind == "Bigint":
        return int(value[:-1]) if re.match(r"^-?\d+n$", value) else str(value)
    if kind == "Boolean":
        return value == "true" if value in ("true", "false") else str(value)
    if kind == "dict":
        return _js_object(value.strip())
    if kind == "array":
        return _js_array(value.strip(), items)
    return str(value)  # any


def _js_array(code: str, items: str | None) -> Any:
    two_d = r"\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\)"
    try:
        nested = re.match(two_d, code)
        if nested:
            rows = []
            for i, row in enumerate(re.findall(r"\[(.*?)\]", nested.group(0))):
                row = row.strip()
                if i == 0 and row.startswith("["):
                    row = row[1:]
                rows.append([_js_literal(e.strip()) for e in row.split(",")])
            return rows
        flat = re.match(r"\[(.*?)\]|\bnew\s+Array\((.*?)\)", code)
        if not flat:
            return code
        inside = flat.group(1) if flat.group(1) is not None else flat.group(2)
        inside = (inside or "").strip()
        elements = inside.split(",") if inside else []
        if items:
            return [js_value(e.strip(), items, _quoted_items(e.strip())) for e in elements]
        return [_js_literal(e.strip()) for e in elements]
    except Exception:  # BFCL's converter returns the text on any failure here
        return code


def _quoted_items(element: str) -> str | None:
    """BFCL converts a quoted item of an array of arrays as an array of Strings."""
    return "String" if element.startswith(("'", '"')) else None


def _js_object(code: str) -> Any:
    if code == "{}":
        return {}
    found = re.match(r"\{(.*?)\}", code)
    if not found:
        return code
    try:
        out: dict[str, Any] = {}
        pairs = re.findall(r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)", found.group(1))
        for key, raw in pairs:
            key, raw = key.strip().strip("'\""), raw.strip()
            if raw.startswith("[") and raw.endswith("]"):
                out[key] = _js_array(raw, None)
            elif raw.startswith("{") and raw.endswith("}"):
                out[key] = _js_object(raw)
            else:
                out[key] = _js_literal(raw.strip("'\""))
        return out
    except Exception:  # BFCL's converter returns the text on any failure here
        return code


def _js_literal(text: str) -> Any:
    """BFCL's ``parse_js_value``."""
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    quoted = (text.startswith('"') and text.endswith('"')) or (
        text.startswith("'") and text.endswith("'")
    )
    return text[1:-1] if quoted else _number_or_text(text)
