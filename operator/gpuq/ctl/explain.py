"""`gpuq explain NAMESPACE/JOB`: why a job waits and what would change that, or, for a running job,
where it runs and what could take it off. Pure: everything comes from a State (the operator's
snapshot and the core's decisions), and the what-ifs re-run the same core on edited snapshots."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuq.api.trainingjob import FINISHED_PHASES, PLACED_PHASES, Phase
from gpuq.controller.objects import JobEntry
from gpuq.controller.preemption import STOPS
from gpuq.controller.snapshot import SUSPENDED
from gpuq.core import preemption
from gpuq.core.decisions import CAPACITY_CODES, NEVER_CODES, Decisions, PendingCode
from gpuq.core.model import Job, Queue, ReclaimPreemption, WithinQueuePreemption
from gpuq.core.quota import QuotaBook, lendable, lent_out
from gpuq.core.reasons import counted
from gpuq.core.scheduler import schedule
from gpuq.core.state import CycleState
from gpuq.ctl.state import State

# What-if runs of the core per explanation (each is a whole cycle on an edited snapshot).
MAX_WHAT_IFS = 24
SHOW = 8  # jobs named per list


@dataclass
class Explanation:
    job: str
    phase: str
    code: str | None
    summary: str
    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def add(self, title: str, lines: Sequence[str], **data: Any) -> None:
        if lines:
            self.sections.append((title, list(lines)))
        self.data.update(data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "phase": self.phase,
            "reason": self.code,
            "summary": self.summary,
            "sections": {title: lines for title, lines in self.sections},
            **self.data,
        }


def explain(state: State, key: str) -> Explanation:
    entry = state.cache.jobs[key]
    phase = str(entry.status.phase or Phase.QUEUED)
    if entry.status.phase in FINISHED_PHASES:
        return Explanation(key, phase, None, entry.status.message or phase.lower())
    if entry.status.phase in PLACED_PHASES:
        return _running(state, entry)
    return _waiting(state, entry)


# ---- waiting jobs ------------------------------------------------------------------------------------


def _waiting(state: State, entry: JobEntry) -> Explanation:
    key = entry.key
    excluded = state.view.excluded.get(key)
    if excluded is not None:
        ex = Explanation(key, str(entry.status.phase or Phase.QUEUED), excluded.reason, excluded.message)
        ex.add("What would unblock it", [_unblock_excluded(state, entry, excluded.reason)])
        return ex
    job = state.core_job(key)
    pending = state.pending(key)
    if job is None or pending is None:
        nxt = state.admitted_next(key)
        summary = (
            "fits now: the operator admits it in its next cycle" if nxt else "not seen by the scheduler yet"
        )
        return Explanation(key, str(entry.status.phase or Phase.QUEUED), None, summary)
    ex = Explanation(key, str(entry.status.phase or Phase.QUEUED), pending.code, pending.reason)
    q = state.queues().get(job.queue)
    ahead = _queue_line(state, job, pending.position)
    ex.add("Queue", ahead, position=pending.position, queue=job.queue)
    if q is not None:
        book = _book(state)
        gpus = 0 if job.recovering else job.workers.total_gpus
        ex.add("Quota", _quota_lines(state, book, q, gpus), quota=_quota_data(book, q, gpus))
        ex.add("Topology", _topology_lines(state, job), domains=_best_domains(state, job))
        ex.add("What would unblock it", _unblock(state, book, job, q, pending.code, gpus))
        ex.add("Preemption", _preemption_lines(state, book, job, q, gpus, pending.code, pending.position))
    return ex


def _queue_line(state: State, job: Job, position: int) -> list[str]:
    same = sorted(
        (
            p
            for p in state.decisions.pending
            if (j := state.core_job(p.job)) is not None and j.queue == job.queue
        ),
        key=lambda p: p.position,
    )
    line = f"position {position} of {len(same)} waiting in queue {job.queue} (priority {job.priority})"
    out = [line]
    before = [p.job for p in same if p.position < position][:SHOW]
    if before:
        out.append(f"ahead of it: {', '.join(before)}{' ...' if position - 1 > len(before) else ''}")
    return out


def _book(state: State) -> QuotaBook:
    ix = state.ix
    return QuotaBook(CycleState(ix), state.queues(), ix.usage, ix.model_usage)


def _quota_data(book: QuotaBook, q: Queue, gpus: int) -> dict[str, Any]:
    check = book.check(q, gpus)
    lent, peers_borrowed = book.cohort_lends(q)
    return {
        "nominal": q.nominal_gpus,
        "used": book.used(q.name),
        "request": gpus,
        "cohort": q.cohort,
        "cohortLends": lent,
        "peersBorrow": peers_borrowed,
        "borrowingLimit": q.borrowing_limit_gpus,
        "fits": check.ok,
    }


def _quota_lines(state: State, book: QuotaBook, q: Queue, gpus: int) -> list[str]:
    used = book.used(q.name)
    after = used + gpus
    out = [f"queue {q.name}: nominal {q.nominal_gpus}, in use {used}, this job {gpus} -> {after}"]
    if q.held:
        out.append(f"queue {q.name} is held (stopPolicy): it admits nothing new")
    if q.cohort is not None:
        lent, peers = book.cohort_lends(q)
        limit = (
            "no borrowing limit"
            if q.borrowing_limit_gpus is None
            else f"borrowing limit {q.borrowing_limit_gpus}"
        )
        out.append(
            f"cohort {q.cohort}: the other queues lend {lent} unused GPUs and borrow {peers}; {limit}; "
            f"{q.name} lends {lent_out(book.queues.values(), book.usage).get(q.name, 0)} of the "
            f"{lendable(q, used)} it could lend now"
        )
    check = book.check(q, gpus)
    out.append("quota allows it" if check.ok else f"quota refuses it: {check.reason} ({check.code})")
    return out


def _best_domains(state: State, job: Job) -> list[dict[str, Any]]:
    """Per topology level: the domain with the most free GPUs on the job's eligible nodes."""
    ix = state.ix
    tree = ix.tree
    eligible = ix.eligibility(job).nodes
    g = job.workers.gpus_per_worker
    out = []
    for depth in range(tree.node_depth + 1):
        free: dict[int, int] = {}
        slots: dict[int, int] = {}
        for n in eligible:
            dom = 0 if depth == 0 else tree.ancestors[n][depth] if depth < tree.node_depth else n
            f = max(ix.free_gpu[n], 0)
            free[dom] = free.get(dom, 0) + f
            slots[dom] = slots.get(dom, 0) + (f // g if g else 0)
        if not free:
            continue
        best = max(free, key=lambda d: (slots[d], free[d]))
        name = ix.nodes[best].name if depth == tree.node_depth else tree.names[best]
        out.append(
            {
                "level": tree.level_name(depth) if depth < tree.node_depth else "node",
                "domain": name,
                "freeGPUs": free[best],
                "workerSlots": slots[best],
            }
        )
    return out


def _topology_lines(state: State, job: Job) -> list[str]:
    w = job.workers
    level = job.topology.level
    want = f"needs {counted(w.replicas, 'worker')} x {w.gpus_per_worker} GPUs"
    if level is not None:
        want += f", {job.topology.mode.value.lower()} in one {level}"
    eligible = state.ix.eligibility(job).nodes
    out = [f"{want}; {counted(len(eligible), 'eligible node')}"]
    for d in _best_domains(state, job):
        mark = (
            " (its required level)" if d["level"] == level and job.topology.mode.value == "Required" else ""
        )
        out.append(
            f"best {d['level']}: {d['domain']} with {d['freeGPUs']} free GPUs, {_room(d, w.replicas)}{mark}"
        )
    return out


def _room(domain: dict[str, Any], replicas: int) -> str:
    """Worker slots of a domain as a share of the gang, never more than it (a domain may hold more)."""
    slots = domain["workerSlots"]
    if slots >= replicas:
        return "room for all its workers" if replicas > 1 else "room for its worker"
    return f"room for {slots} of its {replicas} workers" if slots else "no room for a worker"


# ---- what would unblock it ---------------------------------------------------------------------------


def _unblock_excluded(state: State, entry: JobEntry, reason: str) -> str:
    spec = entry.spec
    if reason == SUSPENDED:
        return f"resume it: gpuq resume {entry.key}"
    if reason == PendingCode.EXCEEDS_CAPACITY:
        return "more GPUs (nodes) than the cluster has, or a smaller gang"
    if spec is None:  # Invalid: the spec itself did not parse; the message says where
        return f"fix its spec (kubectl edit trainingjob -n {entry.namespace} {entry.name})"
    what_to_do = {
        "QueueNotFound": f"create GPUQueue {spec.queue} (kubectl apply a GPUQueue named {spec.queue})",
        "QueueInvalid": f"fix GPUQueue {spec.queue} (kubectl edit gpuqueue {spec.queue})",
        "NamespaceNotAllowed": f"label namespace {entry.namespace} to match the namespaceSelector of "
        f"GPUQueue {spec.queue}, or submit to another queue",
        "UnknownTopologyLevel": "spec.topology.level set to a level the cluster has: "
        + ", ".join(state.view.snapshot.topology.levels),
        "InvalidPodTemplate": f"fix spec.workers.template (kubectl edit trainingjob -n {entry.namespace} "
        f"{entry.name})",
    }
    return what_to_do.get(
        reason, "fix what the message names (the spec or its queue); the operator retries on every change"
    )


def _unblock(state: State, book: QuotaBook, job: Job, q: Queue, code: str, gpus: int) -> list[str]:
    used = book.used(q.name)
    if code == PendingCode.HELD:
        return [f"release the queue: gpuq queue release {q.name}"]
    if code == PendingCode.QUOTA_EXCEEDED:
        short = used + gpus - q.nominal_gpus
        out = [f"nominalGPUs of {q.name} raised to {used + gpus} (now {q.nominal_gpus})"]
        return out + _finishing(state, _running_of(state, [q.name]), short, f"jobs of {q.name} finishing")
    if code == PendingCode.BORROWING_LIMIT:
        need = used + gpus - q.nominal_gpus
        out = [f"borrowingLimitGPUs of {q.name} raised to {need} (now {q.borrowing_limit_gpus})"]
        return out + _finishing(
            state,
            _running_of(state, [q.name]),
            need - (q.borrowing_limit_gpus or 0),
            f"jobs of {q.name} finishing",
        )
    if code == PendingCode.COHORT_EXHAUSTED and q.cohort is not None:
        peers = [p.name for p in book.cohorts.get(q.cohort, []) if p.name != q.name]
        borrowers = [p for p in book.cohorts.get(q.cohort, []) if book.borrowed(p) > 0 and p.name != q.name]
        out = [f"more nominalGPUs in cohort {q.cohort} (any of {', '.join(peers) or 'no peers'})"]
        if borrowers:
            names = ", ".join(f"{p.name} (+{book.borrowed(p)})" for p in borrowers)
            out.append(f"borrowing peers giving back quota: {names}")
        return out
    if code == PendingCode.BEHIND_QUEUE_HEAD:
        return ["the job at the head of its queue being admitted first (StrictFIFO or the starvation rule)"]
    if code == PendingCode.WAITING_FOR_PREEMPTION:
        return [f"its victims releasing their GPUs: {', '.join(_waited_for(state, job)) or 'already gone'}"]
    if code == PendingCode.BACKING_OFF:
        return [f"time: its restart back-off ends in {max(job.not_before - state.now, 0):.0f}s"]
    if code in NEVER_CODES:
        return ["nodes that match it (or a spec it can fit): no finishing job helps"]
    if code == PendingCode.CYCLE_LIMIT:
        limit = state.config.max_admissions_per_cycle
        return [f"nothing: it is tried again next cycle (maxAdmissionsPerCycle {limit} was reached)"]
    if code in CAPACITY_CODES:
        return _capacity_what_if(state, job)
    return []


def _waited_for(state: State, job: Job) -> list[str]:
    """The gangs a job waits for: those it preempted, else (a gang another preemption or a stop
    evicts, which it may count on too) the ones leaving its nominated nodes."""
    mine = [k for k, j in state.cache.jobs.items() if (p := j.status.preemption) and p.preemptor == job.key]
    if mine:
        return mine
    pending = state.pending(job.key)
    ix = state.ix
    nominated = {ix.node_idx[n] for n in (pending.nominated if pending else ()) if n in ix.node_idx}
    return sorted(k for k in ix.evicting if any(n in nominated for n, _ in ix.job_nodes.get(k, ())))


def _running_of(state: State, queues: Sequence[str]) -> list[Job]:
    ix = state.ix
    keys = {k for q in queues for k in ix.running_by_queue.get(q, ())}
    return sorted((ix.jobs[k] for k in keys if k not in ix.evicting), key=lambda j: -j.workers.total_gpus)


def _finishing(state: State, running: Sequence[Job], gpus: int, what: str) -> list[str]:
    """The fewest of `running` (largest first) whose GPUs cover `gpus`."""
    if gpus <= 0:
        return []
    chosen, total = [], 0
    for j in running:
        chosen.append(j.key)
        total += j.workers.total_gpus
        if total >= gpus:
            return [f"or {what}: {', '.join(chosen)} ({total} GPUs)"]
    return []


def _capacity_what_if(state: State, job: Job) -> list[str]:
    """Running jobs whose finishing lets the core admit it, found by re-running the core without them:
    the smallest prefix of the candidates (most GPUs on its eligible nodes first) that works, pruned."""
    ix = state.ix
    eligible = set(ix.eligibility(job).nodes)
    weight = {
        k: sum(ranks for n, ranks in ix.job_nodes.get(k, ()) if n in eligible)
        for k, j in ix.jobs.items()
        if j.running is not None and k not in ix.evicting
    }
    cands = sorted((k for k, w in weight.items() if w), key=lambda k: (-weight[k], k))
    runs = [0]

    def without(gone: Sequence[str]) -> Decisions:
        runs[0] += 1
        snap, drop = state.view.snapshot, set(gone)
        jobs = tuple(j for j in snap.jobs if j.key not in drop)
        return schedule(dataclasses.replace(snap, jobs=jobs), state.now, state.config)

    def admitted_without(gone: Sequence[str]) -> bool:
        return any(a.job == job.key for a in without(gone).admit)

    all_gone = without(cands)
    if not any(a.job == job.key for a in all_gone.admit):
        # Admitted in its place: jobs placed on its eligible nodes in that what-if, and it gets in
        # once they are left out too (so they really take its room, not just room elsewhere).
        idx = ix.node_idx
        takers = [
            a.job
            for a in all_gone.admit
            if a.job != job.key and any(idx.get(n, -1) in eligible for n in a.placement)
        ]
        ahead = takers if takers and admitted_without([*cands, *takers]) else []
        return [_still_waiting(state, job, all_gone, eligible, ahead)]
    lo, hi = 1, len(cands)  # smallest k with admitted_without(cands[:k])
    while lo < hi and runs[0] < MAX_WHAT_IFS:
        mid = (lo + hi) // 2
        if admitted_without(cands[:mid]):
            hi = mid
        else:
            lo = mid + 1
    chosen = cands[:hi]
    for k in list(reversed(chosen)):
        if len(chosen) == 1 or runs[0] >= MAX_WHAT_IFS:
            break
        rest = [c for c in chosen if c != k]
        if admitted_without(rest):
            chosen = rest
    names = ", ".join(chosen[:SHOW]) + (" ..." if len(chosen) > SHOW else "")
    return [f"{counted(len(chosen), 'running job')} finishing: {names} (the core admits it without them)"]


def _still_waiting(
    state: State, job: Job, all_gone: Decisions, eligible: set[int], ahead: Sequence[str]
) -> str:
    """Why even the end of every running job on its eligible nodes would not let it in: what the
    core decided in that what-if. `ahead`: jobs that took its room there (checked by the caller)."""
    lead = "no set of running jobs finishing lets it in on its own"
    if ahead:
        names = ", ".join(ahead[:SHOW]) + (" ..." if len(ahead) > SHOW else "")
        return f"{lead}: jobs ahead of it would take the freed room first ({names})"
    ix = state.ix
    leaving = sorted(k for k in ix.evicting if any(n in eligible for n, _ in ix.job_nodes.get(k, ())))
    if leaving:
        names = ", ".join(leaving[:SHOW]) + (" ..." if len(leaving) > SHOW else "")
        return f"{lead}: gangs being evicted still hold its room ({names}); it fits once they are gone"
    then = next((p for p in all_gone.pending if p.job == job.key), None)
    return f"{lead}: even then it would wait: {then.reason}" if then is not None else lead


# ---- preemption ------------------------------------------------------------------------------------


def _preemption_lines(
    state: State, book: QuotaBook, job: Job, q: Queue, gpus: int, code: str, position: int
) -> list[str]:
    if code == PendingCode.WAITING_FOR_PREEMPTION:
        return ["it is preempting: see 'What would unblock it'"]
    protected = frozenset(name for name, qq in state.queues().items() if qq.preemption.budget() == 0)
    allowed = preemption.allowed_jobs(state.ix, book, job, q, gpus, state.now, set(), protected)
    cands = preemption.victims(state.ix, allowed, state.now)
    if cands:
        names = ", ".join(f"{v.key} (priority {v.priority}, {v.gpus} GPUs)" for v in cands[:SHOW])
        why = (
            "only its queue's head preempts"
            if position > 1
            else "no set of them frees a placement that fits it (size, topology or constraints)"
        )
        return [f"it may preempt {counted(len(cands), 'job')}: {names}", f"it does not because {why}"]
    return _why_no_victims(state, book, job, q, gpus)


def _why_no_victims(state: State, book: QuotaBook, job: Job, q: Queue, gpus: int) -> list[str]:
    ix = state.ix
    out = []
    if q.preemption.within_queue is WithinQueuePreemption.NEVER:
        out.append(f"within {q.name}: withinQueue is Never")
    else:
        prios = ix.running_priorities.get(q.name) or {}
        lowest = min(prios) if prios else None
        if lowest is None:
            out.append(f"within {q.name}: nothing of {q.name} runs")
        else:
            line = (
                f"within {q.name}: its running jobs have priority >= {lowest}; it (priority {job.priority}) "
                "may only take strictly lower ones that are preemptible and past minRuntimeSeconds"
            )
            rule = ix.config.service
            if rule.preempt and rule.thresholds_gpu_hours:
                line += (
                    f", or ones of its priority above its attained-service level that ran "
                    f"{rule.min_run_seconds:.0f}s in their attempt"
                )
                if rule.spare_larger_gangs:
                    line += f" (not gangs on several nodes with more than its {job.workers.total_gpus} GPUs)"
            out.append(line)
    if q.cohort is None:
        out.append(f"reclaim: {q.name} has no cohort")
    elif q.preemption.reclaim_within_cohort is ReclaimPreemption.NEVER:
        out.append(f"reclaim: reclaimWithinCohort of {q.name} is Never")
    elif book.used(q.name) + gpus > q.nominal_gpus:
        out.append(f"reclaim: only within nominal quota ({book.used(q.name)} + {gpus} > {q.nominal_gpus})")
    else:
        out.append(_why_no_reclaim(state, book, job, q))
    return out


def _why_no_reclaim(state: State, book: QuotaBook, job: Job, q: Queue) -> str:
    assert q.cohort is not None
    peers = [p for p in book.cohorts.get(q.cohort, []) if p.name != q.name]
    borrowers = [p for p in peers if book.borrowed(p) > 0]
    if not borrowers:
        leaving = state.ix.evicting_usage
        # The core's rule: a peer that borrowed counting its leaving gangs gives those back.
        back = [
            f"{p.name} ({leaving[p.name]} GPUs)"
            for p in peers
            if preemption.reclaimed_by_eviction(book, p, leaving)
        ]
        if back:
            return (
                f"reclaim: no peer in cohort {q.cohort} borrows beyond its gangs being evicted: "
                f"{', '.join(back)} return their GPUs"
            )
        return f"reclaim: no peer in cohort {q.cohort} runs on borrowed quota"
    names = ", ".join(f"{p.name} (+{book.borrowed(p)})" for p in borrowers)
    prios = [j.priority for j in _running_of(state, [p.name for p in borrowers])]
    if q.preemption.reclaim_within_cohort is ReclaimPreemption.LOWER_PRIORITY and prios:
        return (
            f"reclaim: {names} borrow, but reclaimWithinCohort LowerPriority takes only jobs below its "
            f"priority {job.priority} (theirs: {min(prios)} and up)"
        )
    return (
        f"reclaim: {names} borrow, but their jobs are not preemptible, inside minRuntimeSeconds, or their "
        "queue's maxPreemptionsPerHour is used up"
    )


# ---- running jobs ----------------------------------------------------------------------------------


def _running(state: State, entry: JobEntry) -> Explanation:
    s = entry.status
    key = entry.key
    workers = Counter(p.node for p in sorted(s.placement, key=lambda p: p.rank))  # node -> its ranks
    nodes = list(workers)
    ex = Explanation(key, str(s.phase), None, s.message or str(s.phase))
    by_domain: dict[str, list[str]] = {}
    job = state.core_job(key)
    ix = state.ix
    for n, k in workers.items():
        i = ix.node_idx.get(n)
        dom = ix.tree.names[ix.tree.ancestors[i][-1]] if i is not None else "?"
        by_domain.setdefault(dom, []).append(n if k == 1 else f"{n} ({k} workers)")
    placement = [f"{dom}: {', '.join(ns)}" for dom, ns in sorted(by_domain.items())]
    when = []
    if s.admitted_at:
        when.append(f"admitted {s.admitted_at.isoformat()}")
    if s.started_at:
        when.append(f"running since {s.started_at.isoformat()}")
    head = f"attempt {s.attempt}: {counted(len(s.placement), 'worker')} on {counted(len(nodes), 'node')}"
    ex.add("Placement", [head, *placement, *when], nodes=nodes)
    if job is not None:
        ex.add("Preemption exposure", _exposure(state, job))
    ck = s.last_checkpoint or entry.checkpoint
    history = [
        f"restarts {s.restarts}, preemptions {s.preemptions}, lost {s.lost_gpu_seconds:.0f} GPU-seconds"
    ]
    if ck is not None:
        history.insert(0, f"last checkpoint: step {ck.step} at {ck.time.isoformat()} ({ck.path})")
    else:
        history.insert(0, "no checkpoint reported (a restart starts from the beginning)")
    if s.preemption is not None:
        history.append(
            f"being stopped: {s.preemption.reason} (evicted by {s.preemption.deadline.isoformat()})"
        )
        off = next((a for a in state.decisions.abandon if a.victim == key), None)
        if off is not None and s.preemption.preemptor not in STOPS:
            history.append(f"the operator calls this preemption off in its next cycle: {off.reason}")
    ex.add("History", history, restarts=s.restarts, preemptions=s.preemptions)
    return ex


def _exposure(state: State, job: Job) -> list[str]:
    q = state.queues().get(job.queue)
    if q is None:
        return []
    if not job.preemptible:
        return ["never preempted (preemptible: false)"]
    if not q.preemption.preemptible:
        return [f"never preempted (queue {q.name} is not preemptible)"]
    out = []
    if job.running is not None and state.now - job.running.started_at < job.min_runtime_seconds:
        left = job.min_runtime_seconds - (state.now - job.running.started_at)
        out.append(f"protected by minRuntimeSeconds for {left:.0f}s more")
    higher = [
        p.job
        for p in state.decisions.pending
        if (j := state.core_job(p.job)) is not None and j.queue == q.name and j.priority > job.priority
    ]
    if higher and q.preemption.within_queue is WithinQueuePreemption.LOWER_PRIORITY:
        out.append(
            f"{counted(len(higher), 'waiting job')} of {q.name} with higher priority may preempt it: "
            f"{', '.join(higher[:SHOW])}"
        )
    book = _book(state)
    if book.borrowed(q) > 0:
        out.append(
            f"{q.name} runs {book.borrowed(q)} GPUs over its nominal quota: cohort peers may reclaim it"
        )
    if q.preemption.max_per_hour is not None:
        most = counted(q.preemption.max_per_hour, "job")
        out.append(f"queue {q.name} loses at most {most} an hour to preemption")
    return out or ["nothing waiting may preempt it now"]
