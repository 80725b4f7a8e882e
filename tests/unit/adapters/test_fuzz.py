"""Fuzz: mutated envelopes, streams and result sets never raise anything but AdapterError.

Each case copies a valid envelope (the worked examples', the recordings, built ones), applies one to
three random mutations (drop, retype, truncate, duplicate, swap, inject a loaded key or
value, replace with junk such as NaN, tuples, bytes, non-string keys, deep nesting), and
feeds it to the entry point. A reader either refuses with an ``AdapterError`` or returns
proposals that still hold the invariants. The quick run is part of the normal suite; the
100,000-case run is marked ``slow`` (``pytest -m slow``).
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from callgate.core.types import ProposedCall
from callgate.producer.adapters import (
    SURFACES,
    AdapterError,
    names,
    read_proposals,
    read_stream,
    write_results,
)
from callgate.producer.adapters.base import show

from . import test_streams as streams_fixtures
from .support import inbound, load

KNOWN = frozenset(
    {
        "get_weather",
        "get_stock",
        "get_news",
        "Query",
        "GetWeatherArgs",
        "get_stock_price",
        "billing.refund",
    }
)
PROPOSALS = [
    ProposedCall(
        call_id="call-weather",
        tool_name="get_weather",
        arguments={"city": "Seoul", "unit": "celsius"},
    ),
    ProposedCall(call_id="call-stock", tool_name="get_stock", arguments={"symbol": "ACME"}),
    ProposedCall(
        call_id="call-refund",
        tool_name="billing.refund",
        arguments={"order": "o-1", "amount": 12.5},
    ),
]

KEYS = [
    "outputs",
    "tool_calls",
    "function_call",
    "finish_reason",
    "stop_reason",
    "status",
    "error",
    "id",
    "call_id",
    "type",
    "index",
    "candidates",
    "choices",
    "steps",
    "content",
    "parts",
    "functionCall",
    "function_call",
    "args",
    "arguments",
    "input",
    "name",
    "partial_json",
    "custom",
    "thought",
    "finishReason",
    "message",
    "delta",
    "content_block",
    "response",
    "partialArgs",
    "execution",
    "willContinue",
    "jsonPath",
    "stringValue",
    "numberValue",
    "event_type",
    "chunk",
]
VALUES: list[object] = [
    "tool_calls",
    "tool_use",
    "requires_action",
    "custom",
    "function_call",
    "function",
    "custom_tool_call",
    "MALFORMED_FUNCTION_CALL",
    "STOP",
    "SAFETY",
    "failed",
    "incomplete",
    "completed",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "input_json_delta",
    "response.completed",
    "function_result",
    "chunk",
    "step.start",
    "step.delta",
    "step.stop",
    "arguments_delta",
    "interaction.completed",
    "$.city",
    "$.a[0]",
    True,
    "{",
    '{"a":',
    "[]",
    "null",
    '{"city": NaN}',
    "cg-",
    "cg-x-zz",
    "cg-billing-2erefund",
    "callgate-gemini-x-0",
    "get_weather",
    "",
    0,
    1,
    -1,
    10**20,
    True,
]


def _deep(depth: int, dict_form: bool) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": value} if dict_form else [value]
    return value


class _Fresh:
    """A JUNK entry built anew for each use: too deep for copy.deepcopy, and it must not be
    shared, or a mutation inside it would change it for every later case."""

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


# Values that defeat repr/str/json.dumps: an int past sys.get_int_max_str_digits() (4300
# digits) raises ValueError, nesting past the recursion limit RecursionError.
_HOSTILE: list[object] = [
    10**5000,
    -(10**5000),
    _Fresh(lambda: _deep(5_000, False)),
    _Fresh(lambda: _deep(5_000, True)),
]


JUNK: list[object] = [
    None,
    True,
    False,
    0,
    -1,
    2**70,
    1.5,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "x",
    "{",
    "[1,",
    "x" * 300,
    [],
    {},
    [None],
    {"": None},
    {1: "int key"},
    ("tuple",),
    b"bytes",
    bytearray(b"{}"),
    {"a"},
    object(),
    _deep(200, False),
    _deep(200, True),
    "NaN",
    -0.0,
    *_HOSTILE,
]


def _copy(value: object) -> object:
    # Within one case, what is too deep to copy is shared; a mutation inside it only makes
    # the case odder.
    try:
        return copy.deepcopy(value)
    except RecursionError:
        return value


def _junk(rng: random.Random) -> object:
    # A copy: later mutations may edit what was inserted, and JUNK is shared by every case.
    value = rng.choice(JUNK)
    return value.make() if isinstance(value, _Fresh) else copy.deepcopy(value)


def _slots(root: object) -> list[tuple[Any, Any]]:
    """Every (container, key) in the tree, so a mutation can land anywhere."""
    found: list[tuple[Any, Any]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                found.append((node, key))
                stack.append(child)
        elif isinstance(node, list):
            for index, child in enumerate(node):
                found.append((node, index))
                stack.append(child)
    return found


def _variant(rng: random.Random, value: object) -> object:
    if isinstance(value, str):
        return rng.choice(
            [
                value[: rng.randrange(len(value) + 1)],
                value + rng.choice(['"', "}", "x"]),
                value.upper(),
                "",
            ]
        )
    if isinstance(value, bool):
        return not value
    if isinstance(value, int) and value.bit_length() > 64:
        return rng.choice([-1, 0, -value])  # str() and float() would fail on it
    if isinstance(value, int | float):
        return rng.choice([-1, 0, value * 1000, str(value), float(value)])
    if isinstance(value, list):
        return rng.choice([[], value + value, value[::-1], [value]])
    if isinstance(value, dict):
        return rng.choice([{}, [value], dict(reversed(list(value.items())))])
    return _junk(rng)


def mutate(rng: random.Random, root: Any) -> Any:
    for _ in range(rng.randint(1, 3)):
        slots = _slots(root)
        if not slots or rng.random() < 0.01:
            return _junk(rng)
        parent, key = rng.choice(slots)
        op = rng.randrange(7)
        if op == 0:
            del parent[key]
        elif op == 1:
            parent[key] = _junk(rng)
        elif op == 2:
            parent[key] = _variant(rng, parent[key])
        elif op == 3 and isinstance(parent, list):
            parent.insert(rng.randrange(len(parent) + 1), _copy(parent[key]))
        elif op == 4 and isinstance(parent, dict):
            parent[rng.choice(KEYS)] = rng.choice(VALUES) if rng.random() < 0.5 else _junk(rng)
        elif op == 5:
            parent[key] = rng.choice(VALUES)
        elif isinstance(parent, list) and len(parent) > 1:
            i, j = rng.randrange(len(parent)), rng.randrange(len(parent))
            parent[i], parent[j] = parent[j], parent[i]
    return root


def _bases() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """(surface, JSON text) for envelopes, streams, and result sets."""
    envelopes: list[tuple[str, object]] = []
    for surface in SURFACES:
        envelopes.append((surface, inbound(surface, PROPOSALS)))
        envelopes.append((surface, inbound(surface, [])))
    for surface in ("gemini-generate-content", "gemini-interactions"):
        envelopes.append((surface, inbound(surface, PROPOSALS, with_ids=False)))
    envelopes.append(
        (
            "gemini-interactions",
            {
                "status": "requires_action",
                "outputs": [
                    {"type": "function_call", "id": "c1", "name": "get_weather", "arguments": {}}
                ],
            },
        )
    )
    envelopes += [("openai-chat", load(f"openai_chat_recorded_{n}.json")) for n in range(4)]
    for name in (
        "092be1de-d3f8-4c22-a4ea-a7ad54689836",
        "e075a6c2-de4d-4125-9709-f0e178058190",
        "32da0815-2270-4d29-87be-3b5b63ab42e2",
        "f59a9391-643b-422c-96dc-1f28bc7ea4d7",
    ):
        envelopes += [
            ("anthropic-messages", e["response_body"])
            for e in load(f"anthropic_cassette_{name}.json")
            if e["response_body"]
        ]

    streams: list[tuple[str, object]] = [
        ("openai-chat", load(f"openai_chat_stream_recorded_{n}.json")) for n in range(4)
    ]
    streams += [
        ("anthropic-messages", load("anthropic_stream_tool_use_response.json")),
        ("anthropic-messages", load("anthropic_stream_tool_use_invalid_json_response.json")),
        (
            "openai-responses",
            [{"type": "response.completed", "response": inbound("openai-responses", PROPOSALS)}],
        ),
        (
            "gemini-generate-content",
            [
                inbound("gemini-generate-content", PROPOSALS[:1]),
                inbound("gemini-generate-content", PROPOSALS[1:]),
            ],
        ),
        (
            "openai-chat",
            streams_fixtures.chat_helper_events(streams_fixtures.interleaved_chat_stream()),
        ),
        (
            "gemini-interactions",
            streams_fixtures.interaction_events(
                streams_fixtures.TEXT_STEP,
                streams_fixtures.call_step(1, streams_fixtures.WEATHER, '{"ci', 'ty": "Seoul"}'),
                streams_fixtures.call_step(2, streams_fixtures.STOCK),
            ),
        ),
        (
            "gemini-generate-content",
            streams_fixtures.streamed(
                [streams_fixtures.arg("$.city", True, stringValue="Se")],
                [streams_fixtures.arg("$.city", stringValue="oul")],
            ),
        ),
    ]
    ok = {"status": "succeeded", "data": {"t": 22}}
    retry = {
        "status": "failed_retryable",
        "error": {"code": "upstream_unavailable", "retry_after_ms": 500},
    }
    detail = {"code": "required", "path": "/amount"}
    terminal = {
        "status": "failed_terminal",
        "error": {"code": "invalid_arguments", "details": [detail]},
    }
    results = [
        {**body, "call_id": call.call_id, "tool_name": call.tool_name}
        for body, call in zip((ok, retry, terminal), PROPOSALS, strict=True)
    ]
    result_sets = [
        (surface, {"proposals": [p.model_dump() for p in PROPOSALS], "results": results})
        for surface in SURFACES
    ]
    return tuple(  # type: ignore[return-value]
        [(surface, json.dumps(value)) for surface, value in group]
        for group in (envelopes, streams, result_sets)
    )


def _canonical(surface: str, name: str) -> bool:
    wire = names.wire_name(surface, name, check_length=False)
    return names.tool_name(surface, wire) == name


def _check_proposals(surface: str, proposals: object) -> None:
    assert isinstance(proposals, list)
    assert all(isinstance(p, ProposedCall) for p in proposals)
    assert len({p.call_id for p in proposals}) == len(proposals)
    assert all(isinstance(p.arguments, dict) for p in proposals)
    # A known tool, or an invented one in its one canonical spelling (the gate refuses that
    # call alone): never a second spelling of some name.
    assert all(p.tool_name in KNOWN or _canonical(surface, p.tool_name) for p in proposals)
    json.dumps([p.arguments for p in proposals], allow_nan=False)  # arguments stay plain JSON


def run_fuzz(cases: int, seed: int) -> Counter[str]:
    """Feed ``cases`` mutated inputs; return how each ended (a code, or ``ok``)."""
    rng = random.Random(seed)
    envelopes, streams, result_sets = _bases()
    outcomes: Counter[str] = Counter()
    for case in range(cases):
        kind = rng.random()
        group = envelopes if kind < 0.6 else streams if kind < 0.85 else result_sets
        surface, text = rng.choice(group)
        value = mutate(rng, json.loads(text))
        if rng.random() < 0.02:
            surface = rng.choice([*SURFACES, "bogus"])
        try:
            if group is envelopes:
                _check_proposals(surface, read_proposals(surface, value, KNOWN))
            elif group is streams:
                _check_proposals(surface, read_stream(surface, value, KNOWN))
            else:
                parts = value if isinstance(value, dict) else {}
                proposals = parts.get("proposals", value)
                results = parts.get("results", [])
                envelope = write_results(
                    surface,
                    proposals if isinstance(proposals, list) else [proposals],
                    results if isinstance(results, list) else [results],
                )
                json.dumps(envelope, allow_nan=False)
            outcomes["ok"] += 1
        except AdapterError as exc:
            outcomes[str(exc.code)] += 1
        except Exception as exc:
            raise AssertionError(
                f"case {case} (seed {seed}, {surface}) escaped with {type(exc).__name__}: {exc}\n"
                f"input: {show(value, 2000)}"
            ) from exc
    return outcomes


def _assert_meaningful(outcomes: Counter[str], cases: int) -> None:
    assert sum(outcomes.values()) == cases
    assert outcomes["ok"] > cases // 20, outcomes  # mutations do not only break envelopes
    assert len(outcomes) >= 10, outcomes  # and they reach many distinct refusals


def test_quick_fuzz() -> None:
    _assert_meaningful(run_fuzz(2_000, seed=20260710), 2_000)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fuzz_100k() -> None:
    started = time.perf_counter()
    outcomes = run_fuzz(100_000, seed=4)
    _assert_meaningful(outcomes, 100_000)
    elapsed = time.perf_counter() - started
    print(f"\n100,000 fuzz cases in {elapsed:.1f}s: {dict(outcomes.most_common())}")
