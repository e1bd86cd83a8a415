"""Hypothesis strategies: small random clusters, queues and jobs (running ones placed validly).

Hypothesis draws the shape (sizes, counts, feature switches) and a seed; attribute values come from a
Random seeded by it. Thousands of examples per property stay fast that way (a draw per attribute
costs ~10x more), and failures still shrink in size and replay from the seed.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpuq.core import SchedulerConfig
from gpuq.core.config import ServiceOrdering
from gpuq.core.model import (
    Checkpoint,
    Constraints,
    Health,
    Job,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreemptionPolicy,
    PreferredTerm,
    Queue,
    QueueingStrategy,
    ReclaimPreemption,
    Resources,
    Running,
    Snapshot,
    Taint,
    TaintEffect,
    Toleration,
    Topology,
    TopologyMode,
    TopologyRequest,
    WithinQueuePreemption,
    WorkerSpec,
)

GI = 1 << 30
NOW = 1000.0
EXAMPLES = int(os.environ.get("GPUQ_CORE_EXAMPLES", "2000"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("GPUQ_CORE_DERANDOMIZE", "1") == "1",
)
MODELS = (None, "A100", "H100")
TAINTS = (
    Taint("dedicated", "team-x", TaintEffect.NO_SCHEDULE),
    Taint("maint", "", TaintEffect.PREFER_NO_SCHEDULE),
    Taint("evict", "now", TaintEffect.NO_EXECUTE),
)


def _nodes(rnd: random.Random, shape: tuple[int, int, int], failures: bool) -> list[Node]:
    zones, blocks, racks = shape
    out = []
    for z in range(zones):
        for b in range(blocks):
            for r in range(racks):
                for n in range(rnd.randint(1, 3)):
                    name = f"n{z}{b}{r}{n}"
                    gpus = rnd.choice((0, 2, 4, 8, 8))
                    cpu = rnd.choice((8_000, 32_000, 64_000))
                    mem = rnd.choice((32 * GI, 256 * GI))
                    others = Resources()
                    if rnd.randint(0, 4) == 0:
                        others = Resources(rnd.randint(0, gpus), rnd.randint(0, cpu // 2), 0)
                    health, not_ready, healthy = Health.HEALTHY, None, None
                    if failures:
                        kind = rnd.randint(0, 12)
                        if kind == 0:
                            health = Health.FAILED
                        elif kind == 1:
                            health = Health.CORDONED
                        elif kind == 2:
                            not_ready = NOW - rnd.choice((1.0, 60.0))
                        elif kind == 3:
                            healthy = rnd.randint(0, gpus)
                    taints: tuple[Taint, ...] = ()
                    if rnd.randint(0, 5) == 0:
                        taints = (rnd.choice(TAINTS if failures else TAINTS[:2]),)
                    out.append(
                        Node(
                            name,
                            Resources(gpus, cpu, mem),
                            (f"z{z}", f"b{z}{b}", f"r{z}{b}{r}", name),
                            labels={"pool": rnd.choice(("a", "b")), "rank": str(r)},
                            health=health,
                            taints=taints,
                            gpu_model=rnd.choice(MODELS),
                            used_by_others=others,
                            not_ready_since=not_ready,
                            healthy_gpus=healthy,
                        )
                    )
    return out


def _queues(rnd: random.Random, count: int, preemption: bool) -> list[Queue]:
    out = []
    for i in range(count):
        if preemption:
            policy = PreemptionPolicy(
                rnd.choice(list(WithinQueuePreemption)),
                rnd.choice(list(ReclaimPreemption)),
                preemptible=rnd.random() > 0.1,
                max_per_hour=rnd.choice((None, None, None, 0, 1, 2)),
                recent=rnd.choice((0, 0, 1)),
            )
        else:
            policy = PreemptionPolicy(WithinQueuePreemption.NEVER, ReclaimPreemption.NEVER)
        out.append(
            Queue(
                f"q{i}",
                rnd.choice((0, 4, 8, 16, 32)),
                cohort=rnd.choice((None, "c", "c")),
                borrowing_limit_gpus=rnd.choice((None, 0, 8)),
                lending_limit_gpus=rnd.choice((None, 0, 4)),
                weight=rnd.choice((1.0, 2.0)),
                strategy=rnd.choice(list(QueueingStrategy)),
                preemption=policy,
                model_quotas=rnd.choice(({}, {}, {"H100": 8})),
            )
        )
    return out


def _constraints(rnd: random.Random) -> Constraints:
    kind = rnd.randint(0, 9)
    if kind == 0:
        return Constraints(gpu_models=(rnd.choice(("A100", "H100", "B200")),))
    if kind == 1:
        return Constraints(node_selector={"pool": rnd.choice(("a", "b"))})
    if kind == 2:
        return Constraints(tolerations=(Toleration("dedicated", "Equal", "team-x"),))
    if kind == 3:
        op = rnd.choice(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"))
        values: tuple[str, ...] = ()
        if op in ("In", "NotIn"):
            values = ("a",)
        elif op in ("Gt", "Lt"):
            values = ("0",)
        key = "rank" if op in ("Gt", "Lt") else rnd.choice(("pool", "missing"))
        term = NodeSelectorTerm((NodeSelectorRequirement(key, op, values),))
        return Constraints(required_terms=(term,))
    if kind == 4:
        term = NodeSelectorTerm((NodeSelectorRequirement("pool", "In", ("b",)),))
        return Constraints(preferred_terms=(PreferredTerm(50, term),), mixed_models=rnd.random() < 0.5)
    if kind == 5:
        return Constraints(tolerations=(Toleration(operator="Exists"),), mixed_models=True)
    return Constraints()


def _first_fit(
    rnd: random.Random,
    free: dict[str, list[int]],
    names: list[str],
    replicas: int,
    need: tuple[int, int, int],
) -> list[str] | None:
    """Ranks placed first-fit over a random node order, consuming `free`; None (nothing taken) if short."""
    order = rnd.sample(names, len(names))
    trial = {k: list(v) for k, v in free.items()}
    placement: list[str] = []
    for _ in range(replicas):
        for name in order:
            f = trial[name]
            if all(f[i] >= need[i] for i in range(3)):
                for i in range(3):
                    f[i] -= need[i]
                placement.append(name)
                break
    if len(placement) < replicas:
        return None
    free.update(trial)
    return placement


def _jobs(
    rnd: random.Random, count: int, node_list: list[Node], queue_names: list[str], evicting: bool
) -> list[Job]:
    """Pending and running jobs; running ones are placed first-fit so no node starts over-committed."""
    free = {
        n.name: [
            n.allocatable.gpus - n.used_by_others.gpus,
            n.allocatable.cpu_millis - n.used_by_others.cpu_millis,
            n.allocatable.memory_bytes,
        ]
        for n in node_list
    }
    names = [n.name for n in node_list]
    out = []
    for i in range(count):
        replicas = rnd.randint(1, 4)
        gpw = rnd.choice((0, 1, 2, 4, 8))
        cpu = rnd.choice((0, 1_000, 8_000))
        mem = rnd.choice((0, GI, 32 * GI))
        base = Job(
            key=f"ns/j{i}",
            queue=rnd.choice([*queue_names, *queue_names, "missing"]),
            priority=rnd.randint(0, 3),
            created_at=float(rnd.randint(0, 900)),
            workers=WorkerSpec(replicas, gpw, cpu, mem),
            topology=TopologyRequest(
                rnd.choice((None, None, "rack", "block", "zone", "node")), rnd.choice(list(TopologyMode))
            ),
            preemptible=rnd.randint(0, 5) > 0,
            min_runtime_seconds=rnd.choice((0.0, 0.0, 500.0)),
            constraints=_constraints(rnd),
            restart_count=rnd.randint(0, 2),
            attained_gpu_seconds=rnd.choice((0.0, 0.0, 0.0, 2_000.0, 4_000.0, 40_000.0)),
        )
        placement = _first_fit(rnd, free, names, replicas, (gpw, cpu, mem)) if rnd.random() < 0.5 else None
        if placement is not None:
            if rnd.randint(0, 15) == 0:
                placement[0] = "gone-node"
            started = float(rnd.randint(0, 999))
            ckpt = Checkpoint(started + rnd.randint(0, 10), 1, "p") if rnd.random() < 0.5 else None
            out.append(
                replace(
                    base,
                    running=Running(tuple(placement), started),
                    checkpoint=ckpt,
                    evicting=evicting and rnd.randint(0, 7) == 0,
                )
            )
            continue
        if rnd.randint(0, 7) == 0:
            prev = tuple(rnd.choice(names) for _ in range(rnd.randint(1, replicas)))
            base = replace(
                base,
                recovering=True,
                previous_placement=prev,
                avoid_nodes=frozenset(prev[:1]),
                not_before=rnd.choice((0.0, NOW + 30)),
            )
        out.append(base)
    return out


@st.composite
def scenarios(
    draw: st.DrawFn, preemption: bool = True, failures: bool = True, evicting: bool = True
) -> tuple[Snapshot, SchedulerConfig]:
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    n_queues = draw(st.integers(1, 3))
    n_jobs = draw(st.integers(1, 8))
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    node_list = _nodes(rnd, shape, failures)
    queue_list = _queues(rnd, n_queues, preemption)
    job_list = _jobs(rnd, n_jobs, node_list, [q.name for q in queue_list], evicting)
    service = rnd.choice(
        (
            ServiceOrdering(),
            ServiceOrdering(thresholds_gpu_hours=(0.5, 2.0), min_run_seconds=100.0),
            ServiceOrdering(thresholds_gpu_hours=(0.5, 2.0), min_run_seconds=100.0, spare_larger_gangs=False),
            ServiceOrdering(thresholds_gpu_hours=()),
            ServiceOrdering(preempt=False),
        )
    )
    config = SchedulerConfig(starvation_seconds=rnd.choice((300.0, 5000.0)), service=service)
    return Snapshot(Topology(), tuple(node_list), tuple(queue_list), tuple(job_list)), config
