"""The kind e2e backend's GPU fleet: kwok runs inside the kind cluster (a Deployment on the kind
node, with the same stages and timings as the local control plane's kwok) and simulates gpuq's
GPU nodes there, so the operator can run in the cluster as its Deployment while its gangs land on
simulated GPUs. Node failures work as locally: turn a node's heartbeat label off.

The kind cluster itself is made by pytest-kind with kind and a node image built offline
(hack/kind/); see docs/devcluster.md, "kind"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuq.devcluster import fakenodes
from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.kwok_config import kwok_config
from gpuq.devcluster.rest import Rest
from gpuq.devcluster.shape import HEARTBEAT_OFF, HEARTBEAT_ON, Shape

KWOK_NAMESPACE = "kwok-system"
RBAC = "rbac.authorization.k8s.io/v1"
KWOK_LEASE_SECONDS = 6  # as the local control plane: kwok renews every 1.5 s

_PATHS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
}


def kwok_manifests(image: str) -> list[dict[str, Any]]:
    """kwok as a Deployment on the kind node (never on the nodes it simulates), with the RBAC it
    needs to play nodes and their pods."""
    ns, name = KWOK_NAMESPACE, "kwok-controller"
    labels = {"app.kubernetes.io/name": name}
    rules = [
        {"apiGroups": [""], "resources": ["nodes", "nodes/status", "pods", "pods/status"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    ]  # fmt: skip
    pod = {
        "serviceAccountName": name,
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "kwok",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "args": ["--config=/etc/kwok/kwok.yaml", "--v=WARN"],
                "volumeMounts": [{"name": "config", "mountPath": "/etc/kwok", "readOnly": True}],
            }
        ],
        "volumes": [{"name": "config", "configMap": {"name": name}}],
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns},
            "data": {"kwok.yaml": kwok_config(KWOK_LEASE_SECONDS)},
        },
        {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules},
        {"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}},
        },
    ]  # fmt: skip


def create(rest: Rest, obj: dict[str, Any]) -> None:
    path = _PATHS[obj["kind"]].format(ns=obj["metadata"].get("namespace", ""))
    rest.json("POST", path, obj, ok=(409,))


class KindFleet:
    """The simulated GPU nodes of a kind cluster (kubeconfig with inline certificates)."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.rest = Rest.from_kubeconfig(kubeconfig, workdir)
        self.where = f"the kind cluster of {kubeconfig}"

    def start(self, shape: Shape, kwok_image: str, timeout: float = 180.0) -> None:
        for obj in kwok_manifests(kwok_image):
            create(self.rest, obj)
        fakenodes.create_nodes(self.rest, shape)
        deadline = time.monotonic() + timeout
        while fakenodes.ready_count(self.rest, "type=kwok") < shape.node_count:
            if time.monotonic() > deadline:
                raise DevClusterError(
                    f"kwok in the kind cluster did not make {shape.node_count} GPU nodes Ready within "
                    f"{timeout:.0f}s (kubectl -n {KWOK_NAMESPACE} logs deploy/kwok-controller)"
                )
            time.sleep(0.5)

    def fail_node(self, node: str) -> None:
        fakenodes.set_heartbeat(self.rest, node, HEARTBEAT_OFF, self.where)

    def recover_node(self, node: str) -> None:
        fakenodes.set_heartbeat(self.rest, node, HEARTBEAT_ON, self.where)
