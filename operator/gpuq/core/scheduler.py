"""`schedule(snapshot, now, config) -> Decisions`: one pure, deterministic scheduling cycle.

Phases (docs/scheduling.md):
1. Failover: every running gang that lost a node gets a Restart; it releases its resources.
2. Recovery: jobs restarted now or earlier (recovering) are re-placed first, in priority order, keeping
   their quota, avoiding bad nodes, preferring the domain they ran in; back-off is honored.
3. Queues: pending jobs are taken queue head by queue head. Heads that fit their nominal quota go first,
   then borrowers by lowest weighted share, each class by priority, then creation time. A head is
   admitted only with quota AND a placement; otherwise it may preempt, else it gets a reason. StrictFIFO
   stops the queue at a head that is not admitted; BestEffortFIFO moves on, except that a head waiting
   longer than starvation_seconds reserves capacity (or, if quota binds, the queue's quota).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from gpuq.core import consolidation, preemption
from gpuq.core.config import SchedulerConfig
from gpuq.core.constraints import invalid_constraints
from gpuq.core.decisions import (
    CAPACITY_CODES,
    NEVER_CODES,
    Abandon,
    Admit,
    Decisions,
    Pending,
    PendingCode,
    Preempt,
    Restart,
)
from gpuq.core.failover import backoff_seconds, detect, gang_fails
from gpuq.core.fit import Demand, invalid_workers, slots_on
from gpuq.core.index import ClusterIndex, OrderKey, SnapshotError, order_key
from gpuq.core.model import Job, Queue, QueueingStrategy, Snapshot, TopologyMode
from gpuq.core.placement import Placement, Request, place
from gpuq.core.pools import Pool
from gpuq.core.quota import QuotaBook, cohorts_of, model_quota_reason
from gpuq.core.reasons import capacity_reason, placement_reason, unschedulable_reason
from gpuq.core.service import ServiceView, attained
from gpuq.core.state import CycleState
from gpuq.core.topology import level_weights


def schedule(
    snapshot: Snapshot,
    now: float,
    config: SchedulerConfig,
    index: ClusterIndex | None = None,
    *,
    explain: bool = True,
) -> Decisions:
    """Decide one cycle. Pure: the result depends only on (snapshot, now, config).

    `index` is an optional cache kept by the caller between cycles (see gpuq.core.index); it must have
    been built from or `apply`-ed up to this very snapshot and config. `explain=False` leaves
    `Decisions.pending` empty: the actions are the same, and the cycle skips the O(pending jobs) work of
    explaining every waiting job (for callers that only act, like the simulator).
    """
    if index is None:
        ix = ClusterIndex(snapshot, config)
    else:
        if index.snapshot is not snapshot:
            raise ValueError("the index reflects another snapshot: call index.apply(snapshot, ...) first")
        if index.config != config:
            raise ValueError("the index was built with another SchedulerConfig")
        ix = index
    cycle = _Cycle(ix, snapshot, now, config, explain)
    decisions = cycle.run()
    # A cycle that preempted nothing leaves a memo for the next one (see _Memo).
    if decisions.preempt or decisions.restart or decisions.abandon:
        ix.cycle_memo = None
    else:
        admitted = tuple(a.job for a in decisions.admit)
        # Running jobs become victims (or movers) with time alone: the memo expires then.
        until = _next_running_event(ix, config, now)
        ix.cycle_memo = _Memo(
            ix.changes,
            ix.takes,
            ix.reprices,
            admitted,
            tuple(cycle.holding),
            tuple(cycle.holds),
            tuple(cycle.acts),
            snapshot.queues,
            now,
            config,
            cycle.failed_out,
            until,
        )
    return decisions


def _keys(victims: Iterable[preemption.Victim]) -> tuple[str, ...]:
    return tuple(v.key for v in victims)


def _next_running_event(ix: ClusterIndex, config: SchedulerConfig, now: float) -> float:
    """When a running job next passes its minimum run or an attained-service level, if any rule
    (attained-service preemption, consolidation) cares; inf otherwise."""
    if config.service.preempts or config.consolidation.enabled:
        return ix.next_service_event(now)
    return float("inf")


def _deepest_holding(ix: ClusterIndex, d: Demand, R: int, pools: list[Pool]) -> int:
    """The deepest level where one domain of some pool could hold R workers of d on an empty cluster,
    by each node's allocatable resources (worker slots, not GPU totals: a rack of two 8-GPU nodes
    holds four 3-GPU workers, not five)."""
    tree = ix.tree
    L = tree.node_depth
    depth = 0
    for pool in pools:
        slots = {
            n: slots_on(ix.cap_gpu[n], ix.cap_cpu[n], ix.cap_mem[n], ix.nodes[n].allocatable.extra, d)
            for n in pool.member_list()
        }
        if depth < L and any(k >= R for k in slots.values()):
            depth = L  # one node holds it
        for t in range(L - 1, depth, -1):  # only deeper than what another pool already found
            per_domain: dict[int, int] = {}
            for n, k in slots.items():
                dom = tree.ancestors[n][t]
                per_domain[dom] = per_domain.get(dom, 0) + k
            if any(k >= R for k in per_domain.values()):
                depth = t
                break
    return depth


@dataclass(frozen=True, slots=True)
class _Failed:
    """How a pending class failed in a cycle (its first job tried, as head or not)."""

    job: Job
    head: bool
    stage: int  # how long it had waited: _Cycle._stage
    local_until: float  # when its locality wait ends (_local_until; 0: none)
    held_out: bool  # it failed only because it holds out for its smallest domain (_Cycle.held_out)
    searched: bool  # it ran a preemption search (counts against the per-cycle budget)
    # Its verdict depended on what evicting running gangs costs (a preemption or consolidation
    # search was run or skipped as failed before): a checkpoint since may change it.
    priced: bool
    # The per-cycle search budget was spent when it would have searched (_Cycle.skipped), and
    # whether that was its preemption search (then its reason says so: _Cycle.deferred).
    skipped: bool
    deferred: bool
    acts: int  # how many of its cycle's acts (_Cycle.acts) came before it
    # How many of its cycle's holds (_Cycle.holds) came before it: it failed with what they took
    # taken; a cycle that has not repeated them all may have that room, or quota, free for it.
    holds: int
    # Its reason was found on the state its cycle reached after those acts (not recalled from a
    # cycle whose state differed): a cycle with the same acts before it has the same state again.
    exact: bool
    # Starving heads holding a reservation when it failed: with another set (a new arrival may take
    # such a head's place), what the class saw free differs.
    reserved: tuple[str, ...]
    reason: str
    code: str


@dataclass(frozen=True, slots=True)
class _Memo:
    """What a cycle that preempted nothing leaves for the next. If since then its admissions started,
    running jobs reported checkpoints and otherwise only queued jobs came, changed or went
    (ClusterIndex.changes/takes/reprices), and the jobs whose tries took capacity or quota without
    being admitted (`holding`: reservations, waits for preempted gangs) are still there, unchanged,
    no capacity or quota was freed: a class whose same first job fails in the same role (head or
    not, at the same waiting stage, behind the same reservations) fails again and need not be tried,
    unless it is a head that jobs started since could now be preempted for, or its verdict weighed
    victims' costs and a checkpoint came since. Those jobs being unchanged does not make their tries
    take the same again (a new job admitted ahead of a waiting head may leave it outside its quota,
    waiting for nothing): a class is recalled only once every hold that came before it in that cycle
    (`holds`) was repeated, the same, in this one (_Failed.holds, _Cycle.repeated). An explaining
    cycle recalls a class only when its reason's words are sure to be the same too (_Failed.exact)."""

    changes: int
    takes: int
    reprices: int
    admitted: tuple[str, ...]
    holding: tuple[Job, ...]
    holds: tuple[Hashable, ...]  # its acts that were not admissions, in order (_Cycle.holds)
    acts: tuple[Hashable, ...]  # what its cycle did, in order (_Cycle.acts)
    queues: tuple[Queue, ...]
    now: float
    config: SchedulerConfig
    failed: dict[tuple[str, int], _Failed]
    until: float  # the memo expires when time alone may give a queue new victims


class _Outcome(Enum):
    ADMITTED = 1
    WAITING = 2  # preemption committed: waits for victims
    FAILED = 3
    STARVED_ON_QUOTA = 4  # a starving head that quota blocks: its queue stops behind it


@dataclass(frozen=True, slots=True)
class _Recovery:
    job: Job
    exclude: frozenset[int]  # nodes that failed under it, now or in earlier attempts
    previous: tuple[int, ...]  # node indices it ran on (known nodes only)
    not_before: float
    old: tuple[tuple[int, int], ...]  # resources it still holds this cycle (restarted now)
    failing: frozenset[int] = frozenset()  # nodes failing it right now: never a fallback


_Heads = list[tuple[OrderKey, int, int]]  # heap of (class head's order key, class, cursor)


@dataclass(frozen=True, slots=True)
class _Dead:
    """A pending class that failed in this cycle: its jobs from `start` on (in its queue order) are not
    tried again this cycle. Capacity and quota only shrink while a cycle admits, so they would fail
    too; a preemption's release is held for its preemptor. The next cycle tries the class again."""

    start: int
    reason: str
    code: str


class _Cycle:
    def __init__(
        self, ix: ClusterIndex, snapshot: Snapshot, now: float, config: SchedulerConfig, explain: bool
    ) -> None:
        self.ix = ix
        self.snapshot = snapshot
        self.now = now
        self.cfg = config
        self.explain = explain
        kept = ix.cycle_queues
        if kept is not None and kept[0] is snapshot.queues:  # the caller's very tuple: nothing to check
            queues, cohorts = kept[1], kept[2]
        else:
            queues = {}
            for q in snapshot.queues:
                if q.name in queues:
                    raise SnapshotError(f"queue {q.name!r} appears twice in the snapshot")
                queues[q.name] = q
            cohorts = cohorts_of(queues)
            ix.cycle_queues = (snapshot.queues, queues, cohorts)
        self.queues = queues  # read only: kept by the index for the next cycle with the same queues
        self.st = CycleState(ix)
        self.book = QuotaBook(self.st, queues, ix.usage, ix.model_usage, cohorts)
        self.weights = level_weights(snapshot.topology, config.weights)
        self.admits: list[Admit] = []
        self.preempts: list[Preempt] = []
        self.restarts: list[Restart] = []
        self.pending: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        self.tried: dict[str, dict[str, tuple[str, str, tuple[str, ...]]]] = {}  # the same by queue
        self.unavailable: set[str] = set()  # running jobs whose resources this cycle already released
        # Victims each capped (or non-preemptible) queue may still lose this cycle.
        self.budgets: dict[str, int] = {
            q.name: left for q in snapshot.queues if (left := q.preemption.budget()) is not None
        }
        self.reason_memo: dict[Hashable, tuple[str, str]] = {}
        self.stages: dict[str, int] = {}  # _stage's memo: a job's stage is fixed within a cycle
        self.preempt_fail: dict[Hashable, int] = {}
        self.admitted = 0
        self.reserved: list[str] = []  # starving jobs holding a reservation this cycle
        self.starving_at = float("inf")  # when a head that waits passes its next stage (_stage_times)
        self._admitted_keys: set[str] = set()
        self.searches = 0  # preemption searches run this cycle
        self.deferred: set[str] = set()  # jobs whose preemption search the budget deferred
        self.skipped = 0  # searches (preemption or consolidation) skipped for the budget
        # Gangs being evicted that a job waiting this cycle counts on, and whether every job that
        # might was tried (no search skipped for the budget, no admission cap): _abandon_unneeded.
        self.counted: set[str] = set()
        self.complete = True
        self.abandons: list[Abandon] = []
        self.dead: dict[tuple[str, int], _Dead] = {}  # (queue, pending class) -> failed this cycle
        self.stops: dict[str, tuple[OrderKey, str, str]] = {}  # queue -> (blocking head, reason, code)
        self.fail_reason: tuple[str, str] = ("", "")  # of the last _try that failed, for its class
        self.failed_out: dict[tuple[str, int], _Failed] = {}  # for the next cycle's memo
        self.failed_in: dict[tuple[str, int], _Failed] = {}  # the last cycle's, when still valid
        self.started_since = False  # jobs started since the last cycle (new preemption victims)
        self.repriced = False  # running jobs reported checkpoints since the last cycle
        # What changed the state so far this cycle, in order (admissions, reservations, committed
        # preemptions, recoveries), and the jobs behind those that were not admissions
        # (_Memo.holding). While the acts repeat the last cycle's, on the state it started from,
        # the state a class is tried on is the one it failed on then (`same_acts`).
        self.acts: list[Hashable] = []
        self.holding: list[Job] = []
        self.last_acts: tuple[Hashable, ...] = ()
        self.same_acts = False
        # The acts that took capacity or quota without an admission (reservations, waits for
        # preempted gangs, recoveries), in order, and how many of the last cycle's (`last_holds`)
        # this cycle repeated, as a prefix (`repeated`: the first that many were all done here too).
        # A job unchanged since may act otherwise now (an admission before it took what it needed):
        # a class that failed behind a hold not repeated yet may find its room or quota free.
        self.holds: list[Hashable] = []
        self.last_holds: tuple[Hashable, ...] = ()
        self.repeated = 0
        self.priced = 0  # preemption and consolidation searches reached (or skipped as failed)
        self.searched_queues: set[str] = set()  # queues with a failed search memo (preempt_fail)
        self.held_out = False  # the last job tried failed only because of its locality wait
        self.service = ServiceView(config.service, now, ix.levels)

    # ---- driver ---------------------------------------------------------------------------------

    def _memo_still_valid(self) -> bool:
        memo, ix = self.ix.cycle_memo, self.ix
        return (
            isinstance(memo, _Memo)
            and memo.changes == ix.changes
            and all(k in ix.jobs and ix.jobs[k].running is not None for k in memo.admitted)
            and all(ix.jobs.get(j.key) is j for j in memo.holding)
            and memo.queues == self.snapshot.queues
            and memo.config == self.cfg
            and memo.now <= self.now < memo.until
            and not self.restarts  # failover releases resources
            and ix.min_runtime_running == 0  # victims may become allowed by time alone
        )

    def run(self) -> Decisions:
        recoveries = self._failover()
        if self._memo_still_valid():
            assert isinstance(self.ix.cycle_memo, _Memo)
            self.failed_in = self.ix.cycle_memo.failed
            self.started_since = self.ix.takes != self.ix.cycle_memo.takes
            self.repriced = self.ix.reprices != self.ix.cycle_memo.reprices
            self.last_acts = self.ix.cycle_memo.acts
            self.last_holds = self.ix.cycle_memo.holds
            self.same_acts = not self.started_since
        for key in self.ix.recovering:
            job = self.ix.jobs[key]
            prev = self._indices(job.previous_placement)
            recoveries.append(_Recovery(job, self._indices_set(job.avoid_nodes), prev, job.not_before, ()))
        recoveries.sort(key=lambda r: order_key(r.job, self.ix.thresholds))
        for r in recoveries:
            self._recover(r)
        self._queues()
        self._abandon_unneeded()
        return self._decisions()

    def _indices(self, names: Iterable[str]) -> tuple[int, ...]:
        idx = self.ix.node_idx
        return tuple(idx[n] for n in names if n in idx)

    def _indices_set(self, names: Iterable[str]) -> frozenset[int]:
        return frozenset(self._indices(names))

    # ---- failover & recovery --------------------------------------------------------------------

    def _failover(self) -> list[_Recovery]:
        ix, fcfg = self.ix, self.cfg.failover
        out = []
        for f in detect(ix, self.now, fcfg):
            job = ix.jobs[f.job]
            assert job.running is not None
            not_before = self.now + backoff_seconds(job.restart_count, fcfg)
            self.restarts.append(Restart(f.job, f.nodes, f.reason, not_before=not_before))
            self.unavailable.add(f.job)
            exclude = self._indices_set(f.nodes) | self._indices_set(job.avoid_nodes)
            prev = self._indices(job.running.placement)
            failing = self._indices_set(f.nodes)
            out.append(_Recovery(job, exclude, prev, not_before, ix.job_nodes[f.job], failing))
        return out

    def _prefer_domains(self, previous: tuple[int, ...]) -> list[int]:
        """The smallest domain the job ran in, then each enclosing domain up to the cluster."""
        if not previous:
            return [0]
        tree = self.st.tree
        dom, _ = tree.common_domain(sorted(set(previous)))
        chain = []
        while dom >= 0:
            chain.append(dom)
            dom = tree.parent[dom]
        return chain

    def _recover(self, r: _Recovery) -> None:
        job, st = r.job, self.st
        self._act(("recover", job.key), job)  # it may release and take resources
        bad = self._invalid(job)
        if bad is not None:
            self._pend(job, bad, PendingCode.INVALID)
            return
        q = self.queues.get(job.queue)
        if q is None:
            self._pend(job, f"queue {job.queue} does not exist", PendingCode.QUEUE_NOT_FOUND)
            return
        if r.not_before > self.now:
            self._pend(
                job,
                f"restart back-off: next attempt in {r.not_before - self.now:.0f}s "
                f"(restart {job.restart_count + (1 if r.old else 0)})",
                PendingCode.BACKING_OFF,
            )
            return
        d = self.ix.demand[job.key]
        R = job.workers.replicas
        depth = self._required_depth(job)
        st.use_all(r.old, d, -1)  # its own terminating pods' resources: reusable by itself only
        # It keeps its nominal quota, but its model quota follows its GPUs: the new placement's models
        # must have headroom once its old share is released.
        old_models = dict(self.ix.job_models.get(job.key, ()))
        self.book.add(job.queue, 0, {m: -g for m, g in old_models.items()})
        allowed, model_reason = self._allowed_models(q, job, job.workers.total_gpus, d)
        search = self._avoiding(d, R, depth, r.exclude, r.failing, self._prefer_domains(r.previous))
        p, tiers, capped = self._place_within_model_quota(q, job, d, allowed, search)
        if p is not None:
            st.use_all(p.assign, d, 1)
            self._hold_leftovers(r.old, p.assign, d)
            self.book.add(job.queue, 0, self._models_of(p, d))
            self._admit(job, p, borrowed=0, restart=True, quota=False)
            return
        self.book.add(job.queue, 0, old_models)
        st.use_all(r.old, d, 1)  # not re-placed: the old pods hold their resources until gone
        if allowed == frozenset() or capped:
            self._pend(job, capped or model_reason, PendingCode.QUOTA_EXCEEDED)
            return
        if self._preempt(job, q, 0, d, Request(d, R, depth, 0, r.exclude), tiers) is _Outcome.WAITING:
            return
        reason, code = placement_reason(st, job, d, R, depth, tiers[-1], self.reason_memo)
        if r.exclude:
            reason += f" (avoiding {len(r.exclude)} failed nodes)"
        self._pend(job, reason, code)

    def _avoiding(
        self,
        d: Demand,
        R: int,
        depth: int | None,
        avoid: frozenset[int],
        failing: frozenset[int] = frozenset(),
        domains: Sequence[int] = (0,),
    ) -> Callable[[list[list[Pool]]], Placement | None]:
        """The placement search for a job that avoids the nodes that failed under it (`avoid`: its
        failedNodes, and those failing it now), trying `domains` in order. When nothing else fits, a
        recovered one (healthy, Ready, not flapping: placement skips unusable nodes anyway) beats
        waiting forever; a node failing it right now (`failing`) never is: its old pods still hold it."""
        st, weights = self.st, self.weights

        def search(tiers: list[list[Pool]]) -> Placement | None:
            for exclude in (avoid, failing) if avoid != failing else (avoid,):
                for dom in domains:
                    p = place(st, tiers, Request(d, R, depth, dom, exclude), weights)
                    if p is not None:
                        return p
            return None

        return search

    def _hold_leftovers(
        self, old: Iterable[tuple[int, int]], new: Iterable[tuple[int, int]], d: Demand
    ) -> None:
        """Keep what the old pods hold beyond the new placement's use until they are gone."""
        used = dict(new)
        for n, k in old:
            extra = k - used.get(n, 0)
            if extra > 0:
                self.st.use(n, d, extra)

    # ---- queues ---------------------------------------------------------------------------------

    def _queues(self) -> None:
        """Queue heads in fairness order. Each queue is walked as the heads of its pending classes
        (ClusterIndex.queued); a class whose job failed is dropped for the rest of the cycle, so a cycle
        costs O(classes + admissions), not O(pending jobs)."""
        ix, now = self.ix, self.now
        lines: dict[str, _Heads] = {}  # queue -> heap of its class heads
        for qn, classes in ix.queued.items():
            if qn not in self.queues or self.queues[qn].held:
                continue  # explained as QueueNotFound, Held (or Invalid) in _explain_queued
            strict = self.queues[qn].strategy is QueueingStrategy.STRICT_FIFO
            heads = []
            for ck, keys in classes.items():
                bad = self._invalid_class(ck, keys[0])
                if bad is not None:
                    self.dead[(qn, ck)] = _Dead(0, bad, PendingCode.INVALID)
                elif not strict and (never := self._never_fits(ix.jobs[keys[0][-1]])) is not None:
                    # A gang no node set could ever hold waits aside, like an invalid spec: it is not
                    # its queue's head, so the next job may preempt. (StrictFIFO keeps it at the head:
                    # it blocks, as it would in Kueue, but costs O(1) a cycle; see _try.)
                    self.dead[(qn, ck)] = _Dead(0, never, PendingCode.EXCEEDS_CAPACITY)
                else:
                    heads.append((keys[0], ck, 0))
            if heads:
                heapq.heapify(heads)
                lines[qn] = heads
        heap: list[tuple[tuple[int, float, int, int, float, str], str]] = []
        head_failed: set[str] = set()
        st = self.st

        def push(qn: str) -> None:
            heads = lines[qn]
            if qn in head_failed:
                # Behind a failed head a class can only be admitted: drop every class whose jobs need
                # more GPUs than the whole cluster has free, without trying them one by one.
                while heads and ix.jobs[heads[0][0][-1]].workers.total_gpus > st.free_gpus_bound:
                    ok, ck, cur = heapq.heappop(heads)
                    if self.explain:  # its reason, as trying it would give (it cannot change anything)
                        outcome = self._try(ix.jobs[ok[-1]], self.queues[qn], is_head=False)
                        assert outcome is _Outcome.FAILED
                        self.dead[(qn, ck)] = _Dead(cur + 1, *self.fail_reason)
                    else:
                        self.dead[(qn, ck)] = _Dead(cur, "", "")
            if heads:
                ok = heads[0][0]
                q = self.queues[qn]
                borrow = self.book.needs_borrow(q, ix.jobs[ok[-1]].workers.total_gpus)
                share = self.book.share(q) if borrow else 0.0
                heapq.heappush(heap, ((int(borrow), share, *ok), qn))

        for qn in sorted(lines):
            push(qn)
        while heap:
            if self.admitted >= self.cfg.max_admissions_per_cycle:
                self.complete = False
                break
            _, qn = heapq.heappop(heap)
            heads = lines[qn]
            ok, ck, cur = heads[0]
            keys = ix.queued[qn][ck]
            job = ix.jobs[ok[-1]]
            q = self.queues[qn]
            if job.not_before > now:
                self._pend_backoff(job)
                self._advance(heads, keys, ck, cur)
                push(qn)
                continue
            is_head = qn not in head_failed
            self.held_out = False
            outcome = self._try_or_recall(job, q, qn, ck, is_head)
            if outcome is not _Outcome.ADMITTED:
                local_until = self._local_until(job)
                if local_until > now:  # decide again when it stops holding out for its smallest domain
                    self.starving_at = min(self.starving_at, local_until)
            if is_head and outcome is not _Outcome.ADMITTED:
                # A waiting head may get a reservation, then moves, once it waited long enough.
                for t in self._stage_times(job):
                    if t > now:
                        self.starving_at = min(self.starving_at, t)
                        break
            if outcome is _Outcome.ADMITTED:
                self._advance(heads, keys, ck, cur)
                push(qn)
                continue
            head_failed.add(qn)
            if outcome is _Outcome.WAITING or self.held_out:
                # A gang holding out for its smallest domain says nothing of its class-mates, whose
                # waits end at other times: the next one is tried.
                self._advance(heads, keys, ck, cur)
            else:
                self.dead[(qn, ck)] = _Dead(cur + 1, *self.fail_reason)
                heapq.heappop(heads)
            if q.strategy is QueueingStrategy.STRICT_FIFO:
                self.stops[qn] = (ok, f"StrictFIFO: waiting behind {job.key}", PendingCode.BEHIND_QUEUE_HEAD)
            elif outcome is _Outcome.STARVED_ON_QUOTA:
                age = now - job.created_at
                self.stops[qn] = (
                    ok,
                    f"queue {qn} keeps its quota for {job.key}, waiting {age:.0f}s (starvation rule)",
                    PendingCode.BEHIND_QUEUE_HEAD,
                )
            else:
                push(qn)

    def _try_or_recall(self, job: Job, q: Queue, qn: str, ck: int, is_head: bool) -> _Outcome:
        """_try, or the last cycle's failure of this class when nothing that could change it did."""
        stage = self._stage(job)
        prev = self.failed_in.get((qn, ck))
        # The state it is tried on is the one it failed on last cycle: its reason's figures (free
        # GPUs, quota in use) are the same.
        exact = prev is not None and prev.exact and self.same_acts and len(self.acts) == prev.acts
        if (
            prev is not None
            and not self.preempts  # evictions free their queues' quota: a reclaim may now be allowed
            and (prev.job is job or prev.job == job)
            and prev.head == is_head
            and prev.stage == stage
            and (prev.local_until > self.now) == (self._local_until(job) > self.now)
            and prev.reserved == tuple(self.reserved)
            and prev.holds <= self.repeated
            and not (prev.priced and self.repriced)
            # An explaining cycle repeats the reason: only one found on the same state, and not a
            # locality wait's (it counts down the seconds left).
            and not (self.explain and not (exact and not prev.held_out))
            # A search is run again only while the budget allows, and one the budget skipped is
            # skipped again only with the budget spent, on the same state (and no failed search of
            # its queue this cycle that would make it fail before the budget is looked at).
            and not (prev.searched and self.searches >= self.cfg.max_preemption_searches_per_cycle)
            and not (
                prev.skipped
                and not (
                    exact
                    and self.searches >= self.cfg.max_preemption_searches_per_cycle
                    and qn not in self.searched_queues
                )
            )
            and not (
                is_head
                and self.started_since
                and preemption.may_have_victims(
                    self.ix, self.book, job, q, job.workers.total_gpus, self.service
                )
            )
        ):
            self.searches += prev.searched
            self.priced += prev.priced
            self.held_out = prev.held_out
            self._pend(job, prev.reason, prev.code)  # its reason says when it was deferred
            if prev.skipped:
                self.skipped += 1
                self.complete = False
            if prev.deferred:
                self.deferred.add(job.key)
            # Where it stands in this cycle: the next one checks the holds before it here.
            acts, holds = len(self.acts), len(self.holds)
            if prev.acts != acts or prev.holds != holds or prev.exact != exact:
                prev = replace(prev, acts=acts, holds=holds, exact=exact)
            self.failed_out[(qn, ck)] = prev
            return _Outcome.FAILED
        searches, priced, skipped, acts = self.searches, self.priced, self.skipped, len(self.acts)
        holds = len(self.holds)
        outcome = self._try(job, q, is_head)
        if outcome is _Outcome.FAILED and job.key not in self.reserved:
            self.failed_out[(qn, ck)] = _Failed(
                job,
                is_head,
                stage,
                self._local_until(job),
                self.held_out,
                self.searches > searches,
                self.priced > priced,
                self.skipped > skipped,
                job.key in self.deferred,
                acts,
                holds,
                True,
                tuple(self.reserved),
                *self.fail_reason,
            )
        return outcome

    def _act(self, act: Hashable, job: Job | None = None) -> None:
        """The cycle's state changed: `act` says how (equal acts on equal states change it equally);
        `job`, when it was not admitted, is what the next cycle's memo needs unchanged."""
        if self.same_acts:
            i = len(self.acts)
            self.same_acts = i < len(self.last_acts) and self.last_acts[i] == act
        self.acts.append(act)
        if job is not None:
            self.holding.append(job)
            self.holds.append(act)
            last, n = self.last_holds, self.repeated
            while n < len(last) and last[n] in self.holds:
                n += 1
            self.repeated = n

    def _stage_times(self, job: Job) -> tuple[float, ...]:
        """When a waiting job starts starving (starvation_seconds: a reservation) and when it may
        have gangs moved for it (consolidation.min_wait_seconds, once starving), ascending."""
        starves = job.created_at + self.cfg.starvation_seconds
        if not self.cfg.consolidation.enabled:
            return (starves,)
        return (starves, max(starves, job.created_at + self.cfg.consolidation.min_wait_seconds))

    def _stage(self, job: Job) -> int:
        """How many of its _stage_times a waiting job has passed (asked up to three times a try)."""
        stage = self.stages.get(job.key)
        if stage is None:
            stage = self.stages[job.key] = sum(self.now >= t for t in self._stage_times(job))
        return stage

    @staticmethod
    def _advance(heads: _Heads, keys: list[OrderKey], ck: int, cur: int) -> None:
        """Move a class's head to its next job (or drop the class when it has none left)."""
        if cur + 1 < len(keys):
            heapq.heapreplace(heads, (keys[cur + 1], ck, cur + 1))
        else:
            heapq.heappop(heads)

    def _invalid_class(self, ck: int, first: OrderKey) -> str | None:
        """A class's spec error: it depends only on the class and the topology levels, which stay the
        same for the index's lifetime, so the index keeps it."""
        memo = self.ix.class_invalid
        if ck not in memo:
            memo[ck] = self._invalid(self.ix.jobs[first[-1]])
        return memo[ck]

    def _explained(self) -> tuple[tuple[str, tuple[Pending, ...]], ...]:
        """Every waiting job's Pending, queue by queue (by name), each queue's in its order. A
        queue's Pendings are those of the last explaining cycle (ClusterIndex.explained) when what
        they are made of is the same: its queued jobs (ClusterIndex.queue_versions), the queue, the
        reasons this cycle's tries gave its jobs, its classes' failures (_Dead), its stop, its
        admissions, and no queued job of it in a back-off (whose reason counts down the seconds)."""
        ix = self.ix
        admitted: dict[str, set[str]] = {}
        for key in self._admitted_keys:
            admitted.setdefault(ix.jobs[key].queue, set()).add(key)
        kept, ix.explained = ix.explained, {}
        out: list[tuple[str, tuple[Pending, ...]]] = []
        for qn in sorted(ix.queued.keys() | self.tried.keys()):
            classes = ix.queued.get(qn, {})
            tried = self.tried.get(qn, {})
            made_of = (
                ix.queue_versions.get(qn, 0),
                self.queues.get(qn),
                self.stops.get(qn),
                [(ck, self.dead.get((qn, ck))) for ck in classes],
                dict(tried),
                admitted.get(qn),
                self.now if ix.backoffs.get(qn) else None,
            )
            last = kept.get(qn)
            if last is not None and last[0] == made_of:
                chunk = last[1]
            else:
                self._explain_queued(qn, classes)
                chunk = self._in_queue_order(qn, classes, admitted.get(qn, set()))
            ix.explained[qn] = (made_of, chunk)
            out.append((qn, chunk))
        return tuple(out)

    def _in_queue_order(
        self, qn: str, classes: dict[int, list[OrderKey]], admitted: set[str]
    ) -> tuple[Pending, ...]:
        """The queue's waiting jobs' Pendings with their positions: recovering jobs first, then by
        order key (a queued job's is in its class's sorted list already)."""
        ix, entries = self.ix, self.tried.get(qn, {})
        th = ix.thresholds
        others = [k for k in entries if k not in ix.job_class]  # recovering, or restarted now
        first = sorted(order_key(ix.jobs[k], th) for k in others if ix.jobs[k].recovering)
        rest = [ok for keys in classes.values() for ok in keys if ok[-1] not in admitted]
        rest += [order_key(ix.jobs[k], th) for k in others if not ix.jobs[k].recovering]
        rest.sort()
        out = []
        for pos, ok in enumerate((*first, *rest), start=1):
            reason, code, nominated = entries[ok[-1]]
            out.append(Pending(ok[-1], reason, pos, code, nominated))
        return tuple(out)

    def _explain_queued(self, qn: str, classes: dict[int, list[OrderKey]]) -> None:
        """Reasons for the queue's queued jobs the cycle did not try itself (see _Dead, stops, the
        cycle limit)."""
        ix, now = self.ix, self.now
        limit = self.cfg.max_admissions_per_cycle
        stop = self.stops.get(qn)
        for ck, keys in classes.items():
            dead = self.dead.get((qn, ck))
            for i, ok in enumerate(keys):
                key = ok[-1]
                if key in self.pending or key in self._admitted_keys:
                    continue
                job = ix.jobs[key]
                bad = self._invalid_class(ck, keys[0])
                if bad is not None:
                    self._pend(job, bad, PendingCode.INVALID)
                elif qn not in self.queues:
                    self._pend(job, f"queue {qn} does not exist", PendingCode.QUEUE_NOT_FOUND)
                elif self.queues[qn].held:
                    self._pend(job, f"queue {qn} is held: it admits no new jobs", PendingCode.HELD)
                elif stop is not None and ok > stop[0]:
                    self._pend(job, stop[1], stop[2])
                elif dead is not None and i >= dead.start:
                    if job.not_before > now:
                        self._pend_backoff(job)
                    else:
                        self._pend(job, dead.reason, dead.code)
                else:
                    self._pend(
                        job,
                        f"cycle admission limit ({limit}) reached; retried next cycle",
                        PendingCode.CYCLE_LIMIT,
                    )

    def _never_fits(self, job: Job) -> str | None:
        """Why no node set could ever hold the gang, or None. A queued job's answer is its pending
        class's (same shape and constraints) until nodes change: the index keeps it per class."""
        ix = self.ix
        ck = ix.job_class.get(job.key)
        kept = ix.class_never.get(ck) if ck is not None else None
        if kept is not None and kept[0] == ix.static_version:
            return kept[1]
        d = ix.demand[job.key]
        short = ix.never_fits(job, d)
        reason = None if short is None else capacity_reason(job.workers.replicas, d, short)
        if ck is not None:
            ix.class_never[ck] = (ix.static_version, reason)
        return reason

    def _try(self, job: Job, q: Queue, is_head: bool) -> _Outcome:
        st, book = self.st, self.book
        d = self.ix.demand[job.key]
        R = job.workers.replicas
        G = job.workers.total_gpus
        never = self._never_fits(job)
        if never is not None:  # no placement, preemption or reservation could help
            self._pend(job, never, PendingCode.EXCEEDS_CAPACITY)
            return _Outcome.FAILED
        depth = wide = self._required_depth(job)
        allowed, model_reason = self._allowed_models(q, job, G, d)
        local_until = self._local_until(job)
        if local_until > self.now:  # it holds out for its smallest domain: as if Required there
            depth = self._local_depth(d, R, st.pool_tiers(job, R, allowed)[-1])
        qc = book.check(q, G)
        quota_ok = qc.ok and allowed != frozenset()
        tiers: list[list[Pool]] | None = None
        capped = ""
        # Nodes that failed under it stay avoided after its recovery (a preemption, a drain, a
        # kubelet's refusal sends it back to its queue): docs/failover.md, "Recovery".
        avoid = self._indices_set(job.avoid_nodes) if job.avoid_nodes else frozenset()
        if quota_ok:
            p, tiers, capped = self._place_within_model_quota(
                q, job, d, allowed, self._avoiding(d, R, depth, avoid)
            )
            if p is not None:
                st.use_all(p.assign, d, 1)
                self._admit(job, p, borrowed=qc.borrowed, restart=False, quota=True)
                return _Outcome.ADMITTED
        if allowed != frozenset():
            tiers = tiers or st.pool_tiers(job, R, allowed)
            # Only a queue's head may preempt (as in Kueue): jobs behind it would evict gangs that
            # leave leftovers for borrowers to take again, a reclaim churn with no end.
            req = Request(d, R, depth, 0, avoid)
            if is_head and self._preempt(job, q, G, d, req, tiers) is _Outcome.WAITING:
                return _Outcome.WAITING
        if not quota_ok:
            if qc.ok:  # only its model quota blocks it
                self._pend(job, model_reason, PendingCode.QUOTA_EXCEEDED)
            else:
                self._pend(job, qc.reason, qc.code)
            starving = is_head and self._stage(job) >= 1
            if starving and self._quota_alone_blocks(job, q, d, R, depth, tiers):
                return _Outcome.STARVED_ON_QUOTA
            return _Outcome.FAILED
        assert tiers is not None
        if not any(p.size for p in tiers[-1]):
            el = self.ix.eligibility(job)
            if not el.nodes:
                self._pend(job, unschedulable_reason(job, el), PendingCode.NO_MATCHING_NODES)
                return _Outcome.FAILED
        reason, code = placement_reason(st, job, d, R, depth, tiers[-1], self.reason_memo)
        if depth is not None and depth != wide and code in CAPACITY_CODES:
            if place(st, tiers, Request(d, R, wide), self.weights) is None:  # it would not fit wider
                reason, code = placement_reason(st, job, d, R, wide, tiers[-1], self.reason_memo)
            else:
                self.held_out = True
                reason += (
                    f" (holds out for one {st.tree.level_name(depth)} for {local_until - self.now:.0f}s "
                    "more, then takes a wider placement: localityWaitSeconds)"
                )
        if capped or (allowed is not None and code in NEVER_CODES):
            # Only models the queue's model quota excludes could hold it.
            self._pend(job, capped or model_reason, PendingCode.QUOTA_EXCEEDED)
            return _Outcome.FAILED
        stage = self._stage(job) if is_head else 0
        if (
            stage == 2
            and code in CAPACITY_CODES
            and self._consolidate(job, q, G, d, Request(d, R, depth), tiers) is _Outcome.WAITING
        ):
            return _Outcome.WAITING
        if (
            stage >= 1
            and not self.reserved  # one reservation at a time: each one idles GPUs until it fits
            and code in CAPACITY_CODES
        ):
            held = self._reserve(job, q, d, R, depth, tiers[-1])
            if held:
                waited = self.now - job.created_at
                self._pend(job, f"{reason}; {held} GPUs reserved for it (waiting {waited:.0f}s)", code)
                self.fail_reason = (reason, code)  # what the rest of its class is told
                return _Outcome.FAILED
        elif self.reserved and code in CAPACITY_CODES:
            reason += f" (capacity reserved for starving {', '.join(self.reserved[:3])})"
        self._pend(job, reason, code)
        return _Outcome.FAILED

    def _quota_alone_blocks(
        self, job: Job, q: Queue, d: Demand, R: int, depth: int | None, tiers: list[list[Pool]] | None
    ) -> bool:
        """Would stopping q help its starving head? Only if the head fits q's nominal quota (its own
        jobs finishing make room, reclaim does the rest) and the cluster could place it now (else
        capacity, not q's other jobs, holds it back, and stopping q would only idle q's quota)."""
        gpus = job.workers.total_gpus
        if gpus > q.nominal_gpus:
            return False
        tiers = tiers or self.st.pool_tiers(job, R, None)
        return place(self.st, tiers, Request(d, R, depth), self.weights) is not None

    # ---- preemption & reservations --------------------------------------------------------------

    def _preempt(
        self, job: Job, q: Queue, quota_gpus: int, d: Demand, req: Request, tiers: list[list[Pool]]
    ) -> _Outcome:
        st, book = self.st, self.book
        if not preemption.may_have_victims(self.ix, book, job, q, quota_gpus, self.service):
            return _Outcome.FAILED
        self.priced += 1
        memo_key = (q.name, job.priority, d, req, quota_gpus, tuple(id(p) for p in tiers[-1]))
        if self.preempt_fail.get(memo_key) == st.gives:
            return _Outcome.FAILED
        if self.searches >= self.cfg.max_preemption_searches_per_cycle:
            self.deferred.add(job.key)
            self.skipped += 1
            self.complete = False
            return _Outcome.FAILED
        self.searches += 1
        protected = frozenset(name for name, left in self.budgets.items() if left <= 0)
        plan = None
        # Even every job of the queues victims may come from would not leave room: no need to list
        # the allowed ones (room_for would say no too).
        queues = preemption.victim_queues(self.ix, book, q, quota_gpus)
        if preemption.room_for_queues(st, queues, d, req.replicas, tiers[-1]):
            allowed = preemption.allowed_jobs(
                self.ix, book, job, q, quota_gpus, self.now, self.unavailable, protected, self.service
            )
        else:
            allowed = []
        if allowed and preemption.room_for(st, allowed, d, req.replicas, tiers[-1]):
            plan = preemption.search(
                st, book, job, q, quota_gpus, req, tiers[-1], self.weights, allowed, self.now
            )
        if plan is None:
            self.preempt_fail[memo_key] = st.gives
            self.searched_queues.add(q.name)
            return _Outcome.FAILED
        if not self._spend_budgets(plan):
            return _Outcome.FAILED  # it would exceed a queue's preemptions per hour: wait instead
        models = self._models_of(plan.placement, d)
        # Whether its queue's quota (not only free room) needed the victims: their reason says so.
        quota = book.check(q, quota_gpus)
        preemption.commit(st, book, plan, d, q, quota_gpus, models)
        self._act(("preempt", job, _keys(plan.victims), _keys(plan.waiting), plan.placement.assign), job)
        for v in plan.victims:
            if v.reclaim:
                why = f"reclaimed by queue {q.name} for {job.key}: queue {v.queue} runs on borrowed quota"
            else:
                rank = (
                    f"priority {job.priority} > {v.priority}"
                    if job.priority > v.priority
                    else f"priority {v.priority}, more attained service"
                )
                need = f"to free quota: {quota.reason}" if not quota.ok else "to free room on its nodes"
                why = f"preempted by {job.key} ({rank}) in queue {q.name} {need}"
            self.preempts.append(Preempt(v.key, job.key, why))
            self.unavailable.add(v.key)
        for v in plan.waiting:
            self.unavailable.add(v.key)
            self.counted.add(v.key)
        n = len(plan.victims) + len(plan.waiting)
        nodes = self.ix.nodes
        self._pend(
            job,
            f"waiting for {n} preempted gang{'s' if n != 1 else ''} to release GPUs",
            PendingCode.WAITING_FOR_PREEMPTION,
            tuple(nodes[i].name for i in plan.placement.nodes),
        )
        return _Outcome.WAITING

    def _consolidate(
        self, job: Job, q: Queue, quota_gpus: int, d: Demand, req: Request, tiers: list[list[Pool]]
    ) -> _Outcome:
        """Move small gangs so that a starving head fits (gpuq.core.consolidation): its quota holds it
        and the cluster has its GPUs free, in the wrong shape."""
        cfg, st, ix = self.cfg.consolidation, self.st, self.ix
        G = job.workers.total_gpus
        if st.free_gpus_bound < G:  # moves free no GPUs
            return _Outcome.FAILED
        if self.service.level(job) > 0:
            # Attained service puts it behind new work by design: its queue's level-0 jobs would
            # preempt it again once it ran service.min_run_seconds, undoing the moves (a head that
            # lands on several nodes is spared only by smaller jobs, not by its equals).
            return _Outcome.FAILED
        self.priced += 1
        if self.searches >= self.cfg.max_preemption_searches_per_cycle:
            self.skipped += 1
            self.complete = False
            return _Outcome.FAILED
        self.searches += 1
        plan = consolidation.search(
            st,
            req,
            tiers,
            self.weights,
            self._movers(job),
            self._mover_tiers,
            self._mover_order,
            min(G, cfg.max_moved_gpus),
        )
        if plan is None:
            return _Outcome.FAILED
        victims = [m.victim for m in plan.moves]
        pplan = preemption.Plan(
            tuple(v for v in victims if not v.evicting),
            tuple(v for v in victims if v.evicting),
            plan.placement,
            preemption.set_cost(victims),
        )
        if not self._spend_budgets(pplan):
            return _Outcome.FAILED
        preemption.commit(st, self.book, pplan, d, q, quota_gpus, self._models_of(plan.placement, d))
        moves = tuple((m.victim.key, m.target.assign) for m in plan.moves)
        self._act(("move", job, moves, plan.placement.assign), job)
        for m in plan.moves:  # the free GPUs each moved gang restarts on stay its own this cycle
            st.use_all(m.target.assign, m.victim.demand, 1)
        nodes = ix.nodes
        cleared = ", ".join(nodes[i].name for i in plan.nodes[:3]) + (" ..." if len(plan.nodes) > 3 else "")
        for v in pplan.victims:
            why = (
                f"moved to make room for {job.key} (queue {q.name}): its GPUs free up {len(plan.nodes)} "
                f"partly used node(s) ({cleared}); it restarts from its checkpoint on free GPUs elsewhere"
            )
            self.preempts.append(Preempt(v.key, job.key, why, move=True))
        self.unavailable.update(v.key for v in victims)
        self.counted.update(v.key for v in pplan.waiting)
        self._pend(
            job,
            f"waiting for {len(victims)} gang{'s' if len(victims) != 1 else ''} to move off "
            f"{len(plan.nodes)} partly used node{'s' if len(plan.nodes) != 1 else ''} (consolidation)",
            PendingCode.WAITING_FOR_PREEMPTION,
            tuple(nodes[i].name for i in plan.placement.nodes),
        )
        return _Outcome.WAITING

    def _abandon_unneeded(self) -> None:
        """Preemptions that buy nothing (issue 33): a gang being evicted that no job waiting this
        cycle counted on, and that its queue's quota (cohort rules and model quotas included, after
        this cycle's admissions) admits where it runs, keeps running: its preemptor found room
        elsewhere, went away, or no longer needs it. A preemption the quota forced is carried
        through. Decided only after a complete cycle: a job whose search the budget or the
        admission cap skipped might still count on it. Highest priority first."""
        ix, book = self.ix, self.book
        leaving = [k for k in ix.evicting if k not in self.counted and not ix.jobs[k].stopping]
        if not self.complete or not leaving:
            return
        for key in sorted(leaving, key=lambda k: (-ix.jobs[k].priority, k)):
            job = ix.jobs[key]
            q = self.queues.get(job.queue)
            if q is None or q.held:
                continue  # nothing to admit it into: its eviction goes on
            if gang_fails(ix, key, self.now, self.cfg.failover):
                continue  # kept, it would be failed over at once
            gpus = sum(k for _, k in ix.job_nodes[key]) * ix.demand[key].gpus
            models = dict(ix.job_models[key])
            headroom = book.model_headroom(q)
            if not book.admits(q, gpus) or any(g > headroom.get(m, g) for m, g in models.items()):
                continue
            book.add(q.name, gpus, models)
            self.abandons.append(
                Abandon(key, f"no job waits for its GPUs any more and queue {q.name}'s quota still admits it")
            )

    def _spend_budgets(self, plan: preemption.Plan) -> bool:
        """Count the plan's new victims against their queues' preemptions per hour; False (nothing
        spent) if a queue has fewer left than the plan takes."""
        taken = preemption.victims_per_queue(plan)
        if any(n > self.budgets[name] for name, n in taken.items() if name in self.budgets):
            return False
        for name, n in taken.items():
            if name in self.budgets:
                self.budgets[name] -= n
        return True

    def _movers(self, job: Job) -> list[preemption.Victim]:
        """Running gangs consolidation may move for `job`: on one node they do not fill, of no higher
        priority, past their minimum run (service.min_run_seconds) and allowed to stop at all."""
        ix, now = self.ix, self.now
        protected = frozenset(name for name, left in self.budgets.items() if left <= 0)
        latest = now - self.cfg.service.min_run_seconds
        out = []
        for qn, keys in ix.running_by_queue.items():
            queue = self.queues.get(qn)
            if queue is None or queue.held:
                continue  # a moved gang could not come back: its queue is gone or admits nothing
            for key in keys:
                v = ix.jobs[key]
                if key in self.unavailable or v.priority > job.priority:
                    continue
                placed = ix.job_nodes[key]
                if len(placed) != 1:
                    continue
                n, k = placed[0]
                if not 0 < ix.demand[key].gpus * k < ix.cap_gpu[n]:  # a gang that fills its node stays
                    continue
                evicting = key in ix.evicting
                assert v.running is not None
                if not evicting and (
                    v.running.started_at > latest or not preemption.may_stop(v, protected, now)
                ):
                    continue
                out.append(preemption.victim_of(ix, v, now))
        return out

    def _mover_order(self, v: preemption.Victim) -> OrderKey:
        """Where a moved gang will stand in its queue: its order key with the service it has then."""
        job = self.ix.jobs[v.key]
        return order_key(replace(job, attained_gpu_seconds=attained(job, self.now)), self.ix.thresholds)

    def _mover_tiers(self, v: preemption.Victim) -> list[list[Pool]]:
        """Where a moved gang may restart: its own constraints, on the GPU model it runs on (so its
        queue's model usage does not change)."""
        ix = self.ix
        model = ix.model[v.assign[0][0]]
        return self.st.pool_tiers(ix.jobs[v.key], sum(k for _, k in v.assign), frozenset((model,)))

    def _reserve(self, job: Job, q: Queue, d: Demand, R: int, depth: int | None, pools: list[Pool]) -> int:
        """Hold the free part of the best domain for a starving head; returns GPUs held."""
        st, tree, ix = self.st, self.st.tree, self.ix
        G = job.workers.total_gpus
        L = tree.node_depth
        best: tuple[int, int, Pool, int] | None = None  # (-free, dom, pool, depth)
        for pool in pools:
            # Its Required level, else the deepest level where some domain's capacity holds the gang.
            for t in [depth] if depth is not None else range(L, -1, -1):
                fits = self._capable(pool, t, G)
                for dom, free in fits:
                    if best is None or (-free, dom) < (best[0], best[1]):
                        best = (-free, dom, pool, t)
                if fits:
                    break
        if best is None:
            return 0
        _, dom, pool, t = best
        # The head will need whole worker slots on the nodes with the most free GPUs: hold what is free
        # on them now (partial slots too), so smaller jobs cannot keep nibbling at them.
        members = [dom] if t == L else [n for n in pool.member_list() if tree.contains(dom, n)]
        members.sort(key=lambda n: (-st.free_gpu[n], n))
        held = 0
        need = R
        taken = []
        for n in members:
            if need <= 0 or not d.gpus:
                break
            k = min(need, ix.cap_gpu[n] // d.gpus)
            take = min(max(st.free_gpu[n], 0), k * d.gpus)
            need -= k
            if take:
                st.delta(n, take, 0, 0, ())
                held += take
                taken.append((n, take))
        if not held:
            return 0
        self.book.add(q.name, G, {})
        self.reserved.append(job.key)
        self._act(("reserve", job, tuple(taken)), job)
        return held

    def _capable(self, pool: Pool, t: int, G: int) -> list[tuple[int, int]]:
        """(domain, free GPUs) of the domains at depth t whose capacity in the pool could hold G GPUs."""
        st, ix = self.st, self.ix
        if t == st.tree.node_depth:
            return [(n, st.free_gpu[n]) for n in pool.member_list() if ix.cap_gpu[n] >= G]
        return [(dom, pool.free_sum[dom]) for dom in st.tree.by_depth[t] if pool.cap_sum[dom] >= G]

    def _local_depth(self, d: Demand, R: int, pools: list[Pool]) -> int:
        """The deepest level where one domain of some pool could hold the gang's R workers on an empty
        cluster (_deepest_holding). Capacities change only with the nodes: the index keeps it per
        demand, size and pools' members until they do (static_version)."""
        ix = self.ix
        key = (d, R, tuple(bytes(p.member) for p in pools))
        kept = ix.local_depths.get(key)
        if kept is not None and kept[0] == ix.static_version:
            return kept[1]
        depth = _deepest_holding(ix, d, R, pools)
        if len(ix.local_depths) > 1024:
            ix.local_depths.clear()
        ix.local_depths[key] = (ix.static_version, depth)
        return depth

    def _local_until(self, job: Job) -> float:
        """When a multi-worker gang without a Required level stops holding out for its smallest
        domain (locality_wait_seconds after it entered its queue); 0 for none. A recovering gang
        never waits: it goes back to work first (failover prefers its old domain anyway)."""
        wait = self.cfg.locality_wait_seconds
        if wait <= 0 or job.recovering or job.workers.replicas < 2 or self._required_depth(job) is not None:
            return 0.0
        return (job.queued_since or job.created_at) + wait

    # ---- helpers --------------------------------------------------------------------------------

    def _invalid(self, job: Job) -> str | None:
        bad = invalid_workers(job.workers) or invalid_constraints(job.constraints)
        if bad is not None:
            return f"invalid spec: {bad}"
        level = job.topology.level
        if level is not None and self.st.tree.depth_of_level(level) is None:
            return f"invalid spec: topology level {level!r} is not one of {list(self.st.tree.levels)}"
        return None

    def _required_depth(self, job: Job) -> int | None:
        t = job.topology
        if t.mode is TopologyMode.REQUIRED and t.level is not None:
            return self.st.tree.depth_of_level(t.level)
        return None

    def _allowed_models(self, q: Queue, job: Job, G: int, d: Demand) -> tuple[frozenset[str] | None, str]:
        if not q.model_quotas:
            return None, ""
        headroom = self.book.model_headroom(q)
        need = d.gpus if job.constraints.mixed_models else G
        allowed = frozenset(m for m in self.ix.models if m not in headroom or headroom[m] >= need)
        if allowed == frozenset(self.ix.models):
            return None, ""
        full = frozenset(m for m in q.model_quotas if m not in allowed)
        usage = self.book.model_usage.get(q.name, {})
        return allowed, model_quota_reason(q, usage, full, need, job.constraints.mixed_models)

    def _place_within_model_quota(
        self,
        q: Queue,
        job: Job,
        d: Demand,
        allowed: frozenset[str] | None,
        search: Callable[[list[list[Pool]]], Placement | None],
    ) -> tuple[Placement | None, list[list[Pool]], str]:
        """`search` over the pools of the allowed models; a mixed gang that would overrun one model's
        quota is searched again on the models whose headroom holds the whole gang. The last item is a
        reason when no model's headroom holds it."""
        R, G = job.workers.replicas, job.workers.total_gpus
        tiers = self.st.pool_tiers(job, R, allowed)
        p = search(tiers)
        if p is None or self._within_model_quota(q, p, d):
            return p, tiers, ""
        headroom = self.book.model_headroom(q)
        over = frozenset(m for m, g in self._models_of(p, d).items() if g > headroom.get(m, g))
        capped = model_quota_reason(q, self.book.model_usage.get(q.name, {}), over, G)
        strict = self._single_model_allowed(q, G)
        if not strict:
            return None, [[]], capped
        tiers = self.st.pool_tiers(job, R, strict)
        p = search(tiers)
        return p, tiers, "" if p is not None else capped

    def _single_model_allowed(self, q: Queue, G: int) -> frozenset[str]:
        headroom = self.book.model_headroom(q)
        return frozenset(m for m in self.ix.models if m not in headroom or headroom[m] >= G)

    def _within_model_quota(self, q: Queue, p: Placement, d: Demand) -> bool:
        if not q.model_quotas:
            return True
        headroom = self.book.model_headroom(q)
        return all(g <= headroom.get(m, g) for m, g in self._models_of(p, d).items())

    def _models_of(self, p: Placement, d: Demand) -> dict[str, int]:
        out: dict[str, int] = {}
        for n, k in p.assign:
            m = self.ix.model[n]
            if m and d.gpus:
                out[m] = out.get(m, 0) + k * d.gpus
        return out

    def _admit(self, job: Job, p: Placement, borrowed: int, restart: bool, quota: bool) -> None:
        if quota:
            self.book.add(job.queue, job.workers.total_gpus, self._models_of(p, self.ix.demand[job.key]))
            self.admitted += 1
        nodes = self.ix.nodes
        self.admits.append(Admit(job.key, tuple(nodes[n].name for n in p.nodes), p.cost, borrowed, restart))
        self._admitted_keys.add(job.key)
        self._act(("admit", job, p.assign, restart, quota))

    def _pend_backoff(self, job: Job) -> None:
        self._pend(
            job, f"back-off: next attempt in {job.not_before - self.now:.0f}s", PendingCode.BACKING_OFF
        )

    def _pend(self, job: Job, reason: str, code: str, nominated: tuple[str, ...] = ()) -> None:
        if job.key in self.deferred:
            reason += "; preemption search deferred to the next cycle (per-cycle budget used)"
        entry = self.pending[job.key] = (reason, code, nominated)
        q = self.tried.get(job.queue)
        if q is None:
            q = self.tried[job.queue] = {}
        q[job.key] = entry
        self.fail_reason = (reason, code)

    # ---- output ---------------------------------------------------------------------------------

    def _decisions(self) -> Decisions:
        ix = self.ix
        by_queue = self._explained() if self.explain else ()
        usage = {qn: self.book.used(qn) for qn in sorted(self.queues)}
        borrowed = {qn: self.book.borrowed(q) for qn, q in sorted(self.queues.items())}
        wake = min(self.starving_at, _next_running_event(ix, self.cfg, self.now))
        return Decisions(
            admit=tuple(self.admits),
            preempt=tuple(self.preempts),
            restart=tuple(self.restarts),
            pending=tuple(p for _, chunk in by_queue for p in chunk),
            pending_by_queue=by_queue,
            abandon=tuple(self.abandons),
            queue_usage=usage,
            queue_borrowed=borrowed,
            wake_at=wake if wake != float("inf") else None,
        )
