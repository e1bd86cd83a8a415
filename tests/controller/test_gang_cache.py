"""The cache holds gangs gpuq did not create as jobs: an Indexed Job and its pods, in any order."""

from __future__ import annotations

import itertools
from typing import Any

from gpuq.api import meta
from gpuq.controller.cache import ClusterCache
from gpuq.controller.gangs import indexed_job
from gpuq.controller.gangs.resolve import StrayCode

NS = "team-a"


def job(
    name: str = "llama", uid: str = "u-1", replicas: int = 4, rv: str = "1", **spec: Any
) -> dict[str, Any]:
    template = {
        "metadata": {"annotations": {meta.KUEUE_REQUIRED_TOPOLOGY: "gpuq.dev/rack"}},
        "spec": {
            "schedulerName": "gpuq",
            "containers": [{"name": "t", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "resourceVersion": rv,
            "creationTimestamp": "2026-12-06T10:00:00Z",
            "labels": {meta.LABEL_QUEUE: "team-a"},
        },
        "spec": {
            "completionMode": "Indexed",
            "parallelism": replicas,
            "completions": replicas,
            "template": template,
            **spec,
        },
    }


def pod(index: int, owner: str = "llama", uid: str = "u-1", node: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{owner}-{index}",
            "namespace": NS,
            "uid": f"p-{owner}-{index}",
            "resourceVersion": "5",
            "labels": {indexed_job.COMPLETION_INDEX: str(index)},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": uid, "controller": True}
            ],
        },
        "spec": {
            "schedulerName": "gpuq",
            "containers": [{"name": "t", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            **({"nodeName": node} if node else {}),
        },
        "status": {"phase": "Pending"},
    }


def cache() -> ClusterCache:
    c = ClusterCache()
    c.set_topology_labels({"gpuq.dev/rack": "rack"})
    return c


def test_an_indexed_job_and_its_pods_become_one_gang_whatever_arrives_first() -> None:
    events = [("owner:Job", job())] + [("pod", pod(i)) for i in range(4)]
    for order in itertools.permutations(events):
        c = cache()
        for kind, body in order:
            c.apply(kind, "ADDED", body)
        gang = c.jobs["team-a/job.llama"]
        assert gang.source == "Job" and gang.uid == "u-1" and gang.error is None
        assert (
            gang.spec is not None
            and gang.spec.workers.replicas == 4
            and gang.spec.workers.gpus_per_worker == 8
        )
        assert gang.spec.topology.level == "rack"
        pods = c.unclaimed_of("team-a/job.llama", "u-1")
        assert sorted(p.rank for p in pods if p.rank is not None) == [0, 1, 2, 3], order
        assert not c.gangs.strays


def test_a_trainingjob_of_the_same_name_is_another_job() -> None:
    c = cache()
    c.apply("owner:Job", "ADDED", job())
    tj = {
        "metadata": {"name": "llama", "namespace": NS, "uid": "t-1", "resourceVersion": "2"},
        "spec": {"queue": "team-a", "workers": {"replicas": 1, "gpusPerWorker": 1, "template": {}}},
    }
    c.apply("job", "ADDED", tj)
    assert {"team-a/llama", "team-a/job.llama"} <= set(c.jobs)
    assert c.jobs["team-a/llama"].source is None


def test_an_owner_gpuq_cannot_run_is_a_job_with_its_reason() -> None:
    c = cache()
    c.apply("owner:Job", "ADDED", job(completions=2))
    gang = c.jobs["team-a/job.llama"]
    assert gang.spec is None and gang.error is not None and gang.error.startswith("UnsupportedGang: ")


def test_pods_of_an_unknown_owner_wait_as_strays_with_a_reason() -> None:
    c = cache()
    c.apply("pod", "ADDED", pod(0, owner="other", uid="u-2"))
    stray = c.gangs.strays["team-a/other-0"]
    assert stray.code is StrayCode.MISSING_QUEUE and "other" in stray.message
    assert "team-a/other-0" not in c.pods  # unbound and nobody's: nothing the scheduler counts
    c.apply("pod", "DELETED", pod(0, owner="other", uid="u-2"))
    assert not c.gangs.strays


def test_deleting_the_owner_removes_the_gang_and_tells_the_snapshot() -> None:
    c = cache()
    sink = c.watch_jobs()
    c.apply("owner:Job", "ADDED", job())
    assert "team-a/job.llama" in sink
    sink.clear()
    c.replace("owner:Job", [], resource_version="9", scope=None)  # a relist without it
    assert "team-a/job.llama" not in c.jobs and "team-a/job.llama" in sink
    assert not c.orphans()  # garbage collection removes a Job's pods, not gpuq


def test_an_owner_update_that_changes_nothing_scheduled_does_not_wake_the_loop() -> None:
    c = cache()
    c.apply("owner:Job", "ADDED", job())
    before = c.changes
    c.apply("owner:Job", "MODIFIED", job(rv="2"))  # e.g. the Job controller's status write
    assert c.changes == before
    c.apply("owner:Job", "MODIFIED", job(rv="3", replicas=8))
    assert c.changes > before and c.jobs["team-a/job.llama"].spec.workers.replicas == 8  # type: ignore[union-attr]


def test_the_topology_level_follows_the_configs_labels() -> None:
    c = ClusterCache()
    c.apply("owner:Job", "ADDED", job())
    assert c.jobs["team-a/job.llama"].spec is None  # no level uses gpuq.dev/rack yet
    c.set_topology_labels({"gpuq.dev/rack": "rack"})
    spec = c.jobs["team-a/job.llama"].spec
    assert spec is not None and spec.topology.level == "rack"


def test_a_bound_gang_pod_takes_its_attempt_from_the_annotation_gpuq_binds_with() -> None:
    c = cache()
    c.apply("owner:Job", "ADDED", job())
    bound = pod(0, node="gpu-0")
    bound["metadata"]["annotations"] = {meta.LABEL_ATTEMPT: "3"}
    c.apply("pod", "ADDED", bound)
    entry = c.pods["team-a/llama-0"]
    assert (entry.job, entry.rank, entry.attempt, entry.node_name) == ("team-a/job.llama", 0, 3, "gpu-0")


def test_a_relisted_gang_pod_is_resolved_again_at_the_version_the_cache_holds() -> None:
    # Its entry depends on the owners the cache holds, not on the pod alone: a relist (a new term's
    # fresh lists) resolves it again even though its version did not change.
    c = cache()
    c.apply("owner:Job", "ADDED", job())
    c.replace("pod", [pod(0, node="n1")], "6")
    assert c.pods["team-a/llama-0"].job == "team-a/job.llama"
    c.apply("owner:Job", "DELETED", job())
    c.replace("pod", [pod(0, node="n1")], "7")
    assert c.pods["team-a/llama-0"].job is None  # bound, ownerless now: other pods' usage
