"""Builders for small clusters/jobs and the invariant checks shared by property and example tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from gpuq.core import SchedulerConfig, schedule
from gpuq.core.decisions import Decisions, PendingCode
from gpuq.core.model import (
    Checkpoint,
    Constraints,
    Job,
    Node,
    PreemptionPolicy,
    Queue,
    ReclaimPreemption,
    Resources,
    Running,
    Snapshot,
    Topology,
    TopologyMode,
    TopologyRequest,
    WithinQueuePreemption,
    WorkerSpec,
)

GI = 1 << 30
TOPO = Topology()
NOW = 1000.0


def node(
    name: str,
    rack: str = "r0",
    block: str = "b0",
    zone: str = "z0",
    gpus: int = 8,
    cpu: int = 64_000,
    mem: int = 512 * GI,
    **kw: object,
) -> Node:
    return Node(name, Resources(gpus, cpu, mem), (zone, block, rack, name), **kw)  # type: ignore[arg-type]


def cluster(
    racks: int = 2, nodes_per_rack: int = 4, gpus: int = 8, blocks: int = 1, zones: int = 1
) -> list[Node]:
    """zones x blocks x racks x nodes; rack names are globally unique (r<zone><block><rack>)."""
    out = []
    for z in range(zones):
        for b in range(blocks):
            for r in range(racks):
                for n in range(nodes_per_rack):
                    name = f"n{z}{b}{r}{n}"
                    out.append(node(name, f"r{z}{b}{r}", f"b{z}{b}", f"z{z}", gpus))
    return out


def job(
    key: str,
    queue: str = "q",
    replicas: int = 1,
    gpus: int = 1,
    priority: int = 0,
    created: float = 900.0,  # NOW - 100: younger than the default starvation threshold
    on: Sequence[str] | None = None,
    started: float = 900.0,  # NOW - 100: shorter than ServiceOrdering.min_run_seconds
    level: str | None = None,
    required: bool = True,
    **kw: object,
) -> Job:
    topo = TopologyRequest(level, TopologyMode.REQUIRED if required else TopologyMode.PREFERRED)
    running = Running(tuple(on), started) if on is not None else None
    return Job(
        key,
        queue,
        priority,
        created,
        WorkerSpec(replicas, gpus),
        topo,
        running=running,
        **kw,  # type: ignore[arg-type]
    )


def with_node(nodes: Sequence[Node], name: str, **kw: object) -> list[Node]:
    """`nodes` with the node called `name` changed by `kw` (dataclasses.replace)."""
    return [replace(n, **kw) if n.name == name else n for n in nodes]  # type: ignore[arg-type]


def queue(name: str = "q", nominal: int = 1000, **kw: object) -> Queue:
    return Queue(name, nominal, **kw)  # type: ignore[arg-type]


def never_preempt() -> PreemptionPolicy:
    return PreemptionPolicy(WithinQueuePreemption.NEVER, ReclaimPreemption.NEVER)


def snap(nodes: Iterable[Node], queues: Iterable[Queue], jobs: Iterable[Job]) -> Snapshot:
    return Snapshot(TOPO, tuple(nodes), tuple(queues), tuple(jobs))


def run(s: Snapshot, now: float = NOW, config: SchedulerConfig | None = None) -> Decisions:
    d = schedule(s, now, config or SchedulerConfig())
    check_all(s, d, now, config or SchedulerConfig())
    return d


def admitted(d: Decisions) -> dict[str, tuple[str, ...]]:
    return {a.job: a.placement for a in d.admit}


def pending(d: Decisions) -> dict[str, str]:
    return {p.job: p.reason for p in d.pending}


def codes(d: Decisions) -> dict[str, str]:
    return {p.job: p.code for p in d.pending}


# ---- invariants ---------------------------------------------------------------------------------

Vec = tuple[int, int, int]


def _use(j: Job, ranks: Iterable[str]) -> Counter[str]:
    return Counter(ranks)


def _capacity(n: Node) -> Vec:
    g = n.allocatable.gpus if n.healthy_gpus is None else min(n.allocatable.gpus, n.healthy_gpus)
    return (g, n.allocatable.cpu_millis, n.allocatable.memory_bytes)


def _per_worker(j: Job) -> Vec:
    return (j.workers.gpus_per_worker, j.workers.cpu_millis, j.workers.memory_bytes)


class Ledger:
    """Per-node resource sums built from (job, ranks, weight) contributions."""

    def __init__(self, s: Snapshot) -> None:
        self.used: dict[str, list[int]] = {}
        for n in s.nodes:
            o = n.used_by_others
            self.used[n.name] = [o.gpus, o.cpu_millis, o.memory_bytes]

    def add(self, j: Job, counts: Counter[str]) -> None:
        w = _per_worker(j)
        for name, k in counts.items():
            if name in self.used:
                u = self.used[name]
                for i in range(3):
                    u[i] += w[i] * k


def _restarted_old(s: Snapshot, d: Decisions) -> dict[str, Counter[str]]:
    jobs = {j.key: j for j in s.jobs}
    out = {}
    for r in d.restart:
        run_ = jobs[r.job].running
        assert run_ is not None
        out[r.job] = Counter(run_.placement)
    return out


def check_no_overcommit(s: Snapshot, d: Decisions) -> None:
    """Now: on every node that receives new pods, each resource those pods request fits next to
    everything still there. Later: once victims and evicting/restarted gangs are gone, every admitted and
    nominated gang fits. (A resource new pods do not request may already be short, e.g. failed GPUs.)"""
    jobs = {j.key: j for j in s.jobs}
    nodes = {n.name: n for n in s.nodes}
    restarted = _restarted_old(s, d)
    now_l, later_l = Ledger(s), Ledger(s)
    victims = {p.victim for p in d.preempt}
    for j in s.jobs:
        if j.running is None:
            continue
        now_l.add(j, Counter(j.running.placement))
        if j.key not in victims and not j.evicting and j.key not in restarted:
            later_l.add(j, Counter(j.running.placement))
    # node -> resource dimensions new pods request there (now: admitted; later: admitted or nominated)
    touched_now: dict[str, set[int]] = {}
    touched_later: dict[str, set[int]] = {}

    def touch(touched: dict[str, set[int]], j: Job, names: Iterable[str]) -> None:
        dims = {i for i, v in enumerate(_per_worker(j)) if v}
        for n in names:
            touched.setdefault(n, set()).update(dims)

    for a in d.admit:
        j = jobs[a.job]
        new = Counter(a.placement)
        touch(touched_now, j, new)
        touch(touched_later, j, new)
        later_l.add(j, new)
        if a.restart and a.job in restarted:
            old = restarted[a.job]
            now_l.add(j, Counter({n: max(0, k - old.get(n, 0)) for n, k in new.items()}))
        else:
            now_l.add(j, new)
    for p in d.pending:
        if p.nominated:
            later_l.add(jobs[p.job], Counter(p.nominated))
            touch(touched_later, jobs[p.job], p.nominated)
    for label, ledger, touched in (("now", now_l, touched_now), ("later", later_l, touched_later)):
        for name, dims in touched.items():
            cap = _capacity(nodes[name])
            u = ledger.used[name]
            assert all(u[i] <= cap[i] for i in dims), f"node {name} over-committed ({label}): {u} > {cap}"


def check_gangs(s: Snapshot, d: Decisions) -> None:
    jobs = {j.key: j for j in s.jobs}
    nodes = {n.name for n in s.nodes}
    seen: Counter[str] = Counter()
    for a in d.admit:
        j = jobs[a.job]
        assert len(a.placement) == j.workers.replicas, (
            f"{a.job}: {len(a.placement)} of {j.workers.replicas} ranks"
        )
        assert set(a.placement) <= nodes
        seen[a.job] += 1
    for p in d.pending:
        seen[p.job] += 1
        if p.nominated:
            assert len(p.nominated) == jobs[p.job].workers.replicas
    restarted = {r.job for r in d.restart}
    for j in s.jobs:
        expected = 1 if (j.running is None or j.key in restarted) else 0
        assert seen[j.key] == expected, f"{j.key} decided {seen[j.key]} times, expected {expected}"
    for a in d.admit:
        assert a.restart == (a.job in restarted or jobs[a.job].recovering)


def check_required_topology(s: Snapshot, d: Decisions) -> None:
    jobs = {j.key: j for j in s.jobs}
    paths = {n.name: n.path for n in s.nodes}
    levels = s.topology.levels
    placements = [(a.job, a.placement) for a in d.admit] + [
        (p.job, p.nominated) for p in d.pending if p.nominated
    ]
    for key, placement in placements:
        t = jobs[key].topology
        if t.mode is TopologyMode.REQUIRED and t.level is not None:
            depth = levels.index(t.level) + 1
            domains = {paths[n][:depth] for n in placement}
            assert len(domains) == 1, f"{key} Required {t.level} spans {domains}"


def check_reasons(s: Snapshot, d: Decisions) -> None:
    jobs = {j.key: j for j in s.jobs}
    per_queue: dict[str, list[int]] = {}
    valid = {c.value for c in PendingCode}
    for p in d.pending:
        assert p.reason.strip(), f"{p.job} has no reason"
        assert p.code in valid, p.code
        per_queue.setdefault(jobs[p.job].queue, []).append(p.position)
        if p.nominated:
            assert p.code == PendingCode.WAITING_FOR_PREEMPTION
    for q, positions in per_queue.items():
        assert sorted(positions) == list(range(1, len(positions) + 1)), f"queue {q} positions {positions}"


def outranks_by_service(v: Job, j: Job, now: float, config: SchedulerConfig) -> bool:
    """The attained-service rule, recomputed here from its definition (docs/scheduling.md)."""
    rule = config.service
    if not (rule.preempt and rule.thresholds_gpu_hours) or v.running is None:
        return False
    if now - v.running.started_at < rule.min_run_seconds:
        return False
    v_gpus = len(v.running.placement) * v.workers.gpus_per_worker
    if rule.spare_larger_gangs and len(set(v.running.placement)) > 1 and v_gpus > j.workers.total_gpus:
        return False  # a multi-node gang is spared for a job needing fewer GPUs
    service_v = v.attained_gpu_seconds + len(v.running.placement) * v.workers.gpus_per_worker * (
        now - v.running.started_at
    )
    service_j = j.attained_gpu_seconds
    if j.running is not None:  # a restarted gang re-placing itself still shows its old attempt
        service_j += (
            len(j.running.placement) * j.workers.gpus_per_worker * max(0.0, now - j.running.started_at)
        )
    levels = [3600.0 * t for t in rule.thresholds_gpu_hours]
    return sum(service_v >= t for t in levels) > sum(service_j >= t for t in levels)


def victim_allowed(
    s: Snapshot, victim: str, for_job: str, now: float, config: SchedulerConfig | None = None
) -> bool:
    config = config or SchedulerConfig()
    jobs = {j.key: j for j in s.jobs}
    queues = {q.name: q for q in s.queues}
    v, j = jobs[victim], jobs[for_job]
    if v.running is None or v.evicting or not v.preemptible:
        return False
    if now - v.running.started_at < v.min_runtime_seconds:
        return False
    q = queues[j.queue]
    vq_policy = queues[v.queue].preemption if v.queue in queues else None
    if vq_policy is not None and vq_policy.budget() == 0:
        return False  # a non-preemptible queue, or one out of preemptions this hour
    if v.queue == j.queue:
        if q.preemption.within_queue is not WithinQueuePreemption.LOWER_PRIORITY:
            return False
        return v.priority < j.priority or (
            v.priority == j.priority and outranks_by_service(v, j, now, config)
        )
    vq = queues.get(v.queue)
    if vq is None or q.cohort is None or vq.cohort != q.cohort:
        return False
    policy = q.preemption.reclaim_within_cohort
    if policy is ReclaimPreemption.NEVER:
        return False
    if policy is ReclaimPreemption.LOWER_PRIORITY and v.priority >= j.priority:
        return False
    # The victim's queue must have been borrowing at the start of the cycle.
    usage = sum(
        len(x.running.placement) * x.workers.gpus_per_worker
        for x in s.jobs
        if x.queue == v.queue and x.running is not None and not x.evicting
    ) + sum(x.workers.total_gpus for x in s.jobs if x.queue == v.queue and x.running is None and x.recovering)
    return usage > vq.nominal_gpus


def move_allowed(
    s: Snapshot, victim: str, for_job: str, now: float, config: SchedulerConfig | None = None
) -> bool:
    """Consolidation's rule (docs/scheduling.md), from its definition: a starving job may move a
    running gang of no higher priority that sits on one node without filling it, once the gang ran
    its minimum run, if the gang and its queue may be preempted at all."""
    config = config or SchedulerConfig()
    jobs = {j.key: j for j in s.jobs}
    queues = {q.name: q for q in s.queues}
    nodes = {n.name: n for n in s.nodes}
    v, j = jobs[victim], jobs[for_job]
    if not config.consolidation.enabled or v.running is None or v.evicting or not v.preemptible:
        return False
    waited = now - j.created_at
    if (
        waited < max(config.starvation_seconds, config.consolidation.min_wait_seconds)
        or v.priority > j.priority
    ):
        return False
    ran = now - v.running.started_at
    if ran < v.min_runtime_seconds or ran < config.service.min_run_seconds:
        return False
    vq = queues.get(v.queue)
    if vq is not None and vq.preemption.budget() == 0:
        return False
    on = set(v.running.placement)
    if len(on) != 1:
        return False
    node = nodes.get(next(iter(on)))
    return node is not None and len(v.running.placement) * v.workers.gpus_per_worker < node.allocatable.gpus


def check_preemptions(s: Snapshot, d: Decisions, now: float, config: SchedulerConfig | None = None) -> None:
    pend = {p.job: p for p in d.pending}
    seen: set[str] = set()
    jobs = {j.key: j for j in s.jobs}
    taken: dict[str, int] = {}
    for p in d.preempt:
        taken[jobs[p.victim].queue] = taken.get(jobs[p.victim].queue, 0) + 1
    for q in s.queues:
        left = q.preemption.budget()
        assert left is None or taken.get(q.name, 0) <= left, f"queue {q.name} lost more jobs than its cap"
    for p in d.preempt:
        assert p.victim not in seen, f"{p.victim} preempted twice"
        seen.add(p.victim)
        allowed = move_allowed if p.move else victim_allowed
        assert allowed(s, p.victim, p.for_job, now, config), (
            f"{p.victim} is not an allowed victim of {p.for_job}"
        )
        assert p.for_job in pend and pend[p.for_job].code == PendingCode.WAITING_FOR_PREEMPTION
        assert pend[p.for_job].nominated, f"{p.for_job} preempted without a nominated placement"


def check_all(s: Snapshot, d: Decisions, now: float, config: SchedulerConfig) -> None:
    check_no_overcommit(s, d)
    check_gangs(s, d)
    check_required_topology(s, d)
    check_reasons(s, d)
    check_preemptions(s, d, now, config)


def with_running(j: Job, placement: Sequence[str], started: float = 0.0, **kw: object) -> Job:
    return replace(j, running=Running(tuple(placement), started), **kw)  # type: ignore[arg-type]


def checkpoint(t: float) -> Checkpoint:
    return Checkpoint(t, 1, f"s3://ckpt/{t}")


__all__ = ["Constraints", "checkpoint"]
