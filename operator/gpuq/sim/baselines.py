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

import bisect
import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter

from gpuq.core.decisions import Restart
from gpuq.core.model import Health, Job, Node, Snapshot
from gpuq.sim.policy import Delta

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


ArrivalKey = tuple[int, float, str]
Line = list[tuple[ArrivalKey, str]]  # (arrival key, job key), sorted


@dataclass
class View:
    """One cycle's working copy: free resources of schedulable nodes (every bound pod counted, except
    those of restarted jobs), GPUs in use per queue, and the waiting jobs in arrival order."""

    free: Free
    nodes: list[Node]
    queue_used: dict[str, int]
    lowest_running_priority: int | None  # of preemptible jobs holding GPUs
    waiting: Iterator[Job]  # all queues, arrival order (restarted jobs included), lazily
    lines: dict[str, Iterator[Job]]  # the same per queue

    @property
    def free_gpus(self) -> int:
        return sum(slot[0] for slot in self.free.values())


class Tracker:
    """What the baselines read of the snapshot, kept across calls from the simulator's deltas, so a
    cycle costs O(what changed + what it admits), not O(jobs): free resources per node, GPUs and
    running jobs per queue, priorities of preemptible running jobs, waiting jobs in arrival order
    (a job with fewer bound pods than workers, a partial gang, is running and waiting)."""

    def __init__(self) -> None:
        self.built = False
        self.nodes: dict[str, Node] = {}
        self.free: Free = {}
        self.jobs: dict[str, Job] = {}
        self.queue_used: Counter[str] = Counter()
        self.running: dict[str, dict[str, Job]] = defaultdict(dict)
        self.priorities: Counter[int] = Counter()
        self.waiting: Line = []
        self.lines: dict[str, Line] = defaultdict(list)
        self.version = 0  # bumped whenever what runs where, or a node, changes

    def update(self, snapshot: Snapshot, delta: Delta) -> None:
        if not self.built:
            for node in snapshot.nodes:
                self._set_node(node)
            for job in snapshot.jobs:
                self._add(job)
            self.built = True
            return
        for node in delta.nodes.values():
            self._set_node(node)
        for key in delta.removed_jobs:
            self._drop(key)
        for key, job in delta.jobs.items():
            if key not in delta.removed_jobs:
                self._drop(key)
                self._add(job)

    def view(self, snapshot: Snapshot, restarted: set[str]) -> View:
        healthy = [node for node in snapshot.nodes if node.health is Health.HEALTHY]
        free = {node.name: list(self.free[node.name]) for node in healthy}
        queue_used = dict(self.queue_used)
        priorities = Counter(self.priorities)
        again: list[tuple[ArrivalKey, str]] = []
        for key in sorted(restarted):  # released now: waiting again from this cycle on
            job = self.jobs[key]
            assert job.running is not None
            for name in job.running.placement:
                if name in free:
                    take(free[name], job, sign=-1)
            queue_used[job.queue] -= len(job.running.placement) * job.workers.gpus_per_worker
            if job.preemptible and not job.evicting:
                priorities[job.priority] -= 1
            if len(job.running.placement) == job.workers.replicas:  # else already listed
                again.append((arrival_key(job), key))
        again.sort()
        lowest = min((p for p, n in priorities.items() if n > 0), default=None)
        jobs = self.jobs
        waiting = (jobs[key] for _, key in heapq.merge(self.waiting, again))
        lines = {
            queue: self._line(queue, again) for queue in set(self.lines) | {jobs[k].queue for _, k in again}
        }
        return View(free, healthy, queue_used, lowest, waiting, lines)

    def _line(self, queue: str, again: Line) -> Iterator[Job]:
        mine = [entry for entry in again if self.jobs[entry[1]].queue == queue]
        return (self.jobs[key] for _, key in heapq.merge(self.lines.get(queue, ()), mine))

    def _set_node(self, node: Node) -> None:
        a, o = node.allocatable, node.used_by_others
        cap = [a.gpus - o.gpus, a.cpu_millis - o.cpu_millis, a.memory_bytes - o.memory_bytes]
        old = self.nodes.get(node.name)
        if old is None:
            self.free[node.name] = cap
        else:
            b, p = old.allocatable, old.used_by_others
            before = [b.gpus - p.gpus, b.cpu_millis - p.cpu_millis, b.memory_bytes - p.memory_bytes]
            slot = self.free[node.name]
            for i in range(3):
                slot[i] += cap[i] - before[i]
        self.nodes[node.name] = node
        self.version += 1

    def _add(self, job: Job) -> None:
        self.jobs[job.key] = job
        running = job.running
        if running is not None:
            self._hold(job, running.placement, 1)
            if not job.evicting:  # a victim being evicted still holds its resources
                self.running[job.queue][job.key] = job
                if job.preemptible:
                    self.priorities[job.priority] += 1
        if running is None or len(running.placement) < job.workers.replicas:
            entry = (arrival_key(job), job.key)
            bisect.insort(self.waiting, entry)
            bisect.insort(self.lines[job.queue], entry)

    def _drop(self, key: str) -> None:
        job = self.jobs.pop(key, None)
        if job is None:
            return
        running = job.running
        if running is not None:
            self._hold(job, running.placement, -1)
            if not job.evicting:
                del self.running[job.queue][key]
                if job.preemptible:
                    self.priorities[job.priority] -= 1
        if running is None or len(running.placement) < job.workers.replicas:
            entry = (arrival_key(job), key)
            for line in (self.waiting, self.lines[job.queue]):
                del line[bisect.bisect_left(line, entry)]

    def _hold(self, job: Job, placement: tuple[str, ...], sign: int) -> None:
        self.version += 1
        for name in placement:
            slot = self.free.get(name)
            if slot is not None:
                take(slot, job, sign)
        self.queue_used[job.queue] += sign * len(placement) * job.workers.gpus_per_worker


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
