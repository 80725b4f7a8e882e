"""Hypothesis strategies for hostile submit input, shared by the library and CLI properties.

A submission starts valid and has zero to three places replaced by something hostile:
arbitrary JSON values (NaN, infinities, big integers, sets of odd keys), strings with NUL,
control characters, lone surrogates, only spaces or hundreds of kilobytes, nestings around
and past the depth cap, an operation id shared by two calls. So both outcomes, a stored turn
and a coded refusal, are drawn often.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

TOOLS = ["get_news", "get_weather", "refund_payment", "send_email", "no_such_tool"]
CONTEXT = {
    "request_id": "req-p",
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "roles": ["support"],
}

# Text PostgreSQL can hold (no NUL, no lone surrogate), and text that may hold anything.
safe_text = st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=12)
chars = st.characters(exclude_categories=())  # NUL, controls and surrogates included
texts = st.one_of(
    st.text(chars, max_size=12),
    st.sampled_from(["", " ", "   ", "\t", "\x00", "a\ud800", "\u202e", "c-1", "NaN", "O-17"]),
    st.builds(
        lambda c, n: c * n, st.sampled_from(["x", "é", " "]), st.sampled_from([201, 300_000])
    ),
)


def _json(leaves: st.SearchStrategy[Any], keys: st.SearchStrategy[str]) -> Any:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
        max_leaves=8,
    )


safe_values = _json(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | safe_text,
    safe_text,
)
hostile_values = _json(st.none() | st.booleans() | st.integers() | st.floats() | texts, texts)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


# Nesting around the cap (64), as text (parsed by submit) and as values (walked by submit).
# Python's own json gives up near 1,000 levels: deeper cases are written out in the tests.
deep_text = st.integers(min_value=55, max_value=1200).map(lambda n: "[" * n + "1" + "]" * n)
deep_values = st.integers(min_value=55, max_value=400).map(_nested)

safe_arguments = st.dictionaries(safe_text, safe_values, max_size=3) | st.dictionaries(
    safe_text, safe_values, max_size=3
).map(json.dumps)
hostile_arguments = st.one_of(
    st.dictionaries(texts, hostile_values | deep_values, max_size=3),
    hostile_values.map(json.dumps),  # string form; NaN and Infinity written as such
    texts,
    deep_text,
    st.dictionaries(safe_text, deep_values, min_size=1, max_size=1).map(json.dumps),
)

PLACES = [
    "call_id",
    "tool_name",
    "arguments",
    "extra_key",
    "request_id",
    "tenant_id",
    "user_id",
    "role",
    "roles",
    "conversation_id",
    "operation_id",
    "shared_operation_id",
    "many_calls",
]


@st.composite
def submissions(
    draw: st.DrawFn, min_places: int = 0
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    """(proposals, context, operation ids): valid, then ``min_places`` to three places made
    hostile."""
    count = draw(st.integers(min_value=1, max_value=4))
    proposals = [
        {
            "call_id": f"c-{i}",
            "tool_name": draw(st.sampled_from(TOOLS)),
            "arguments": draw(safe_arguments),
        }
        for i in range(count)
    ]
    context: dict[str, Any] = dict(CONTEXT)
    operation_ids: dict[str, str] = {}
    for place in draw(st.lists(st.sampled_from(PLACES), min_size=min_places, max_size=3)):
        i = draw(st.integers(min_value=0, max_value=count - 1))
        target = proposals[i]
        if place in ("call_id", "tool_name"):
            target[place] = draw(texts)
        elif place == "arguments":
            target["arguments"] = draw(hostile_arguments)
        elif place == "extra_key":
            target[draw(texts)] = draw(hostile_values)
        elif place in ("request_id", "tenant_id", "user_id", "conversation_id"):
            context[place] = draw(texts)
        elif place == "role":
            context["roles"] = [*context["roles"], draw(texts)]
        elif place == "roles":
            context["roles"] = [f"r{n}" for n in range(draw(st.sampled_from([64, 65, 500])))]
        elif place == "operation_id":
            operation_ids[target["call_id"]] = draw(texts)
        elif place == "shared_operation_id" and count > 1:
            operation_ids.update({p["call_id"]: "op-shared" for p in proposals[:2]})
        elif place == "many_calls":
            proposals.extend(
                {"call_id": f"m-{n}", "tool_name": "get_news", "arguments": {}}
                for n in range(draw(st.sampled_from([100, 200])))
            )
    return proposals, context, operation_ids
