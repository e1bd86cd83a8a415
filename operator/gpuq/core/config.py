"""Scheduler configuration (ConfigMap `gpuq-scheduler-config`, key `config.yaml`).

Every field has a default, so no config is needed to start. The operator and the simulator
read the same file through `gpuq.config` and pass the result here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuq.core.model import Topology


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """Communication cost weight of a rank pair whose two ranks are split at each level.

    A pair on one node costs 0; a pair split across nodes in one rack costs `node`; across racks in
    one block costs `rack`; across blocks in one zone `block`; across zones `zone`.
    """

    node: float = 1.0
    rack: float = 4.0
    block: float = 16.0
    zone: float = 64.0


@dataclass(frozen=True, slots=True)
class FailoverConfig:
    not_ready_grace_seconds: float = 10.0
    backoff_base_seconds: float = 5.0
    backoff_max_seconds: float = 300.0
    node_flap_window_seconds: float = 600.0
    node_flap_threshold: int = 3
    # Many nodes NotReady at once is a control-plane or network event, not that many node failures
    # (an API server freeze makes every lease look stale). While at least this fraction of the nodes
    # (of the cluster, or of one zone) and at least disruption_min_nodes are NotReady, NotReady alone
    # fails no gang, for up to disruption_max_seconds; then failover resumes (a real outage).
    disruption_fraction: float = 0.3
    disruption_min_nodes: int = 3
    disruption_max_seconds: float = 300.0
    # At least disruption_min_nodes NotReady but below the share: wait until no node turned NotReady
    # for this long before failing any of them over (the spread of a simultaneous heartbeat loss:
    # node lease renewal 10 s + node-monitor-period 5 s with Kubernetes' defaults).
    disruption_settle_seconds: float = 15.0


@dataclass(frozen=True, slots=True)
class ServiceOrdering:
    """Attained-service ordering within a queue (Tiresias' discretized LAS, docs/scheduling.md).

    A job's attained service is the GPU-time it has held running, over all its attempts. Its level is
    the number of thresholds it has reached. Within a queue and priority, lower levels go first (FIFO
    within a level), so a long-running job that was stopped waits behind new work of its queue. With
    `preempt`, a pending job may also evict running jobs of its own queue and priority at a higher
    level, once they ran `min_run_seconds` in their current attempt (this bounds the restart cost a
    job pays per level). `thresholds_gpu_hours=()` turns the rule off: plain FIFO.
    """

    thresholds_gpu_hours: tuple[float, ...] = (1.0, 100.0)
    preempt: bool = True
    min_run_seconds: float = 900.0
    # A multi-node gang is never evicted by attained service for a job that needs fewer GPUs: its
    # restart pays start-up on every node and rarely finds its racks again (docs/scheduling.md).
    spare_larger_gangs: bool = True
    # Derived once (__post_init__), not properties: read per running job and level check, 100,000
    # times in a first cycle at 10,000 nodes.
    thresholds_gpu_seconds: tuple[float, ...] = field(init=False, repr=False, compare=False)
    # Running jobs may become victims of their own queue's lower-level jobs.
    preempts: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "thresholds_gpu_seconds", tuple(3600.0 * t for t in self.thresholds_gpu_hours)
        )
        object.__setattr__(self, "preempts", self.preempt and bool(self.thresholds_gpu_hours))


@dataclass(frozen=True, slots=True)
class Consolidation:
    """Moving small gangs to make room for a starving one (KAI's consolidation; docs/scheduling.md).

    When a queue head at the first attained-service level that waited `min_wait_seconds` (and
    `starvation_seconds`) fits its quota and the free GPUs in number but not in shape (they are
    scattered over partly used nodes), running single-node gangs of no higher priority are stopped
    (asked to checkpoint) and restarted on other nodes' free GPUs, if every one of them fits there at
    once, so that whole nodes come free for the head in the smallest domain that could hold it. At most
    the head's GPUs and `max_moved_gpus` are moved for one head; a gang is moved only after it ran
    `service.min_run_seconds` in its current attempt (and its own minRuntimeSeconds), and never when it
    or its queue is not preemptible or its queue is out of preemptions.
    """

    enabled: bool = True
    max_moved_gpus: int = 32
    min_wait_seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    topology: Topology = field(default_factory=Topology)
    weights: ScoringWeights = field(default_factory=ScoringWeights)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    service: ServiceOrdering = field(default_factory=ServiceOrdering)
    consolidation: Consolidation = field(default_factory=Consolidation)
    # BestEffortFIFO: a head that has waited this long gets a reservation; later jobs may only
    # backfill around it (see docs/scheduling.md).
    starvation_seconds: float = 300.0
    # A gang with a Preferred (or no) topology request holds out this long, from when it entered its
    # queue, for a placement inside one domain of the deepest level that could hold it on an empty
    # cluster (one node, else one rack, ...), before it takes a wider one; 0 places it at once wherever
    # it fits best (docs/scheduling.md, "Locality wait"). Recovering gangs never wait. A day: a
    # preempted gang often waits hours behind newer work, and a shorter wait is over by its turn.
    locality_wait_seconds: float = 86400.0
    # Upper bound of admissions per cycle (keeps one cycle's write burst bounded).
    max_admissions_per_cycle: int = 10_000
    # Upper bound of preemption searches per cycle (each simulates evictions; keeps a cycle's latency
    # bounded when many high-priority jobs arrive at once). Later preemptors retry next cycle.
    max_preemption_searches_per_cycle: int = 16
    gpu_model_label: str = "nvidia.com/gpu.product"
    # The scheduler extender kube-scheduler calls (gpuq.controller.extender; docs/extender.md): only
    # the leader listens. 127.0.0.1 as in a scheduler config on the same host; 0.0.0.0 in a cluster.
    extender_enabled: bool = True
    extender_bind_address: str = "127.0.0.1"
    extender_port: int = 8888
