"""`kube-default`: what the default kube-scheduler profile does with a training job's pods.

One pod at a time from a queue ordered by priority then arrival; no gangs, so a partially bound job
holds its GPUs while its other pods wait. Filter: resources fit (GPUs, cpu, memory) and GPU model
(node affinity). Score, with the default profile's weights, each plugin normalised to 0-100 in the
scheduler's integer arithmetic:
- NodeResourcesFit, LeastAllocated over cpu and memory (weight 1; the default scores no extended
  resource, so nvidia.com/gpu is not scored);
- NodeResourcesBalancedAllocation over cpu and memory (weight 1);
- PodTopologySpread with the system default constraints for pods under a Service (a training job's
  headless Service): hostname maxSkew 3 and zone maxSkew 5, ScheduleAnyway (weight 2);
ties broken at random; on clusters over 100 nodes only a rotating sample is scored
(percentageOfNodesToScore). DefaultPreemption evicts lower-priority pods on one node, which kills
their whole job (no checkpoint request: the job keeps its last periodic checkpoint).
Trace jobs carry cpu/memory requests proportional to their GPUs (gpuq.sim.engine.worker_spec).
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict

from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Admit, Decisions, Preempt
from gpuq.core.model import Job, Node, Snapshot
from gpuq.sim.baselines import Free, Tracker, failed_node_restarts, fits, model_ok, take
from gpuq.sim.policy import Delta

MAX_SCORE = 100
FIT_WEIGHT, BALANCED_WEIGHT, SPREAD_WEIGHT = 1, 1, 2
HOST_SKEW, ZONE_SKEW = 3, 5  # system default constraints (ScheduleAnyway)


def nodes_to_score(total: int) -> int:
    """kube-scheduler's adaptive percentageOfNodesToScore: all of small clusters, else
    max(5%, 50% - nodes/125) but at least 100 nodes."""
    if total <= 100:
        return total
    percentage = max(5.0, 50.0 - total / 125.0)
    return max(100, int(total * percentage / 100))


def least_allocated(node: Node, slot: list[int], job: Job) -> int:
    """NodeResourcesFit LeastAllocated over cpu and memory, equal weights."""
    a, w = node.allocatable, job.workers
    score, weights = 0, 0
    for capacity, left, request in (
        (a.cpu_millis, slot[1], w.cpu_millis),
        (a.memory_bytes, slot[2], w.memory_bytes),
    ):
        if capacity > 0:
            score += (left - request) * MAX_SCORE // capacity
            weights += 1
    return score // weights if weights else 0


def balanced_allocation(node: Node, slot: list[int], job: Job) -> int:
    """NodeResourcesBalancedAllocation: 100 x (1 - std of the cpu and memory fractions after binding)."""
    a, w = node.allocatable, job.workers
    fractions = [
        min(1.0, (capacity - left + request) / capacity)
        for capacity, left, request in (
            (a.cpu_millis, slot[1], w.cpu_millis),
            (a.memory_bytes, slot[2], w.memory_bytes),
        )
        if capacity > 0
    ]
    if len(fractions) < 2:
        return MAX_SCORE
    mean = sum(fractions) / len(fractions)
    std = math.sqrt(sum((f - mean) ** 2 for f in fractions) / len(fractions))
    return int((1 - std) * MAX_SCORE)


class KubeDefault:
    name = "kube-default"
    checkpoint_on_preempt = False
    timers = False

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.next_start = 0  # kube-scheduler rotates where its node search starts
        self.tracker = Tracker()

    def schedule(self, snapshot: Snapshot, now: float, config: SchedulerConfig, delta: Delta) -> Decisions:
        restarts, restarted = failed_node_restarts(snapshot)
        self.tracker.update(snapshot, delta)
        v = self.tracker.view(snapshot, restarted)
        free, nodes, free_gpus, lowest = v.free, v.nodes, v.free_gpus, v.lowest_running_priority
        bound: dict[str, list[str]] = {}
        preempts: list[Preempt] = []
        evicted: set[str] = set(restarted)
        unschedulable: set[tuple[int, int, int, tuple[str, ...]]] = set()
        for job in v.waiting:
            may_preempt = lowest is not None and job.priority > lowest
            if free_gpus <= 0 and not may_preempt:
                break  # the queue is sorted by priority: nothing after this can bind or preempt
            if job.workers.gpus_per_worker > free_gpus and not may_preempt:
                continue  # its pods fit nowhere and it may not preempt
            if job.key in evicted and job.key not in restarted:
                continue
            placement = list(job.running.placement) if job.running and job.key not in restarted else []
            w = job.workers
            shape = (w.gpus_per_worker, w.cpu_millis, w.memory_bytes, job.constraints.gpu_models)
            grew = False
            while len(placement) < w.replicas and shape not in unschedulable:
                node = self._pick(job, nodes, free, placement) if free_gpus >= w.gpus_per_worker else None
                if node is None:
                    if lowest is not None and job.priority > lowest:
                        victims = preemption_victims(job, snapshot, free, evicted)
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

    def _pick(self, job: Job, nodes: list[Node], free: Free, placed: list[str]) -> str | None:
        """Filter, score a (rotating) sample, pick at random among the best."""
        wanted = nodes_to_score(len(nodes))
        count = len(nodes)
        feasible: list[Node] = []
        start = self.next_start % count if count else 0
        for offset in range(count):
            node = nodes[(start + offset) % count]
            if fits(free[node.name], job) and model_ok(job, node):
                feasible.append(node)
                if len(feasible) >= wanted:
                    self.next_start = (start + offset + 1) % count
                    break
        if not feasible:
            return None
        spread = self._spread_scores(feasible, placed)
        best: list[str] = []
        best_score = -1
        for node in feasible:
            slot = free[node.name]
            score = (
                FIT_WEIGHT * least_allocated(node, slot, job)
                + BALANCED_WEIGHT * balanced_allocation(node, slot, job)
                + SPREAD_WEIGHT * spread[node.name]
            )
            if score > best_score:
                best, best_score = [node.name], score
            elif score == best_score:
                best.append(node.name)
        return best[0] if len(best) == 1 else self.rng.choice(best)

    @staticmethod
    def _spread_scores(feasible: list[Node], placed: list[str]) -> dict[str, int]:
        """PodTopologySpread scoring over the job's own pods: fewer of them in a node's host and zone
        domains scores higher (each constraint weighted by log(domains + 2), as the plugin does)."""
        if not placed:
            return dict.fromkeys((n.name for n in feasible), MAX_SCORE)
        on_host = Counter(placed)
        zone_of = {n.name: n.path[0] for n in feasible}
        in_zone: Counter[str] = Counter(zone_of.get(name, "") for name in placed)
        host_w = math.log(len(feasible) + 2)
        zone_w = math.log(len(set(zone_of.values())) + 2)
        raw = {
            n.name: (on_host[n.name] + HOST_SKEW - 1) * host_w
            + (in_zone[zone_of[n.name]] + ZONE_SKEW - 1) * zone_w
            for n in feasible
        }
        high, low = max(raw.values()), min(raw.values())
        if high <= 0:
            return dict.fromkeys(raw, MAX_SCORE)
        return {name: int(MAX_SCORE * (high + low - r) / high) for name, r in raw.items()}


def preemption_victims(job: Job, snapshot: Snapshot, free: Free, evicted: set[str]) -> list[str]:
    """DefaultPreemption: on the node where evicting lower-priority pods makes room at the least cost
    (lowest highest victim priority, then fewest victims), evict just enough of them."""
    pods: dict[str, list[Job]] = defaultdict(list)
    for other in snapshot.jobs:
        if other.running and other.priority < job.priority and other.preemptible and other.key not in evicted:
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
