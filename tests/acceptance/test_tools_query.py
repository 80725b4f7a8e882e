"""``callgate tools --query TEXT --top K`` and ``GET /v1/tools?query=&top=``: the allowed
tools that best match a request, best first, from a real CLI process and a real API
process. The allowlist decides: a tool the roles may not use is never listed, even when it
is the one the query names. A bad ``top`` is one clear line (CLI) or a 400 problem (API).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.acceptance.api_server import ApiServer, api, env, make_key
from tests.docs.snippets import checkout_pythonpath

__all__ = ["api", "env"]  # fixtures, for pytest

pytestmark = pytest.mark.services

VIEWER_TOOLS = {"get_news", "get_stock", "get_weather", "read_email"}  # the demo's viewer


def tools(*args: str, database_url: str, pre: str = "") -> subprocess.CompletedProcess[str]:
    """``callgate tools ...`` as a process, on the demo tools; ``pre`` runs first in it."""
    script = f"{pre}\nfrom callgate.ops.cli.main import main\nmain()"
    return subprocess.run(
        [sys.executable, "-c", script, "tools", *args],
        env={
            **os.environ,
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
            "PYTHONPATH": checkout_pythonpath(os.environ.get("PYTHONPATH")),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def names(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    return [d.get("name") or d["function"]["name"] for d in doc]


def one_line(result: subprocess.CompletedProcess[str], code: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"callgate: {code}: "), lines[0]
    return lines[0]


def test_the_cli_lists_the_best_allowed_tools_first(database_url: str) -> None:
    query = "refund the payment of order O-17"
    support = names(
        tools("--role", "support", "--query", query, "--top", "2", database_url=database_url)
    )
    assert support[0] == "refund_payment" and len(support) == 2
    viewer = names(
        tools("--role", "viewer", "--query", query, "--top", "10", database_url=database_url)
    )
    assert "refund_payment" not in viewer
    assert sorted(viewer) == sorted(VIEWER_TOOLS)  # every allowed tool, and only those
    weather = tools(
        "--role",
        "viewer",
        "--query",
        "weather in Seoul",
        "--provider",
        "openai-chat",
        database_url=database_url,
    )
    listed = names(weather)
    assert listed[0] == "get_weather" and len(listed) == len(VIEWER_TOOLS)  # default top 5
    # Without --query: the whole allowlist, as before.
    assert set(names(tools("--role", "viewer", database_url=database_url))) == VIEWER_TOOLS


@pytest.mark.parametrize("top", ["0", "-3", "101"])
def test_the_cli_refuses_a_bad_top_in_one_line(database_url: str, top: str) -> None:
    line = one_line(
        tools("--role", "support", "--query", "weather", "--top", top, database_url=database_url),
        "invalid_input",
    )
    assert "--top" in line


def test_the_cli_refuses_a_role_the_allowlist_does_not_name(database_url: str) -> None:
    # A misspelt role printed [] and exited 0, as if the role could call nothing.
    line = one_line(tools("--role", "supprt", database_url=database_url), "invalid_input")
    assert "'supprt'" in line and "support" in line and "viewer" in line


def test_the_cli_refuses_top_without_query(database_url: str) -> None:
    line = one_line(
        tools("--role", "support", "--top", "3", database_url=database_url), "invalid_input"
    )
    assert "--query" in line


def test_the_cli_without_bm25s_names_the_extra(database_url: str) -> None:
    result = tools(
        "--role",
        "support",
        "--query",
        "weather",
        database_url=database_url,
        pre="import sys; sys.modules['bm25s'] = None",
    )
    line = one_line(result, "invalid_configuration")
    assert "pip install 'callgate[retrieval]'" in line


def test_the_api_lists_the_best_tools_of_the_keys_roles(
    env: dict[str, str], api: Callable[[dict[str, str]], ApiServer]
) -> None:
    server = api(env)
    viewer = make_key(env, "tenant-a", "user-5", "viewer")["key"]
    support = make_key(env, "tenant-a", "user-17", "support")["key"]
    query = {"query": "refund the payment of order O-17"}
    with server.client(support) as http:
        resp = http.get("/v1/tools", params={**query, "top": 1})
        assert resp.status_code == 200, resp.text
        assert [t["name"] for t in resp.json()] == ["refund_payment"]
    with server.client(viewer) as http:
        resp = http.get("/v1/tools", params={**query, "top": 100})
        assert resp.status_code == 200, resp.text
        listed = [t["name"] for t in resp.json()]
        assert "refund_payment" not in listed and sorted(listed) == sorted(VIEWER_TOOLS)
        weather = http.get(
            "/v1/tools", params={"query": "weather in Seoul", "provider": "anthropic-messages"}
        )
        assert weather.status_code == 200, weather.text
        assert weather.json()[0]["name"] == "get_weather"
        for params in (
            {**query, "top": 0},
            {**query, "top": 101},
            {**query, "top": "x"},
            {"top": 3},
            {"query": "   "},
        ):
            bad = http.get("/v1/tools", params=params)
            assert bad.status_code == 400, (params, bad.text)
            assert bad.headers["content-type"].startswith("application/problem+json")
            assert bad.json()["code"] == "invalid_input", bad.text
