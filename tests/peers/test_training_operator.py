"""Kubeflow's training-operator as the kind suite installs it: its own standalone manifests, with only
the image (built here) and the node its pod may run on changed."""

from __future__ import annotations

import copy
from typing import Any

from gpuq.peers.training_operator import image, in_cluster, version


def standalone() -> list[dict[str, Any]]:
    """The shape of `kubectl kustomize manifests/overlays/standalone` of v1.8.1, trimmed."""
    container = {
        "name": "training-operator",
        "image": "kubeflow/training-operator:v1-04f9f13",
        "command": ["/manager"],
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "training-operator-webhook-cert"}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "training-operator", "namespace": "kubeflow"},
            "spec": {
                "template": {"spec": {"serviceAccountName": "training-operator", "containers": [container]}}
            },
        },
    ]


def test_only_the_image_and_the_node_of_the_deployment_change() -> None:
    docs = standalone()
    before = copy.deepcopy(docs)
    out = in_cluster(docs, image())
    assert docs == before  # the rendered install is not modified in place
    assert out[:2] == before[:2]
    pod = out[2]["spec"]["template"]["spec"]
    assert pod["containers"] == [
        {
            **before[2]["spec"]["template"]["spec"]["containers"][0],
            "image": image(),
            "imagePullPolicy": "IfNotPresent",
        }
    ]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}  # never on a kwok GPU node
    assert pod["serviceAccountName"] == "training-operator"
    assert image() == f"localhost/gpuq/training-operator:{version()}"
