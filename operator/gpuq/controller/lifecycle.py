"""Per-job state transitions driven by what the pods report (pure: time is an argument).

The core decides admissions, preemptions and failovers; this module decides what follows from
pod phases and the job's own status: an admission's status once its gang exists
(gpuq.controller.record), Admitted -> Running when every worker runs, Succeeded when
all succeeded, restart or Failed when a worker fails or vanishes, Preempted -> Queued once the
victim's pods are gone, and clean-up of pods left over from earlier attempts. Each result is a
`Plan`: the status patch first (intent is persisted before pods are touched), then pod actions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuq.api.meta import Condition
from gpuq.api.trainingjob import FINISHED_PHASES, PLACED_PHASES, CheckpointReport, Phase
from gpuq.controller import record
from gpuq.controller import status as st
from gpuq.controller.intents import admit_status, all_workers
from gpuq.controller.objects import TERMINAL_POD_PHASES, JobEntry, PodEntry, newer
from gpuq.core.config import FailoverConfig
from gpuq.core.failover import backoff_seconds


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do for one job, in order: patch status, post events, then pod actions."""

    job: str
    status: dict[str, Any] = field(default_factory=dict)
    events: tuple[st.Event, ...] = ()
    delete_pods: tuple[str, ...] = ()  # pod keys
    complete_admission: bool = False  # create the missing pods of the attempt and bind them
    clear_checkpoint_request: tuple[str, ...] = ()  # pod keys whose request annotation is stale
    recheck_at: float | None = None  # look at the job again then, even if nothing changes
    resume_owner: bool = False  # lift the suspension gpuq put on a gang's owner to evict it

    def __bool__(self) -> bool:
        return bool(
            self.status
            or self.events
            or self.delete_pods
            or self.complete_admission
            or self.clear_checkpoint_request
            or self.resume_owner
        )


def backoff(restarts: int, cfg: FailoverConfig) -> float:
    """Restart back-off, as the core applies it to failovers: the first restart is immediate, then
    base, 2x base, 4x base, ... capped at backoff_max_seconds."""
    return backoff_seconds(restarts - 1, cfg)  # the core counts the restarts before this one


def ran_gpu_seconds(job: JobEntry, now: float) -> float:
    """GPU-seconds the current attempt has held running (from its start, else its admission: the same
    start the core's Running.started_at uses); 0 once the attempt let go of its placement, so an
    attempt is counted once however many evictions overlap."""
    if job.spec is None or not job.status.placement:
        return 0.0
    started = job.facts.started_at
    if started is None:
        return 0.0
    w = job.spec.workers
    return max(0.0, now - started) * w.replicas * w.gpus_per_worker


def lost_gpu_seconds(job: JobEntry, now: float) -> float:
    """GPU-seconds run since the later of the attempt's start and the last checkpoint."""
    if job.spec is None:
        return 0.0
    started = job.facts.started_at
    if started is None:
        return 0.0
    ckpt = job.status.last_checkpoint
    since = max(started, ckpt.time.timestamp()) if ckpt else started
    w = job.spec.workers
    return max(0.0, now - since) * w.replicas * w.gpus_per_worker


RESTARTS = "Restarts"  # condition whose message keeps the latest restarts, newest last
HISTORY_ENTRIES = 10
# Pod status reasons that blame the node, not the training code: the node joins status.failedNodes.
NODE_REASONS = frozenset({"NodeLost", "Evicted", "NodeShutdown", "Terminated"})
# A kubelet refusing to start a pod it was given (its admission check): usually another scheduler
# won the race for the GPUs (OutOfnvidia.com/gpu). Nothing ran, so the gang is placed again without
# a restart; only REJECTIONS_BEFORE_AVOIDING refusals in a row make gpuq avoid the node.
REJECTION_REASONS = frozenset(
    {
        "UnexpectedAdmissionError",
        "NodeAffinity",
        "NodeName",
        "NodePorts",
        "TaintToleration",
        "InvalidNodeInfo",
        "UnexpectedPredicateFailureType",
        "PodOSNotSupported",
    }
)
REJECTIONS_BEFORE_AVOIDING = 3


def rejected_by_kubelet(pod: PodEntry) -> bool:
    return pod.phase == "Failed" and (
        pod.status_reason in REJECTION_REASONS or pod.status_reason.startswith("OutOf")
    )


def restart_history(conds: Sequence[Condition], n: int, why: str, now: float) -> list[Condition]:
    """Condition Restarts=True whose message lists the last HISTORY_ENTRIES restarts, one per line."""
    old = st.condition(conds, RESTARTS)
    lines = (old.message.splitlines() if old is not None else [])[-(HISTORY_ENTRIES - 1) :]
    lines.append(f"#{n} {st.when(now)}: {why}")
    return st.with_condition(conds, RESTARTS, True, "Restarted", "\n".join(lines), now)


def evict_status(
    job: JobEntry,
    phase: Phase,
    message: str,
    now: float,
    cfg: FailoverConfig,
    *,
    count_restart: bool,
    count_preemption: bool = True,
    failed_nodes: Sequence[str] = (),
    reason: str,
) -> dict[str, Any]:
    """Status of a job whose gang is being evicted: Recovering/Queued (restart), Preempted or
    Suspended (a suspension or a queue drain does not count as a preemption).
    The placement moves to previousPlacement so failover can prefer its old domain."""
    s = job.status
    restarts = s.restarts + (1 if count_restart else 0)
    known_failed = list(dict.fromkeys([*s.failed_nodes, *failed_nodes]))[-256:]
    fields: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "placement": [],
        "previous_placement": s.placement or s.previous_placement,
        "restarts": restarts,
        "failed_nodes": known_failed,
        "started_at": None,
        "attained_gpu_seconds": round(s.attained_gpu_seconds + ran_gpu_seconds(job, now), 3),
        "preemption": None,
        "reason": None,
        "conditions": st.without_condition(
            st.with_condition(s.conditions, st.ADMITTED, False, reason, message, now), st.PREEMPTION_REQUESTED
        ),
    }
    if count_restart:
        fields["conditions"] = restart_history(fields["conditions"], restarts, message, now)
        fields["not_before"] = st.when(now + backoff(restarts, cfg))
        fields["lost_gpu_seconds"] = round(s.lost_gpu_seconds + lost_gpu_seconds(job, now), 3)
    elif count_preemption:
        fields["preemptions"] = s.preemptions + 1
    return st.patch(s, **fields)


def fail_or_restart(
    job: JobEntry,
    pods: Sequence[PodEntry],
    why: str,
    now: float,
    cfg: FailoverConfig,
    failed_nodes: Sequence[str] = (),
    event_reason: str = "WorkerFailed",
) -> Plan:
    """A worker (or its node) is gone: restart the whole gang if restarts remain, else fail the job."""
    assert job.spec is not None
    s = job.status
    live = tuple(p.key for p in pods if p.live and not p.deleting)
    if s.restarts < job.spec.max_restarts:
        n = s.restarts + 1
        msg = f"{why}; restarting the gang ({n}/{job.spec.max_restarts})"
        status = evict_status(
            job,
            Phase.RECOVERING,
            msg,
            now,
            cfg,
            count_restart=True,
            failed_nodes=failed_nodes,
            reason="Restarting",
        )
        return Plan(job.key, status, (st.warning(event_reason, msg),), live)
    msg = f"{why}; no restarts left (maxRestarts {job.spec.max_restarts})"
    if s.restarts:
        msg += f"; earlier restarts in condition {RESTARTS}"
    status = st.patch(
        s,
        phase=Phase.FAILED,
        message=msg,
        finished_at=st.when(now),
        queue_position=None,
        reason=None,
        preemption=None,
        conditions=st.without_condition(
            st.with_condition(s.conditions, st.ADMITTED, False, "Failed", msg, now), st.PREEMPTION_REQUESTED
        ),
    )
    return Plan(job.key, status, (st.warning("Failed", msg),), live)


def requeue_rejected(
    job: JobEntry, pods: Sequence[PodEntry], pod: PodEntry, now: float, cfg: FailoverConfig
) -> Plan:
    """A kubelet refused a worker of an Admitted gang: back to the queue, no restart counted. The
    node joins failedNodes (avoided) only after REJECTIONS_BEFORE_AVOIDING refusals in a row."""
    s = job.status
    n = s.rejections + 1
    why = f"kubelet on {pod.node_name} refused worker rank {pod.rank} ({pod.status_reason})"
    avoid = n >= REJECTIONS_BEFORE_AVOIDING and pod.node_name is not None
    msg = why + (
        f"; {n} refusals in a row: node {pod.node_name} is avoided from now on"
        if avoid
        else "; placing the gang again (no restart counted)"
    )
    failed_nodes = list(dict.fromkeys([*s.failed_nodes, pod.node_name]))[-256:] if avoid else s.failed_nodes
    status = st.patch(
        s,
        phase=Phase.QUEUED,
        message=msg,
        placement=[],
        previous_placement=s.placement or s.previous_placement,
        admitted_at=None,
        started_at=None,
        rejections=n,
        failed_nodes=failed_nodes,
        not_before=st.when(now + backoff_seconds(n - 1, cfg)) if n > 1 else None,
        preemption=None,
        conditions=st.without_condition(
            st.with_condition(s.conditions, st.ADMITTED, False, "AdmissionRejected", msg, now),
            st.PREEMPTION_REQUESTED,
        ),
    )
    live = tuple(p.key for p in pods if p.live and not p.deleting)
    return Plan(job.key, status, (st.warning("AdmissionRejected", msg),), live)


@dataclass(slots=True)
class _Workers:
    """What the transitions read of a job's pods, found in one pass (a term's first cycle looks at
    every job's: 100,000 pods at 10,000 nodes)."""

    by_rank: dict[int, PodEntry]  # the workers of the attempt the status records (the last pod of a rank)
    failed: list[PodEntry]  # those workers (of any rank) that failed
    stale: tuple[str, ...]  # live, not being deleted, and no worker of the placed attempt
    any_live: bool
    reported: CheckpointReport | None  # the newest checkpoint a current worker reported
    requested: tuple[str, ...]  # live, not being deleted, and asked to checkpoint


def _survey(job: JobEntry, pods: Sequence[PodEntry]) -> _Workers:
    attempt = job.status.attempt
    placed = job.status.phase in PLACED_PHASES
    by_rank: dict[int, PodEntry] = {}
    failed: list[PodEntry] = []
    stale: list[str] = []
    requested: list[str] = []
    any_live = False
    reported: CheckpointReport | None = None
    for p in pods:
        if p.attempt == attempt:
            if p.rank is not None:
                by_rank[p.rank] = p
            if p.phase == "Failed":
                failed.append(p)
            if p.checkpoint is not None:
                # A pod of an older attempt is fenced off (docs/failover.md, "Fencing").
                reported = newer(reported, p.checkpoint)
        if p.phase in TERMINAL_POD_PHASES:
            continue
        any_live = True
        if p.deleting:
            continue
        if not placed or p.attempt != attempt:
            stale.append(p.key)
        if p.checkpoint_requested:
            requested.append(p.key)
    return _Workers(by_rank, failed, tuple(stale), any_live, reported, tuple(requested))


def _ranks_state(by_rank: Mapping[int, PodEntry], replicas: int) -> tuple[bool, bool, bool, bool]:
    """(a rank of 0..replicas-1 has no worker or one being deleted, some worker is not bound, every
    worker succeeded, every worker runs or succeeded), in one pass (a first cycle asks for every
    placed job's)."""
    present, unbound, succeeded, running = 0, False, True, True
    for r, p in by_rank.items():
        if 0 <= r < replicas and not p.deleting:
            present += 1
        if p.node_name is None:
            unbound = True
        if p.phase != "Succeeded":
            succeeded = False
            if p.phase != "Running":
                running = False
    return present < replicas, unbound, succeeded, running


def _first_vanished(by_rank: Mapping[int, PodEntry], replicas: int) -> int:
    """The lowest rank with no worker or one being deleted (one exists: _ranks_state said so)."""
    return next(r for r in range(replicas) if r not in by_rank or by_rank[r].deleting)


def _checkpoint_fields(job: JobEntry, workers: _Workers, now: float) -> dict[str, Any]:
    """The latest checkpoint report: the job's own annotation and its current attempt's pods."""
    fields: dict[str, Any] = {}
    best = newer(newer(job.status.last_checkpoint, job.checkpoint), workers.reported)
    if best is not None and best != job.status.last_checkpoint:
        fields["last_checkpoint"] = best
    conds = job.status.conditions
    if job.checkpoint_error and not st.is_true(conds, st.CHECKPOINT_INVALID):
        fields["conditions"] = st.with_condition(
            conds, st.CHECKPOINT_INVALID, True, "BadAnnotation", job.checkpoint_error, now
        )
    elif not job.checkpoint_error and st.condition(conds, st.CHECKPOINT_INVALID) is not None:
        fields["conditions"] = st.without_condition(conds, st.CHECKPOINT_INVALID)
    return fields


def _abandoned_preemption(job: JobEntry, fields: dict[str, Any]) -> dict[str, Any]:
    """A preemption recorded on a job that no longer holds a placement will never complete: clear it."""
    s = job.status
    if s.preemption is None or s.phase in PLACED_PHASES:
        return fields
    conds = fields.get("conditions", s.conditions)
    return {**fields, "preemption": None, "conditions": st.without_condition(conds, st.PREEMPTION_REQUESTED)}


@dataclass(frozen=True, slots=True)
class Recording:
    """How an admission's status is written from its gang (gpuq.controller.record)."""

    note: str = ""  # what the decision adds to the message, while the writer remembers it
    status_delay: float = record.ADMITTED_STATUS_DELAY  # wait for Running before saying Admitted


UNNOTED = Recording()  # a gang with no admission in flight in this operator


def observe(
    job: JobEntry, pods: Sequence[PodEntry], now: float, cfg: FailoverConfig, rec: Recording = UNNOTED
) -> Plan:
    """The transition (if any) that the job's pods and status call for right now."""
    workers = _survey(job, pods)
    plan = _transition(job, pods, workers, now, cfg, rec)
    if job.parked and job.status.phase not in PLACED_PHASES and not workers.any_live:
        plan = dataclasses.replace(plan, resume_owner=True)  # evicted, its workers gone
    if job.status.preemption is not None and job.status.phase in PLACED_PHASES:
        return plan
    # No preemption in progress: a checkpoint request left on a live worker is stale (e.g. from an
    # operator that stopped mid-preemption); training code would otherwise checkpoint forever.
    stale_request = tuple(key for key in workers.requested if key not in plan.delete_pods)
    return dataclasses.replace(plan, clear_checkpoint_request=stale_request) if stale_request else plan


def _record_admission(
    job: JobEntry,
    pods: Sequence[PodEntry],
    gang: tuple[str, ...],
    now: float,
    fields: dict[str, Any],
    events: tuple[st.Event, ...],
    rec: Recording,
) -> Plan:
    """The status of a gang created without one (gpuq.controller.record): Running as soon as every
    worker runs, Admitted once the status delay has passed without that; a gang admitted in a burst
    waits out its delay either way (the API server's time goes to binding the burst first)."""
    attempt = job.status.attempt + 1
    stale = tuple(p.key for p in pods if p.live and not p.deleting and p.attempt != attempt)
    running = all(p.phase in ("Running", "Succeeded") for p in pods if p.attempt == attempt)
    since = record.gang_created_at(job, pods) or now
    deadline = since + rec.status_delay
    if now < deadline and (not running or record.in_burst(rec.status_delay)):
        return Plan(job.key, st.patch(job.status, **fields), events, stale, recheck_at=deadline)
    status = {**st.patch(job.status, **fields), **admit_status(job, gang, since, now, running, rec.note)}
    if record.finished_gang(job, pods):  # done before its admission was recorded: one write says both
        msg = _succeeded_message(len(gang))
        status |= st.patch(job.status, phase=Phase.SUCCEEDED, message=msg, finished_at=st.when(now))
        return Plan(job.key, status, (*events, st.normal("Succeeded", msg)), stale)
    return Plan(job.key, status, events, stale)


def _succeeded_message(workers: int) -> str:
    return all_workers(workers, "succeeded")


def _owner_ended(job: JobEntry, outcome: str, now: float) -> Plan:
    """A gang of another owner whose controller ended it (a Job Complete or Failed, a PyTorchJob
    Succeeded or Failed): its record says so; its pods are the controller's to clean up."""
    msg = f"its {job.source} {outcome.lower()} (its controller says so)"
    phase = Phase.SUCCEEDED if outcome == "Succeeded" else Phase.FAILED
    status = st.patch(job.status, phase=phase, message=msg, finished_at=st.when(now))
    return Plan(job.key, status, ((st.normal if phase is Phase.SUCCEEDED else st.warning)(outcome, msg),))


def _transition(
    job: JobEntry,
    pods: Sequence[PodEntry],
    workers: _Workers,
    now: float,
    cfg: FailoverConfig,
    rec: Recording,
) -> Plan:
    s = job.status
    if job.ended is not None and s.phase not in FINISHED_PHASES:
        return _owner_ended(job, job.ended, now)
    if job.spec is None:
        if st.is_true(s.conditions, st.BLOCKED) and s.message == job.error:
            return Plan(job.key)
        msg = job.error or "invalid spec"
        return Plan(
            job.key,
            st.patch(
                s,
                phase=s.phase or Phase.QUEUED,
                message=msg,
                conditions=st.with_condition(s.conditions, st.BLOCKED, True, job.error_reason, msg, now),
            ),
            # A gang of another owner: the reason gpuq cannot run it (UnsupportedGang, InvalidGang...).
            (st.warning("InvalidSpec" if job.source is None else job.error_reason, msg),),
        )

    spec = job.spec
    checkpoint = _checkpoint_fields(job, workers, now)
    events = (
        (st.warning("CheckpointReportInvalid", job.checkpoint_error),)
        if ("conditions" in checkpoint and job.checkpoint_error)
        else ()
    )
    extra = _abandoned_preemption(job, checkpoint)
    stale = workers.stale
    placed = s.phase in PLACED_PHASES

    if s.phase in FINISHED_PHASES:
        return Plan(job.key, st.patch(s, **extra), events, stale)
    if s.phase == Phase.PREEMPTED and not workers.any_live:
        msg = "requeued after preemption"
        return Plan(job.key, st.patch(s, phase=Phase.QUEUED, message=msg, **extra), events)
    if not placed:
        gang = record.created_gang(job, pods)
        if gang is not None:
            return _record_admission(job, pods, gang, now, extra, events, rec)
        return Plan(job.key, st.patch(s, **extra), events, stale)

    # Admitted or Running: look at the current attempt's workers.
    by_rank = workers.by_rank
    failed = sorted(workers.failed, key=lambda p: p.rank or 0)
    rejected = [p for p in failed if rejected_by_kubelet(p)]
    if rejected and s.phase == Phase.ADMITTED:
        plan = requeue_rejected(job, pods, rejected[0], now, cfg)
        return Plan(plan.job, {**st.patch(s, **extra), **plan.status}, plan.events, plan.delete_pods)
    if failed:
        p = failed[0]
        why = f"worker rank {p.rank} failed on {p.node_name}" + (f": {p.reason}" if p.reason else "")
        bad_node = (p.node_name,) if p.node_name and p.reason in NODE_REASONS else ()
        plan = fail_or_restart(job, pods, why, now, cfg, failed_nodes=bad_node)
        return Plan(plan.job, {**st.patch(s, **extra), **plan.status}, plan.events, plan.delete_pods)
    vanished, unbound, succeeded, running = _ranks_state(by_rank, spec.workers.replicas)
    if vanished and spec.suspend and job.source is not None:
        # Its user suspended its owner, whose controller deletes the pods itself: a stop, not a lost
        # worker (gpuq's own eviction of a TrainingJob records Suspended before it deletes them).
        msg = f"suspended: its {job.source} has its suspend field set; it holds no GPUs until that is lifted"
        status = evict_status(
            job,
            Phase.SUSPENDED,
            msg,
            now,
            cfg,
            count_restart=False,
            count_preemption=False,
            reason="Suspended",
        )
        return Plan(job.key, {**st.patch(s, **extra), **status}, (*events, st.normal("Suspended", msg)))
    if vanished and s.phase == Phase.RUNNING:
        why = f"worker rank {_first_vanished(by_rank, spec.workers.replicas)} was deleted or evicted"
        plan = fail_or_restart(job, pods, why, now, cfg, event_reason="WorkerLost")
        return Plan(plan.job, {**st.patch(s, **extra), **plan.status}, plan.events, plan.delete_pods)
    if vanished or unbound:
        return Plan(job.key, st.patch(s, **extra), events, stale, complete_admission=True)
    if succeeded:
        msg = _succeeded_message(spec.workers.replicas)
        status = st.patch(
            s, phase=Phase.SUCCEEDED, message=msg, finished_at=st.when(now), rejections=0, **extra
        )
        return Plan(job.key, status, (*events, st.normal("Succeeded", msg)), stale)
    if s.phase == Phase.ADMITTED and running:
        msg = all_workers(spec.workers.replicas, "running")
        status = st.patch(s, phase=Phase.RUNNING, message=msg, started_at=st.when(now), rejections=0, **extra)
        return Plan(job.key, status, events, stale)  # no Event: the phase says it, and it saves a write
    return Plan(job.key, st.patch(s, **extra), events, stale)
