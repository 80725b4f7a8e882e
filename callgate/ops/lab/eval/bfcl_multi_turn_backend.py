"""BFCL's multi-turn backend classes and checker, taken from the ``bfcl-eval`` package.

``bfcl-eval`` is not a dependency of callgate: its checker and its backend classes need none
of its heavy dependencies (model SDKs, torch), so it is installed with ``--no-deps``, or an
unzipped wheel is named with ``--bfcl DIR``. Only the modules named here are imported:
``multi_turn_checker`` and ``multi_turn_utils`` (which import nothing else of BFCL but its
backend table) and the backend classes an entry involves. ``MathAPI`` needs ``mpmath``;
an entry whose class cannot be imported is skipped with the reason.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from callgate.core.errors import ConfigurationError
from callgate.ops.lab.eval import bfcl_decode
from callgate.ops.lab.eval import bfcl_multi_turn_decode as decode

PACKAGE = "bfcl_eval"
BACKENDS = f"{PACKAGE}.eval_checker.multi_turn_eval.func_source_code"
CHECKER = f"{PACKAGE}.eval_checker.multi_turn_eval.multi_turn_checker"
UTILS = f"{PACKAGE}.eval_checker.multi_turn_eval.multi_turn_utils"
ENUMS = f"{PACKAGE}.constants.enums"
HANDLER_UTILS = ("model_handler", "utils.py")
# BFCL's decoders of a model's answer into call strings (bfcl_eval/model_handler/utils.py).
DECODERS = frozenset(
    {
        "ast_parse",
        "resolve_ast_call",
        "resolve_ast_by_type",
        "parse_nested_value",
        "decoded_output_to_execution_list",
        "default_decode_execute_prompting",
        "convert_to_function_call",
    }
)
INSTALL = "pip install bfcl-eval --no-deps"

# class → (its module under BACKENDS, its function doc under data/multi_turn_func_doc)
CLASSES: dict[str, tuple[str, str]] = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
# BFCL loads no scenario into these (executable_backend_config.STATELESS_CLASSES).
STATELESS = frozenset({"MathAPI"})


def use(path: Path | None) -> None:
    """Make ``bfcl_eval`` importable: from ``path`` (an unzipped wheel) when given, else as
    installed; ``invalid_configuration`` naming the install command when it is not."""
    if path is not None:
        if not (path / PACKAGE / "__init__.py").is_file():
            raise ConfigurationError(
                f"--bfcl {path}: no {PACKAGE} package in it (unzip bfcl-eval's wheel there, "
                f"or {INSTALL})"
            )
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    try:
        importlib.import_module(CHECKER)
    except ImportError as exc:
        raise ConfigurationError(
            f"BFCL's multi-turn checker is not importable ({exc}): {INSTALL}, or give "
            "--bfcl DIR (an unzipped bfcl-eval wheel)"
        ) from None
    decoders()
    _check_refusal()


def _check_refusal() -> None:
    """The guard's stand-in for a refused call must be answered by BFCL's deny list, before
    its ``eval``: a BFCL that no longer does so is not used."""
    answered, _ = utils().execute_multi_turn_func_call(
        func_call_list=[decode.REFUSED],
        initial_config={},
        involved_classes=[],
        model_name="callgate_probe",
        test_entry_id="probe",
    )
    if answered != [decode.REFUSED_RESPONSE]:
        raise ConfigurationError(
            f"this bfcl-eval answers {decode.REFUSED!r} with {answered!r}, not with its deny "
            "list's error: callgate refuses to score with it (bfcl-eval 2026.3.23 does)"
        )


@cache
def decoders() -> decode.Decoders:
    """BFCL's own decoders, taken by name from its source file: importing the module would
    import tree-sitter for Java and JavaScript, which multi-turn (Python only) never uses.
    Their namespace's ``eval`` (BFCL evaluates arithmetic in an argument with it) is
    callgate's evaluator of literal arithmetic, which runs nothing of the model's."""
    path = root() / PACKAGE / Path(*HANDLER_UTILS)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        enums = importlib.import_module(ENUMS)
    except (OSError, SyntaxError, ImportError) as exc:
        raise ConfigurationError(f"BFCL's decoders cannot be read from {path}: {exc}") from None
    namespace: dict[str, Any] = {
        "ast": ast,
        "json": json,
        "re": re,
        "ReturnFormat": enums.ReturnFormat,
        "eval": bfcl_decode.arithmetic,
    }
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in DECODERS]
    missing = DECODERS - {n.name for n in found}
    if missing:
        raise ConfigurationError(f"{path} has no {', '.join(sorted(missing))}: not bfcl-eval?")
    for node in found:
        node.decorator_list = []  # none of them has one; nothing else runs at definition
        exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return decode.Decoders(
        fc=namespace["convert_to_function_call"],
        prompt=namespace["default_decode_execute_prompting"],
        is_empty=utils().is_empty_execute_response,
    )


def methods(classes: list[str]) -> frozenset[str]:
    """The names BFCL's executor binds to the entry's instances: every public method, as
    ``execute_multi_turn_func_call`` lists them (``inspect.getmembers``)."""
    found: set[str] = set()
    for class_name in classes:
        instance = getattr(module_of(class_name), class_name)()
        found |= {
            name
            for name, _ in inspect.getmembers(instance, predicate=inspect.ismethod)
            if not name.startswith("_")
        }
    return frozenset(found)


def root() -> Path:
    """The folder holding the ``bfcl_eval`` package: the workers get it on PYTHONPATH."""
    module = importlib.import_module(PACKAGE)
    return Path(str(module.__file__)).resolve().parent.parent


def checker() -> Any:
    return importlib.import_module(CHECKER)


def utils() -> Any:
    return importlib.import_module(UTILS)


@cache
def function_docs(class_name: str) -> list[dict[str, Any]]:
    """BFCL's function docs of one class (one JSON object a line), as it shows them to models."""
    docs = root() / PACKAGE / "data" / "multi_turn_func_doc" / CLASSES[class_name][1]
    return [json.loads(line) for line in docs.read_text().splitlines() if line.strip()]


def module_of(class_name: str) -> ModuleType:
    return importlib.import_module(f"{BACKENDS}.{CLASSES[class_name][0]}")


def missing(class_name: str) -> str | None:
    """Why ``class_name`` cannot be used here, or None when it can."""
    if class_name not in CLASSES:
        return f"{class_name} is not one of BFCL's multi-turn classes"
    try:
        module_of(class_name)
    except ImportError as exc:
        return f"{class_name} needs {exc.name or exc} (pip install it)"
    return None


def fresh(class_name: str, config: dict[str, Any], long_context: bool) -> Any:
    """A new instance with the entry's scenario loaded, as ``execute_multi_turn_func_call``
    makes one."""
    instance = getattr(module_of(class_name), class_name)()
    if class_name not in STATELESS:
        instance._load_scenario(copy.deepcopy(config), long_context=long_context)
    return instance


def response_text(value: Any) -> str:
    """A method's return value as BFCL's executor records it: a string as is, a dict as
    JSON (``str`` if it does not serialize), anything else ``str``."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def call(instance: Any, method: str, arguments: dict[str, Any]) -> str:
    """Run one method on ``instance`` and return BFCL's text for the outcome; an exception is
    BFCL's ``Error during execution: …`` (the instance keeps what the method changed)."""
    try:
        return response_text(getattr(instance, method)(**arguments))
    except Exception as exc:
        return f"Error during execution: {exc}"
