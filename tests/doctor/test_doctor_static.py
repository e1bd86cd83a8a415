"""What `gpuq doctor` checks stays in step with what gpuq ships: every permission it asks the API
server about is granted by manifests/rbac.yaml, and a CRD compares equal to itself after the trip
through JSON the API server makes (so only real drift fails the crds check)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpuq.api import crd
from gpuq.doctor.checks import OPERATOR_ACCESS, _comparable

RBAC = Path(__file__).resolve().parents[2] / "manifests" / "rbac.yaml"


def granted(rules: list[dict], group: str, resource: str, verb: str, name: str | None) -> bool:
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and (not r.get("resourceNames") or name in r["resourceNames"])
        for r in rules
    )


def test_every_permission_the_doctor_checks_is_granted_by_the_manifests() -> None:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    cluster = next(d for d in docs if d["kind"] == "ClusterRole")["rules"]
    local = next(d for d in docs if d["kind"] == "Role")["rules"]
    for group, resource, verb, ns, name in OPERATOR_ACCESS:
        rules = cluster if ns is None else [*cluster, *local]
        assert granted(rules, group, resource, verb, name), (group, resource, verb, ns, name)


def test_a_crd_compares_equal_to_itself() -> None:
    for kind in crd.KINDS:
        ours = crd.crd(kind)
        assert _comparable(json.loads(json.dumps(ours))) == _comparable(ours)
