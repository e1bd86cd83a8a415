"""The scheduling core's input model: an immutable snapshot of nodes, queues and jobs.

Everything here is plain frozen data. The operator builds it from the API server's objects,
the simulator builds it from traces; `gpuq.core.schedule` reads it and returns decisions.
Time is a float of seconds (any epoch); the core never reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

GPU = "nvidia.com/gpu"
CPU = "cpu"
MEMORY = "memory"


class Health(StrEnum):
    HEALTHY = "Healthy"
    FAILED = "Failed"  # NotReady/Unknown past grace, deleted, NoExecute-tainted or bad GPUs
    CORDONED = "Cordoned"  # spec.unschedulable: keeps what runs there, receives nothing new


class QueueingStrategy(StrEnum):
    BEST_EFFORT_FIFO = "BestEffortFIFO"
    STRICT_FIFO = "StrictFIFO"


class WithinQueuePreemption(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"


class ReclaimPreemption(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class TopologyMode(StrEnum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource vector. GPUs, CPU (millicores) and memory (bytes) are first-class for speed;
    any other extended resource (ephemeral-storage, rdma/hca, ...) goes in `extra`."""

    gpus: int = 0
    cpu_millis: int = 0
    memory_bytes: int = 0
    extra: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty key with operator Exists tolerates everything
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: TaintEffect | None = None  # None matches every effect


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """All requirements of a term must hold (AND); a job's terms are ORed, as in Kubernetes. A term with
    neither expressions nor fields selects no node."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()  # on node labels
    match_fields: tuple[NodeSelectorRequirement, ...] = ()  # on node fields: only metadata.name exists


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    weight: int
    term: NodeSelectorTerm


@dataclass(frozen=True, slots=True)
class Topology:
    """Topology levels, outermost first, each read from a node label. The last level is the node."""

    levels: tuple[str, ...] = ("zone", "block", "rack", "node")
    labels: tuple[str, ...] = (
        "topology.kubernetes.io/zone",
        "gpuq.dev/block",
        "gpuq.dev/rack",
        "kubernetes.io/hostname",
    )


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    allocatable: Resources
    # One domain name per topology level (same length as Topology.levels; the last is the node name).
    path: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    health: Health = Health.HEALTHY
    taints: tuple[Taint, ...] = ()
    gpu_model: str | None = None
    # Resources requested by pods gpuq does not own (other schedulers): never touched, always counted.
    used_by_others: Resources = field(default_factory=Resources)
    # When the Ready condition turned False/Unknown (None while Ready). The core declares the node FAILED
    # once `now - not_ready_since >= config.failover.not_ready_grace_seconds`; before that the node only
    # stops receiving new work. The shell passes the condition's lastTransitionTime and needs no clock.
    not_ready_since: float | None = None
    # The last time a disruption held this NotReady node's failover (gpuq.core.failover, the shell
    # remembers it): its grace period counts from then, so when a disruption dissolves node by node,
    # the nodes still coming back get a whole grace period instead of failing over at once.
    disrupted_at: float | None = None
    # GPUs the device plugin reports healthy (None: all of allocatable). Fewer healthy GPUs than the GPUs
    # bound on the node fails every gang with a rank there; new work sees only the healthy ones.
    healthy_gpus: int | None = None
    # Flap damping (gpuq.core.failover.flap_damped_until): the node's Ready condition left True too often
    # lately. It receives no new work but keeps what runs there (unless it fails for real).
    flapping: bool = False


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    within_queue: WithinQueuePreemption = WithinQueuePreemption.LOWER_PRIORITY
    reclaim_within_cohort: ReclaimPreemption = ReclaimPreemption.ANY
    preemptible: bool = True  # False: the queue's jobs are never victims
    max_per_hour: int | None = None  # victims this queue may lose in any hour (None: no cap)
    recent: int = 0  # victims it lost in the last hour (the shell counts them)

    def budget(self) -> int | None:
        """Victims the queue may still lose now (None: unlimited)."""
        if not self.preemptible:
            return 0
        return None if self.max_per_hour is None else max(0, self.max_per_hour - self.recent)


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    nominal_gpus: int
    cohort: str | None = None
    borrowing_limit_gpus: int | None = None  # None: may borrow all the cohort lends
    lending_limit_gpus: int | None = None  # None: lends all of its unused nominal quota
    weight: float = 1.0
    strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    model_quotas: Mapping[str, int] = field(default_factory=dict)  # GPU model -> GPUs, on top of nominal
    # Admits nothing new while held (GPUQueue stopPolicy Hold/HoldAndDrain); what runs keeps running
    # and recovering jobs are still re-placed.
    held: bool = False


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    replicas: int
    gpus_per_worker: int
    cpu_millis: int = 0
    memory_bytes: int = 0
    extra: Mapping[str, int] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus_per_worker

    def per_worker(self) -> Resources:
        return Resources(self.gpus_per_worker, self.cpu_millis, self.memory_bytes, self.extra)


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    level: str | None = None  # None: no topology constraint (Preferred packing still applies)
    mode: TopologyMode = TopologyMode.PREFERRED


@dataclass(frozen=True, slots=True)
class Checkpoint:
    time: float
    step: int
    path: str


@dataclass(frozen=True, slots=True)
class Constraints:
    """Pod-level placement constraints gpuq must honor because it binds pods itself."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[NodeSelectorTerm, ...] = ()  # ORed; empty = no requirement
    preferred_terms: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    gpu_models: tuple[str, ...] = ()  # any of; empty = any model
    mixed_models: bool = False


@dataclass(frozen=True, slots=True)
class Running:
    """A job that holds resources: its placement (rank -> node name) and when it started."""

    placement: tuple[str, ...]
    started_at: float


@dataclass(frozen=True, slots=True)
class Job:
    key: str  # "namespace/name"
    queue: str
    priority: int
    created_at: float
    workers: WorkerSpec
    topology: TopologyRequest = field(default_factory=TopologyRequest)
    preemptible: bool = True
    min_runtime_seconds: float = 0.0
    checkpoint: Checkpoint | None = None
    running: Running | None = None
    restart_count: int = 0
    constraints: Constraints = field(default_factory=Constraints)
    # Nodes this job must avoid when re-placed (failed under it before); set by the failover path.
    avoid_nodes: frozenset[str] = frozenset()
    # Last placement before a failure/preemption: failover prefers its domain.
    previous_placement: tuple[str, ...] = ()
    # True while the job waits for re-placement after a failure: it goes ahead of new work and keeps quota.
    recovering: bool = False
    # Set when the job was evicted and must not be placed before this time (restart back-off).
    not_before: float = 0.0
    # A victim already asked to checkpoint / being deleted: it still holds its resources, is never chosen
    # as a victim again, and a preemptor entitled to its capacity waits for it instead of preempting more.
    evicting: bool = False
    # Evicting because it is being stopped (spec.suspend, a queue drain), not preempted: what the user
    # asked for, so never called off (scheduler: preemptions that buy nothing are).
    stopping: bool = False
    # GPU-seconds this job held running in its earlier attempts (the shell records them when an attempt
    # ends); the running attempt's share is added from running.started_at (gpuq.core.service).
    attained_gpu_seconds: float = 0.0
    # When it last entered its queue: its creation, or when it last lost an admission (preempted,
    # restarted); 0 means created_at. What it has waited for counts from here (locality_wait_seconds).
    queued_since: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    topology: Topology
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    jobs: tuple[Job, ...]  # pending and running jobs gpuq owns; finished jobs are not part of it
