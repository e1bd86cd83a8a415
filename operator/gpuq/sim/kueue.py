"""Kueue-like baselines: gang admission against the queues' quotas, the queues' preemption settings.

- `gang-binpack`: Kueue without topology-aware scheduling, each worker on the feasible node with the
  fewest GPUs left (Volcano's gang + binpack places the same way), no topology.
- `kueue-tas`: Kueue with topology-aware scheduling, a preferred topology level per gang and the
  BestFit profile (gpuq.sim.tas).

Both, as Kueue v0.17.0 runs a ClusterQueue with BestEffortFIFO:
- Order: queue heads by (needs to borrow, priority, creation time); a head that cannot be admitted
  is skipped (no reservation) and the next job of its queue becomes the head.
- A job tried and not admitted is parked (Kueue's inadmissible workloads,
  pkg/cache/queue/cluster_queue.go `requeueIfNotPresent`): later cycles skip it until a job of its
  cohort stops holding quota (finishes or is evicted) and a second has passed
  (pkg/cache/queue/inadmissible_workloads.go: `NotifyRetryInadmissible` queues the cohort's requeue
  `AddAfter` `requeueBatchPeriod`, 1 s; a node that changes requeues every queue the same way,
  pkg/controller/tas/resource_flavor.go). Jobs that arrived since are tried first, as the head of
  their queue (so they may preempt): when GPUs free up while jobs keep arriving, newer jobs take
  them before the parked older ones.
- Quota: the same rules as gpuq (nominal, cohort lending and borrowing limits, and GPUs a queue lent
  out are not free for it until they are reclaimed or released): gpuq.core.quota.QuotaBook, the one
  home of that rule.
- Preemption (Kueue's classical preemption, the queue's own settings): withinClusterQueue
  LowerPriority lets a job evict lower-priority jobs of its queue; reclaimWithinCohort lets a job that
  stays within its nominal quota evict jobs of cohort peers that borrow (Any: any priority,
  LowerPriority: lower only). Candidates: other queues' first, lower priority first, most recently
  started first; evicted one by one until the preemptor fits (quota and placement), then the fewest
  kept. Victims are killed, not asked to checkpoint: they keep their last periodic checkpoint. Only
  a queue's head may preempt, once per cycle (Kueue nominates heads).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Admit, Decisions, Preempt
from gpuq.core.model import Job, Node, Queue, ReclaimPreemption, Snapshot, WithinQueuePreemption
from gpuq.core.quota import QuotaBook
from gpuq.core.state import CycleState
from gpuq.sim.baselines import (
    Free,
    Tracker,
    arrival_key,
    failed_node_restarts,
    fits,
    model_ok,
    take,
)
from gpuq.sim.policy import Delta
from gpuq.sim.tas import tas_place

Placer = Callable[[Job, Sequence[Node], Free], "tuple[str, ...] | None"]


class _NoJournal:
    """QuotaBook journals undo steps for gpuq's statements; a baseline has none to roll back."""

    def record(self, undo: object) -> None:
        pass


def best_fit(job: Job, nodes: Sequence[Node], free: Free) -> tuple[str, ...] | None:
    """All workers or none; each on the feasible node with the fewest GPUs left, no topology.
    Resources are not taken (the caller does)."""
    placement: list[str] = []
    for _ in range(job.workers.replicas):
        best: str | None = None
        best_left = 1 << 62
        for node in nodes:
            slot = free[node.name]
            if slot[0] < best_left and fits(slot, job) and model_ok(job, node):
                best, best_left = node.name, slot[0]
        if best is None:
            break
        take(free[best], job)
        placement.append(best)
    for name in placement:  # hand back: the caller takes what it commits
        take(free[name], job, sign=-1)
    return tuple(placement) if len(placement) == job.workers.replicas else None


@dataclass(frozen=True, slots=True)
class _CycleView:
    """What one cycle works on: quota, free resources per node, running jobs per queue."""

    book: QuotaBook
    free: Free
    nodes: Sequence[Node]
    running: dict[str, list[Job]]
    queues: dict[str, Queue]
    preempted: list[str] = field(default_factory=list)  # preemptors of this cycle so far


# Kueue's delay before inadmissible workloads go back to the queue after quota was released
# (requeueBatchPeriod; the SchedulerLongRequeueInterval gate, off by default, makes it 10 s).
REQUEUE_BATCH_SECONDS = 1.0


class KueueLike:
    checkpoint_on_preempt = False
    timers = True  # its requeue after REQUEUE_BATCH_SECONDS is a timer: wake_at asks for that cycle

    def __init__(self, name: str, placer: Placer) -> None:
        self.name = name
        self.placer = placer
        self.tracker = Tracker()
        self.failed_searches: dict[str, object] = {}  # job -> state in which its preemption search failed
        # Cohort (or queue) -> when the jobs of it that waited through a cycle are tried again.
        self.requeue_at: dict[str, float] = {}
        self.holding: dict[str, str] = {}  # job -> queue, for jobs admitted and not yet gone

    def schedule(self, snapshot: Snapshot, now: float, config: SchedulerConfig, delta: Delta) -> Decisions:
        restarts, restarted = failed_node_restarts(snapshot)
        queues = {q.name: q for q in snapshot.queues}
        released, arrived = self._released(delta)
        released |= {self.tracker.jobs[k].queue for k in restarted if k in self.tracker.jobs}
        notified = {_root(queues[qn]) for qn in released if qn in queues}
        if delta.nodes:  # a node changed (failed, repaired): TAS requeues every ClusterQueue
            notified |= {_root(q) for q in queues.values()}  # (pkg/controller/tas/resource_flavor.go)
        fired = self._requeue(now, notified)
        self.tracker.update(snapshot, delta)
        fresh_lines = self._fresh_lines(arrived, restarted)
        v = self.tracker.view(snapshot, restarted)
        free, nodes = v.free, v.nodes
        free_gpus = v.free_gpus
        book = QuotaBook(cast(CycleState, _NoJournal()), queues, v.queue_used, {})
        running = {
            queue: [job for key, job in jobs.items() if key not in restarted]
            for queue, jobs in self.tracker.running.items()
        }
        cv = _CycleView(book, free, nodes, running, queues)
        lines: dict[str, Iterator[Job]] = {}
        heads: dict[str, Job] = {}
        for qn, whole_line in sorted(v.lines.items()):
            q = queues.get(qn)
            if q is None or q.held:
                continue
            # Jobs that waited through a cycle are parked until their cohort's requeue fires.
            line = whole_line if _root(q) in fired else iter(fresh_lines.get(qn, ()))
            head = next(line, None)
            if head is not None:
                lines[qn], heads[qn] = line, head
        admits: list[Admit] = []
        preempts: list[Preempt] = []
        first = set(heads)  # queues whose current job is still their head
        # Queue heads by _head_key; only the admitting queue's key changes, so a heap with a re-check
        # on pop (a preemption may change a victim queue's borrowing) keeps the order exact.
        heap = [(self._head_key(book, queues[qn], job), qn) for qn, job in heads.items()]
        heapq.heapify(heap)
        while heap and len(admits) < config.max_admissions_per_cycle:
            key, qn = heapq.heappop(heap)
            q, job = queues[qn], heads[qn]
            fresh = self._head_key(book, q, job)
            if fresh != key:
                heapq.heappush(heap, (fresh, qn))
                continue
            is_head = qn in first
            first.discard(qn)
            placement = self._admit_or_preempt(job, q, is_head, free_gpus, cv)
            if placement is not None:
                if placement[1]:
                    preempts.extend(Preempt(x.key, job.key, "Kueue preemption") for x in placement[1])
                    free_gpus += sum(x.workers.total_gpus for x in placement[1])
                for name in placement[0]:
                    take(free[name], job)
                gpus = job.workers.total_gpus
                free_gpus -= gpus
                book.add(qn, gpus, {})
                admits.append(
                    Admit(job.key, placement[0], 0.0, restart=job.key in restarted or job.recovering)
                )
            # BestEffortFIFO: a job not admitted is skipped (no reservation); behind the head only
            # jobs that fit the GPUs still free are worth a try, and none once no GPU is free.
            if free_gpus <= 0:
                continue
            nxt = next((j for j in lines[qn] if j.workers.total_gpus <= free_gpus), None)
            if nxt is not None:
                heads[qn] = nxt
                heapq.heappush(heap, (self._head_key(book, q, nxt), qn))
        for a in admits:
            self.holding[a.job] = self.tracker.jobs[a.job].queue
        return Decisions(
            admit=tuple(admits), preempt=tuple(preempts), restart=tuple(restarts), wake_at=self._wake(queues)
        )

    def _admit_or_preempt(
        self, job: Job, q: Queue, is_head: bool, free_gpus: int, cv: _CycleView
    ) -> tuple[tuple[str, ...], list[Job]] | None:
        """(placement, victims evicted for it) or None. Victims' resources and quota are released here."""
        book, free, nodes, running = cv.book, cv.free, cv.nodes, cv.running
        gpus = job.workers.total_gpus
        if gpus <= free_gpus and book.check(q, gpus).ok:
            placement = self.placer(job, nodes, free)
            if placement is not None:
                return placement, []
        if not is_head:
            return None
        # A search that failed fails again while nothing ran, stopped or moved since and no quota
        # changed (Kueue has no time-based preemption rule): skip it, the simulation is long.
        state = (self.tracker.version, tuple(sorted(book.usage.items())), free_gpus)
        if not cv.preempted and self.failed_searches.get(job.key) == state:
            return None
        victims = self._preempt(job, q, cv)
        if not victims:
            self.failed_searches[job.key] = state
            return None
        cv.preempted.append(job.key)
        for x in victims:
            running[x.queue].remove(x)
        placement = self.placer(job, nodes, free)
        assert placement is not None, "the preemption search verified the placement"
        return placement, victims

    @staticmethod
    def _head_key(book: QuotaBook, q: Queue, job: Job) -> tuple[bool, int, float, str]:
        return (book.needs_borrow(q, job.workers.total_gpus), -job.priority, job.created_at, job.key)

    def _candidates(
        self, job: Job, q: Queue, book: QuotaBook, running: dict[str, list[Job]], queues: dict[str, Queue]
    ) -> list[Job]:
        """Kueue's candidates, in its order: other queues' first, lower priority first, most recently
        started first."""
        found: list[tuple[bool, Job]] = []  # (own queue, job)
        if q.preemption.within_queue is WithinQueuePreemption.LOWER_PRIORITY:
            found += [(True, r) for r in running.get(q.name, ()) if r.priority < job.priority]
        reclaim = q.preemption.reclaim_within_cohort
        if (
            q.cohort is not None
            and reclaim is not ReclaimPreemption.NEVER
            and book.used(q.name) + job.workers.total_gpus <= q.nominal_gpus
        ):
            for other, jobs in running.items():
                p = queues.get(other)
                if p is None or other == q.name or p.cohort != q.cohort or book.borrowed(p) <= 0:
                    continue
                found += [
                    (False, r) for r in jobs if reclaim is ReclaimPreemption.ANY or r.priority < job.priority
                ]
        usable = [(own, r) for own, r in found if r.preemptible and queues[r.queue].preemption.preemptible]
        usable.sort(key=lambda c: (c[0], c[1].priority, -(c[1].running.started_at if c[1].running else 0.0)))
        return [r for _, r in usable]

    def _preempt(self, job: Job, q: Queue, cv: _CycleView) -> list[Job]:
        """Victims that let job in, released from the cycle's free resources and quota; [] (and
        nothing changed) when none do."""
        book, free, nodes, queues = cv.book, cv.free, cv.nodes, cv.queues
        candidates = self._candidates(job, q, book, cv.running, queues)
        gpus = job.workers.total_gpus
        free_total = sum(slot[0] for slot in free.values())
        if not candidates or free_total + sum(c.workers.total_gpus for c in candidates) < gpus:
            return []
        chosen: list[Job] = []

        def remove(x: Job, sign: int) -> None:  # sign 1 releases x's resources and quota, -1 takes them
            for name in x.running.placement if x.running else ():
                if name in free:
                    take(free[name], x, sign=-sign)
            book.add(x.queue, -sign * x.workers.total_gpus, {})

        def admissible() -> bool:
            return book.check(q, gpus).ok and self.placer(job, nodes, free) is not None

        for x in candidates:
            p = queues[x.queue]
            if x.queue != q.name and book.borrowed(p) <= 0:
                continue  # that peer no longer borrows: nothing left to reclaim from it
            remove(x, 1)
            chosen.append(x)
            if admissible():
                break
        else:
            for x in chosen:
                remove(x, -1)
            return []
        for x in reversed(chosen[:-1]):  # keep the fewest: give back any victim not needed after all
            remove(x, -1)
            if admissible():
                chosen.remove(x)
            else:
                remove(x, 1)
        return chosen

    # ---- Kueue's inadmissible workloads ---------------------------------------------------------
    def _released(self, delta: Delta) -> tuple[set[str], set[str]]:
        """Queues whose jobs stopped holding quota since the last cycle (finished or evicted), and
        the jobs that started waiting since (arrived, or evicted): Kueue tries those at once."""
        released: set[str] = set()
        fresh: set[str] = set()
        holding = self.holding
        for key in delta.removed_jobs:
            if key in holding:
                released.add(holding.pop(key))
        for key, job in delta.jobs.items():
            if key in delta.removed_jobs:
                continue
            if job.running is not None:
                holding[key] = job.queue
            elif key in holding:  # evicted
                released.add(holding.pop(key))
                fresh.add(key)
            elif key not in self.tracker.jobs:  # arrived
                fresh.add(key)
        return released, fresh

    def _requeue(self, now: float, notified: set[str]) -> set[str]:
        """The requeues due now (their cohorts' waiting jobs are all tried this cycle); then one a
        batch period after each new notification (one already pending stands)."""
        fired = {root for root, at in self.requeue_at.items() if at <= now}
        for root in fired:
            del self.requeue_at[root]
        for root in notified:
            self.requeue_at.setdefault(root, now + REQUEUE_BATCH_SECONDS)
        return fired

    def _fresh_lines(self, arrived: set[str], restarted: set[str]) -> dict[str, list[Job]]:
        """The jobs waiting since the last cycle (arrived or evicted, or released from a failed node
        now), per queue in queue order."""
        lines: dict[str, list[Job]] = {}
        for key in arrived | restarted:
            job = self.tracker.jobs.get(key)
            if job is not None and (job.running is None or key in restarted):
                lines.setdefault(job.queue, []).append(job)
        for line in lines.values():
            line.sort(key=arrival_key)
        return lines

    def _wake(self, queues: dict[str, Queue]) -> float | None:
        """The next requeue with jobs to bring back (one over an empty cohort changes nothing)."""
        waiting = {_root(queues[qn]) for qn, line in self.tracker.lines.items() if line and qn in queues}
        return min((at for root, at in self.requeue_at.items() if root in waiting), default=None)


def _root(q: Queue) -> str:
    """What Kueue requeues as one: the queue's cohort, or the queue alone."""
    return f"cohort/{q.cohort}" if q.cohort is not None else f"queue/{q.name}"


def gang_binpack() -> KueueLike:
    return KueueLike("gang-binpack", best_fit)


def kueue_tas() -> KueueLike:
    return KueueLike("kueue-tas", tas_place)
