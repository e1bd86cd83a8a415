"""Kubeflow's training-operator (PyTorchJob and the other kubeflow.org/v1 kinds) on a gpuq local
cluster, installed as its users install it: `kubectl apply -k manifests/overlays/standalone` of its
release, here from the Go module (hack/training-operator.sh), every object but the Deployment, whose
container runs as a local process (gpuq.peers.local_controller says how its webhooks are reached).

What differs from its Deployment: free ports for its metrics, health probes and webhook server (two
runs must not collide), the admin kubeconfig instead of its ServiceAccount, and MY_POD_NAMESPACE
given (the Downward API gives it in a pod). Its certificate directory is fixed in its code
(/tmp/k8s-webhook-server/serving-certs): one training-operator per machine at a time.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpuq.devcluster.binaries import GoMissing, hack_dir, read_env, run_hack
from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.paths import cache_root
from gpuq.devcluster.testing import wait_for
from gpuq.peers.local_controller import LocalController, free_port, host_address

NAMESPACE = "kubeflow"
SERVICE = "training-operator"
CERT_SECRET = "training-operator-webhook-cert"
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in the training-operator's code
WEBHOOKS = "validator.training-operator.kubeflow.org"
_PROBE = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "probe", "namespace": "default"},
    "spec": {
        "pytorchReplicaSpecs": {
            "Master": {
                "replicas": 1,
                "template": {"spec": {"containers": [{"name": "pytorch", "image": "probe"}]}},
            }
        }
    },
}


@dataclass(frozen=True)
class TrainingOperatorBuild:
    """What hack/training-operator.sh leaves in ~/.cache/gpuq/bin/training-operator-<version>/."""

    directory: Path
    version: str

    @property
    def binary(self) -> Path:
        return self.directory / "training-operator.v1"

    @property
    def manifests(self) -> Path:
        return self.directory / "manifests"

    def missing(self) -> list[str]:
        gone = [] if os.access(self.binary, os.X_OK) else [self.binary.name]
        return gone + ([] if (self.manifests / ".copied").exists() else ["manifests/"])


def version() -> str:
    env = os.environ.get("GPUQ_TRAINING_OPERATOR_VERSION")
    return env or read_env(hack_dir() / "tools.env")["TRAINING_OPERATOR_VERSION"].strip()


def cached_build() -> TrainingOperatorBuild:
    """Where hack/training-operator.sh leaves this version (`missing()` says whether it did yet)."""
    return TrainingOperatorBuild(cache_root() / "bin" / f"training-operator-{version()}", version())


def ensure_training_operator(progress: TextIO | None = sys.stderr) -> TrainingOperatorBuild:
    """The training-operator and its manifests, built first when missing (a few minutes, with
    progress). GoMissing without Go; DevClusterError when the build fails."""
    build = cached_build()
    if not build.missing():
        return build
    if shutil.which("go") is None:
        raise GoMissing(f"training-operator {build.version} is not built and Go is not installed")
    directory = run_hack("training-operator.sh", f"training-operator {build.version}", progress)
    build = TrainingOperatorBuild(directory, build.version)
    if missing := build.missing():
        raise DevClusterError(
            f"hack/training-operator.sh finished but {directory} lacks {', '.join(missing)}"
        )
    return build


def image() -> str:
    """The training-operator's image as hack/kind/images.sh builds it (its binary on an empty base,
    as upstream's Dockerfile puts it on distroless) for clusters with a container runtime (kind)."""
    return f"localhost/gpuq/training-operator:{version()}"


def in_cluster(docs: list[dict[str, Any]], image_ref: str) -> list[dict[str, Any]]:
    """The standalone install as applied to a cluster whose other nodes are kwok's simulated GPU
    nodes: unchanged, but for the image built here and the Deployment's pod kept on a real node."""
    out = copy.deepcopy(docs)
    for doc in out:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        pod["nodeSelector"] = {"node-role.kubernetes.io/control-plane": ""}
        pod["tolerations"] = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
        for container in pod["containers"]:
            container["image"], container["imagePullPolicy"] = image_ref, "IfNotPresent"
    return out


class TrainingOperatorDeployment(LocalController):
    """The training-operator installed exactly as its users install it, Deployment included, on a
    cluster that runs pods (kind; its image loaded there by the e2e fixture): `up` and `down`."""

    def __init__(self, build: TrainingOperatorBuild, kubectl: Path, kubeconfig: Path, work: Path) -> None:
        super().__init__(kubectl, kubeconfig, work)
        self.build = build

    def up(self, say: Callable[[str], None] = lambda _m: None, timeout: float = 180.0) -> None:
        docs = in_cluster(self.render(self.build.manifests / "overlays" / "standalone"), image())
        say(f"training-operator: applying its standalone install ({len(docs)} objects, image {image()})")
        self.apply(docs, "training-operator-install.yaml")
        self.run_kubectl(
            "rollout", "status", "-n", NAMESPACE, f"deploy/{SERVICE}", f"--timeout={timeout:.0f}s"
        )
        wait_for(lambda: self.admits(_PROBE), timeout, "the training-operator's webhooks answering", 1.0)

    def logs(self) -> str:
        try:
            return self.run_kubectl("logs", "-n", NAMESPACE, f"deploy/{SERVICE}", "--tail=200")
        except DevClusterError as exc:
            return str(exc)

    def down(self) -> None:
        """Remove its Deployment and webhook configuration; its CRDs and objects stay."""
        for kind, name, ns in (
            ("validatingwebhookconfiguration", WEBHOOKS, ()),
            ("deployment", SERVICE, ("-n", NAMESPACE)),
        ):
            self.run_kubectl("delete", kind, name, *ns, "--ignore-not-found", "--wait=false")


class TrainingOperatorStack(LocalController):
    """Install (`up`) and stop (`down`) the training-operator on the cluster of `kubeconfig`."""

    def __init__(self, build: TrainingOperatorBuild, kubectl: Path, kubeconfig: Path, work: Path) -> None:
        super().__init__(kubectl, kubeconfig, work)
        self.build = build
        self.ports: dict[str, int] = {}

    def up(self, say: Callable[[str], None] = lambda _m: None, timeout: float = 120.0) -> None:
        docs = self.render(self.build.manifests / "overlays" / "standalone")
        objects = [d for d in docs if d["kind"] != "Deployment"]
        service = next(d for d in objects if d["kind"] == "Service" and d["metadata"]["name"] == SERVICE)
        service["spec"].pop("selector", None)
        say(f"training-operator: applying {len(objects)} objects of its standalone install (no Deployment)")
        self.apply(objects, "training-operator-install.yaml")
        self.run_kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", "crd", "pytorchjobs.kubeflow.org"
        )
        self.ports = {name: free_port() for name in ("metrics", "health", "webhook")}
        address = host_address()
        self.endpoints(
            service,
            {"monitoring-port": self.ports["metrics"], "webhook-server": self.ports["webhook"]},
            address,
        )
        shutil.rmtree(CERT_DIR, ignore_errors=True)  # another run's certificate is not this cluster's
        cmd = [
            str(self.build.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-bind-address=:{self.ports['metrics']}",
            f"--health-probe-bind-address=:{self.ports['health']}",
            f"--webhook-server-port={self.ports['webhook']}",
        ]
        say(f"training-operator: starting it (webhooks at {address}:{self.ports['webhook']})")
        env = {"MY_POD_NAMESPACE": NAMESPACE, "MY_POD_NAME": "local"}
        self.launch("the training-operator", cmd, "training-operator.log", timeout, env)

    def ready(self, what: str) -> bool:
        # Its certificates must be in place before it serves: it waits for the files a kubelet mounts.
        mounted = self.mount_secret(NAMESPACE, CERT_SECRET, CERT_DIR)
        return self.answers(what, self.ports["health"], _PROBE) and mounted

    def down(self) -> None:
        """Stop it and remove its webhook configuration, so the cluster works on without it; its
        CRDs and objects stay."""
        self.stop()
        self.run_kubectl(
            "delete", "validatingwebhookconfiguration", WEBHOOKS, "--ignore-not-found", "--wait=false"
        )
