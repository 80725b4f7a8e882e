"""A real Prometheus server (Debian's ``prometheus`` binary) for acceptance tests: it
scrapes real callgate processes every second, evaluates the repository's own rules
(ops/prometheus/rules) and answers queries over its HTTP API.

``MetricsStack`` starts workers, relayer and sweeper through the CLI, each with its own
``--metrics-port``, and a Prometheus whose static targets are those ports.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

# Re-exported: the other tests' servers take their ports from here.
from callgate.ops.lab.ports import free_port_block as free_port_block

REPO = Path(__file__).resolve().parents[2]
RULES = sorted((REPO / "ops" / "prometheus" / "rules").glob("*.yml"))
SCRAPE_SECONDS = 1


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )
    if found is None:
        pytest.fail(
            "the prometheus server is required for this test "
            "(apt-get install prometheus; .ci/run installs it)"
        )
    return found


def http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class Prometheus:
    """One prometheus process with its own port, storage and configuration."""

    targets: dict[str, list[int]]  # job name -> ports on 127.0.0.1
    # alert name -> its "for:" in this test's copy of the rules (the shipped files stay as
    # they are; a test cannot wait minutes for an alert to fire)
    alert_for: dict[str, str] = field(default_factory=dict)
    port: int = 0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="callgate-prom-")))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        lines = [
            "global:",
            f"  scrape_interval: {SCRAPE_SECONDS}s",
            f"  scrape_timeout: {SCRAPE_SECONDS}s",
            f"  evaluation_interval: {SCRAPE_SECONDS}s",
            "rule_files:",
            *[f"  - {json.dumps(str(r))}" for r in self.rule_files()],
            "scrape_configs:",
        ]
        for job, ports in self.targets.items():
            lines += [
                f"  - job_name: {job}",
                "    static_configs:",
                "      - targets: [" + ", ".join(f'"127.0.0.1:{p}"' for p in ports) + "]",
            ]
        return "\n".join(lines) + "\n"

    def rule_files(self) -> list[Path]:
        """The repository's rule files, or copies with ``alert_for`` applied."""
        if not self.alert_for:
            return RULES
        copies = []
        for path in RULES:
            doc = yaml.safe_load(path.read_text())
            for group in doc["groups"]:
                for rule in group["rules"]:
                    if rule.get("alert") in self.alert_for:
                        rule["for"] = self.alert_for[rule["alert"]]
            copy = self.workdir / path.name
            copy.write_text(yaml.safe_dump(doc, sort_keys=False))
            copies.append(copy)
        found = {
            r.get("alert")
            for c in copies
            for g in yaml.safe_load(c.read_text())["groups"]
            for r in g["rules"]
        }
        assert set(self.alert_for) <= found, f"no such alerts: {set(self.alert_for) - found}"
        return copies

    def start(self) -> None:
        self.port = self.port or free_port_block(1)
        config = self.workdir / "prometheus.yml"
        config.write_text(self.config())
        log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        raise AssertionError(f"prometheus did not become ready: {self.log()}")

    def log(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- the HTTP API ----------------------------------------------------------------------

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [ts, "v"]}, ...]``."""
        doc = http_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def values(self, expr: str, by: str | None = None) -> dict[str, float]:
        """``{label value (or ""): value}`` of an instant query."""
        return {
            (r["metric"].get(by, "") if by else ""): float(r["value"][1]) for r in self.query(expr)
        }

    def value(self, expr: str) -> float | None:
        found = self.query(expr)
        assert len(found) <= 1, f"{expr} returned {len(found)} series"
        return float(found[0]["value"][1]) if found else None

    def wait_for(
        self,
        expr: str,
        check: Callable[[float], bool],
        *,
        timeout: float = 30.0,
        what: str = "",
    ) -> float:
        """Poll ``expr`` (one series) until ``check(value)``; return that value."""
        deadline = time.monotonic() + timeout
        last: float | None = None
        while time.monotonic() < deadline:
            last = self.value(expr)
            if last is not None and check(last):
                return last
            time.sleep(0.25)
        raise AssertionError(f"{what or expr}: last value {last} after {timeout}s")

    def targets_health(self) -> dict[str, str]:
        """``{"job/instance": "up" | "down" | "unknown"}`` of every active target."""
        doc = http_json(f"{self.url}/api/v1/targets")
        return {
            f"{t['labels']['job']}/{t['labels']['instance']}": t["health"]
            for t in doc["data"]["activeTargets"]
        }

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts pending or firing now (``state``, ``labels``)."""
        alerts: list[dict[str, Any]] = http_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]
        return alerts

    def rule_names(self) -> set[str]:
        doc = http_json(f"{self.url}/api/v1/rules")
        return {r["name"] for g in doc["data"]["groups"] for r in g["rules"]}
