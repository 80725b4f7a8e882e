"""Property tests: proposals survive a trip through every surface's envelope, and results
keep their own id and status in any order or raise the right correlation error."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.core.types import AppError, FailedRetryable, FailedTerminal, ProposedCall, Succeeded
from callgate.producer.adapters import SURFACES, AdapterError, read_proposals, write_results
from callgate.producer.adapters import names as name_codec

from .support import PLACES, id_status, inbound

Result = Succeeded | FailedRetryable | FailedTerminal

TEXT = st.characters(exclude_categories=["Cs"])  # lone surrogates are not text
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(TEXT, max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(TEXT, max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
arguments = st.dictionaries(st.text(TEXT, max_size=10), json_values, max_size=5)
# Five characters encode to at most 63 on every surface (4 UTF-8 bytes x "-hh" each + "cg-").
tool_names = st.text(TEXT, min_size=1, max_size=5)
call_ids = st.text(TEXT, min_size=1, max_size=40).filter(
    lambda s: not s.startswith("callgate-gemini-")
)


@st.composite
def proposal_lists(draw: st.DrawFn, min_size: int = 0) -> list[ProposedCall]:
    rows = draw(
        st.lists(
            st.tuples(call_ids, tool_names, arguments),
            min_size=min_size,
            max_size=6,
            unique_by=lambda r: r[0],
        )
    )
    return [ProposedCall(call_id=c, tool_name=t, arguments=a) for c, t, a in rows]


@settings(deadline=None, max_examples=150)
@given(surface=st.sampled_from(SURFACES), proposals=proposal_lists(), where=st.sampled_from(PLACES))
def test_proposals_survive_the_envelope_of_every_surface(
    surface: str, proposals: list[ProposedCall], where: str
) -> None:
    known = {p.tool_name for p in proposals}
    response = inbound(surface, proposals, where=where)
    assert read_proposals(surface, response, known) == proposals


@settings(deadline=None)
@given(proposals=proposal_lists(min_size=1))
def test_id_less_gemini_calls_get_stable_unique_ids_and_results_in_call_order(
    proposals: list[ProposedCall],
) -> None:
    # GenerateContent only: Interactions steps always carry an id (id-less ones are refused).
    surface = "gemini-generate-content"
    known = {p.tool_name for p in proposals}
    response = inbound(surface, proposals, with_ids=False)
    read = read_proposals(surface, response, known)
    assert [(p.tool_name, p.arguments) for p in read] == [
        (p.tool_name, p.arguments) for p in proposals
    ]
    assert len({p.call_id for p in read}) == len(read)
    assert read_proposals(surface, response, known) == read
    results = [
        Succeeded(call_id=p.call_id, tool_name=p.tool_name, data={"n": n})
        for n, p in enumerate(read)
    ]
    envelope = write_results(surface, read, list(reversed(results)))
    assert isinstance(envelope, dict)
    assert [p["functionResponse"]["response"]["data"]["n"] for p in envelope["parts"]] == list(
        range(len(read))
    )
    assert all("id" not in p["functionResponse"] for p in envelope["parts"])


def make_result(call: ProposedCall, status: str, n: int) -> Result:
    if status == "succeeded":
        return Succeeded(call_id=call.call_id, tool_name=call.tool_name, data={"n": n})
    error = AppError(code=f"code_{n}", retry_after_ms=n if status == "failed_retryable" else None)
    if status == "failed_retryable":
        return FailedRetryable(call_id=call.call_id, tool_name=call.tool_name, error=error)
    return FailedTerminal(call_id=call.call_id, tool_name=call.tool_name, error=error)


STATUSES = ["succeeded", "failed_retryable", "failed_terminal"]
FAULTS = ["none", "duplicate", "extra", "tool_name", "non_terminal"]


@settings(deadline=None, max_examples=300)
@given(data=st.data(), surface=st.sampled_from(SURFACES), proposals=proposal_lists(min_size=1))
def test_any_permutation_and_subset_keeps_each_status_or_raises_the_right_error(
    data: st.DataObject, surface: str, proposals: list[ProposedCall]
) -> None:
    results = [
        make_result(p, data.draw(st.sampled_from(STATUSES)), n) for n, p in enumerate(proposals)
    ]
    chosen = data.draw(st.permutations(results))
    chosen = chosen[: data.draw(st.integers(min_value=0, max_value=len(chosen)))]
    fault = data.draw(st.sampled_from(FAULTS if chosen else ["none", "extra"]))
    given_results: list[Any] = list(chosen)
    if fault == "duplicate":
        i = data.draw(st.integers(0, len(chosen) - 1))
        given_results.insert(data.draw(st.integers(i + 1, len(chosen))), chosen[i])
    elif fault == "extra":
        ids = {p.call_id for p in proposals}
        extra = ProposedCall(call_id="extra-" + "x" * len(ids), tool_name="t", arguments={})
        assert extra.call_id not in ids
        given_results.insert(
            data.draw(st.integers(0, len(chosen))), make_result(extra, "succeeded", 0)
        )
    elif fault == "tool_name":
        i = data.draw(st.integers(0, len(chosen) - 1))
        given_results[i] = chosen[i].model_copy(
            update={"tool_name": chosen[i].tool_name + "_other"}
        )
    elif fault == "non_terminal":
        i = data.draw(st.integers(0, len(chosen) - 1))
        given_results[i] = {
            **chosen[i].model_dump(),
            "status": data.draw(st.sampled_from(["proposed", "started", None])),
        }
    # plain dicts and result values are interchangeable
    given_results = [
        r.model_dump() if data.draw(st.booleans()) and not isinstance(r, dict) else r
        for r in given_results
    ]

    expected_code = {
        "duplicate": "duplicate_result",
        "extra": "extra_result",
        "tool_name": "tool_name_mismatch",
        "non_terminal": "non_terminal_result",
    }.get(fault, None if len(chosen) == len(proposals) else "missing_result")
    if expected_code is not None:
        try:
            write_results(surface, proposals, given_results)
        except AdapterError as exc:
            assert exc.code == expected_code
        else:
            raise AssertionError(f"expected {expected_code}")
        return
    envelope = write_results(surface, proposals, given_results)
    assert id_status(surface, envelope) == [(r.call_id, r.status) for r in chosen]


@given(surface=st.sampled_from(SURFACES), name=st.text(min_size=1, max_size=40))
def test_name_encoding_is_a_bijection(surface: str, name: str) -> None:
    wire = name_codec.wire_name(surface, name, check_length=False)
    assert name_codec.tool_name(surface, wire) == name
    allowed = (
        r"[a-zA-Z0-9_-]+"
        if surface.startswith(("openai", "anthropic"))
        else r"[a-zA-Z_][a-zA-Z0-9_.:-]*"
    )
    assert re.fullmatch(allowed, wire)
