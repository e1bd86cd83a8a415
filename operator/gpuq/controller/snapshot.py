"""Build the core's immutable `Snapshot` from the ClusterCache (pure: time is an argument).

Besides the snapshot it reports which jobs were kept out and why (unknown queue, namespace not
allowed, unknown topology level, bad pod template, bigger than the cluster), which jobs hold a
placement, and the next time something changes by itself (a NotReady grace period ending, a
restart back-off expiring) so the loop can sleep until then instead of polling.
"""

from __future__ import annotations

import functools
import heapq
import math
import os
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuq.api.gpuqueue import GPUQueueSpec, StopPolicy
from gpuq.api.trainingjob import (
    FINISHED_PHASES,
    PLACED_PHASES,
    Phase,
    TrainingJobSpec,
)
from gpuq.controller import selectors
from gpuq.controller.cache import Assumed, ClusterCache
from gpuq.controller.objects import JobEntry, QueueEntry
from gpuq.controller.pods import TemplateError, check_template, worker_pod
from gpuq.controller.preemption import STOP_DRAIN, STOP_SUSPEND
from gpuq.controller.quarantine import MESSAGE as QUARANTINE_MESSAGE
from gpuq.controller.record import created_gang, finished_gang
from gpuq.controller.resources import pod_requests
from gpuq.controller.snapshot_nodes import NodeSide, Placement, bump, foreign_usage
from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import PendingCode
from gpuq.core.incremental import SnapshotDelta
from gpuq.core.model import (
    Constraints,
    Job,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredTerm,
    Queue,
    Running,
    Snapshot,
    TaintEffect,
    Toleration,
    Topology,
    TopologyMode,
    TopologyRequest,
    WorkerSpec,
)

SHAPES = 4096  # workers' shapes derived and kept (SnapshotBuilder._derive); more start afresh


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Why a job is not offered to the scheduler this cycle (it stays Queued, condition Blocked=True
    with this reason)."""

    reason: str
    message: str


# Exclusion reason of a job the core failed on (gpuq.controller.quarantine).
QUARANTINED = "InternalError"
# Exclusion reason of a job with spec.suspend that holds no GPUs (phase Suspended).
SUSPENDED = "Suspended"
SUSPENDED_MESSAGE = "suspended (spec.suspend is true): it holds no GPUs until spec.suspend is false again"
# Exclusion reason of a gang gpuq did not create whose pods do not all exist yet (or never will).
GANG_INCOMPLETE = "GangIncomplete"


@dataclass(frozen=True, slots=True)
class Holding:
    """A job that holds its placement (admitted, running, or an admission in flight)."""

    attempt: int
    placement: tuple[str, ...]
    gpus_per_worker: int


@dataclass(frozen=True, slots=True)
class View:
    snapshot: Snapshot
    excluded: Mapping[str, Exclusion] = field(default_factory=dict)
    holding: Mapping[str, Holding] = field(default_factory=dict)
    wake_at: float | None = None
    # Jobs holding a placement that must give it up though no job preempts them: key -> STOP_SUSPEND
    # (spec.suspend) or STOP_DRAIN (their queue's stopPolicy is HoldAndDrain).
    stopping: Mapping[str, str] = field(default_factory=dict)
    # Jobs holding a placement that would be kept out if they waited (key -> why): the core sees
    # them running (a failed node fails them over), but once evicted they wait blocked, so a
    # re-placement the core decides for them in the cycle of their restart is not carried out.
    blocked: Mapping[str, Exclusion] = field(default_factory=dict)
    # What changed since the builder's previous view, for the core's kept index (None: unknown).
    delta: SnapshotDelta | None = field(default=None, compare=False)
    # Jobs derived again for this view (None: all): only their exclusions can have changed.
    changed: frozenset[str] | None = field(default=None, compare=False)
    # The nodes that may fail gangs (NotReady or failed), and nodes per zone and in all: what
    # gpuq.core.failover needs to find disruptions and failed nodes without walking every node.
    suspects: tuple[Node, ...] = field(default=(), compare=False)
    scope_sizes: Mapping[str, int] = field(default_factory=dict, compare=False)
    # (queue, "running" | "waiting" | "excluded") -> jobs: the queue's job counts.
    tally: Mapping[tuple[str, str], int] = field(default_factory=dict, compare=False)


def with_recent_preemptions(queue: Queue, count: int) -> Queue:
    """The queue with the victims it lost in the last hour (its maxPreemptionsPerHour budget)."""
    if count == 0:
        return queue
    return replace(queue, preemption=replace(queue.preemption, recent=count))


def with_disrupted_at(view: View, memory: Mapping[str, float]) -> View:
    """The view with Node.disrupted_at set from the loop's memory (gpuq.core.failover). Its nodes
    are then not the builder's: the core's index recovers the delta by comparing (rare: only while
    a disruption holds NotReady nodes)."""
    if not memory:
        return view

    def disrupted(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        return tuple(replace(n, disrupted_at=memory[n.name]) if n.name in memory else n for n in nodes)

    snapshot = replace(view.snapshot, nodes=disrupted(view.snapshot.nodes))
    return replace(view, snapshot=snapshot, suspects=disrupted(view.suspects), delta=None)


def _earliest(times: Iterable[float | None]) -> float | None:
    real = [t for t in times if t is not None]
    return min(real) if real else None


# The pod template is free-form in the CRD, so the shapes gpuq reads from it are checked here, once:
# a wrong type becomes a ValueError naming the field (the job pends as Invalid), never a value the
# core cannot hash or compare.
_AFFINITY = "spec.workers.template.spec.affinity.nodeAffinity"


def _text(raw: Any, where: str, default: str = "") -> str:
    if raw is None:
        return default
    if not isinstance(raw, str):
        raise ValueError(f"{where} must be a string, not {type(raw).__name__}")
    return raw


def _items(raw: Any, where: str) -> list[Mapping[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(e, Mapping) for e in raw):
        raise ValueError(f"{where} must be a list of objects")
    return raw


def _requirements(raw: Any, where: str) -> tuple[NodeSelectorRequirement, ...]:
    out = []
    for i, e in enumerate(_items(raw, where)):
        values = e.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{where}[{i}].values must be a list of strings")
        key, op = _text(e.get("key"), f"{where}[{i}].key"), _text(e.get("operator"), f"{where}[{i}].operator")
        out.append(NodeSelectorRequirement(key, op, tuple(values)))
    return tuple(out)


def _term(raw: Any, where: str) -> NodeSelectorTerm:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object")
    return NodeSelectorTerm(
        _requirements(raw.get("matchExpressions"), f"{where}.matchExpressions"),
        _requirements(raw.get("matchFields"), f"{where}.matchFields"),
    )


def _toleration(raw: Mapping[str, Any], where: str) -> Toleration:
    effect = _text(raw.get("effect"), f"{where}.effect")
    return Toleration(
        key=_text(raw.get("key"), f"{where}.key"),
        operator=_text(raw.get("operator"), f"{where}.operator") or "Equal",
        value=_text(raw.get("value"), f"{where}.value"),
        effect=TaintEffect(effect) if effect else None,
    )


def _node_selector(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise ValueError("spec.workers.template.spec.nodeSelector must map label keys to strings")
    return dict(raw)


def _mapping(raw: Any, where: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object")
    return raw


def constraints(spec: TrainingJobSpec) -> Constraints:
    """Placement constraints gpuq must honour itself because it binds the pods."""
    pod = _mapping(
        _mapping(spec.workers.template, "spec.workers.template").get("spec"), "spec.workers.template.spec"
    )
    affinity = _mapping(pod.get("affinity"), "spec.workers.template.spec.affinity")
    node_aff = _mapping(affinity.get("nodeAffinity"), _AFFINITY)
    required_raw = _mapping(
        node_aff.get("requiredDuringSchedulingIgnoredDuringExecution"), f"{_AFFINITY}.required..."
    )
    required = _items(required_raw.get("nodeSelectorTerms"), f"{_AFFINITY}.required...nodeSelectorTerms")
    preferred = _items(
        node_aff.get("preferredDuringSchedulingIgnoredDuringExecution"), f"{_AFFINITY}.preferred..."
    )
    where_pref = f"{_AFFINITY}.preferred..."
    for i, p in enumerate(preferred):
        if not isinstance(p.get("weight", 1), int) or isinstance(p.get("weight", 1), bool):
            raise ValueError(f"{where_pref}[{i}].weight must be an integer")
    return Constraints(
        node_selector=_node_selector(pod.get("nodeSelector")),
        required_terms=tuple(_term(t, f"{_AFFINITY}.required...[{i}]") for i, t in enumerate(required)),
        preferred_terms=tuple(
            PreferredTerm(
                int(p.get("weight", 1)), _term(p.get("preference") or {}, f"{where_pref}[{i}].preference")
            )
            for i, p in enumerate(preferred)
        ),
        tolerations=tuple(
            _toleration(t, f"spec.workers.template.spec.tolerations[{i}]")
            for i, t in enumerate(_items(pod.get("tolerations"), "spec.workers.template.spec.tolerations"))
        ),
        gpu_models=tuple(spec.workers.gpu_models),
        mixed_models=spec.workers.mixed_models,
    )


def worker_spec(job: JobEntry, spec: TrainingJobSpec) -> WorkerSpec:
    """Per-worker requests exactly as the rendered pod will carry them."""
    pod = worker_pod(job.namespace, job.name, job.uid, spec, rank=0, attempt=0)
    req = pod_requests(pod["spec"], "spec.workers.template.spec")
    return WorkerSpec(
        replicas=spec.workers.replicas,
        gpus_per_worker=spec.workers.gpus_per_worker,
        cpu_millis=req.cpu_millis,
        memory_bytes=req.memory_bytes,
        extra=dict(req.extra),
    )


@functools.lru_cache(maxsize=256)
def _topology_request(level: str | None, mode: TopologyMode) -> TopologyRequest:
    return TopologyRequest(level, mode)  # one object per distinct request, not one per job


def _stop(job: JobEntry, queue: GPUQueueSpec | None) -> str:
    """Why the job must not hold GPUs though nobody preempts it ("" when it may); `queue`: its
    queue's spec (None: missing or invalid)."""
    spec = job.spec
    if spec is None:
        return ""
    if spec.suspend:
        return STOP_SUSPEND
    if queue is not None and queue.stop_policy is StopPolicy.HOLD_AND_DRAIN:
        # Only a placed job is drained; a queued one waits in the held queue (code Held).
        return STOP_DRAIN if job.status.phase in PLACED_PHASES else ""
    return ""


def unrecorded_gang(job: JobEntry, cache: ClusterCache) -> tuple[str, ...] | None:
    """The placement of a gang created with no status recording it yet (gpuq.controller.record)."""
    if job.status.phase in PLACED_PHASES or not cache.has_pods(job.key):
        return None
    return created_gang(job, cache.pods_of(job.key, job.uid))


def gang_shortfall(job: JobEntry, cache: ClusterCache) -> Exclusion | None:
    """Why a gang gpuq did not create cannot be admitted yet: not every rank has exactly one pod,
    made by its owner's controller, waiting to be bound (no pod of it is bound until all are)."""
    if job.source is None or job.spec is None or job.spec.suspend:
        return None  # a gang its user suspended has no pods by design: it waits Suspended (_stop)
    replicas = job.spec.workers.replicas
    pods = cache.unclaimed_of(job.key, job.uid)
    counts = Counter(p.rank for p in pods if p.live and not p.deleting and p.rank is not None)
    ready = sum(1 for r in range(replicas) if counts.get(r) == 1)
    if ready == replicas:
        return None
    msg = f"{ready} of its {replicas} workers have exactly one pod waiting to be bound"
    doubled = sorted(r for r, n in counts.items() if n > 1)
    if doubled:
        msg += f"; rank {doubled[0]} has {counts[doubled[0]]}"
    return Exclusion(GANG_INCOMPLETE, msg)


def holding(
    job: JobEntry, assumed: Assumed | None, gang: tuple[str, ...] | None, evicting: bool
) -> Holding | None:
    """The placement a job holds: an admission in flight (`assumed`), the one its status records, a
    gang created before its status (`gang`: unrecorded_gang's answer; an operator stopped in
    between), or, for a preemption victim whose pods are still leaving, the one it had."""
    gpus = job.spec.workers.gpus_per_worker if job.spec is not None else 0
    if assumed is not None:
        return Holding(assumed.attempt, assumed.placement, gpus)
    s = job.status
    if s.phase in PLACED_PHASES and s.placement:
        return Holding(s.attempt, job.facts.placement, gpus)
    if gang is not None:
        return Holding(s.attempt + 1, gang, gpus)
    if evicting and s.phase in (Phase.PREEMPTED, Phase.SUSPENDED) and s.previous_placement:
        return Holding(s.attempt, job.facts.previous_placement, gpus)
    return None


def _unclaimed(job: JobEntry, cache: ClusterCache) -> tuple[tuple[str, bool], ...]:
    """What gang_shortfall reads of a gang's unclaimed pods (empty for a TrainingJob)."""
    if job.source is None:
        return ()
    return tuple((p.uid, p.live and not p.deleting) for p in cache.unclaimed_of(job.key, job.uid))


_QueueKey = tuple[GPUQueueSpec | None, str | None]


def _same_queue(a: _QueueKey | None, b: _QueueKey | None) -> bool:
    """The same spec object and error (or both queues missing)."""
    if a is None or b is None:
        return a is b
    return a[0] is b[0] and a[1] == b[1]


_Derived = tuple[WorkerSpec | None, Constraints | None, str | None]


@dataclass(slots=True)
class _JobMemo:
    """What the last build derived from a job, valid while the inputs it read are the same objects
    (the cache replaces an entry when it changes, so identity says "unchanged")."""

    entry: JobEntry
    assumed: Assumed | None
    evicting: bool
    queue: _QueueKey | None  # the queue's spec and error: what the job's exclusion reads
    labels: Mapping[str, str] | None
    hold: Holding | None
    exclusion: Exclusion | None
    gang: tuple[str, ...] | None = None  # unrecorded_gang when it was derived
    waiting: tuple[tuple[str, bool], ...] = ()  # _unclaimed when it was derived
    derived: _Derived | None = None  # its workers' spec and constraints (or why they do not derive)
    job: Job | None = None
    job_args: tuple[float, float] | None = None  # (start fallback, notBefore) the Job was built with


@dataclass(slots=True)
class _Row:
    """A job's part of the last build, reused while nothing it was derived from changed: its
    entry, pods and assumption (ClusterCache.watch_jobs), the build-wide inputs (_Inputs) and, for
    the second half, the cluster's size and the time its notBefore passes."""

    memo: _JobMemo | None  # None: finished, or deleting with nothing held (not in the snapshot)
    spec: TrainingJobSpec | None = None
    excluded: Exclusion | None = None  # kept out before placement is looked at
    blocked: Exclusion | None = None
    stops: bool = False
    stopping: str = ""
    # The second half (after the nodes): valid for `sized` (total GPUs, largest node, any nodes)
    # until `until`.
    sized: tuple[int, int, bool] | None = None
    until: float = math.inf
    too_big: Exclusion | None = None
    wake: float | None = None


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What every job's row reads besides its own objects: a change rebuilds all rows. (Whether a
    job is evicting or quarantined is read by its own row only: a change derives it alone.)"""

    config: SchedulerConfig
    queues: tuple[tuple[str, GPUQueueSpec | None, str | None], ...]
    namespaces: tuple[tuple[str, Mapping[str, str]], ...]

    def same(self, other: _Inputs | None) -> bool:
        """Equal, with specs and label maps compared by identity (the cache replaces what changes)."""
        return (
            other is not None
            and self.config is other.config
            and len(self.queues) == len(other.queues)
            and all(
                a[0] == b[0] and a[1] is b[1] and a[2] == b[2]
                for a, b in zip(self.queues, other.queues, strict=True)
            )
            and len(self.namespaces) == len(other.namespaces)
            and all(
                a[0] == b[0] and a[1] is b[1] for a, b in zip(self.namespaces, other.namespaces, strict=True)
            )
        )


@dataclass(slots=True)
class _Kept:
    """The last build's results, kept so the next updates them for what changed only."""

    rows: dict[str, _Row] = field(default_factory=dict)
    candidates: set[str] = field(default_factory=set)  # rows not kept out before placement
    excluded: dict[str, Exclusion] = field(default_factory=dict)
    blocked: dict[str, Exclusion] = field(default_factory=dict)
    held: dict[str, Holding] = field(default_factory=dict)
    stopping: dict[str, str] = field(default_factory=dict)
    placements: dict[str, Placement] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)  # the snapshot's jobs
    order: list[str] = field(default_factory=list)  # their keys, sorted
    ordered: list[Job] = field(default_factory=list)  # their Jobs in that order (a tuple of it is cheap)
    jobs_tuple_: tuple[Job, ...] | None = None  # the snapshot's jobs, while none changed
    wakes: dict[str, float] = field(default_factory=dict)  # when a job's notBefore passes
    expiring: list[tuple[float, str]] = field(default_factory=list)  # heap: rows valid until then
    tally: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (queue, kind) counted
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    nodes: NodeSide = field(default_factory=NodeSide)
    sized: tuple[int, int, bool] | None = None
    snapshot: Snapshot | None = None
    copies: dict[str, dict[str, Any]] = field(default_factory=dict)  # what views were given

    def put(self, table: str, key: str, value: Any) -> None:
        """Set the job's entry in one of the view's tables (None: drop it)."""
        t: dict[str, Any] = getattr(self, table)
        if t.get(key) != value:
            _put(t, key, value)
            self.copies.pop(table, None)

    def shown(self, table: str) -> dict[str, Any]:
        """A copy of the table for a view, made again only after it changed (views outlive builds)."""
        copy = self.copies.get(table)
        if copy is None:
            copy = self.copies[table] = dict(getattr(self, table))
        return copy

    def set_job(self, key: str, job: Job | None, delta: list[Job], removed: list[str]) -> None:
        """The job's Job in the snapshot (None: not in it), noting the change for the core."""
        old = self.jobs.get(key)
        if old is job:
            return
        self.jobs_tuple_ = None
        order = self.order
        # A fresh build adds every job in key order: each goes last, found without a search.
        i = len(order) if not order or order[-1] < key else bisect_left(order, key)
        if job is None:
            del self.jobs[key], self.order[i], self.ordered[i]
            removed.append(key)
            return
        if old is None:
            self.order.insert(i, key)
            self.ordered.insert(i, job)
        else:
            self.ordered[i] = job
        self.jobs[key] = job
        delta.append(job)

    def jobs_tuple(self) -> tuple[Job, ...]:
        if self.jobs_tuple_ is None:
            self.jobs_tuple_ = tuple(self.ordered)
        return self.jobs_tuple_

    def count(self, key: str, tally: tuple[str, str] | None) -> None:
        """Count the job in its queue as `tally` (None: not at all)."""
        old = self.tally.get(key)
        if old == tally:
            return
        if old is not None:
            bump(self.counts, old, -1)
        if tally is None:
            del self.tally[key]
        else:
            self.tally[key] = tally
            bump(self.counts, tally, 1)


def _put(table: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` to `value`, or drop it when `value` is None."""
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


class SnapshotBuilder:
    """Turns the cache into a View. Per job and per node it keeps what it derived last time, and the
    view's parts (snapshot jobs and nodes, exclusions, placements held, per-queue tallies) as running
    results: a build derives again only the jobs and nodes the cache reports changed (watch events)
    and those whose time has come, and hands the core's kept index exactly those changes
    (`View.delta`). A change every job reads (queues, namespaces, the config) derives all again."""

    def __init__(self, verify: bool | None = None) -> None:
        # GPUQ_VERIFY_SNAPSHOT=1: every build is also made by a fresh builder and fails loudly where
        # the two differ (slow: for tests, debugging and the benchmark's debug mode).
        self.verify = os.environ.get("GPUQ_VERIFY_SNAPSHOT") == "1" if verify is None else verify
        self._inputs: _Inputs | None = None
        self._cache: ClusterCache | None = None
        self._changed_jobs: set[str] = set()  # filled by the cache (watch_jobs)
        self._touched_nodes: set[str] = set()  # filled by the cache (watch_nodes)
        self._shapes: dict[bytes, _Derived] = {}
        self._jobs: dict[str, _JobMemo] = {}
        self._config: SchedulerConfig | None = None  # the memos hold for this config only
        self._queues: dict[str, tuple[GPUQueueSpec, int, Queue]] = {}  # name -> (spec, recent, core)
        self._evicting: frozenset[str] = frozenset()
        self._quarantined: frozenset[str] = frozenset()
        self._gone: set[str] = set()  # jobs deleted since forget_missing last ran
        self._kept = _Kept()

    def _derive(self, job: JobEntry, spec: TrainingJobSpec) -> _Derived:
        # Most jobs share their workers' shape (JobEntry.shape): derived once per shape (rendering
        # a worker pod to read its requests was 40% of a first cycle at 15,000 jobs), and jobs of
        # one shape share the objects (the core's index keeps a Demand per WorkerSpec object).
        derived = self._shapes.get(job.shape)
        if derived is None:
            try:
                check_template(spec.workers.template)
                derived = worker_spec(job, spec), constraints(spec), None
            except (TemplateError, ValueError, KeyError, TypeError, AttributeError) as exc:
                derived = None, None, str(exc)
            if len(self._shapes) >= SHAPES:
                self._shapes.clear()
            self._shapes[job.shape] = derived
        return derived

    def close(self) -> None:
        """Stop collecting changed jobs and nodes (the builder's loop is over)."""
        if self._cache is not None:
            self._cache.unwatch_jobs(self._changed_jobs)
            self._cache.unwatch_nodes(self._touched_nodes)
            self._cache = None

    def _changed_since_last(
        self, cache: ClusterCache, inputs: _Inputs, evicting: frozenset[str], quarantined: frozenset[str]
    ) -> set[str] | None:
        """The jobs to derive again this build, or None for all of them (and every node)."""
        every = False
        if cache is not self._cache:
            self.close()
            self._cache = cache
            self._changed_jobs, self._touched_nodes = cache.watch_jobs(), cache.watch_nodes()
            every = True
        changed = set(self._changed_jobs)
        self._changed_jobs.clear()
        # Whether a job is evicting or quarantined is read by its own row only.
        changed |= (evicting ^ self._evicting) | (quarantined ^ self._quarantined)
        self._evicting, self._quarantined = evicting, quarantined
        if every or not inputs.same(self._inputs):
            self._inputs = inputs
            return None
        return changed

    def forget_missing(self, cache: ClusterCache) -> None:
        """Drop what was derived from jobs deleted since the last call."""
        for key in self._gone:
            if key not in cache.jobs:
                self._jobs.pop(key, None)
        self._gone.clear()

    def _memo(self, job: JobEntry, cache: ClusterCache, topo: Topology, evicting: bool) -> _JobMemo:
        assumed = cache.assumed.get(job.key)
        entry = cache.queues.get(job.spec.queue) if job.spec is not None else None
        # Its spec, not the entry: the entry is replaced by every status write (usage, each cycle),
        # and keying on it rebuilt every job of the queue every cycle (bench/kueue_perf.py); the
        # cache keeps an unchanged spec the same object.
        queue = (entry.spec, entry.error) if entry is not None else None
        labels = cache.namespaces.get(job.namespace)
        gang = unrecorded_gang(job, cache) if assumed is None else None
        waiting = _unclaimed(job, cache)
        m = self._jobs.get(job.key)
        if (
            m is None
            or m.entry is not job
            or m.assumed is not assumed
            or m.evicting != evicting
            or not _same_queue(m.queue, queue)
            or m.labels is not labels
            or m.gang != gang
            or m.waiting != waiting
        ):
            hold = holding(job, assumed, gang, evicting)
            derived = self._derive(job, job.spec) if job.spec is not None else None
            exclusion = (
                self._exclusion(job, entry, labels or {}, topo, derived[2]) if derived is not None else None
            )
            if exclusion is None and hold is None:
                exclusion = gang_shortfall(job, cache)
            m = _JobMemo(job, assumed, evicting, queue, labels, hold, exclusion, gang, waiting, derived)
            self._jobs[job.key] = m
        return m

    def _core_queues(self, cache: ClusterCache, recent: Mapping[str, int]) -> tuple[Queue, ...]:
        """Every valid queue as the core sees it, converted again only when its spec or its recent
        preemptions changed."""
        out = []
        for name, q in sorted(cache.queues.items()):
            if q.spec is None:
                continue
            count = recent.get(name, 0)
            m = self._queues.get(name)
            if m is None or m[0] is not q.spec or m[1] != count:
                m = self._queues[name] = (q.spec, count, with_recent_preemptions(q.spec.to_core(name), count))
            out.append(m[2])
        for name in [n for n in self._queues if n not in cache.queues]:
            del self._queues[name]
        return tuple(out)

    def build(
        self,
        cache: ClusterCache,
        now: float,
        config: SchedulerConfig,
        evicting: frozenset[str] = frozenset(),
        quarantined: Mapping[str, int] | None = None,
        recent_preemptions: Mapping[str, int] | None = None,
    ) -> View:
        """`evicting`: victims asked to checkpoint or being deleted (they still hold their nodes).
        `quarantined`: jobs the core failed on (gpuq.controller.quarantine), kept out."""
        if config is not self._config:
            self._config, self._jobs = config, {}
        topo = config.topology
        # Gangs of other owners may name a level by its node label (Kueue's topology annotations).
        cache.set_topology_labels(dict(zip(topo.labels, topo.levels, strict=True)))
        queues = self._core_queues(cache, recent_preemptions or {})
        inputs = _Inputs(
            config,
            tuple((name, q.spec, q.error) for name, q in sorted(cache.queues.items())),
            tuple(sorted(cache.namespaces.items(), key=lambda kv: kv[0])),
        )
        out = frozenset(quarantined or ())
        changed = self._changed_since_last(cache, inputs, evicting, out)
        base = self._kept.snapshot
        if changed is None:
            base, self._kept = None, _Kept()
            changed = set(cache.jobs)
            self._gone.update(key for key in self._jobs if key not in cache.jobs)
            self._touched_nodes.update(cache.nodes, cache.pods_by_node)
        k = self._kept
        self._gone |= {key for key in changed if key not in cache.jobs}
        for key in changed:
            self._first_half(key, cache, topo, key in evicting, key in out)
        if base is None:
            k.nodes.dirty_jobs.clear()  # every node is looked at: no need to find the placements' nodes
        node_delta, came_or_went = k.nodes.update(cache, self._touched_nodes, now, config)
        sized = k.nodes.sized()
        if sized != k.sized:
            changed |= k.candidates
            k.sized = sized
        while k.expiring and k.expiring[0][0] <= now:
            changed.add(heapq.heappop(k.expiring)[1])
        job_delta: list[Job] = []
        removed: list[str] = []
        for key in sorted(changed):  # in key order: new keys append to k.order
            self._second_half(key, cache, sized, now, job_delta, removed)
        snapshot = Snapshot(
            topology=topo,
            nodes=k.nodes.snapshot_nodes(),
            queues=queues,
            jobs=k.jobs_tuple(),
        )
        delta = None
        if base is not None and not came_or_went:
            delta = SnapshotDelta(tuple(node_delta), (), tuple(job_delta), tuple(sorted(removed)), base)
        k.snapshot = snapshot
        wake = _earliest([k.nodes.wake_at(), min(k.wakes.values(), default=None)])
        view = View(
            snapshot,
            k.shown("excluded"),
            k.shown("held"),
            wake,
            k.shown("stopping"),
            k.shown("blocked"),
            delta=delta,
            changed=frozenset(changed) if base is not None else None,
            suspects=tuple(k.nodes.suspects[n] for n in sorted(k.nodes.suspects)),
            scope_sizes=dict(k.nodes.sizes),
            tally=dict(k.counts),
        )
        if self.verify:
            self._verify(view, cache, now, config, evicting, quarantined, recent_preemptions)
        return view

    def tallied(self, key: str) -> tuple[str, str] | None:
        """The queue the last build counted the job in, and as what (View.tally); None: not counted."""
        return self._kept.tally.get(key)

    def _first_half(self, key: str, cache: ClusterCache, topo: Topology, evicting: bool, out: bool) -> None:
        """A job's row again, and what follows from it before the nodes are known."""
        k = self._kept
        job = cache.jobs.get(key)
        row = self._row(job, cache, topo, evicting, out) if job is not None else None
        candidate = row is not None and row.memo is not None and row.excluded is None
        if row is None:
            k.rows.pop(key, None)
        else:
            k.rows[key] = row
        k.put("excluded", key, row.excluded if row is not None and row.memo is not None else None)
        k.put("blocked", key, row.blocked if candidate and row is not None else None)
        hold = row.memo.hold if candidate and row is not None and row.memo is not None else None
        k.put(
            "stopping", key, row.stopping if hold is not None and row is not None and row.stopping else None
        )
        k.put("held", key, hold)
        placement = (
            ((job.uid, hold.attempt), hold.placement) if hold is not None and job is not None else None
        )
        k.nodes.hold(key, k.placements.get(key), placement)
        _put(k.placements, key, placement)
        if candidate:
            k.candidates.add(key)
        else:
            k.candidates.discard(key)

    def _second_half(
        self,
        key: str,
        cache: ClusterCache,
        sized: tuple[int, int, bool],
        now: float,
        delta: list[Job],
        removed: list[str],
    ) -> None:
        """A job's part after the nodes: too big for the cluster, or its core Job in the snapshot."""
        k = self._kept
        row = k.rows.get(key)
        job: Job | None = None
        if key in k.candidates and row is not None:
            if row.sized != sized or now >= row.until:
                self._size_row(cache.jobs[key], row, sized, now)
                if row.until != math.inf:
                    heapq.heappush(k.expiring, (row.until, key))
            k.put("excluded", key, row.too_big)
            if row.too_big is None:
                job = row.memo.job if row.memo is not None else None
            _put(k.wakes, key, row.wake if job is not None else None)
        else:
            k.wakes.pop(key, None)
        k.set_job(key, job, delta, removed)
        if job is not None:
            k.count(key, (job.queue, "running" if job.running is not None else "waiting"))
        elif key in k.excluded and (entry := cache.jobs.get(key)) is not None and entry.spec is not None:
            k.count(key, (entry.spec.queue, "excluded"))
        else:
            k.count(key, None)

    def _row(
        self, job: JobEntry, cache: ClusterCache, topo: Topology, evicting: bool, quarantined: bool
    ) -> _Row:
        """The first half of a job's part: whether it is kept out, holds a placement, must stop."""
        if job.status.phase in FINISHED_PHASES or job.ended is not None:
            return _Row(None)  # done, or its owner's controller ended it (its record follows)
        memo = self._memo(job, cache, topo, evicting)
        hold = memo.hold
        if job.deleting and hold is None:
            return _Row(None)
        if hold is not None and finished_gang(job, cache.pods_of(job.key, job.uid)):
            return _Row(None)  # done, its status not yet written: it holds nothing and waits for nothing
        if job.spec is None:
            reason: Exclusion | None = Exclusion(job.error_reason, job.error or "invalid spec")
        elif quarantined:
            reason = Exclusion(QUARANTINED, QUARANTINE_MESSAGE)
        else:
            reason = memo.exclusion
        blocked = None
        if reason is not None:
            if hold is None:
                return _Row(memo, excluded=reason)
            if not self._modelled_while_held(job, reason):
                return _Row(None)  # a held job we cannot model: its pods count as someone else's usage
            # Its queue is gone (or no longer admits it) while it runs: the core still sees it, so
            # a node failing under it fails it over (docs/api.md, "GPUQueue").
            blocked = reason
        spec = job.spec
        assert spec is not None  # a job without one has a reason above
        stop = _stop(job, memo.queue[0] if memo.queue is not None else None)
        if stop and hold is None:
            return _Row(memo, excluded=Exclusion(SUSPENDED, SUSPENDED_MESSAGE))
        stopping = stop if hold is not None and stop and job.status.phase in PLACED_PHASES else ""
        return _Row(memo, spec, blocked=blocked, stops=bool(stop), stopping=stopping)

    def _size_row(self, job: JobEntry, row: _Row, sized: tuple[int, int, bool], now: float) -> _Row:
        """The second half of a job's part, for a cluster of `sized` (total GPUs, largest node, any
        nodes) at `now`: too big for it, or its core Job (and when it changes by time alone)."""
        memo, spec = row.memo, row.spec
        assert memo is not None and spec is not None
        row.sized, row.until, row.too_big, row.wake = sized, math.inf, None, None
        hold = memo.hold
        total_gpus, largest, any_nodes = sized
        if hold is None and any_nodes:
            too_big = _too_big(spec, total_gpus, largest)
            if too_big:
                row.too_big = Exclusion(PendingCode.EXCEEDS_CAPACITY, too_big)
                return row
        not_before = job.facts.not_before
        if hold is None and not_before > now:
            row.wake = row.until = not_before
        # A held job with no start time in its status yet (an admission in flight) started when it
        # was assumed; only then does the fallback matter for the Job built.
        fallback = memo.assumed.started_at if memo.assumed is not None else now
        timeless = hold is not None and job.status.started_at is None and job.status.admitted_at is None
        if timeless and memo.assumed is None:
            row.until = now  # its Job reads the time: derived again every build
        args = (fallback if timeless else 0.0, not_before)
        if memo.job is None or memo.job_args != args:
            assert memo.derived is not None  # a job with a spec
            workers, cons, _ = memo.derived
            assert workers is not None and cons is not None  # _exclusion rejected bad templates
            memo.job = _job(job, spec, workers, cons, hold, fallback, not_before, memo.evicting, row.stops)
            memo.job_args = args
        return row

    def _modelled_while_held(self, job: JobEntry, why: Exclusion) -> bool:
        """Whether a job that holds a placement but would be kept out if it waited (its queue was
        deleted, turned invalid or no longer admits its namespace, a topology level is gone) can
        still be given to the core as running: its spec derives, and the core did not fail on it."""
        if job.spec is None or why.reason == QUARANTINED:
            return False
        return self._derive(job, job.spec)[2] is None

    def _exclusion(
        self,
        job: JobEntry,
        queue: QueueEntry | None,
        labels: Mapping[str, str],
        topo: Topology,
        template_error: str | None,
    ) -> Exclusion | None:
        """Why the job is kept out before placement is looked at: its queue (`queue`, its entry)
        and its namespace's `labels`, its topology level, its template (`template_error`: why its
        workers do not derive)."""
        spec = job.spec
        assert spec is not None
        if queue is None:
            return Exclusion(
                "QueueNotFound", f"GPUQueue {spec.queue!r} does not exist; the job waits until it does"
            )
        if queue.spec is None:
            return Exclusion("QueueInvalid", f"GPUQueue {spec.queue!r} is invalid: {queue.error}")
        if not selectors.matches(queue.spec.namespace_selector, labels):
            sel = queue.spec.namespace_selector
            assert sel is not None
            return Exclusion(
                "NamespaceNotAllowed",
                f"GPUQueue {spec.queue!r} admits only namespaces matching {selectors.describe(sel)}; "
                f"namespace {job.namespace!r} does not match",
            )
        level = spec.topology.level
        if level is not None and level not in topo.levels:
            return Exclusion(
                "UnknownTopologyLevel",
                f"topology level {level!r} is not configured; levels are {', '.join(topo.levels)}",
            )
        if template_error is not None:
            return Exclusion("InvalidPodTemplate", template_error)
        return None

    def foreign_gpus(self, cache: ClusterCache) -> Callable[[str], int]:
        """Other pods' GPUs on a node as the cache holds them now, by the rule the last snapshot
        summed them with (pods of the placements it held are gpuq's; see `foreign_usage`). Pods of
        a gang admitted since count twice, as reserved and as other pods, until the next snapshot:
        the safe side, and their bindings wake that cycle."""
        ours = self._kept.nodes.ours
        return lambda node: foreign_usage(cache.pods_by_node.get(node, {}).values(), ours).gpus

    def _verify(
        self,
        view: View,
        cache: ClusterCache,
        now: float,
        config: SchedulerConfig,
        evicting: frozenset[str],
        quarantined: Mapping[str, int] | None,
        recent: Mapping[str, int] | None,
    ) -> None:
        """GPUQ_VERIFY_SNAPSHOT: the kept build must be what a fresh builder makes of the cache now."""
        fresh_builder = SnapshotBuilder(verify=False)
        try:
            fresh = fresh_builder.build(cache, now, config, evicting, quarantined, recent)
        finally:
            fresh_builder.close()
        parts = ("snapshot", "excluded", "holding", "wake_at", "stopping", "blocked", "tally", "scope_sizes")
        for part in parts:
            if getattr(view, part) != getattr(fresh, part):
                raise AssertionError(f"kept snapshot build differs from a fresh one in {part}")
        if view.suspects != fresh.suspects:
            raise AssertionError("kept snapshot build differs from a fresh one in its suspect nodes")


def _too_big(spec: TrainingJobSpec, total_gpus: int, largest: int) -> str | None:
    w = spec.workers
    if w.gpus_per_worker > largest:
        return f"each worker needs {w.gpus_per_worker} GPUs but the largest node has {largest}"
    if w.replicas * w.gpus_per_worker > total_gpus:
        return f"the gang needs {w.replicas * w.gpus_per_worker} GPUs but the cluster has {total_gpus}"
    return None


def _job(
    job: JobEntry,
    spec: TrainingJobSpec,
    workers: WorkerSpec,
    cons: Constraints,
    hold: Holding | None,
    now: float,
    not_before: float,
    evicting: bool,
    stop: bool = False,
) -> Job:
    st, facts = job.status, job.facts
    return Job(
        key=job.key,
        queue=spec.queue,
        priority=spec.priority,
        created_at=job.created_at,
        workers=workers,
        topology=_topology_request(spec.topology.level, spec.topology.mode),
        # An admission whose status is not written yet (seconds old) is no victim: evicting it would
        # race its own status write (gpuq.controller.record).
        preemptible=spec.preemptible and not (hold is not None and hold.attempt > st.attempt),
        min_runtime_seconds=float(spec.min_runtime_seconds),
        checkpoint=facts.checkpoint,
        running=Running(hold.placement, facts.started_at or now) if hold else None,
        restart_count=st.restarts,
        constraints=cons,
        avoid_nodes=facts.avoid_nodes,
        previous_placement=facts.previous_placement,
        recovering=st.phase == Phase.RECOVERING and hold is None,
        not_before=not_before,
        evicting=evicting and hold is not None,
        stopping=stop and evicting and hold is not None,
        attained_gpu_seconds=st.attained_gpu_seconds,
        queued_since=facts.queued_since,
    )
