"""Owners gpuq did not create read as gangs: Indexed Jobs and PyTorchJobs (issue 30, first step)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from gpuq.api import meta
from gpuq.api.trainingjob import TrainingJobSpec
from gpuq.controller.gangs import indexed_job, pytorchjob, resolve
from gpuq.controller.gangs.demand import GangCode
from gpuq.core.model import TopologyMode

LEVELS = {"topology.kubernetes.io/zone": "zone", "gpuq.dev/rack": "rack", "kubernetes.io/hostname": "node"}


def template(gpus: int | str = 8, scheduler: str | None = "gpuq", **pod: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "train", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ],
        **pod,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"metadata": {}, "spec": spec}


def job(
    parallelism: Any = 4,
    completions: Any = 4,
    mode: str | None = "Indexed",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    tmpl: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "llama",
            "namespace": "team-a",
            "labels": {meta.LABEL_QUEUE: "team-a", **(labels or {})},
            "annotations": annotations or {},
        },
        "spec": {
            "parallelism": parallelism,
            "completions": completions,
            "template": tmpl or template(),
            **spec,
        },
    }
    if mode is not None:
        body["spec"]["completionMode"] = mode
    return body


def pytorch(master: int | None = 1, workers: int | None = 3, **spec: Any) -> dict[str, Any]:
    replicas = {}
    if master is not None:
        replicas["Master"] = {"replicas": master, "template": template()}
    if workers is not None:
        replicas["Worker"] = {"replicas": workers, "template": template()}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "bert", "namespace": "team-a", "labels": {meta.LABEL_QUEUE: "team-a"}},
        "spec": {"pytorchReplicaSpecs": replicas, **spec},
    }


def test_an_indexed_job_is_a_gang_of_its_parallelism_with_the_templates_gpus() -> None:
    d = indexed_job.demand(job(), LEVELS)
    assert d.error is None and d.size == 4 and not d.suspended
    assert isinstance(d.spec, TrainingJobSpec)
    assert (d.spec.queue, d.spec.workers.replicas, d.spec.workers.gpus_per_worker) == ("team-a", 4, 8)
    assert (d.spec.priority, d.spec.preemptible, d.spec.max_restarts) == (
        0,
        True,
        3,
    )  # a TrainingJob's defaults
    assert d.spec.checkpoint.request_on_preemption is False  # not asked unless the owner says so
    assert d.spec.workers.template == template()


def test_owner_labels_and_annotations_become_the_spec() -> None:
    d = indexed_job.demand(
        job(
            labels={meta.LABEL_PRIORITY: "100", meta.LABEL_PREEMPTIBLE: "false"},
            annotations={
                meta.ANNOTATION_MIN_RUNTIME: "600",
                meta.ANNOTATION_MAX_RESTARTS: "5",
                meta.ANNOTATION_CHECKPOINT_GRACE: "120",
                meta.ANNOTATION_TOPOLOGY_LEVEL: "rack",
                meta.ANNOTATION_TOPOLOGY_MODE: "Required",
            },
        ),
        LEVELS,
    )
    assert d.spec is not None, d.error
    s = d.spec
    assert (s.priority, s.preemptible, s.min_runtime_seconds, s.max_restarts) == (100, False, 600, 5)
    assert (s.checkpoint.request_on_preemption, s.checkpoint.grace_period_seconds) == (True, 120)
    assert (s.topology.level, s.topology.mode) == ("rack", TopologyMode.REQUIRED)


@pytest.mark.parametrize(
    ("key", "mode"),
    [
        (meta.KUEUE_REQUIRED_TOPOLOGY, TopologyMode.REQUIRED),
        (meta.KUEUE_PREFERRED_TOPOLOGY, TopologyMode.PREFERRED),
    ],
)
def test_kueues_topology_annotations_on_the_template_map_a_node_label_to_its_level(
    key: str, mode: TopologyMode
) -> None:
    t = template()
    t["metadata"] = {"annotations": {key: "gpuq.dev/rack"}}
    d = indexed_job.demand(job(tmpl=t), LEVELS)
    assert d.spec is not None, d.error
    assert (d.spec.topology.level, d.spec.topology.mode) == ("rack", mode)


def test_a_node_label_that_is_no_level_names_the_levels() -> None:
    t = template()
    t["metadata"] = {"annotations": {meta.KUEUE_REQUIRED_TOPOLOGY: "example.com/pod"}}
    d = indexed_job.demand(job(tmpl=t), LEVELS)
    assert d.spec is None and d.error is not None and d.error.code is GangCode.INVALID
    assert "example.com/pod" in d.error.message and "rack=gpuq.dev/rack" in d.error.message


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        (job(mode=None), GangCode.UNSUPPORTED, "completionMode NonIndexed"),
        (job(completions=8), GangCode.UNSUPPORTED, "parallelism 4 and completions 8"),
        (job(parallelism="4"), GangCode.UNSUPPORTED, "must be equal"),
        (job(parallelism=5000, completions=5000), GangCode.UNSUPPORTED, "1 to 4096"),
        (job(tmpl=template(scheduler=None)), GangCode.SCHEDULER_NAME, "unset (default-scheduler)"),
        (job(tmpl=template(scheduler="volcano")), GangCode.SCHEDULER_NAME, "volcano"),
        (job(tmpl=template(gpus=0)), GangCode.INVALID, "requests no nvidia.com/gpu"),
        (job(tmpl=template(gpus="lots")), GangCode.INVALID, "lots"),
        (job(labels={meta.LABEL_PRIORITY: "high"}), GangCode.INVALID, f"label {meta.LABEL_PRIORITY}"),
        (job(labels={meta.LABEL_PREEMPTIBLE: "maybe"}), GangCode.INVALID, "neither true nor false"),
        (job(labels={meta.LABEL_QUEUE: "Team_A"}), GangCode.INVALID, f"label {meta.LABEL_QUEUE}"),
        (
            job(annotations={meta.ANNOTATION_MAX_RESTARTS: "-1"}),
            GangCode.INVALID,
            meta.ANNOTATION_MAX_RESTARTS,
        ),
    ],
)
def test_what_cannot_be_a_gang_says_what_to_fix(body: dict[str, Any], code: GangCode, says: str) -> None:
    d = indexed_job.demand(body, LEVELS)
    assert d.spec is None and d.error is not None
    assert d.error.code is code and says in d.error.message, d.error


def test_a_malformed_owner_is_an_error_not_an_exception() -> None:
    for body in (
        {},
        {"spec": None},
        {"spec": {"completionMode": "Indexed", "parallelism": 2, "completions": 2}},
    ):
        d = indexed_job.demand(body, LEVELS)
        assert d.spec is None and d.error is not None
    assert pytorchjob.demand({"spec": {"pytorchReplicaSpecs": "x"}}, LEVELS).error is not None


def test_a_suspended_job_is_read_as_suspended() -> None:
    assert indexed_job.demand(job(suspend=True), LEVELS).suspended


def test_a_job_pods_rank_is_its_completion_index_from_label_or_annotation() -> None:
    label = {"metadata": {"labels": {indexed_job.COMPLETION_INDEX: "3"}}}
    annotation = {"metadata": {"annotations": {indexed_job.COMPLETION_INDEX: "2"}}}
    assert (indexed_job.rank(label), indexed_job.rank(annotation)) == (3, 2)
    assert indexed_job.rank({"metadata": {"labels": {indexed_job.COMPLETION_INDEX: "x"}}}) is None
    assert indexed_job.rank({}) is None


def test_a_pytorchjob_is_one_gang_of_master_and_workers() -> None:
    d = pytorchjob.demand(pytorch(), LEVELS)
    assert d.spec is not None, d.error
    assert d.size == 4 and d.spec.workers.replicas == 4 and d.spec.workers.gpus_per_worker == 8
    assert pytorchjob.demand(pytorch(master=None, workers=2), LEVELS).size == 2
    assert pytorchjob.demand(pytorch(master=1, workers=None), LEVELS).size == 1
    assert pytorchjob.demand(pytorch(runPolicy={"suspend": True}), LEVELS).suspended


def test_pytorchjob_ranks_put_the_master_first() -> None:
    def pod(kind: str, index: str) -> dict[str, Any]:
        labels = {pytorchjob.REPLICA_TYPE: kind, pytorchjob.REPLICA_INDEX: index}
        return {"metadata": {"labels": labels}}

    assert pytorchjob.rank(pod("master", "0"), masters=1) == 0
    assert [pytorchjob.rank(pod("worker", str(i)), masters=1) for i in range(3)] == [1, 2, 3]
    assert pytorchjob.rank(pod("worker", "0"), masters=0) == 0
    assert pytorchjob.rank(pod("ps", "0"), masters=1) is None


def test_pytorchjobs_gpuq_cannot_run_as_one_gang_are_refused() -> None:
    hetero = pytorch()
    hetero["spec"]["pytorchReplicaSpecs"]["Master"]["template"] = template(gpus=1)
    elastic = pytorch(elasticPolicy={"minReplicas": 1, "maxReplicas": 4})
    placed = pytorch()
    placed["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    cases = [
        (hetero, "Master asks for 1 GPUs and Worker for 8"),
        (elastic, "elastic"),
        (placed, "spec.nodeSelector"),
        (pytorch(master=2), "2 Masters"),
        (pytorch(master=None, workers=None), "no pytorchReplicaSpecs"),
    ]
    ps = copy.deepcopy(pytorch())
    ps["spec"]["pytorchReplicaSpecs"]["PS"] = {"replicas": 1, "template": template()}
    cases.append((ps, "replica types PS"))
    for body, says in cases:
        d = pytorchjob.demand(body, LEVELS)
        assert d.spec is None and d.error is not None and d.error.code is GangCode.UNSUPPORTED, (says, d)
        assert says in d.error.message, (says, d.error.message)
    fixed = pytorch(elasticPolicy={"minReplicas": 4, "maxReplicas": 4})
    assert pytorchjob.demand(fixed, LEVELS).spec is not None


# -- which gang a pod belongs to ------------------------------------------------------------------


def owned_pod(
    kind: str = "Job", api: str = "batch/v1", owner: str = "llama", uid: str = "u-1", **labels: str
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{owner}-0",
            "namespace": "team-a",
            "labels": labels,
            "ownerReferences": [
                {"apiVersion": api, "kind": kind, "name": owner, "uid": uid, "controller": True},
            ],
        },
        "spec": {"schedulerName": "gpuq"},
    }


def owners(*bodies: dict[str, Any]) -> Any:
    table = {(b["kind"], b["metadata"]["namespace"], b["metadata"]["name"]): b for b in bodies}
    return lambda kind, ns, name: table.get((kind, ns, name))


def with_uid(body: dict[str, Any], uid: str) -> dict[str, Any]:
    body["metadata"]["uid"] = uid
    return body


def test_a_job_pod_belongs_to_its_jobs_gang_at_its_completion_index() -> None:
    pod = owned_pod(**{indexed_job.COMPLETION_INDEX: "2"})
    got = resolve.resolve(pod, owners(with_uid(job(), "u-1")))
    assert got == resolve.Member("team-a/job.llama", "u-1", 2)
    assert resolve.is_candidate(pod)


def test_a_pytorchjob_pod_belongs_to_its_gang_after_the_master() -> None:
    pod = owned_pod(
        "PyTorchJob", "kubeflow.org/v1", "bert", "u-2",
        **{pytorchjob.REPLICA_TYPE: "worker", pytorchjob.REPLICA_INDEX: "1"},
    )  # fmt: skip
    got = resolve.resolve(pod, owners(with_uid(pytorch(), "u-2")))
    assert got == resolve.Member("team-a/pytorchjob.bert", "u-2", 2)
    no_master = with_uid(pytorch(master=None, workers=2), "u-2")
    assert resolve.resolve(pod, owners(no_master)) == resolve.Member("team-a/pytorchjob.bert", "u-2", 1)


def test_gang_keys_never_collide_with_trainingjob_keys() -> None:
    assert resolve.gang_key("ns", "Job", "llama") == "ns/job.llama"
    assert not re.match(meta.DNS_LABEL_PATTERN, "job.llama")  # a TrainingJob name cannot hold a dot


def test_pods_that_belong_to_no_gang_say_why() -> None:
    bare = owned_pod()
    bare["metadata"]["ownerReferences"] = []
    cases = [
        (bare, owners(), resolve.StrayCode.NO_OWNER, "no controller"),
        (
            owned_pod("ReplicaSet", "apps/v1", "web"),
            owners(),
            resolve.StrayCode.UNKNOWN_OWNER_KIND,
            "ReplicaSet",
        ),
        (owned_pod(), owners(), resolve.StrayCode.MISSING_QUEUE, f"no {meta.LABEL_QUEUE} label"),
        (owned_pod(), owners(with_uid(job(), "u-9")), resolve.StrayCode.NO_OWNER, "is gone"),
        (owned_pod(), owners(with_uid(job(), "u-1")), resolve.StrayCode.NO_RANK, "no rank"),
    ]
    for pod, lookup, code, says in cases:
        got = resolve.resolve(pod, lookup)
        assert isinstance(got, resolve.Stray) and got.code is code and says in got.message, (code, got)


def test_only_pods_asking_for_gpuq_and_not_a_trainingjobs_are_candidates() -> None:
    other = owned_pod()
    other["spec"]["schedulerName"] = "default-scheduler"
    ours = owned_pod(**{meta.LABEL_JOB_NAME: "train"})
    assert not resolve.is_candidate(other) and not resolve.is_candidate(ours)
