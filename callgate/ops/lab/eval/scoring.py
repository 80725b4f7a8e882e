"""From what a model proposed and what callgate did to checks, and from checks to metrics.

Pure: plain functions over typed values. The model's checks read only the proposals; the
executor's read only what happened to each proposed call (outcome, handler runs and effects
counted in the doubles' ledger, the result joined by call id). So a model's mistake moves
only the model's table, and an executor's fault only the executor's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from callgate.core.errors import RETRYABLE_CODES, ErrorCode
from callgate.ops.lab.eval.fixture import AWAITING_APPROVAL, SUCCEEDED, ExpectedCall, Outcome, Turn
from callgate.ops.lab.eval.matchers import arguments_match
from callgate.tools.gate import check_arguments

Table = Literal["model", "executor", "final"]


@dataclass(frozen=True)
class MetricDef:
    key: str
    label: str
    table: Table
    lower_is_better: bool = False  # an error rate: the share of checks that failed


METRICS: tuple[MetricDef, ...] = (
    MetricDef("selection_accuracy", "tool selection accuracy", "model"),
    MetricDef("argument_validity", "argument validity (passes the schema)", "model"),
    MetricDef("argument_accuracy", "argument accuracy (matches the expectation)", "model"),
    MetricDef("hallucinated_tool_rate", "hallucinated-tool rate", "model", lower_is_better=True),
    MetricDef("irrelevance_accuracy", "irrelevance accuracy (no call when none fits)", "model"),
    MetricDef("relevance_accuracy", "relevance accuracy (a call when one fits)", "model"),
    MetricDef("parallel_completeness", "parallel completeness", "model"),
    MetricDef("outcome_accuracy", "outcome as expected", "executor"),
    MetricDef("policy_catch_rate", "policy catch rate", "executor"),
    MetricDef("side_effect_exactness", "side-effect exactness", "executor"),
    MetricDef("handler_runs_on_refusal", "refused calls whose handler ran", "executor", True),
    MetricDef("correlation", "correlation (every result joined by call id)", "executor"),
    MetricDef("partial_failures_visible", "partial failures visible", "executor"),
    MetricDef("final_answer_correctness", "final-answer correctness", "final"),
)
BY_KEY = {m.key: m for m in METRICS}

# Outcomes that are not a policy's refusal: success, parking, and failures of the downstream.
_NOT_POLICY = {SUCCEEDED, AWAITING_APPROVAL, ErrorCode.EXECUTION_FAILED.value} | {
    c.value for c in RETRYABLE_CODES | {ErrorCode.DELIVERY_EXHAUSTED}
}


# An expected call's name meaning "some call, to any tool, with any arguments" (BFCL's
# relevance categories, which score only whether a call was made). In a fixture it always
# means this, never a tool of that name.
ANY_CALL = "*"


def expects_any_call(turn: Turn) -> bool:
    return any(c.name == ANY_CALL for c in turn.calls)


def is_policy_refusal(outcome: str) -> bool:
    return outcome not in _NOT_POLICY and outcome not in ("pending", "missing")


@dataclass(frozen=True)
class Proposed:
    """One call as the model proposed it (arguments a str when they are not JSON)."""

    call_id: str
    name: str
    arguments: Mapping[str, Any] | str


@dataclass(frozen=True)
class Executed:
    """What callgate did with one proposed call, observed from outside.

    ``outcome`` is ``succeeded``, ``awaiting_approval``, an error code, ``pending`` (no
    result in time) or ``missing`` (no call of that id in the collected turn).
    ``handler_runs`` and ``effects`` are the doubles' ledger rows for its operation.
    """

    call_id: str
    tool_name: str
    outcome: str
    handler_runs: int
    effects: int
    trace_id: str
    data: Mapping[str, Any] = field(default_factory=dict)
    approval: Mapping[str, Any] | None = None  # the request's impact, when parked
    effects_after_approval: int | None = None
    outcome_after_approval: str | None = None


@dataclass(frozen=True)
class TurnRun:
    """One turn of one fixture as run: the expectation, the proposals, what happened."""

    fixture_id: str
    category: str
    turn_index: int
    answer: str
    surface: str
    expect: Turn
    exposed: frozenset[str]
    schemas: Mapping[str, Mapping[str, Any]]  # every tool the registry has → its schema
    proposed: Sequence[Proposed]
    read_error: str | None = None  # the adapter refused the recorded response
    executed: Sequence[Executed] = ()
    turn_id: str | None = None
    joined: bool = True  # one result per proposal, by call id and tool name
    final_text: str | None = None


@dataclass(frozen=True)
class Check:
    metric: str
    passed: bool
    fixture_id: str
    category: str
    answer: str
    surface: str
    turn_index: int
    expected: str
    actual: str
    trace_id: str


def score(run: TurnRun) -> list[Check]:
    return [*model_checks(run), *executor_checks(run), *final_checks(run)]


# The model ------------------------------------------------------------------------------


def match_calls(
    expected: Sequence[ExpectedCall],
    proposed: Sequence[Proposed],
    ordered: bool,
    greedy: bool = False,
) -> dict[int, int]:
    """Expected index → proposed index, each used once, as many as possible (order-free
    unless ``ordered``). Small sets: a plain search over assignments. ``greedy``: BFCL's
    matcher instead, each expected call in order taking the first proposed one left that
    matches it, so a set BFCL fails for one order of right calls fails here too."""
    pairs = [
        [
            j
            for j, p in enumerate(proposed)
            if e.name == ANY_CALL
            or (
                p.name == e.name
                and isinstance(p.arguments, Mapping)
                and arguments_match(e.arguments, p.arguments)
            )
        ]
        for e in expected
    ]
    if ordered:
        return {i: i for i in range(min(len(expected), len(proposed))) if i in pairs[i]}
    if greedy:
        taken: dict[int, int] = {}
        for i, candidates in enumerate(pairs):
            free = [j for j in candidates if j not in taken.values()]
            if free:
                taken[i] = free[0]
        return taken
    best: dict[int, int] = {}

    def search(i: int, used: dict[int, int]) -> None:
        nonlocal best
        if len(used) + (len(expected) - i) <= len(best):
            return
        if i == len(expected):
            best = dict(used)
            return
        for j in pairs[i]:
            if j not in used.values():
                search(i + 1, {**used, i: j})
        search(i + 1, used)

    search(0, {})
    return best


def _check(
    run: TurnRun, metric: str, passed: bool, expected: str, actual: str, trace: str
) -> Check:
    return Check(
        metric,
        passed,
        run.fixture_id,
        run.category,
        run.answer,
        run.surface,
        run.turn_index,
        expected,
        actual,
        trace,
    )


def model_checks(run: TurnRun) -> list[Check]:
    out: list[Check] = []
    trace = run.turn_id or "-"

    def check(metric: str, passed: bool, expected: str, actual: str) -> None:
        out.append(_check(run, metric, passed, expected, actual, trace))

    if expects_any_call(run.expect):
        _proposal_checks(run, check)
        check(
            "relevance_accuracy",
            bool(run.proposed) and not run.read_error,
            "a call",
            run.read_error or (", ".join(p.name for p in run.proposed) or "no call"),
        )
        return out
    expected = run.expect.calls
    want = [c.name for c in expected]
    got = [p.name for p in run.proposed]
    shown_got = run.read_error or (", ".join(got) or "no call")
    same = want == got if run.expect.ordered else sorted(want) == sorted(got)
    check(
        "selection_accuracy", same and not run.read_error, ", ".join(want) or "no call", shown_got
    )
    _proposal_checks(run, check)
    matched = match_calls(expected, run.proposed, run.expect.ordered, run.expect.greedy)
    for i, e in enumerate(expected):
        check(
            "argument_accuracy",
            i in matched,
            f"{e.name}({_shown_matchers(e)})",
            _closest(e, run.proposed),
        )
    if not expected:
        check("irrelevance_accuracy", not run.proposed and not run.read_error, "no call", shown_got)
    if len(expected) > 1 and run.category in ("parallel", "parallel_multiple"):
        check(
            "parallel_completeness",
            len(matched) == len(expected),
            f"all {len(expected)} calls",
            f"{len(matched)} of {len(expected)} matched",
        )
    return out


def _proposal_checks(run: TurnRun, check: Callable[[str, bool, str, str], None]) -> None:
    """Each proposed call: a tool the model was given, with arguments its schema takes."""
    for p in run.proposed:
        hallucinated = p.name not in run.exposed
        check("hallucinated_tool_rate", not hallucinated, "a tool it was given", p.name)
        if hallucinated or p.name not in run.schemas:
            continue
        problems = (
            check_arguments(run.schemas[p.name], p.arguments)
            if isinstance(p.arguments, Mapping)
            else [{"path": "/", "code": "not_json"}]
        )
        check(
            "argument_validity",
            not problems,
            f"{p.name} arguments valid for its schema",
            "valid" if not problems else _problems(problems),
        )


def _problems(details: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{d.get('path')} {d.get('code')}" for d in details)


def _shown_matchers(call: ExpectedCall) -> str:
    return ", ".join(
        f"{k}={m.model_dump_json(exclude_none=True)}" for k, m in call.arguments.items()
    )


def _closest(call: ExpectedCall, proposed: Sequence[Proposed]) -> str:
    same_tool = [p for p in proposed if p.name == call.name]
    if not same_tool:
        return f"no {call.name} call"
    return "; ".join(_shown_call(p) for p in same_tool)


def _shown_call(p: Proposed) -> str:
    if isinstance(p.arguments, str):
        return f"{p.name}({p.arguments})"
    return f"{p.name}({json.dumps(dict(p.arguments), ensure_ascii=False, sort_keys=True)})"


# The executor ---------------------------------------------------------------------------


def expected_outcome(
    run: TurnRun, call: Proposed, matched: bool
) -> tuple[str | None, Outcome | None]:
    """The outcome the executor owes this call, and the rule it came from (which carries the
    effects and the approval when the rule's ``outcome`` applies). A tool the registry does not
    have is ``unknown_tool``; arguments its schema refuses are ``invalid_arguments``; then the
    fixture's rule for the tool."""
    if call.name not in run.schemas:
        return ErrorCode.UNKNOWN_TOOL.value, None
    if not isinstance(call.arguments, Mapping):
        return ErrorCode.INVALID_ARGUMENTS_JSON.value, None
    if check_arguments(run.schemas[call.name], call.arguments):
        return ErrorCode.INVALID_ARGUMENTS.value, None
    rule = run.expect.executor.get(call.name)
    if rule is None:
        return None, None
    if rule.always or matched:
        return rule.outcome, rule
    return rule.otherwise, None


def executor_checks(run: TurnRun) -> list[Check]:
    out: list[Check] = []
    if not run.proposed or run.read_error:
        return out
    by_id = {e.call_id: e for e in run.executed}
    matched = set(
        match_calls(run.expect.calls, run.proposed, run.expect.ordered, run.expect.greedy).values()
    )

    def check(metric: str, passed: bool, expected: str, actual: str, trace: str) -> None:
        out.append(_check(run, metric, passed, expected, actual, trace))

    for j, call in enumerate(run.proposed):
        done = by_id.get(call.call_id)
        actual = done.outcome if done else "missing"
        trace = done.trace_id if done else run.turn_id or "-"
        want, rule = expected_outcome(run, call, j in matched)
        label = f"{call.call_id} {call.name}"
        if want is not None:
            approval_ok, approval_seen = _approval(rule, done)
            check(
                "outcome_accuracy",
                actual == want and approval_ok,
                f"{label}: {want}" + _approval_wanted(rule),
                f"{actual}{approval_seen}",
                trace,
            )
            if is_policy_refusal(want):
                check("policy_catch_rate", actual == want, f"{label}: {want}", actual, trace)
        if done is None:
            continue
        if is_policy_refusal(actual) or (want is not None and is_policy_refusal(want)):
            check(
                "handler_runs_on_refusal",
                done.handler_runs == 0,
                f"{label}: no handler run",
                f"{done.handler_runs} handler run(s)",
                trace,
            )
        if rule is not None and rule.effects is not None:
            before = rule.outcome == AWAITING_APPROVAL
            check(
                "side_effect_exactness",
                done.effects == rule.effects,
                f"{label}: {rule.effects} effect(s)" + (" before approval" if before else ""),
                f"{done.effects} effect(s) in the ledger",
                trace,
            )
        elif actual != SUCCEEDED and actual != AWAITING_APPROVAL:
            check(
                "side_effect_exactness",
                done.effects == 0,
                f"{label}: no effect ({actual})",
                f"{done.effects} effect(s) in the ledger",
                trace,
            )
        after = rule.approval.effects_after if rule and rule.approval else None
        if after is not None:
            check(
                "side_effect_exactness",
                done.effects_after_approval == after,
                f"{label}: {after} effect(s) once approved",
                f"{done.effects_after_approval} effect(s) in the ledger "
                f"({done.outcome_after_approval})",
                trace,
            )
    got = {e.call_id for e in run.executed}
    want_ids = {p.call_id for p in run.proposed}
    check(
        "correlation",
        run.joined and got == want_ids,
        f"one result per call id: {', '.join(sorted(want_ids))}",
        "joined" if run.joined and got == want_ids else f"results for {sorted(got)}",
        run.turn_id or "-",
    )
    # A turn of several calls where one failed: the failure must be there, with its code,
    # beside the others' results; none of them missing or left pending.
    unfinished = ("pending", "missing")
    ended = [e.outcome for e in run.executed if e.outcome not in unfinished]
    if len(run.proposed) > 1 and any(o not in (SUCCEEDED, AWAITING_APPROVAL) for o in ended):
        check(
            "partial_failures_visible",
            len(ended) == len(run.proposed) == len(run.executed),
            "each failed call's code next to the others' results",
            ", ".join(f"{e.call_id}={e.outcome}" for e in run.executed),
            run.turn_id or "-",
        )
    return out


def _approval(rule: Outcome | None, done: Executed | None) -> tuple[bool, str]:
    if rule is None or rule.approval is None or done is None:
        return True, ""
    shown = done.approval or {}
    ok = all(k in shown and shown[k] == v for k, v in rule.approval.shows.items())
    seen = {k: shown.get(k) for k in rule.approval.shows}
    return ok, f", approval shows {seen}"


def _approval_wanted(rule: Outcome | None) -> str:
    if rule is None or rule.approval is None or not rule.approval.shows:
        return ""
    return f", approval shows {dict(rule.approval.shows)}"


# The final answer -------------------------------------------------------------------------

_FIELD = re.compile(r"\{([A-Za-z_][\w]*)\.([A-Za-z_][\w.]*)\}")


def fill(template: str, executed: Sequence[Executed]) -> str | None:
    """``{tool.field}`` replaced by that field of the tool's succeeded result in the turn;
    None when a named tool has no such result (the answer cannot have used it)."""
    missing = False

    def value(m: re.Match[str]) -> str:
        nonlocal missing
        for e in executed:
            if e.tool_name == m.group(1) and e.outcome == SUCCEEDED:
                found: Any = e.data
                for part in m.group(2).split("."):
                    found = found.get(part) if isinstance(found, Mapping) else None
                if found is not None:
                    return str(found)
        missing = True
        return m.group(0)

    filled = _FIELD.sub(value, template)
    return None if missing else filled


def final_checks(run: TurnRun) -> list[Check]:
    rules = run.expect.final
    if rules is None or run.final_text is None:
        return []
    text = run.final_text
    problems: list[str] = []
    for need in rules.requires:
        filled = fill(need, run.executed)
        if filled is None or filled not in text:
            problems.append(f"lacks {filled or need!r}")
    for banned in rules.forbids:
        filled = fill(banned, run.executed)
        if filled is not None and filled in text:
            problems.append(f"says {filled!r}")
    expected = "; ".join(
        [*(f"mentions {r!r}" for r in rules.requires), *(f"never {f!r}" for f in rules.forbids)]
    )
    actual = "; ".join(problems) or "as expected"
    return [
        _check(run, "final_answer_correctness", not problems, expected, actual, run.turn_id or "-")
    ]
