"""Parse the API objects the operator watches into small typed cache entries.

Parsing is pure and total: a malformed object becomes an entry with `error` set (reported as a
condition and an Event by the loop), never an exception in a watch handler.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from hashlib import blake2b
from operator import attrgetter
from sys import intern
from typing import Any, cast

import orjson
from pydantic import ValidationError

from gpuq.api import meta
from gpuq.api.gpuqueue import GPUQueueSpec, GPUQueueStatus
from gpuq.api.trainingjob import (
    CheckpointReport,
    PlacementEntry,
    TrainingJobSpec,
    TrainingJobStatus,
    Workers,
)
from gpuq.controller.resources import QuantityError, pod_requests, resources_from_list
from gpuq.controller.status import ADMITTED, condition
from gpuq.core.model import Checkpoint, Resources, Taint, TaintEffect

TERMINAL_POD_PHASES = ("Succeeded", "Failed")


def parse_time(value: Any) -> float | None:
    """RFC 3339 string (or epoch number) -> epoch seconds; None when absent or unparsable."""
    if value is None:
        return None
    if type(value) is datetime:  # the common case first: a parsed status time (a first cycle has 15,000)
        return value.timestamp()
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_checkpoint(raw: str | None) -> tuple[CheckpointReport | None, str | None]:
    """The gpuq.dev/checkpoint annotation: JSON {step, path, time}; time is RFC 3339 or epoch seconds."""
    if not raw:
        return None, None
    try:
        data = json.loads(raw)
        if isinstance(data, Mapping) and isinstance(data.get("time"), int | float):
            data = {**data, "time": datetime.fromtimestamp(data["time"], UTC)}
        return CheckpointReport.model_validate(data), None
    except json.JSONDecodeError as exc:
        return None, f"annotation {meta.ANNOTATION_CHECKPOINT} is not JSON: {exc.msg}"
    except ValidationError as exc:
        return None, f"annotation {meta.ANNOTATION_CHECKPOINT}: {meta.validation_text(exc)}"


def newer(a: CheckpointReport | None, b: CheckpointReport | None) -> CheckpointReport | None:
    """The later of two checkpoint reports (by time, then step)."""
    if a is None or b is None:
        return a or b
    return a if (a.time, a.step) >= (b.time, b.step) else b


@dataclass(slots=True)
class NodeEntry:
    name: str
    labels: dict[str, str]
    allocatable: Resources
    capacity_gpus: int = 0
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    not_ready_since: float | None = None  # when Ready last left True (or the node was created)
    deleting: bool = False
    error: str | None = None
    # NotReady transitions (lastTransitionTime) seen by this operator, oldest first: flap damping.
    not_ready_history: tuple[float, ...] = ()


@dataclass(slots=True)
class QueueEntry:
    name: str
    spec: GPUQueueSpec | None
    status: GPUQueueStatus
    generation: int = 0
    error: str | None = None
    uid: str = ""


@dataclass(slots=True)
class JobEntry:
    namespace: str
    name: str
    uid: str
    created_at: float
    spec: TrainingJobSpec | None
    status: TrainingJobStatus
    generation: int = 0
    error: str | None = None  # spec does not parse
    error_reason: str = "Invalid"  # the reason code of `error` (a gang's: why gpuq cannot run it)
    checkpoint: CheckpointReport | None = None  # from the job's own annotation
    checkpoint_error: str | None = None
    deleting: bool = False
    # The version this entry was read at: status writes computed from it are conditional on it.
    # Not compared: a new version alone changes nothing the scheduler looks at.
    resource_version: str = field(default="", compare=False)
    # None: a TrainingJob. Else the kind of the owner whose gang this is (gpuq.controller.gangs).
    source: str | None = None
    # Its owner is suspended by gpuq (how a gang of another owner is evicted): resumed once its
    # workers are gone, so its controller makes the pods of the next admission.
    parked: bool = False
    # Its owner's controller says it ended (Succeeded / Failed): it holds and waits for nothing.
    ended: str | None = None
    # "namespace/name", made once (a cycle asks for it many times a job).
    key: str = field(default="", compare=False)
    # What the scheduler reads of its status and its workers' shape, derived with the entry (from
    # the fields above) when a watch event brings it, not in a cycle: a new leader's first cycle
    # reads 15,000 jobs' at 10,000 nodes (docs/throughput.md, "Fifth round").
    facts: StatusFacts = field(init=False, compare=False, repr=False)
    shape: bytes = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.key = intern(f"{self.namespace}/{self.name}")  # the very string its pods' `job` is
        self.facts = status_facts(self)
        self.shape = workers_shape(self.spec.workers) if self.spec is not None else b""


def workers_shape(w: Workers) -> bytes:
    """A key equal for workers that derive the same requests and constraints (the snapshot builder
    derives once per shape): a digest of the JSON-shaped inputs serialized, so equal texts mean
    equal inputs (a different key order only misses). A digest, not the text: an entry keeps it,
    and 15,000 templates' texts were 60 MiB."""
    parts = (w.template, w.replicas, w.gpus_per_worker, w.gpu_models, w.mixed_models)
    try:
        text = orjson.dumps(parts)  # a fifth of repr's time
    except TypeError:  # not JSON-shaped (a template built in code): its repr, which is slower
        text = repr(parts).encode()
    return blake2b(text, digest_size=16).digest()


_RANK = attrgetter("rank")


def ranked_nodes(entries: Sequence[PlacementEntry]) -> tuple[str, ...]:
    """The nodes by rank. Ranks 0..n-1 once each (what gpuq writes) are put in place; anything else
    is sorted (stable), which gives the same for those and keeps any other order as it was."""
    nodes: list[str | None] = [None] * len(entries)
    for p in entries:
        r = p.rank
        if not 0 <= r < len(nodes) or nodes[r] is not None:
            return tuple([intern(p.node) for p in sorted(entries, key=_RANK)])
        nodes[r] = intern(p.node)  # the node's own name object: lookups by it compare identities
    return tuple(cast(list[str], nodes))  # every slot filled: ranks 0..n-1


@dataclass(frozen=True, slots=True)
class StatusFacts:
    """What the scheduler reads of a job's status and checkpoint annotation (JobEntry.facts)."""

    started_at: float | None  # status.startedAt, else admittedAt (the core's Running.started_at)
    not_before: float  # status.notBefore (0.0: none)
    placement: tuple[str, ...]  # status.placement's nodes by rank
    previous_placement: tuple[str, ...]
    checkpoint: Checkpoint | None  # the newer of status.lastCheckpoint and the annotation's
    avoid_nodes: frozenset[str]  # status.failedNodes
    queued_since: float  # see queued_since


_NO_NODES: frozenset[str] = frozenset()  # shared: an empty frozenset is 216 bytes, one per job


def status_facts(job: JobEntry) -> StatusFacts:
    st = job.status
    ckpt = newer(st.last_checkpoint, job.checkpoint)
    return StatusFacts(
        started_at=parse_time(st.started_at) or parse_time(st.admitted_at),
        not_before=parse_time(st.not_before) or 0.0,
        placement=ranked_nodes(st.placement),
        previous_placement=ranked_nodes(st.previous_placement),
        checkpoint=Checkpoint(ckpt.time.timestamp(), ckpt.step, ckpt.path) if ckpt else None,
        avoid_nodes=frozenset(st.failed_nodes) if st.failed_nodes else _NO_NODES,
        queued_since=queued_since(job),
    )


def queued_since(job: JobEntry) -> float:
    """When the job last entered its queue: its creation, or, once it has been admitted, the time it
    lost that admission (preempted, restarted, rolled back, refused by a kubelet), which is when its
    Admitted condition last turned False."""
    if job.status.attempt > 0:
        cond = condition(job.status.conditions, ADMITTED)
        if cond is not None and cond.status == meta.ConditionStatus.FALSE and cond.last_transition_time:
            return max(job.created_at, cond.last_transition_time.timestamp())
    return job.created_at


@dataclass(slots=True)
class PodEntry:
    """What the scheduler needs of a pod. The cache holds one per pod on a GPU node or of a gang
    (100,000 at 10,000 nodes), so it is slotted, its repeated strings are interned and its requests
    shared (parse_pod): docs/throughput.md has what one costs."""

    namespace: str
    name: str
    uid: str
    phase: str
    node_name: str | None
    scheduler_name: str
    requests: Resources
    deleting: bool = False
    job: str | None = None  # "namespace/name" of the owning TrainingJob (label gpuq.dev/job-name)
    owner_uid: str | None = None  # uid of that TrainingJob (an earlier job of the same name differs)
    attempt: int | None = None
    rank: int | None = None
    checkpoint: CheckpointReport | None = None
    checkpoint_requested: str | None = None
    created_by: str | None = None  # annotation gpuq.dev/created-by: the admission that created it
    reason: str = ""  # why it failed, for messages
    status_reason: str = ""  # status.reason as the kubelet set it (e.g. OutOfnvidia.com/gpu)
    created_at: float | None = None  # metadata.creationTimestamp (API-server clock, 1 s resolution)
    # "namespace/name", made once: the cache's tables share this one string.
    key: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        self.key = f"{self.namespace}/{self.name}"

    @property
    def live(self) -> bool:
        """Holds node resources: not finished (a deleting pod holds them until it is gone)."""
        return self.phase not in TERMINAL_POD_PHASES

    @property
    def unclaimed(self) -> bool:
        """Not bound and of no attempt: of a gang gpuq did not create, a pod its owner's controller
        made that waits for an admission to bind it (never stale, never a worker yet)."""
        return self.attempt is None and self.node_name is None


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    out = []
    for t in spec.get("taints") or []:
        try:
            effect = TaintEffect(t.get("effect", "NoSchedule"))
        except ValueError:
            continue  # an effect Kubernetes itself would reject; nothing to honour
        out.append(Taint(key=t.get("key", ""), value=t.get("value", "") or "", effect=effect))
    return tuple(out)


def _interned(labels: Mapping[str, Any]) -> dict[str, Any]:
    """Labels with their strings interned: 10,000 nodes share a few keys and values (racks, zones,
    models), one string each instead of one per node as a decoded list has them."""
    return {
        (intern(k) if type(k) is str else k): (intern(v) if type(v) is str else v) for k, v in labels.items()
    }


def parse_node(body: Mapping[str, Any]) -> NodeEntry:
    md, spec, status = _meta(body), body.get("spec") or {}, body.get("status") or {}
    ready_cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    ready = ready_cond is not None and ready_cond.get("status") == "True"
    since = None
    if not ready:
        since = parse_time((ready_cond or {}).get("lastTransitionTime")) or parse_time(
            md.get("creationTimestamp")
        )
    error = None
    try:
        allocatable = resources_from_list(status.get("allocatable"), "status.allocatable")
        capacity_gpus = resources_from_list(status.get("capacity"), "status.capacity").gpus
    except QuantityError as exc:
        allocatable, capacity_gpus, error = Resources(), 0, str(exc)
    return NodeEntry(
        name=intern(md["name"]),
        labels=_interned(md.get("labels") or {}),
        allocatable=allocatable,
        capacity_gpus=capacity_gpus,
        taints=_taints(spec),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        not_ready_since=since,
        deleting=md.get("deletionTimestamp") is not None,
        error=error,
    )


def parse_queue(body: Mapping[str, Any]) -> QueueEntry:
    md = _meta(body)
    try:
        status = GPUQueueStatus.model_validate(body.get("status") or {})
    except ValidationError:
        status = GPUQueueStatus()  # status is ours: a garbled one is rewritten, never fatal
    try:
        spec, error = GPUQueueSpec.model_validate(body.get("spec") or {}), None
    except ValidationError as exc:
        spec, error = None, f"invalid spec: {meta.validation_text(exc, 'spec')}"
    return QueueEntry(
        name=md["name"],
        spec=spec,
        status=status,
        generation=md.get("generation", 0),
        error=error,
        uid=md.get("uid", ""),
    )


def job_status(raw: Mapping[str, Any] | None) -> TrainingJobStatus:
    try:
        return TrainingJobStatus.model_validate(raw or {})
    except ValidationError:
        # Status is ours; if someone garbled it, start over from Queued rather than crash.
        return TrainingJobStatus()


def parse_job(body: Mapping[str, Any]) -> JobEntry:
    md = _meta(body)
    try:
        spec, error = TrainingJobSpec.model_validate(body.get("spec") or {}), None
    except ValidationError as exc:
        spec, error = None, f"invalid spec: {meta.validation_text(exc, 'spec')}"
    checkpoint, checkpoint_error = parse_checkpoint(
        (md.get("annotations") or {}).get(meta.ANNOTATION_CHECKPOINT)
    )
    return JobEntry(
        namespace=md["namespace"],
        name=md["name"],
        uid=md.get("uid", ""),
        created_at=parse_time(md.get("creationTimestamp")) or 0.0,
        spec=spec,
        status=job_status(body.get("status")),
        generation=md.get("generation", 0),
        error=error,
        checkpoint=checkpoint,
        checkpoint_error=checkpoint_error,
        deleting=md.get("deletionTimestamp") is not None,
        resource_version=str(md.get("resourceVersion") or ""),
    )


def _int_value(values: Mapping[str, str], key: str) -> int | None:
    try:
        return int(values[key])
    except (KeyError, ValueError):
        return None


def _failure_reason(status: Mapping[str, Any]) -> str:
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode", 0) != 0:
            return f"container {cs.get('name')} exited {term.get('exitCode')} ({term.get('reason', 'Error')})"
    return status.get("reason") or status.get("message") or ""


# Pods' requests by value: most pods ask for one of a few shapes, and each Resources with its
# `extra` dict costs ~160 bytes. Bounded, so a cluster of many shapes only shares the first ones.
_REQUESTS: dict[tuple[int, int, int, tuple[tuple[str, int], ...]], Resources] = {}
SHARED_REQUESTS = 4096


def _shared(r: Resources) -> Resources:
    """An equal Resources already held, if any (never mutated: the core's model is frozen)."""
    key = (r.gpus, r.cpu_millis, r.memory_bytes, tuple(sorted(r.extra.items())))
    shared = _REQUESTS.get(key)
    if shared is not None:
        return shared
    if len(_REQUESTS) < SHARED_REQUESTS:
        _REQUESTS[key] = r
    return r


def parse_pod(body: Mapping[str, Any]) -> PodEntry:
    md, spec, status = _meta(body), body.get("spec") or {}, body.get("status") or {}
    labels = dict(md.get("labels") or {})
    annotations = md.get("annotations") or {}
    job_name = labels.get(meta.LABEL_JOB_NAME)
    try:
        requests = pod_requests(spec)
    except QuantityError:
        requests = Resources()  # the API server validated it; unreachable in practice
    checkpoint, _ = (
        parse_checkpoint(annotations.get(meta.ANNOTATION_CHECKPOINT)) if job_name else (None, None)
    )
    node_name = spec.get("nodeName") or None
    return PodEntry(
        namespace=intern(md["namespace"]),
        name=md["name"],
        uid=md.get("uid", ""),
        phase=intern(status.get("phase", "Pending")),
        node_name=intern(node_name) if node_name else None,
        scheduler_name=intern(spec.get("schedulerName", "default-scheduler")),
        requests=_shared(requests),
        deleting=md.get("deletionTimestamp") is not None,
        job=intern(f"{md['namespace']}/{job_name}") if job_name else None,
        owner_uid=next(
            (o.get("uid") for o in md.get("ownerReferences") or [] if o.get("kind") == "TrainingJob"), None
        ),
        # A TrainingJob's pods carry their attempt as a label; pods gpuq binds for another owner get it
        # as an annotation with the binding (gpuq.controller.gangs).
        attempt=_int_value(labels if job_name else annotations, meta.LABEL_ATTEMPT),
        rank=_int_value(labels, meta.LABEL_RANK),
        checkpoint=checkpoint,
        checkpoint_requested=annotations.get(meta.ANNOTATION_CHECKPOINT_REQUESTED),
        created_by=annotations.get(meta.ANNOTATION_CREATED_BY),
        reason=_failure_reason(status) if status.get("phase") == "Failed" else "",
        status_reason=intern(str(status.get("reason") or "")),
        created_at=parse_time(md.get("creationTimestamp")),
    )
