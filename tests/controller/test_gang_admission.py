"""Gangs gpuq did not create (an Indexed Job's pods): admitted only once every rank has its pod,
bound all or nothing with the attempt written by the binding, their status kept by the operator,
and their owners watched only where the cluster serves them."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from builders import RecordingWriter
from fakeapi import FakeApi, Reply, client, serve
from test_gang_cache import job, pod

from gpuq.api import meta
from gpuq.api.trainingjob import Phase
from gpuq.controller import bodies as b
from gpuq.controller import intents, lifecycle
from gpuq.controller.cache import ClusterCache
from gpuq.controller.gangs.resolve import Stray, StrayCode
from gpuq.controller.gangs.strays import STRAY_GRACE, StrayReporter
from gpuq.controller.informer import Informer
from gpuq.controller.loop import SchedulingLoop
from gpuq.controller.metrics import Metrics
from gpuq.controller.snapshot import GANG_INCOMPLETE, SUSPENDED, SnapshotBuilder, gang_shortfall
from gpuq.controller.writer import GangPodsMissing, Writer
from gpuq.core import SchedulerConfig, schedule

NS = "team-a"
GANG = "team-a/job.llama"


def cluster(replicas: int = 2) -> ClusterCache:
    cache = ClusterCache()
    cache.set_topology_labels({"gpuq.dev/rack": "rack"})
    cache.replace("namespace", [b.namespace(NS)], "1")
    cache.replace("node", [b.node("n1"), b.node("n2"), b.node("n3")], "1")
    cache.replace("queue", [b.queue("team-a", nominal=24)], "1")
    cache.replace("job", [], "1")
    cache.replace("pod", [], "1")
    cache.apply("owner:Job", "ADDED", job(replicas=replicas))
    return cache


def test_a_gang_is_admitted_only_once_every_rank_has_exactly_one_pod() -> None:
    cache = cluster()
    metrics = Metrics()
    loop = SchedulingLoop(
        cache, RecordingWriter(cache, metrics), SchedulerConfig(), metrics, schedule, lambda: b.T0
    )
    cache.apply("pod", "ADDED", pod(0))
    why = gang_shortfall(cache.jobs[GANG], cache)
    assert why is not None and why.reason == GANG_INCOMPLETE and why.message.startswith("1 of its 2 workers")
    assert loop.cycle().admit == ()  # rank 1 has no pod yet: nothing of the gang is placed
    extra = pod(0)
    extra["metadata"]["name"], extra["metadata"]["uid"] = "llama-0-x", "p-llama-0-x"
    cache.apply("pod", "ADDED", extra)
    cache.apply("pod", "ADDED", pod(1))
    why = gang_shortfall(cache.jobs[GANG], cache)
    assert why is not None and "rank 0 has 2" in why.message
    assert loop.cycle().admit == ()  # two pods claim rank 0: which one to bind is not gpuq's guess
    cache.apply("pod", "DELETED", extra)
    assert gang_shortfall(cache.jobs[GANG], cache) is None
    admitted = loop.cycle().admit
    assert [a.job for a in admitted] == [GANG] and len(admitted[0].placement) == 2


def test_the_operator_keeps_a_gangs_status_and_rebuilds_it_from_bound_pods() -> None:
    cache = cluster()
    gang = cache.jobs[GANG]
    assert gang.status.attempt == 0 and gang.source == "Job"
    fresh = cache.set_gang_status(GANG, gang.status.model_copy(update={"phase": Phase.RUNNING, "attempt": 1}))
    assert fresh is not None and fresh.status.phase is Phase.RUNNING and cache.jobs[GANG] is fresh
    # An operator started later sees only the pods, bound with their attempt by the earlier one.
    restarted = cluster()
    for i, node in enumerate(("n1", "n2")):
        body = pod(i, node=node)
        body["metadata"]["annotations"] = {meta.LABEL_ATTEMPT: "3"}
        restarted.apply("pod", "ADDED", body)
    entry = restarted.jobs[GANG]
    assert entry.status.attempt == 2  # so attempt 3's bound gang is the admission to record
    assert [p.attempt for p in restarted.pods_of(GANG)] == [3, 3]


async def test_binding_writes_uid_and_attempt_and_binds_nothing_while_a_rank_has_no_pod() -> None:
    cache = cluster()
    for i in range(2):
        cache.apply("pod", "ADDED", pod(i))
    fake = FakeApi()
    for i in range(2):
        fake.on("POST", f"/api/v1/namespaces/{NS}/pods/llama-{i}/binding", Reply(201, {}))
    async for server in serve(fake):
        async with client(server) as api:
            writer = Writer(api, cache, Metrics(), on_done=lambda: None, clock=lambda: b.T0)
            bound: dict[str, str] = {}
            await writer._bind_gang(cache.jobs[GANG], 1, ("n2", "n3"), bound)
    seen = {s.path.split("/")[-2]: s.body for s in fake.seen}
    assert sorted(seen) == ["llama-0", "llama-1"]
    assert seen["llama-1"]["metadata"]["uid"] == "p-llama-1"
    assert seen["llama-1"]["metadata"]["annotations"] == {meta.LABEL_ATTEMPT: "1"}
    assert seen["llama-1"]["target"]["name"] == "n3"
    assert bound == {f"{NS}/llama-0": "p-llama-0", f"{NS}/llama-1": "p-llama-1"}
    assert [(p.node_name, p.attempt) for p in cache.pods_of(GANG)] == [("n2", 1), ("n3", 1)]

    lonely = cluster()
    lonely.apply("pod", "ADDED", pod(0))
    ticks = itertools.count()
    fake = FakeApi()
    async for server in serve(fake):
        async with client(server) as api:
            writer = Writer(
                api, lonely, Metrics(), on_done=lambda: None, clock=lambda: b.T0 + 30 * next(ticks)
            )
            with pytest.raises(GangPodsMissing, match="no pod to bind for rank 1"):
                await writer._bind_gang(lonely.jobs[GANG], 1, ("n2", "n3"), {})
    assert fake.seen == []  # all or nothing: rank 0 was not bound either


async def test_an_owner_kind_the_cluster_does_not_serve_counts_as_synced_and_empty() -> None:
    path = "/apis/kubeflow.org/v1/pytorchjobs"
    fake = FakeApi()
    fake.on("GET", path, Reply(404, {"reason": "NotFound", "message": "the server could not find it"}))
    cache = ClusterCache()
    async for server in serve(fake):
        async with client(server) as api:
            inf = Informer(api, "owner:PyTorchJob", path, cache, params={"labelSelector": "q"}, optional=True)
            task = asyncio.create_task(inf.run())
            await asyncio.wait_for(inf.synced.wait(), 5)
            task.cancel()
    assert not inf.served and cache.jobs == {}
    assert fake.requests("GET", path)[0].query["labelSelector"] == "q"


def test_a_stray_pod_is_told_once_after_the_grace_and_again_for_a_new_reason() -> None:
    reporter = StrayReporter(grace=10.0)
    missing = Stray(StrayCode.MISSING_QUEUE, "its owner Job other has no gpuq.dev/queue label")
    assert reporter.due({"ns/p": missing}, 100.0) == ([], 110.0)  # its owner may just not be seen yet
    assert reporter.due({"ns/p": missing}, 105.0) == ([], 110.0)
    assert reporter.due({"ns/p": missing}, 110.0) == ([("ns/p", missing)], None)
    assert reporter.due({"ns/p": missing}, 500.0) == ([], None)  # told once
    no_rank = Stray(StrayCode.NO_RANK, "no completion index")
    assert reporter.due({"ns/p": no_rank}, 501.0) == ([], 511.0)
    assert reporter.due({"ns/p": no_rank}, 511.0) == ([("ns/p", no_rank)], None)
    assert reporter.due({}, 512.0) == ([], None)
    assert reporter.due({"ns/p": no_rank}, 513.0) == ([], 523.0)  # a new pod of the same name: anew


def test_the_loop_posts_the_stray_event_on_the_pod() -> None:
    cache = cluster()
    now = [b.T0]
    metrics = Metrics()
    writer = RecordingWriter(cache, metrics)
    loop = SchedulingLoop(cache, writer, SchedulerConfig(), metrics, schedule, lambda: now[0])
    cache.apply("pod", "ADDED", pod(0, owner="other", uid="u-2"))
    loop.cycle()
    assert "stray:team-a/other-0" not in writer.submitted
    now[0] += STRAY_GRACE
    loop.cycle()
    assert "stray:team-a/other-0" in writer.submitted


async def test_a_gang_is_evicted_by_suspending_its_owner_and_resumed_once_its_workers_are_gone() -> None:
    cache = cluster()
    suspended = job(rv="2")
    suspended["spec"]["suspend"] = True
    suspended["metadata"]["annotations"] = {meta.ANNOTATION_SUSPENDED_BY: "gpuq"}
    fake = FakeApi()
    path = f"/apis/batch/v1/namespaces/{NS}/jobs/llama"
    fake.on("PATCH", path, Reply(200, suspended))
    async for server in serve(fake):
        async with client(server) as api:
            writer = Writer(api, cache, Metrics(), on_done=lambda: None, clock=lambda: b.T0)
            await writer.suspend_owner(cache.jobs[GANG], True)
    assert fake.requests("PATCH", path)[0].body == {
        "spec": {"suspend": True},
        "metadata": {"annotations": {meta.ANNOTATION_SUSPENDED_BY: "gpuq"}},
    }
    gang = cache.jobs[GANG]
    assert gang.parked and gang.spec is not None and not gang.spec.suspend  # evicted, not stopped
    preempted = gang.status.model_copy(update={"phase": Phase.PREEMPTED, "attempt": 1})
    gang = cache.set_gang_status(GANG, preempted)
    assert gang is not None
    cfg = SchedulerConfig().failover
    worker = pod(0, node="n1")
    worker["metadata"]["annotations"] = {meta.LABEL_ATTEMPT: "1"}
    cache.apply("pod", "ADDED", worker)
    assert not lifecycle.observe(gang, cache.pods_of(GANG), b.T0, cfg).resume_owner  # still running
    cache.apply("pod", "DELETED", worker)
    plan = lifecycle.observe(gang, cache.pods_of(GANG), b.T0, cfg)
    assert plan.resume_owner and plan.status["phase"] == Phase.QUEUED


def test_a_job_its_user_suspended_is_a_stopped_gang_not_a_parked_one() -> None:
    cache = cluster()
    user = job(rv="2")
    user["spec"]["suspend"] = True
    cache.apply("owner:Job", "MODIFIED", user)
    gang = cache.jobs[GANG]
    assert gang.spec is not None and gang.spec.suspend and not gang.parked


def test_kueues_topology_annotation_names_a_level_by_the_configs_node_label() -> None:
    """The operator tells the cache the config's levels: a template annotated with Kueue's
    podset-required-topology of `gpuq.dev/rack` asks for the config's rack level."""
    cache = ClusterCache()  # no labels given: what the operator starts with
    cache.replace("namespace", [b.namespace(NS)], "1")
    cache.replace("node", [b.node("n1")], "1")
    cache.replace("queue", [b.queue("team-a", nominal=24)], "1")
    cache.apply("owner:Job", "ADDED", job(replicas=2))
    before = cache.jobs[GANG]
    assert before.spec is None and before.error is not None and "gpuq.dev/rack" in before.error
    metrics = Metrics()
    loop = SchedulingLoop(
        cache, RecordingWriter(cache, metrics), SchedulerConfig(), metrics, schedule, lambda: b.T0
    )
    loop.cycle()
    after = cache.jobs[GANG]
    assert after.spec is not None and after.spec.topology.level == "rack"


async def test_a_gangs_status_is_written_to_its_gang_object_created_on_the_first_write() -> None:
    cache = cluster()
    fake = FakeApi()
    gangs = f"/apis/gpuq.dev/v1alpha1/namespaces/{NS}/gangs"
    status_path = f"{gangs}/job.llama/status"
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "uid": "u-1"}
    stored = {  # what the API server answers each status write with
        "apiVersion": "gpuq.dev/v1alpha1",
        "kind": "Gang",
        "metadata": {"name": "job.llama", "namespace": NS, "uid": "g-1", "resourceVersion": "7"},
        "spec": {"owner": owner},
    }
    fake.on("POST", gangs, Reply(201, stored))
    fake.on(
        "PATCH",
        status_path,
        Reply(200, {**stored, "status": {"phase": "Queued", "message": "waits"}}),
        Reply(
            200,
            {
                **stored,
                "metadata": {**stored["metadata"], "resourceVersion": "8"},
                "status": {"phase": "Queued", "message": "still waits"},
            },
        ),
    )
    async for server in serve(fake):
        async with client(server) as api:
            writer = Writer(api, cache, Metrics(), on_done=lambda: None, clock=lambda: b.T0)
            fresh = await writer.patch_job_status(cache.jobs[GANG], {"phase": "Queued", "message": "waits"})
            assert fresh.status.phase is Phase.QUEUED and cache.jobs[GANG].status.message == "waits"
            created = fake.requests("POST", gangs)[0].body
            assert created["metadata"]["name"] == "job.llama"
            assert created["metadata"]["ownerReferences"] == [
                {**owner, "controller": False, "blockOwnerDeletion": False}
            ]
            assert created["spec"] == {"owner": owner, "queue": "team-a", "workers": 2}
            first = fake.requests("PATCH", status_path)[0].body["status"]
            assert first["phase"] == "Queued" and first["message"] == "waits" and first["attempt"] == 0
            cache.apply("gang", "ADDED", stored)  # the informer reports the Gang (no status yet)
            assert cache.jobs[GANG].status.message == "waits"  # an empty Gang says nothing
            await writer.patch_job_status(cache.jobs[GANG], {"message": "still waits"})
    assert len(fake.requests("POST", gangs)) == 1  # later writes send only what changed
    assert fake.requests("PATCH", status_path)[1].body == {"status": {"message": "still waits"}}
    assert cache.jobs[GANG].status.message == "still waits"


async def test_without_the_gang_crd_the_status_stays_in_memory() -> None:
    cache = cluster()
    fake = FakeApi()
    gangs = f"/apis/gpuq.dev/v1alpha1/namespaces/{NS}/gangs"
    fake.on("POST", gangs, Reply(404, {"reason": "NotFound", "message": "the server could not find it"}))
    async for server in serve(fake):
        async with client(server) as api:
            writer = Writer(api, cache, Metrics(), on_done=lambda: None, clock=lambda: b.T0)
            await writer.patch_job_status(cache.jobs[GANG], {"phase": "Queued"})
            await writer.patch_job_status(cache.jobs[GANG], {"message": "waits"})
    assert cache.jobs[GANG].status.phase is Phase.QUEUED and cache.jobs[GANG].status.message == "waits"
    assert len(fake.seen) == 1  # asked once


def test_a_new_leader_takes_a_gangs_status_from_its_gang_object() -> None:
    cache = cluster()
    record = {
        "apiVersion": "gpuq.dev/v1alpha1",
        "kind": "Gang",
        "metadata": {"name": "job.llama", "namespace": NS, "uid": "g-1", "resourceVersion": "9"},
        "spec": {"owner": {"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "uid": "u-1"}},
        "status": {"phase": "Queued", "attempt": 2, "restarts": 1},
    }
    cache.apply("gang", "ADDED", {**record, "status": {}})  # created, not written: says nothing
    assert cache.jobs[GANG].status.attempt == 0
    cache.apply("gang", "MODIFIED", {**record, "metadata": {**record["metadata"], "resourceVersion": "10"}})
    assert cache.jobs[GANG].status.attempt == 2 and cache.jobs[GANG].status.restarts == 1
    stale = {
        **record,
        "spec": {"owner": {"uid": "u-old"}},
        "metadata": {**record["metadata"], "resourceVersion": "11"},
    }
    cache.apply("gang", "MODIFIED", stale)  # a Gang of an earlier Job of the same name
    assert cache.jobs[GANG].status.attempt == 0


async def test_a_gang_gpuq_cannot_run_gets_its_gang_object_with_its_owners_queue() -> None:
    cache = cluster()
    cache.apply("owner:Job", "MODIFIED", job(rv="2", completions=3))  # completions != parallelism
    gang = cache.jobs[GANG]
    assert gang.spec is None and gang.error_reason == "UnsupportedGang"
    fake = FakeApi()
    gangs = f"/apis/gpuq.dev/v1alpha1/namespaces/{NS}/gangs"
    fake.on("POST", gangs, Reply(201, {}))
    fake.on("PATCH", f"{gangs}/job.llama/status", Reply(404, {"reason": "NotFound", "message": "gone"}))
    async for server in serve(fake):
        async with client(server) as api:
            writer = Writer(api, cache, Metrics(), on_done=lambda: None, clock=lambda: b.T0)
            await writer.patch_job_status(gang, {"phase": "Queued", "message": gang.error})
    created = fake.requests("POST", gangs)[0].body
    assert created["metadata"]["labels"] == {meta.LABEL_QUEUE: "team-a"}
    assert created["spec"]["queue"] == "team-a" and created["spec"]["workers"] == 0
    assert cache.jobs[GANG].status.message == gang.error  # kept in memory all the same


def test_a_gang_whose_owner_ended_is_recorded_finished_and_never_placed_again() -> None:
    cache = cluster()
    failed = job(rv="3")
    failed["status"] = {
        "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
    }
    cache.apply("owner:Job", "MODIFIED", failed)
    gang = cache.jobs[GANG]
    assert gang.ended == "Failed"
    plan = lifecycle.observe(gang, [], b.T0, SchedulerConfig().failover)
    assert plan.status["phase"] == Phase.FAILED and plan.events[0].reason == "Failed"
    for i in range(2):  # its pods, made again before it failed, never make it a gang to place
        cache.apply("pod", "ADDED", pod(i))
    metrics = Metrics()
    loop = SchedulingLoop(
        cache, RecordingWriter(cache, metrics), SchedulerConfig(), metrics, schedule, lambda: b.T0
    )
    assert loop.cycle().admit == ()
    done = job(rv="4")
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    cache.apply("owner:Job", "MODIFIED", done)
    assert cache.jobs[GANG].ended == "Succeeded"


def test_a_gang_its_user_suspends_while_running_is_suspended_not_restarted() -> None:
    cache = cluster()
    running = {
        "phase": "Running",
        "attempt": 1,
        "placement": [{"rank": 0, "node": "n1"}, {"rank": 1, "node": "n2"}],
    }
    cache.set_gang_status(GANG, cache.jobs[GANG].status.model_validate(running))
    user = job(rv="2")
    user["spec"]["suspend"] = True  # its controller deletes the pods at once
    cache.apply("owner:Job", "MODIFIED", user)
    plan = lifecycle.observe(cache.jobs[GANG], [], b.T0, SchedulerConfig().failover)
    assert plan.status["phase"] == Phase.SUSPENDED and "restarts" not in plan.status
    assert [e.reason for e in plan.events] == ["Suspended"]


def test_a_gang_its_user_suspends_before_its_admission_is_recorded_is_suspended() -> None:
    # The race the stop/resume e2e test found: gpuq bound the gang, its user suspended the owner and
    # the owner's controller deleted the pods before a cycle recorded the admission.
    cache = cluster()
    for i, node in enumerate(("n1", "n2")):
        body = pod(i, node=node)
        body["metadata"]["annotations"] = {meta.LABEL_ATTEMPT: "1"}
        cache.apply("pod", "ADDED", body)
    builder = SnapshotBuilder()
    assert GANG not in builder.build(cache, b.T0, SchedulerConfig()).excluded  # bound, unrecorded
    user = job(rv="2", replicas=2)
    user["spec"]["suspend"] = True
    cache.apply("owner:Job", "MODIFIED", user)
    for i in range(2):
        cache.apply("pod", "DELETED", pod(i))
    why = builder.build(cache, b.T0 + 1, SchedulerConfig()).excluded[GANG]
    assert why.reason == SUSPENDED, why  # not GangIncomplete: a suspended owner has no pods by design
    patch, events = intents.blocked_status(cache.jobs[GANG], why, b.T0 + 1)
    assert patch["phase"] == Phase.SUSPENDED and [e.reason for e in events] == ["Suspended"]
