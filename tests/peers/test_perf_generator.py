"""Kueue's generator format translated to gpuq objects (gpuq.peers.perf_generator)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from gpuq.core.model import ReclaimPreemption, TopologyMode, WithinQueuePreemption
from gpuq.peers.perf_generator import CLASS_LABEL, GeneratorError, expand, load, parse

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "kueue-configs"


def _config(workloads: list[dict], topology: dict | None = None, **queue: object) -> dict:
    qs = {"className": "cq", "count": 2, "nominalQuota": 20, "borrowingLimit": 100, **queue}
    qs["workloadsSets"] = [{"count": 3, "creationIntervalMs": 100, "workloads": workloads}]
    raw: dict = {"cohorts": [{"className": "cohort", "count": 2, "queuesSets": [qs]}]}
    if topology is not None:
        raw["topology"] = topology
    return raw


SMALL = {"className": "small", "runtimeMs": 200, "priority": 50, "request": 1}
TOPOLOGY = {
    "levels": [
        {"name": "block", "count": 1, "nodeLabel": "x/block"},
        {"name": "rack", "count": 3, "nodeLabel": "x/rack"},
        {"name": "node", "count": 4, "nodeLabel": "kubernetes.io/hostname", "capacity": {"cpu": "96"}},
    ]
}


def test_names_and_schedule_follow_kueues_runner() -> None:
    plan = expand(parse(_config([SMALL])))
    assert [q.name for q in plan.queues] == [
        "cq-0-0-cohort-0",
        "cq-0-1-cohort-0",
        "cq-0-0-cohort-1",
        "cq-0-1-cohort-1",
    ]
    assert [q.cohort for q in plan.queues] == ["cohort-0", "cohort-0", "cohort-1", "cohort-1"]
    stream = plan.streams[0]
    assert stream.queue.namespace == "cq-0-0-cohort-0" and stream.interval_ms == 100
    assert [j.name for j in stream.jobs] == ["small-0-0-0", "small-0-1-0", "small-0-2-0"]
    assert plan.jobs == 12 and plan.classes == ("small",)


def test_quota_preemption_and_job_translate_one_to_one() -> None:
    plan = expand(parse(_config([SMALL], reclaimWithinCohort="Any", withinClusterQueue="LowerPriority")))
    q = plan.queues[0]
    assert (q.nominal_gpus, q.borrowing_limit_gpus) == (20, 100)
    assert (q.within, q.reclaim) == (WithinQueuePreemption.LOWER_PRIORITY, ReclaimPreemption.ANY)
    body = q.body()
    assert body["spec"] == {
        "nominalGPUs": 20,
        "cohort": "cohort-0",
        "borrowingLimitGPUs": 100,
        "preemption": {"withinQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
    }
    job = plan.streams[0].jobs[0].body(q.name)
    assert job["spec"]["priority"] == 50
    assert job["spec"]["workers"]["replicas"] == 1 and job["spec"]["workers"]["gpusPerWorker"] == 1
    assert job["spec"]["checkpoint"] == {"requestOnPreemption": False}  # mimicked work reports none
    assert job["metadata"]["labels"][CLASS_LABEL] == "small"
    assert "topology" not in job["spec"]


def test_kueue_default_preemption_is_never() -> None:
    plan = expand(parse(_config([SMALL])))  # no preemption keys: Kueue's defaults
    assert (plan.queues[0].within, plan.queues[0].reclaim) == (
        WithinQueuePreemption.NEVER,
        ReclaimPreemption.NEVER,
    )


def test_lower_or_newer_equal_priority_maps_to_lower_priority_with_a_note() -> None:
    plan = expand(parse(_config([SMALL], withinClusterQueue="LowerOrNewerEqualPriority")))
    assert plan.queues[0].within is WithinQueuePreemption.LOWER_PRIORITY
    assert any("LowerOrNewerEqualPriority" in n for n in plan.notes)


def test_pod_count_counts_only_with_a_tas_level_as_in_kueue() -> None:
    plan = expand(parse(_config([{**SMALL, "podCount": 4}])))
    assert plan.streams[0].jobs[0].workers == 1


def test_fractional_requests_scale_everything_by_one_factor() -> None:
    wl = [
        {
            "className": "a",
            "request": "500m",
            "podCount": 2,
            "tasConstraint": "required",
            "tasLevel": "x/rack",
        },
        {
            "className": "b",
            "request": "1250m",
            "podCount": 4,
            "tasConstraint": "preferred",
            "tasLevel": "x/rack",
        },
        {
            "className": "c",
            "request": "2500m",
            "podCount": 8,
            "tasConstraint": "balanced",
            "tasLevel": "x/rack",
            "sliceSize": 4,
        },
    ]
    plan = expand(parse(_config(wl, TOPOLOGY)))
    assert plan.factor == Fraction(4)
    a, b, c = plan.streams[0].jobs[:3]
    assert (a.workers, a.gpus_per_worker, a.topology) == (2, 2, (TopologyMode.REQUIRED, "rack"))
    assert (b.workers, b.gpus_per_worker, b.topology) == (4, 5, (TopologyMode.PREFERRED, "rack"))
    assert (c.workers, c.gpus_per_worker, c.topology) == (8, 10, (TopologyMode.REQUIRED, "rack"))
    assert (plan.queues[0].nominal_gpus, plan.queues[0].borrowing_limit_gpus) == (80, 400)
    # 1 block x 3 racks x 4 nodes, each 96 CPUs x 4
    s = plan.shape
    assert (s.zones, s.blocks, s.racks, s.nodes_per_rack, s.gpus_per_node) == (1, 1, 3, 4, 384)
    assert any("balanced" in n for n in plan.notes)


def test_without_topology_one_node_holds_the_nominal_quota_so_placement_never_binds_first() -> None:
    """Kueue's run places nothing: only quota binds. One node of all the quota keeps it so."""
    plan = expand(parse(_config([SMALL, {**SMALL, "className": "large", "request": 20}])))
    assert plan.nominal_gpus == 80
    assert (plan.shape.node_count, plan.shape.gpus_per_node) == (1, 80)
    split = expand(parse(_config([SMALL, {**SMALL, "className": "large", "request": 20}])), node_gpus=20)
    assert (split.shape.node_count, split.shape.gpus_per_node) == (4, 20)
    assert expand(parse(_config([SMALL])), node_gpus=8).shape.node_count == 10  # 80 / 8


@pytest.mark.parametrize(
    ("workload", "topology", "match"),
    [
        ({**SMALL, "tasLevel": "x/rack", "tasConstraint": "required"}, None, "no topology"),
        ({**SMALL, "tasLevel": "x/row", "tasConstraint": "required"}, TOPOLOGY, "none of the topology"),
        ({**SMALL, "tasLevel": "x/rack", "tasConstraint": "spread"}, TOPOLOGY, "tasConstraint 'spread'"),
        ({**SMALL, "request": 65}, None, "1 to 64"),
        ({**SMALL, "request": "lots"}, None, "not a Kubernetes quantity"),
        ({**SMALL, "className": "Small"}, None, "not a valid Kubernetes name"),
    ],
)
def test_what_cannot_be_translated_is_said(workload: dict, topology: dict | None, match: str) -> None:
    with pytest.raises(GeneratorError, match=match):
        expand(parse(_config([workload], topology)))


def test_a_file_without_cohorts_is_refused_like_the_runner_does() -> None:
    with pytest.raises(GeneratorError, match="at least one cohort"):
        parse({"topology": None})


def test_unknown_keys_are_ignored_as_by_the_runner() -> None:
    raw = _config([{**SMALL, "futureField": 1}])
    raw["somethingNew"] = {"x": 1}
    assert expand(parse(raw)).jobs == 12


@pytest.mark.parametrize("name", ["smoke", "smoke-tas", "large-scale"])
def test_our_generator_files_translate(name: str) -> None:
    plan = expand(load(CONFIGS / name / "generator.yaml"))
    assert plan.jobs > 0
    if name == "large-scale":
        assert (len(plan.queues), plan.jobs) == (1000, 50_000)
