"""How well ``Catalog.select`` finds the tool a request needs, and what it saves.

Over a suite in BFCL's format (a questions file of JSON lines ``{id, question, function}``
and its ``possible_answer`` file ``{id, ground_truth: [{tool: {arg: [values]}}]}``), every
question's tools join one catalog (the first definition of a name wins), each question is
the query, and its ground-truth tools are the expected ones. Reported: recall@k (the share
of a question's expected tools among the first k, averaged over questions) and the tokens of
tool definitions a request carries with every tool shown versus only the top k.

Tokens are approximated offline, without a model's tokenizer: one token per word (a run of
letters or digits) and one per other non-space character of the definitions' JSON
(``APPROX_TOKENS``). Real tokenizers split long words further, so the absolute numbers run
low; the ratio between all tools and the top k is what the measurement is for.

Lab side: nothing in the product imports this module. ``retrieval_cmd`` is
``callgate eval retrieval``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from callgate.core.errors import InputError
from callgate.tools.registry import READ_ONLY, Catalog, ToolSpec
from callgate.tools.retrieval import Embed

KS = (1, 3, 5, 10)
ROLE = "eval"
APPROX_TOKENS = "words and punctuation marks of the definitions' JSON (regex \\w+|[^\\w\\s])"
_TOKEN = re.compile(r"\w+|[^\w\s]")
# BFCL's parameter types that JSON Schema spells otherwise (BFCL converts them so too before
# showing the tools to a model).
_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def recall_at_k(expected: Collection[str], ranked: Sequence[str], k: int) -> float:
    """The share of ``expected`` found among the first ``k`` of ``ranked``."""
    if not expected:
        raise ValueError("recall needs at least one expected tool")
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    return len(set(expected) & set(ranked[:k])) / len(set(expected))


def approx_tokens(text: str) -> int:
    """Tokens, approximately (``APPROX_TOKENS``): no tokenizer, no network."""
    return len(_TOKEN.findall(text))


def definitions_tokens(definitions: Iterable[Mapping[str, Any]]) -> int:
    return approx_tokens(json.dumps(list(definitions), ensure_ascii=False))


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    expected: tuple[str, ...]


@dataclass(frozen=True)
class Suite:
    catalog: Catalog
    questions: tuple[Question, ...]


def json_schema(parameters: Any) -> Any:
    """BFCL's parameter schema as JSON Schema: ``dict`` → ``object``, ``float`` →
    ``number``, ``tuple`` → ``array``, ``any`` → no type; the rest as written."""
    if isinstance(parameters, list):
        return [json_schema(p) for p in parameters]
    if not isinstance(parameters, Mapping):
        return parameters
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if key == "type" and isinstance(value, str) and value in _JSON_TYPES:
            if _JSON_TYPES[value] is not None:
                out[key] = _JSON_TYPES[value]
        elif key == "properties" and isinstance(value, Mapping):
            out[key] = {name: json_schema(sub) for name, sub in value.items()}
        else:
            out[key] = json_schema(value)
    return out


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise InputError(f"{path}:{number}: an entry is a JSON object with an id")
        entries.append(entry)
    return entries


def _user_text(entry: Mapping[str, Any], where: str) -> str:
    turns = entry.get("question")
    if not isinstance(turns, list):
        raise InputError(f"{where}: question must be a list of turns")
    texts = [
        m["content"]
        for turn in turns
        for m in (turn if isinstance(turn, list) else [])
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
    ]
    if not texts:
        raise InputError(f"{where}: question has no user message")
    return "\n".join(texts)


def default_answers(questions: Path) -> Path:
    """BFCL's layout: ``possible_answer/NAME`` beside the questions file ``NAME``."""
    return questions.parent / "possible_answer" / questions.name


def load_bfcl(questions: Path, answers: Path | None = None) -> Suite:
    """A suite from BFCL's files; questions without a ground truth (irrelevance) are left out."""
    answers = answers or default_answers(questions)
    truth: dict[str, tuple[str, ...]] = {}
    for entry in _lines(answers):
        calls = entry.get("ground_truth")
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise InputError(f"{answers}: {entry['id']}: ground_truth must be a list of objects")
        truth[entry["id"]] = tuple(dict.fromkeys(name for c in calls for name in c))
    specs: dict[str, ToolSpec] = {}
    asked: list[Question] = []
    for entry in _lines(questions):
        where = f"{questions}: {entry['id']}"
        functions = entry.get("function")
        if not isinstance(functions, list):
            raise InputError(f"{where}: function must be a list of tool definitions")
        for f in functions:
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                raise InputError(f"{where}: every function needs a name")
            specs.setdefault(
                f["name"],
                ToolSpec(
                    name=f["name"],
                    description=str(f.get("description", "")),
                    arguments=json_schema(f.get("parameters", {"type": "dict"})),
                    kind="read",
                    effect=READ_ONLY,
                ),
            )
        expected = truth.get(entry["id"])
        if expected:
            asked.append(Question(entry["id"], _user_text(entry, where), expected))
    unknown = sorted({n for q in asked for n in q.expected} - specs.keys())
    if unknown:
        raise InputError(f"{answers}: expected tools no question offers: {unknown}")
    catalog = Catalog.of_specs(specs.values(), {ROLE: list(specs)})
    return Suite(catalog, tuple(asked))


@dataclass(frozen=True)
class Measured:
    tools: int
    questions: int
    recall: dict[int, float]
    # Tokens of tool definitions per request: every tool, and the mean over questions of
    # the top k's.
    tokens_all: int
    tokens_top: dict[int, float]
    token_count: str = APPROX_TOKENS
    misses: dict[int, list[str]] = field(default_factory=dict)  # question ids, per k

    def saving(self, k: int) -> float:
        return 1 - self.tokens_top[k] / self.tokens_all

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["saving"] = {k: round(self.saving(k), 4) for k in self.tokens_top}
        return doc


def measure(suite: Suite, ks: Sequence[int] = KS, *, embed: Embed | None = None) -> Measured:
    """Recall@k and tokens per request over the suite, each question ranked among every
    tool of the suite."""
    if not suite.questions:
        raise InputError("the suite has no question with an expected tool")
    catalog = suite.catalog
    everything = catalog.definitions_for([ROLE])
    deepest = max(ks)
    recall = {k: 0.0 for k in ks}
    tokens = {k: 0.0 for k in ks}
    misses: dict[int, list[str]] = {k: [] for k in ks}
    for q in suite.questions:
        chosen = catalog.select(q.text, [ROLE], deepest, embed=embed)
        names = [t.name for t in chosen]
        for k in ks:
            found = recall_at_k(q.expected, names, k)
            recall[k] += found
            if found < 1:
                misses[k].append(q.id)
            tokens[k] += definitions_tokens(t.definition() for t in chosen[:k])
    n = len(suite.questions)
    return Measured(
        tools=len(catalog.tools),
        questions=n,
        recall={k: recall[k] / n for k in ks},
        tokens_all=definitions_tokens(everything),
        tokens_top={k: tokens[k] / n for k in ks},
        misses=misses,
    )


def report(m: Measured) -> str:
    lines = [
        f"{m.questions} questions, {m.tools} tools; tokens counted as {m.token_count}",
        f"every tool shown: {m.tokens_all} tokens of tool definitions per request",
        "",
        f"{'k':>4}  {'recall@k':>8}  {'tokens/request':>14}  {'saving':>7}",
    ]
    for k in m.recall:
        lines.append(f"{k:>4}  {m.recall[k]:>8.3f}  {m.tokens_top[k]:>14.0f}  {m.saving(k):>7.1%}")
    return "\n".join(lines)


def _ks(value: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give whole numbers, e.g. 1,3,5,10") from None
    if not ks or ks[0] < 1:
        raise click.BadParameter(f"{value!r}: each k is at least 1")
    return ks


@click.command("retrieval")
@click.argument("questions", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--answers",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="BFCL's possible-answer file (default: possible_answer/NAME beside QUESTIONS).",
)
@click.option("--k", "ks", default="1,3,5,10", show_default=True, help="The k of recall@k.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def retrieval_cmd(questions: Path, answers: Path | None, ks: str, as_json: bool) -> None:
    """Measure tool retrieval on a BFCL-format suite: recall@k of the expected tools and
    the tokens of tool definitions per request, every tool shown versus the top k."""
    measured = measure(load_bfcl(questions, answers), _ks(ks))
    if as_json:
        click.echo(json.dumps(measured.as_json(), indent=2))
    else:
        click.echo(report(measured))
