"""`kubectl apply -k manifests/` installs gpuq, and the operator does its whole job with nothing but
the ServiceAccount's least-privilege RBAC (a Forbidden anywhere fails the test)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

import test_operator as shared
from gpuq.controller.testing import ContainerImage, GpuqClient, OperatorProcess
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
gpuq = shared.gpuq
ns = shared.ns
queue = shared.queue
phase = shared.phase


def kubectl(cluster: E2ECluster) -> str:
    """The kubectl built with the local control plane (make test builds it), else the one on PATH."""
    from gpuq.devcluster.binaries import bin_dir

    built = bin_dir() / "kubectl"
    if built.exists():
        return str(built)
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl not on PATH")
    return found


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def metrics(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
        return text


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a /metrics answer (whatever order its labels come in)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def service_account_kubeconfig(cluster: E2ECluster, path: Path) -> Path:
    """A kubeconfig that authenticates as system:serviceaccount:gpuq-system:gpuq-operator."""
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = cluster.core.create_namespaced_service_account_token(
        "gpuq-operator", "gpuq-system", request
    ).status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    current = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == current["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [server],
        "users": [{"name": "gpuq-operator", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": server["name"], "user": "gpuq-operator"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def operator_image() -> ContainerImage:
    """The operator image under test (`make test` builds it and sets GPUQ_E2E_OPERATOR_IMAGE)."""
    image = os.environ.get("GPUQ_E2E_OPERATOR_IMAGE")
    if not image:
        pytest.skip("GPUQ_E2E_OPERATOR_IMAGE is not set: `make test` sets it after `make image`")
    found = subprocess.run(
        ["bash", str(ROOT / "hack" / "container-engine.sh")], capture_output=True, text=True
    )
    if found.returncode != 0:
        pytest.fail(f"no container engine to run {image}: {found.stderr.strip()}")
    return ContainerImage(found.stdout.strip(), image)


@pytest.fixture(scope="module", params=["process", "image"])
def operator(
    request: pytest.FixtureRequest, cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator as its ServiceAccount: this interpreter's `gpuq`, then the image's (non-root,
    read-only root filesystem), both against the same API server."""
    image = operator_image() if request.param == "image" else None
    work = tmp_path_factory.mktemp("operator-install")
    subprocess.run(
        [kubectl(cluster), "apply", "-k", str(ROOT / "manifests")],
        check=True,
        capture_output=True,
        env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
    )
    # On kind the Deployment's replicas really run and would win the Lease: scale them away, so the
    # operator under test here is the one that schedules (test_incluster.py tests the Deployment).
    subprocess.run(
        [kubectl(cluster), "-n", "gpuq-system", "scale", "deployment/gpuq-operator", "--replicas=0"],
        check=True,
        capture_output=True,
        env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
    )
    wait_for(
        lambda: (
            not [
                p
                for p in cluster.core.list_namespaced_pod(
                    "gpuq-system", label_selector="app.kubernetes.io/name=gpuq"
                ).items
            ]
        ),
        120,
        "the Deployment's pods gone",
    )
    # The Deployment's command as its ServiceAccount, outside the cluster.
    kubeconfig = service_account_kubeconfig(cluster, work / "sa.kubeconfig")
    port = free_port()
    op = OperatorProcess(
        kubeconfig,
        work / "operator.log",
        log_level="DEBUG",
        extra_args=("--metrics-port", str(port)),
        image=image,
    ).start()
    op.metrics_port = port  # type: ignore[attr-defined]
    yield op
    op.stop()
    print(f"operator log: {op.log_path}")


def test_operator_works_with_the_installed_rbac_only(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: shared.Callable[..., str],
) -> None:
    q = queue(16)
    gpuq.submit(ns, "low", q, 2, 8, checkpoint={"requestOnPreemption": True, "gracePeriodSeconds": 2})
    phase(gpuq, operator, ns, "low", "Running")  # status, pods, bindings, Service, Events
    assert gpuq.core.read_namespaced_service("low", ns)
    gpuq.submit(ns, "high", q, 2, 8, priority=10)  # preemption: annotate and delete pods
    phase(gpuq, operator, ns, "high", "Running")
    low = phase(gpuq, operator, ns, "low", ("Preempted", "Queued"))
    assert low["preemptions"] == 1
    wait_for(lambda: gpuq.queue(q).get("status", {}).get("usedGPUs") == 16, 20, "queue status written")
    gpuq.delete_job(ns, "high")
    phase(gpuq, operator, ns, "low", "Running")
    log = operator.log_path.read_text()
    assert "Forbidden" not in log and '"403' not in log and "403 " not in log, operator.log_tail()
    assert '"no scheduler config map' not in log  # read ConfigMap gpuq-scheduler-config via its Role
    assert {"CheckpointRequested", "Preempted"} <= {e.reason for e in gpuq.events(ns, "low")}
    text = metrics(operator.metrics_port)  # type: ignore[attr-defined]
    assert sample(text, "gpuq_admissions_total", queue=q) == 3  # low, high, low again
    assert sample(text, "gpuq_preempted_jobs_total", queue=q, reason="InQueuePriority") == 1
    assert sample(text, "gpuq_queue_used_gpus", queue=q, cohort="") == 16
    assert "gpuq_cycle_seconds_count" in text and "gpuq_schedule_seconds_bucket" in text
