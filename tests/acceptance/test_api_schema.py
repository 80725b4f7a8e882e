"""Schemathesis against the OpenAPI document a real ``callgate api`` serves, on real Postgres
and Redis: no answer is a 5xx, and every answer (success or problem) matches its documented
status, content type, headers and schema.

The example budget is modest (``MAX_EXAMPLES`` per operation) so the run takes about a
minute; the generated requests carry an approver's key of tenant-a with a bucket large
enough not to be rate-limited (429 is documented, but would only shorten the run).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.acceptance.api_server import ApiServer, api, make_key

__all__ = ["api"]  # fixtures, for pytest

MAX_EXAMPLES = 40
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def served(make_own_database: Callable[[], str], redis_url: str) -> Iterator[tuple[ApiServer, str]]:
    from tests.acceptance.api_server import start_api

    env = {
        "CALLGATE_DATABASE_URL": make_own_database(),
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": f"t-schema-{uuid.uuid4().hex[:8]}",
        "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
        "CALLGATE_API_MAX_WAIT": "0.5",
    }
    key = make_key(env, "tenant-a", "user-5", "support", "approver", rate=1000, burst=1000)
    server = start_api(env)
    try:
        yield server, key["key"]
    finally:
        server.stop()


@pytest.fixture(scope="module")
def api_schema(served: tuple[ApiServer, str]) -> Any:
    server, _key = served
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def _labels() -> list[str]:
    """The operations of the document (built in-process, without services, only to name
    the tests; the test itself reads the one the server serves)."""
    from callgate.core.settings import Settings
    from callgate.ops.http.app import create_app
    from callgate.ops.http.settings import ApiSettings

    doc = create_app(Settings.from_env({}), ApiSettings()).openapi()
    return [f"{m.upper()} {path}" for path, ops in doc["paths"].items() for m in ops]


# schemathesis.pytest.from_fixture does not run under pytest 9 (it reads a private pytest
# attribute), so each operation's strategies are driven by Hypothesis directly: positive
# and negative cases, the same checks.
@pytest.mark.parametrize("label", _labels())
def test_every_answer_matches_the_served_document(
    label: str, api_schema: Any, served: tuple[ApiServer, str]
) -> None:
    server, key = served
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in the served document"
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case: Any) -> None:
        case.call_and_validate(
            base_url=server.url, headers={"Authorization": f"Bearer {key}"}, checks=CHECKS
        )

    check()


def test_a_submission_its_results_and_trace_match_the_document(
    api_schema: Any, served: tuple[ApiServer, str]
) -> None:
    """Generated bodies are mostly refused before anything is recorded; one real submission
    takes the success paths (no workers run here: its call stays pending)."""
    server, key = served
    headers = {"Authorization": f"Bearer {key}"}
    submit = api_schema.find_operation_by_label("POST /v1/turns")
    body = [{"call_id": "c1", "tool_name": "get_weather", "arguments": {"city": "Seoul"}}]
    response = submit.Case(body=body, media_type="application/json").call_and_validate(
        base_url=server.url, headers=headers, checks=CHECKS
    )
    assert response.status_code == 200, response.text
    turn_id = response.json()["turn_id"]
    results = api_schema.find_operation_by_label("GET /v1/turns/{turn_id}/results")
    answer = results.Case(path_parameters={"turn_id": turn_id}).call_and_validate(
        base_url=server.url, headers=headers, checks=CHECKS
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["pending"] == ["c1"]
