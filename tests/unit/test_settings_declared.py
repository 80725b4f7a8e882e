"""Every CALLGATE_ variable is declared once (core/settings.py, ops/http/settings.py) and the
declaration is the only truth: docs/configuration.md lists exactly the declared variables with
their declared defaults, CLI help can read them (``describe``), and a bad value of any of them
is callgate's ConfigurationError, never pydantic's ValidationError."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import callgate.ops.http.settings  # declares the CALLGATE_API_ section
import callgate.ops.lab.settings  # noqa: F401  # declares the lab's variables
from callgate.core import settings as declared
from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.core.settings import CommandSettings, Settings, describe
from callgate.ops.http.settings import ApiSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `(CALLGATE_[A-Z0-9_]+)` \| ([^|]*) \|", re.MULTILINE)


def documented() -> dict[str, str]:
    rows = ROW.findall(DOC.read_text())
    table = {name: default.strip() for name, default in rows}
    assert len(table) == len(rows), "a variable has two rows in docs/configuration.md"
    return table


def shown(default: Any) -> str:
    """A default as the docs' table writes it."""
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, int | float):
        return str(int(default)) if float(default).is_integer() else repr(float(default))
    return f"`{default}`"


def test_the_docs_list_exactly_the_declared_variables() -> None:
    variables = set(declared.variables())
    docs = set(documented())
    assert sorted(variables - docs) == [], "declared but not in docs/configuration.md"
    assert sorted(docs - variables) == [], "in the docs but never declared"
    assert len(variables) == 71


def test_the_docs_show_each_declared_default() -> None:
    docs = documented()
    checked, wrong = 0, []
    for variable in declared.variables():
        default = describe(variable).default
        if default is None or variable not in docs:  # unset or computed; missing: above
            continue
        cell = docs[variable]
        if not (cell == shown(default) or cell.startswith(shown(default) + " ")):
            wrong.append(f"{variable}: declared {shown(default)}, documented {cell!r}")
        checked += 1
    assert wrong == []
    assert checked == 52


def test_each_variable_has_one_line_of_help() -> None:
    for variable in declared.variables():
        text = describe(variable).help
        assert text and "\n" not in text and len(text) <= 100, variable


def test_describe_gives_the_cli_what_it_shows() -> None:
    assert describe("CALLGATE_WORKER_CONCURRENCY") == (
        "CALLGATE_WORKER_CONCURRENCY",
        8,
        "Calls one worker process runs at once.",
        "a whole number from 1 to 256",
    )
    assert Settings.describe("worker_concurrency") == describe("CALLGATE_WORKER_CONCURRENCY")
    assert ApiSettings.describe("max_body_bytes").env == "CALLGATE_API_MAX_BODY_BYTES"
    assert CommandSettings.describe("log_format").accepts == "auto or json or text"
    assert describe("CALLGATE_STATE_METRICS").accepts == "1/true/yes/on or 0/false/no/off"
    with pytest.raises(KeyError):
        describe("CALLGATE_NO_SUCH_THING")


@pytest.mark.parametrize("variable", sorted(declared.variables()))
def test_a_bad_value_of_any_variable_is_a_configuration_error(variable: str) -> None:
    section, field = declared.variables()[variable]
    if describe(variable).accepts == "text":
        assert getattr(section.from_env({variable: "x y"}), field) in ("x y", Path("x y"))
        return
    with pytest.raises(ConfigurationError) as caught:
        section.from_env({variable: "x y"})
    message = caught.value.message
    assert caught.value.code == ErrorCode.INVALID_CONFIGURATION
    assert message.startswith(variable) and "\n" not in message
    assert message.endswith(f": expected {describe(variable).accepts}")
    assert "validation error" not in message.lower() and "pydantic" not in message


def test_the_message_says_what_is_accepted() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"CALLGATE_LEASE_SECONDS": "0.1", "CALLGATE_QUEUE": "a/b"})
    assert caught.value.message == (
        "CALLGATE_QUEUE='a/b': expected 1-64 letters, digits, '_', '-' or '.'; "
        "CALLGATE_LEASE_SECONDS='0.1': expected a number, at least 0.5"
    )


def test_a_secret_is_never_echoed() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ApiSettings.from_env({"CALLGATE_API_SESSION_SECRET": "hunter2"})
    assert caught.value.message == (
        "CALLGATE_API_SESSION_SECRET: expected at least 32 characters (random)"
    )
    secret = "s" * 40
    assert secret not in repr(ApiSettings.from_env({"CALLGATE_API_SESSION_SECRET": secret}))


def test_only_the_given_mapping_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLGATE_QUEUE", "from-os")
    monkeypatch.setenv("CALLGATE_RELAYER_BATCH", "7")
    assert Settings.from_env({}).queue == "callgate"
    assert Settings().queue == "callgate"  # keyword construction never reads the environment
    read = Settings.from_env()
    assert (read.queue, read.relayer_batch) == ("from-os", 7)
    # The names are exact: a lower-case twin is not the variable.
    assert Settings.from_env({"callgate_queue": "lower", "CALLGATE_Queue": "mixed"}).queue == (
        "callgate"
    )
    assert Settings.from_env({"CALLGATE_QUEUE": "   "}).queue == "callgate"


def test_replace_checks_like_the_variables() -> None:
    s = Settings.from_env({})
    assert s.replace(worker_concurrency=3).worker_concurrency == 3
    assert s.worker_concurrency == 8
    with pytest.raises(ConfigurationError, match="CALLGATE_WORKER_CONCURRENCY=0"):
        s.replace(worker_concurrency=0)
    with pytest.raises(ConfigurationError, match="not a setting of Settings"):
        s.replace(no_such_field=1)
    api = ApiSettings.from_env({"CALLGATE_API_PORT": "9001"})
    moved = api.with_address("0.0.0.0", None)
    assert (moved.host, moved.port, moved.session_secret) == ("0.0.0.0", 9001, api.session_secret)


def test_settings_are_frozen_values() -> None:
    s = Settings.from_env({"CALLGATE_QUEUE": "q"})
    with pytest.raises(ValueError, match="frozen"):
        s.queue = "other"  # type: ignore[misc]
    assert s == Settings(queue="q") and hash(s) == hash(Settings(queue="q"))
