"""`helm install` of charts/gpuq into the cluster (helm built from Go modules by hack/helm.sh): the
release's objects exist, the CRDs are established, the ServiceAccount may do what the operator does
(and no more), the Deployment's ReplicaSet and pods are created; `helm upgrade` changes the release,
`helm uninstall` removes it and keeps the CRDs. The local backend runs no real kubelet, so the
operator pods themselves do not run here (test_operator_install.py runs the operator as this RBAC)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from gpuq.devcluster.testing import E2ECluster, built_tool, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gpuq"
NAMESPACE = "gpuq-helm-e2e"
# Its own names: the install suite applies manifests/ (gpuq-operator) to the same cluster.
NAME = "gpuq-helm"
RELEASE = "gpuq"
CRDS = ("trainingjobs.gpuq.dev", "gpuqueues.gpuq.dev")


class Helm:
    def __init__(self, binary: Path, cluster: E2ECluster, home: Path) -> None:
        self.binary = binary
        # Its caches and settings in the test's directory, never the user's.
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str) -> str:
        out = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=self.env)
        assert out.returncode == 0, f"helm {' '.join(args)}: {out.stderr}"
        return out.stdout


@pytest.fixture(scope="module")
def helm(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    if cluster.backend == "existing" and cluster.dev is None:
        # It takes ownership of the CRDs for a release it then deletes: not on somebody's cluster.
        pytest.skip("installs the chart cluster-wide: only on a gpuq dev cluster or kind")
    tool = Helm(built_tool("helm"), cluster, tmp_path_factory.mktemp("helm"))
    yield tool
    subprocess.run(
        [str(tool.binary), "uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait"],
        capture_output=True,
        env=tool.env,
    )
    with contextlib.suppress(k8s.ApiException):
        cluster.core.delete_namespace(NAMESPACE, propagation_policy="Background")


def install(helm: Helm, *values: str) -> None:
    # --take-ownership: other suites of the session may have created the CRDs already (kubectl).
    helm("upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
         "--take-ownership", "--set", f"fullnameOverride={NAME}", *values)  # fmt: skip


def release(helm: Helm) -> tuple[str, int]:
    """The release's status and revision (`helm status -o json`: info.status, version)."""
    status = json.loads(helm("status", RELEASE, "-n", NAMESPACE, "-o", "json"))
    return status["info"]["status"], status["version"]


def established(ext: k8s.ApiextensionsV1Api, name: str) -> bool:
    conds = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conds)


def allowed(
    cluster: E2ECluster, verb: str, resource: str, namespace: str = "", name: str = "", **kw: str
) -> bool:
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{NAMESPACE}:{NAME}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
            resource_attributes=k8s.V1ResourceAttributes(
                verb=verb, resource=resource, namespace=namespace or None, name=name or None, **kw
            ),
        )
    )
    result = k8s.AuthorizationV1Api(cluster.api).create_subject_access_review(review)
    return bool(result.status.allowed)


def test_helm_install_upgrade_and_uninstall(cluster: E2ECluster, helm: Helm) -> None:
    install(helm)
    assert release(helm) == ("deployed", 1)

    ext = k8s.ApiextensionsV1Api(cluster.api)
    for name in CRDS:
        wait_for(lambda name=name: established(ext, name), 30, f"CRD {name} established")
        meta = ext.read_custom_resource_definition(name).metadata
        assert meta.annotations["meta.helm.sh/release-name"] == RELEASE
        assert meta.annotations["helm.sh/resource-policy"] == "keep"

    core, apps, rbac = cluster.core, k8s.AppsV1Api(cluster.api), k8s.RbacAuthorizationV1Api(cluster.api)
    core.read_namespaced_service_account(NAME, NAMESPACE)
    core.read_namespaced_config_map("gpuq-scheduler-config", NAMESPACE)
    core.read_namespaced_service(f"{NAME}-metrics", NAMESPACE)
    core.read_namespaced_service("gpuq-extender", NAMESPACE)
    rbac.read_cluster_role(NAME)
    rbac.read_namespaced_role(f"{NAME}-config", NAMESPACE)

    # kube-controller-manager acts on the Deployment: a ReplicaSet, then its two pods.
    deploy = apps.read_namespaced_deployment(NAME, NAMESPACE)
    assert deploy.spec.replicas == 2 and deploy.spec.template.spec.service_account_name == NAME
    selector = ",".join(f"{k}={v}" for k, v in deploy.spec.selector.match_labels.items())
    wait_for(
        lambda: apps.list_namespaced_replica_set(NAMESPACE, label_selector=selector).items, 30, "ReplicaSet"
    )
    wait_for(
        lambda: len(core.list_namespaced_pod(NAMESPACE, label_selector=selector).items) == 2,
        30,
        "2 pods created",
    )

    # The ServiceAccount may do the operator's work, and only that.
    assert allowed(cluster, "create", "pods", subresource="binding", namespace="team-a")
    assert allowed(cluster, "patch", "trainingjobs", group="gpuq.dev", subresource="status", namespace="x")
    assert allowed(cluster, "update", "leases", NAMESPACE, "gpuq-operator", group="coordination.k8s.io")
    assert not allowed(cluster, "update", "leases", NAMESPACE, "other", group="coordination.k8s.io")
    assert not allowed(cluster, "delete", "nodes")
    assert not allowed(cluster, "update", "trainingjobs", group="gpuq.dev", namespace="x")

    install(helm, "--set", "replicas=1,config.starvationSeconds=600")
    deploy = apps.read_namespaced_deployment(NAME, NAMESPACE)
    assert deploy.spec.replicas == 1
    config = core.read_namespaced_config_map("gpuq-scheduler-config", NAMESPACE).data["config.yaml"]
    assert "starvationSeconds: 600" in config
    assert release(helm) == ("deployed", 2)

    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    with pytest.raises(k8s.ApiException) as gone:
        apps.read_namespaced_deployment(NAME, NAMESPACE)
    assert gone.value.status == 404
    with pytest.raises(k8s.ApiException):
        rbac.read_cluster_role(NAME)
    for name in CRDS:  # resource-policy keep: the CRDs, and every TrainingJob, survive
        assert established(ext, name)
