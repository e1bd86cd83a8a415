"""ClusterIndex: everything `schedule` derives from a snapshot before it decides, kept between cycles.

`schedule(snapshot, now, config)` builds one from scratch (O(nodes log nodes + jobs)). A caller that runs
many cycles (the operator loop, the simulator) may keep one and feed it the deltas since the last cycle
with `apply`, which costs O(changes); `schedule(snapshot, now, config, index=index)` then starts from
it. The index is a cache, never a source of truth: `schedule` never changes its view of the cluster (it
works on a copy), and decisions are the same with or without it.
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter

from gpuq.core.config import SchedulerConfig
from gpuq.core.constraints import (
    F_TAINTS,
    HARD_EFFECTS,
    constraints_key,
    first_failed_filter,
    is_schedulable,
    node_model,
    taint_text,
    untolerated,
)
from gpuq.core.decisions import Pending
from gpuq.core.fit import Demand, Extra, extra_of, slots_on
from gpuq.core.model import Job, Node, Queue, Snapshot, TaintEffect, WorkerSpec
from gpuq.core.pools import Pool
from gpuq.core.service import LevelCache, level_of, service_times
from gpuq.core.topology import DomainTree, scope_sizes

NO_MODEL = ""  # model key of nodes that report no GPU model


OrderKey = tuple[int, int, float, str]


def order_key(job: Job, thresholds: tuple[float, ...] = ()) -> OrderKey:
    """Queue order: higher priority first, then the lower attained-service level (ServiceOrdering;
    a pending job's level is fixed while it waits), then older, then by key (a stable tie-break)."""
    return (-job.priority, level_of(job.attained_gpu_seconds, thresholds), job.created_at, job.key)


def pending_class(job: Job, d: Demand) -> Hashable:
    """Jobs of one queue with equal classes are interchangeable for admission: same priority, gang
    shape, constraints and topology request (only their order and age differ)."""
    c = job.constraints
    return (job.priority, job.workers.replicas, d, constraints_key(c), c.mixed_models, job.topology)


# Every field but the two a start changes (running, queued_since): what _started compares (read
# at once by an attrgetter: these comparisons run for every job a simulated cycle changes).
_KEPT_BY_A_START = attrgetter(*(f.name for f in fields(Job) if f.name not in ("running", "queued_since")))


def _started(old: Job, new: Job) -> bool:
    """A queued job that just started, nothing else about it changed: it only takes capacity. (When
    it was queued since no longer matters once it runs: the operator stops reporting it then.)"""
    return (
        old.running is None
        and not old.recovering
        and new.running is not None
        and not new.recovering
        and not new.evicting
        and _KEPT_BY_A_START(old) == _KEPT_BY_A_START(new)
    )


# Every field but the checkpoint: what _repriced compares.
_KEPT_BY_A_CHECKPOINT = attrgetter(*(f.name for f in fields(Job) if f.name != "checkpoint"))


def _queued(job: Job) -> bool:
    """A job waiting in its queue (not running, not recovering): it holds no capacity or quota."""
    return job.running is None and not job.recovering


def _repriced(old: Job, new: Job) -> bool:
    """A running job that reported a checkpoint, nothing else about it changed: only what evicting
    it would cost (preemption and consolidation searches) changed, no capacity, quota or service."""
    return (
        old.running is not None
        and old.checkpoint != new.checkpoint
        and _KEPT_BY_A_CHECKPOINT(old) == _KEPT_BY_A_CHECKPOINT(new)
    )


def _same_service(old: Job, new: Job) -> bool:
    """The same running attempt of the same job, still (or still not) evicting (a new checkpoint):
    its service times and level entry do not change, so they are kept, not scheduled again. (An
    evicting job's times are dropped from service_events: one that stops evicting schedules them.)"""
    return (
        old.running is not None
        and old.running == new.running
        and old.evicting == new.evicting
        and old.attained_gpu_seconds == new.attained_gpu_seconds
        and old.workers == new.workers
        and old.queue == new.queue
    )


class SnapshotError(ValueError):
    """The snapshot is structurally wrong (a bug in the code that built it); nothing was decided."""


@dataclass(frozen=True, slots=True)
class Eligibility:
    """Nodes (indices, canonical order) passing a constraint signature's hard filters, and why the
    others failed: filter name -> number of schedulable nodes it was the first to reject."""

    nodes: tuple[int, ...]
    rejected_by: tuple[tuple[str, int], ...]
    # Untolerated NoSchedule/NoExecute taints ("key=value:Effect") of the nodes the taints filter rejected,
    # with how many of those nodes carry each: what a pending reason names.
    taints: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class CapacityShort:
    """A gang its eligible nodes could not hold even empty: how many workers they hold at most, and
    the resources that alone fall short (empty when only their combination does)."""

    eligible: int
    held: int
    lacking: tuple[str, ...]


def _add_extra(target: dict[str, int] | None, extra: Extra, sign: int) -> dict[str, int] | None:
    if not extra:
        return target
    out = dict(target) if target else {}
    for k, v in extra:
        out[k] = out.get(k, 0) + sign * v
    return out


class ClusterIndex:
    """Node arrays, the domain tree, open-pool aggregates and job bookkeeping of one snapshot."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig) -> None:
        self.config = config
        self.thresholds = config.service.thresholds_gpu_seconds
        self.rebuilds = 0
        self._build(snapshot)

    # ---- building -------------------------------------------------------------------------------

    def _build(self, snapshot: Snapshot) -> None:
        self.rebuilds += 1
        # Bumped by every delta except those of queued jobs (arriving, changing while they wait,
        # leaving: they hold nothing), starts and checkpoints: equal counts between two cycles mean no
        # running or recovering job left, nothing released, no node changed (see scheduler).
        self.changes = 0
        self.takes = 0  # pending jobs that started running (capacity only shrinks): not a change
        self.reprices = 0  # running jobs that reported a checkpoint (only victims' costs change)
        self.min_runtime_running = 0  # running jobs with minRuntimeSeconds (time alone changes victims)
        self.cycle_memo: object | None = None  # what the last cycle left for the next (scheduler)
        # (snapshot.queues, by name, by cohort) of the last cycle: the scheduler's, reused while the
        # caller hands it the same tuple.
        self.cycle_queues: tuple[tuple[Queue, ...], dict[str, Queue], dict[str, list[Queue]]] | None = None
        # What the last explaining cycle made of each queue: (what it was made of, its Pendings)
        # (scheduler: _Cycle._explained). Kept valid by queue_versions: bumped whenever a pending
        # job of the queue comes, changes or goes; backoffs: its queued jobs with a notBefore.
        self.explained: dict[str, tuple[object, tuple[Pending, ...]]] = {}
        self.queue_versions: dict[str, int] = {}
        self.backoffs: dict[str, int] = {}
        self._pools_ready = False  # _use() keeps pools current only once they exist
        self.snapshot = snapshot
        self.topology = snapshot.topology
        L = len(snapshot.topology.levels)
        if L < 1:
            raise SnapshotError("topology needs at least one level (the node level)")
        seen: set[str] = set()
        for node in snapshot.nodes:
            if node.name in seen:
                raise SnapshotError(f"node {node.name!r} appears twice in the snapshot")
            seen.add(node.name)
            if len(node.path) != L:
                raise SnapshotError(
                    f"node {node.name!r} has topology path {node.path!r} of length {len(node.path)}, "
                    f"expected {L} (levels {snapshot.topology.levels})"
                )
        nodes = sorted(snapshot.nodes, key=lambda nd: (nd.path[:-1], nd.name))
        self.nodes: list[Node] = nodes
        self.node_idx = {nd.name: i for i, nd in enumerate(nodes)}
        self.paths = [(*nd.path[:-1], nd.name) for nd in nodes]
        self.tree = DomainTree(snapshot.topology, self.paths)
        self.scope_sizes = scope_sizes(nodes)  # nodes per zone and in all: disruption thresholds
        N = len(nodes)
        self.cap_gpu = [0] * N
        self.cap_cpu = [0] * N
        self.cap_mem = [0] * N
        self.cap_extra: list[dict[str, int] | None] = [None] * N
        self.used_gpu = [0] * N  # by gpuq's running jobs
        self.used_cpu = [0] * N
        self.used_mem = [0] * N
        self.used_extra: list[dict[str, int] | None] = [None] * N
        # Free resources as int64 arrays: a cycle copies them with one memcpy each.
        self.free_gpu = array("q", bytes(8 * N))
        self.free_cpu = array("q", bytes(8 * N))
        self.free_mem = array("q", bytes(8 * N))
        self.free_extra: dict[int, dict[str, int]] = {}  # sparse: only nodes with extended resources
        self.schedulable = bytearray(N)
        self.model: list[str] = [NO_MODEL] * N
        self.suspects: set[int] = set()  # nodes that may fail gangs: health, NotReady, NoExecute, bad GPUs
        self.static_version = 0
        self.eligibility_cache: dict[Hashable, Eligibility] = {}
        # (constraints, demand, replicas) -> (static_version, why the gang cannot fit even an empty
        # cluster, or None): a job that can never fit costs O(1) per cycle until nodes change.
        self.capacity_cache: dict[Hashable, tuple[int, CapacityShort | None]] = {}
        for i, nd in enumerate(nodes):
            self._load_static(i, nd)
        self.width = max([*self.cap_gpu, 1]) + 1
        # GPU models of the schedulable nodes, and how many such nodes each has: a model that appears
        # or loses its last schedulable node changes pools and model rules, so the index rebuilds.
        self.model_nodes = Counter(self.model[i] for i in range(N) if self.schedulable[i])
        self.models = sorted(self.model_nodes)
        # Jobs.
        self.jobs: dict[str, Job] = {}
        self.demand: dict[str, Demand] = {}
        self._demands: dict[int, tuple[WorkerSpec, Demand]] = {}  # id(workers) -> (workers, demand)
        self.job_nodes: dict[str, tuple[tuple[int, int], ...]] = {}  # running: (node, ranks there)
        self.job_models: dict[str, tuple[tuple[str, int], ...]] = {}  # running: GPUs per GPU model
        self.orphans: dict[str, tuple[str, ...]] = {}  # running job -> its node names not in the snapshot
        self.on_node: dict[int, set[str]] = {}
        self.running_by_queue: dict[str, set[str]] = {}
        # queue -> node -> GPUs its running jobs (evicting ones too) hold there: what evicting every
        # job of a queue could release at most (preemption.room_for_queues).
        self.queue_node_gpus: dict[str, dict[int, int]] = {}
        self.running_priorities: dict[str, dict[int, int]] = {}  # queue -> priority -> running jobs
        self.pending: set[str] = set()
        self.recovering: set[str] = set()  # pending jobs waiting for re-placement after a failure
        # Other pending jobs: queue -> pending class -> their order keys, sorted (queue order).
        self.queued: dict[str, dict[int, list[OrderKey]]] = {}
        self.job_class: dict[str, int] = {}
        self.class_ids: dict[Hashable, int] = {}  # pending class -> small int (cheap to hash)
        self.class_invalid: dict[int, str | None] = {}  # pending class -> spec error (scheduler fills)
        # pending class -> (static_version, why it never fits or None): the scheduler's _never_fits
        self.class_never: dict[int, tuple[int, str | None]] = {}
        # (demand, replicas, pools' members) -> (static_version, depth): the scheduler's _local_depth
        self.local_depths: dict[Hashable, tuple[int, int]] = {}
        self.evicting: set[str] = set()
        # When running jobs reach an attained-service level or their minimum run (gpuq.core.service):
        # a lazy heap of (time, job, attempt start); stale entries are skipped when popped.
        self.service_events: list[tuple[float, str, float]] = []
        self.service_events_now = float("-inf")
        self.service_events_filled = False  # next_service_event fills the heap at its first call
        self.levels = LevelCache(self.config.service, self.jobs)  # attained-service tables (service.py)
        self.usage: dict[str, int] = {}  # queue -> GPUs held (running, not evicting) or kept (recovering)
        self.evicting_usage: dict[str, int] = {}  # queue -> GPUs its evicting gangs still hold
        self.model_usage: dict[str, dict[str, int]] = {}
        for job in snapshot.jobs:
            if job.key in self.jobs:
                raise SnapshotError(f"job {job.key!r} appears twice in the snapshot")
            self._add_job(job)
        for i in range(N):
            self._refresh_free(i)
        self._build_pools()
        self._pools_ready = True

    def _load_static(self, i: int, nd: Node) -> None:
        gpus = nd.allocatable.gpus if nd.healthy_gpus is None else min(nd.allocatable.gpus, nd.healthy_gpus)
        self.cap_gpu[i] = gpus
        self.cap_cpu[i] = nd.allocatable.cpu_millis
        self.cap_mem[i] = nd.allocatable.memory_bytes
        # Extended resources are kept net of other schedulers' pods (GPU/CPU/memory subtract them in
        # _refresh_free, so the shell can update used_by_others without touching capacity).
        cap_extra = dict(nd.allocatable.extra) if nd.allocatable.extra else None
        others = extra_of(nd.used_by_others)
        self.cap_extra[i] = _add_extra(cap_extra, others, -1) if others else cap_extra
        self.schedulable[i] = 1 if is_schedulable(nd) else 0
        self.model[i] = node_model(nd, self.config.gpu_model_label) or NO_MODEL
        suspect = (
            not self.schedulable[i]
            or nd.healthy_gpus is not None
            or any(t.effect is TaintEffect.NO_EXECUTE for t in nd.taints)
        )
        if suspect:
            self.suspects.add(i)
        else:
            self.suspects.discard(i)

    def _refresh_free(self, i: int) -> None:
        nd = self.nodes[i]
        o = nd.used_by_others
        self.free_gpu[i] = self.cap_gpu[i] - o.gpus - self.used_gpu[i]
        self.free_cpu[i] = self.cap_cpu[i] - o.cpu_millis - self.used_cpu[i]
        self.free_mem[i] = self.cap_mem[i] - o.memory_bytes - self.used_mem[i]
        used = self.used_extra[i]
        cap = self.cap_extra[i]
        free = _add_extra(cap, tuple(used.items()), -1) if used else (dict(cap) if cap else None)
        if free:
            self.free_extra[i] = free
        else:
            self.free_extra.pop(i, None)

    def _open(self, i: int) -> bool:
        """Open nodes take any job: schedulable and untainted."""
        return bool(self.schedulable[i]) and not self.nodes[i].taints

    def _build_pools(self) -> None:
        N = len(self.nodes)
        open_nodes = [i for i in range(N) if self._open(i)]
        self.open_all = Pool(self.tree, self.width, N, open_nodes, self.free_gpu, self.cap_gpu, None, "open")
        by_model: dict[str, list[int]] = {m: [] for m in self.models}
        for i in open_nodes:
            by_model[self.model[i]].append(i)
        self.open_by_model = {
            m: Pool(self.tree, self.width, N, members, self.free_gpu, self.cap_gpu, m, f"open:{m}")
            for m, members in sorted(by_model.items())
        }
        self.soft_tainted = sum(
            1
            for i in range(N)
            if self.schedulable[i]
            and self.nodes[i].taints
            and all(t.effect is TaintEffect.PREFER_NO_SCHEDULE for t in self.nodes[i].taints)
        )

    def pools(self) -> list[Pool]:
        return [self.open_all, *self.open_by_model.values()]

    # ---- jobs -----------------------------------------------------------------------------------

    def _add_job(self, job: Job, same_service: bool = False) -> None:
        """`same_service`: it replaces a job whose service times and level entry it shares (kept)."""
        key = job.key
        self.jobs[key] = job
        d = self._demand_of(job.workers)
        self.demand[key] = d
        if job.running is None:
            self.pending.add(key)
            self._count_pending(job, 1)
            if job.recovering:
                self.recovering.add(key)
                self._count_usage(job.queue, job.workers.total_gpus, ())
            else:
                ck = self.class_ids.setdefault(pending_class(job, d), len(self.class_ids))
                self.job_class[key] = ck
                bisect.insort(
                    self.queued.setdefault(job.queue, {}).setdefault(ck, []), order_key(job, self.thresholds)
                )
            return
        counts: dict[int, int] = {}
        missing: list[str] = []
        for name in job.running.placement:
            i = self.node_idx.get(name)
            if i is None:
                missing.append(name)
            else:
                counts[i] = counts.get(i, 0) + 1
        placed = tuple(sorted(counts.items()))
        self.job_nodes[key] = placed
        if missing:
            self.orphans[key] = tuple(sorted(set(missing)))
        self.running_by_queue.setdefault(job.queue, set()).add(key)
        if not same_service:
            self._push_service_events(job)
            self.levels.add(job)
        if job.min_runtime_seconds > 0:
            self.min_runtime_running += 1
        prios = self.running_priorities.setdefault(job.queue, {})
        prios[job.priority] = prios.get(job.priority, 0) + 1
        held = self.queue_node_gpus.setdefault(job.queue, {})
        for i, k in placed:
            self.on_node.setdefault(i, set()).add(key)
            self._use(i, d, k)
            if d.gpus:
                held[i] = held.get(i, 0) + k * d.gpus
        models = self._models_of(placed, d)
        self.job_models[key] = models
        if job.evicting:
            self.evicting.add(key)
            self._count_evicting(job.queue, len(job.running.placement) * d.gpus)
        else:
            self._count_usage(job.queue, len(job.running.placement) * d.gpus, models)

    def _demand_of(self, workers: WorkerSpec) -> Demand:
        """Demand.of, kept for the last WorkerSpec objects seen: the shell hands jobs of one shape the
        same object, so a build of 15,000 jobs derives a handful."""
        kept = self._demands.get(id(workers))
        if kept is not None and kept[0] is workers:
            return kept[1]
        d = Demand.of(workers)
        if len(self._demands) >= 1024:
            self._demands.clear()
        self._demands[id(workers)] = (workers, d)
        return d

    def _push_service_events(self, job: Job) -> None:
        if not self.service_events_filled:
            return  # the first next_service_event enters every running job
        assert job.running is not None
        for t in service_times(job, self.config.service, self.config.consolidation.enabled):
            heapq.heappush(self.service_events, (t, job.key, job.running.started_at))

    def _fill_service_events(self, now: float) -> None:
        """The heap from scratch: every running job's times after `now` (its first use, or time went
        back), heapified at once rather than a push, and a pop at once, per past time of every job."""
        rule, moves = self.config.service, self.config.consolidation.enabled
        heap = self.service_events
        heap.clear()
        for keys in self.running_by_queue.values():
            for key in keys:
                job = self.jobs[key]
                assert job.running is not None
                started = job.running.started_at
                heap.extend((t, key, started) for t in service_times(job, rule, moves) if t > now)
        heapq.heapify(heap)
        self.service_events_filled = True

    def next_service_event(self, now: float) -> float:
        """The earliest time after `now` at which a running job (not being evicted) passes its minimum
        run or reaches a new attained-service level: time alone may then give a queue new victims.
        Entries of jobs gone, restarted or evicting since they were pushed are dropped as met."""
        heap = self.service_events
        # Time went back: entries already dropped may matter again.
        if not self.service_events_filled or now < self.service_events_now:
            self._fill_service_events(now)
        self.service_events_now = now
        while heap:
            t, key, started = heap[0]
            job = self.jobs.get(key)
            live = job is not None and job.running is not None and job.running.started_at == started
            if t > now and live and key not in self.evicting:
                return t
            heapq.heappop(heap)
        return float("inf")

    def _remove_job(self, key: str, same_service: bool = False) -> None:
        job = self.jobs.pop(key)
        d = self.demand.pop(key)
        if job.running is None:
            self.pending.discard(key)
            self._count_pending(job, -1)
            if job.recovering:
                self.recovering.discard(key)
                self._count_usage(job.queue, -job.workers.total_gpus, ())
            else:
                self._unqueue(job)
            return
        placed = self.job_nodes.pop(key)
        self.orphans.pop(key, None)
        self.running_by_queue[job.queue].discard(key)
        if not same_service:
            self.levels.remove(job)
        if job.min_runtime_seconds > 0:
            self.min_runtime_running -= 1
        prios = self.running_priorities[job.queue]
        prios[job.priority] -= 1
        if not prios[job.priority]:
            del prios[job.priority]
        held = self.queue_node_gpus[job.queue]
        for i, k in placed:
            self.on_node[i].discard(key)
            self._use(i, d, -k)
            if d.gpus:
                left = held[i] - k * d.gpus
                if left:
                    held[i] = left
                else:
                    del held[i]
        models = self.job_models.pop(key)
        if key in self.evicting:
            self.evicting.discard(key)
            self._count_evicting(job.queue, -len(job.running.placement) * d.gpus)
        else:
            self._count_usage(
                job.queue, -len(job.running.placement) * d.gpus, tuple((m, -g) for m, g in models)
            )

    def _count_pending(self, job: Job, sign: int) -> None:
        q = job.queue
        self.queue_versions[q] = self.queue_versions.get(q, 0) + 1
        if job.not_before and not job.recovering:
            left = self.backoffs.get(q, 0) + sign
            if left:
                self.backoffs[q] = left
            else:
                del self.backoffs[q]

    def _unqueue(self, job: Job) -> None:
        ck = self.job_class.pop(job.key)
        classes = self.queued[job.queue]
        keys = classes[ck]
        ok = order_key(job, self.thresholds)
        i = bisect.bisect_left(keys, ok)
        assert keys[i] == ok
        del keys[i]
        if not keys:
            del classes[ck]
            if not classes:
                del self.queued[job.queue]

    def _models_of(self, placed: tuple[tuple[int, int], ...], d: Demand) -> tuple[tuple[str, int], ...]:
        out: dict[str, int] = {}
        for i, k in placed:
            m = self.model[i]
            if m != NO_MODEL and d.gpus:
                out[m] = out.get(m, 0) + k * d.gpus
        return tuple(sorted(out.items()))

    def _count_usage(self, queue: str, gpus: int, models: tuple[tuple[str, int], ...]) -> None:
        self.usage[queue] = self.usage.get(queue, 0) + gpus
        if models:
            mu = self.model_usage.setdefault(queue, {})
            for m, g in models:
                mu[m] = mu.get(m, 0) + g

    def _count_evicting(self, queue: str, gpus: int) -> None:
        left = self.evicting_usage.get(queue, 0) + gpus
        if left:
            self.evicting_usage[queue] = left
        else:
            self.evicting_usage.pop(queue, None)  # a gang of no GPUs never entered it

    def _use(self, i: int, d: Demand, k: int) -> None:
        """Account k workers of d on node i (negative k releases), keeping free arrays and pools current
        once the index is built."""
        self.used_gpu[i] += d.gpus * k
        self.used_cpu[i] += d.cpu * k
        self.used_mem[i] += d.mem * k
        if d.extra:
            self.used_extra[i] = _add_extra(self.used_extra[i], d.extra, k)
        if self._pools_ready:
            old = self.free_gpu[i]
            self._refresh_free(i)
            self._move_in_pools(i, old, self.free_gpu[i])

    def _move_in_pools(self, i: int, old: int, new: int) -> None:
        for pool in self.pools():
            if pool.member[i]:
                pool.move(i, old, new)

    # ---- deltas ---------------------------------------------------------------------------------

    def apply(
        self,
        snapshot: Snapshot,
        *,
        nodes: Iterable[Node] = (),
        removed_nodes: Iterable[str] = (),
        jobs: Iterable[Job] = (),
        removed_jobs: Iterable[str] = (),
    ) -> None:
        """Bring the index to `snapshot`, given what changed since the snapshot it reflects.

        `nodes`/`jobs` are added or changed objects, `removed_*` names/keys that are gone. Added or removed
        nodes, a changed node path or GPU model, or a topology change rebuild the index from `snapshot`
        (rare events); everything else costs O(changes). If the counts then disagree with `snapshot`,
        the deltas were incomplete and the index rebuilds rather than decide on a wrong view.
        """
        nodes = list(nodes)
        removed_nodes = list(removed_nodes)
        if snapshot.topology != self.topology or removed_nodes or any(self._structural(nd) for nd in nodes):
            self._build(snapshot)
            return
        for nd in nodes:
            self.changes += 1
            self._update_node(nd)
        for key in removed_jobs:
            gone = self.jobs.get(key)
            if gone is not None:
                self.changes += not _queued(gone)
                self._remove_job(key)
        for job in jobs:
            old = self.jobs.get(job.key)
            if old is not None and _repriced(old, job):
                # Only its checkpoint changed: nothing derived from it does (its nodes, usage, class,
                # service times and level entry are those of `old`), so only the job is replaced.
                self.reprices += 1
                self.jobs[job.key] = job
                continue
            same = old is not None and _same_service(old, job)
            if old is not None:
                if _started(old, job):
                    self.takes += 1
                elif not (_queued(old) and _queued(job)):
                    self.changes += 1
                self._remove_job(job.key, same)
            elif not _queued(job):
                self.changes += 1
            self._add_job(job, same)
        self.snapshot = snapshot
        if len(snapshot.nodes) != len(self.nodes) or len(snapshot.jobs) != len(self.jobs):
            self._build(snapshot)

    def _structural(self, nd: Node) -> bool:
        i = self.node_idx.get(nd.name)
        if i is None:
            return True
        old = self.nodes[i]
        gpus = nd.allocatable.gpus if nd.healthy_gpus is None else min(nd.allocatable.gpus, nd.healthy_gpus)
        model = node_model(nd, self.config.gpu_model_label) or NO_MODEL
        return (
            old.path != nd.path
            or gpus >= self.width
            or model != self.model[i]
            or (is_schedulable(nd) and model not in self.model_nodes)
            or (not is_schedulable(nd) and self.schedulable[i] == 1 and self.model_nodes[model] == 1)
        )

    def _update_node(self, nd: Node) -> None:
        i = self.node_idx[nd.name]
        old = self.nodes[i]
        if old is nd:
            return
        was_open = self._open(i)
        old_free = self.free_gpu[i]
        if was_open:
            for pool in self.pools():
                if pool.member[i]:
                    pool.remove(i, old_free, self.cap_gpu[i])
        static_changed = (
            old.labels != nd.labels
            or old.taints != nd.taints
            or old.health != nd.health
            or old.not_ready_since != nd.not_ready_since
            or old.disrupted_at != nd.disrupted_at
            or old.flapping != nd.flapping
            or old.allocatable != nd.allocatable
            or old.healthy_gpus != nd.healthy_gpus
        )
        old_soft = self._soft(i)
        self.model_nodes[self.model[i]] -= self.schedulable[i]
        self.nodes[i] = nd
        self._load_static(i, nd)
        self.model_nodes[self.model[i]] += self.schedulable[i]
        self._refresh_free(i)
        self.soft_tainted += self._soft(i) - old_soft
        if static_changed:
            self.static_version += 1
            self.eligibility_cache.clear()
        if self._open(i):
            self.open_all.add(i, self.free_gpu[i], self.cap_gpu[i])
            self.open_by_model[self.model[i]].add(i, self.free_gpu[i], self.cap_gpu[i])

    def _soft(self, i: int) -> int:
        nd = self.nodes[i]
        return int(
            bool(self.schedulable[i])
            and bool(nd.taints)
            and all(t.effect is TaintEffect.PREFER_NO_SCHEDULE for t in nd.taints)
        )

    # ---- queries --------------------------------------------------------------------------------

    def never_fits(self, job: Job, d: Demand) -> CapacityShort | None:
        """Whether the gang could not fit even if nothing ran anywhere: its eligible nodes' allocatable
        resources hold fewer than its replicas. Checked against capacity, so it stays true until nodes
        change (cached per static_version); usually O(replicas) nodes are read."""
        R = job.workers.replicas
        key = (constraints_key(job.constraints), d, R)
        hit = self.capacity_cache.get(key)
        if hit is not None and hit[0] == self.static_version:
            return hit[1]
        el = self.eligibility(job)
        short: CapacityShort | None = None
        if el.nodes and self._capacity_slots(el.nodes, d, R) < R:
            alone = {"GPU": Demand(d.gpus, 0, 0), "CPU": Demand(0, d.cpu, 0), "memory": Demand(0, 0, d.mem)}
            alone.update({name: Demand(0, 0, 0, ((name, v),)) for name, v in d.extra})
            nothing = Demand(0, 0, 0)
            lacking = tuple(
                r for r, one in alone.items() if one != nothing and self._capacity_slots(el.nodes, one, R) < R
            )
            short = CapacityShort(len(el.nodes), self._capacity_slots(el.nodes, d, R), lacking)
        if len(self.capacity_cache) > 1024:
            self.capacity_cache.clear()
        self.capacity_cache[key] = (self.static_version, short)
        return short

    def _capacity_slots(self, nodes: Sequence[int], d: Demand, enough: int) -> int:
        """Workers of `d` these nodes' allocatable resources hold, empty (counting stops at `enough`)."""
        total = 0
        for i in nodes:
            extra = self.nodes[i].allocatable.extra
            total += slots_on(self.cap_gpu[i], self.cap_cpu[i], self.cap_mem[i], extra, d)
            if total >= enough:
                break
        return total

    def eligibility(self, job: Job) -> Eligibility:
        """Schedulable nodes passing the job's hard filters (cached per constraint signature)."""
        c = job.constraints
        key = constraints_key(c)
        hit = self.eligibility_cache.get(key)
        if hit is not None:
            return hit
        label = self.config.gpu_model_label
        ok: list[int] = []
        rejected: dict[str, int] = {}
        taints: dict[str, int] = {}
        for i, nd in enumerate(self.nodes):
            if not self.schedulable[i]:
                continue
            failed = first_failed_filter(nd, c, label)
            if failed is None:
                ok.append(i)
            else:
                rejected[failed] = rejected.get(failed, 0) + 1
                if failed == F_TAINTS:
                    for t in {taint_text(t) for t in untolerated(nd, c.tolerations, HARD_EFFECTS)}:
                        taints[t] = taints.get(t, 0) + 1
        result = Eligibility(tuple(ok), tuple(sorted(rejected.items())), tuple(sorted(taints.items())))
        if len(self.eligibility_cache) > 256:
            self.eligibility_cache.clear()
        self.eligibility_cache[key] = result
        return result
