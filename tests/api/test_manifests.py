"""manifests/ and its samples: installable as they are, least-privilege RBAC, defaults that match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuq.api import GPUQueueSpec, TrainingJobSpec
from gpuq.api.meta import DNS_LABEL_PATTERN
from gpuq.config import config_from_config_map
from gpuq.core.config import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomized(directory: Path) -> list[dict[str, Any]]:
    """What `kubectl apply -k` would send (resources only; no patches are used)."""
    out: list[dict[str, Any]] = []
    for entry in docs(directory / "kustomization.yaml")[0]["resources"]:
        target = (directory / entry).resolve()
        out += kustomized(target) if target.is_dir() else docs(target)
    return out


def test_kustomization_installs_everything() -> None:
    kinds = sorted({d["kind"] for d in kustomized(MANIFESTS)})
    assert kinds == sorted(
        {
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "CustomResourceDefinition",
            "Deployment",
            "Namespace",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        }
    )


def test_rbac_has_no_wildcards() -> None:
    for doc in docs(MANIFESTS / "rbac.yaml"):
        for rule in doc.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (doc["metadata"]["name"], rule)
                assert rule[field], (doc["metadata"]["name"], rule)


def test_config_map_documents_the_defaults() -> None:
    """Every field at its default, but the extender's address: in a cluster kube-scheduler reaches it
    through a Service, so the leader listens on all addresses (the default is loopback)."""
    import dataclasses

    cm = next(d for d in docs(MANIFESTS / "configmap.yaml") if d["kind"] == "ConfigMap")
    assert cm["metadata"]["name"] == "gpuq-scheduler-config"
    config = config_from_config_map(cm["data"])
    assert config.extender_bind_address == "0.0.0.0"
    assert dataclasses.replace(config, extender_bind_address="127.0.0.1") == SchedulerConfig()


def test_deployment_runs_the_operator_command() -> None:
    from gpuq.cli import build_parser

    deploy = next(d for d in docs(MANIFESTS / "deployment.yaml") if d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert args.command == "operator" and str(args.config) == "/etc/gpuq/config.yaml"
    # A standby replica is safe only with leader election, whose identity and Lease namespace
    # come from the pod.
    assert deploy["spec"]["replicas"] == 2 and args.leader_elect
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and args.health_port == 8080


def test_rbac_lets_the_operator_elect_a_leader() -> None:
    role = next(d for d in docs(MANIFESTS / "rbac.yaml") if d["kind"] == "Role")
    verbs = {v for r in role["rules"] if "leases" in r["resources"] for v in r["verbs"]}
    assert {"get", "create", "update", "list", "watch"} <= verbs


@pytest.mark.parametrize("path", sorted((MANIFESTS / "samples").glob("*.yaml")), ids=lambda p: p.name)
def test_samples_are_valid(path: Path) -> None:
    import re

    for doc in docs(path):
        if doc["kind"] == "TrainingJob":
            TrainingJobSpec.model_validate(doc["spec"])
            assert re.match(DNS_LABEL_PATTERN, doc["metadata"]["name"])
        elif doc["kind"] == "GPUQueue":
            GPUQueueSpec.model_validate(doc["spec"])
