"""``callgate eval bfcl-multi-turn``: a model's BFCL multi-turn results replayed through
callgate's real pipeline, scored by BFCL's own checker, and callgate's execution checked
against BFCL's.

For each entry, BFCL's backend instances are seeded from its ``initial_config`` into the
scratch database (``bfcl_multi_turn_store``); then every step of every turn of the model's
decoded answer is proposed to a ``Producer``, checked by the gate, run by real worker
processes (``bfcl_multi_turn_tools``) and collected. A step is split where BFCL's order
matters to callgate's: callgate runs a turn's reads at once and its writes in order, while
BFCL runs a step's calls one after another, so consecutive reads go together and writes
follow in their own turn (an identical write again starts a new one, where callgate would
take it for the model repeating itself). Every proposal is marked ``repeat``: the recording
is the model's deliberate answer, replayed, not a model retrying a lost result.

Two verdicts, kept apart:

- the model's: BFCL's ``multi_turn_checker`` on the decoded calls (it re-executes them and
  the ground truth on fresh instances in this process);
- the executor's: BFCL's ``execute_multi_turn_func_call`` runs the same calls in this
  process, and the instances the workers left (unpickled from the state table) must equal
  its instances by BFCL's own ``state_checker``, each call's response must equal BFCL's, and
  every proposed call must get exactly one result; effects are counted from the state
  table's rows.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import Engine

from callgate.core.errors import InputError
from callgate.core.settings import Settings
from callgate.core.types import ProposedCall, Succeeded
from callgate.ops.lab.eval import bfcl
from callgate.ops.lab.eval import bfcl_multi_turn_backend as backend
from callgate.ops.lab.eval import bfcl_multi_turn_decode as decode
from callgate.ops.lab.eval import bfcl_multi_turn_store as store
from callgate.ops.lab.eval.runner import scratch
from callgate.ops.lab.settings import EvalSettings
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from callgate.producer.producer import Collected
from callgate.store import db

TOOLS = "callgate.ops.lab.eval.bfcl_multi_turn_tools:registry"
CATEGORY = re.compile(r"multi_turn_[a-z_]+?(?=_\d+$)")
# BFCL names each entry's instances after its id and evaluates that name: an id is an id.
ENTRY_ID = re.compile(r"multi_turn_[A-Za-z0-9_]{1,120}")
COLLECT_SECONDS = 60.0
SUCCEEDED = "succeeded"
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Options:
    bfcl: Path | None = None  # an unzipped bfcl-eval wheel (None: the installed package)
    workers: int = 2
    limit: int | None = None
    log_path: str | None = None
    start_seconds: float | None = None
    style: decode.Style = "fc"


@dataclass
class CallRun:
    turn: int
    step: int
    call: str  # BFCL's call string
    tool: str | None  # what callgate was proposed (None: the call could not be proposed)
    outcome: str  # succeeded, an error code, or not_proposed
    response: str | None  # the worker's response text
    bfcl_response: str | None  # BFCL's in-process response to the same call
    runs: int = 0  # handler runs, from the state table's rows
    effects: int = 0  # instance writes stored, from the same rows
    write: bool = False


@dataclass
class EntryRun:
    id: str
    category: str
    turns: int
    calls: list[CallRun] = field(default_factory=list)
    skipped: str | None = None  # why neither checker ran
    bfcl_valid: bool | None = None
    bfcl_error: str | None = None
    callgate_turns: int = 0
    correlated: bool = True
    state_equal: bool | None = None
    state_differences: dict[str, Any] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)  # calls kept from BFCL's eval, and why

    @property
    def refusals(self) -> int:
        return sum(c.outcome not in (SUCCEEDED, "not_proposed") for c in self.calls)

    @property
    def effects(self) -> int:
        return sum(c.effects for c in self.calls)

    @property
    def writes_succeeded(self) -> int:
        return sum(c.write and c.outcome == SUCCEEDED for c in self.calls)

    @property
    def responses_differing(self) -> list[CallRun]:
        return [c for c in self.calls if c.outcome == SUCCEEDED and c.response != c.bfcl_response]

    @property
    def responses_equal(self) -> bool:
        return not self.responses_differing

    @property
    def redacted(self) -> int:
        """Responses that differ only where callgate redacted a secret (an access token):
        callgate's result policy, applied to every tool's output before a model sees it."""
        return sum(REDACTED in (c.response or "") for c in self.responses_differing)

    @property
    def executor_ok(self) -> bool:
        """Every call answered once, the workers' instances equal BFCL's, one stored write
        per succeeded write, and every response BFCL's (but for redacted secrets)."""
        return (
            self.correlated
            and bool(self.state_equal)
            and len(self.responses_differing) == self.redacted
            and self.effects == self.writes_succeeded
        )


@dataclass(frozen=True)
class Entry:
    doc: dict[str, Any]
    ground_truth: list[list[str]]
    result: Any

    @property
    def id(self) -> str:
        return str(self.doc["id"])

    @property
    def classes(self) -> list[str]:
        return [str(c) for c in self.doc.get("involved_classes") or []]

    @property
    def category(self) -> str:
        found = CATEGORY.match(self.id)
        return found.group(0) if found else "multi_turn"

    @property
    def long_context(self) -> bool:
        return "long_context" in self.category or "composite" in self.category


def is_multi_turn(questions: Path, ids: Sequence[str]) -> bool:
    """A BFCL multi-turn question file, by its name or all its ids."""
    stem = questions.name.removeprefix("BFCL_v4_").removeprefix("BFCL_v3_")
    return stem.startswith("multi_turn") or (
        bool(ids) and all(i.startswith("multi_turn_") for i in ids)
    )


def read_entries(
    questions: Path,
    results: Path,
    answers: Path | None,
    limit: int | None,
    max_bytes: int | None = None,
) -> tuple[list[Entry], list[str]]:
    """The entries that have a result, in the question file's order (at most ``limit``),
    and the ids of the questions without one."""
    asked = bfcl.read_lines(questions, max_bytes)
    if not is_multi_turn(questions, [q.id for q in asked]):
        raise InputError(f"{questions}: not a BFCL multi-turn question file (multi_turn_* ids)")
    truth_file = answers or bfcl.default_answers(questions)
    truth = {t.id: t for t in bfcl.read_lines(truth_file, max_bytes)}
    recorded = {r.id: r for r in bfcl.read_lines(results, max_bytes)}
    entries, unanswered = [], []
    for line in asked:
        if not ENTRY_ID.fullmatch(line.id):
            raise line.fail("id", f"{line.id[:80]!r} is not a BFCL multi-turn id")
        if line.id not in recorded:
            unanswered.append(line.id)
            continue
        if line.id not in truth:
            raise line.fail("id", f"{line.id!r} has no ground truth in the answers file")
        gt = truth[line.id].doc.get("ground_truth")
        if not isinstance(gt, list) or not all(
            isinstance(t, list) and all(isinstance(c, str) for c in t) for t in gt
        ):
            raise truth[line.id].fail("ground_truth", "expected a list of turns of call strings")
        entries.append(Entry(line.doc, gt, recorded[line.id].doc.get("result")))
    if not entries:
        raise InputError(f"{results}: no result for any question of {questions}")
    return entries[:limit] if limit else entries, unanswered


def model_style(entries: list[Entry], asked: str) -> tuple[decode.Style, str | None]:
    """The style the results are decoded in, and a warning to print. ``auto`` takes the one
    the file is written in, and refuses a file that holds both: BFCL decodes every step with
    one model's handler, so one of the two kinds would count as no call."""
    found = decode.shapes((e.result for e in entries), backend.decoders())
    if asked == "auto" and found.mixed:
        raise InputError(
            f"the results mix {found.fc} function-calling steps and {found.prompt} text steps "
            "holding Python calls; BFCL decodes a file with one model's handler: give "
            "--model-style fc or --model-style prompt"
        )
    style: decode.Style = (
        found.style() if asked == "auto" else ("fc" if asked == "fc" else "prompt")
    )
    other = found.prompt if style == "fc" else found.fc
    if not other:
        return style, None
    kind = "text steps holding Python calls" if style == "fc" else "function-calling steps"
    return style, f"{other} {kind} count as no call under --model-style {style}, as in BFCL"


def run(
    settings: Settings, entries: list[Entry], options: Options, progress: TextIO
) -> list[EntryRun]:
    """Every entry through scratch services and real workers, then both checks."""
    backend.use(options.bfcl)
    path = os.pathsep.join(p for p in (str(backend.root()), os.environ.get("PYTHONPATH")) if p)
    start = options.start_seconds or EvalSettings.from_env().start_seconds
    with scratch(settings, None, progress) as ready:
        env = {
            "CALLGATE_DATABASE_URL": ready.require_database(),
            "CALLGATE_REDIS_URL": ready.require_redis(),
            "CALLGATE_QUEUE": ready.queue,
            "CALLGATE_TOOLS": TOOLS,
            "CALLGATE_ALLOWLIST": "",
            "PYTHONPATH": path,
        }
        engine = db.create(ready.require_database(), application_name="callgate-eval")
        try:
            store.install(engine)
            log = options.log_path or os.devnull
            with Stack(env=env, workers=options.workers, log_path=log) as stack:
                wait_for_workers(
                    ready.require_redis(), ready.queue, options.workers, start, stack=stack
                )
                producer = Producer.from_env(ready.replace(tools=TOOLS, allowlist=None))
                try:
                    out = []
                    for n, entry in enumerate(entries, 1):
                        t0 = time.monotonic()
                        done = _entry(producer, engine, entry, options.style)
                        out.append(done)
                        _progress(progress, n, len(entries), done, time.monotonic() - t0)
                    return out
                finally:
                    producer.close()
        finally:
            engine.dispose()


def _progress(out: TextIO, n: int, total: int, done: EntryRun, took: float) -> None:
    if done.skipped:
        verdict = f"skipped ({done.skipped})"
    else:
        model = "valid" if done.bfcl_valid else f"invalid ({done.bfcl_error})"
        executor = "ok" if done.executor_ok else "MISMATCH"
        verdict = f"BFCL {model}; executor {executor}"
    out.write(f"{n}/{total} {done.id}: {verdict} ({took:.1f} s)\n")
    out.flush()


@dataclass
class Judged:
    """BFCL's verdict on an entry, and the guarded calls it was given (None when it was not
    run: the entry is skipped, or invalid before any call is decoded)."""

    valid: bool | None = None
    error: str | None = None
    skipped: str | None = None
    decoded: decode.Decoded | None = None
    refused: list[str] = field(default_factory=list)


def judge(entry: Entry, style: decode.Style, run_key: str) -> Judged:
    """The model's verdict, as BFCL's ``_evaluate_single_multi_turn_entry`` gives it, with
    every call guarded before BFCL's checker executes it."""
    why = next(filter(None, (backend.missing(c) for c in entry.classes)), None)
    if why:
        return Judged(skipped=why)
    methods = backend.methods(entry.classes)
    # The answers file is input too: its calls are held to the same rule.
    guarded_truth, unsafe = decode.guard([entry.ground_truth], methods)
    if unsafe:
        return Judged(skipped=f"the ground truth has a call that is not run: {unsafe[0].reason}")
    decoders = backend.decoders()
    try:
        decoded = decode.decode_result(entry.result, decoders.of(style), decoders)
    except ValueError as exc:
        return Judged(False, f"multi_turn:inference_error ({exc})")
    if len(decoded) != len(entry.ground_truth):
        return Judged(False, "multi_turn:force_terminated")
    decoded, refusals = decode.guard(decoded, methods)
    valid, error = _bfcl_verdict(entry, guarded_truth[0], decoded, run_key)
    refused = [f"turn {r.turn} step {r.step}: {r.reason}" for r in refusals]
    return Judged(valid, error, None, decoded, refused)


def _entry(producer: Producer, engine: Engine, entry: Entry, style: decode.Style) -> EntryRun:
    done = EntryRun(entry.id, entry.category, len(entry.ground_truth))
    run_key = f"bfcl-{uuid.uuid4().hex[:12]}"
    judged = judge(entry, style, run_key)
    done.skipped, done.bfcl_valid, done.bfcl_error = judged.skipped, judged.valid, judged.error
    done.refused = judged.refused
    decoded = judged.decoded
    if decoded is None:
        return done
    bfcl_responses, bfcl_instances = _bfcl_execution(entry, decoded, run_key)
    for class_name in entry.classes:
        instance = backend.fresh(
            class_name, entry.doc["initial_config"].get(class_name, {}), entry.long_context
        )
        store.seed(engine, store.Key(run_key, entry.id, class_name), pickle.dumps(instance))
    conversation = f"{run_key}-{entry.id}"
    for t, turn in enumerate(decoded):
        for s, step in enumerate(turn):
            calls = [
                _proposed(t, s, i, text, bfcl_responses[t][s][i]) for i, text in enumerate(step)
            ]
            for group in _groups(producer, calls):
                _submit(producer, engine, entry, run_key, conversation, group, done)
            done.calls.extend(c for c, _ in calls)
    workers = {
        # This run's own rows, in its scratch database.
        name: pickle.loads(state)
        for name, state in store.states(engine, run_key, entry.id).items()
    }
    verdict = backend.checker().state_checker(workers, bfcl_instances)
    done.state_equal = bool(verdict["valid"])
    if not done.state_equal:
        done.state_differences = {"class": verdict.get("error_message"), **verdict["details"]}
        done.state_differences = json.loads(json.dumps(done.state_differences, default=str))
    return done


def _bfcl_verdict(
    entry: Entry, truth: list[list[str]], decoded: decode.Decoded, run_key: str
) -> tuple[bool, str | None]:
    """BFCL's ``multi_turn_checker``, as its evaluation calls it (the model name only keys
    its instances, so each run's is new)."""
    model = f"callgate_{run_key}"
    prompt = {k: v for k, v in entry.doc.items() if k != "function"}
    try:
        verdict = backend.checker().multi_turn_checker(
            decoded, truth, prompt, entry.category, model
        )
    except Exception as exc:  # BFCL's checker asserts on some inputs: invalid, with the reason
        return False, f"checker error: {exc!r}"
    finally:
        _forget(model)
    return bool(verdict["valid"]), None if verdict["valid"] else str(verdict.get("error_type"))


def _bfcl_execution(
    entry: Entry, decoded: decode.Decoded, run_key: str
) -> tuple[list[list[list[str]]], dict[str, Any]]:
    """BFCL's own execution of the decoded calls, step after step on one set of instances:
    each call's response, and the instances at the end."""
    model = f"callgate_exec_{run_key}"
    execute = backend.utils().execute_multi_turn_func_call
    kwargs = {
        "initial_config": entry.doc["initial_config"],
        "involved_classes": entry.classes,
        "model_name": model,
        "test_entry_id": entry.id,
        "long_context": entry.long_context,
        "is_evaL_run": True,
    }
    try:
        _, instances = execute(func_call_list=[], **kwargs)
        responses = []
        for turn in decoded:
            steps = []
            for step in turn:
                answered, instances = execute(func_call_list=step, **kwargs)
                steps.append([str(a) for a in answered])
            responses.append(steps)
        return responses, dict(instances)
    finally:
        _forget(model)


def _forget(model: str) -> None:
    """BFCL keeps each entry's instances as globals of its module, named after the model:
    dropped once used, so a long run does not keep them all."""
    names = backend.utils().__dict__
    prefix = re.sub(r"[-./:]", "_", model)
    for name in [n for n in names if n.startswith(prefix)]:
        del names[name]


def _proposed(
    turn: int,
    step: int,
    index: int,
    text: str,
    bfcl_response: str,
) -> tuple[CallRun, ProposedCall | None]:
    record = CallRun(turn, step, text, None, "not_proposed", None, bfcl_response)
    if text == decode.REFUSED:
        record.response = "refused before BFCL's eval (the entry's refused list says why)"
        return record, None
    call = decode.parse_call(text)  # the guard let it through: a literal call of a method
    if call.positional:  # BFCL's decoders never write one: only a ground truth has them
        record.response = "positional arguments are not proposed"
        return record, None
    record.tool = call.name
    proposal = ProposedCall(
        call_id=f"t{turn}-s{step}-c{index}",
        tool_name=call.name,
        arguments=decode.plain(call.arguments),
        repeat=True,
    )
    return record, proposal


def _groups(
    producer: Producer, calls: list[tuple[CallRun, ProposedCall | None]]
) -> list[list[tuple[CallRun, ProposedCall]]]:
    """The step's proposable calls as callgate turns that keep BFCL's order: a run of reads,
    or a run of distinct writes."""
    groups: list[list[tuple[CallRun, ProposedCall]]] = []
    current: list[tuple[CallRun, ProposedCall]] = []
    current_kind = ""
    for record, proposal in calls:
        if proposal is None:
            continue
        kind = producer.registry.kind_of(proposal.tool_name)
        record.write = kind == "write"
        same = json.dumps([proposal.tool_name, proposal.arguments], sort_keys=True)
        repeated = kind == "write" and any(
            json.dumps([p.tool_name, p.arguments], sort_keys=True) == same for _, p in current
        )
        if current and (kind != current_kind or repeated):
            groups.append(current)
            current = []
        current.append((record, proposal))
        current_kind = kind
    if current:
        groups.append(current)
    return groups


def _submit(
    producer: Producer,
    engine: Engine,
    entry: Entry,
    run_key: str,
    conversation: str,
    group: list[tuple[CallRun, ProposedCall]],
    done: EntryRun,
) -> None:
    context = {
        "request_id": f"{conversation}-{done.callgate_turns}",
        "tenant_id": run_key,
        "user_id": entry.id,
        "roles": entry.classes,
        "conversation_id": conversation,
    }
    proposals = [p for _, p in group]
    submitted = producer.submit(proposals, context)
    done.callgate_turns += 1
    collected = _settle(producer, submitted.turn_id)
    ids = [r.call_id for r in collected.results]
    if len(ids) != len(set(ids)) or set(ids) != {p.call_id for p in proposals}:
        done.correlated = False
    ops = {c.call_id: c.operation_id for c in submitted.calls}
    counted = store.counts(engine, ops.values())
    results = {r.call_id: r for r in collected.results}
    for record, proposal in group:
        record.runs, record.effects = counted.get(ops.get(proposal.call_id, ""), (0, 0))
        result = results.get(proposal.call_id)
        if result is None:
            record.outcome = "missing"
        elif isinstance(result, Succeeded):
            record.outcome = SUCCEEDED
            record.response = _response(result.data)
        else:
            record.outcome = str(result.error.code)


def _response(data: dict[str, Any]) -> str | None:
    content = data.get("content", data)
    found = content.get("response") if isinstance(content, dict) else None
    return found if isinstance(found, str) else None


def _settle(producer: Producer, turn_id: str) -> Collected:
    deadline = time.monotonic() + COLLECT_SECONDS
    while True:
        left = deadline - time.monotonic()
        collected = producer.collect(turn_id, timeout=max(0.0, min(1.0, left)))
        if collected.complete or left <= 0:
            return collected
