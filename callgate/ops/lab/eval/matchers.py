"""Argument matchers: does a value the model proposed meet what a fixture expects? Pure.

A matcher is one of ``{exact: V}``, ``{one_of: [V, ...]}``, ``{range: {min, max}}`` (numbers,
either bound optional, both inclusive), ``{regex: PATTERN}`` (the whole string) or
``{any: true}`` (present, whatever its value); ``{optional: MATCHER}`` may be left out, and
must match when given. A bare value is ``exact``. Numbers compare by value (``3`` matches
``3.0``), never a bool for a number. These are the checks BFCL's possible answers need.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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


class Optional(_Strict):
    optional: Exact | OneOf | Range | Regex | AnyValue


Matcher = Exact | OneOf | Range | Regex | AnyValue | Optional


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
        matches(m, actual[name]) if name in actual else isinstance(m, Optional)
        for name, m in expected.items()
    )
