"""The pod template's constraints and other schedulers' pods as the core sees them (issue 7)."""

from __future__ import annotations

from builders import job, node, pod, queue
from test_snapshot import build, jobs_of, nodes_of

from gpuq.core import schedule
from gpuq.core.config import SchedulerConfig
from gpuq.core.model import NodeSelectorRequirement


def pinned_template(node_name: str) -> dict:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    return {"spec": {"containers": [{"name": "c", "image": "i"}], "affinity": affinity}}


def test_match_fields_reach_the_core_and_pin_the_gang() -> None:
    view = build(node("n1"), node("n2"), queue("q"), job("a", replicas=1, template=pinned_template("n2")))
    c = jobs_of(view)["team-a/a"].constraints
    assert c.required_terms[0].match_fields == (NodeSelectorRequirement("metadata.name", "In", ("n2",)),)
    d = schedule(view.snapshot, 0.0, SchedulerConfig())
    assert [a.placement for a in d.admit] == [("n2",)]


def test_default_scheduler_pods_count_with_every_resource_they_request() -> None:
    web = pod("web", "default", node_name="n1", scheduler="default-scheduler", gpus=6)
    web["spec"]["containers"][0]["resources"]["requests"].update(
        {"ephemeral-storage": "10Gi", "memory": "8Gi"}
    )
    pending = pod("queued", "default", scheduler="default-scheduler", gpus=8)  # not bound: holds nothing yet
    view = build(node("n1"), queue("q"), web, pending)
    used = nodes_of(view)["n1"].used_by_others
    assert (used.gpus, used.cpu_millis, used.memory_bytes) == (6, 4000, 8 << 30)
    assert used.extra == {"ephemeral-storage": 10 << 30}


def test_the_gpu_model_comes_from_the_configured_label() -> None:
    custom = node("n1")
    custom["metadata"]["labels"]["example.com/gpu"] = "A100"
    cfg = SchedulerConfig(gpu_model_label="example.com/gpu")
    assert nodes_of(build(custom, cfg=cfg))["n1"].gpu_model == "A100"
    assert nodes_of(build(custom))["n1"].gpu_model == "H100"  # builders' nvidia.com/gpu.product
