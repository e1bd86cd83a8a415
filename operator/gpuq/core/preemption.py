"""Preemption: the cheapest set of whole gangs whose eviction lets a job in, simulated before it is decided.

Allowed victims of job J in queue q (docs/scheduling.md, "Preemption"):
- within the queue, if q's withinQueue policy is LowerPriority: running jobs of q with lower priority,
  and (ServiceOrdering with preempt) jobs of q's priority at a higher attained-service level than J
  that ran min_run_seconds in their current attempt, except (spare_larger_gangs) a gang on several
  nodes holding more GPUs than J needs (gpuq.core.service.ServiceView.outranked);
- reclaim, if J fits q's nominal quota and q's reclaimWithinCohort is not Never: running jobs of cohort
  peers that borrow (usage above their nominal; a peer stops being a source once it is back at nominal),
  of lower priority than J under LowerPriority, of any priority under Any; a peer that is back at
  nominal only because some of its gangs are being evicted still offers those (free) gangs, so J
  waits for them as a within-queue preemptor does;
- never a non-preemptible job, a job of a non-preemptible queue or of a queue that lost its
  maxPreemptionsPerHour in the last hour (a plan that would exceed a cap is dropped: the job waits),
  one younger than its minRuntimeSeconds, or one admitted, restarted or
  already chosen as a victim in this cycle. Jobs already being evicted that J could have chosen are free
  victims (cost 0): J waits for them instead of preempting more.

Search: candidate domains are those at the job's target depths (Required: its level; Preferred: one
node, then rack, block, zone, cluster, stopping at the first depth with a feasible set) that hold a
victim and could hold J by capacity. For each, its victims are added in cost order (priority,
GPU-seconds lost since their last checkpoint, more GPUs first) until its GPU slots suffice; if q is
short of quota, q's cheapest own victims covering the shortfall are added. Domains are estimated in
order of a lower bound on their cost, until VERIFY_BATCH estimates reach the next bound (or a work
budget is spent). The cheapest estimates are then verified on a statement (evict, place, roll back),
extended if CPU/memory still block, and pruned (most expensive first, keep out every victim the job
fits without). The cheapest verified set by (highest victim priority, GPU-seconds lost, number of
victims) wins and is committed.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gpuq.core.fit import Demand
from gpuq.core.index import ClusterIndex
from gpuq.core.model import Job, Queue, ReclaimPreemption, WithinQueuePreemption
from gpuq.core.placement import Placement, Request, place_in_pool
from gpuq.core.pools import Pool
from gpuq.core.quota import QuotaBook
from gpuq.core.service import ServiceView
from gpuq.core.state import CycleState

VERIFY_BATCH = 8  # estimated-cheapest candidate domains verified per depth before taking the best
# Work bound per depth: once VERIFY_BATCH estimates exist, stop after this many victims were walked.
ESTIMATE_BUDGET = 20_000
Cost = tuple[float, float, int]


class Victim(NamedTuple):
    """A candidate victim. A NamedTuple (thousands are built per search) whose leading fields are its
    cost order, so a list of them sorts cheapest first without a key function."""

    paying: bool  # False for a job already being evicted: free, sorts first
    priority: int
    lost: float  # GPU-seconds of work lost since its last checkpoint (0 if already evicting)
    neg_gpus: int  # larger victims first on ties
    key: str
    queue: str
    gpus: int
    assign: tuple[tuple[int, int], ...]
    demand: Demand
    reclaim: bool  # chosen as borrowed capacity of a cohort peer (else: lower priority in the queue)
    models: tuple[tuple[str, int], ...]

    @property
    def evicting(self) -> bool:
        return not self.paying


@dataclass(frozen=True, slots=True)
class Plan:
    victims: tuple[Victim, ...]  # new victims to evict
    waiting: tuple[Victim, ...]  # already evicting, now counted on by this job
    placement: Placement
    cost: Cost


def may_have_victims(
    ix: ClusterIndex,
    book: QuotaBook,
    job: Job,
    q: Queue,
    quota_gpus: int,
    service: ServiceView | None = None,
) -> bool:
    """A cheap necessary condition for allowed_jobs to find any: O(priorities + 1), not O(jobs)
    (the attained-service part is computed once per queue and cycle by `service`)."""
    if q.preemption.within_queue is WithinQueuePreemption.LOWER_PRIORITY:
        prios = ix.running_priorities.get(q.name)
        if prios and min(prios) < job.priority:
            return True
        if prios and job.priority in prios and ix.config.service.preempts:
            if service is None:
                return True  # no cycle view at hand: assume some job of the queue outranks it
            own = ix.running_by_queue.get(q.name, ())
            if service.outranks_any(q.name, (ix.jobs[k] for k in own), job):
                return True
    if (
        q.cohort is None
        or q.preemption.reclaim_within_cohort is ReclaimPreemption.NEVER
        or book.used(q.name) + quota_gpus > q.nominal_gpus
    ):
        return False
    if book.cohort_borrowed[q.cohort] > book.borrowed(q):  # some peer borrows
        return True
    # Or a peer borrowed until some of its gangs started leaving: J may wait for them.
    leaving = ix.evicting_usage
    return bool(leaving) and any(
        reclaimed_by_eviction(book, p, leaving) for p in book.cohorts[q.cohort] if p.name != q.name
    )


def reclaimed_by_eviction(book: QuotaBook, peer: Queue, leaving: Mapping[str, int]) -> bool:
    """The peer borrowed, counting its gangs being evicted: their GPUs return borrowed quota, so a
    reclaimer may wait for them (they are free victims) instead of preempting more."""
    gone = leaving.get(peer.name, 0)
    return gone > 0 and book.used(peer.name) + gone > peer.nominal_gpus


def allowed_jobs(
    ix: ClusterIndex,
    book: QuotaBook,
    job: Job,
    q: Queue,
    quota_gpus: int,
    now: float,
    unavailable: set[str],
    protected: frozenset[str] = frozenset(),
    service: ServiceView | None = None,
) -> list[tuple[Job, bool]]:
    """The running jobs job may preempt, with whether each is a reclaim, unsorted (`victims` makes
    them Victims, sorted cheapest first: already-evicting ones first, at cost 0).
    `protected`: queues whose jobs may not be taken now (non-preemptible, or out of preemptions).
    `service`: the cycle's ServiceView (built here when not given)."""
    keys: list[tuple[str, bool]] = []
    within = q.preemption.within_queue is WithinQueuePreemption.LOWER_PRIORITY
    outranked: dict[str, int] = {}  # own-queue jobs above J's attained-service level
    if within:
        own = ix.running_by_queue.get(q.name, set())
        sv = service or ServiceView(ix.config.service, now)
        outranked = sv.outranked(q.name, (ix.jobs[k] for k in own), job)
        prios = ix.running_priorities.get(q.name)
        if prios and min(prios) < job.priority:
            keys.extend((k, False) for k in own)
        else:  # no lower priority in the queue: only jobs above J's level can be victims
            keys.extend((k, False) for k in sorted(outranked))
    policy = q.preemption.reclaim_within_cohort
    for peer, leaving_only in reclaim_peers(ix, book, q, quota_gpus):
        running = ix.running_by_queue.get(peer, ())
        keys.extend((k, True) for k in running if not leaving_only or k in ix.evicting)
    out = []
    jobs, evicting_set = ix.jobs, ix.evicting
    any_priority = policy is ReclaimPreemption.ANY
    for key, reclaim in keys:
        if key in unavailable:
            continue
        v = jobs[key]
        if (
            v.priority >= job.priority
            and not (reclaim and any_priority)
            and not (not reclaim and v.priority == job.priority and key in outranked)
        ):
            continue
        if key not in evicting_set and not may_stop(v, protected, now):
            continue
        out.append((v, reclaim))
    return out


def victims(ix: ClusterIndex, allowed: Iterable[tuple[Job, bool]], now: float) -> list[Victim]:
    """allowed_jobs' jobs as victims, sorted cheapest first."""
    out = [victim_of(ix, v, now, reclaim) for v, reclaim in allowed]
    out.sort()
    return out


def room_for(
    st: CycleState, allowed: Iterable[tuple[Job, bool]], demand: Demand, replicas: int, pools: Sequence[Pool]
) -> bool:
    """Whether evicting every allowed victim at once could leave GPU slots for the gang in one of the
    pools. A search places whole workers on GPUs the victims it picks (a subset) release, so when
    even all of them leave fewer than `replicas` slots, no search can succeed: an exact necessary
    condition, O(victims + pool nodes), that spares most failing searches their whole cost."""
    if demand.gpus <= 0:
        return True
    ix = st.ix
    released: dict[int, int] = {}
    for v, _ in allowed:
        for n, k in ix.job_nodes[v.key]:
            released[n] = released.get(n, 0) + k * ix.demand[v.key].gpus
    return _room(st, released, demand.gpus, replicas, pools)


def reclaim_peers(ix: ClusterIndex, book: QuotaBook, q: Queue, quota_gpus: int) -> list[tuple[str, bool]]:
    """The cohort peers a job of q needing quota_gpus may reclaim from, each with whether only its
    gangs already leaving may go: a peer over its nominal quota gives any running job; one back
    within it once its leaving gangs are gone gives those, as free victims."""
    if (
        q.cohort is None
        or q.preemption.reclaim_within_cohort is ReclaimPreemption.NEVER
        or book.used(q.name) + quota_gpus > q.nominal_gpus
    ):
        return []
    out = []
    for peer in book.cohorts[q.cohort]:
        if peer.name == q.name:
            continue
        if book.used(peer.name) > peer.nominal_gpus:
            out.append((peer.name, False))
        elif reclaimed_by_eviction(book, peer, ix.evicting_usage):
            out.append((peer.name, True))
    return out


def victim_queues(ix: ClusterIndex, book: QuotaBook, q: Queue, quota_gpus: int) -> list[str]:
    """The queues whose running jobs allowed_jobs may return for a job of q (a superset: it looks at
    no priority, level, minimum run or budget)."""
    out = [q.name] if q.preemption.within_queue is WithinQueuePreemption.LOWER_PRIORITY else []
    return out + [peer for peer, _ in reclaim_peers(ix, book, q, quota_gpus)]


def room_for_queues(
    st: CycleState, queues: Iterable[str], demand: Demand, replicas: int, pools: Sequence[Pool]
) -> bool:
    """room_for with every running job of `queues` as a victim: GPUs released only grow with the set
    of victims, and so do the slots, so when this is False room_for is False for any victims drawn
    from those queues. O(nodes the queues run on), from the index's per-queue GPU counts: it spares
    a head that cannot find room even the list of its allowed victims."""
    if demand.gpus <= 0:
        return True
    held = st.ix.queue_node_gpus
    names = list(queues)
    if len(names) == 1:  # most heads: their own queue's counts, read as they are
        return _room(st, held.get(names[0], {}), demand.gpus, replicas, pools)
    released: dict[int, int] = {}
    for qn in names:
        for n, gpus in held.get(qn, {}).items():
            released[n] = released.get(n, 0) + gpus
    return _room(st, released, demand.gpus, replicas, pools)


def _room(st: CycleState, released: Mapping[int, int], g: int, replicas: int, pools: Sequence[Pool]) -> bool:
    """Whether some pool would hold `replicas` workers of g GPUs with `released` GPUs freed per node."""
    free = st.free_gpu
    for pool in pools:
        member = pool.member
        slots = pool.slots(0, g, replicas)  # the whole cluster's (domain 0) free slots now
        for n, r in released.items():
            if member[n]:
                now = free[n]
                then = now + r
                # max(then, 0) // g - max(now, 0) // g, without two calls per node
                slots += (then // g if then > 0 else 0) - (now // g if now > 0 else 0)
        if slots >= replicas:
            return True
    return False


def may_stop(job: Job, protected: frozenset[str], now: float) -> bool:
    """Whether a running job may be stopped at all now (by preemption or to be moved): preemptible,
    its queue not protected, past its minRuntimeSeconds."""
    running = job.running
    assert running is not None
    return (
        job.preemptible and job.queue not in protected and now - running.started_at >= job.min_runtime_seconds
    )


def victim_of(ix: ClusterIndex, job: Job, now: float, reclaim: bool = False) -> Victim:
    """A running job as a victim: its cost is the work lost since its last checkpoint (0 when it is
    already being evicted)."""
    running = job.running
    assert running is not None
    key = job.key
    evicting = key in ix.evicting
    d = ix.demand[key]
    gpus = len(running.placement) * d.gpus
    if evicting:
        lost = 0.0
    else:
        ckpt = job.checkpoint
        since = running.started_at if ckpt is None or ckpt.time < running.started_at else ckpt.time
        lost = (now - since if now > since else 0.0) * gpus
    return Victim(
        not evicting,
        job.priority,
        lost,
        -gpus,
        key,
        job.queue,
        gpus,
        ix.job_nodes[key],
        d,
        reclaim,
        ix.job_models[key],
    )


def victims_per_queue(plan: Plan) -> dict[str, int]:
    """New victims (not already evicting) of the plan, by queue."""
    out: dict[str, int] = {}
    for v in plan.victims:
        if not v.evicting:
            out[v.queue] = out.get(v.queue, 0) + 1
    return out


NO_VICTIMS: Cost = (float("-inf"), 0.0, 0)  # the cost of a set without new victims: the least there is


def set_cost(victims: Sequence[Victim]) -> Cost:
    new = [v for v in victims if not v.evicting]
    if not new:
        return NO_VICTIMS
    return (float(max(v.priority for v in new)), sum(v.lost for v in new), len(new))


class _Search:
    """One preemption search for one job (state is only changed inside statements it rolls back)."""

    def __init__(
        self,
        st: CycleState,
        book: QuotaBook,
        job: Job,
        q: Queue,
        quota_gpus: int,
        req: Request,
        weights: Sequence[float],
        cands: list[Victim],
    ) -> None:
        self.st, self.book, self.job, self.q = st, book, job, q
        self.quota_gpus = quota_gpus
        self.req = req
        self.weights = weights
        self.cands = cands
        self.quota_set: list[int] = []

    # -- statement helpers --

    def _release(self, v: Victim, sign: int) -> None:
        self.st.use_all(v.assign, v.demand, -sign)
        if not v.evicting:
            self.book.add(v.queue, -sign * v.gpus, {m: -sign * g for m, g in v.models})

    def _quota_ok(self) -> bool:
        return self.book.admits(self.q, self.quota_gpus)

    def _try(self, pool: Pool, dom: int, depth: int | None) -> Placement | None:
        if not self._quota_ok():
            return None
        r = self.req
        return place_in_pool(
            self.st, pool, Request(r.demand, r.replicas, depth, dom, r.exclude), self.weights
        )

    def _still_allowed(self, v: Victim, released_from: Mapping[str, int]) -> bool:
        if not v.reclaim or v.evicting:
            return True
        peer = self.book.queues[v.queue]
        return self.book.used(v.queue) - released_from.get(v.queue, 0) > peer.nominal_gpus

    # -- estimate --

    def estimate(self, pool: Pool, dom: int, node: int, bucket: list[int]) -> list[int] | None:
        """Greedy victims (indices into cands) for the domain, or None if even all of them do not do.
        node >= 0: the target is that single node (domain = its rack). The domain's candidates are
        taken in cost order until the gang's GPU slots suffice; if the job's own queue is short of
        quota, the cheapest victims that cover it (`quota_set`) are added (verification prunes extras)."""
        st, tree, req = self.st, self.st.tree, self.req
        g, R = req.demand.gpus, req.replicas
        if not g:
            slots = R
        elif node >= 0:
            slots = max(st.free_gpu[node], 0) // g if pool.member[node] and node not in req.exclude else 0
        else:
            slots = pool.slots(dom, g, R)
        chosen: list[int] = []
        if slots < R:
            rel: dict[int, int] = {}
            released_from: dict[str, int] = {}
            for ci in bucket:
                v = self.cands[ci]
                if not self._still_allowed(v, released_from):
                    continue
                chosen.append(ci)
                for n, k in v.assign:
                    inside = n == node if node >= 0 else tree.contains(dom, n)
                    if inside and pool.member[n] and n not in req.exclude:
                        before = max(st.free_gpu[n] + rel.get(n, 0), 0) // g
                        rel[n] = rel.get(n, 0) + k * v.demand.gpus
                        slots += max(st.free_gpu[n] + rel[n], 0) // g - before
                if not v.evicting:
                    released_from[v.queue] = released_from.get(v.queue, 0) + v.gpus
                if slots >= R:
                    break
            if slots < R:
                return None
        if self.quota_set:
            taken = set(chosen)
            chosen.extend(ci for ci in self.quota_set if ci not in taken)
        return chosen

    def _quota_victims(self) -> list[int] | None:
        """The cheapest victims whose release lets the queue's quota admit the job: its own
        lower-priority work, or (reclaim) cohort peers' work running on GPUs this queue lent them.
        Simulated on the quota book and rolled back; [] if the quota admits the job already, None if
        even all of them do not do."""
        if self._quota_ok():
            return []
        mark = self.st.begin()
        try:
            out: list[int] = []
            for ci, v in enumerate(self.cands):
                if v.evicting or (v.queue != self.q.name and not v.reclaim):
                    continue
                if not self._still_allowed(v, {}):
                    continue  # that peer no longer borrows
                self._release(v, 1)
                out.append(ci)
                if self._quota_ok():
                    return out
            return None
        finally:
            self.st.rollback(mark)

    # -- verification --

    def verify(
        self, pool: Pool, dom: int, depth: int | None, chosen: list[int], bucket: list[int]
    ) -> tuple[list[int], Placement] | None:
        """Evict, place, extend if still short, prune; always rolls back. (final victims, placement)."""
        st = self.st
        mark = st.begin()
        for ci in chosen:
            self._release(self.cands[ci], 1)
        p = self._try(pool, dom, depth)
        taken = set(chosen)
        extra = [ci for ci in bucket if ci not in taken]
        for ci in extra:
            if p is not None:
                break
            if not self._still_allowed(self.cands[ci], {}):
                continue
            self._release(self.cands[ci], 1)
            chosen = [*chosen, ci]
            p = self._try(pool, dom, depth)
        if p is None:
            st.rollback(mark)
            return None
        final = list(chosen)
        for ci in reversed(chosen):
            self._release(self.cands[ci], -1)
            again = self._try(pool, dom, depth)
            if again is None:
                self._release(self.cands[ci], 1)
            else:
                final.remove(ci)
                p = again
        st.rollback(mark)
        return final, p

    # -- search --

    def _buckets(self, t: int) -> tuple[dict[int, list[int]], dict[int, tuple[int, float]]]:
        """Candidate indices per domain at depth t (per node at the node depth), in cost order, and per
        domain (largest paying candidate in GPUs, smallest GPU-seconds lost per GPU) for lower bounds."""
        tree, within = self.st.tree, self.req.within
        anc, L = tree.ancestors, tree.node_depth
        everywhere = within == 0
        buckets: dict[int, list[int]] = {}
        bounds: dict[int, tuple[int, float]] = {}

        for ci, v in enumerate(self.cands):
            assign = v.assign
            if len(assign) == 1:  # most victims sit on one node
                n = assign[0][0]
                doms: Iterable[int] = (
                    (n if t == L else anc[n][t],) if everywhere or tree.contains(within, n) else ()
                )
            else:
                doms = {
                    n if t == L else anc[n][t] for n, _ in assign if everywhere or tree.contains(within, n)
                }
            for dom in doms:
                bucket = buckets.get(dom)
                if bucket is None:
                    buckets[dom] = [ci]
                else:
                    bucket.append(ci)
                if v.paying and v.gpus:
                    bound = bounds.get(dom)
                    rate = v.lost / v.gpus
                    if bound is None:
                        bounds[dom] = (v.gpus, rate)
                    elif v.gpus > bound[0] or rate < bound[1]:
                        bounds[dom] = (max(bound[0], v.gpus), min(bound[1], rate))
        return buckets, bounds

    def _lower_bound(
        self, bucket: list[int], bound: tuple[int, float], need: int, quota_cost: Cost, quota: set[int]
    ) -> Cost:
        """No victim set of this domain costs less. Its victims have at least the priority of its
        cheapest candidate (candidates are sorted) and must free `need` GPUs there: each GPU loses at
        least the domain's smallest per-GPU loss, and no victim is larger than its largest."""
        v = self.cands[bucket[0]]
        if v.evicting or bucket[0] in quota:
            return quota_cost
        big, rate = bound
        lost = max(v.lost, need * rate)
        count = max(1, -(-need // big)) if big else 1
        if not quota:
            return (float(v.priority), lost, count)
        return (max(quota_cost[0], float(v.priority)), quota_cost[1] + lost, quota_cost[2] + count)

    def _unbeatable(self, cost: Cost, p: Placement, bounds: Sequence[Cost]) -> bool:
        """Whether no domain still to verify could give a plan that replaces this one, so their
        verifications are skipped. It must sit on one node (every one-node placement ties on depth and
        communication cost, and a tie keeps the first), and cost nothing (no new victim) or no more
        than every remaining domain's lower bound (a true bound only without quota victims: pruning
        may find a cheaper quota set than the greedy one the bound counts)."""
        if p.depth != self.st.tree.node_depth:
            return False
        return cost == NO_VICTIMS or (not self.quota_set and all(cost <= lb for lb in bounds))

    def run(self, pools: Sequence[Pool]) -> Plan | None:
        tree, req = self.st.tree, self.req
        L = tree.node_depth
        g, R = req.demand.gpus, req.replicas
        start = tree.depth[req.within]
        if req.required_depth is not None:
            depths: Sequence[int] = range(L, max(req.required_depth, start) - 1, -1)
        else:
            depths = range(L, start - 1, -1)
        quota_set = self._quota_victims()
        if quota_set is None or not any(p.size for p in pools):
            return None  # even evicting every allowed victim leaves the quota short
        self.quota_set = quota_set
        quota_members = set(quota_set)
        quota_cost = set_cost([self.cands[ci] for ci in quota_set])
        gpus_needed = g * R
        cap_gpu = self.st.ix.cap_gpu
        for t in depths:
            buckets, bounds = self._buckets(t)
            # (lower bound, pool, bucket key): domains that could ever hold the job, cheapest first.
            order: list[tuple[Cost, int, int]] = []
            for pi, pool in enumerate(pools):
                for key, bucket in buckets.items():
                    if t == L:
                        if not pool.member[key] or (g and cap_gpu[key] // g < R):
                            continue
                        free = self.st.free_gpu[key]
                    elif g and pool.cap_sum[key] // g < R:
                        continue
                    else:
                        free = pool.free_sum[key]
                    need = max(0, gpus_needed - max(free, 0))
                    lb = self._lower_bound(bucket, bounds.get(key, (0, 0.0)), need, quota_cost, quota_members)
                    order.append((lb, pi, key))
            order.sort()
            # Estimate in that order until VERIFY_BATCH estimates exist that no later domain can beat.
            estimates: list[tuple[Cost, int, int, list[int], Cost]] = []
            walked = 0
            for lb, pi, key in order:
                if len(estimates) >= VERIFY_BATCH and (
                    lb >= estimates[VERIFY_BATCH - 1][0] or walked >= ESTIMATE_BUDGET
                ):
                    break
                dom, node = (tree.ancestors[key][-1], key) if t == L else (key, -1)
                chosen = self.estimate(pools[pi], dom, node, buckets[key])
                walked += len(buckets[key]) if chosen is None else len(chosen)
                if chosen is not None:
                    cost = set_cost([self.cands[ci] for ci in chosen])
                    bisect.insort(estimates, (cost, pi, key, chosen, lb))
            best: tuple[Cost, list[int], Placement] | None = None
            for tried, (_, pi, key, chosen, _) in enumerate(estimates):
                if best is not None and tried >= VERIFY_BATCH:
                    break
                dom, node = (tree.ancestors[key][-1], key) if t == L else (key, -1)
                depth = L if node >= 0 else req.required_depth
                got = self.verify(pools[pi], dom, depth, chosen, buckets[key])
                if got is None:
                    continue
                final, p = got
                c = set_cost([self.cands[ci] for ci in final])
                if best is None or (c, -p.depth, p.cost) < (best[0], -best[2].depth, best[2].cost):
                    best = (c, final, p)
                    if self._unbeatable(c, p, [e[4] for e in estimates[tried + 1 : VERIFY_BATCH]]):
                        break
            if best is not None:
                return self._plan(*best)
        return None

    def _plan(self, cost: Cost, final: list[int], p: Placement) -> Plan:
        victims = [self.cands[ci] for ci in final]
        new, leaving = tuple(v for v in victims if not v.evicting), tuple(v for v in victims if v.evicting)
        return Plan(new, leaving, p, cost)

    def waiting_on_one_node(self, pools: Sequence[Pool], paying: Iterable[int]) -> Plan | None:
        """_waiting_plan's search: `cands` are the allowed gangs already leaving, `paying` the nodes
        the other allowed victims run on. With the quota free, run() estimates first the nodes whose
        cheapest victim is leaving, in (pool, node) order; the first whose leaving gangs suffice is
        verified first (no estimate is cheaper) unless a node before it has room with no victim at
        all, and a one-node plan without new victims is never replaced. So when that verification
        needs no other victim, its plan is run()'s; anything else is left to run() (None)."""
        st, req = self.st, self.req
        tree = st.tree
        L = tree.node_depth
        g, R = req.demand.gpus, req.replicas
        cap_gpu, free = st.ix.cap_gpu, st.free_gpu
        buckets, _ = self._buckets(L)
        others = {n for n in paying if n not in buckets and (req.within == 0 or tree.contains(req.within, n))}
        nodes = sorted(buckets.keys() | others)
        for pool in pools:
            for key in nodes:
                if not pool.member[key] or cap_gpu[key] // g < R:
                    continue
                if key in others:  # its cheapest victim is a new one
                    if key not in req.exclude and max(free[key], 0) // g >= R:
                        return None  # its estimate takes no victim either, and may come first
                    continue
                dom = tree.ancestors[key][-1]
                chosen = self.estimate(pool, dom, key, buckets[key])
                if chosen is None:
                    continue  # its leaving gangs do not suffice: run() prices new victims there
                got = self.verify(pool, dom, L, chosen, buckets[key])
                if got is None or got[1].depth != L:
                    return None  # it needs new victims, or run() decides between domains
                return self._plan(NO_VICTIMS, *got)
        return None


def search(
    st: CycleState,
    book: QuotaBook,
    job: Job,
    q: Queue,
    quota_gpus: int,
    req: Request,
    pools: Sequence[Pool],
    weights: Sequence[float],
    allowed: Sequence[tuple[Job, bool]],
    now: float,
) -> Plan | None:
    """The cheapest verified preemption plan for job among its allowed victims (allowed_jobs), or
    None. Leaves the state unchanged. A plan that waits on one node for gangs already being evicted
    (a preemptor waiting for its victims: most plans) comes from those gangs alone (_waiting_plan)."""
    if not allowed:
        return None
    args = (st, book, job, q, quota_gpus, req, weights)
    plan = _waiting_plan(args, pools, allowed, now)
    return plan if plan is not None else _Search(*args, victims(st.ix, allowed, now)).run(pools)


def _waiting_plan(
    args: tuple[CycleState, QuotaBook, Job, Queue, int, Request, Sequence[float]],
    pools: Sequence[Pool],
    allowed: Sequence[tuple[Job, bool]],
    now: float,
) -> Plan | None:
    """_Search.run()'s plan when it waits on one node for gangs already leaving, found from them
    alone: the other victims are not priced, sorted or bucketed; None when that is not sure. (The
    estimates' work budget of run() cannot bind here: the guard below keeps it out of reach.)"""
    st, book, _, q, quota_gpus, req, _ = args
    ix = st.ix
    if not req.demand.gpus or not book.admits(q, quota_gpus):
        return None  # run() would add the cheapest quota victims first
    leaving: list[Victim] = []
    paying: set[int] = set()
    for v, reclaim in allowed:
        if v.key in ix.evicting:
            leaving.append(victim_of(ix, v, now, reclaim))
        else:
            paying.update(n for n, _ in ix.job_nodes[v.key])
    if not leaving or len(pools) * sum(len(ix.job_nodes[v.key]) for v, _ in allowed) >= ESTIMATE_BUDGET:
        return None
    leaving.sort()
    return _Search(*args, leaving).waiting_on_one_node(pools, paying)


def commit(
    st: CycleState,
    book: QuotaBook,
    plan: Plan,
    job_demand: Demand,
    q: Queue,
    quota_gpus: int,
    models: Mapping[str, int],
) -> None:
    """Evict the plan's victims, reserve the job's placement and quota, and hold whatever the victims
    free but the job does not use until their pods are really gone (nobody else may bind there yet)."""
    mark = st.begin()
    freed: dict[int, list[int]] = {}
    freed_extra: dict[int, dict[str, int]] = {}
    for v in (*plan.victims, *plan.waiting):
        st.use_all(v.assign, v.demand, -1)
        if not v.evicting:
            book.add(v.queue, -v.gpus, {m: -g for m, g in v.models})
        for n, k in v.assign:
            acc = freed.setdefault(n, [0, 0, 0])
            acc[0] += v.demand.gpus * k
            acc[1] += v.demand.cpu * k
            acc[2] += v.demand.mem * k
            for name, amount in v.demand.extra:
                fx = freed_extra.setdefault(n, {})
                fx[name] = fx.get(name, 0) + amount * k
    p = plan.placement
    st.use_all(p.assign, job_demand, 1)
    used = dict(p.assign)
    for n, (g, c, m) in sorted(freed.items()):
        k = used.get(n, 0)
        extra = tuple(
            (name, amount - dict(job_demand.extra).get(name, 0) * k)
            for name, amount in sorted(freed_extra.get(n, {}).items())
        )
        st.delta(
            n,
            max(0, g - job_demand.gpus * k),
            max(0, c - job_demand.cpu * k),
            max(0, m - job_demand.mem * k),
            tuple((name, a) for name, a in extra if a > 0),
        )
    book.add(q.name, quota_gpus, models)
    st.commit(mark)
