"""``callgate eval run``, ``compare``, ``import-bfcl`` and ``bfcl-multi-turn`` (an entry point
of ``callgate.commands``).

``run`` exits 0 once the report is written, whatever it says (compare it with a baseline to
gate CI); ``compare`` exits 1 on a regression, 0 otherwise. Bad input is one line,
``callgate: <code>: <message>``, and exit 2.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import click

from callgate.core.errors import InputError
from callgate.ops import lifeline
from callgate.ops.cli.common import load_settings
from callgate.ops.flags import setting_option
from callgate.ops.lab.eval import (
    bfcl,
    bfcl_decode,
    bfcl_multi_turn,
    bfcl_multi_turn_backend,
    bfcl_multi_turn_decode,
    bfcl_multi_turn_report,
    inputs,
    retrieval,
)
from callgate.ops.lab.eval import compare as comparing
from callgate.ops.lab.eval import report as reporting
from callgate.ops.lab.eval.fixture import SURFACES, load_suite, with_responses
from callgate.ops.lab.eval.runner import Options, run_suite

EXIT_REGRESSION = 1


@click.group("eval")
def eval_group() -> None:
    """Score a model's tool calls and callgate's execution of them, apart (docs/eval.md)."""


# How long `run` and `bfcl-multi-turn` wait for their workers to start.
start_timeout_option = setting_option(
    "--start-timeout",
    "start_seconds",
    variable="CALLGATE_EVAL_START_SECONDS",
    type=click.FloatRange(min=0.01),
    help="Seconds to wait for the workers to start.",
)


@eval_group.command("run")
@click.argument("suite", default="builtin")
@click.option(
    "--surface",
    "surfaces",
    multiple=True,
    type=click.Choice(SURFACES),
    help="Only the recorded answers on this surface (repeatable; default: all).",
)
@click.option(
    "--answers",
    "answers",
    multiple=True,
    help="The answer set to score, e.g. good or bad (repeatable; default: good).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("eval-report"),
    show_default=True,
    help="Folder for eval-ANSWERS.json, .md and .html.",
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1, max=16))
@click.option(
    "--tools",
    default=None,
    help="module:attribute of another registry for the suite's tools (a double of your own).",
)
@click.option(
    "--responses",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    default=None,
    help="Score the responses recorded in this folder (FIXTURE.TURN.SURFACE.json) instead "
    "of the fixtures' own; the report is named after the folder.",
)
@click.option(
    "--live",
    "live",
    metavar="MODEL",
    default=None,
    help="Ask MODEL through the provider's SDK (key from the environment) on the one "
    "--surface given, instead of the recorded answers; the report is named after MODEL.",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the scratch data so the report's trace ids work with `callgate trace`: the "
    "scratch database's URL is printed, or the embedded services' data stays in OUT/data.",
)
@start_timeout_option
@inputs.max_file_bytes_option
def run_cmd(
    suite: str,
    surfaces: tuple[str, ...],
    answers: tuple[str, ...],
    out: Path,
    workers: int,
    tools: str | None,
    responses: Path | None,
    live: str | None,
    keep: bool,
    start_seconds: float,
    max_bytes: int,
) -> None:
    """Run SUITE (a folder, or builtin) through the real pipeline on scratch services.

    Running a suite runs its code: the tools and doubles modules its suite.yaml names are
    Python, imported by this command and its workers with your privileges. Run only suites
    you trust. A suite may name only modules in its own folder (or callgate's stubs); any
    other is refused before it is imported.

    Uses embedded PostgreSQL and Redis (the demo extra) unless CALLGATE_DATABASE_URL /
    CALLGATE_REDIS_URL are set: then a scratch database beside the configured one (dropped
    afterwards) and queues of its own. Prints the model's and the executor's tables.
    """
    loaded = load_suite(Path(suite), max_bytes)
    if live is not None:
        if answers or responses is not None:
            raise InputError("--live answers itself: leave out --answers and --responses")
        answers = (live,)
    if responses is not None:
        if answers:
            raise InputError("--responses names the answers itself: leave out --answers")
        answers = (responses.resolve().name,)
        loaded = with_responses(loaded, responses, answers[0], max_bytes)
    options = Options(
        answers=answers or ("good",),
        surfaces=frozenset(surfaces) if surfaces else None,
        workers=workers,
        tools=tools,
        log_path=str(out / "eval-processes.log"),
        keep=(out / "data").resolve() if keep else None,
        live=live,
        start_seconds=start_seconds,
        max_bytes=max_bytes,
    )
    command = " ".join(["callgate", "eval", "run", *sys.argv[3:]]) if len(sys.argv) > 2 else ""
    _writable(out)  # before a minute of running, not after
    with lifeline.unwind_on_signals():  # SIGTERM/SIGHUP: stop the stack, drop the scratch data
        runs = run_suite(load_settings(), loaded, options, sys.stderr)
    for run in runs:
        doc = reporting.build(
            loaded.config.name, run.answer, run.turns, command=command, seconds=run.seconds
        )
        try:
            paths = reporting.write(doc, out)
        except OSError as exc:
            raise InputError(f"--out {out}: cannot write the report ({exc.strerror})") from None
        click.echo(f"== {loaded.config.name}: {run.answer} answers ==")
        click.echo(reporting.tables(doc))
        click.echo("wrote " + ", ".join(str(p) for p in paths))


@eval_group.command("compare")
@click.argument("base", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("new", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--threshold",
    default=0.02,
    show_default=True,
    type=click.FloatRange(min=0, max=1),
    help="A rate that moves the wrong way by more than this is a regression.",
)
@click.option(
    "--factor",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="An error rate at this many times a non-zero baseline is a regression.",
)
@inputs.max_file_bytes_option
def compare_cmd(base: Path, new: Path, threshold: float, factor: float, max_bytes: int) -> None:
    """Each metric's change from BASE to NEW (report JSON files); exit 1 on a regression."""
    old_doc, new_doc = _report(base, max_bytes), _report(new, max_bytes)
    changes = comparing.compare(old_doc, new_doc, threshold=threshold, factor=factor)
    click.echo(comparing.render(changes), nl=False)
    if any(c.regression for c in changes):
        sys.exit(EXIT_REGRESSION)


def _writable(out: Path) -> None:
    """``out`` made, and a file written in it, or one ``invalid_input`` line saying why not."""
    if out.is_symlink() and not out.exists():
        raise InputError(f"--out {out}: a symbolic link to nothing ({out.readlink()})")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


def _report(path: Path, max_bytes: int) -> dict[str, object]:
    text = inputs.read_text(path, max_bytes)
    inputs.check_json_depth(text, str(path))
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        raise InputError(f"{path}: not a JSON report of callgate eval run") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a JSON report of callgate eval run")
    return doc


@eval_group.command("import-bfcl")
@click.argument("questions", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--answers",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="BFCL's possible-answer file (default: possible_answer/NAME beside QUESTIONS; "
    "irrelevance needs none).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="The suite folder to write (default: bfcl-CATEGORY); it must not exist yet.",
)
@click.option(
    "--results",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A model's BFCL result file ({id, result} lines): recorded as each fixture's "
    "openai-chat answer, named after the file (or --name).",
)
@click.option("--name", "answer", default=None, help="The answer set --results becomes.")
@click.option(
    "--category",
    type=click.Choice(sorted(bfcl.CATEGORIES)),
    default=None,
    help="BFCL's category, when neither the file name nor the ids say it.",
)
@click.option(
    "--model-style",
    "style",
    type=click.Choice(["auto", *bfcl_decode.STYLES]),
    default="auto",
    show_default=True,
    help="The model's convention, as BFCL scores it: fc-underscore (function calling, "
    "underscore_to_dot: writes math_hypot for math.hypot; OpenAI, Claude, Gemini), fc "
    "(function calling, names as defined), prompt (Python calls in text); auto: "
    "fc-underscore if --results has any list of calls, else prompt.",
)
@inputs.max_file_bytes_option
def import_bfcl_cmd(
    questions: Path,
    answers: Path | None,
    out: Path | None,
    results: Path | None,
    answer: str | None,
    category: str | None,
    style: str,
    max_bytes: int,
) -> None:
    """Turn BFCL question (and possible-answer) files into a suite of read-only stub tools
    that `callgate eval run` scores the way BFCL's AST checker does (docs/eval.md)."""
    asked = bfcl.read_lines(questions, max_bytes)
    if bfcl_multi_turn.is_multi_turn(questions, [q.id for q in asked]):
        # Its entries run against BFCL's stateful classes, not stubs: there is no suite to write.
        raise InputError(
            f"{questions}: a multi-turn file is not imported; score a model's results on it "
            f"with: callgate eval bfcl-multi-turn {questions} RESULTS"
        )
    found = category or bfcl.category_of(questions, [q.id for q in asked])
    kind = bfcl.CATEGORIES[found]
    truth: list[bfcl.Line] = []
    if kind != "irrelevance":
        truth = bfcl.read_lines(answers or bfcl.default_answers(questions), max_bytes)
    recorded: list[bfcl.Line] = []
    if results is not None:
        recorded = bfcl.read_lines(results, max_bytes)
        answer = answer or re.sub(r"[^\w.-]", "-", results.name.removesuffix(".json"))
    elif answer is not None:
        raise InputError("--name names the answers of --results: give --results too")
    if answer is not None and not re.fullmatch(r"[\w.-]{1,120}", answer):
        raise InputError(f"--name {answer!r}: letters, digits, '_', '.' and '-' only")
    target = out or Path(f"bfcl-{found.replace('_', '-')}")
    chosen = next((s for s in bfcl_decode.STYLES if s == style), None)  # None: auto
    imported = bfcl.build(target.name, found, asked, truth, recorded, answer, chosen)
    bfcl.write_suite(imported, target)
    click.echo(
        f"wrote {target}: {len(imported.fixtures)} fixtures ({found}), "
        f"{len(imported.tools)} read-only stub tools (named for --model-style "
        f"{imported.style})"
    )
    if answer is not None:
        if imported.unanswered:
            click.echo(f"{len(imported.unanswered)} questions have no result: not scored")
        click.echo(f"score it: callgate eval run {target} --answers {answer}")
    else:
        click.echo(
            f"score a model: callgate eval run {target} --responses DIR "
            "(or --live MODEL --surface S)"
        )


@eval_group.command("bfcl-multi-turn")
@click.argument("questions", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("results", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--answers",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="BFCL's ground-truth file (default: possible_answer/NAME beside QUESTIONS).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("bfcl-multi-turn"),
    show_default=True,
    help="Folder for bfcl-multi-turn.json and .md.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="The first N entries.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1, max=16))
@click.option(
    "--bfcl",
    "bfcl_path",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="An unzipped bfcl-eval wheel (default: the installed bfcl_eval package).",
)
@click.option(
    "--model-style",
    "style",
    type=click.Choice(["auto", *bfcl_multi_turn_decode.STYLES]),
    default="auto",
    show_default=True,
    help="How BFCL decodes the model's steps: fc (function calling: lists of {name: "
    "arguments}), prompt (Python calls in text); auto: the one the file is written in "
    "(a file holding both is refused).",
)
@start_timeout_option
@inputs.max_file_bytes_option
def bfcl_multi_turn_cmd(
    questions: Path,
    results: Path,
    answers: Path | None,
    out: Path,
    limit: int | None,
    workers: int,
    bfcl_path: Path | None,
    style: str,
    start_seconds: float,
    max_bytes: int,
) -> None:
    """Replay a model's BFCL multi-turn RESULTS for QUESTIONS through real workers against
    BFCL's own backend classes; print BFCL's verdicts and the executor check
    (docs/bfcl-multi-turn.md). Needs bfcl-eval: pip install bfcl-eval --no-deps."""
    entries, unanswered = bfcl_multi_turn.read_entries(
        questions, results, answers, limit, max_bytes
    )
    bfcl_multi_turn_backend.use(bfcl_path)  # before anything starts: one line if missing
    decoded_style, warning = bfcl_multi_turn.model_style(entries, style)
    if warning:
        click.echo(f"callgate eval: warning: {warning}", err=True)
    _writable(out)
    options = bfcl_multi_turn.Options(
        bfcl=bfcl_path,
        workers=workers,
        log_path=str(out / "bfcl-multi-turn-processes.log"),
        start_seconds=start_seconds,
        style=decoded_style,
    )
    with lifeline.unwind_on_signals():  # SIGTERM/SIGHUP: stop the stack, drop the scratch data
        runs = bfcl_multi_turn.run(load_settings(), entries, options, sys.stderr)
    command = " ".join(["callgate", "eval", *sys.argv[2:]]) if len(sys.argv) > 2 else ""
    try:
        paths = bfcl_multi_turn_report.write(runs, out, command)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write the report ({exc.strerror})") from None
    click.echo(bfcl_multi_turn_report.tables(runs), nl=False)
    if unanswered:
        click.echo(f"{len(unanswered)} questions have no result: not scored")
    click.echo("wrote " + ", ".join(str(p) for p in paths))


eval_group.add_command(retrieval.retrieval_cmd)
