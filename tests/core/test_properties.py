"""Property tests of gpuq.core.schedule over thousands of generated clusters and workloads.

Each property runs GPUQ_CORE_EXAMPLES examples (default 2,000) of small random clusters: failed,
cordoned, NotReady and GPU-degraded nodes, taints, labels, GPU models, other schedulers' pods; queues
with cohorts, limits, policies and model quotas; running (some evicting, some on deleted nodes),
pending and recovering jobs with topology and pod constraints.
"""

from __future__ import annotations

import random
from dataclasses import replace
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq.core import ClusterIndex, SchedulerConfig, preemption, schedule
from gpuq.core.decisions import Decisions, PendingCode
from gpuq.core.model import Checkpoint, Job, Running, Snapshot
from gpuq.core.quota import QuotaBook
from gpuq.core.state import CycleState

from .helpers import (
    check_gangs,
    check_no_overcommit,
    check_preemptions,
    check_reasons,
    check_required_topology,
)
from .strategies import NOW, PROPERTY, scenarios

Scenario = tuple[Snapshot, SchedulerConfig]


@PROPERTY
@given(scenarios())
def test_no_node_overcommitted(sc: Scenario) -> None:
    s, cfg = sc
    check_no_overcommit(s, schedule(s, NOW, cfg))


@PROPERTY
@given(scenarios())
def test_gangs_all_or_nothing_and_every_job_decided_once(sc: Scenario) -> None:
    s, cfg = sc
    check_gangs(s, schedule(s, NOW, cfg))


@PROPERTY
@given(scenarios())
def test_required_topology_respected(sc: Scenario) -> None:
    s, cfg = sc
    check_required_topology(s, schedule(s, NOW, cfg))


@PROPERTY
@given(scenarios())
def test_every_pending_job_gets_reason_and_position(sc: Scenario) -> None:
    s, cfg = sc
    check_reasons(s, schedule(s, NOW, cfg))


@PROPERTY
@given(scenarios())
def test_preemption_only_of_allowed_victims_and_only_if_preemptor_fits(sc: Scenario) -> None:
    s, cfg = sc
    d = schedule(s, NOW, cfg)
    check_preemptions(s, d, NOW, cfg)
    check_no_overcommit(s, d)  # "later": with victims gone, every nominated preemptor fits


def _usage(s: Snapshot) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    models = {n.name: n.gpu_model for n in s.nodes}
    usage: dict[str, int] = {}
    model_usage: dict[str, dict[str, int]] = {}
    for j in s.jobs:
        if j.running is not None and not j.evicting:
            usage[j.queue] = usage.get(j.queue, 0) + len(j.running.placement) * j.workers.gpus_per_worker
            for n in j.running.placement:
                m = models.get(n)
                if m:
                    mu = model_usage.setdefault(j.queue, {})
                    mu[m] = mu.get(m, 0) + j.workers.gpus_per_worker
        elif j.running is None and j.recovering:
            usage[j.queue] = usage.get(j.queue, 0) + j.workers.total_gpus
    return usage, model_usage


@PROPERTY
@given(scenarios(preemption=False, evicting=False))
def test_quota_borrowing_and_lending_limits(sc: Scenario) -> None:
    """Replays admissions in decision order (preemption off, so usage changes only by admission)."""
    s, cfg = sc
    cfg = replace(cfg, starvation_seconds=1e9)  # no reservations: only admissions change usage
    d = schedule(s, NOW, cfg)
    queues = {q.name: q for q in s.queues}
    jobs = {j.key: j for j in s.jobs}
    models = {n.name: n.gpu_model for n in s.nodes}
    usage, model_usage = _usage(s)

    def lent(q: str) -> int:
        qq = queues[q]
        limit = (
            qq.nominal_gpus if qq.lending_limit_gpus is None else min(qq.lending_limit_gpus, qq.nominal_gpus)
        )
        return max(0, min(limit, qq.nominal_gpus - usage.get(q, 0)))

    def borrowed(q: str) -> int:
        return max(0, usage.get(q, 0) - queues[q].nominal_gpus)

    for a in d.admit:
        if a.restart:
            continue  # recovering jobs keep the quota they already had
        j = jobs[a.job]
        q = queues[j.queue]
        before = usage.get(q.name, 0)
        usage[q.name] = before + j.workers.total_gpus
        added: set[str] = set()
        for n in a.placement:
            m = models[n]
            if m and j.workers.gpus_per_worker:
                mu = model_usage.setdefault(q.name, {})
                mu[m] = mu.get(m, 0) + j.workers.gpus_per_worker
                added.add(m)
        for m, limit in q.model_quotas.items():
            if m in added:
                assert model_usage[q.name][m] <= limit, f"{a.job}: {m} quota {limit} exceeded"
        if q.cohort is not None:
            # Within nominal or not: GPUs a queue lent out are not free for it (reclaim or wait).
            peers = [p for p in queues.values() if p.cohort == q.cohort]
            assert sum(borrowed(p.name) for p in peers) <= sum(lent(p.name) for p in peers), (
                f"{a.job}: cohort {q.cohort} borrows more than it lends"
            )
        if usage[q.name] <= q.nominal_gpus:
            assert a.borrowed_gpus == 0
            continue
        assert q.cohort is not None, f"{a.job}: queue {q.name} has no cohort but went above nominal"
        assert a.borrowed_gpus == min(j.workers.total_gpus, usage[q.name] - q.nominal_gpus)
        if q.borrowing_limit_gpus is not None:
            assert borrowed(q.name) <= q.borrowing_limit_gpus
    for qn, used in d.queue_usage.items():
        assert used == usage.get(qn, 0), f"queue {qn}: reported {used}, replayed {usage.get(qn, 0)}"


@PROPERTY
@given(scenarios(), st.randoms(use_true_random=False))
def test_deterministic_under_input_permutation(sc: Scenario, rnd: random.Random) -> None:
    s, cfg = sc
    first = schedule(s, NOW, cfg)
    assert schedule(s, NOW, cfg) == first
    nodes, queues, jobs = list(s.nodes), list(s.queues), list(s.jobs)
    rnd.shuffle(nodes)
    rnd.shuffle(queues)
    rnd.shuffle(jobs)
    assert schedule(Snapshot(s.topology, tuple(nodes), tuple(queues), tuple(jobs)), NOW, cfg) == first


@PROPERTY
@given(scenarios(), scenarios(), st.randoms(use_true_random=False))
def test_incremental_index_decides_like_a_fresh_one(a: Scenario, b: Scenario, rnd: random.Random) -> None:
    """An index moved from snapshot A to B by deltas decides exactly like one built from B."""
    s1, cfg = a
    s2, _ = b
    ix = ClusterIndex(s1, cfg)
    schedule(s1, NOW, cfg, index=ix)
    # Keep A's nodes, mutate some (same names/paths), swap the jobs for B's jobs mapped onto A's nodes.
    names = [n.name for n in s1.nodes]
    changed = [replace(n, used_by_others=type(n.used_by_others)()) for n in s1.nodes if rnd.random() < 0.3]
    by_name = {n.name: n for n in s1.nodes} | {n.name: n for n in changed}
    new_jobs: list[Job] = []
    for j in s2.jobs:
        if j.running is not None:
            j = replace(j, running=Running(tuple(rnd.choice(names) for _ in j.running.placement), 0.0))
        new_jobs.append(j)
    kept = [j for j in s1.jobs if rnd.random() < 0.5]
    kept_keys = {j.key for j in kept}
    new_jobs = [replace(j, key=j.key + "-b") for j in new_jobs]
    s3 = Snapshot(s1.topology, tuple(by_name[n] for n in names), s2.queues, tuple(kept + new_jobs))
    ix.apply(
        s3,
        nodes=changed,
        jobs=new_jobs,
        removed_jobs=[j.key for j in s1.jobs if j.key not in kept_keys],
    )
    assert schedule(s3, NOW, cfg, index=ix) == schedule(s3, NOW, cfg)


@PROPERTY
@given(scenarios())
def test_explain_false_takes_the_same_actions(sc: Scenario) -> None:
    """explain=False only skips the pending reasons; admissions, preemptions and restarts are equal."""
    s, cfg = sc
    full = schedule(s, NOW, cfg)
    quiet = schedule(s, NOW, cfg, explain=False)
    assert quiet.pending == () and quiet.pending_by_queue == ()
    assert replace(quiet, pending=full.pending, pending_by_queue=full.pending_by_queue) == full
    assert full.pending == tuple(p for _, chunk in full.pending_by_queue for p in chunk)


@PROPERTY
@given(scenarios(), st.randoms(use_true_random=False))
def test_interchangeable_jobs_keep_every_invariant(sc: Scenario, rnd: random.Random) -> None:
    """Clones of pending jobs (same queue, shape, constraints, priority; created later) exercise the
    per-class skipping: invariants hold, every job is decided once and every waiting one explained."""
    s, cfg = sc
    clones = [
        replace(j, key=f"{j.key}-clone{i}", created_at=j.created_at + i)
        for j in s.jobs
        if j.running is None and not j.recovering
        for i in range(1, rnd.randint(1, 3) + 1)
    ]
    s2 = replace(s, jobs=(*s.jobs, *clones))
    d = schedule(s2, NOW, cfg)
    check_no_overcommit(s2, d)
    check_gangs(s2, d)
    check_reasons(s2, d)
    check_preemptions(s2, d, NOW, cfg)
    new_admissions = sum(1 for a in d.admit if not a.restart)
    if new_admissions < cfg.max_admissions_per_cycle:
        assert all(p.code != PendingCode.CYCLE_LIMIT for p in d.pending), "skipped jobs left unexplained"


@PROPERTY
@given(scenarios(), st.randoms(use_true_random=False))
def test_quiet_cycle_memo_decides_like_a_fresh_cycle(sc: Scenario, rnd: random.Random) -> None:
    """After a cycle that decided nothing, the next one (new pending jobs only, later time) may recall
    the classes that failed; it must decide exactly like a cycle that tries everything."""
    s, cfg = sc
    ix = ClusterIndex(s, cfg)
    d = schedule(s, NOW, cfg, index=ix, explain=False)
    for _ in range(4):  # drop what got admitted or preempts until a cycle decides nothing
        if not (d.admit or d.preempt or d.restart):
            break
        gone = {a.job for a in d.admit} | {p.for_job for p in d.preempt}
        if d.restart or not gone:
            return
        s = replace(s, jobs=tuple(j for j in s.jobs if j.key not in gone))
        ix = ClusterIndex(s, cfg)
        d = schedule(s, NOW, cfg, index=ix, explain=False)
    later = NOW + rnd.choice((0.0, 1.0, 250.0, 5000.0))
    new = [
        replace(
            j,
            key=f"{j.key}-new{i}",
            created_at=later - rnd.choice((0.0, 400.0)),
            priority=j.priority + rnd.choice((0, 0, 1, 100)),
        )
        for i, j in enumerate(s.jobs)
        if j.running is None and not j.recovering and rnd.random() < 0.7
    ]
    s2 = replace(s, jobs=(*s.jobs, *new))
    ix.apply(s2, jobs=new)
    assert schedule(s2, later, cfg, index=ix, explain=False) == schedule(s2, later, cfg, explain=False)


def _next_state(
    s: Snapshot, d: Decisions, now: float, step: int, rnd: random.Random
) -> tuple[Snapshot, list[Job], list[str]]:
    """What may come between two cycles without counting as a change to the cycle memo (started
    admissions, checkpoints, queued jobs arriving, changing and leaving), and now and then a real
    change (a running job leaves): the next snapshot, the jobs added or changed, the keys removed."""
    started = {a.job: Running(a.placement, now) for a in d.admit}
    jobs: list[Job] = []
    changed: list[Job] = []
    removed: list[str] = []
    for j in s.jobs:
        queued = j.running is None and not j.recovering
        roll = rnd.random()
        if j.key in started:
            new: Job | None = replace(j, running=started[j.key], recovering=False)
        elif j.running is not None and roll < 0.3:
            new = replace(j, checkpoint=Checkpoint(now - rnd.choice((0.0, 50.0)), rnd.randint(1, 9), "/ck"))
        elif (j.running is not None and roll < 0.33) or (queued and roll < 0.1):
            new = None  # a running job leaves (a change), or a queued one (not a change)
        elif queued and roll < 0.2:
            new = replace(
                j,
                not_before=now + rnd.choice((0.0, 0.0, 30.0)),
                queued_since=now - rnd.choice((0.0, 99.0)),
                avoid_nodes=frozenset(rnd.sample([n.name for n in s.nodes], min(2, len(s.nodes)))),
            )
        else:
            new = j
        if new is None:
            removed.append(j.key)
            continue
        jobs.append(new)
        if new is not j:
            changed.append(new)
    arrivals = [
        replace(
            j,
            key=f"{j.key}-{step}",
            created_at=now - rnd.choice((0.0, 400.0)),
            priority=j.priority + rnd.choice((0, 0, 1, 100)),
        )
        for j in s.jobs
        if j.running is None and not j.recovering and rnd.random() < 0.3
    ]
    return replace(s, jobs=(*jobs, *arrivals)), [*changed, *arrivals], removed


@PROPERTY
@given(scenarios(), st.randoms(use_true_random=False))
def test_a_memo_kept_across_queued_jobs_and_checkpoints_decides_like_a_fresh_cycle(
    sc: Scenario, rnd: random.Random
) -> None:
    """The cycle memo outlives what frees nothing (queued jobs that come, change or go; checkpoints;
    admissions that start) and explaining cycles: a chain of cycles on a kept index, each explaining
    or not, decides and explains exactly like fresh cycles."""
    s, cfg = sc
    ix = ClusterIndex(s, cfg)
    now = NOW
    for step in range(5):
        explain = rnd.random() < 0.6
        d = schedule(s, now, cfg, index=ix, explain=explain)
        assert d == schedule(s, now, cfg, explain=explain)
        s, changed, removed = _next_state(s, d, now, step, rnd)
        ix.apply(s, jobs=changed, removed_jobs=removed)
        now += rnd.choice((0.0, 1.0, 1.0, 250.0))


# Shortcuts of the preemption search, each patched to never apply.
NO_SHORTCUT = {
    # A search skipped when even evicting every allowed victim leaves too few GPU slots.
    "room_for": (preemption, "room_for", lambda *_: True),
    # The domains left unverified once a plan is found that none of them could replace.
    "unbeatable": (preemption._Search, "_unbeatable", lambda *_: False),
    # The allowed victims left unlisted when even every job of their queues leaves too few slots.
    "room_for_queues": (preemption, "room_for_queues", lambda *_: True),
    # A plan that waits on one node for gangs already leaving, taken without pricing other domains.
    "waiting_plan": (preemption, "_waiting_plan", lambda *_: None),
}


@pytest.mark.parametrize("shortcut", sorted(NO_SHORTCUT))
@PROPERTY
@given(sc=scenarios())
def test_preemption_search_shortcuts_change_no_decision(shortcut: str, sc: Scenario) -> None:
    """A cycle that runs every search and verifies every domain decides exactly like one that skips."""
    s, cfg = sc
    skipping = schedule(s, NOW, cfg)
    with patch.object(*NO_SHORTCUT[shortcut]):
        assert schedule(s, NOW, cfg) == skipping


@PROPERTY
@given(scenarios(), st.randoms(use_true_random=False))
def test_a_checkpoint_delta_leaves_the_index_as_a_fresh_one(sc: Scenario, rnd: random.Random) -> None:
    """ClusterIndex.apply replaces a running job whose only change is its checkpoint without
    re-deriving it (its nodes, usage, class and service entries are kept): the index must then hold
    what one built from the new snapshot holds, and decide like it."""
    s, cfg = sc
    ix = ClusterIndex(s, cfg)
    schedule(s, NOW, cfg, index=ix)
    changed = [
        replace(j, checkpoint=Checkpoint(NOW - rnd.choice((0.0, 50.0, 4000.0)), rnd.randint(1, 9), "/ck"))
        for j in s.jobs
        if j.running is not None and rnd.random() < 0.6
    ]
    by_key = {j.key: j for j in changed}
    s2 = replace(s, jobs=tuple(by_key.get(j.key, j) for j in s.jobs))
    reprices = ix.reprices
    ix.apply(s2, jobs=changed)
    fresh = ClusterIndex(s2, cfg)
    assert ix.reprices - reprices == sum(1 for j in changed if j.checkpoint != _checkpoint_in(s, j.key))
    assert ix.jobs == fresh.jobs
    assert ix.job_nodes == fresh.job_nodes and ix.demand == fresh.demand
    assert ix.usage == fresh.usage and ix.model_usage == fresh.model_usage
    assert ix.evicting == fresh.evicting and ix.evicting_usage == fresh.evicting_usage
    assert (ix.free_gpu, ix.free_cpu, ix.free_mem) == (fresh.free_gpu, fresh.free_cpu, fresh.free_mem)
    assert [bytes(p.hist) for p in ix.pools()] == [bytes(p.hist) for p in fresh.pools()]
    assert ix.running_by_queue == fresh.running_by_queue
    assert _held(ix) == _held(fresh)
    assert {k: dict(v) for k, v in ix.running_priorities.items() if v} == {
        k: dict(v) for k, v in fresh.running_priorities.items() if v
    }
    for later in (NOW, NOW + 7200.0):
        assert schedule(s2, later, cfg, index=ix) == schedule(s2, later, cfg)


def _checkpoint_in(s: Snapshot, key: str) -> Checkpoint | None:
    return next(j.checkpoint for j in s.jobs if j.key == key)


def _held(ix: ClusterIndex) -> dict[str, dict[int, int]]:
    return {q: dict(nodes) for q, nodes in ix.queue_node_gpus.items() if nodes}


@PROPERTY
@given(scenarios(), scenarios(), st.randoms(use_true_random=False))
def test_kept_per_queue_gpus_on_nodes_equal_a_fresh_count(
    a: Scenario, b: Scenario, rnd: random.Random
) -> None:
    """ClusterIndex.queue_node_gpus (what room_for_queues counts) after deltas: equal to a count of
    the snapshot's running jobs, as a fresh index makes it; and room_for_queues is never False where
    room_for, over the allowed victims of any head, is True."""
    s1, cfg = a
    s2, _ = b
    ix = ClusterIndex(s1, cfg)
    names = [n.name for n in s1.nodes]
    moved = [
        replace(
            j, key=j.key + "-b", running=Running(tuple(rnd.choice(names) for _ in j.running.placement), 0.0)
        )
        if j.running is not None
        else replace(j, key=j.key + "-b")
        for j in s2.jobs
    ]
    kept = [j for j in s1.jobs if rnd.random() < 0.5]
    s3 = Snapshot(s1.topology, s1.nodes, s2.queues, tuple(kept + moved))
    ix.apply(s3, jobs=moved, removed_jobs=[j.key for j in s1.jobs if j not in kept])
    counted: dict[str, dict[int, int]] = {}
    for j in s3.jobs:
        if j.running is not None and j.workers.gpus_per_worker:
            for name in j.running.placement:
                if name in ix.node_idx:
                    per = counted.setdefault(j.queue, {})
                    i = ix.node_idx[name]
                    per[i] = per.get(i, 0) + j.workers.gpus_per_worker
    assert _held(ix) == counted == _held(ClusterIndex(s3, cfg))
    state = CycleState(ix)
    queues = {q.name: q for q in s3.queues}
    book = QuotaBook(state, queues, ix.usage, ix.model_usage)
    for j in s3.jobs:
        q = queues.get(j.queue)
        if j.running is not None or q is None:
            continue
        d = ix.demand[j.key]
        pools = state.pool_tiers(j, j.workers.replicas, None)[-1]
        for quota_gpus in (0, j.workers.total_gpus):
            allowed = preemption.allowed_jobs(ix, book, j, q, quota_gpus, NOW, set())
            if preemption.room_for(state, allowed, d, j.workers.replicas, pools):
                by = preemption.victim_queues(ix, book, q, quota_gpus)
                assert {v.queue for v, _ in allowed} <= set(by)
                assert preemption.room_for_queues(state, by, d, j.workers.replicas, pools)
