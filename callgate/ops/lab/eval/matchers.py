"""Argument matchers: does a value the model proposed meet what a fixture expects? Pure.

A matcher is one of ``{exact: V}``, ``{one_of: [V, ...]}``, ``{range: {min, max}}`` (numbers,
either bound optional, both inclusive), ``{regex: PATTERN}`` (the whole string) or
``{any: true}`` (present, whatever its value); ``{optional: MATCHER}`` may be left out, and
must match when given. A bare value is ``exact``. Numbers compare by value (``3`` matches
``3.0``), never a bool for a number.

``{bfcl: {type, items, values, required, declared, language}}`` checks a value the way
BFCL's AST checker does (``bfcl_matches``; docs/eval.md cites the source): ``values`` is BFCL's
list of acceptable values for one parameter, ``""`` among them meaning it may be left out
(unless ``required``); a Java or JavaScript argument is source text, converted first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from callgate.ops.lab.eval.bfcl_decode import (
    JAVA_TYPES,
    JS_TYPES,
    NESTED_TYPES,
    Language,
    Unconvertible,
    convert,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Exact(_Strict):
    exact: Any


class OneOf(_Strict):
    one_of: Annotated[list[Any], Field(min_length=1)]


class Bounds(_Strict):
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Bounds:
        if self.min is None and self.max is None:
            raise ValueError("a range needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("range min is above its max")
        return self


class Range(_Strict):
    range: Bounds


class Regex(_Strict):
    regex: str

    @model_validator(mode="after")
    def _compiles(self) -> Regex:
        try:
            re.compile(self.regex)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return self


class AnyValue(_Strict):
    any: Literal[True]


# BFCL's parameter types, as its checker reads them in Python ("any" is checked as a string).
BFCL_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
TYPES_BY_LANGUAGE: dict[str, dict[str, type]] = {
    "python": BFCL_TYPES,
    "java": JAVA_TYPES,
    "javascript": JS_TYPES,
}


class BfclSpec(_Strict):
    # A type of the function's language: BFCL_TYPES for Python, bfcl_decode.JAVA_TYPES or
    # JS_TYPES for Java and JavaScript, whose arguments are strings of source text that BFCL
    # converts (bfcl_decode.convert) before checking them as Python values.
    type: str
    items: str | None = None
    values: list[Any]
    required: bool = False  # the function declares it required: never left out
    # False: the function's definition lacks the parameter, so any value given fails (BFCL's
    # "unexpected parameter"); it may still be left out when "" is among the values.
    declared: bool = True
    language: Language = "python"

    @model_validator(mode="after")
    def _known_types(self) -> BfclSpec:
        table = TYPES_BY_LANGUAGE[self.language]
        for kind in (self.type, self.items):
            if kind is not None and kind not in table:
                raise ValueError(f"{kind!r} is not one of BFCL's {self.language} types")
        return self


class Bfcl(_Strict):
    bfcl: BfclSpec


class Optional(_Strict):
    optional: Exact | OneOf | Range | Regex | AnyValue | Bfcl


Matcher = Exact | OneOf | Range | Regex | AnyValue | Bfcl | Optional


def parse(raw: Any) -> Matcher:
    """A matcher from its YAML form; a bare value (or a mapping with other keys) is exact."""
    if isinstance(raw, Mapping) and len(raw) == 1:
        key = next(iter(raw))
        kinds: dict[str, type[Matcher]] = {
            "exact": Exact,
            "one_of": OneOf,
            "range": Range,
            "regex": Regex,
            "any": AnyValue,
            "bfcl": Bfcl,
            "optional": Optional,
        }
        if key == "optional":
            return Optional(optional=parse(raw[key]))  # type: ignore[arg-type]
        if key in kinds:
            return kinds[key].model_validate(raw)
    return Exact(exact=raw)


def same(expected: Any, actual: Any) -> bool:
    """JSON equality: numbers by value, a bool never equal to a number."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        return float(expected) == float(actual)
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return expected.keys() == actual.keys() and all(
            same(expected[k], actual[k]) for k in expected
        )
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(
            same(e, a) for e, a in zip(expected, actual, strict=True)
        )
    return type(expected) is type(actual) and bool(expected == actual)


def matches(matcher: Matcher, value: Any) -> bool:
    if isinstance(matcher, AnyValue):
        return True
    if isinstance(matcher, Optional):
        return matches(matcher.optional, value)
    if isinstance(matcher, Exact):
        return same(matcher.exact, value)
    if isinstance(matcher, OneOf):
        return any(same(option, value) for option in matcher.one_of)
    if isinstance(matcher, Bfcl):
        return bfcl_matches(matcher.bfcl, value)
    if isinstance(matcher, Range):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        low, high = matcher.range.min, matcher.range.max
        return (low is None or value >= low) and (high is None or value <= high)
    return isinstance(value, str) and re.fullmatch(matcher.regex, value) is not None


def arguments_match(expected: Mapping[str, Matcher], actual: Mapping[str, Any]) -> bool:
    """Every expected argument matches; none is given that the fixture does not name (as
    BFCL's checker says); only an ``optional`` one may be left out."""
    if set(actual) - set(expected):
        return False
    return all(
        matches(m, actual[name]) if name in actual else omittable(m) for name, m in expected.items()
    )


def omittable(matcher: Matcher) -> bool:
    if isinstance(matcher, Bfcl):
        return "" in matcher.bfcl.values and not matcher.bfcl.required
    return isinstance(matcher, Optional)


# BFCL's rules -----------------------------------------------------------------------------
# As bfcl_eval/eval_checker/ast_eval/ast_checker.py (ShishirPatil/gorilla) checks a Python
# function's parameter: a type check (an int passes for a float; a value of the answers' own
# type is a "variable" and skips the value check), then strings normalised, lists compared
# element by element, dicts key by key, and anything else by equality with one of the values.

_STANDARD = re.compile(r"[ ,./\-_*^]")


def standardize(text: str) -> str:
    """BFCL's string normalisation: no spaces nor ``,./-_*^``, lower case, ``'`` as ``"``
    ("April 1, 2024" = "april 1 2024")."""
    return _STANDARD.sub("", text).lower().replace("'", '"')


def bfcl_matches(spec: BfclSpec, value: Any) -> bool:
    if not spec.declared:
        return False
    if spec.language != "python":
        return _source_text_matches(spec, value)
    kind = BFCL_TYPES[spec.type]
    nested = BFCL_TYPES[spec.items] if spec.items else None
    if spec.type == "float" and type(value) is int:
        value = float(value)  # Python's own int → float, as BFCL allows
    return _typed_value_matches(value, kind, nested, spec.values)


def _source_text_matches(spec: BfclSpec, value: Any) -> bool:
    """A Java or JavaScript argument: a string of source text, converted as BFCL converts
    it, then checked as a Python value of the type's class (no int → float here)."""
    if type(value) is not str:
        return False
    table = TYPES_BY_LANGUAGE[spec.language]
    items = spec.items if spec.type in NESTED_TYPES else None
    try:
        converted = convert(spec.language, value, spec.type, items)
    except Unconvertible:
        return False  # BFCL's checker crashes on it: never a pass
    nested = table[items] if items else None
    return _typed_value_matches(converted, table[spec.type], nested, spec.values)


def _typed_value_matches(value: Any, kind: type, nested: type | None, values: list[Any]) -> bool:
    answer_type = _answer_type(values)
    variable = answer_type is not None and answer_type is not kind
    if type(value) is kind:
        if isinstance(value, list) and nested and not _nested_types(value, values, nested):
            return False
    elif answer_type is not None and type(value) is answer_type:
        variable = True
    else:
        return False
    if not variable:  # the value has the declared type
        if isinstance(value, dict):
            return _dict_ok(value, values)
        if isinstance(value, list) and nested is dict:
            return _list_of_dicts_ok(value, values)
        if isinstance(value, str):
            return standardize(value) in [standardize(v) for v in values if type(v) is str]
        if isinstance(value, list):
            return _standard_list(value) in [
                _standard_list(v) for v in values if isinstance(v, list | str)
            ]
    return any(value == v for v in values)


def _answer_type(values: list[Any]) -> type | None:
    return next((type(v) for v in values if v != ""), None)


def _nested_types(value: list[Any], values: list[Any], nested: type) -> bool:
    """BFCL checks one level of item types: against some acceptable list whose items have
    that type (or the acceptable list's own item type); a non-list acceptable value passes."""
    for option in values:
        if not isinstance(option, list):
            return True
        own = _answer_type(option)
        if all(type(item) is nested or type(item) is own for item in value):
            return True
    return False


def _standard_list(items: list[Any] | str) -> list[Any]:
    return [standardize(v) if type(v) is str else v for v in items]


def _dict_ok(value: Mapping[str, Any], options: list[Any]) -> bool:
    for option in options:
        if option == "" or not isinstance(option, Mapping):
            continue
        if _one_dict_ok(value, option):
            return True
    return False


def _one_dict_ok(value: Mapping[str, Any], option: Mapping[str, Any]) -> bool:
    for key, given in value.items():
        if key not in option or not isinstance(option[key], list):
            return False
        given = standardize(given) if type(given) is str else given
        if given not in [standardize(v) if type(v) is str else v for v in option[key]]:
            return False
    return all(key in value or "" in allowed for key, allowed in option.items())


def _list_of_dicts_ok(value: list[Any], options: list[Any]) -> bool:
    for option in options:
        if not isinstance(option, list | str) or len(option) != len(value):
            continue
        if all(
            isinstance(v, Mapping) and isinstance(o, Mapping) and _one_dict_ok(v, o)
            for v, o in zip(value, option, strict=True)
        ):
            return True
    return False
