"""The monitoring and deployment files: Prometheus' configuration and rules (checked and
unit-tested by promtool), the Grafana dashboard, docker-compose.yml and the Dockerfile, and
the runbook. Every name they use must exist in the code, and every command they run must be
a real ``callgate`` command."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import REGISTRY

from callgate.core.settings import Settings
from callgate.daemons import gauges
from callgate.observe import metrics
from callgate.ops.cli.main import cli

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "ops" / "prometheus"
GRAFANA = REPO / "ops" / "grafana"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))
DASHBOARD = GRAFANA / "dashboards" / "callgate.json"
DOCS = REPO / "docs" / "metrics.md"
SERVICES = {
    "postgres",
    "redis",
    "migrate",
    "worker",
    "relayer",
    "sweeper",
    "api",
    "prometheus",
    "grafana",
    "rq-dashboard",
}
CALLGATE_SERVICES = {"migrate", "worker", "relayer", "sweeper", "api"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(binary).exists():
        pytest.fail(
            "promtool is required (Debian's prometheus package: apt-get install prometheus; "
            ".ci/run installs it)"
        )
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=120, cwd=PROM, check=False
    )


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in RULE_FILES:
        groups += yaml.safe_load(path.read_text())["groups"]
    return groups


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def recorded() -> set[str]:
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


def exposed_series() -> set[str]:
    """Every series name callgate can expose, as Prometheus stores it."""
    names: set[str] = set()
    for family in REGISTRY.collect():
        if not family.name.startswith("callgate_"):
            continue
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names | set(gauges.FAMILY_NAMES)


def referenced(expr: str) -> set[str]:
    """Metric and rule names an expression reads: callgate_… and level:metric:ops names."""
    expr = re.sub(r'"[^"]*"', "", expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    tokens = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {t for t in tokens if t.startswith("callgate_") or ":" in t}


# --- Prometheus ----------------------------------------------------------------------------


def test_promtool_accepts_the_configuration_and_the_rules() -> None:
    assert RULE_FILES and TEST_FILES
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    rules = promtool("check", "rules", *[str(p) for p in RULE_FILES])
    assert rules.returncode == 0, rules.stdout + rules.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    done = promtool("test", "rules", *[str(p.relative_to(PROM)) for p in TEST_FILES])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alerts())
    assert len(names) >= 5
    assert names - firing == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested silent"


def test_every_alert_has_a_runbook_entry() -> None:
    docs = DOCS.read_text()
    for name, rule in alerts().items():
        assert rule["annotations"]["runbook"] == f"docs/metrics.md#{name.lower()}", name
        assert f"\n### {name}\n" in docs, f"docs/metrics.md has no runbook for {name}"
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_rules_read_only_metrics_that_exist() -> None:
    known = exposed_series() | recorded()
    for group in rule_groups():
        for rule in group["rules"]:
            missing = referenced(rule["expr"]) - known
            assert not missing, f"{rule.get('record') or rule.get('alert')} reads {missing}"


def test_the_issue_s_alerts_and_ratios_exist() -> None:
    assert {
        "CallgateDuplicateSideEffect",
        "CallgateCallPastRecoveryWindow",
        "CallgateOutboxLag",
        "CallgateReconciliationPendingTooLong",
        "CallgateWorkersIdleWhileQueueGrows",
    } <= set(alerts())
    assert {
        "tool:callgate_side_effects_per_handler_invocation:ratio_rate5m",
        "tool:callgate_side_effects_per_write_operation:ratio_rate5m",
    } <= recorded()


def test_scrape_config_finds_scaled_workers_by_dns() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["callgate-worker"]["dns_sd_configs"][0]["names"] == ["worker"]
    assert jobs["callgate-relayer"]["static_configs"][0]["targets"] == ["relayer:9100"]
    assert jobs["callgate-sweeper"]["static_configs"][0]["targets"] == ["sweeper:9100"]


# --- Grafana -------------------------------------------------------------------------------


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


def test_dashboard_reads_only_metrics_and_rules_that_exist() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    known = exposed_series() | recorded() | {"up"}
    for expr in exprs:
        missing = referenced(expr) - known
        assert not missing, f"{expr!r} reads {missing}"
    used = set().union(*(referenced(e) for e in exprs))
    assert {
        "tool:callgate_side_effects_per_write_operation:ratio_rate5m",
        "tool:callgate_side_effects_per_handler_invocation:ratio_rate5m",
    } <= used


def test_dashboard_expressions_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each expression as a recording rule's."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:panel_{i}", "expr": e}
                    for i, e in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.yml"
    path.write_text(yaml.safe_dump(rules))
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    source = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    doc = json.loads(DASHBOARD.read_text())
    uids = {t["datasource"]["uid"] for p in doc["panels"] for t in p.get("targets", [])}
    assert uids == {source["uid"]}
    assert source["url"] == "http://prometheus:9090"
    provider = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "callgate.yml").read_text()
    )["providers"][0]
    grafana = compose()["services"]["grafana"]
    assert f"./ops/grafana/dashboards:{provider['options']['path']}:ro" in grafana["volumes"]


# --- docker-compose.yml and the Dockerfile ---------------------------------------------------


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return doc


def test_compose_lists_every_service_with_a_healthcheck() -> None:
    services = compose()["services"]
    assert set(services) >= SERVICES
    for name, service in services.items():
        if name != "migrate":  # one-shot: the others wait for it to complete
            assert "healthcheck" in service, name
    assert services["worker"]["depends_on"]["migrate"] == {
        "condition": "service_completed_successfully"
    }


def test_callgate_services_share_one_image_built_here() -> None:
    services = compose()["services"]
    for name in CALLGATE_SERVICES:
        assert services[name]["build"] == ".", name
        assert services[name]["image"] == "callgate:local", name
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["callgate"]' in dockerfile
    # Scalable: no fixed name, no host port for the workers.
    assert "container_name" not in services["worker"] and "ports" not in services["worker"]
    assert services["worker"]["environment"]["CALLGATE_METRICS_PORT"] == "9100"


def _seconds(duration: str) -> float:
    """A compose duration such as ``45s``, ``1m30s`` or ``2m``."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", duration)
    assert parts and duration, f"unreadable duration {duration!r}"
    return int(parts.group(1) or 0) * 60 + float(parts.group(2) or 0)


def test_long_running_services_stop_after_the_grace_not_before() -> None:
    """Docker sends SIGKILL 10 s after SIGTERM unless told otherwise; a worker's grace is 30 s
    by default, so without a longer stop_grace_period every stop would cut calls short."""
    for name in CALLGATE_SERVICES - {"migrate"}:
        service = compose()["services"][name]
        grace = float(
            service["environment"].get(
                "CALLGATE_WORKER_GRACE_SECONDS", Settings.from_env({}).worker_grace_seconds
            )
        )
        assert "stop_grace_period" in service, name
        # Room past the grace for the worker to leave Redis's worker list and exit.
        assert _seconds(service["stop_grace_period"]) >= grace + 5, name


def test_every_compose_command_is_a_real_callgate_command() -> None:
    runner = CliRunner()
    for name in CALLGATE_SERVICES:
        command = compose()["services"][name]["command"]
        result = runner.invoke(cli, [*command, "--help"])
        assert result.exit_code == 0, f"{name}: callgate {' '.join(command)}: {result.output}"
        assert "Usage: " in result.output


def test_every_callgate_service_sends_its_traces_to_the_stacks_phoenix() -> None:
    services = compose()["services"]
    phoenix = services["phoenix"]
    assert {"127.0.0.1:6006:6006", "127.0.0.1:4317:4317"} <= set(phoenix["ports"])
    for name in CALLGATE_SERVICES:
        endpoint = services[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
        # Overridable, Phoenix by default: its base URL, to which the exporter appends
        # /v1/traces (Phoenix takes OTLP over HTTP on its UI's port).
        assert endpoint.endswith("http://phoenix:6006}"), name
    assert "'.[api,otel]'" in (REPO / "Dockerfile").read_text()
    # The stack's Phoenix is the version tests/acceptance/test_trace_ui.py drives in a
    # browser (.ci/run installs it), so docs/images/trace.png shows the stack's UI.
    image_version = phoenix["image"].removeprefix("arizephoenix/phoenix:version-")
    pinned = re.search(r"arize-phoenix==([0-9.]+)", (REPO / ".ci" / "run").read_text())
    assert pinned and image_version == pinned[1]


def test_prometheus_and_grafana_mount_the_repository_s_files() -> None:
    services = compose()["services"]
    assert "./ops/prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert (
        "./ops/grafana/provisioning:/etc/grafana/provisioning:ro"
        in (services["grafana"]["volumes"])
    )


# --- docs ------------------------------------------------------------------------------------


def test_docs_name_every_metric_and_rule() -> None:
    docs = DOCS.read_text()
    families = {f.name for f in REGISTRY.collect() if f.name.startswith("callgate_")}
    for name in sorted(families | set(gauges.FAMILY_NAMES) | recorded()):
        assert name in docs, f"docs/metrics.md does not describe {name}"
    assert metrics.UNREGISTERED_TOOL in docs
