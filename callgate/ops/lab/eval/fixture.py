"""The fixture format, and the loader that reads a suite folder. No I/O beyond reading files.

A suite is a folder holding ``suite.yaml`` (its name, the registry of test doubles its tools
run against, and optionally the module that resets and seeds those doubles) and one fixture
per ``fixtures/*.yaml`` file. docs/eval.md describes every field. A malformed suite or
fixture is one ``invalid_input`` error naming the file, the fixture id and the field path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from callgate.core.errors import InputError
from callgate.ops.lab.eval import inputs, matchers
from callgate.ops.lab.eval.matchers import Matcher

Category = Literal[
    "simple", "multiple", "parallel", "parallel_multiple", "irrelevance", "multi_turn"
]
Surface = Literal[
    "openai-chat",
    "openai-responses",
    "anthropic-messages",
    "gemini-generate-content",
    "gemini-interactions",
]
SURFACES: tuple[str, ...] = Surface.__args__  # type: ignore[attr-defined]
# A call's outcome: it ran and succeeded, it waits for a person, or an error code (a refusal
# by the gate, or a failure the handler reported).
SUCCEEDED = "succeeded"
AWAITING_APPROVAL = "awaiting_approval"
Name = Annotated[str, Field(min_length=1, max_length=200)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Principal(_Strict):
    """Who asks: the server-trusted context the turn is submitted with."""

    user_id: Name
    tenant_id: Name
    roles: Annotated[list[Name], Field(min_length=1)]


class ExpectedCall(_Strict):
    name: Name
    arguments: dict[str, Matcher] = Field(default_factory=dict)

    @field_validator("arguments", mode="before")
    @classmethod
    def _matchers(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            return raw
        parsed = {}
        for name, value in raw.items():
            try:
                parsed[name] = matchers.parse(value)
            except ValidationError as exc:
                problem = exc.errors()[0]
                where = "/".join(str(p) for p in problem["loc"])
                raise ValueError(
                    f"argument {name!r}: {where + ': ' if where else ''}{_plain(problem['msg'])}"
                ) from None
        return parsed


class Approval(_Strict):
    """What a parked call's approval request must show (values the server computed), and
    what the decision leads to once an approver grants it."""

    shows: dict[str, Any] = Field(default_factory=dict)
    then: Literal["approve", "leave"] = "approve"
    effects_after: int | None = Field(default=None, ge=0)


class Outcome(_Strict):
    """What the executor must do with a call of one tool.

    ``outcome`` applies to a call that matches the model expectation; ``otherwise`` to one
    that does not (a model's mistake the executor must still stop); ``always`` makes
    ``outcome`` hold whatever the model proposed (authorization of another tenant's order).
    ``effects`` counts the tool's downstream effects for the call (ledger rows);
    ``approval`` applies when ``outcome`` is ``awaiting_approval``.
    """

    outcome: Name
    otherwise: Name | None = None
    always: bool = False
    effects: int | None = Field(default=None, ge=0)
    approval: Approval | None = None

    @model_validator(mode="after")
    def _approval_only_when_parked(self) -> Outcome:
        if self.approval is not None and self.outcome != AWAITING_APPROVAL:
            raise ValueError("approval is only for outcome: awaiting_approval")
        return self


Answers = dict[Name, dict[Surface, Any]]


class FinalAnswer(_Strict):
    """A second recorded response, after the results went back to the model.

    ``requires``: text the answer must contain; ``{tool.field}`` is replaced by that field of
    the tool's result in this turn (so the answer used the right call's result). ``forbids``:
    text it must not contain; ``{tool.field}`` likewise. A fixture whose call must be refused
    or fail forbids the words that would report it as done.
    """

    answers: Answers
    requires: list[str] = Field(default_factory=list)
    forbids: list[str] = Field(default_factory=list)


class Turn(_Strict):
    request: str | None = None  # the user's follow-up; the fixture's request for the first
    answers: Answers  # answer set name (good, bad…) → surface → recorded response
    calls: list[ExpectedCall]  # [] for a turn that must call nothing (irrelevance)
    ordered: bool = False  # parallel sets match in any order unless this says otherwise
    # In any order, but as BFCL's checker matches: each expected call, in order, takes the
    # first proposed call left that matches it (no search for a better assignment).
    greedy: bool = False
    executor: dict[Name, Outcome] = Field(default_factory=dict)
    final: FinalAnswer | None = None


class Fixture(_Strict):
    id: Annotated[str, Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9][\w.-]*$")]
    category: Category
    request: Annotated[str, Field(min_length=1)]
    principal: Principal
    tools: list[Name]  # the tools exposed to the model
    setup: dict[str, Any] = Field(default_factory=dict)  # handed to the suite's seed
    turns: Annotated[list[Turn], Field(min_length=1)]

    @model_validator(mode="after")
    def _consistent(self) -> Fixture:
        if self.category == "irrelevance" and any(t.calls for t in self.turns):
            raise ValueError("an irrelevance fixture expects no call: calls: []")
        if self.category == "multi_turn" and len(self.turns) < 2:
            raise ValueError("a multi_turn fixture has two turns or more")
        return self

    def answer_sets(self) -> set[str]:
        return {name for turn in self.turns for name in turn.answers}

    def surfaces(self, answer: str) -> set[str]:
        """Surfaces every turn has a recorded ``answer`` on."""
        found: list[set[str]] = [set(t.answers.get(answer, {})) for t in self.turns]
        return set.intersection(*found) if found else set()


class SuiteConfig(_Strict):
    name: Name
    tools: Annotated[str, Field(pattern=r"^[\w.]+:[\w.]+$")]  # module:registry factory
    doubles: Annotated[str | None, Field(pattern=r"^[\w.]+$")] = None  # module with install/seed
    # A JSON file of stub tool definitions beside suite.yaml (an imported suite): the runner
    # hands its path to the registry as CALLGATE_EVAL_STUBS (callgate.ops.lab.eval.stubs).
    stubs: Annotated[str | None, Field(pattern=r"^[\w.-]+$")] = None
    description: str = ""


class Suite(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: Path
    config: SuiteConfig
    fixtures: list[Fixture]


BUILTIN = Path(__file__).parent / "suites" / "builtin"


def load_suite(path: Path, max_bytes: int | None = None) -> Suite:
    """Read and check a suite folder (or ``builtin``); every fixture id once. Each file is
    read within ``inputs``' caps (``max_bytes``, default the setting; nesting)."""
    folder = BUILTIN if str(path) == "builtin" else path
    config_file = folder / "suite.yaml"
    if not config_file.is_file():
        raise InputError(f"{folder}: not a suite folder (it has no suite.yaml)")
    config = _validated(SuiteConfig, _document(config_file, max_bytes), config_file, None)
    fixtures: list[Fixture] = []
    seen: dict[str, Path] = {}
    for file in sorted((folder / "fixtures").glob("*.yaml")):
        fixture = load_fixture(file, max_bytes)
        if fixture.id in seen:
            raise InputError(
                f"{file}: fixture id {fixture.id!r} is also used by {seen[fixture.id]}"
            )
        seen[fixture.id] = file
        fixtures.append(fixture)
    if not fixtures:
        raise InputError(f"{folder}: the suite has no fixtures (fixtures/*.yaml)")
    return Suite(path=folder, config=config, fixtures=fixtures)


def load_fixture(file: Path, max_bytes: int | None = None) -> Fixture:
    doc = _document(file, max_bytes)
    ident = doc.get("id") if isinstance(doc, dict) else None
    return _validated(Fixture, doc, file, ident if isinstance(ident, str) else None)


def _document(file: Path, max_bytes: int | None) -> Any:
    return inputs.load_yaml(inputs.read_text(file, max_bytes), file)


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], doc: Any, file: Path, ident: str | None) -> M:
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = "/" + "/".join(str(p) for p in first["loc"]) if first["loc"] else "/"
        who = f" fixture {ident!r}" if ident else ""
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(
            f"{file}:{who} field {path}: {_plain(first['msg'])}{more}",
            details=[{"path": path, "code": first["type"], "expected": first["msg"]}],
        ) from None


RESPONSE_FILE = re.compile(
    r"^(?P<id>[A-Za-z0-9][\w.-]*?)\.(?P<turn>[1-9][0-9]*)\.(?P<surface>[a-z-]+)(?P<final>\.final)?\.json$"
)


def with_responses(suite: Suite, folder: Path, answer: str, max_bytes: int | None = None) -> Suite:
    """``suite`` with the answer set ``answer`` taken from recorded responses in ``folder``.

    One JSON file per response, named ``FIXTURE.TURN.SURFACE.json`` (turns count from 1), and
    ``FIXTURE.TURN.SURFACE.final.json`` for a final answer. A fixture is kept for a surface
    only if every turn of it has a response there; a file naming no fixture of the suite, or
    no turn of it, is refused (a typo would silently drop it otherwise)."""
    if not folder.is_dir():
        raise InputError(f"--responses {folder}: not a folder")
    by_id = {f.id: f for f in suite.fixtures}
    found: dict[tuple[str, int, str, bool], Any] = {}
    for file in sorted(folder.glob("*.json")):
        match = RESPONSE_FILE.match(file.name)
        if match is None:
            raise InputError(
                f"{file}: expected a name FIXTURE.TURN.SURFACE.json (or .final.json), e.g. "
                "seoul-weather-and-stock.1.openai-chat.json"
            )
        ident, turn, surface = match["id"], int(match["turn"]), match["surface"]
        if surface not in SURFACES:
            raise InputError(
                f"{file}: unknown surface {surface!r}; expected one of {', '.join(SURFACES)}"
            )
        fixture = by_id.get(ident)
        if fixture is None or turn > len(fixture.turns):
            raise InputError(
                f"{file}: suite {suite.config.name!r} has no fixture {ident!r} with a turn {turn}"
            )
        text = inputs.read_text(file, max_bytes)
        inputs.check_json_depth(text, str(file))
        try:
            found[(ident, turn - 1, surface, bool(match["final"]))] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{file}: not a JSON response ({type(exc).__name__})") from None
    fixtures = []
    for each in suite.fixtures:
        turns = []
        for index, step in enumerate(each.turns):
            mine = {k[2]: r for k, r in found.items() if k[:2] == (each.id, index) and not k[3]}
            finals = {k[2]: r for k, r in found.items() if k[:2] == (each.id, index) and k[3]}
            closing = step.final
            if closing is not None:
                closing = closing.model_copy(
                    update={"answers": {**closing.answers, answer: finals}}
                )
            update = {"answers": {**step.answers, answer: mine}, "final": closing}
            turns.append(step.model_copy(update=update))
        fixtures.append(each.model_copy(update={"turns": turns}))
    if not found:
        raise InputError(f"--responses {folder}: no response files (FIXTURE.TURN.SURFACE.json)")
    return suite.model_copy(update={"fixtures": fixtures})


def _plain(message: str) -> str:
    """pydantic's message without its "Value error, " prefix for a validator's own words."""
    return message.removeprefix("Value error, ")
