"""Property tests of pod constraints over random heterogeneous clusters (issue 7).

The generator mixes GPU models (field or label), labels, every taint effect, cordoned and NotReady nodes,
extended resources (ephemeral-storage, rdma/hca) and other schedulers' pods; jobs draw random nodeSelectors,
required/preferred affinity with every operator, tolerations, gpuModels lists and mixedModels. The checks
use a small reference of the Kubernetes rules written here, independent of gpuq.core.constraints.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpuq.core import SchedulerConfig, schedule
from gpuq.core.decisions import Decisions, PendingCode
from gpuq.core.model import (
    Constraints,
    Health,
    Job,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredTerm,
    Queue,
    Resources,
    Running,
    Snapshot,
    Taint,
    TaintEffect,
    Toleration,
    Topology,
    WorkerSpec,
)

from .strategies import GI, NOW, PROPERTY

LABEL = "nvidia.com/gpu.product"
MODELS = ("A100", "H100", "L4")
EXTRA = ("ephemeral-storage", "rdma/hca")
TAINTS = (
    Taint("dedicated", "team-x", TaintEffect.NO_SCHEDULE),
    Taint("dedicated", "team-y", TaintEffect.NO_SCHEDULE),
    Taint("maint", "", TaintEffect.PREFER_NO_SCHEDULE),
    Taint("drain", "soon", TaintEffect.NO_EXECUTE),
)
TOLERATIONS = (
    Toleration("dedicated", "Equal", "team-x"),
    Toleration("dedicated", "Exists", effect=TaintEffect.NO_SCHEDULE),
    Toleration("drain", "Exists"),
    Toleration("maint", "Exists", effect=TaintEffect.PREFER_NO_SCHEDULE),
    Toleration(operator="Exists"),
)


# ---- reference rules (Kubernetes semantics, written independently of gpuq.core) -------------------


def ref_requirement(labels: dict[str, str], r: NodeSelectorRequirement) -> bool:
    v = labels.get(r.key)
    if r.operator in ("Gt", "Lt"):
        if v is None or not v.isdigit():
            return False
        return int(v) > int(r.values[0]) if r.operator == "Gt" else int(v) < int(r.values[0])
    return {
        "In": v is not None and v in r.values,
        "NotIn": v is None or v not in r.values,
        "Exists": v is not None,
        "DoesNotExist": v is None,
    }[r.operator]


def ref_term(n: Node, t: NodeSelectorTerm) -> bool:
    # An empty term selects nothing (k8s.io/component-helpers nodeaffinity).
    if not t.match_expressions and not t.match_fields:
        return False
    fields = {"metadata.name": n.name}
    return all(ref_requirement(dict(n.labels), r) for r in t.match_expressions) and all(
        ref_requirement(fields, r) for r in t.match_fields
    )


def ref_tolerated(tols: tuple[Toleration, ...], taint: Taint) -> bool:
    return any(
        (t.effect is None or t.effect == taint.effect)
        and (
            t.key in ("", taint.key)
            if t.operator == "Exists"
            else (t.key, t.value) == (taint.key, taint.value)
        )
        for t in tols
    )


def ref_model(n: Node) -> str | None:
    return n.gpu_model if n.gpu_model is not None else n.labels.get(LABEL)


def ref_eligible(n: Node, c: Constraints) -> bool:
    return (
        n.health is Health.HEALTHY
        and n.not_ready_since is None
        and all(n.labels.get(k) == v for k, v in c.node_selector.items())
        and (not c.required_terms or any(ref_term(n, t) for t in c.required_terms))
        and all(
            ref_tolerated(c.tolerations, t)
            for t in n.taints
            if t.effect is not TaintEffect.PREFER_NO_SCHEDULE
        )
        and (not c.gpu_models or ref_model(n) in c.gpu_models)
    )


def demand(j: Job) -> Counter[str]:
    w = j.workers
    return Counter({"gpu": w.gpus_per_worker, "cpu": w.cpu_millis, "mem": w.memory_bytes, **w.extra})


def vector(r: Resources) -> Counter[str]:
    return Counter({"gpu": r.gpus, "cpu": r.cpu_millis, "mem": r.memory_bytes, **r.extra})


# ---- generator ------------------------------------------------------------------------------------


def _node(rnd: random.Random, name: str, rack: int) -> Node:
    gpus = rnd.choice((4, 8, 8))
    extra = {k: rnd.choice((0, 2, 100 * GI if k == "ephemeral-storage" else 4)) for k in EXTRA}
    alloc = Resources(gpus, rnd.choice((16_000, 64_000)), rnd.choice((64 * GI, 512 * GI)), extra)
    others = Resources()
    if rnd.random() < 0.25:
        # Other schedulers' pods never exceed the node (kubelet admission), leaving a GPU for the gang below.
        rdma = {"rdma/hca": rnd.randint(0, extra["rdma/hca"])}
        others = Resources(rnd.randint(0, gpus - 1), rnd.randint(0, 8_000), rnd.randint(0, 32) * GI, rdma)
    model = rnd.choice(MODELS)
    labels = {"pool": rnd.choice("ab"), "gen": str(rnd.randint(1, 5))}
    as_label = rnd.random() < 0.5  # the model comes from the label or from the explicit field
    if as_label:
        labels[LABEL] = model
    kind = rnd.randint(0, 14)
    return Node(
        name,
        alloc,
        ("z0", "b0", f"r{rack}", name),
        labels=labels,
        health=Health.CORDONED if kind == 0 else Health.HEALTHY,
        taints=tuple(rnd.sample(TAINTS, rnd.choice((0, 0, 0, 1, 2)))),
        gpu_model=None if as_label else model,
        used_by_others=others,
        not_ready_since=NOW - 1 if kind == 1 else None,
    )


def _requirement(rnd: random.Random) -> NodeSelectorRequirement:
    op = rnd.choice(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"))
    key = rnd.choice(("pool", "gen", "missing"))
    if op in ("Gt", "Lt"):
        return NodeSelectorRequirement("gen", op, (str(rnd.randint(0, 5)),))
    if op in ("In", "NotIn"):
        return NodeSelectorRequirement(key, op, tuple(rnd.sample(("a", "b", "1", "3"), rnd.randint(1, 2))))
    return NodeSelectorRequirement(key, op)


def _term(rnd: random.Random, names: list[str]) -> NodeSelectorTerm:
    fields: tuple[NodeSelectorRequirement, ...] = ()
    if rnd.random() < 0.15:
        fields = (
            NodeSelectorRequirement("metadata.name", rnd.choice(("In", "NotIn")), (rnd.choice(names),)),
        )
    exprs = tuple(_requirement(rnd) for _ in range(rnd.choice((0, 1, 1, 2))))
    return NodeSelectorTerm(exprs, fields)


def _constraints(rnd: random.Random, names: list[str]) -> Constraints:
    return Constraints(
        node_selector={"pool": rnd.choice("ab")} if rnd.random() < 0.2 else {},
        required_terms=tuple(_term(rnd, names) for _ in range(rnd.choice((0, 0, 1, 2)))),
        preferred_terms=tuple(
            PreferredTerm(rnd.randint(1, 100), _term(rnd, names)) for _ in range(rnd.choice((0, 0, 1, 2)))
        ),
        tolerations=tuple(rnd.sample(TOLERATIONS, rnd.choice((0, 0, 1, 2)))),
        gpu_models=tuple(rnd.sample((*MODELS, "B200"), rnd.choice((0, 0, 1, 2)))),
        mixed_models=rnd.random() < 0.3,
    )


def _job(rnd: random.Random, i: int, names: list[str]) -> Job:
    extra = {k: rnd.choice((0, 0, 1)) * (10 * GI if k == "ephemeral-storage" else 1) for k in EXTRA}
    workers = WorkerSpec(
        rnd.randint(1, 4),
        rnd.choice((1, 2, 4, 8)),
        rnd.choice((0, 4_000, 12_000)),
        rnd.choice((0, 16 * GI)),
        {k: v for k, v in extra.items() if v},
    )
    return Job(
        f"ns/j{i}",
        rnd.choice(("q", "q", "mq")),
        rnd.randint(0, 2),
        float(rnd.randint(0, 900)),
        workers,
        constraints=_constraints(rnd, names),
    )


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    racks, per_rack, n_jobs = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 7))
    nodes = [_node(rnd, f"n{r}{k}", r) for r in range(racks) for k in range(per_rack)]
    names = [n.name for n in nodes]
    jobs = [_job(rnd, i, names) for i in range(n_jobs)]
    # A running gang on the first node: it counts like any other pod there.
    if rnd.random() < 0.5 and nodes[0].health is Health.HEALTHY:
        jobs[0] = replace(
            jobs[0], workers=WorkerSpec(1, 1), constraints=Constraints(), running=Running((names[0],), 0.0)
        )
    queues = (Queue("q", 1000), Queue("mq", 1000, model_quotas={"H100": 8, "L4": 4}))
    return Snapshot(Topology(), tuple(nodes), queues, tuple(jobs))


def decide(s: Snapshot) -> Decisions:
    return schedule(s, NOW, SchedulerConfig())


def placed(s: Snapshot, nominated: bool = True) -> list[tuple[Job, list[Node]]]:
    """Every admitted (and nominated) gang of one cycle with the nodes of its ranks."""
    d = decide(s)
    nodes = {n.name: n for n in s.nodes}
    jobs = {j.key: j for j in s.jobs}
    gangs = [(a.job, a.placement) for a in d.admit]
    gangs += [(p.job, p.nominated) for p in d.pending if p.nominated and nominated]
    return [(jobs[key], [nodes[n] for n in placement]) for key, placement in gangs]


def running(s: Snapshot) -> list[tuple[Job, list[Node]]]:
    nodes = {n.name: n for n in s.nodes}
    return [(j, [nodes[n] for n in j.running.placement]) for j in s.jobs if j.running is not None]


# ---- properties -------------------------------------------------------------------------------------


@PROPERTY
@given(clusters())
def test_every_rank_lands_on_a_node_kube_scheduler_would_accept(s: Snapshot) -> None:
    for job, nodes in placed(s):
        for n in nodes:
            assert ref_eligible(n, job.constraints), f"{job.key} on {n.name}"


@PROPERTY
@given(clusters())
def test_a_gang_never_mixes_gpu_models_unless_allowed(s: Snapshot) -> None:
    for job, nodes in placed(s):
        if not job.constraints.mixed_models:
            assert len({ref_model(n) for n in nodes}) == 1, f"{job.key} mixes models on {nodes}"


@PROPERTY
@given(clusters())
def test_every_requested_resource_fits_next_to_every_pod_on_the_node(s: Snapshot) -> None:
    new = placed(s, nominated=False)
    used = {n.name: vector(n.used_by_others) for n in s.nodes}
    for job, nodes in running(s) + new:
        for n in nodes:
            used[n.name].update(demand(job))
    for job, nodes in new:
        for n in nodes:
            cap = vector(n.allocatable)
            for resource in +demand(job):  # the resources the new pods request
                assert used[n.name][resource] <= cap[resource], f"{n.name}: {resource} {used[n.name]} > {cap}"


@PROPERTY
@given(clusters())
def test_model_quotas_cap_gpus_per_model(s: Snapshot) -> None:
    quotas = {q.name: q.model_quotas for q in s.queues}
    per_model: Counter[tuple[str, str | None]] = Counter()
    for job, nodes in running(s) + placed(s, nominated=False):
        for n in nodes:
            per_model[(job.queue, ref_model(n))] += job.workers.gpus_per_worker
    for (queue, model), gpus in per_model.items():
        limit = quotas[queue].get(model or "")
        assert limit is None or gpus <= limit, f"{queue} uses {gpus} {model} GPUs, model quota {limit}"


@PROPERTY
@given(clusters())
def test_a_job_no_node_accepts_is_unschedulable_and_names_a_constraint(s: Snapshot) -> None:
    d = decide(s)
    jobs = {j.key: j for j in s.jobs}
    for p in d.pending:
        c = jobs[p.job].constraints
        if jobs[p.job].queue == "q" and not any(ref_eligible(n, c) for n in s.nodes):
            assert p.code == PendingCode.NO_MATCHING_NODES, (p.code, p.reason)
            named = ("gpuModels", "nodeSelector", "affinity", "taint", "no schedulable node")
            assert any(w in p.reason for w in named), p.reason


@PROPERTY
@given(clusters())
def test_preferences_never_decide_whether_a_lone_job_fits(s: Snapshot) -> None:
    """Preferred affinity and PreferNoSchedule are scores: dropping them never changes admission."""
    lone = next(j for j in s.jobs if j.running is None) if any(j.running is None for j in s.jobs) else None
    if lone is None:
        return
    others = tuple(j for j in s.jobs if j.running is not None)
    with_prefs = replace(s, jobs=(*others, lone))
    hard_only = replace(lone, constraints=replace(lone.constraints, preferred_terms=()))
    without = replace(s, jobs=(*others, hard_only))
    assert {a.job for a in decide(with_prefs).admit} == {a.job for a in decide(without).admit}
