"""`gpuq extender config`: the seed's legacy Policy translates with a clear report, what has no
equivalent says so, and the checked-in kube-scheduler configuration is what the command prints."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuq.cli import main
from gpuq.schedconfig import PolicyError, duration, load_policy, scheduler_configuration, translate

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "manifests" / "extender" / "seed-policy-configmap.yaml"


def test_the_seeds_policy_translates() -> None:
    t = translate(load_policy(SEED.read_text()))
    profile = t.configuration["profiles"][0]
    assert profile["plugins"]["score"] == {
        "disabled": [{"name": "*"}],
        "enabled": [{"name": "NodeResourcesFit", "weight": 2}, {"name": "ImageLocality", "weight": 1}],
    }
    assert profile["pluginConfig"][0]["args"]["scoringStrategy"]["type"] == "LeastAllocated"
    (ext,) = t.configuration["extenders"]
    assert (
        ext["urlPrefix"] == "http://127.0.0.1:8888"
        and ext["httpTimeout"] == "3s"
        and ext["enableHTTPS"] is False
    )
    report = t.report()
    assert "LeastRequestedPriority (weight 2) -> score plugin NodeResourcesFit" in report
    assert "ImageLocalityPriority (weight 1) -> score plugin ImageLocality" in report
    assert "set ignorable: true" in report  # the seed's extender would stop scheduling when gpuq is down


def test_what_has_no_equivalent_is_reported() -> None:
    t = translate(
        {
            "kind": "Policy",
            "priorities": [
                {"name": "NodePreferAvoidPodsPriority", "weight": 10},
                {"name": "MyCustom", "weight": 1},
            ],
            "predicates": [{"name": "CheckNodeMemoryPressure"}, {"name": "PodFitsResources"}],
            "hardPodAffinitySymmetricWeight": 10,
        }
    )
    unmapped = "\n".join(t.unmapped)
    assert "NodePreferAvoidPodsPriority: removed" in unmapped and "MyCustom: not a known priority" in unmapped
    assert "CheckNodeMemoryPressure: replaced by the node.kubernetes.io/memory-pressure taint" in unmapped
    assert "hardPodAffinitySymmetricWeight: not translated" in unmapped
    assert any("PodFitsResources -> filter plugin NodeResourcesFit" in m for m in t.mapped)


def test_durations_and_bad_input() -> None:
    assert duration(3_000_000_000) == "3s" and duration("1500ms") == "1.5s" and duration("2m") == "120s"
    with pytest.raises(PolicyError, match="not a duration"):
        duration("soon")
    with pytest.raises(PolicyError, match="holds no kind: Policy"):
        load_policy("kind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n")
    with pytest.raises(PolicyError, match="expected kind: Policy"):
        load_policy("kind: Deployment\n")


def test_checked_in_configuration_is_current() -> None:
    checked_in = yaml.safe_load((ROOT / "manifests" / "extender" / "kube-scheduler-config.yaml").read_text())
    assert checked_in == scheduler_configuration(), (
        "regenerate: gpuq extender config > manifests/extender/..."
    )


def test_the_command_prints_yaml_and_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extender", "config", "--from-policy", str(SEED)]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["kind"] == "KubeSchedulerConfiguration" and "maps to:" in err
    assert main(["extender", "config", "--from-policy", "/nonexistent"]) == 2
