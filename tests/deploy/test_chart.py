"""charts/gpuq renders, with its default values, what manifests/ installs (the same objects, image,
arguments, RBAC rules, configuration and CRD schemas), so the two never drift; its options render
what they say. Uses helm built from Go modules (hack/helm.sh); skips without Go."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuq.api import crd
from gpuq.cli import build_parser
from gpuq.config import config_from_config_map
from gpuq.devcluster.testing import built_tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpuq"
MANIFESTS = ROOT / "manifests"
NAMESPACE = "gpuq-system"
SYNC = "run `make chart-files`"

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> Path:
    return built_tool("helm")


def render(helm: Path, *args: str, namespace: str = NAMESPACE) -> list[Obj]:
    out = subprocess.run(
        [str(helm), "template", "gpuq", str(CHART), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def manifests() -> list[Obj]:
    """What `kubectl apply -k manifests/` sends (its kustomization lists resources only)."""
    out: list[Obj] = []
    queue = [MANIFESTS]
    while queue:
        directory = queue.pop(0)
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for entry in kustomization["resources"]:
            target = (directory / entry).resolve()
            if target.is_dir():
                queue.append(target)
            else:
                out += [d for d in yaml.safe_load_all(target.read_text()) if d]
    return out


def by_key(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.fixture(scope="module")
def default(helm: Path) -> dict[tuple[str, str], Obj]:
    return by_key(render(helm))


@pytest.fixture(scope="module")
def plain() -> dict[tuple[str, str], Obj]:
    return by_key(manifests())


def subset(small: dict[str, Any] | None, big: dict[str, Any] | None) -> bool:
    return (small or {}).items() <= (big or {}).items()


# -- the default rendering is manifests/ ------------------------------------------------------


def test_the_same_objects_in_the_release_namespace(default: dict[Any, Obj], plain: dict[Any, Obj]) -> None:
    # Helm users create the namespace with --create-namespace; the chart does not own it.
    assert set(default) == set(plain) - {("Namespace", NAMESPACE)}
    for key, obj in default.items():
        assert obj["metadata"].get("namespace") == plain[key]["metadata"].get("namespace"), key


def test_deployment_runs_the_same_pod(default: dict[Any, Obj], plain: dict[Any, Obj]) -> None:
    key = ("Deployment", "gpuq-operator")
    chart, mine = default[key]["spec"], plain[key]["spec"]
    assert chart["replicas"] == mine["replicas"] == 2 and chart["strategy"] == mine["strategy"]
    assert subset(mine["selector"]["matchLabels"], chart["selector"]["matchLabels"])
    assert subset(mine["template"]["metadata"]["labels"], chart["template"]["metadata"]["labels"])
    assert subset(mine["template"]["metadata"]["annotations"], chart["template"]["metadata"]["annotations"])
    pod, pod_m = chart["template"]["spec"], mine["template"]["spec"]
    assert {k: v for k, v in pod.items() if k != "containers"} == {
        k: v for k, v in pod_m.items() if k != "containers"
    }
    (c,), (c_m,) = pod["containers"], pod_m["containers"]
    assert c["image"] == c_m["image"] == "gpuq:0.1.0"
    assert c.pop("imagePullPolicy") == "IfNotPresent"  # the API's default for a tag that is not latest
    # The same command: argument lists may spell defaults out, the parsed options must be equal.
    assert vars(build_parser().parse_args(c.pop("args"))) == vars(build_parser().parse_args(c_m.pop("args")))
    assert c == c_m


@pytest.mark.parametrize("kind", ["ClusterRole", "Role"])
def test_rbac_rules_are_the_same(kind: str, default: dict[Any, Obj], plain: dict[Any, Obj]) -> None:
    (chart,) = [o for (k, _), o in default.items() if k == kind]
    (mine,) = [o for (k, _), o in plain.items() if k == kind]
    assert chart["rules"] == mine["rules"]


@pytest.mark.parametrize("kind", ["ClusterRoleBinding", "RoleBinding"])
def test_bindings_are_the_same(kind: str, default: dict[Any, Obj], plain: dict[Any, Obj]) -> None:
    (chart,) = [o for (k, _), o in default.items() if k == kind]
    (mine,) = [o for (k, _), o in plain.items() if k == kind]
    assert (chart["roleRef"], chart["subjects"]) == (mine["roleRef"], mine["subjects"])


def test_services_expose_the_same_ports(default: dict[Any, Obj], plain: dict[Any, Obj]) -> None:
    for key in [k for k in plain if k[0] == "Service"]:
        assert default[key]["spec"]["ports"] == plain[key]["spec"]["ports"], key
        assert subset(plain[key]["spec"]["selector"], default[key]["spec"]["selector"]), key


def test_scheduler_config_is_the_same(default: dict[Any, Obj], plain: dict[Any, Obj]) -> None:
    key = ("ConfigMap", "gpuq-scheduler-config")
    assert config_from_config_map(default[key]["data"]) == config_from_config_map(plain[key]["data"])


def test_crds_are_the_generated_ones_kept_on_uninstall(
    default: dict[Any, Obj], plain: dict[Any, Obj]
) -> None:
    crds = [k for k in plain if k[0] == "CustomResourceDefinition"]
    assert len(crds) == len(crd.KINDS)
    for key in crds:
        chart, mine = default[key], plain[key]
        assert chart["spec"] == mine["spec"], key
        assert chart["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert chart["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_chart_files_are_copies_of_their_sources() -> None:
    assert crd.drifted(CHART / "files" / "crds") == [], SYNC
    assert sorted(p.name for p in (CHART / "files" / "crds").iterdir()) == sorted(
        p.name for p in (ROOT / "crds").glob("*.yaml") if p.name != "kustomization.yaml"
    ), SYNC
    for name, source in [
        ("gpuq-alerts.yaml", ROOT / "deploy" / "prometheus" / "gpuq-alerts.yaml"),
        ("gpuq-dashboard.json", ROOT / "deploy" / "grafana" / "gpuq-dashboard.json"),
    ]:
        assert (CHART / "files" / name).read_bytes() == source.read_bytes(), SYNC


def test_helm_lint_passes(helm: Path) -> None:
    out = subprocess.run([str(helm), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# -- values -----------------------------------------------------------------------------------


def test_image_replicas_and_names_follow_the_values(helm: Path) -> None:
    objs = by_key(
        render(
            helm,
            "--set",
            "image.repository=registry.example.com/ml/gpuq,image.tag=0.2.0,replicas=3",
            "--set",
            "fullnameOverride=sched,leaderElection.leaseName=sched-lease,resources.limits.memory=4Gi",
            namespace="ml-system",
        )
    )
    deploy = objs[("Deployment", "sched")]
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "registry.example.com/ml/gpuq:0.2.0" and deploy["spec"]["replicas"] == 3
    assert c["resources"]["limits"]["memory"] == "4Gi"
    assert build_parser().parse_args(c["args"]).lease_name == "sched-lease"
    assert pod["serviceAccountName"] == "sched" and ("ServiceAccount", "sched") in objs
    binding = objs[("ClusterRoleBinding", "sched")]
    assert binding["roleRef"]["name"] == "sched" and binding["subjects"][0]["namespace"] == "ml-system"
    role = objs[("Role", "sched-config")]
    named = [
        r["resourceNames"] for r in role["rules"] if r["resources"] == ["leases"] and "resourceNames" in r
    ]
    assert named == [["sched-lease"]]
    assert {o["metadata"].get("namespace") for k, o in objs.items() if k[0] != "CustomResourceDefinition"} - {
        None
    } == {"ml-system"}


def test_a_config_change_rolls_the_pods(helm: Path) -> None:
    def checksum(*args: str) -> str:
        deploy = by_key(render(helm, *args))[("Deployment", "gpuq-operator")]
        value: str = deploy["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    assert checksum() != checksum("--set", "config.starvationSeconds=600")


def test_crds_can_be_left_out_or_deleted_with_the_release(helm: Path) -> None:
    assert not [
        o for o in render(helm, "--set", "crds.install=false") if o["kind"] == "CustomResourceDefinition"
    ]
    crds = [o for o in render(helm, "--set", "crds.keep=false") if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == len(crd.KINDS) and all("annotations" not in o["metadata"] for o in crds)


def test_monitoring_objects_on_request(helm: Path) -> None:
    assert {o["kind"] for o in render(helm)} & {"ServiceMonitor", "PrometheusRule"} == set()
    on = "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true"
    objs = by_key(render(helm, "--set", on + ",metrics.grafanaDashboard.enabled=true"))
    monitor = objs[("ServiceMonitor", "gpuq-operator")]
    service = objs[("Service", "gpuq-operator-metrics")]
    assert subset(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    rules = objs[("PrometheusRule", "gpuq-operator")]["spec"]
    assert rules == yaml.safe_load((ROOT / "deploy" / "prometheus" / "gpuq-alerts.yaml").read_text())
    board = objs[("ConfigMap", "gpuq-operator-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "gpuq-dashboard.json").read_text())
    assert json.loads(board["data"]["gpuq-dashboard.json"]) == dashboard
