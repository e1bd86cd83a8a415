"""The admission record: a gang's bound pods first, the job's status after them.

An admission creates the attempt's pods already bound (named <job>-<attempt>-<rank>, labelled with
the attempt and rank, owned by the job) and writes no status before them: the complete set of
pods *is* the durable record of the admission. The status follows in one write once the workers run
(phase Running), or after ADMITTED_STATUS_DELAY with phase Admitted if they are still starting, so a
gang whose workers start quickly costs one status write instead of two. A gang admitted in a burst
(more than BURST_GANGS others awaiting their status, or decided in the same cycle) waits
BURST_STATUS_DELAY whether its workers run or not: a custom resource's status write costs the API
server about twice a pod create, and while the burst is being bound that time is better spent on
pods (docs/throughput.md).

Why it is safe to stop the operator at any moment (docs/api.md, "TrainingJob lifecycle"):
- pods complete and bound, no status yet: `created_gang` finds them; the snapshot counts them as the
  job's placement (GPUs and quota) and the lifecycle writes the status from them: never admitted
  twice, never lost;
- pods partly created: not a gang; the lifecycle deletes them (the job is still Queued, so they
  are stale) and the job is scheduled again; until they are gone their GPUs count as used;
- status written: as before (Admitted/Running with the placement).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuq.api.trainingjob import FINISHED_PHASES, PLACED_PHASES
from gpuq.controller.objects import JobEntry, PodEntry

# How long a created gang's status may wait for its workers to run before it says Admitted; for a
# gang admitted during a burst (more gangs awaiting their status than BURST_GANGS) longer, so that
# most admissions cost one status write while the API server is busiest (kubelets report Running
# later then, too).
ADMITTED_STATUS_DELAY = 2.0
BURST_STATUS_DELAY = 10.0
BURST_GANGS = 64


def created_gang(job: JobEntry, pods: Sequence[PodEntry]) -> tuple[str, ...] | None:
    """Nodes by rank of the next attempt's gang when every rank exists, bound and not being deleted
    (an admission whose status has not been written yet), else None. Workers that already finished
    count: the lifecycle takes it from there once the status records the attempt."""
    if job.spec is None or job.status.phase in (*PLACED_PHASES, *FINISHED_PHASES):
        return None
    attempt = job.status.attempt + 1
    by_rank: dict[int, str] = {}
    for p in pods:
        if p.attempt != attempt or p.owner_uid != job.uid or p.rank is None:
            continue
        if p.deleting or p.node_name is None or p.rank in by_rank:
            return None
        by_rank[p.rank] = p.node_name
    replicas = job.spec.workers.replicas
    if sorted(by_rank) != list(range(replicas)):
        return None
    return tuple(by_rank[r] for r in range(replicas))


def finished_gang(job: JobEntry, pods: Sequence[PodEntry]) -> bool:
    """Every worker of the job's current attempt (the one its status records, or a gang created
    before its status) has succeeded: the job is done, whatever its status says yet. Its GPUs are
    free (a kubelet frees a finished pod's at once), so the snapshot stops counting them, a
    preemption decided meanwhile is not carried out, and the lifecycle writes Succeeded."""
    if job.spec is None or job.status.phase in FINISHED_PHASES:
        return False
    attempt = job.status.attempt if job.status.phase in PLACED_PHASES else job.status.attempt + 1
    done: set[int] = set()
    for p in pods:
        if p.attempt != attempt or p.owner_uid != job.uid or p.rank is None:
            continue
        if p.deleting or p.phase != "Succeeded":
            return False
        done.add(p.rank)
    return done == set(range(job.spec.workers.replicas))


def gang_created_at(job: JobEntry, pods: Sequence[PodEntry]) -> float | None:
    """When the next attempt's first pod was created (None if unknown)."""
    times = [p.created_at for p in pods if p.attempt == job.status.attempt + 1 and p.created_at is not None]
    return min(times, default=None)


def status_delay(awaiting: int) -> float:
    """The wait for Running before Admitted is written, given how many gangs await their status."""
    return BURST_STATUS_DELAY if awaiting > BURST_GANGS else ADMITTED_STATUS_DELAY


def in_burst(delay: float) -> bool:
    """Whether a gang was admitted in a burst (its status then waits out the delay)."""
    return delay >= BURST_STATUS_DELAY
