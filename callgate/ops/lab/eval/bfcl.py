"""BFCL's files (the Berkeley Function Calling Leaderboard), read; and a suite built from them.

The format (docs/eval.md, "Importing BFCL", cites its source): one JSON object a line.

- questions: ``{"id", "question": [[{"role", "content"}, ...]], "function": [{name,
  description, parameters}, ...]}``, ``parameters`` in BFCL's dialect of JSON Schema
  (``dict``, ``float``, ``tuple``, ``any`` for ``object``, ``number``, ``array``, no type);
- possible answers: ``{"id", "ground_truth": [{tool: {param: [acceptable values]}}]}``, ``""``
  among a parameter's values meaning it may be left out;
- a model's results: ``{"id", "result"}``, ``result`` a list of ``{tool: {param: value}}``
  (function-calling models; the arguments may be a JSON string) or a string of Python calls,
  ``"[get_weather(city='Seoul')]"`` (prompting models), decoded as BFCL decodes them
  (``bfcl_decode``; nothing in them runs).

The fixtures check what BFCL's ``ast_checker`` checks: the tool named as the model's
convention shows it, every argument against the possible answer and the function's own
definition, a parallel set matched greedily in BFCL's order. A Java or JavaScript function's
arguments are strings of source text, converted as BFCL converts them before that check
(``bfcl_decode.convert``); a relevance question expects any call at all.

``build`` is pure over the parsed lines; ``read_lines`` and ``write_suite`` do the I/O. Bad
input is one ``invalid_input`` error naming the file, the line and the field.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from callgate.core.errors import InputError
from callgate.ops.lab.eval import bfcl_decode, inputs
from callgate.ops.lab.eval.bfcl_decode import NESTED_TYPES, Language, Style
from callgate.ops.lab.eval.matchers import TYPES_BY_LANGUAGE
from callgate.ops.lab.eval.scoring import ANY_CALL
from callgate.producer.adapters.names import wire_name

# BFCL's parameter types that JSON Schema spells otherwise (BFCL converts them so too before
# showing the tools to a model).
_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
# BFCL's single-turn categories (v3 and v4 spellings) → the fixture's category. BFCL scores
# relevance and irrelevance with one runner, neither having possible answers, the one the
# other's inverse: live_relevance is read as irrelevance is (no possible answers), and its
# fixtures expect some call (RELEVANCE).
CATEGORIES = {
    "live_parallel_multiple": "parallel_multiple",
    "parallel_multiple": "parallel_multiple",
    "live_parallel": "parallel",
    "parallel": "parallel",
    "live_multiple": "multiple",
    "multiple": "multiple",
    "live_simple": "simple",
    "simple_python": "simple",
    "simple": "simple",
    "simple_javascript": "simple",
    "simple_java": "simple",
    "live_irrelevance": "irrelevance",
    "irrelevance": "irrelevance",
    "live_relevance": "irrelevance",
}
# BFCL's relevance categories: a pass is any call at all. Their fixtures are "multiple" ones
# (several functions offered) whose one expected call is ``scoring.ANY_CALL``.
RELEVANCE = {"live_relevance": "multiple"}
# The categories whose functions are Java or JavaScript: each argument is a string of source
# text, which BFCL converts to a value of the declared type before checking it.
LANGUAGES: dict[str, Language] = {"simple_java": "java", "simple_javascript": "javascript"}
ROLE = "bfcl"
PRINCIPAL = {"user_id": "bfcl-user", "tenant_id": "bfcl", "roles": [ROLE]}
STUBS = "tools.json"
SURFACE = "openai-chat"  # the surface recorded results are written on


@dataclass(frozen=True)
class Line:
    file: Path
    number: int
    doc: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.doc["id"])

    def fail(self, field: str, problem: str) -> InputError:
        return InputError(f"{self.file}:{self.number}: field {field}: {problem}")


def read_lines(path: Path, max_bytes: int | None = None) -> list[Line]:
    """A JSON-lines file of objects that each have a string ``id``, read within the caps of
    ``inputs`` (``max_bytes``, default the setting; nesting)."""
    text = inputs.read_text(path, max_bytes)
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        inputs.check_json_depth(raw, f"{path}:{number}")
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not doc["id"]:
            raise InputError(f"{path}:{number}: field id: each line is a JSON object with an id")
        lines.append(Line(path, number, doc))
    if not lines:
        raise InputError(f"{path}: no entries (one JSON object a line)")
    return lines


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


def user_text(line: Line) -> str:
    """The user's messages of an entry's first turn(s), joined."""
    turns = line.doc.get("question")
    if not isinstance(turns, list):
        raise line.fail("question", "must be a list of turns (lists of messages)")
    texts = [
        m["content"]
        for turn in turns
        for m in (turn if isinstance(turn, list) else [turn])
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
    ]
    if not texts:
        raise line.fail("question", "has no user message")
    return "\n".join(texts)


def functions(line: Line) -> list[dict[str, Any]]:
    """An entry's function docs, each with a name and a ``dict`` parameters schema."""
    found = line.doc.get("function")
    if isinstance(found, dict):
        found = [found]
    if not isinstance(found, list):  # [] offers nothing (some irrelevance questions)
        raise line.fail("function", "must be a list of function docs")
    for i, f in enumerate(found):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise line.fail(f"function[{i}].name", "every function needs a name")
        params = f.get("parameters", {"type": "dict", "properties": {}})
        if not isinstance(params, dict) or not isinstance(params.get("properties", {}), dict):
            raise line.fail(f"function[{i}].parameters", "must be an object with properties")
    return found


def default_answers(questions: Path) -> Path:
    """BFCL's layout: ``possible_answer/NAME`` beside the questions file ``NAME``."""
    return questions.parent / "possible_answer" / questions.name


def category_of(questions: Path, ids: Sequence[str], given: str | None = None) -> str:
    """BFCL's category: ``given``, else the file name's (``BFCL_v4_live_simple.json``), else
    the ids' (``parallel_multiple_3``); the longest name that fits wins."""
    if given is not None:
        if given not in CATEGORIES:
            raise InputError(f"--category {given!r}: expected one of {', '.join(CATEGORIES)}")
        return given
    stem = re.sub(r"^BFCL_v\d+_", "", questions.name.removesuffix(".json"))
    # A file is named after its category exactly; an id is the category and a number
    # (``simple_python_0``, ``live_simple_3-2-0``), so ``simple_java_0`` is no ``simple``.
    for name in sorted(CATEGORIES, key=len, reverse=True):
        if stem == name:
            return name
    for name in sorted(CATEGORIES, key=len, reverse=True):
        if ids and all(re.fullmatch(rf"{name}_\d[\w.-]*", i) for i in ids):
            return name
    unsupported = _unsupported(stem, ids)
    if unsupported is not None:
        name, why = unsupported
        raise InputError(
            f"{questions}: BFCL's {name} category cannot be imported ({why}); import-bfcl "
            f"takes {', '.join(CATEGORIES)}"
        )
    raise InputError(
        f"{questions}: cannot tell the BFCL category from the file name or the ids; give "
        f"--category, one of {', '.join(CATEGORIES)}"
    )


# BFCL's categories import-bfcl does not take, and why, for the message that refuses them.
UNSUPPORTED = {
    "multi_turn": "its questions run over several turns against BFCL's own stateful Python "
    "classes, which import-bfcl has no stub for",
    "memory": "it needs BFCL's memory backends",
    "web_search": "it needs live web search",
    "format_sensitivity": "it scores prompt formats, not calls",
}


def _unsupported(stem: str, ids: Sequence[str]) -> tuple[str, str] | None:
    for name, why in sorted(UNSUPPORTED.items(), key=lambda kv: -len(kv[0])):
        if stem == name or stem.startswith(f"{name}_"):
            return stem, why
        if ids and all(i.startswith(f"{name}_") for i in ids):
            return name, why
    return None


@dataclass(frozen=True)
class Imported:
    """A suite's content: its stub tools, its fixtures, and the recorded answers' name."""

    name: str
    category: str
    tools: list[dict[str, Any]]
    fixtures: list[dict[str, Any]]
    answer: str | None = None
    unanswered: list[str] = field(default_factory=list)  # fixtures the results left out
    style: Style = "prompt"  # the model's naming convention the suite's tools follow


def build(
    name: str,
    category: str,
    questions: Sequence[Line],
    answers: Sequence[Line],
    results: Sequence[Line] = (),
    answer: str | None = None,
    style: Style | None = None,
) -> Imported:
    """The suite for BFCL ``category``'s questions, possible answers and (optional) results.

    ``style`` is the model's convention (``bfcl_decode.Style``; default from the results,
    ``style_of``): its tools are named as such a model is shown them, and its results
    decoded as BFCL decodes that model's."""
    kind = CATEGORIES[category]
    language = LANGUAGES.get(category, "python")
    style = style or style_of(results)
    if language != "python" and answer is not None and style == "prompt":
        raise InputError(
            f"{results[0].file if results else '--results'}: BFCL reads a prompting model's "
            f"{category} answers with tree-sitter's {language} grammar, which import-bfcl does "
            "not carry; it takes a function-calling model's results (--model-style fc or "
            "fc-underscore)"
        )
    truth = {a.id: a for a in answers}
    given = {r.id: r for r in results}
    asked = {q.id for q in questions}
    for r in results:
        if r.id not in asked:
            raise r.fail("id", f"{r.id!r} is no question of {questions[0].file}")
    stubs: dict[str, dict[str, Any]] = {}
    fixtures: list[dict[str, Any]] = []
    unanswered: list[str] = []
    for q in questions:
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", q.id) or len(q.id) > 120:
            raise q.fail("id", f"{q.id!r} is not usable as a fixture id ([A-Za-z0-9][\\w.-]*)")
        docs = functions(q)
        names = {f["name"]: _stub_name(q, i, f, stubs, style, language) for i, f in enumerate(docs)}
        calls: list[dict[str, Any]] = []
        if category in RELEVANCE:
            calls = [{"name": ANY_CALL, "arguments": {}}]
        elif kind != "irrelevance":
            found = truth.get(q.id)
            if found is None:
                raise InputError(f"{answers[0].file if answers else '--answers'}: no entry {q.id}")
            calls = _expected(found, docs, names, language)
        turn: dict[str, Any] = {
            "answers": {},
            "calls": calls,
            # BFCL matches a parallel set greedily: each possible answer, in order, takes the
            # first call left that passes it (parallel_function_checker_no_order).
            "greedy": kind in ("parallel", "parallel_multiple"),
            "executor": {
                n: {"outcome": "succeeded", "always": True, "effects": 0} for n in names.values()
            },
        }
        if answer is not None:
            if q.id in given:
                response = _response(given[q.id], docs, names, answer, style)
                turn["answers"] = {answer: {SURFACE: response}}
            else:
                unanswered.append(q.id)
        fixtures.append(
            {
                "id": q.id,
                "category": RELEVANCE.get(category, kind),
                "request": user_text(q),
                "principal": PRINCIPAL,
                "tools": list(names.values()),
                "turns": [turn],
            }
        )
    return Imported(name, category, list(stubs.values()), fixtures, answer, unanswered, style)


def _stub_name(
    line: Line,
    index: int,
    doc: Mapping[str, Any],
    stubs: dict[str, dict[str, Any]],
    style: Style,
    language: Language = "python",
) -> str:
    """The suite's name for a function doc: the name a model of ``style`` is shown
    (``math_hypot`` for an underscore_to_dot FC model), unless another entry defined that
    name differently (one registry serves the suite): then ``NAME__2`` and on."""
    where = f"function[{index}].parameters"
    doc = shown_to_model(doc, language)
    schema = json_schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise line.fail(where, f"not a usable schema once converted ({exc.message})") from None
    shown = bfcl_decode.visible_name(doc["name"], style)
    definition = {
        "name": shown,
        "description": str(doc.get("description", "")),
        "parameters": schema,
    }
    n = 1
    while True:
        candidate = shown if n == 1 else f"{shown}__{n}"
        known = stubs.get(candidate)
        if known is None:
            stubs[candidate] = {**definition, "name": candidate}
            return candidate
        if {**known, "name": shown} == definition:
            return candidate
        n += 1


def shown_to_model(doc: Mapping[str, Any], language: Language) -> dict[str, Any]:
    """A Java or JavaScript function as BFCL shows it to a model
    (``_func_doc_language_specific_pre_processing``): every parameter a string of source text,
    its declared type (and an array's item type, an object's entries) told in its
    description; a Python function as defined."""
    if language == "python":
        return dict(doc)
    shown: dict[str, Any] = json.loads(
        json.dumps(doc)
    )  # a deep copy: the question's own doc is not touched
    name = "Java 8 SDK" if language == "java" else "JavaScript"
    shown["description"] = (
        f"{shown.get('description', '')} Note that the provided function is in {name} syntax."
    )
    props = (shown.get("parameters") or {}).get("properties") or {}
    for param in props.values():
        if isinstance(param, dict):
            _as_source_text(param, "Java" if language == "java" else "JavaScript")
    return shown


def _as_source_text(param: dict[str, Any], language: str) -> None:
    kind = param.get("type")
    text = str(param.get("description", ""))
    if kind == "any":
        text += f" This parameter can be of any type of {language} object in string representation."
    else:
        text += f" This is {language} {kind} type parameter in string representation."
    if kind in NESTED_TYPES and isinstance(param.get("items"), dict):
        item = param.pop("items").get("type")
        text += f" The list elements are of type {item}; they are not in string representation."
    if language == "JavaScript" and kind == "dict" and "properties" in param:
        text += (
            " The dictionary entries have the following schema; they are not in string "
            f"representation. {json.dumps(param.pop('properties'))}"
        )
    param["description"] = text
    param["type"] = "string"


def _expected(
    found: Line,
    docs: Sequence[Mapping[str, Any]],
    names: Mapping[str, str],
    language: Language = "python",
) -> list[dict[str, Any]]:
    truth = found.doc.get("ground_truth")
    if not isinstance(truth, list) or not truth:
        raise found.fail("ground_truth", "must be a non-empty list of {tool: {param: [values]}}")
    by_name = {d["name"]: d for d in docs}
    calls = []
    for i, call in enumerate(truth):
        if not isinstance(call, dict) or len(call) != 1:
            raise found.fail(f"ground_truth[{i}]", "must be one {tool: {param: [values]}}")
        tool, params = next(iter(call.items()))
        doc = by_name.get(tool)
        if doc is None:
            raise found.fail(f"ground_truth[{i}]", f"{tool!r} is no function of the question")
        if not isinstance(params, dict):
            raise found.fail(f"ground_truth[{i}].{tool}", "must map each param to its values")
        schema = doc.get("parameters") or {}
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        arguments = {}
        for param, values in params.items():
            where = f"ground_truth[{i}].{tool}.{param}"
            if not isinstance(values, list):  # [] accepts nothing: BFCL's data has a few
                raise found.fail(where, "must be a list of acceptable values")
            arguments[param] = {
                "bfcl": _spec(found, where, param, props, values, required, language)
            }
            if param not in props:
                # BFCL checks a given argument against the definition too: one the function
                # does not declare fails, whatever the possible answer lists.
                arguments[param]["bfcl"]["declared"] = False
        for param in sorted(required - set(params)):
            # Required by the definition, absent from the possible answer: BFCL fails the
            # call whether it is left out (missing) or given (not in the answer).
            where = f"ground_truth[{i}].{tool}.{param}"
            arguments[param] = {"bfcl": _spec(found, where, param, props, [], required, language)}
        calls.append({"name": names[tool], "arguments": arguments})
    return calls


def _spec(
    found: Line,
    where: str,
    param: str,
    props: Mapping[str, Any],
    values: list[Any],
    required: set[str],
    language: Language = "python",
) -> dict[str, Any]:
    """A ``bfcl`` matcher: the type the definition declares, BFCL's acceptable values."""
    doc = props.get(param)
    declared: dict[str, Any] = doc if isinstance(doc, dict) else {}
    kind = declared.get("type", "any")
    types = TYPES_BY_LANGUAGE[language]
    if kind not in types:
        raise found.fail(where, f"type {kind!r} is not one of BFCL's {language} types")
    items = (declared.get("items") or {}).get("type")
    spec: dict[str, Any] = {"type": kind, "values": values}
    if language != "python":
        spec["language"] = language
        if kind in NESTED_TYPES:
            if items not in types:  # BFCL's checker fails on it (KeyError)
                raise found.fail(where, f"{kind} needs an item type of BFCL's {language} types")
            spec["items"] = items
    elif kind in ("array", "tuple") and items in types:
        spec["items"] = items
    if param in required:
        spec["required"] = True
    return spec


# A model's recorded results ------------------------------------------------------------


def style_of(results: Sequence[Line]) -> Style:
    """The convention of a result file whose model's was not given: a file with any list of
    calls is a function-calling model's, taken to write names as BFCL's ``underscore_to_dot``
    models do (most of BFCL's FC configurations, OpenAI, Claude and Gemini among them); a
    file of strings only is a prompting model's."""
    if any(isinstance(r.doc.get("result"), list) for r in results):
        return "fc-underscore"
    return "prompt"


def _response(
    result: Line,
    docs: Sequence[Mapping[str, Any]],
    names: Mapping[str, str],
    model: str,
    style: Style,
) -> dict[str, Any]:
    """The result as an openai-chat completion: the calls BFCL's decoder finds in it as
    tool_calls, or, where it finds none, its text (no call)."""
    raw = result.doc.get("result")
    if not isinstance(raw, str | list):
        raise result.fail("result", "must be a list of calls or a string of Python calls")
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            for func, args in item.items() if isinstance(item, dict) else ():
                if isinstance(args, str):  # bounded before BFCL's json.loads reads it
                    inputs.check_json_depth(
                        args, f"{result.file}:{result.number}: field result[{i}].{func}"
                    )
    calls = bfcl_decode.decode(raw, style)
    by_visible = {bfcl_decode.visible_name(d["name"], style): d for d in docs}
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if calls:
        tool_calls = []
        for i, (func, args) in enumerate(calls, 1):
            doc = by_visible.get(func)
            declared = ((doc.get("parameters") or {}).get("properties") or {}) if doc else {}
            # A name the model's convention does not give any offered function stays as
            # written, so it is a tool the model was not shown (BFCL: wrong function name);
            # an empty one (``a[0](x=1)``) is shown as the callee's text.
            tool = names[doc["name"]] if doc else func or "(no name)"
            tool_calls.append(
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": wire_name(SURFACE, tool, check_length=False),
                        "arguments": json.dumps(
                            bfcl_decode.arguments_json(args, declared), ensure_ascii=False
                        ),
                    },
                }
            )
        message["tool_calls"] = tool_calls
    else:
        message["content"] = raw if isinstance(raw, str) else json.dumps(raw)
    return {
        "id": f"chatcmpl-bfcl-{result.id}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
    }


# The suite on disk ---------------------------------------------------------------------


def suite_config(imported: Imported) -> dict[str, Any]:
    return {
        "name": imported.name,
        "description": f"imported from BFCL's {imported.category} category",
        "tools": "callgate.ops.lab.eval.stubs:registry",
        "doubles": "callgate.ops.lab.eval.stubs",
        "stubs": STUBS,
    }


def write_suite(imported: Imported, out: Path) -> None:
    """Write the suite folder: in a temporary folder beside ``out``, renamed into place at
    the end, so a failure leaves nothing half-written. An existing ``out`` is refused."""
    import yaml

    if out.exists() or out.is_symlink():
        raise InputError(f"--out {out}: already exists; remove it or name another folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    try:
        (tmp / "suite.yaml").write_text(
            "# Imported by callgate eval import-bfcl (docs/eval.md, Importing BFCL).\n"
            + yaml.safe_dump(suite_config(imported), sort_keys=False, allow_unicode=True),
            encoding="utf-8",
        )
        (tmp / STUBS).write_text(
            json.dumps(imported.tools, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        (tmp / "fixtures").mkdir()
        for doc in imported.fixtures:
            (tmp / "fixtures" / f"{doc['id']}.yaml").write_text(
                yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8"
            )
        os.replace(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise InputError(
                f"--out {out}: cannot write the suite there ({exc.strerror or exc})"
            ) from None
        raise
