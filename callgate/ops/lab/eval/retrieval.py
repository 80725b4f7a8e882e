"""How well ``Catalog.select`` finds the tool a request needs, and what it saves.

Over a suite in BFCL's format (read by ``callgate.ops.lab.eval.bfcl``: a questions file of
JSON lines ``{id, question, function}`` and its ``possible_answer`` file ``{id,
ground_truth: [{tool: {arg: [values]}}]}``), every
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
from callgate.ops.lab.eval import inputs
from callgate.ops.lab.eval.bfcl import (
    default_answers,
    functions,
    json_schema,
    read_lines,
    user_text,
)
from callgate.tools.registry import READ_ONLY, Catalog, ToolSpec
from callgate.tools.retrieval import Embed

KS = (1, 3, 5, 10)
ROLE = "eval"
APPROX_TOKENS = "words and punctuation marks of the definitions' JSON (regex \\w+|[^\\w\\s])"
_TOKEN = re.compile(r"\w+|[^\w\s]")


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


def load_bfcl(questions: Path, answers: Path | None = None, max_bytes: int | None = None) -> Suite:
    """A suite from BFCL's files (read by ``bfcl``, each within ``max_bytes``, default the
    setting); questions without a ground truth (irrelevance) are left out."""
    answers = answers or default_answers(questions)
    truth: dict[str, tuple[str, ...]] = {}
    for line in read_lines(answers, max_bytes):
        calls = line.doc.get("ground_truth")
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise line.fail("ground_truth", "must be a list of objects")
        truth[line.id] = tuple(dict.fromkeys(name for c in calls for name in c))
    specs: dict[str, ToolSpec] = {}
    asked: list[Question] = []
    for line in read_lines(questions, max_bytes):
        for f in functions(line):
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
        expected = truth.get(line.id)
        if expected:
            asked.append(Question(line.id, user_text(line), expected))
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
@inputs.max_file_bytes_option
def retrieval_cmd(
    questions: Path, answers: Path | None, ks: str, as_json: bool, max_bytes: int
) -> None:
    """Measure tool retrieval on a BFCL-format suite: recall@k of the expected tools and
    the tokens of tool definitions per request, every tool shown versus the top k."""
    measured = measure(load_bfcl(questions, answers, max_bytes), _ks(ks))
    if as_json:
        click.echo(json.dumps(measured.as_json(), indent=2))
    else:
        click.echo(report(measured))
