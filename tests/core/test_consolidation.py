"""Consolidation: a starving gang gets whole nodes by moving small gangs onto other nodes' free GPUs."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as hs

from gpuq.core import SchedulerConfig
from gpuq.core.config import Consolidation
from gpuq.core.decisions import Decisions, PendingCode
from gpuq.core.model import Job, PreemptionPolicy, Running

from .helpers import NOW, admitted, check_all, cluster, codes, job, queue, run, snap, with_running

TWO = cluster(racks=1, nodes_per_rack=2)  # n0000, n0001: 8 GPUs each
QUEUES = [queue("q"), queue("other")]  # no cohort: no reclaim between them
OLD = NOW - 2000  # past service.min_run_seconds (900)


def halves(**kw: object) -> list[Job]:
    """A 4-GPU gang of queue `other` on each node: 8 GPUs free, none of them a whole node."""
    return [
        job("ns/a", "other", gpus=4, on=["n0000"], started=OLD, **kw),
        job("ns/b", "other", gpus=4, on=["n0001"], started=OLD, **kw),
    ]


def whole(created: float = NOW - 4000, replicas: int = 1) -> Job:  # waited consolidation.min_wait_seconds
    return job("ns/big", "q", replicas=replicas, gpus=8, created=created)


def decide(jobs: list[Job], config: SchedulerConfig | None = None) -> Decisions:
    config = config or SchedulerConfig()
    s = snap(TWO, QUEUES, jobs)
    d = run(s, config=config)
    check_all(s, d, NOW, config)
    return d


def test_a_starving_gang_moves_a_small_one_to_get_a_whole_node() -> None:
    d = decide([*halves(), whole()])
    assert [(p.victim, p.for_job, p.move) for p in d.preempt] == [("ns/a", "ns/big", True)]
    assert "moved to make room for ns/big" in d.preempt[0].reason
    (p,) = [p for p in d.pending if p.job == "ns/big"]
    assert p.code == PendingCode.WAITING_FOR_PREEMPTION and p.nominated == ("n0000",)
    assert "consolidation" in p.reason


def test_while_the_moved_gang_saves_its_checkpoint_nothing_more_is_moved() -> None:
    a, b = halves()
    d = decide([replace(a, evicting=True), b, whole()])
    assert d.preempt == () and d.admit == ()
    assert codes(d)["ns/big"] == PendingCode.WAITING_FOR_PREEMPTION


def test_once_it_is_gone_the_gang_takes_the_node_and_the_moved_one_the_free_half() -> None:
    a, b = halves()
    moved = replace(a, running=None, created_at=OLD, attained_gpu_seconds=4 * 2000.0)
    assert admitted(decide([moved, b, whole()])) == {"ns/big": ("n0000",), "ns/a": ("n0001",)}


def test_nothing_moves_for_a_gang_that_has_not_waited_long() -> None:
    d = decide([*halves(), whole(created=NOW - 100)])
    assert d.preempt == () and codes(d)["ns/big"] == PendingCode.FRAGMENTED
    d = decide([*halves(), whole(created=NOW - 400)])  # starving (a reservation), not for an hour
    assert d.preempt == () and d.wake_at == NOW - 400 + 3600


def test_nothing_moves_that_cannot_restart_elsewhere_at_once() -> None:
    a, b = halves()
    b = replace(b, workers=replace(b.workers, gpus_per_worker=5))  # 3 GPUs free on n0001: a does not fit
    d = decide([a, b, whole()])
    assert d.preempt == ()


def test_protected_gangs_stay() -> None:
    young = [replace(j, running=replace(j.running, started_at=NOW - 100)) for j in halves()]  # type: ignore[arg-type]
    pinned = halves(preemptible=False)
    higher = halves(priority=5)
    for jobs in (young, pinned, higher):
        assert decide([*jobs, whole()]).preempt == ()
    for policy in (PreemptionPolicy(preemptible=False), PreemptionPolicy(max_per_hour=2, recent=2)):
        s = snap(TWO, [queue("q"), queue("other", preemption=policy)], [*halves(), whole()])
        assert run(s).preempt == ()


def test_gangs_that_could_not_come_back_stay() -> None:
    """A moved gang rejoins its queue: nothing moves a gang whose queue is gone or held (Hold keeps
    running jobs running; they would wait Held, or blocked, once moved)."""
    for queues in ([queue("q")], [queue("q"), queue("other", held=True)]):
        s = snap(TWO, queues, [*halves(), whole()])
        assert run(s).preempt == ()


def test_consolidation_can_be_turned_off_and_bounded() -> None:
    off = SchedulerConfig(consolidation=Consolidation(enabled=False))
    assert decide([*halves(), whole()], off).preempt == ()
    tiny = SchedulerConfig(consolidation=Consolidation(max_moved_gpus=2))
    assert decide([*halves(), whole()], tiny).preempt == ()


@settings(max_examples=150, deadline=None)
@given(hs.integers(2, 6), hs.data())
def test_a_move_never_strands_the_moved_gangs(nodes_n: int, data: hs.DataObject) -> None:
    """Whatever small gangs run where, the decisions keep every invariant, and once the moved gangs
    are gone and the head runs where it was nominated, every moved gang fits at once."""
    nodes = cluster(racks=1, nodes_per_rack=nodes_n)
    small = []
    for n in nodes:
        used = 0
        for gpus in data.draw(hs.lists(hs.sampled_from([1, 2, 4]), max_size=4)):
            if used + gpus <= 8:
                used += gpus
                started = data.draw(hs.sampled_from([OLD, OLD, OLD, NOW - 100]))
                small.append(job(f"ns/s{len(small)}", "other", gpus=gpus, on=[n.name], started=started))
    free = 8 * nodes_n - sum(j.workers.total_gpus for j in small)
    replicas = data.draw(hs.integers(1, max(1, free // 8)))
    head = whole(replicas=replicas)
    config = SchedulerConfig()
    s1 = snap(nodes, QUEUES, [*small, head])
    d1 = run(s1, config=config)
    check_all(s1, d1, NOW, config)
    moved = {p.victim for p in d1.preempt}
    assert all(p.move for p in d1.preempt)
    if not moved:
        return
    (p,) = [p for p in d1.pending if p.job == "ns/big"]
    later = NOW + 60
    jobs = [replace(j, running=None, created_at=OLD) if j.key in moved else j for j in small]
    jobs.append(replace(head, running=Running(p.nominated, later)))
    d2 = run(snap(nodes, QUEUES, jobs), later, config)
    assert set(admitted(d2)) == moved


def test_nodes_are_cleared_in_one_rack_rather_than_cheapest_across_racks() -> None:
    nodes = cluster(racks=2, nodes_per_rack=2)  # racks r000: n0000 n0001, r001: n0010 n0011
    jobs = [
        job("ns/four", "other", gpus=4, on=["n0001"], started=OLD),
        job("ns/two", "other", gpus=2, on=["n0010"], started=OLD),  # cheaper to move, wrong rack
        job("ns/young", "other", gpus=6, on=["n0011"], started=NOW - 100),
        whole(replicas=2),
    ]
    config = SchedulerConfig()
    s = snap(nodes, QUEUES, jobs)
    d = run(s, config=config)
    check_all(s, d, NOW, config)
    assert [p.victim for p in d.preempt] == ["ns/four"]
    assert [p.nominated for p in d.pending if p.job == "ns/big"] == [("n0000", "n0001")]


def test_the_shell_is_told_when_a_waiting_head_starts_starving() -> None:
    d = decide([*halves(), whole(created=NOW - 100)])
    assert d.preempt == () and d.wake_at == NOW + 200  # created + starvation_seconds (300)
    a, b = halves()
    young = [with_running(a, ["n0000"], NOW - 10), with_running(b, ["n0001"], NOW - 20)]
    d = decide([*young, whole()])
    assert d.preempt == () and d.wake_at == NOW - 20 + 900  # a gang passes service.min_run_seconds
