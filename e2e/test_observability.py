"""deploy/'s dashboard and alert rules against real data: the operator runs a small workload (an
admission, a preemption, a job left pending, one blocked, a node failure and its recovery) while a
Prometheus built from Go modules (hack/prometheus.sh) scrapes it every second with
deploy/prometheus/gpuq-alerts.yaml loaded; then every panel expression of the dashboard must return
data through Prometheus' HTTP API, and every alert expression must evaluate, with its rule loaded
and healthy. GPUQ_DASHBOARD_PNG=<dir> adds a scripted scenario and draws six panels of it there."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import test_operator as shared
from gpuq.controller.metrics import PREEMPTION_REASONS
from gpuq.controller.testing import GpuqClient, OperatorProcess
from gpuq.devcluster.testing import E2ECluster, built_tool, wait_for
from gpuq.observability import alert_queries, dashboard_queries, dashboard_variables, to_promql

pytestmark = pytest.mark.e2e

gpuq, ns, queue, phase = shared.gpuq, shared.ns, shared.queue, shared.phase

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuq-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "gpuq-alerts.yaml"
CONFIG = "failover: {notReadyGraceSeconds: 2}\n"
# Grafana's $__rate_interval and $__range as a dashboard over the last 15 minutes would send them:
# the whole workload lies inside both.
WINDOW, RANGE = "5m", "15m"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """A Prometheus server on loopback scraping `targets` every second, with `rule_files` loaded."""

    def __init__(self, binary: Path, work: Path, targets: list[str], rule_files: list[Path]) -> None:
        self.binary, self.work = binary, work
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": "gpuq", "static_configs": [{"targets": targets}]}],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = work / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        args = [
            str(self.binary),
            f"--config.file={self.work / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.work / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._ready, 60, f"Prometheus ready on {self.url} (log: {self.log_path})", interval=0.5)
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"Prometheus exited: {self.log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a success, AssertionError with Prometheus' error otherwise."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        assert body["status"] == "success", f"{path} {params}: {body.get('errorType')}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] in ("vector", "scalar"), (expr, data["resultType"])
        result: list[dict[str, Any]] = (
            data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]
        )
        return result

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    return built_tool("prometheus")  # first: without Go the module skips before starting anything


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster, gpuq: GpuqClient, prometheus_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    if not cluster.can_fail_nodes:
        pytest.skip("backend cannot fail nodes (the failover panels need one)")
    port = free_port()
    for op in shared.run_operator(
        cluster, tmp_path_factory, "observability-operator", CONFIG, ("--metrics-port", str(port))
    ):
        op.metrics_port = port  # type: ignore[attr-defined]
        yield op


@pytest.fixture(scope="module")
def prometheus(
    prometheus_binary: Path, operator: OperatorProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    target = f"127.0.0.1:{operator.metrics_port}"  # type: ignore[attr-defined]
    prom = Prometheus(prometheus_binary, tmp_path_factory.mktemp("prometheus"), [target], [ALERTS]).start()
    wait_for(lambda: prom.query('up{job="gpuq"} == 1'), 30, "Prometheus scraping the operator")
    yield prom
    prom.stop()
    print(f"prometheus log: {prom.log_path}")


def run_workload(
    cluster: E2ECluster, gpuq: GpuqClient, op: OperatorProcess, prom: Prometheus, ns: str, queues: list[str]
) -> None:
    """An admission, a preemption within a queue, a job that stays pending (quota) and one that is
    blocked (bigger than the cluster), and a gang restarted after a node failure (its re-admission
    re-creates its Service: a 409, so the non-2xx API panel has data too)."""
    q, spare = queues
    # Queues exist before their jobs, as in a real cluster: once Prometheus has seen their counters
    # at 0, the first preemption is an increase (a series first scraped at 1 shows none).
    selector = f'gpuq_preempted_jobs_total{{queue=~"{q}|{spare}"}}'
    series = 2 * len(PREEMPTION_REASONS)  # each queue, each reason
    wait_for(lambda: len(prom.query(selector)) == series, 30, "the queues' counters scraped at 0")
    gpuq.submit(ns, "low", q, 2, 8, checkpoint={"requestOnPreemption": False})
    phase(gpuq, op, ns, "low", "Running")
    gpuq.submit(ns, "high", q, 2, 8, priority=10)
    phase(gpuq, op, ns, "high", "Running")
    phase(gpuq, op, ns, "low", ("Preempted", "Queued"))  # then waits: q's quota is taken
    gpuq.submit(ns, "huge", spare, 64, 8)  # 512 GPUs: more than the cluster has
    gpuq.submit(ns, "ft", spare, 2, 8)
    victim = phase(gpuq, op, ns, "ft", "Running")["placement"][0]["node"]
    cluster.fail_node(victim)
    try:
        gpuq.wait_status(
            ns, "ft", lambda s: s.get("phase") == "Running" and s.get("attempt") == 2, 60, "ft running again"
        )
    finally:
        cluster.recover_node(victim)


def total(prom: Prometheus, expr: str) -> float:
    return sum(float(s["value"][1]) for s in prom.query(expr))


def finite(sample: dict[str, Any]) -> bool:
    return math.isfinite(float(sample["value"][1]))


def test_every_panel_and_alert_expression_evaluates_on_real_data(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    prometheus: Prometheus,
    ns: str,
    queue: Callable[..., str],
) -> None:
    q, spare = queue(16), queue(16)
    run_workload(cluster, gpuq, operator, prometheus, ns, [q, spare])
    # Everything happened; wait until Prometheus has scraped the last of it (the recovery).
    recovered = "sum(gpuq_failover_recovery_time_seconds_count) > 0"
    wait_for(lambda: prometheus.query(recovered), 30, "the recovery scraped")
    time.sleep(3)  # a few more scrapes, so rate() has points after every event
    # The workload is what Prometheus holds: one preemption, one restart, one job of each queue waiting.
    preempted = f'increase(gpuq_preempted_jobs_total{{queue="{q}",reason="InQueuePriority"}}[{WINDOW}])'
    assert total(prometheus, preempted) > 0.5
    assert total(prometheus, f'increase(gpuq_restarts_total{{queue="{spare}"}}[{WINDOW}])') > 0.5
    assert total(prometheus, f'gpuq_pending_jobs{{queue="{q}"}}') == 1
    assert total(prometheus, f'gpuq_pending_jobs{{queue="{spare}"}}') == 1

    dashboard = json.loads(DASHBOARD.read_text())
    empty = []
    for q in dashboard_queries(dashboard):
        result = prometheus.query(to_promql(q.expr, WINDOW, RANGE))
        if not any(finite(s) for s in result):
            empty.append(f"{q.source}: {q.expr} -> {result}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    for var in dashboard_variables(dashboard):
        values = prometheus.api(f"label/{var.label}/values", **{"match[]": var.metric})
        assert values, f"template variable {var.name}: no {var.label} values of {var.metric}"

    for q in alert_queries(yaml.safe_load(ALERTS.read_text())):
        prometheus.query(q.expr)  # parses and evaluates (an alert that should not fire returns nothing)
    expected = {q.source.split("/", 1)[1] for q in alert_queries(yaml.safe_load(ALERTS.read_text()))}
    loaded = wait_for(lambda: _evaluated_rules(prometheus, expected), 20, "every alert rule evaluated")
    unhealthy = {name: r.get("lastError") for name, r in loaded.items() if r["health"] != "ok"}
    assert not unhealthy and set(loaded) == expected, unhealthy


def _evaluated_rules(prometheus: Prometheus, expected: set[str]) -> dict[str, dict[str, Any]] | None:
    """The alerting rules Prometheus loaded, once each has been evaluated at least once."""
    groups = prometheus.api("rules", type="alert")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    if set(rules) != expected or any(r["health"] == "unknown" for r in rules.values()):
        return None
    return rules


@pytest.mark.skipif(not os.environ.get("GPUQ_DASHBOARD_PNG"), reason="GPUQ_DASHBOARD_PNG is not set")
def test_render_dashboard_panels(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, prometheus: Prometheus, ns: str
) -> None:
    """Not a check: a four-minute scenario, then six panels drawn from Prometheus (docs/img/)."""
    from dashboard_png import render_panels, run_showcase

    started = time.time()
    run_showcase(cluster, gpuq, ns)
    dashboard = json.loads(DASHBOARD.read_text())
    path = render_panels(prometheus.api, dashboard, Path(os.environ["GPUQ_DASHBOARD_PNG"]), started)
    print(f"dashboard panels: {path}")
