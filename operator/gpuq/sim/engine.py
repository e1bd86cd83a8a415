"""The discrete-event loop: virtual time, trace arrivals, completions, node failures and repairs.

Each time something changes (jobs arrive or finish, a node fails or is repaired) the loop builds a
`Snapshot`, asks the policy for `Decisions` and carries them out, exactly as the operator's writer
would: restarts first, then preemptions, then admissions. If a cycle evicted anything, the policy is
asked again at the same instant so the freed GPUs are used at once (the operator's loop re-runs
when pods go away). Every admission is checked: a node over-committed, a failed node used, or a
job left running on a dead node is a `SimulationError` naming the policy, the job and the node.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import IntEnum
from operator import attrgetter
from typing import Any

from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Decisions
from gpuq.core.model import (
    Checkpoint,
    Constraints,
    Health,
    Job,
    Node,
    Queue,
    Running,
    Snapshot,
    WorkerSpec,
)
from gpuq.logs import get_logger
from gpuq.sim.metrics import JobOutcome, Recorder, fragmented_gpus
from gpuq.sim.policy import Delta, Policy
from gpuq.sim.speed import SpeedModel, Spread, spread
from gpuq.sim.trace import TraceJob

log = get_logger("gpuq.sim")
# A cycle that evicted something is re-run at the same instant, at most this often.
MAX_ROUNDS_PER_INSTANT = 4

_JOB_FIELDS = tuple(f.name for f in fields(Job))
_JOB_VALUES = attrgetter(*_JOB_FIELDS)
_CHECKPOINT_AT = _JOB_FIELDS.index("checkpoint")


def _with_checkpoint(job: Job, checkpoint: Checkpoint) -> Job:
    """`replace(job, checkpoint=checkpoint)`, without its per-call field walk (it runs for every
    periodic checkpoint of every running job)."""
    values = list(_JOB_VALUES(job))
    values[_CHECKPOINT_AT] = checkpoint
    return Job(*values)


class SimulationError(RuntimeError):
    """A policy decision that cannot be carried out (the message names policy, job and node)."""


class State(IntEnum):
    PENDING = 0  # waiting; may hold a partial gang (kube-default)
    RUNNING = 1
    DONE = 2
    STOPPING = 3  # a preemption victim saving its checkpoint: it still holds its GPUs


class Event(IntEnum):  # order of events at the same instant
    FINISH = 0
    REPAIR = 1
    FAIL = 2
    WAKE = 3  # a restart back-off expires
    STOPPED = 4  # a victim's checkpoint save is done: it lets go of its GPUs


@dataclass(frozen=True, slots=True)
class SimOptions:
    worker_gpus: str = "whole"  # "whole": one worker per node-sized chunk; "1": one worker per GPU
    speed: SpeedModel = field(default_factory=SpeedModel)
    mtbf_hours: float | None = None  # per node; None: no failures
    repair_hours: float = 2.0
    # Periodic checkpoints of every job, whatever the policy (None: none). A kill (failure, or a
    # preemption without a checkpoint request) loses the work since the last one.
    checkpoint_minutes: float | None = 30.0
    # A checkpoint taken on request (gpuq's preemption protocol): the victim keeps its GPUs this long,
    # then lets go with all its progress saved; longer than the grace, it is killed instead.
    checkpoint_save_seconds: float = 60.0
    checkpoint_grace_seconds: float = 60.0  # TrainingJob spec.checkpoint.gracePeriodSeconds default
    # Every restart of a gang (after a preemption or failure) holds its GPUs this long before it makes
    # progress again: pods start, ranks rendezvous, the checkpoint loads.
    restart_overhead_seconds: float = 120.0
    # Every start (first or not) holds the gang's GPUs this long before its pods run: the scheduler's
    # and the cluster's machinery, which a replay measures per scheduler (bench/replay.py). Counted
    # in the queueing delay, as a replay counts it; 0 (instant) everywhere else.
    start_latency_seconds: float = 0.0
    cycle_seconds: float = 0.0  # 0: decide at every event instant; >0: at most once per period
    large_job_gpus: int = 8
    seed: int = 0


# A trace job without cpu/memory requests asks, per GPU, for this share of a GPU node's cpu and
# memory per GPU (so GPUs, not cpu or memory, bind, as on real GPU nodes); the default scheduler
# scores cpu and memory only, so requests without them would leave it nothing to score.
REQUEST_SHARE_PER_GPU = 0.75


def requests_per_gpu(nodes: Sequence[Node]) -> tuple[int, int]:
    """(cpu millis, memory bytes) a trace job without requests asks for per GPU."""
    gpu_nodes = [n for n in nodes if n.allocatable.gpus > 0]
    if not gpu_nodes:
        return 0, 0
    node = max(gpu_nodes, key=lambda n: n.allocatable.gpus)
    a = node.allocatable
    return (
        int(a.cpu_millis * REQUEST_SHARE_PER_GPU / a.gpus),
        int(a.memory_bytes * REQUEST_SHARE_PER_GPU / a.gpus),
    )


def worker_spec(job: TraceJob, mode: str, node_gpus: int, per_gpu: tuple[int, int] = (0, 0)) -> WorkerSpec:
    """`whole`: the fewest workers, each the largest divisor of the job's GPUs that fits a node.
    A job without cpu/memory requests gets `per_gpu` for each of its GPUs."""
    if not job.cpu_millis and not job.memory_bytes and job.gpus:
        job = replace(job, cpu_millis=per_gpu[0] * job.gpus, memory_bytes=per_gpu[1] * job.gpus)
    if mode == "1":
        replicas, per_worker = job.gpus, 1
    elif mode == "whole":
        per_worker = max(d for d in range(1, min(job.gpus, node_gpus) + 1) if job.gpus % d == 0)
        replicas = job.gpus // per_worker
    else:
        raise ValueError(f"--worker-gpus must be 'whole' or '1', got {mode!r}")
    return WorkerSpec(replicas, per_worker, -(-job.cpu_millis // replicas), -(-job.memory_bytes // replicas))


@dataclass(slots=True)
class SimJob:
    trace: TraceJob
    workers: WorkerSpec
    constraints: Constraints
    state: State = State.PENDING
    placement: tuple[str, ...] = ()
    seg_start: float = 0.0
    overhead: float = 0.0  # seconds of the current segment before it makes progress (restart cost)
    slowdown: float = 1.0
    spread: Spread | None = None
    work_done: float = 0.0  # full-speed seconds saved (checkpointed) before the current segment
    first_start: float | None = None
    restarts: int = 0
    epoch: int = 0  # bumped on eviction: stale FINISH events are ignored
    avoid: frozenset[str] = frozenset()
    previous: tuple[str, ...] = ()
    recovering: bool = False
    checkpoint: Checkpoint | None = None
    not_before: float = 0.0
    attained: float = 0.0  # GPU-seconds held running in ended segments (attained service)
    queued_since: float = 0.0  # when its last segment ended (0: never ran)
    save_fits: bool = False  # the save ends within the grace (else the victim is killed at the deadline)
    stop_requested: float = 0.0  # when a victim was asked to checkpoint (State.STOPPING)

    @property
    def progress_start(self) -> float:
        return self.seg_start + self.overhead


def offered_load(jobs: Sequence[TraceJob], total_gpus: int) -> float:
    """GPU-time demanded per unit of cluster capacity over the arrival span."""
    if len(jobs) < 2 or total_gpus <= 0:
        return math.nan
    span = max(j.submit_time for j in jobs) - min(j.submit_time for j in jobs)
    return sum(j.gpus * j.duration for j in jobs) / (span * total_gpus) if span > 0 else math.inf


def rescale_arrivals(jobs: Sequence[TraceJob], total_gpus: int, target_load: float) -> list[TraceJob]:
    """Stretch or compress inter-arrival times so the offered load becomes `target_load`."""
    if target_load <= 0:
        raise ValueError(f"--target-load must be > 0, got {target_load}")
    load = offered_load(jobs, total_gpus)
    if not math.isfinite(load) or load <= 0:
        raise ValueError("--target-load needs at least two jobs submitted at different times")
    factor = load / target_load
    return [replace(j, submit_time=j.submit_time * factor) for j in jobs]


class Simulation:
    def __init__(
        self,
        jobs: Sequence[TraceJob],
        nodes: Sequence[Node],
        queues: Sequence[Queue],
        config: SchedulerConfig,
        policy: Policy,
        options: SimOptions | None = None,
        on_finish: Callable[[int], None] | None = None,
    ) -> None:
        self.options = options or SimOptions()
        self.config = config
        self.policy = policy
        self.queues = tuple(queues)
        self.nodes: dict[str, Node] = {}
        for node in nodes:
            if node.name in self.nodes:
                raise ValueError(f"duplicate node name {node.name!r}")
            self.nodes[node.name] = node
        self.node_tuple = tuple(self.nodes.values())
        self.paths = {name: node.path for name, node in self.nodes.items()}
        # Free resources per node, kept by the loop itself to check every decision.
        self.free = {
            name: [
                n.allocatable.gpus - n.used_by_others.gpus,
                n.allocatable.cpu_millis - n.used_by_others.cpu_millis,
                n.allocatable.memory_bytes - n.used_by_others.memory_bytes,
            ]
            for name, n in self.nodes.items()
        }
        self.max_node_gpus = max((n.allocatable.gpus for n in self.node_tuple), default=0)
        self.total_gpus = sum(n.allocatable.gpus for n in self.node_tuple)
        self.free_hist = [0] * (self.max_node_gpus + 1)  # healthy nodes by free GPUs
        for name in self.nodes:
            self.free_hist[self.free[name][0]] += 1
        queue_names = {q.name for q in self.queues}
        self.jobs: dict[str, SimJob] = {}
        per_gpu = requests_per_gpu(self.node_tuple)
        for tj in sorted(jobs, key=lambda j: j.submit_time):
            if tj.key in self.jobs:
                raise ValueError(f"duplicate job name {tj.key!r} in the trace")
            if tj.queue not in queue_names:
                raise ValueError(
                    f"job {tj.key} names queue {tj.queue!r}, which is not among the queues "
                    f"({', '.join(sorted(queue_names))})"
                )
            self.jobs[tj.key] = SimJob(
                tj,
                worker_spec(tj, self.options.worker_gpus, self.max_node_gpus, per_gpu),
                Constraints(gpu_models=tj.gpu_models),
            )
        self.arrivals = list(self.jobs.values())
        self.next_arrival = 0
        self.active: dict[str, Job] = {}  # pending and running jobs, as the core sees them
        self.pending_shapes: Counter[tuple[int, int]] = Counter()  # (workers still needed, GPUs each)
        self.allocated = 0
        self.busy = 0
        self.running: dict[str, None] = {}  # keys of running gangs, in start order (an ordered set)
        self.checkpoints_due: list[tuple[float, int, str]] = []  # (time, epoch, job) of the next one
        self.events: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.rng = random.Random(self.options.seed)
        self.failed: set[str] = set()
        self.recorder = Recorder(self.total_gpus, config.weights, self.options.large_job_gpus)
        self.cycles = 0
        self.timers: set[float] = set()  # instants of the policy's pending timers (_set_timer)
        self.schedule_seconds = 0.0
        self.on_finish = on_finish
        self.finished = 0
        self.dirty = False  # something changed since the last cycle
        self.delta = Delta()  # changes since the policy's last call

    # ---- event queue -------------------------------------------------------------------------
    def _push(self, t: float, kind: Event, key: str, epoch: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, int(kind), self.seq, key, epoch))

    def run(self) -> dict[str, Any]:
        wall = time.perf_counter()
        if self.options.mtbf_hours:
            for name in self.nodes:
                self._push(self.rng.expovariate(1.0 / (self.options.mtbf_hours * 3600)), Event.FAIL, name)
        cycle = self.options.cycle_seconds
        while True:
            t = min(self._next_arrival_time(), self.events[0][0] if self.events else math.inf)
            if t == math.inf or self.finished == len(self.jobs) or self._stalled():
                break
            tick = math.ceil(t / cycle) * cycle if cycle > 0 else t
            self._process_until(tick)
            if self.dirty:
                self._cycle(tick)
        summary = self.recorder.summary(len(self.jobs))
        summary["policy"] = self.policy.name
        summary["sim"] = {
            "cycles": self.cycles,
            "schedule_seconds": self.schedule_seconds,
            "wall_seconds": time.perf_counter() - wall,
            "cluster_gpus": self.total_gpus,
            "nodes": len(self.nodes),
            "worker_gpus": self.options.worker_gpus,
        }
        return summary

    def _next_arrival_time(self) -> float:
        if self.next_arrival < len(self.arrivals):
            return self.arrivals[self.next_arrival].trace.submit_time
        return math.inf

    def _process_until(self, tick: float) -> None:
        """Apply every arrival and event due by `tick`, in time order (events first on ties)."""
        while True:
            t_arrival = self._next_arrival_time()
            t_event = self.events[0][0] if self.events else math.inf
            if min(t_arrival, t_event) > tick:
                return
            if t_event <= t_arrival:
                self._handle(*heapq.heappop(self.events))
            else:
                self._arrive(self.arrivals[self.next_arrival], t_arrival)
                self.next_arrival += 1

    def _stalled(self) -> bool:
        """Nothing can change any more: no arrivals left, nothing running, no node to be repaired."""
        return (
            self.next_arrival >= len(self.arrivals)
            and self.busy == 0
            and not self.failed
            and all(kind == Event.FAIL for _, kind, _, _, _ in self.events)
        )

    def _handle(self, t: float, kind: int, _seq: int, key: str, epoch: int) -> None:
        self.recorder.advance(t)
        if kind == Event.FINISH:
            job = self.jobs[key]
            if job.epoch == epoch and job.state in (State.RUNNING, State.STOPPING):
                self._finish(job, t)  # a victim that finishes while it saves just finishes
        elif kind == Event.STOPPED:
            job = self.jobs[key]
            # A victim whose save failed (its node died) leaves at its grace deadline, not before;
            # one whose preemption was called off and decided again waits for its new save.
            waits = t < job.stop_requested + min(
                self.options.checkpoint_save_seconds, self.options.checkpoint_grace_seconds
            ) or (not job.save_fits and t < self._stop_deadline(job))
            if job.epoch == epoch and job.state is State.STOPPING and not waits:
                self._evict(job, t)
                self._sync(job)
                self.dirty = True
        elif kind == Event.FAIL:
            self._set_health(key, Health.FAILED)
            self._push(t + self.options.repair_hours * 3600, Event.REPAIR, key)
        elif kind == Event.WAKE:
            self.timers.discard(t)
            self.dirty = True
        else:
            self._set_health(key, Health.HEALTHY)
            if self.options.mtbf_hours:
                self._push(t + self.rng.expovariate(1.0 / (self.options.mtbf_hours * 3600)), Event.FAIL, key)

    def _arrive(self, job: SimJob, t: float) -> None:
        self.recorder.advance(t)
        self._activate(job)
        self.dirty = True

    # ---- the scheduling cycle ----------------------------------------------------------------
    def _cycle(self, now: float) -> None:
        if self.options.checkpoint_minutes:
            self._refresh_checkpoints(now)
        for _ in range(MAX_ROUNDS_PER_INSTANT):
            snapshot = Snapshot(
                self.config.topology, self.node_tuple, self.queues, tuple(self.active.values())
            )
            started = time.perf_counter()
            decisions = self.policy.schedule(snapshot, now, self.config, self.delta)
            self.delta.clear()
            self.schedule_seconds += time.perf_counter() - started
            self.cycles += 1
            self._apply(decisions, now)
            if self.policy.timers and decisions.wake_at is not None and decisions.wake_at > now:
                self._set_timer(decisions.wake_at)
            if not (decisions.preempt or decisions.restart) or self._pending_count() == 0:
                break
        if self.failed:
            self._check_no_job_on_failed_nodes()
        self._record(now)
        self.dirty = False

    def _set_timer(self, at: float) -> None:
        """A cycle at `at` (the policy's timer); one pending wake-up per instant is enough."""
        if at not in self.timers:
            self.timers.add(at)
            self._push(at, Event.WAKE, "")

    def _pending_count(self) -> int:
        return sum(self.pending_shapes.values())

    def _apply(self, decisions: Decisions, now: float) -> None:
        for restart in decisions.restart:
            job = self._active_job(restart.job, "restart")
            self._evict(job, now)
            job.restarts += 1
            job.recovering = True
            job.avoid = job.avoid | frozenset(restart.failed_nodes)
            job.not_before = restart.not_before
            if restart.not_before > now:
                self._push(restart.not_before, Event.WAKE, job.trace.key)
            self.recorder.restarts += 1
            self._sync(job)
        for preempt in decisions.preempt:
            job = self._active_job(preempt.victim, "preempt")
            if not job.placement or job.state is State.STOPPING:
                raise SimulationError(
                    f"{self.policy.name}: preempted {job.trace.key}, which holds no GPUs or already stops"
                )
            self.recorder.preemptions += 1
            if self.policy.checkpoint_on_preempt and job.state is State.RUNNING:
                self._request_checkpoint(job, now)
            else:
                self._evict(job, now)
            self._sync(job)
        for call_off in decisions.abandon:  # a victim saving its checkpoint keeps running
            job = self._active_job(call_off.victim, "call off the preemption of")
            if job.state is State.STOPPING:
                job.state = State.RUNNING
                self.recorder.preemptions -= 1
                self._sync(job)
        for admit in decisions.admit:
            self._bind(self._active_job(admit.job, "admit"), admit.placement, now)

    def _active_job(self, key: str, what: str) -> SimJob:
        job = self.jobs.get(key)
        if job is None or job.state is State.DONE or key not in self.active:
            raise SimulationError(f"{self.policy.name}: {what} of unknown or finished job {key!r}")
        return job

    # ---- state transitions -------------------------------------------------------------------
    def _activate(self, job: SimJob) -> None:
        self.pending_shapes[(job.workers.replicas, job.workers.gpus_per_worker)] += 1
        self._sync(job)

    def _sync(self, job: SimJob) -> None:
        """Rebuild the core's view of one job after it changed."""
        t = job.trace
        self.active[t.key] = self.delta.jobs[t.key] = Job(
            key=t.key,
            queue=t.queue,
            priority=t.priority,
            created_at=t.submit_time,
            workers=job.workers,
            checkpoint=job.checkpoint,
            running=Running(job.placement, job.seg_start) if job.placement else None,
            restart_count=job.restarts,
            constraints=job.constraints,
            avoid_nodes=job.avoid,
            previous_placement=job.previous,
            recovering=job.recovering,
            not_before=job.not_before,
            evicting=job.state is State.STOPPING,
            attained_gpu_seconds=job.attained,
            queued_since=job.queued_since,
        )

    def _take(self, name: str, w: WorkerSpec, sign: int) -> None:
        slot = self.free[name]
        healthy = name not in self.failed
        if healthy:
            self.free_hist[slot[0]] -= 1
        slot[0] -= sign * w.gpus_per_worker
        slot[1] -= sign * w.cpu_millis
        slot[2] -= sign * w.memory_bytes
        if healthy:
            self.free_hist[slot[0]] += 1
        self.allocated += sign * w.gpus_per_worker

    def _bind(self, job: SimJob, placement: tuple[str, ...], now: float) -> None:
        w = job.workers
        old = job.placement
        if job.state is State.RUNNING or placement[: len(old)] != old or len(placement) > w.replicas:
            raise SimulationError(
                f"{self.policy.name}: admitted {job.trace.key} with placement {placement} "
                f"(it holds {old}, needs {w.replicas} workers)"
            )
        if len(placement) == len(old):
            return
        for name in placement[len(old) :]:
            node = self.nodes.get(name)
            if node is None or name in self.failed or node.health is not Health.HEALTHY:
                raise SimulationError(f"{self.policy.name}: placed {job.trace.key} on unusable node {name!r}")
            slot = self.free[name]
            if slot[0] < w.gpus_per_worker or slot[1] < w.cpu_millis or slot[2] < w.memory_bytes:
                raise SimulationError(
                    f"{self.policy.name}: node {name} over-committed by {job.trace.key} "
                    f"(free {slot[0]} GPUs/{slot[1]}m CPU, worker needs {w.gpus_per_worker}/{w.cpu_millis}m)"
                )
            self._take(name, w, +1)
        shape_before = (w.replicas - len(old), w.gpus_per_worker)
        self.pending_shapes[shape_before] -= 1
        if not self.pending_shapes[shape_before]:
            del self.pending_shapes[shape_before]
        job.placement = placement
        if len(placement) < w.replicas:  # a partial gang holds its GPUs and waits
            job.seg_start = now
            self.pending_shapes[(w.replicas - len(placement), w.gpus_per_worker)] += 1
        else:
            self._start(job, now)
        self._sync(job)

    def _start(self, job: SimJob, now: float) -> None:
        job.state = State.RUNNING
        job.seg_start = now
        job.recovering = False
        latency = self.options.start_latency_seconds
        if job.first_start is None:
            job.first_start = now + latency
        job.spread = spread(job.placement, job.workers.gpus_per_worker, self.paths)
        job.slowdown = self.options.speed.slowdown(job.spread.crossed)
        self.busy += job.trace.gpus
        self.running[job.trace.key] = None
        # A gang that ran before (preempted or failed) pays the restart overhead before progress,
        # and every start the start latency.
        job.overhead = (self.options.restart_overhead_seconds if job.epoch > 0 else 0.0) + latency
        if self.options.checkpoint_minutes:
            first = job.progress_start + self.options.checkpoint_minutes * 60
            heapq.heappush(self.checkpoints_due, (first, job.epoch, job.trace.key))
        remaining = max(job.trace.duration - job.work_done, 0.0)
        self._push(now + job.overhead + remaining * job.slowdown, Event.FINISH, job.trace.key, job.epoch)

    def _release(self, job: SimJob, now: float) -> None:
        for name in job.placement:
            self._take(name, job.workers, -1)
        if job.state in (State.RUNNING, State.STOPPING):
            job.attained += job.trace.gpus * (now - job.seg_start)
            job.queued_since = now
            self.busy -= job.trace.gpus
            del self.running[job.trace.key]
            if job.spread is not None:
                self.recorder.segment(job.spread, job.seg_start, now)
        job.previous = job.placement
        job.placement = ()

    def _request_checkpoint(self, job: SimJob, now: float) -> None:
        """gpuq's protocol: the victim saves, holding its GPUs, then lets go with its progress kept.
        A save longer than the grace is cut short: the victim is killed at the deadline."""
        job.state = State.STOPPING
        job.stop_requested = now
        save, grace = self.options.checkpoint_save_seconds, self.options.checkpoint_grace_seconds
        job.save_fits = save <= grace
        self._push(now + min(save, grace), Event.STOPPED, job.trace.key, job.epoch)

    def _stop_deadline(self, job: SimJob) -> float:
        return job.stop_requested + self.options.checkpoint_grace_seconds

    def _evict(self, job: SimJob, now: float) -> None:
        """Stop a job; a victim whose requested save finished keeps its work up to the request, any
        other job up to its last periodic checkpoint; the rest of the segment's GPU-time is lost."""
        w = job.workers
        if job.state in (State.RUNNING, State.STOPPING):
            saved_at = job.stop_requested if job.state is State.STOPPING and job.save_fits else None
            if saved_at is not None:
                progress = max(0.0, saved_at - job.progress_start)
            else:
                progress = self._checkpointed_wall(max(0.0, now - job.progress_start))
            job.work_done = min(job.trace.duration, job.work_done + progress / job.slowdown)
            self.recorder.productive_gpu_seconds += job.trace.gpus * progress
            saving = now - saved_at if saved_at is not None else 0.0
            self.recorder.lost_gpu_seconds += job.trace.gpus * max(
                0.0, now - job.progress_start - progress - saving
            )
            self.recorder.overhead_gpu_seconds += job.trace.gpus * (
                min(job.overhead, now - job.seg_start) + saving
            )
            job.checkpoint = Checkpoint(
                job.progress_start + progress, int(job.work_done), f"sim://{job.trace.key}"
            )
            job.epoch += 1
            self.pending_shapes[(w.replicas, w.gpus_per_worker)] += 1
        elif job.placement:  # partial gang: pods never ran
            held = (w.replicas - len(job.placement), w.gpus_per_worker)
            self.pending_shapes[held] -= 1
            if not self.pending_shapes[held]:
                del self.pending_shapes[held]
            self.pending_shapes[(w.replicas, w.gpus_per_worker)] += 1
        self._release(job, now)
        job.state = State.PENDING

    def _checkpointed_wall(self, elapsed: float) -> float:
        interval = (self.options.checkpoint_minutes or 0) * 60
        return math.floor(elapsed / interval) * interval if interval > 0 else 0.0

    def _refresh_checkpoints(self, now: float) -> None:
        """Periodic checkpoints due by now, shown to the core (it weighs victims by work lost since
        one). A heap of due times keeps this O(checkpoints taken), not O(running jobs) per cycle."""
        interval = (self.options.checkpoint_minutes or 0) * 60
        due = self.checkpoints_due
        while due and due[0][0] <= now:
            t, epoch, key = heapq.heappop(due)
            job = self.jobs[key]
            if job.state not in (State.RUNNING, State.STOPPING) or job.epoch != epoch:
                continue  # evicted or finished since: its next attempt has its own schedule
            # The latest checkpoint by now; at least the one due at t (floor() of a float division
            # can land one interval short of it, which would schedule t again: an endless loop).
            saved = max(self._checkpointed_wall(max(0.0, now - job.progress_start)), t - job.progress_start)
            step = int(job.work_done + saved / job.slowdown)
            job.checkpoint = Checkpoint(job.progress_start + saved, step, f"sim://{key}")
            self.active[key] = self.delta.jobs[key] = _with_checkpoint(self.active[key], job.checkpoint)
            heapq.heappush(due, (max(job.progress_start + saved, t) + interval, epoch, key))

    def _finish(self, job: SimJob, now: float) -> None:
        self.recorder.overhead_gpu_seconds += job.trace.gpus * job.overhead
        self.recorder.productive_gpu_seconds += job.trace.gpus * max(0.0, now - job.progress_start)
        self._release(job, now)
        job.state = State.DONE
        del self.active[job.trace.key]
        self.delta.removed_jobs.add(job.trace.key)
        t = job.trace
        assert job.first_start is not None
        self.recorder.finished(
            JobOutcome(t.key, t.queue, t.gpus, t.duration, t.submit_time, job.first_start, now)
        )
        self.finished += 1
        self.dirty = True
        if self.on_finish is not None:
            self.on_finish(self.finished)

    def _set_health(self, name: str, health: Health) -> None:
        node = self.nodes[name]
        if node.health is health:
            return
        free_gpus = self.free[name][0]
        if health is Health.FAILED:
            self._fail_saves_on(name)
            self.failed.add(name)
            self.free_hist[free_gpus] -= 1
            log.debug("node failed", node=name)
        else:
            self.failed.discard(name)
            self.free_hist[free_gpus] += 1
        self.nodes[name] = self.delta.nodes[name] = replace(node, health=health)
        self.dirty = True
        self.node_tuple = tuple(self.nodes.values())

    def _fail_saves_on(self, name: str) -> None:
        """A victim saving its checkpoint on a node that dies cannot finish the save: like the
        operator, which waits for a report until the grace deadline, it is killed then and keeps
        only its periodic checkpoint."""
        for key in self.running:
            job = self.jobs[key]
            if job.state is State.STOPPING and job.save_fits and name in job.placement:
                job.save_fits = False
                self._push(self._stop_deadline(job), Event.STOPPED, key, job.epoch)

    def _check_no_job_on_failed_nodes(self) -> None:
        for key in self.active:
            job = self.jobs[key]
            if job.state is State.STOPPING:
                continue  # a victim keeps a dead node until its grace deadline (gpuq.core.failover)
            bad = self.failed.intersection(job.placement)
            if bad:
                raise SimulationError(
                    f"{self.policy.name}: job {key} still holds failed node {sorted(bad)[0]} after a cycle "
                    "(a failed node must restart every gang on it)"
                )

    # ---- metrics -----------------------------------------------------------------------------
    def _record(self, now: float) -> None:
        pending = self._pending_count()
        self.recorder.set_levels(
            now, self.allocated, self.busy, self._fragmented() if pending else 0, pending
        )

    def _fragmented(self) -> int:
        return fragmented_gpus(self.free_hist, self.pending_shapes)
