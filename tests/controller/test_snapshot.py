"""Snapshot building: what the core sees of nodes, queues and jobs, and what is kept out and why."""

from __future__ import annotations

import copy

from builders import T0, gang_pods, iso, job, namespace, node, placed_status, pod, queue

from gpuq.controller.cache import ClusterCache
from gpuq.controller.snapshot import SnapshotBuilder, View
from gpuq.core import schedule
from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import PendingCode
from gpuq.core.model import GPU, Health, Topology, TopologyMode

CFG = SchedulerConfig()


def build(
    *bodies: dict, now: float = T0 + 100, evicting: frozenset[str] = frozenset(), cfg: SchedulerConfig = CFG
) -> View:
    cache = ClusterCache()
    for b in bodies:
        getattr(
            cache, f"upsert_{ {'GPUQueue': 'queue', 'TrainingJob': 'job'}.get(b['kind'], b['kind'].lower()) }"
        )(b)
    return SnapshotBuilder().build(cache, now, cfg, evicting)


def nodes_of(view: View) -> dict:
    return {n.name: n for n in view.snapshot.nodes}


def jobs_of(view: View) -> dict:
    return {j.key: j for j in view.snapshot.jobs}


def test_node_paths_follow_topology_labels() -> None:
    bare = node("n2")
    del bare["metadata"]["labels"]["gpuq.dev/block"]
    del bare["metadata"]["labels"]["topology.kubernetes.io/zone"]
    v = build(node("n1", rack="r1", block="b1", zone="z1"), bare)
    assert nodes_of(v)["n1"].path == ("z1", "b1", "r1", "n1")
    # Missing zone/block labels do not split the parent: the rack still counts.
    assert nodes_of(v)["n2"].path == ("", "", "rack-0", "n2")
    assert nodes_of(v)["n1"].allocatable.gpus == 8 and nodes_of(v)["n1"].gpu_model == "H100"


def test_node_health_from_conditions_taints_cordon_and_deletion() -> None:
    tainted = node("tainted")
    tainted["spec"]["taints"] = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]
    cordoned = node("cordoned")
    cordoned["spec"]["unschedulable"] = True
    deleting = node("deleting", deletionTimestamp="2023-11-14T22:15:00Z")
    v = build(node("ok"), node("down", ready=False, since=T0 + 95), tainted, cordoned, deleting, now=T0 + 100)
    n = nodes_of(v)
    assert n["ok"].health == Health.HEALTHY and n["ok"].not_ready_since is None
    assert n["down"].not_ready_since == T0 + 95  # the core applies the grace period
    assert n["tainted"].health == Health.HEALTHY  # NotReady restated: the core's grace period decides
    assert n["cordoned"].health == Health.CORDONED
    assert n["deleting"].health == Health.FAILED
    assert v.wake_at == T0 + 95 + CFG.failover.not_ready_grace_seconds


def test_unhealthy_gpus_are_reported() -> None:
    sick = node("sick")
    sick["status"]["allocatable"]["nvidia.com/gpu"] = "6"  # device plugin dropped two GPUs
    assert nodes_of(build(sick))["sick"].healthy_gpus == 6
    assert nodes_of(build(node("fine")))["fine"].healthy_gpus is None


def test_queue_and_job_translation() -> None:
    v = build(
        node("n1"),
        queue("q", 16, cohort="c", borrowingLimitGPUs=8, weight=2, queueingStrategy="StrictFIFO"),
        node("n2"),
        job("a", priority=5, topology={"level": "rack", "mode": "Required"}, minRuntimeSeconds=30),
    )
    q = v.snapshot.queues[0]
    assert (q.name, q.nominal_gpus, q.cohort, q.borrowing_limit_gpus, q.weight, q.strategy) == (
        "q",
        16,
        "c",
        8,
        2.0,
        "StrictFIFO",
    )
    j = jobs_of(v)["team-a/a"]
    assert (j.queue, j.priority, j.workers.replicas, j.workers.gpus_per_worker) == ("q", 5, 2, 8)
    assert j.workers.cpu_millis == 4000 and j.workers.memory_bytes == 16 * 2**30
    assert j.topology.level == "rack" and j.topology.mode == TopologyMode.REQUIRED
    assert j.min_runtime_seconds == 30 and j.running is None and j.created_at == T0


def test_template_constraints_reach_the_core() -> None:
    template = {
        "spec": {
            "containers": [{"name": "c", "image": "i"}],
            "nodeSelector": {"pool": "a"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "gpuq.dev/rack", "operator": "In", "values": ["r1"]}
                                ]
                            }
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 10,
                            "preference": {"matchExpressions": [{"key": "fast", "operator": "Exists"}]},
                        }
                    ],
                }
            },
        }
    }
    workers_extra = job("a", replicas=1, template=template)
    workers_extra["spec"]["workers"].update(gpuModels=["H100"], mixedModels=True)
    c = jobs_of(build(node("n1"), queue("q"), workers_extra))["team-a/a"].constraints
    assert c.node_selector == {"pool": "a"}
    assert c.required_terms[0].match_expressions[0].values == ("r1",)
    assert c.preferred_terms[0].weight == 10
    assert c.tolerations[0].key == "dedicated" and c.tolerations[0].effect == "NoSchedule"
    assert c.gpu_models == ("H100",) and c.mixed_models


def test_running_job_holds_its_placement_and_its_pods_are_not_double_counted() -> None:
    nodes = ["n1", "n2"]
    v = build(
        node("n1"),
        node("n2"),
        queue("q"),
        job("a", status=placed_status(nodes, attempt=2)),
        *gang_pods("a", nodes, attempt=2),
        pod("a-1-0", node_name="n1", job_name="a", attempt=1, deleting=True),  # previous attempt, leaving
        pod("web", "default", node_name="n2", scheduler="default-scheduler", gpus=2),
        pod("done", "default", node_name="n2", scheduler="default-scheduler", phase="Succeeded", gpus=8),
    )
    j = jobs_of(v)["team-a/a"]
    assert j.running is not None and j.running.placement == ("n1", "n2") and j.running.started_at == T0 + 20
    n = nodes_of(v)
    assert n["n1"].used_by_others.gpus == 8  # the old attempt's pod still holds its GPUs
    assert n["n2"].used_by_others.gpus == 2  # the foreign running pod; the finished one is free
    assert v.holding["team-a/a"].attempt == 2


def test_assumed_admission_counts_before_the_api_says_so() -> None:
    cache = ClusterCache()
    cache.upsert_node(node("n1"))
    cache.upsert_queue(queue("q"))
    cache.upsert_job(job("a", replicas=1))
    cache.assume("team-a/a", 1, ("n1",), T0)
    v = SnapshotBuilder().build(cache, T0 + 1, CFG)
    assert jobs_of(v)["team-a/a"].running.placement == ("n1",)  # type: ignore[union-attr]


def test_jobs_kept_out_say_why() -> None:
    restricted = queue("locked", namespaceSelector={"matchLabels": {"team": "b"}})
    bad_template = job("tmpl", template={"spec": {"containers": []}})
    lots = {"name": "a", "image": "i", "resources": {"requests": {"cpu": "lots"}}}
    bad_cpu = job("cpu", template={"spec": {"containers": [lots]}})
    v = build(
        node("n1"),
        node("n2"),
        queue("q"),
        restricted,
        namespace("team-a", team="a"),
        job("orphan", queue_name="missing"),
        job("wrongns", queue_name="locked"),
        job("lvl", topology={"level": "pod", "mode": "Required"}),
        bad_template,
        bad_cpu,
        job("huge", replicas=3),  # 24 GPUs > 16 in the cluster
        job("wide", replicas=1, gpus=16),  # no node has 16
        job("fine"),
    )
    ex = {k.split("/")[1]: (e.reason, e.message) for k, e in v.excluded.items()}
    assert ex["orphan"][0] == "QueueNotFound" and "'missing' does not exist" in ex["orphan"][1]
    assert ex["wrongns"][0] == "NamespaceNotAllowed" and "team=b" in ex["wrongns"][1]
    assert ex["lvl"][0] == "UnknownTopologyLevel" and "zone, block, rack, node" in ex["lvl"][1]
    assert ex["tmpl"][0] == "InvalidPodTemplate" and "spec.workers.template.spec.containers:" in ex["tmpl"][1]
    assert ex["cpu"] == (
        "InvalidPodTemplate",
        "spec.workers.template.spec.containers[0].resources.requests.cpu: not a Kubernetes quantity: 'lots'",
    )
    assert ex["huge"][0] == "ExceedsCapacity" and "24 GPUs" in ex["huge"][1]
    assert ex["wide"][0] == "ExceedsCapacity" and "largest node has 8" in ex["wide"][1]
    assert list(jobs_of(v)) == ["team-a/fine"]


def test_finished_jobs_are_not_scheduled() -> None:
    v = build(
        node("n1"), queue("q"), job("a", status={"phase": "Succeeded"}), job("b", status={"phase": "Failed"})
    )
    assert v.snapshot.jobs == ()


def test_running_job_of_a_deleted_queue_stays_running_in_the_snapshot_and_fails_over() -> None:
    """Its GPUs count through its placement, as before its queue went; and since the core sees it,
    a node dying under it fails it over (issue 33: it used to stay Running on a dead node)."""
    bodies = (
        node("n1"),
        node("n2"),
        node("n3"),
        node("n4"),
        job("a", queue_name="gone", status=placed_status(["n1", "n2"])),
        *gang_pods("a", ["n1", "n2"]),
    )
    v = build(*bodies)
    a = jobs_of(v)["team-a/a"]
    assert a.running is not None and a.running.placement == ("n1", "n2")
    assert "team-a/a" not in v.excluded and v.blocked["team-a/a"].reason == "QueueNotFound"
    assert nodes_of(v)["n1"].used_by_others.gpus == 0  # counted through its placement
    dead = build(node("n1", ready=False, since=T0), *bodies[1:], now=T0 + 100)
    d = schedule(dead.snapshot, T0 + 100, CFG)
    assert [(r.job, r.failed_nodes) for r in d.restart] == [("team-a/a", ("n1",))]
    assert d.admit == ()  # no queue to charge it to: it waits
    assert {p.job: p.code for p in d.pending} == {"team-a/a": PendingCode.QUEUE_NOT_FOUND}


def test_running_job_its_queue_no_longer_admits_is_failed_over_too() -> None:
    locked = queue("q", namespaceSelector={"matchLabels": {"team": "b"}})
    v = build(
        node("n1", ready=False, since=T0),
        node("n2"),
        node("n3"),
        locked,
        namespace("team-a", team="a"),
        job("a", replicas=1, status=placed_status(["n1"])),
        *gang_pods("a", ["n1"]),
        now=T0 + 100,
    )
    assert v.blocked["team-a/a"].reason == "NamespaceNotAllowed"
    d = schedule(v.snapshot, T0 + 100, CFG)
    assert [r.job for r in d.restart] == ["team-a/a"]


def test_node_deleted_under_a_running_job_is_a_failed_node() -> None:
    v = build(node("n1"), queue("q"), job("a", status=placed_status(["n1", "gone"])))
    gone = nodes_of(v)["gone"]
    assert gone.health == Health.FAILED and gone.path[-1] == "gone"
    assert len(gone.path) == len(Topology().levels)


def test_recovering_job_and_backoff() -> None:
    status = {
        "phase": "Recovering",
        "attempt": 1,
        "restarts": 1,
        "failedNodes": ["n9"],
        "previousPlacement": [{"rank": 1, "node": "n2"}, {"rank": 0, "node": "n1"}],
        "notBefore": "2023-11-14T22:20:00Z",
    }
    v = build(node("n1"), node("n2"), queue("q"), job("a", status=status), now=T0 + 100)
    j = jobs_of(v)["team-a/a"]
    assert j.recovering and j.running is None and j.restart_count == 1
    assert j.avoid_nodes == frozenset({"n9"}) and j.previous_placement == ("n1", "n2")
    assert j.not_before == T0 + 400 and v.wake_at == T0 + 400


def test_preemption_victim_holds_its_nodes_until_its_pods_are_gone() -> None:
    status = {"phase": "Preempted", "attempt": 1, "previousPlacement": [{"rank": 0, "node": "n1"}]}
    bodies = (node("n1"), queue("q"), job("v", replicas=1, status=status), *gang_pods("v", ["n1"]))
    held = build(*bodies, evicting=frozenset({"team-a/v"}))
    j = jobs_of(held)["team-a/v"]
    assert j.evicting and j.running is not None and j.running.placement == ("n1",)
    assert nodes_of(held)["n1"].used_by_others.gpus == 0
    free = build(*bodies)  # once the tracker lets go, it is just a pending job
    assert jobs_of(free)["team-a/v"].running is None


def test_checkpoint_annotation_is_newer_than_status() -> None:
    status = {"phase": "Queued", "lastCheckpoint": {"step": 1, "path": "p1", "time": "2023-11-14T22:00:00Z"}}
    ann = {"gpuq.dev/checkpoint": '{"step": 5, "path": "p5", "time": 1700000050}'}
    j = jobs_of(build(node("n1"), queue("q"), job("a", replicas=1, status=status, annotations=ann)))[
        "team-a/a"
    ]
    assert j.checkpoint is not None and (j.checkpoint.step, j.checkpoint.path) == (5, "p5")
    assert j.checkpoint.time == 1700000050


def test_custom_topology_levels() -> None:
    cfg = SchedulerConfig(
        topology=Topology(levels=("rack", "node"), labels=("gpuq.dev/rack", "kubernetes.io/hostname"))
    )
    v = build(
        node("n1", rack="r7"), queue("q"), job("a", topology={"level": "zone", "mode": "Required"}), cfg=cfg
    )
    assert nodes_of(v)["n1"].path == ("r7", "n1")
    assert v.excluded["team-a/a"].reason == "UnknownTopologyLevel"


def test_builder_is_deterministic() -> None:
    bodies = [node(f"n{i}") for i in range(5)] + [queue("q")] + [job(f"j{i}", replicas=1) for i in range(5)]
    a = build(*bodies)
    b = build(*reversed(copy.deepcopy(bodies)))
    assert a.snapshot == b.snapshot
    assert GPU == "nvidia.com/gpu"


def test_a_kept_builder_agrees_with_a_fresh_one_as_pods_jobs_and_nodes_change() -> None:
    """The builder reuses per-node and per-job results and re-sums other pods' usage only where
    something changed: after each change its snapshot equals a fresh builder's."""
    cache = ClusterCache()
    for n in ("n1", "n2"):
        cache.upsert_node(node(n))
    cache.upsert_queue(queue("q", nominal=64))
    cache.upsert_namespace(namespace("team-a"))
    kept = SnapshotBuilder()

    def check() -> View:
        v = kept.build(cache, T0 + 100, CFG)
        assert v == SnapshotBuilder().build(cache, T0 + 100, CFG)
        return v

    check()
    web = pod("web", node_name="n1", scheduler="default-scheduler", gpus=2)
    cache.upsert_pod(web)
    assert {n.name: n.used_by_others.gpus for n in check().snapshot.nodes} == {"n1": 2, "n2": 0}
    cache.upsert_job(job("a", status=placed_status(["n1", "n2"])))
    for p in gang_pods("a", ["n1", "n2"]):
        cache.upsert_pod(p)
    assert check().snapshot.nodes[1].used_by_others.gpus == 0  # its own pods count through the job
    # Attempt 2 admitted while attempt 1's pods still run: those now count as someone else's.
    cache.upsert_job(job("a", status=placed_status(["n2", "n1"], phase="Admitted", attempt=2)))
    assert check().snapshot.nodes[1].used_by_others.gpus == 8
    cache.delete_pod(web)
    for p in gang_pods("a", ["n1", "n2"]):
        cache.delete_pod(p)
    cache.upsert_node(node("n2", gpus=4))
    v = check()
    assert [n.used_by_others.gpus for n in v.snapshot.nodes] == [0, 0]
    assert v.snapshot.nodes[1].allocatable.gpus == 4


def test_a_gang_created_before_its_status_holds_its_nodes_and_a_partial_one_does_not() -> None:
    """Operator stopped between creating a gang and writing its status (gpuq.controller.record):
    the complete gang is the job's placement (counted once, against its quota); a partial one is
    no admission, but its pods' GPUs stay used until they are gone."""
    cache = ClusterCache()
    for n in ("n1", "n2"):
        cache.upsert_node(node(n))
    cache.upsert_queue(queue("q"))
    cache.upsert_job(job("a", replicas=2, status={"phase": "Queued", "attempt": 0}))
    builder = SnapshotBuilder()
    first, second = gang_pods("a", ["n2", "n1"], phase="Pending")
    cache.upsert_pod(first)
    v = builder.build(cache, T0 + 1, CFG)
    assert jobs_of(v)["team-a/a"].running is None and "team-a/a" not in v.holding
    assert nodes_of(v)["n2"].used_by_others.gpus == 8
    cache.upsert_pod(second)  # the same builder: its memo must notice the gang is now complete
    v = builder.build(cache, T0 + 1, CFG)
    assert jobs_of(v)["team-a/a"].running.placement == ("n2", "n1")  # type: ignore[union-attr]
    assert v.holding["team-a/a"].attempt == 1
    assert [n.used_by_others.gpus for n in v.snapshot.nodes] == [0, 0]


def test_an_admission_whose_status_is_not_written_yet_is_no_victim() -> None:
    cache = ClusterCache()
    cache.upsert_node(node("n1"))
    cache.upsert_queue(queue("q"))
    cache.upsert_job(job("a", replicas=1, status={"phase": "Queued"}))
    cache.assume("team-a/a", 1, ("n1",), T0)
    assert not jobs_of(SnapshotBuilder().build(cache, T0 + 1, CFG))["team-a/a"].preemptible
    cache.upsert_job(job("a", replicas=1, status=placed_status(["n1"], phase="Admitted")))
    assert jobs_of(SnapshotBuilder().build(cache, T0 + 1, CFG))["team-a/a"].preemptible


def test_a_requeued_job_is_queued_since_it_lost_its_admission() -> None:
    # The core counts the locality wait from here (gpuq.core.scheduler, localityWaitSeconds).
    lost = {"type": "Admitted", "status": "False", "reason": "Preempted", "lastTransitionTime": iso(T0 + 60)}
    requeued = job("a", status={"phase": "Queued", "attempt": 1, "conditions": [lost]})
    jobs = jobs_of(build(node("n1"), node("n2"), queue("q"), requeued, job("b")))
    assert jobs["team-a/a"].queued_since == T0 + 60
    assert jobs["team-a/b"].queued_since == jobs["team-a/b"].created_at  # never admitted: its creation


def test_a_gang_whose_workers_all_succeeded_holds_nothing_before_its_status_says_so() -> None:
    """Short jobs finish while their status waits its turn (a burst's delay, a busy writer): their
    GPUs and quota are free when the pods say so, as a kubelet frees them, not when a status write
    gets through; the job is neither running nor waiting any more."""
    cache = ClusterCache()
    cache.upsert_node(node("n1"))
    cache.upsert_queue(queue("q", nominal=8))
    cache.upsert_job(job("a", replicas=1, status=placed_status(["n1"])))
    cache.upsert_job(job("b", replicas=1, status={"phase": "Queued", "attempt": 0}))  # unrecorded gang
    cache.upsert_job(job("c", replicas=1))
    (a,) = gang_pods("a", ["n1"], phase="Running")
    (b,) = gang_pods("b", ["n1"], phase="Running")
    cache.upsert_pod(a)
    cache.upsert_pod(b)
    builder = SnapshotBuilder()
    v = builder.build(cache, T0 + 100, CFG)
    assert set(v.holding) == {"team-a/a", "team-a/b"}
    for p in (a, b):
        p["status"]["phase"] = "Succeeded"
        cache.upsert_pod(p)
    v = builder.build(cache, T0 + 100, CFG)
    assert v.holding == {} and [j.key for j in v.snapshot.jobs] == ["team-a/c"]
    assert [a.job for a in schedule(v.snapshot, T0 + 100, CFG).admit] == ["team-a/c"]  # quota and node free


def test_a_queue_status_write_does_not_rebuild_its_jobs_but_a_spec_change_does() -> None:
    """The operator writes each queue's usage every cycle; keyed on the queue's entry, the builder
    rebuilt every waiting job of the queue each time (with 10,000 waiting, most of a cycle)."""
    cache = ClusterCache()
    cache.upsert_node(node("n1"))
    q = queue("q", nominal=8)
    cache.upsert_queue(q)
    cache.upsert_namespace(namespace("team-a"))
    cache.upsert_job(job("a", replicas=1))
    builder = SnapshotBuilder()
    first = jobs_of(builder.build(cache, T0 + 100, CFG))["team-a/a"]
    cache.upsert_queue({**q, "status": {"usedGPUs": 8, "pendingJobs": 1}})
    assert jobs_of(builder.build(cache, T0 + 100, CFG))["team-a/a"] is first
    cache.upsert_queue({**q, "spec": {**q["spec"], "namespaceSelector": {"matchLabels": {"team": "b"}}}})
    v = builder.build(cache, T0 + 100, CFG)
    assert "team-a/a" not in jobs_of(v) and "team-a/a" in v.excluded  # the new selector is seen


def test_kept_rows_equal_a_fresh_build_through_random_changes() -> None:
    """The builder derives again only the jobs the cache reports changed (their entry, pods or
    assumption) unless something every job reads changed (queues, namespaces, evicting, config).
    Through random changes of every kind, each build equals a fresh builder's, and its own
    GPUQ_VERIFY_SNAPSHOT check (verify=True) finds no kept row that deriving would change."""
    import random

    rng = random.Random(7)
    cache = ClusterCache()
    nodes = [f"n{i}" for i in range(4)]
    for n in nodes:
        cache.upsert_node(node(n))
    cache.upsert_queue(queue("q", nominal=32))
    cache.upsert_queue(queue("r", nominal=8, cohort="c"))
    cache.upsert_namespace(namespace("team-a"))
    cache.upsert_namespace(namespace("team-b"))
    kept = SnapshotBuilder(verify=True)
    now = T0 + 100
    names: list[str] = []
    made: dict[str, tuple[str, str, int, int]] = {}  # key -> job()'s arguments (the spec never changes)
    evicting: frozenset[str] = frozenset()
    for step in range(400):
        op = rng.randrange(12)
        key = rng.choice(names) if names else None
        name = key.split("/")[1] if key else None
        if op <= 2 or name is None:
            name = f"j{step}"
            ns = rng.choice(["team-a", "team-b"])
            key = f"{ns}/{name}"
            made[key] = (ns, rng.choice(["q", "r", "missing"]), rng.randint(1, 3), rng.choice([1, 4, 8]))
            cache.upsert_job(job(name, *made[key]))
            names.append(key)
        elif op == 3:  # placed, with or without its pods
            ns, q, replicas, gpus = made[key]
            placement = [rng.choice(nodes) for _ in range(replicas)]
            raw = job(name, ns, q, replicas, gpus)
            raw["status"] = placed_status(placement, phase=rng.choice(["Admitted", "Running"]))
            cache.upsert_job(raw)
            if rng.random() < 0.7:
                for p in gang_pods(name, placement, ns=ns, phase=rng.choice(["Running", "Succeeded"])):
                    cache.upsert_pod(p)
        elif op == 4:  # waits with a back-off
            raw = job(name, *made[key])
            back_off = iso(now + rng.choice([-5, 5, 30]))
            raw["status"] = {"phase": "Recovering", "attempt": 1, "notBefore": back_off}
            cache.upsert_job(raw)
        elif op == 5:
            if rng.random() < 0.6:
                cache.assume(key, 1, (rng.choice(nodes),), now)
            else:
                cache.forget(key)
        elif op == 6:
            for p in list(cache.pods_of(key)):
                pod_ns, pod_name = p.key.split("/")
                cache.delete_pod({"metadata": {"name": pod_name, "namespace": pod_ns}})
        elif op == 7:
            cache.upsert_queue(
                queue("q", nominal=rng.choice([16, 32]), **rng.choice([{}, {"stopPolicy": "HoldAndDrain"}]))
            )
        elif op == 8:
            cache.upsert_namespace(namespace(rng.choice(["team-a", "team-b"]), tier=rng.choice(["x", "y"])))
        elif op == 9:
            evicting = frozenset(rng.sample(names, k=min(len(names), rng.randint(0, 2))))
        elif op == 10:  # a node joins or leaves
            if rng.random() < 0.5 and len(nodes) > 2:
                gone = nodes.pop()
                cache.delete_node({"metadata": {"name": gone, "uid": f"uid--{gone}"}})
            else:
                nodes.append(f"n{step}")
                cache.upsert_node(node(nodes[-1]))
        else:
            now += rng.choice([0.0, 3.0, 20.0])
        view = kept.build(cache, now, CFG, evicting)
        assert view == SnapshotBuilder().build(cache, now, CFG, evicting), f"step {step}, op {op}"
