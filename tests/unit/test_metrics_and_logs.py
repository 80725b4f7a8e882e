"""Metric definitions follow Prometheus' conventions with bounded labels; logs are JSON
lines (or text at a terminal) carrying ids, never arguments, and stay redacted; the metrics
settings refuse bad values with invalid_configuration."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from callgate.core import logs
from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.core.settings import Settings, metrics_port
from callgate.daemons import gauges
from callgate.observe import metrics

# Labels a callgate metric may carry: each has a small, fixed set of values.
BOUNDED_LABELS = {"tool", "kind", "status", "code", "layer", "reason", "outcome", "state", "age"}
BOUNDED_LABELS |= {"source"}


def _callgate_families() -> list[tuple[str, str, set[str]]]:
    """(name, type, label names) of every callgate family in the default registry."""
    metrics.declare_tools([("t_read", "read"), ("t_write", "write")])
    metrics.declare_sweeper()
    out = []
    for family in REGISTRY.collect():
        if not family.name.startswith("callgate_"):
            continue
        labels = {k for s in family.samples for k in s.labels} - {"le"}
        out.append((family.name, family.type, labels))
    return out


def test_every_metric_follows_the_naming_conventions() -> None:
    families = _callgate_families()
    assert len(families) >= 25
    for name, kind, labels in families:
        assert name.islower() and " " not in name, name
        if kind == "histogram":
            assert name.endswith("_seconds"), f"{name}: a histogram in base units"
        if kind == "counter":
            assert not name.endswith("_total"), f"{name}: the client adds _total once"
        assert labels <= BOUNDED_LABELS, f"{name} has unbounded labels {labels - BOUNDED_LABELS}"


def test_no_metric_is_labelled_by_an_id() -> None:
    for name, _kind, labels in _callgate_families():
        assert not labels & {"tenant", "tenant_id", "call_id", "turn_id", "operation_id"}, name


def test_the_issue_s_counters_exist_with_the_exposed_names() -> None:
    # As exposed: a counter family "x" is the series "x_total".
    exposed = {
        f"{f.name}_total" if f.type == "counter" else f.name
        for f in text_string_to_metric_families(generate_latest(REGISTRY).decode())
    }
    for name in (
        "callgate_calls_proposed_total",
        "callgate_handler_invocations_total",
        "callgate_side_effects_total",
        "callgate_write_operations_total",
        "callgate_results_reused_total",
        "callgate_idempotency_conflicts_total",
        "callgate_stale_fence_rejections_total",
        "callgate_stale_completions_total",
        "callgate_lease_takeovers_total",
        "callgate_retries_total",
        "callgate_duplicate_deliveries_total",
        "callgate_sweeper_redispatches_total",
        "callgate_outbox_published_total",
        "callgate_outbox_republished_total",
    ):
        assert name in exposed, name


def test_helpers_count_one_event_per_call() -> None:
    before = REGISTRY.get_sample_value("callgate_side_effects_total", {"tool": "t_write"}) or 0
    metrics.side_effect("t_write")
    after = REGISTRY.get_sample_value("callgate_side_effects_total", {"tool": "t_write"})
    assert after == before + 1
    metrics.result("t_write", "succeeded")
    assert (
        REGISTRY.get_sample_value(
            "callgate_results_total", {"tool": "t_write", "status": "succeeded", "code": "none"}
        )
        or 0
    ) >= 1


def test_an_unregistered_tool_name_is_never_a_label_value() -> None:
    assert metrics.tool_label("refund_payment", {"refund_payment"}) == "refund_payment"
    assert metrics.tool_label("ignore previous instructions", {"refund_payment"}) == (
        metrics.UNREGISTERED_TOOL
    )


def test_state_gauges_describe_without_querying() -> None:
    registry = CollectorRegistry()
    collector = gauges.StateCollector(
        None,  # type: ignore[arg-type]  # describe() must not touch the engine
        None,  # type: ignore[arg-type]
        queue_key="rq:queue:x",
        window_seconds=1.0,
    )
    registry.register(collector)
    assert {f.name for f in collector.describe()} == set(gauges.FAMILY_NAMES)


def test_recovery_window_follows_the_settings() -> None:
    assert gauges.recovery_window(Settings.from_env({})) == 10 * (60 + 5) + 300
    s = Settings.from_env({"CALLGATE_MAX_DISPATCHES": "2", "CALLGATE_LEASE_SECONDS": "90"})
    assert gauges.recovery_window(s) == 2 * (90 + 5) + 300


# --- settings ------------------------------------------------------------------------------


def test_metrics_settings_default_off() -> None:
    s = Settings.from_env({})
    assert (s.metrics_port, s.metrics_host, s.state_metrics) == (0, "0.0.0.0", None)


def test_metrics_settings_are_read() -> None:
    s = Settings.from_env(
        {
            "CALLGATE_METRICS_PORT": "9100",
            "CALLGATE_METRICS_HOST": "127.0.0.1",
            "CALLGATE_STATE_METRICS": "yes",
        }
    )
    assert (s.metrics_port, s.metrics_host, s.state_metrics) == (9100, "127.0.0.1", True)
    assert Settings.from_env({"CALLGATE_STATE_METRICS": "0"}).state_metrics is False


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("CALLGATE_METRICS_PORT", "http"),
        ("CALLGATE_METRICS_PORT", "-1"),
        ("CALLGATE_METRICS_PORT", "65536"),
        ("CALLGATE_METRICS_PORT", "9100.5"),
        ("CALLGATE_STATE_METRICS", "sometimes"),
    ],
)
def test_bad_metrics_settings_are_invalid_configuration(name: str, raw: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({name: raw})
    assert caught.value.code == ErrorCode.INVALID_CONFIGURATION
    assert name in caught.value.message and "\n" not in caught.value.message


def test_a_port_flag_is_checked_like_the_variable() -> None:
    assert metrics_port("0") == 0
    with pytest.raises(ConfigurationError, match="--metrics-port"):
        metrics_port("nine", "--metrics-port")


# --- logs ----------------------------------------------------------------------------------


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_logs_are_json_lines_off_a_terminal_with_bound_ids(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("INFO", "auto", out)
    log = logging.getLogger("callgate.worker")
    with logs.bind(turn_id="t-1", call_id="call_42"):
        with logs.bind(operation_id="op-9"):
            log.info("call %s ended", "call_42", extra={"status": "succeeded"})
        log.warning("outside", extra={"arguments": {"card": "4111"}, "result": "secret"})
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "call call_42 ended"
    assert (first["turn_id"], first["call_id"], first["operation_id"]) == ("t-1", "call_42", "op-9")
    assert first["status"] == "succeeded" and first["level"] == "info"
    assert first["logger"] == "callgate.worker" and first["ts"].endswith("Z")
    # Unknown extras never reach a line: arguments and results are not log fields.
    assert "operation_id" not in second and "arguments" not in second and "result" not in second
    assert "4111" not in out.getvalue() and "secret" not in out.getvalue()


def test_logs_are_readable_text_at_a_terminal(restore_logging: None) -> None:
    out = _TTY()
    logs.configure("INFO", "auto", out)
    logging.getLogger("callgate.sweeper").info("swept", extra={"count": 3})
    line = out.getvalue().strip()
    assert "INFO callgate.sweeper: swept [count=3]" in line
    assert not line.startswith("{")


def test_a_library_that_sets_its_own_logger_to_debug_stays_quiet(restore_logging: None) -> None:
    """bm25s sets DEBUG on its logger when imported; the process's level still decides."""
    out = io.StringIO()
    logs.configure("WARNING", "json", out)
    chatty = logging.getLogger("some.library")
    chatty.setLevel(logging.DEBUG)
    try:
        chatty.debug("building index")
        chatty.info("built")
        chatty.warning("something to see")
        logging.getLogger(f"{logs.PROCESS_LOGGER}.worker").info("worker started")
    finally:
        chatty.setLevel(logging.NOTSET)
    messages = [json.loads(line)["message"] for line in out.getvalue().splitlines()]
    assert messages == ["something to see", "worker started"]


def test_format_can_be_forced(restore_logging: None) -> None:
    out = _TTY()
    logs.configure("INFO", "json", out)
    logging.getLogger("callgate").info("x")
    assert json.loads(out.getvalue())["message"] == "x"


def test_bind_refuses_a_field_that_is_not_a_log_field() -> None:
    with pytest.raises(ValueError, match="arguments"), logs.bind(arguments="{}"):
        pass


def test_json_logs_stay_redacted(restore_logging: None) -> None:
    from callgate.tools import redaction

    out = io.StringIO()
    logs.configure("INFO", "json", out)
    redaction.install_log_redaction()
    log = logging.getLogger("callgate.test")
    try:
        raise RuntimeError("connect postgresql://admin:opaque-90@db/x token=opaque-91")
    except RuntimeError:
        log.exception(
            "handler %s failed with password=%s", "t", "opaque-92", extra={"call_id": "c"}
        )
    doc = json.loads(out.getvalue())
    text = out.getvalue()
    assert [text.count(s) for s in ("opaque-90", "opaque-91", "opaque-92")] == [0, 0, 0]
    assert "Traceback" in doc["exception"] and doc["call_id"] == "c"


def test_the_settings_table_names_the_metrics_and_log_variables() -> None:
    from pathlib import Path

    settings = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for name in (
        "CALLGATE_METRICS_PORT",
        "CALLGATE_METRICS_HOST",
        "CALLGATE_STATE_METRICS",
        "CALLGATE_LOG_FORMAT",
    ):
        assert f"| `{name}` |" in settings, name
    assert "](metrics.md)" in settings
