"""Build the core's immutable `Snapshot` from the ClusterCache (pure: time is an argument).

Besides the snapshot it reports which jobs were kept out and why (unknown queue, namespace not
allowed, unknown topology level, bad pod template, bigger than the cluster), which jobs hold a
placement, and the next time something changes by itself (a NotReady grace period ending, a
restart back-off expiring) so the loop can sleep until then instead of polling.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuq.api.gpuqueue import GPUQueueSpec, StopPolicy
from gpuq.api.trainingjob import FINISHED_PHASES, PLACED_PHASES, Phase, PlacementEntry, TrainingJobSpec
from gpuq.controller import selectors
from gpuq.controller.cache import Assumed, ClusterCache
from gpuq.controller.nodehealth import OUT_OF_SERVICE_TAINT, damped_until
from gpuq.controller.objects import JobEntry, NodeEntry, newer, parse_time, queued_since
from gpuq.controller.pods import TemplateError, check_template, worker_pod
from gpuq.controller.preemption import STOP_DRAIN, STOP_SUSPEND
from gpuq.controller.quarantine import MESSAGE as QUARANTINE_MESSAGE
from gpuq.controller.record import created_gang, finished_gang
from gpuq.controller.resources import pod_requests
from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import PendingCode
from gpuq.core.model import (
    Checkpoint,
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
    TaintEffect,
    Toleration,
    Topology,
    TopologyRequest,
    WorkerSpec,
)


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


def with_recent_preemptions(queue: Queue, count: int) -> Queue:
    """The queue with the victims it lost in the last hour (its maxPreemptionsPerHour budget)."""
    if count == 0:
        return queue
    return replace(queue, preemption=replace(queue.preemption, recent=count))


def with_disrupted_at(view: View, memory: Mapping[str, float]) -> View:
    """The view with Node.disrupted_at set from the loop's memory (gpuq.core.failover)."""
    if not memory:
        return view
    nodes = tuple(
        replace(n, disrupted_at=memory[n.name]) if n.name in memory else n for n in view.snapshot.nodes
    )
    return replace(view, snapshot=replace(view.snapshot, nodes=nodes))


def _earliest(times: Iterable[float | None]) -> float | None:
    real = [t for t in times if t is not None]
    return min(real) if real else None


def node_path(name: str, labels: Mapping[str, str], topology: Topology) -> tuple[str, ...]:
    """Domain of each level; a missing label does not split its parent (the node inherits the
    parent's domain), so partially labelled clusters still get the levels they do label."""
    path: list[str] = []
    parent = ""
    for level_label in topology.labels[:-1]:
        parent = labels.get(level_label, parent)
        path.append(parent)
    return (*path, name)


def node_health(node: NodeEntry) -> Health:
    """What the shell knows for sure. NotReady (and the not-ready/unreachable taints that restate it)
    is passed on as `not_ready_since`: the core applies the failover grace period itself."""
    if node.deleting or any(
        t.effect == TaintEffect.NO_EXECUTE and t.key == OUT_OF_SERVICE_TAINT for t in node.taints
    ):
        return Health.FAILED
    if node.unschedulable:
        return Health.CORDONED
    return Health.HEALTHY


def grace_ends(node: NodeEntry, now: float, grace: float) -> float | None:
    """When a NotReady node's grace period ends (the loop wakes up then to fail it over)."""
    if node.ready or node.not_ready_since is None:
        return None
    end = node.not_ready_since + grace
    return end if end > now else None


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


def _ranked(entries: Iterable[PlacementEntry]) -> tuple[str, ...]:
    return tuple(p.node for p in sorted(entries, key=lambda p: p.rank))


def _stop(job: JobEntry, cache: ClusterCache) -> str:
    """Why the job must not hold GPUs though nobody preempts it ("" when it may)."""
    spec = job.spec
    if spec is None:
        return ""
    if spec.suspend:
        return STOP_SUSPEND
    queue = cache.queues.get(spec.queue)
    if queue is not None and queue.spec is not None and queue.spec.stop_policy is StopPolicy.HOLD_AND_DRAIN:
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


def holding(job: JobEntry, cache: ClusterCache, evicting: frozenset[str] = frozenset()) -> Holding | None:
    """The placement a job holds: an admission in flight (assumed), the one its status records, a
    gang created before its status (an operator stopped in between), or, for a preemption victim
    whose pods are still leaving, the one it had."""
    gpus = job.spec.workers.gpus_per_worker if job.spec is not None else 0
    assumed = cache.assumed.get(job.key)
    if assumed is not None:
        return Holding(assumed.attempt, assumed.placement, gpus)
    s = job.status
    if s.phase in PLACED_PHASES and s.placement:
        return Holding(s.attempt, _ranked(s.placement), gpus)
    gang = unrecorded_gang(job, cache)
    if gang is not None:
        return Holding(s.attempt + 1, gang, gpus)
    if job.key in evicting and s.phase in (Phase.PREEMPTED, Phase.SUSPENDED) and s.previous_placement:
        return Holding(s.attempt, _ranked(s.previous_placement), gpus)
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
    until: float = float("inf")
    too_big: Exclusion | None = None
    wake: float | None = None


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What every job's row reads besides its own objects: a change rebuilds all rows."""

    config: SchedulerConfig
    queues: tuple[tuple[str, GPUQueueSpec | None, str | None], ...]
    namespaces: tuple[tuple[str, Mapping[str, str]], ...]
    evicting: frozenset[str]
    quarantined: tuple[tuple[str, int], ...]

    def same(self, other: _Inputs | None) -> bool:
        """Equal, with specs and label maps compared by identity (the cache replaces what changes)."""
        return (
            other is not None
            and self.config is other.config
            and self.evicting == other.evicting
            and self.quarantined == other.quarantined
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
class _NodeMemo:
    entry: NodeEntry
    others: Resources
    flapping: bool
    node: Node


class SnapshotBuilder:
    """Turns the cache into a View. Per job and per node it keeps what it derived last time and
    reuses it (the very same object) while the inputs are unchanged: a cycle after a few watch
    events costs O(jobs + nodes) identity checks, and the core's kept index sees few deltas."""

    def __init__(self, verify: bool | None = None) -> None:
        # GPUQ_VERIFY_SNAPSHOT=1: every build also derives every job afresh and fails loudly where
        # a kept row differs (slow: for tests and debugging).
        self.verify = os.environ.get("GPUQ_VERIFY_SNAPSHOT") == "1" if verify is None else verify
        self._rows: dict[str, _Row] = {}
        self._inputs: _Inputs | None = None
        self._cache: ClusterCache | None = None
        self._changed_jobs: set[str] = set()  # filled by the cache (watch_jobs)
        self._derived: dict[str, tuple[int, str, WorkerSpec | None, Constraints | None, str | None]] = {}
        self._jobs: dict[str, _JobMemo] = {}
        self._nodes_memo: dict[str, _NodeMemo] = {}
        self._config: SchedulerConfig | None = None  # the memos hold for this config only
        self._others: dict[str, Resources] | None = None  # other pods' usage per node (kept)
        self._held: dict[str, Holding] = {}  # the placements `_others` was summed against

    def _derive(
        self, job: JobEntry, spec: TrainingJobSpec
    ) -> tuple[WorkerSpec | None, Constraints | None, str | None]:
        memo = self._derived.get(job.key)
        if memo is not None and memo[0] == job.generation and memo[1] == job.uid:
            return memo[2], memo[3], memo[4]
        try:
            check_template(spec.workers.template)
            workers, cons, err = worker_spec(job, spec), constraints(spec), None
        except (TemplateError, ValueError, KeyError, TypeError, AttributeError) as exc:
            workers, cons, err = None, None, str(exc)
        self._derived[job.key] = (job.generation, job.uid, workers, cons, err)
        return workers, cons, err

    def close(self) -> None:
        """Stop collecting changed jobs (the builder's loop is over)."""
        if self._cache is not None:
            self._cache.unwatch_jobs(self._changed_jobs)
            self._cache = None

    def _changed_since_last(self, cache: ClusterCache, inputs: _Inputs) -> set[str] | None:
        """The jobs to derive again this build, or None for all of them."""
        if cache is not self._cache:
            self.close()
            self._cache, self._changed_jobs = cache, cache.watch_jobs()
            self._inputs, self._rows = inputs, {}
            return None
        changed = set(self._changed_jobs)
        self._changed_jobs.clear()
        if not inputs.same(self._inputs):
            self._inputs = inputs
            return None
        return changed

    def forget_missing(self, cache: ClusterCache) -> None:
        for key in [k for k in self._derived if k not in cache.jobs]:
            del self._derived[key]
        for key in [k for k in self._jobs if k not in cache.jobs]:
            del self._jobs[key]
        for name in [n for n in self._nodes_memo if n not in cache.nodes]:
            del self._nodes_memo[name]

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
            hold = holding(job, cache, frozenset({job.key}) if evicting else frozenset())
            exclusion = self._exclusion(job, cache, topo) if job.spec is not None else None
            if exclusion is None and hold is None:
                exclusion = gang_shortfall(job, cache)
            m = _JobMemo(job, assumed, evicting, queue, labels, hold, exclusion, gang, waiting)
            self._jobs[job.key] = m
        return m

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
            self._config, self._jobs, self._nodes_memo = config, {}, {}
        topo = config.topology
        # Gangs of other owners may name a level by its node label (Kueue's topology annotations).
        cache.set_topology_labels(dict(zip(topo.labels, topo.levels, strict=True)))
        excluded: dict[str, Exclusion] = {}
        blocked: dict[str, Exclusion] = {}
        held: dict[str, Holding] = {}
        stopping: dict[str, str] = {}
        recent = recent_preemptions or {}
        queues = {
            name: with_recent_preemptions(q.spec.to_core(name), recent.get(name, 0))
            for name, q in sorted(cache.queues.items())
            if q.spec is not None
        }
        inputs = _Inputs(
            config,
            tuple((name, q.spec, q.error) for name, q in sorted(cache.queues.items())),
            tuple(sorted(cache.namespaces.items(), key=lambda kv: kv[0])),
            evicting,
            tuple(sorted((quarantined or {}).items())),
        )
        changed = self._changed_since_last(cache, inputs)
        rows = self._rows_for(cache, topo, evicting, quarantined or {}, changed)
        if self.verify and changed is not None:
            self._verify_rows(rows, self._rows_for(cache, topo, evicting, quarantined or {}, None))
        self._rows = rows
        # Pass 1: which jobs hold placements (they shape node usage and health).
        candidates: list[tuple[str, _Row]] = []
        for key, row in rows.items():
            if row.memo is None:
                continue
            if row.excluded is not None:
                excluded[key] = row.excluded
                continue
            if row.blocked is not None:
                blocked[key] = row.blocked
            candidates.append((key, row))
            hold = row.memo.hold
            if hold is not None:
                held[key] = hold
                if row.stopping:
                    stopping[key] = row.stopping

        nodes, wake_nodes = self._nodes(cache, now, config, held)
        capacity = [n for n in nodes if n.health != Health.FAILED]
        total_gpus = sum(n.allocatable.gpus for n in capacity)
        largest = max((n.allocatable.gpus for n in capacity), default=0)
        sized = (total_gpus, largest, bool(nodes))

        jobs: list[Job] = []
        wake_jobs: list[float | None] = []
        for key, row in candidates:
            if row.sized != sized or now >= row.until:
                self._size_row(cache.jobs[key], row, sized, now)
            elif self.verify:
                # On a copy whose Job is built afresh: the kept memo must not vouch for itself.
                fresh = replace(row, memo=replace(row.memo, job=None) if row.memo is not None else None)
                _verify_sized(key, row, self._size_row(cache.jobs[key], fresh, sized, now))
            if row.too_big is not None:
                excluded[key] = row.too_big
                continue
            if row.wake is not None:
                wake_jobs.append(row.wake)
            assert row.memo is not None and row.memo.job is not None
            jobs.append(row.memo.job)
        snapshot = Snapshot(
            topology=topo, nodes=tuple(nodes), queues=tuple(queues.values()), jobs=tuple(jobs)
        )
        return View(snapshot, excluded, held, _earliest([*wake_nodes, *wake_jobs]), stopping, blocked)

    def _rows_for(
        self,
        cache: ClusterCache,
        topo: Topology,
        evicting: frozenset[str],
        quarantined: Mapping[str, int],
        changed: set[str] | None,
    ) -> dict[str, _Row]:
        """Every job's row, in key order: the last build's where nothing it read changed."""
        rows: dict[str, _Row] = {}
        last = self._rows
        for key in sorted(cache.jobs):
            row = last.get(key) if changed is not None and key not in changed else None
            if row is None:
                row = self._row(cache.jobs[key], cache, topo, key in evicting, key in quarantined)
            rows[key] = row
        return rows

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
        stop = _stop(job, cache)
        if stop and hold is None:
            return _Row(memo, excluded=Exclusion(SUSPENDED, SUSPENDED_MESSAGE))
        stopping = stop if hold is not None and stop and job.status.phase in PLACED_PHASES else ""
        return _Row(memo, spec, blocked=blocked, stops=bool(stop), stopping=stopping)

    def _size_row(self, job: JobEntry, row: _Row, sized: tuple[int, int, bool], now: float) -> _Row:
        """The second half of a job's part, for a cluster of `sized` (total GPUs, largest node, any
        nodes) at `now`: too big for it, or its core Job (and when it changes by time alone)."""
        memo, spec = row.memo, row.spec
        assert memo is not None and spec is not None
        row.sized, row.until, row.too_big, row.wake = sized, float("inf"), None, None
        hold = memo.hold
        total_gpus, largest, any_nodes = sized
        if hold is None and any_nodes:
            too_big = _too_big(spec, total_gpus, largest)
            if too_big:
                row.too_big = Exclusion(PendingCode.EXCEEDS_CAPACITY, too_big)
                return row
        not_before = parse_time(job.status.not_before) or 0.0
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
            workers, cons, _ = self._derive(job, spec)
            assert workers is not None and cons is not None  # _exclusion rejected bad templates
            memo.job = _job(job, spec, workers, cons, hold, fallback, not_before, memo.evicting, row.stops)
            memo.job_args = args
        return row

    def _verify_rows(self, kept: Mapping[str, _Row], fresh: Mapping[str, _Row]) -> None:
        """GPUQ_VERIFY_SNAPSHOT: the rows kept from earlier builds must be what deriving gives now."""
        for key in kept.keys() | fresh.keys():
            a, b = kept.get(key), fresh.get(key)
            same = (
                a is not None
                and b is not None
                and (a.memo is None) == (b.memo is None)
                and (a.memo is None or b.memo is None or a.memo.hold == b.memo.hold)
                and (a.excluded, a.blocked, a.stops) == (b.excluded, b.blocked, b.stops)
                and a.stopping == b.stopping
            )
            if not same:
                raise AssertionError(f"snapshot row of {key} kept from an earlier build differs: {a} != {b}")

    def _modelled_while_held(self, job: JobEntry, why: Exclusion) -> bool:
        """Whether a job that holds a placement but would be kept out if it waited (its queue was
        deleted, turned invalid or no longer admits its namespace, a topology level is gone) can
        still be given to the core as running: its spec derives, and the core did not fail on it."""
        if job.spec is None or why.reason == QUARANTINED:
            return False
        return self._derive(job, job.spec)[2] is None

    def _exclusion(self, job: JobEntry, cache: ClusterCache, topo: Topology) -> Exclusion | None:
        spec = job.spec
        assert spec is not None
        queue = cache.queues.get(spec.queue)
        if queue is None:
            return Exclusion(
                "QueueNotFound", f"GPUQueue {spec.queue!r} does not exist; the job waits until it does"
            )
        if queue.spec is None:
            return Exclusion("QueueInvalid", f"GPUQueue {spec.queue!r} is invalid: {queue.error}")
        labels = cache.namespaces.get(job.namespace, {})
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
        _, _, err = self._derive(job, spec)
        if err is not None:
            return Exclusion("InvalidPodTemplate", err)
        return None

    def _others_by_node(self, cache: ClusterCache, held: Mapping[str, Holding]) -> dict[str, Resources]:
        """Other pods' usage per node, re-summed only on nodes whose bound pods changed or that hold
        pods of a job whose placement changed (which decides whether its pods count as ours)."""
        ours = _ours(cache, held)
        dirty = cache.take_touched_nodes()
        if self._others is None:
            self._others, dirty = {}, set(cache.pods_by_node)
        prev = self._held
        for key in prev.keys() | held.keys():
            if prev.get(key) != held.get(key):
                dirty.update(p.node_name for p in cache.pods_of(key) if p.node_name is not None)
        self._held = dict(held)
        for node in dirty:
            usage = _foreign_usage(cache, cache.pods_by_node.get(node, ()), ours)
            if usage == Resources():
                self._others.pop(node, None)
            else:
                self._others[node] = usage
        return self._others

    def foreign_gpus(self, cache: ClusterCache) -> Callable[[str], int]:
        """Other pods' GPUs on a node as the cache holds them now, by the rule the last snapshot
        summed them with (pods of the placements it held are gpuq's; see `_foreign_usage`). Pods of
        a gang admitted since count twice, as reserved and as other pods, until the next snapshot:
        the safe side, and their bindings wake that cycle."""
        ours = _ours(cache, self._held)
        return lambda node: _foreign_usage(cache, cache.pods_by_node.get(node, ()), ours).gpus

    def _nodes(
        self, cache: ClusterCache, now: float, config: SchedulerConfig, held: Mapping[str, Holding]
    ) -> tuple[list[Node], list[float | None]]:
        topo = config.topology
        others = self._others_by_node(cache, held)
        nodes: list[Node] = []
        wake: list[float | None] = []
        nothing = Resources()
        for name in sorted(cache.nodes):
            entry = cache.nodes[name]
            wake.append(grace_ends(entry, now, config.failover.not_ready_grace_seconds))
            damped = damped_until(entry, now, config.failover)
            wake.append(damped)
            used = others.get(name, nothing)
            m = self._nodes_memo.get(name)
            if m is None or m.entry is not entry or m.others != used or m.flapping != (damped is not None):
                # The device plugin lowers allocatable below capacity when GPUs turn unhealthy.
                lost_gpus = entry.capacity_gpus > entry.allocatable.gpus
                node = Node(
                    name=name,
                    allocatable=entry.allocatable,
                    path=node_path(name, entry.labels, topo),
                    labels=entry.labels,
                    health=node_health(entry),
                    taints=entry.taints,
                    gpu_model=entry.labels.get(config.gpu_model_label),
                    used_by_others=used,
                    not_ready_since=None if entry.ready else entry.not_ready_since,
                    healthy_gpus=entry.allocatable.gpus if lost_gpus else None,
                    flapping=damped is not None,
                )
                m = self._nodes_memo[name] = _NodeMemo(entry, used, damped is not None, node)
            nodes.append(m.node)
        # Nodes deleted under running jobs: keep them, failed, so the core plans the failover.
        gone = sorted({n for h in held.values() for n in h.placement} - cache.nodes.keys())
        for name in gone:
            nodes.append(
                Node(
                    name=name,
                    allocatable=Resources(),
                    path=(*[f"~{name}"] * (len(topo.levels) - 1), name),
                    health=Health.FAILED,
                )
            )
        return nodes, wake


def _ours(cache: ClusterCache, held: Mapping[str, Holding]) -> set[tuple[str, int]]:
    """(job uid, attempt) of each held placement: the pods gpuq counts through the placement."""
    return {(cache.jobs[key].uid, h.attempt) for key, h in held.items() if key in cache.jobs}


def _foreign_usage(cache: ClusterCache, pods: Iterable[str], ours: set[tuple[str, int]]) -> Resources:
    """The requests of these live bound pods (keys) that no held gpuq placement accounts for (other
    schedulers' pods, and ours of attempts no longer current). Plain ints: it runs per pod."""
    g = c = m = 0
    extra: dict[str, int] = {}
    for key in pods:
        pod = cache.pods.get(key)
        if pod is None or pod.node_name is None or not pod.live:
            continue
        if pod.owner_uid is not None and (pod.owner_uid, pod.attempt) in ours:
            continue  # counted through the job's placement
        r = pod.requests
        g, c, m = g + r.gpus, c + r.cpu_millis, m + r.memory_bytes
        for k, v in r.extra.items():
            extra[k] = extra.get(k, 0) + v
    return Resources(g, c, m, extra)


def _verify_sized(key: str, kept: _Row, fresh: _Row) -> None:
    """GPUQ_VERIFY_SNAPSHOT: a job's kept second half must be what deriving it gives now."""
    # Its Job counts only when it is in the snapshot (a job too big keeps an older, unused one).
    kept_job = kept.memo.job if kept.memo is not None and kept.too_big is None else None
    fresh_job = fresh.memo.job if fresh.memo is not None and fresh.too_big is None else None
    if (kept.too_big, kept.wake, kept_job) != (fresh.too_big, fresh.wake, fresh_job):
        raise AssertionError(f"snapshot row of {key} kept from an earlier build differs: {kept} != {fresh}")


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
    st = job.status
    ckpt = newer(st.last_checkpoint, job.checkpoint)
    started = parse_time(st.started_at) or parse_time(st.admitted_at) or now
    return Job(
        key=job.key,
        queue=spec.queue,
        priority=spec.priority,
        created_at=job.created_at,
        workers=workers,
        topology=TopologyRequest(spec.topology.level, spec.topology.mode),
        # An admission whose status is not written yet (seconds old) is no victim: evicting it would
        # race its own status write (gpuq.controller.record).
        preemptible=spec.preemptible and not (hold is not None and hold.attempt > st.attempt),
        min_runtime_seconds=float(spec.min_runtime_seconds),
        checkpoint=Checkpoint(ckpt.time.timestamp(), ckpt.step, ckpt.path) if ckpt else None,
        running=Running(hold.placement, started) if hold else None,
        restart_count=st.restarts,
        constraints=cons,
        avoid_nodes=frozenset(st.failed_nodes),
        previous_placement=_ranked(st.previous_placement),
        recovering=st.phase == Phase.RECOVERING and hold is None,
        not_before=not_before,
        evicting=evicting and hold is not None,
        stopping=stop and evicting and hold is not None,
        attained_gpu_seconds=st.attained_gpu_seconds,
        queued_since=queued_since(job),
    )
