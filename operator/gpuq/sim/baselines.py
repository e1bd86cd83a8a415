"""Baseline policies, each faithful to what it names (see docs/simulator.md).

- `kube-default`: what the default kube-scheduler does with a training job's pods: one pod at a
  time from a queue ordered by priority then arrival; no gangs, so a partially bound job holds its
  GPUs while its other pods wait; nodes filtered by fit and GPU model (node affinity), scored by
  NodeResourcesFit LeastAllocated (cpu, memory and nvidia.com/gpu, equal weights: spreading), ties
  broken at random, only a sample of nodes scored on large clusters (percentageOfNodesToScore);
  DefaultPreemption evicts lower-priority pods on one node (which kills their whole job).
- `gang-binpack`: Kueue without topology-aware scheduling / Volcano gang+binpack: jobs admitted in
  priority-then-arrival order against queue quota (cohort borrowing and lending limits),
  BestEffortFIFO (a job that cannot be admitted is skipped, no reservation), gangs all-or-nothing,
  each worker best-fit (the feasible node with the fewest GPUs left), no topology, no preemption
  (Kueue's defaults: withinClusterQueue and reclaimWithinCohort Never).

Both evict and re-queue a whole gang when one of its nodes fails (a training job dies with any
rank), as a Job controller with restartPolicy would.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Admit, Decisions, Preempt, Restart
from gpuq.core.model import Health, Job, Node, Queue, Snapshot
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


def arrival_order(jobs: Iterable[Job]) -> list[Job]:
    """Priority (high first), then creation time, then key; two stable C-level sorts (hot path)."""
    by_time = sorted(jobs, key=attrgetter("created_at", "key"))
    return sorted(by_time, key=attrgetter("priority"), reverse=True)


def nodes_to_score(total: int) -> int:
    """kube-scheduler's adaptive percentageOfNodesToScore: all of small clusters, else
    max(5%, 50% - nodes/125) but at least 100 nodes."""
    if total <= 100:
        return total
    percentage = max(5.0, 50.0 - total / 125.0)
    return max(100, int(total * percentage / 100))


class KubeDefault:
    name = "kube-default"
    checkpoint_on_preempt = False

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.next_start = 0  # kube-scheduler rotates where its node search starts

    def schedule(self, snapshot: Snapshot, now: float, config: SchedulerConfig, delta: Delta) -> Decisions:
        restarts, restarted = failed_node_restarts(snapshot)
        v = view(snapshot, restarted)
        free, nodes, free_gpus, lowest = v.free, v.nodes, v.free_gpus, v.lowest_running_priority
        # Only pods that fit the free GPUs or may preempt (higher priority than some running pod) can act.
        waiting = [
            job
            for job in v.waiting
            if job.workers.gpus_per_worker <= free_gpus or (lowest is not None and job.priority > lowest)
        ]
        bound: dict[str, list[str]] = {}
        preempts: list[Preempt] = []
        evicted: set[str] = set(restarted)
        unschedulable: set[tuple[int, int, int, tuple[str, ...]]] = set()
        for job in arrival_order(waiting):
            if free_gpus <= 0 and (lowest is None or job.priority <= lowest):
                break  # the queue is sorted by priority: nothing after this can bind or preempt
            if job.key in evicted and job.key not in restarted:
                continue
            placement = list(job.running.placement) if job.running and job.key not in restarted else []
            w = job.workers
            shape = (w.gpus_per_worker, w.cpu_millis, w.memory_bytes, job.constraints.gpu_models)
            grew = False
            while len(placement) < w.replicas and shape not in unschedulable:
                node = self._pick(job, nodes, free) if free_gpus >= w.gpus_per_worker else None
                if node is None:
                    if lowest is not None and job.priority > lowest:
                        victims = self._preemption_victims(job, snapshot, free, evicted)
                        preempts.extend(Preempt(v, job.key, "pod priority preemption") for v in victims)
                        evicted.update(victims)
                    unschedulable.add(shape)  # the pod waits (for its nominated node, if it preempted)
                    break
                take(free[node], job)
                free_gpus -= w.gpus_per_worker
                placement.append(node)
                grew = True
            if grew:
                bound[job.key] = placement
        admits = tuple(Admit(key, tuple(p), 0.0) for key, p in bound.items())
        return Decisions(admit=admits, preempt=tuple(preempts), restart=tuple(restarts))

    def _pick(self, job: Job, nodes: list[Node], free: Free) -> str | None:
        """Filter, then LeastAllocated score over a (rotating) sample; random among the best."""
        wanted = nodes_to_score(len(nodes))
        count = len(nodes)
        best: list[str] = []
        best_score = -1
        found = 0
        start = self.next_start % count if count else 0
        for offset in range(count):
            node = nodes[(start + offset) % count]
            slot = free[node.name]
            if not fits(slot, job) or not model_ok(job, node):
                continue
            found += 1
            score = self._least_allocated(node, slot, job)
            if score > best_score:
                best, best_score = [node.name], score
            elif score == best_score:
                best.append(node.name)
            if found >= wanted:
                self.next_start = (start + offset + 1) % count
                break
        if not best:
            return None
        return best[0] if len(best) == 1 else self.rng.choice(best)

    @staticmethod
    def _least_allocated(node: Node, slot: list[int], job: Job) -> int:
        """NodeResourcesFit LeastAllocated, in the scheduler's integer 0-100 arithmetic (so equal
        nodes tie and the scheduler picks among them at random)."""
        a, w = node.allocatable, job.workers
        score, weights = 0, 0
        for capacity, left, request in (
            (a.cpu_millis, slot[1], w.cpu_millis),
            (a.memory_bytes, slot[2], w.memory_bytes),
            (a.gpus, slot[0], w.gpus_per_worker),
        ):
            if capacity > 0:
                score += (left - request) * 100 // capacity
                weights += 1
        return score // weights if weights else 0

    def _preemption_victims(self, job: Job, snapshot: Snapshot, free: Free, evicted: set[str]) -> list[str]:
        """DefaultPreemption: on the node where evicting lower-priority pods makes room at the least
        cost (lowest highest victim priority, then fewest victims), evict just enough of them."""
        pods: dict[str, list[Job]] = defaultdict(list)
        for other in snapshot.jobs:
            if (
                other.running
                and other.priority < job.priority
                and other.preemptible
                and other.key not in evicted
            ):
                for name in other.running.placement:
                    if name in free:
                        pods[name].append(other)
        best: tuple[int, int, str] | None = None
        best_victims: list[str] = []
        nodes = {node.name: node for node in snapshot.nodes}
        for name, candidates in sorted(pods.items()):
            if not model_ok(job, nodes[name]):
                continue
            slot = list(free[name])
            chosen: list[str] = []
            for victim in sorted(candidates, key=lambda v: (v.priority, -v.created_at)):
                if fits(slot, job):
                    break
                take(slot, victim, sign=-1)
                if victim.key not in chosen:
                    chosen.append(victim.key)
            if not fits(slot, job) or not chosen:
                continue
            top = max(v.priority for v in candidates if v.key in chosen)
            rank = (top, len(chosen), name)
            if best is None or rank < best:
                best, best_victims = rank, chosen
        return best_victims


class GangBinpack:
    name = "gang-binpack"
    checkpoint_on_preempt = False

    def schedule(self, snapshot: Snapshot, now: float, config: SchedulerConfig, delta: Delta) -> Decisions:
        restarts, restarted = failed_node_restarts(snapshot)
        v = view(snapshot, restarted)
        free, nodes, free_gpus = v.free, v.nodes, v.free_gpus
        quota = QuotaBook(snapshot.queues, v.queue_used)
        # Jobs larger than the free GPUs are skipped anyway (BestEffortFIFO): filter before sorting.
        candidates = [job for job in v.waiting if job.workers.total_gpus <= free_gpus]
        admits: list[Admit] = []
        for job in arrival_order(candidates):
            if free_gpus <= 0 or len(admits) >= config.max_admissions_per_cycle:
                break
            gpus = job.workers.total_gpus
            if gpus > free_gpus or not quota.can_admit(job.queue, gpus):
                continue  # BestEffortFIFO: skip, no reservation
            placement = best_fit(job, nodes, free)
            if placement is None:
                continue
            quota.use(job.queue, gpus)
            free_gpus -= gpus
            admits.append(Admit(job.key, placement, 0.0, restart=job.key in restarted or job.recovering))
        return Decisions(admit=tuple(admits), restart=tuple(restarts))


def best_fit(job: Job, nodes: list[Node], free: Free) -> tuple[str, ...] | None:
    """All workers or none; each on the feasible node with the fewest GPUs left, no topology."""
    placement: list[str] = []
    for _ in range(job.workers.replicas):
        best: str | None = None
        best_left = 1 << 62
        for node in nodes:
            slot = free[node.name]
            if slot[0] < best_left and fits(slot, job) and model_ok(job, node):
                best, best_left = node.name, slot[0]
        if best is None:
            for name in placement:  # roll back
                take(free[name], job, sign=-1)
            return None
        take(free[best], job)
        placement.append(best)
    return tuple(placement)


class QuotaBook:
    """Kueue-style quota: a queue uses its nominal quota, and beyond it borrows what the other queues
    of its cohort lend (each at most its lending limit) and do not use, up to its borrowing limit."""

    def __init__(self, queues: Iterable[Queue], used: dict[str, int]) -> None:
        self.queues = {queue.name: queue for queue in queues}
        self.used: dict[str, int] = defaultdict(int, used)
        self.members: dict[str, list[Queue]] = defaultdict(list)
        for queue in self.queues.values():
            if queue.cohort:
                self.members[queue.cohort].append(queue)

    def use(self, name: str, gpus: int) -> None:
        self.used[name] += gpus

    def can_admit(self, name: str, gpus: int) -> bool:
        queue = self.queues.get(name)
        if queue is None:
            return False
        used = self.used[name]
        if used + gpus <= queue.nominal_gpus:
            return True
        borrow_after = used + gpus - queue.nominal_gpus
        if queue.borrowing_limit_gpus is not None and borrow_after > queue.borrowing_limit_gpus:
            return False
        pool_free = -max(0, used - queue.nominal_gpus)  # what this queue already borrows
        for other in self.members.get(queue.cohort or "", []) if queue.cohort else []:
            if other.name == name:
                continue
            lendable = other.nominal_gpus if other.lending_limit_gpus is None else other.lending_limit_gpus
            lendable = min(lendable, other.nominal_gpus)
            own = self.used[other.name]
            own_in_lendable = min(lendable, max(0, own - (other.nominal_gpus - lendable)))
            pool_free += lendable - own_in_lendable - max(0, own - other.nominal_gpus)
        return min(gpus, borrow_after) <= pool_free
