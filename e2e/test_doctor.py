"""`gpuq doctor` on the setup the README describes: a local dev cluster, the CRDs, and the operator run
from the checkout as the cluster's admin user, its config in ConfigMap gpuq-scheduler-config. The
advice applies there: kube-scheduler's fix is the `gpuq cluster up ... --scheduler-extender` that
turns the extender on for this very cluster (the test runs it), and the RBAC check asks about the
identity the leader runs as (the admin user here; the ServiceAccount when the operator runs as it),
which it names."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from gpuq.api import meta
from gpuq.config import CONFIG_MAP_KEY, CONFIG_MAP_NAME
from gpuq.controller.testing import OperatorProcess, install_crds
from gpuq.devcluster.cli import up_command
from gpuq.devcluster.testing import E2ECluster, wait_for
from gpuq.doctor.checks import OPERATOR_SA
from test_operator_install import free_port, kubectl, service_account_kubeconfig

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


class Setup:
    def __init__(self, cluster: E2ECluster, work: Path) -> None:
        self.cluster = cluster
        self.work = work
        self.url = f"http://127.0.0.1:{free_port()}"
        self.operator: OperatorProcess | None = None

    def start_operator(self, kubeconfig: Path, name: str) -> OperatorProcess:
        """`gpuq operator run` with no --config: it reads the ConfigMap, as the README's setup does."""
        self.operator = OperatorProcess(kubeconfig, self.work / f"{name}.log", log_level="DEBUG").start()
        return self.operator

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()  # graceful: the Lease is released
            self.operator = None

    def leader_user(self) -> str | None:
        """The user the leader says it runs as (None: nobody leads yet, or it does not say)."""
        coord: Any = k8s.CoordinationV1Api(self.cluster.api)
        try:
            lease = coord.read_namespaced_lease("gpuq-operator", "gpuq-system")
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        if not lease.spec.holder_identity:
            return None
        user: str | None = (lease.metadata.annotations or {}).get(meta.ANNOTATION_LEADER_USER)
        return user

    def doctor(self, kubeconfig: Path | None = None) -> dict[str, dict[str, str]]:
        cmd = [
            sys.executable,
            "-m",
            "gpuq.cli",
            "doctor",
            "--json",
            "--kubeconfig",
            str(kubeconfig or self.cluster.kubeconfig),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return {r["name"]: r for r in json.loads(proc.stdout)}

    def kubectl(self, *args: str) -> None:
        env = {"KUBECONFIG": str(self.cluster.kubeconfig), "PATH": "/usr/bin:/bin"}
        subprocess.run([kubectl(self.cluster), *args], check=True, env=env, capture_output=True, cwd=ROOT)


@pytest.fixture(scope="module")
def setup(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    if cluster.dev is None:
        pytest.skip("needs a gpuq dev cluster (the setup the README describes)")
    install_crds(cluster.api)
    s = Setup(cluster, tmp_path_factory.mktemp("doctor"))
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIG_MAP_NAME}}
    port = s.url.rsplit(":", 1)[1]
    cluster.core.create_namespaced_config_map(
        "gpuq-system", {**config, "data": {CONFIG_MAP_KEY: f"extenderPort: {port}\n"}}
    )
    try:
        s.start_operator(cluster.kubeconfig, "admin")
        wait_for(lambda: s.leader_user() is not None, 60, "the operator leading, its user on the Lease")
        yield s
    finally:
        s.stop_operator()
        cluster.core.delete_namespaced_config_map(CONFIG_MAP_NAME, "gpuq-system")


def test_kube_schedulers_fix_on_a_dev_cluster_is_the_command_that_works(setup: Setup) -> None:
    s, dev = setup, setup.cluster.dev
    before = s.doctor()
    assert before["extender"]["status"] == "pass", before["extender"]  # found where the ConfigMap says
    scheduler = before["kube-scheduler"]
    assert scheduler["status"] == "fail" and s.url in scheduler["detail"], scheduler
    command = up_command(dev.name, dev.shape, s.url)
    assert scheduler["fix"].startswith(command), scheduler
    assert "--scheduler-extender" in command and f"--name {dev.name}" in command
    try:
        _, *args = shlex.split(command)  # as printed, with this checkout's gpuq
        run = subprocess.run(
            [sys.executable, "-m", "gpuq.cli", *args], capture_output=True, text=True, timeout=180
        )
        assert run.returncode == 0, run.stderr
        assert "kube-scheduler restarted" in run.stderr
        after = s.doctor()
        assert after["kube-scheduler"]["status"] == "pass", after["kube-scheduler"]
    finally:
        dev.use_scheduler_extender(None)


def test_a_merged_kubeconfig_gets_the_dev_clusters_advice(setup: Setup) -> None:
    """The dev cluster's kubeconfig merged into another file, its context renamed and current (as
    `kubectl config view --flatten` into ~/.kube/config leaves it): still this dev cluster."""
    s, dev = setup, setup.cluster.dev
    doc = yaml.safe_load(s.cluster.kubeconfig.read_text())
    (context,) = doc["contexts"]
    other = {"name": "prod", "context": {"cluster": "prod", "user": context["context"]["user"]}}
    doc["clusters"].append({"name": "prod", "cluster": {"server": "https://192.0.2.1:6443"}})
    doc["contexts"] = [other, {**context, "name": "my-dev"}]
    doc["current-context"] = "my-dev"
    merged = s.work / "merged-kubeconfig"
    merged.write_text(yaml.safe_dump(doc))
    scheduler = s.doctor(merged)["kube-scheduler"]
    assert scheduler["status"] == "fail", scheduler
    assert scheduler["fix"].startswith(up_command(dev.name, dev.shape, s.url)), scheduler


def test_rbac_is_checked_for_the_identity_the_leader_runs_as(setup: Setup) -> None:
    s = setup
    rbac = s.doctor()["rbac"]
    assert rbac["status"] == "pass" and s.leader_user() == "gpuq-admin", rbac
    assert rbac["detail"].startswith("gpuq-admin (the leader "), (
        rbac
    )  # not the ServiceAccount it does not use

    # The operator as its ServiceAccount (as the Deployment runs it): that is what is checked now.
    s.kubectl("apply", "-f", "manifests/rbac.yaml")
    s.stop_operator()
    # Nobody leads: on a dev cluster the operator would run from the checkout as this kubeconfig's user.
    found = s.doctor()
    assert found["rbac"]["status"] == "pass" and found["rbac"]["detail"].startswith("gpuq-admin (no "), found
    assert found["operator"]["fix"].startswith("gpuq operator run --kubeconfig "), found["operator"]
    binding: Any = k8s.RbacAuthorizationV1Api(s.cluster.api)
    try:
        s.start_operator(service_account_kubeconfig(s.cluster, s.work / "sa.kubeconfig"), "sa")
        wait_for(lambda: s.leader_user() == OPERATOR_SA, 60, "the ServiceAccount's operator leading")
        rbac = s.doctor()["rbac"]
        assert rbac["status"] == "pass" and rbac["detail"].startswith(f"{OPERATOR_SA} (the leader "), rbac
        binding.delete_cluster_role_binding("gpuq-operator")
        rbac = s.doctor()["rbac"]
        assert rbac["status"] == "fail" and rbac["detail"].startswith(OPERATOR_SA), rbac
        assert "list trainingjobs" in rbac["detail"] and rbac["fix"] == "kubectl apply -f manifests/rbac.yaml"
    finally:
        s.kubectl("apply", "-f", "manifests/rbac.yaml")
        s.stop_operator()
        s.start_operator(s.cluster.kubeconfig, "admin-again")
        wait_for(lambda: s.leader_user() == "gpuq-admin", 60, "the admin's operator leading again")
