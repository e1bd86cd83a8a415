"""The CRD install command gpuq names everywhere (gpuq.api.crd.INSTALL_COMMAND: the operator's and the
CLI's errors, `gpuq doctor`, the docs) works as written against a real API server, from the checkout."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from gpuq.api import crd
from gpuq.devcluster.testing import E2ECluster, wait_for
from gpuq.doctor.checks import _comparable
from test_operator_install import kubectl

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def established(ext: Any, name: str) -> bool:
    conditions = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def test_the_documented_crd_install_command_installs_this_builds_crds(cluster: E2ECluster) -> None:
    program, *args = shlex.split(crd.INSTALL_COMMAND)
    assert program == "kubectl"
    run = subprocess.run(
        [kubectl(cluster), *args],
        cwd=ROOT,  # the docs give it from the checkout
        env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    ext: Any = k8s.ApiextensionsV1Api(cluster.api)
    for kind in crd.KINDS:
        wait_for(lambda kind=kind: established(ext, kind.crd_name), 30, f"{kind.crd_name} established")
        live = cluster.api.sanitize_for_serialization(ext.read_custom_resource_definition(kind.crd_name))
        assert _comparable(live) == _comparable(json.loads(json.dumps(crd.crd(kind)))), kind.crd_name
