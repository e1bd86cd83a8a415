"""What the baseline policies share: the snapshot seen as free resources per node, whole-gang
restarts after a node failure, and fit tests. The baselines themselves, each named for exactly what
it is (docs/simulator.md, "Baselines"):

- `kube-default` (gpuq.sim.kube_default): the default kube-scheduler profile, pod by pod;
- `gang-binpack` (gpuq.sim.kueue): Kueue without topology-aware scheduling, with gang admission and
  best-fit nodes, as Volcano's gang + binpack would place;
- `kueue-tas` (gpuq.sim.kueue): Kueue with topology-aware scheduling (best-fit topology domain).

All of them evict and re-queue a whole gang when one of its nodes fails (a training job dies with any
rank), as a Job controller with restartPolicy would, and none asks a victim to checkpoint.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

from gpuq.core.decisions import Restart
from gpuq.core.model import Health, Job, Node, Snapshot

Free = dict[str, list[int]]  # node name -> free [gpus, cpu_millis, memory_bytes]


def failed_node_restarts(snapshot: Snapshot) -> tuple[list[Restart], set[str]]:
    """Every job with a rank on a FAILED node is restarted whole."""
    failed = {node.name for node in snapshot.nodes if node.health is Health.FAILED}
    restarts: list[Restart] = []
    if failed:
        for job in snapshot.jobs:
            if job.running is not None:
                bad = tuple(sorted(set(job.running.placement) & failed))
                if bad:
                    restarts.append(Restart(job.key, bad, f"node {bad[0]} failed"))
    return restarts, {restart.job for restart in restarts}


@dataclass
class View:
    """One pass over the snapshot: free resources of schedulable nodes (every bound pod counted, except
    those of restarted jobs), jobs still waiting for pods, GPUs in use per queue."""

    free: Free
    nodes: list[Node]
    waiting: list[Job]
    queue_used: dict[str, int]
    lowest_running_priority: int | None  # of preemptible jobs holding GPUs

    @property
    def free_gpus(self) -> int:
        return sum(slot[0] for slot in self.free.values())


def view(snapshot: Snapshot, restarted: set[str]) -> View:
    free: Free = {}
    for node in snapshot.nodes:
        if node.health is Health.HEALTHY:
            a, o = node.allocatable, node.used_by_others
            free[node.name] = [a.gpus - o.gpus, a.cpu_millis - o.cpu_millis, a.memory_bytes - o.memory_bytes]
    waiting: list[Job] = []
    queue_used: dict[str, int] = defaultdict(int)
    lowest: int | None = None
    for job in snapshot.jobs:
        running = job.running
        if running is None or job.key in restarted:
            waiting.append(job)
            continue
        w = job.workers
        for name in running.placement:
            slot = free.get(name)
            if slot is not None:
                slot[0] -= w.gpus_per_worker
                slot[1] -= w.cpu_millis
                slot[2] -= w.memory_bytes
        queue_used[job.queue] += len(running.placement) * w.gpus_per_worker
        if len(running.placement) < w.replicas:
            waiting.append(job)
        if job.preemptible and (lowest is None or job.priority < lowest):
            lowest = job.priority
    nodes = [node for node in snapshot.nodes if node.name in free]
    return View(free, nodes, waiting, queue_used, lowest)


def model_ok(job: Job, node: Node) -> bool:
    models = job.constraints.gpu_models
    return not models or node.gpu_model in models


def fits(slot: list[int], job: Job) -> bool:
    w = job.workers
    return slot[0] >= w.gpus_per_worker and slot[1] >= w.cpu_millis and slot[2] >= w.memory_bytes


def take(slot: list[int], job: Job, sign: int = 1) -> None:
    w = job.workers
    slot[0] -= sign * w.gpus_per_worker
    slot[1] -= sign * w.cpu_millis
    slot[2] -= sign * w.memory_bytes


def arrival_key(job: Job) -> tuple[int, float, str]:
    """The order of arrival_order, for one min() instead of a sort."""
    return (-job.priority, job.created_at, job.key)


def arrival_order(jobs: Iterable[Job]) -> list[Job]:
    """Priority (high first), then creation time, then key; two stable C-level sorts (hot path)."""
    by_time = sorted(jobs, key=attrgetter("created_at", "key"))
    return sorted(by_time, key=attrgetter("priority"), reverse=True)
