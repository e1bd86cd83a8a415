"""The scheduler extender end to end, on a 32-node local cluster whose kube-scheduler calls gpuq:
GPU pods of other schedulers never take GPUs gpuq reserved for a gang it is binding (and do without
the extender: the test can fail), small pods leave more whole nodes free with it than without,
kube-scheduler goes on when gpuq is down, and `gpuq doctor` passes, then fails on the right check
for each broken setup."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpuq.chaos.invariants import overcommitted
from gpuq.controller.testing import GpuqClient, OperatorProcess, ensure_namespace, install_crds
from gpuq.devcluster import SIM_DURATION, Cluster, Shape
from gpuq.devcluster.binaries import ensure_binaries
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

SHAPE = Shape(racks=4, nodes_per_rack=8, blocks=2, zones=1)  # 32 nodes x 8 GPUs
ROOT = Path(__file__).resolve().parents[1]
INFERENCE = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"nvidia.com/gpu": "1"}}
DELAY = 10.0  # the operator's --admission-delay: a wide decide -> bind window to aim pods at


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Setup:
    def __init__(self, dev: Cluster, work: Path, port: int) -> None:
        self.dev = dev
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.api = k8s_config.new_client_from_config(config_file=str(dev.kubeconfig))
        self.gpuq = GpuqClient(self.api)
        self.core = self.gpuq.core
        (work / "config.yaml").write_text(f"extenderPort: {port}\n")
        self.operator = OperatorProcess(
            dev.kubeconfig,
            work / "operator.log",
            work / "config.yaml",
            log_level="DEBUG",
            extra_args=("--admission-delay", str(DELAY)),
        )

    def gpus_used(self) -> dict[str, int]:
        pods = self.api.sanitize_for_serialization(self.core.list_pod_for_all_namespaces().items)
        used = {n.metadata.name: 0 for n in self.core.list_node().items}
        for p in pods:
            node = p["spec"].get("nodeName")
            if node and p["status"].get("phase") in ("Pending", "Running"):
                for c in p["spec"]["containers"]:
                    used[node] += int(
                        ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0)
                    )
        return used

    def overcommitted(self) -> dict[str, tuple[int, int]]:
        pods = self.api.sanitize_for_serialization(self.core.list_pod_for_all_namespaces().items)
        nodes = self.api.sanitize_for_serialization(self.core.list_node().items)
        return overcommitted(pods, nodes)

    def inference_pods(self, ns: str, count: int, prefix: str) -> list[str]:
        names = [f"{prefix}-{i}" for i in range(count)]
        for name in names:
            self.core.create_namespaced_pod(
                ns,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "terminationGracePeriodSeconds": 0,
                        # An inference server: one GPU, and the CPU and memory it serves with.
                        "containers": [{"name": "serve", "image": E2ECluster.IMAGE, "resources": INFERENCE}],
                    },
                },
            )
        return names

    def reserved_for(self, ns: str, gang: str) -> set[str]:
        """Nodes the operator's extender reports reserved for `gang` (decided, pods not created yet:
        the only place that window shows, since the status follows the pods)."""
        names = [n.metadata.name for n in self.core.list_node().items]
        pod = {"spec": {"containers": [{"name": "probe", "resources": INFERENCE}]}}
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        req = urllib.request.Request(f"{self.url}/filter", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            failed = json.load(resp)["FailedAndUnresolvableNodes"] or {}
        return {node for node, why in failed.items() if f"{ns}/{gang}" in why}

    def nodes_of(self, ns: str, names: list[str]) -> dict[str, str | None]:
        return {n: self.core.read_namespaced_pod(n, ns).spec.node_name for n in names}

    def restart_operator(self) -> None:
        before = self.operator.log_path.read_text().count("scheduler extender listening")
        self.operator.start()
        wait_for(
            lambda: self.operator.log_path.read_text().count("scheduler extender listening") > before,
            60,
            "the operator leading and its extender listening again",
        )

    def doctor(self, *extra: str) -> dict[str, str]:
        cmd = [sys.executable, "-m", "gpuq.cli", "doctor", "--json", "--kubeconfig", str(self.dev.kubeconfig)]
        cmd += ["--extender-url", self.url, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        results = {r["name"]: r["status"] for r in json.loads(proc.stdout)}
        results["exit"] = str(proc.returncode)
        return results


@pytest.fixture(scope="module")
def setup(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    if cluster.backend != "local":
        pytest.skip("needs gpuq dev clusters (a second one, whose kube-scheduler calls the extender)")
    work = tmp_path_factory.mktemp("extender")
    port = free_port()
    dev = Cluster.up(
        f"ext-{os.getpid()}", SHAPE, tie_to_process=True, extender_url=f"http://127.0.0.1:{port}"
    )
    s = Setup(dev, work, port)
    try:
        install_crds(s.api)
        ensure_namespace(s.core, "gpuq-system")
        s.gpuq.create_queue("q", 10_000)
        s.operator.start()
        wait_for(lambda: "scheduler extender listening" in s.operator.log_path.read_text(), 60, "extender up")
        yield s
    finally:
        s.operator.stop()
        dev.down(keep_logs=True)
        print(f"extender logs: {work} {dev.paths.logs}")


@pytest.fixture
def ns(setup: Setup) -> Iterator[str]:
    name = f"ext-{uuid.uuid4().hex[:6]}"
    ensure_namespace(setup.core, name)
    wait_for(lambda: setup.core.list_namespaced_service_account(name).items, 30, "default service account")
    yield name
    setup.gpuq.clear_namespace(name, timeout=120)


def fill_but_two(s: Setup, ns: str) -> None:
    """gpuq gangs on all but two nodes (2x8 each, running long)."""
    jobs = [f"fill-{i}" for i in range(len(s.dev.shape.nodes()) // 2 - 1)]
    for name in jobs:
        s.gpuq.submit(ns, name, "q", 2, 8, annotations={SIM_DURATION: "600s"})
    for name in jobs:
        s.gpuq.wait_phase(ns, name, "Running", 120)


def aim_at_a_gang_being_bound(
    s: Setup, ns: str, gang: str, prefix: str
) -> tuple[set[str], dict[str, str | None]]:
    """Submit a gang, and while gpuq holds its decided nodes unbound, create 4 one-GPU pods."""
    s.gpuq.submit(ns, gang, "q", 2, 8, annotations={SIM_DURATION: "600s"})
    reserved = wait_for(lambda: s.reserved_for(ns, gang), 30, f"{gang} decided")
    assert not s.gpuq.pods(ns, gang), "the gang's pods exist already: no window to aim at"
    pods = s.inference_pods(ns, 4, prefix)
    time.sleep(DELAY / 2)  # kube-scheduler has long decided; the gang's pods are not bound yet
    return reserved, s.nodes_of(ns, pods)


def test_pods_of_other_schedulers_never_take_gpus_reserved_for_a_gang(setup: Setup, ns: str) -> None:
    s = setup
    fill_but_two(s, ns)
    reserved, placed = aim_at_a_gang_being_bound(s, ns, "gang", "infer")
    assert not reserved & {n for n in placed.values() if n}, (reserved, placed)
    s.gpuq.wait_phase(ns, "gang", "Running", 60)
    assert s.overcommitted() == {}
    assert all(n is None for n in s.nodes_of(ns, list(placed)).values())  # the cluster is full: they wait
    # The same without the extender: kube-scheduler takes the gang's GPUs (this test can fail).
    s.dev.use_scheduler_extender(None)
    try:
        for name in placed:
            s.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        s.gpuq.delete_job(ns, "gang")
        wait_for(lambda: not s.gpuq.pods(ns, "gang"), 60, "gang pods gone")
        reserved, placed = aim_at_a_gang_being_bound(s, ns, "gang-2", "plain")
        assert reserved & {n for n in placed.values() if n}, (reserved, placed)
    finally:
        s.dev.use_scheduler_extender(s.url)


def whole_free_nodes(s: Setup, ns: str, count: int, prefix: str) -> int:
    pods = s.inference_pods(ns, count, prefix)
    wait_for(lambda: all(s.nodes_of(ns, pods).values()), 120, f"{count} pods bound")
    free = sum(1 for used in s.gpus_used().values() if used == 0)
    s.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not s.core.list_namespaced_pod(ns).items, 60, "pods gone")
    return free


def test_small_gpu_pods_leave_more_whole_nodes_free_with_the_extender(setup: Setup, ns: str) -> None:
    s = setup
    with_extender = whole_free_nodes(s, ns, 200, "small")
    s.dev.use_scheduler_extender(None)
    try:
        without = whole_free_nodes(s, ns, 200, "spread")
    finally:
        s.dev.use_scheduler_extender(s.url)
    print(f"\n200 one-GPU pods on 32 nodes x 8 GPUs: {with_extender} whole nodes free with the extender, "
          f"{without} without")  # fmt: skip
    assert with_extender > without


def test_kube_scheduler_goes_on_when_gpuq_is_down(setup: Setup, ns: str) -> None:
    s = setup
    s.operator.stop()
    try:
        (name,) = s.inference_pods(ns, 1, "alone")
        wait_for(lambda: s.nodes_of(ns, [name])[name], 60, "pod bound without gpuq")
    finally:
        s.restart_operator()


def test_doctor_passes_then_fails_on_the_right_check(setup: Setup) -> None:
    s = setup
    kubectl = str(ensure_binaries() / "kubectl")
    env = {"KUBECONFIG": str(s.dev.kubeconfig), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [kubectl, "apply", "-f", str(ROOT / "manifests" / "rbac.yaml")],
        check=True,
        env=env,
        capture_output=True,
    )
    healthy = s.doctor()
    assert healthy.pop("exit") == "0" and "fail" not in healthy.values(), healthy
    assert healthy["extender"] == healthy["kube-scheduler"] == healthy["rbac"] == "pass", healthy

    assert s.doctor("--extender-url", "http://127.0.0.1:1")["extender"] == "fail"

    s.dev.use_scheduler_extender(None)
    try:
        broken = s.doctor()
        assert broken["kube-scheduler"] == "fail" and broken["exit"] == "1"
    finally:
        s.dev.use_scheduler_extender(s.url)

    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpuq-scheduler-config"}}
    s.core.create_namespaced_config_map(
        "gpuq-system", {**bad, "data": {"config.yaml": "failover: {graceSeconds: 1}\n"}}
    )
    try:
        assert s.doctor()["config"] == "fail"
    finally:
        s.core.delete_namespaced_config_map("gpuq-scheduler-config", "gpuq-system")

    # The rbac check asks about the identity the leader runs as (the admin user here): its failing
    # case, with the operator as its ServiceAccount, is in e2e/test_doctor.py.

    ext: Any = k8s.ApiextensionsV1Api(s.api)
    crd = ext.read_custom_resource_definition("gpuqueues.gpuq.dev")
    crd.spec.versions[0].additional_printer_columns = crd.spec.versions[0].additional_printer_columns[:1]
    ext.replace_custom_resource_definition("gpuqueues.gpuq.dev", crd)
    try:
        assert s.doctor()["crds"] == "fail"
    finally:
        install_crds(s.api)

    s.operator.stop()  # graceful: the Lease is released and nobody leads
    try:
        down = s.doctor()
        assert down["operator"] == "fail" and down["extender"] == "fail"
    finally:
        s.restart_operator()
