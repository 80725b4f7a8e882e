"""BFCL's multi-turn backend classes and checker, taken from the ``bfcl-eval`` package.

``bfcl-eval`` is not a dependency of callgate: its checker and its backend classes need none
of its heavy dependencies (model SDKs, torch), so it is installed with ``--no-deps``, or an
unzipped wheel is named with ``--bfcl DIR``. Only the modules named here are imported:
``multi_turn_checker`` and ``multi_turn_utils`` (which import nothing else of BFCL but its
backend table) and the backend classes an entry involves. ``MathAPI`` needs ``mpmath``;
an entry whose class cannot be imported is skipped with the reason.
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from callgate.core.errors import ConfigurationError

PACKAGE = "bfcl_eval"
BACKENDS = f"{PACKAGE}.eval_checker.multi_turn_eval.func_source_code"
CHECKER = f"{PACKAGE}.eval_checker.multi_turn_eval.multi_turn_checker"
UTILS = f"{PACKAGE}.eval_checker.multi_turn_eval.multi_turn_utils"
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
