"""One turn's trace in the compose stack's trace UI, Arize Phoenix, in a real browser.

Phoenix runs from its own venv (``.venv-traceui``, installed by .ci/run at the version
docker-compose.yml's image pins; its dependencies stay out of callgate's). Real worker,
relayer and sweeper processes export to it with nothing but
``OTEL_EXPORTER_OTLP_ENDPOINT=<Phoenix's base URL>``, as the compose stack's services do
(the exporter appends ``/v1/traces``); the test's application span comes from an SDK
provider in this process exporting to the same Phoenix. Once Phoenix's REST API holds the
whole trace, Debian's chromium, driven by Playwright, opens the trace's page and the span
names are read on it.

``TRACE_SCREENSHOT=PATH`` saves the screenshot there as well (docs/images/trace.png is
made so).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from callgate.observe import tracing
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from tests.acceptance import browser
from tests.acceptance.browser import TIMEOUT_MS
from tests.acceptance.conftest import SUPPORT_A, wait_until

REPO = Path(__file__).resolve().parents[2]
PHOENIX = REPO / ".venv-traceui" / "bin" / "phoenix"
# A read's stages: it takes no reservation (a write's span has that stage too).
STAGES = {
    tracing.QUEUE_WAIT,
    tracing.GATE,
    tracing.HANDLER,
    tracing.COMPLETION,
}
TOOLS = ("get_weather", "get_stock")


@dataclass(frozen=True)
class Phoenix:
    url: str

    def spans(self, trace_id: str) -> list[dict[str, Any]]:
        """The trace's spans as Phoenix stored them (its REST API; every span without a
        project of its own lands in project ``default``)."""
        reply = httpx.get(
            f"{self.url}/v1/projects/default/spans",
            params={"trace_id": trace_id, "limit": 1000},
            timeout=10,
        )
        reply.raise_for_status()
        spans: list[dict[str, Any]] = reply.json()["data"]
        return spans


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _drag(page: Any, handle: Any, dx: float) -> None:
    """Drag a resize handle dx pixels to the right (left when negative)."""
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + dx, y, steps=8)
    page.mouse.up()


@pytest.fixture
def phoenix(tmp_path: Path) -> Iterator[Phoenix]:
    if not PHOENIX.exists():
        reason = (
            f"Arize Phoenix is not installed at {PHOENIX}; .ci/run installs it: "
            "python3 -m venv .venv-traceui && "
            ".venv-traceui/bin/pip install 'arize-phoenix==<the version in .ci/run>'"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
    env |= {
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"),  # its SQLite database
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log_path = tmp_path / "phoenix.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(PHOENIX), "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"phoenix serve exited: {log_path.read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, timeout=120, what="phoenix serve to answer /healthz")
        yield Phoenix(url)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def database_url(make_own_database: Callable[[], str]) -> str:
    """A database of its own. On the shared one, the stack's sweeper and relayer carry other
    tests' leftover calls and outbox rows, with the trace contexts stored with their turns,
    into Phoenix: its traces list then shows a foreign ``execute_tool get_weather`` root
    under the drawer, which the page's first match found (seen when this test ran after the
    other tracing tests in one session)."""
    return make_own_database()


# Phoenix's start (~10 s idle), the turn and a browser: room on a loaded machine.
@pytest.mark.timeout(300)
def test_one_turn_s_trace_in_phoenix_s_ui(
    producer: Producer,
    service_env: dict[str, str],
    phoenix: Phoenix,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    browser.require_chromium()
    from playwright.sync_api import expect

    # The application's own provider, for this test only.
    provider = TracerProvider(resource=Resource.create({"service.name": "the-agent"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{phoenix.url}/v1/traces"))
    )
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    env = {
        **service_env,
        # The base URL only, as in docker-compose.yml: the exporter appends /v1/traces.
        "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "CALLGATE_DEMO_DELAY_MS": "get_weather=200,get_stock=100",
    }
    try:
        with Stack(env=env, workers=2):
            wait_for_workers(service_env["CALLGATE_REDIS_URL"], service_env["CALLGATE_QUEUE"], 2)
            with provider.get_tracer("the-agent").start_as_current_span("agent run") as app:
                turn = producer.submit(
                    [
                        {
                            "call_id": "call-weather",
                            "tool_name": "get_weather",
                            "arguments": {"city": "Seoul", "unit": "celsius"},
                        },
                        {
                            "call_id": "call-stock",
                            "tool_name": "get_stock",
                            "arguments": {"symbol": "ACME"},
                        },
                    ],
                    SUPPORT_A,
                )
                collected = producer.collect(turn.turn_id, timeout=30)
            assert collected.complete
            assert [r.status for r in collected.results] == ["succeeded"] * 2
            trace_id = trace.format_trace_id(app.get_span_context().trace_id)

            def whole_trace() -> list[dict[str, Any]] | None:
                spans = phoenix.spans(trace_id)
                names = [s["name"] for s in spans]
                done = (
                    all(names.count(f"execute_tool {t}") == 1 for t in TOOLS)
                    and names.count("callgate.relay") == 2
                    and sum(n in STAGES for n in names) == 2 * len(STAGES)
                    and {"agent run", "callgate.submit", "callgate.collect"} <= set(names)
                )
                return spans if done else None

            spans = wait_until(whole_trace, timeout=60, what="Phoenix to hold the whole trace")
    finally:
        provider.shutdown()

    # Phoenix stored one connected tree: agent run → callgate.submit → execute_tool → stages.
    parent = {s["context"]["span_id"]: s["parent_id"] for s in spans}
    by_name = {s["name"]: s["context"]["span_id"] for s in spans}
    assert parent[by_name["agent run"]] is None
    assert parent[by_name["callgate.submit"]] == by_name["agent run"]
    for tool in TOOLS:
        span_id = by_name[f"execute_tool {tool}"]
        assert parent[span_id] == by_name["callgate.submit"]
        assert {s["name"] for s in spans if s["parent_id"] == span_id} == STAGES
    assert all(p is None or p in parent for p in parent.values())

    shot = tmp_path / "trace.png"
    with browser.page(1400, 900) as page:
        # Phoenix's own link from an OTel trace id to the trace's page.
        page.goto(f"{phoenix.url}/redirects/traces/{trace_id}")
        page.wait_for_url(f"**/traces/{trace_id}**")
        for name in ("agent run", "callgate.submit", "execute_tool get_weather"):
            expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=TIMEOUT_MS)
        # Room for the tree's nested names: the trace's drawer over most of the page,
        # and the tree a wider share of it.
        _drag(page, page.get_by_role("separator", name="Resize drawer"), -60)
        _drag(page, page.locator("[role=separator][aria-controls=trace-tree]"), 160)
        # The weather call selected: its attributes beside the tree.
        page.get_by_text("execute_tool get_weather", exact=True).first.click()
        expect(page.get_by_text("gen_ai.tool.call.id").first).to_be_visible(timeout=TIMEOUT_MS)
        page.get_by_text("agent run", exact=True).first.evaluate("e => e.scrollIntoView()")
        page.screenshot(path=str(shot))
    assert shot.stat().st_size > 0
    if target := os.environ.get("TRACE_SCREENSHOT"):
        shutil.copyfile(shot, target)
