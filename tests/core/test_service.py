"""Attained-service ordering (ServiceOrdering, Tiresias' discretized LAS): lower levels first within a
queue and priority, and running jobs at a higher level are victims of their own queue's new work."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as hs

from gpuq.core import ClusterIndex, SchedulerConfig, schedule
from gpuq.core.config import ServiceOrdering
from gpuq.core.decisions import PendingCode
from gpuq.core.model import Job
from gpuq.core.service import LevelCache, ServiceView, attained, level_of, service_times

from .helpers import NOW, admitted, cluster, codes, job, queue, run, snap

ONE_NODE = cluster(racks=1, nodes_per_rack=1)
HOUR = 3600.0
FIFO = SchedulerConfig(service=ServiceOrdering(thresholds_gpu_hours=()))


def victims(d: object) -> set[str]:
    return {p.victim for p in d.preempt}  # type: ignore[attr-defined]


def test_levels_count_the_thresholds_reached_by_gpu_time_over_all_attempts() -> None:
    fresh = job("ns/a", gpus=8)
    resumed = job("ns/b", gpus=8, attained_gpu_seconds=0.5 * HOUR)
    running = job("ns/c", gpus=4, on=["n0000"], started=NOW - 1000, attained_gpu_seconds=0.5 * HOUR)
    view = ServiceView(ServiceOrdering(thresholds_gpu_hours=(1.0, 10.0)), NOW)
    assert attained(running, NOW) == 0.5 * HOUR + 4 * 1000
    assert [view.level(j) for j in (fresh, resumed, running)] == [0, 0, 1]
    assert level_of(attained(running, NOW), ()) == 0


def test_a_job_with_more_attained_service_waits_behind_newer_work_of_its_queue() -> None:
    old = job("ns/old", gpus=8, created=100.0, attained_gpu_seconds=2 * HOUR)  # preempted before
    new = job("ns/new", gpus=8, created=800.0)
    d = run(snap(ONE_NODE, [queue()], [old, new]))
    assert admitted(d) == {"ns/new": ("n0000",)}
    d = run(snap(ONE_NODE, [queue()], [old, new]), config=FIFO)
    assert admitted(d) == {"ns/old": ("n0000",)}  # off: plain FIFO


def test_new_work_preempts_a_long_runner_of_its_own_queue_and_priority() -> None:
    long_runner = job("ns/long", gpus=8, on=["n0000"], started=NOW - 1000)  # 8,000 GPU-s: level 1
    new = job("ns/new", gpus=8)
    d = run(snap(ONE_NODE, [queue()], [long_runner, new]))
    assert victims(d) == {"ns/long"}
    assert codes(d)["ns/new"] == PendingCode.WAITING_FOR_PREEMPTION


def test_no_preemption_by_service_before_min_run_or_across_queues_or_when_off() -> None:
    new = job("ns/new", gpus=8)
    short_attempt = job("ns/long", gpus=8, on=["n0000"], started=NOW - 600, attained_gpu_seconds=5 * HOUR)
    assert victims(run(snap(ONE_NODE, [queue()], [short_attempt, new]))) == set()
    other_queue = job("ns/long", "other", gpus=8, on=["n0000"], started=NOW - 1000)
    queues = [queue(), queue("other")]
    assert victims(run(snap(ONE_NODE, queues, [other_queue, new]))) == set()
    long_runner = job("ns/long", gpus=8, on=["n0000"], started=NOW - 1000)
    assert victims(run(snap(ONE_NODE, [queue()], [long_runner, new]), config=FIFO)) == set()
    no_preempt = SchedulerConfig(service=ServiceOrdering(preempt=False))
    assert victims(run(snap(ONE_NODE, [queue()], [long_runner, new]), config=no_preempt)) == set()


def test_equal_levels_never_preempt_each_other() -> None:
    runner = job("ns/r", gpus=8, on=["n0000"], started=NOW - 1000)
    resumed = job("ns/p", gpus=8, attained_gpu_seconds=3 * HOUR)  # level 1 too
    assert victims(run(snap(ONE_NODE, [queue()], [runner, resumed]))) == set()


def test_the_cycle_memo_expires_when_a_runner_reaches_its_minimum_run() -> None:
    """Time alone makes a runner a victim: a memo from before must not hide it."""
    config = SchedulerConfig(starvation_seconds=1e9)  # the head's role stays the same
    runner = job("ns/long", gpus=8, on=["n0000"], started=NOW - 600, attained_gpu_seconds=5 * HOUR)
    s = snap(ONE_NODE, [queue()], [runner, job("ns/new", gpus=8)])
    ix = ClusterIndex(s, config)
    first = schedule(s, NOW, config, index=ix, explain=False)
    assert first.preempt == ()
    ix.apply(s, nodes=(), jobs=(), removed_jobs=())
    later = NOW - 600 + config.service.min_run_seconds
    assert min(t for t in service_times(runner, config.service) if t > NOW) == later
    assert ix.next_service_event(NOW) == later
    assert victims(schedule(s, later, config, index=ix, explain=False)) == {"ns/long"}


TWO_NODES = cluster(racks=1, nodes_per_rack=2)


def test_a_multi_node_gang_is_spared_for_a_smaller_job_but_not_for_a_larger_or_equal_one() -> None:
    # 16 GPUs on two nodes for 1,000 s: level 1; a fresh job of its queue at level 0 outranks it.
    gang = job("ns/gang", replicas=2, gpus=8, on=["n0000", "n0001"], started=NOW - 1000)
    small = job("ns/small", gpus=8)
    assert victims(run(snap(TWO_NODES, [queue()], [gang, small]))) == set()
    same = job("ns/same", replicas=2, gpus=8)
    assert victims(run(snap(TWO_NODES, [queue()], [gang, same]))) == {"ns/gang"}
    off = SchedulerConfig(service=ServiceOrdering(spare_larger_gangs=False))
    assert victims(run(snap(TWO_NODES, [queue()], [gang, small]), config=off)) == {"ns/gang"}


def test_a_single_node_gang_stays_a_victim_of_a_smaller_job() -> None:
    runner = job("ns/long", gpus=8, on=["n0000"], started=NOW - 1000)
    small = job("ns/small", gpus=2)
    assert victims(run(snap(ONE_NODE, [queue()], [runner, small]))) == {"ns/long"}


def _outranked_fresh_and_kept(
    cache: LevelCache, rule: ServiceOrdering, now: float, running: list[Job]
) -> None:
    """The kept tables answer like a scan of the running jobs at `now` (for a job sparing none and one
    sparing multi-node gangs, at each level: outranks_any's answers are kept by the cache until a
    queue's table changes)."""
    kept, scan = ServiceView(rule, now, cache), ServiceView(rule, now)
    for need, served in itertools.product((1, 10**6), (0.0, 1800.0, 7200.0)):
        asking = job("ns/asking", gpus=need, attained_gpu_seconds=served)
        for q in ("a", "b"):
            mine = [j for j in running if j.queue == q]
            assert kept.outranked(q, mine, asking) == scan.outranked(q, mine, asking), (q, now, need)
            assert kept.outranks_any(q, mine, asking) == bool(scan.outranked(q, mine, asking))


@settings(max_examples=300, deadline=None)
@given(hs.data())
def test_kept_level_tables_equal_a_scan_at_every_instant(data: hs.DataObject) -> None:
    """LevelCache (kept by the index, moved by scheduled level and minimum-run times) gives the same
    entries as scanning every running job, at instants exactly on those times and one float step
    around them, with jobs starting and stopping in between and time going back."""
    rule = ServiceOrdering(
        thresholds_gpu_hours=(0.25, 1.0), min_run_seconds=data.draw(hs.sampled_from((0.0, 60.0)))
    )
    jobs: dict[str, Job] = {}
    cache = LevelCache(rule, jobs)
    running: list[Job] = []
    now = NOW
    for step in range(data.draw(hs.integers(1, 12))):
        if data.draw(hs.booleans()) or not running:  # a job starts (at or before now)
            nodes = data.draw(hs.sampled_from((["n0000"], ["n0000", "n0001"])))
            j = job(
                f"ns/j{step}",
                queue=data.draw(hs.sampled_from("ab")),
                gpus=data.draw(hs.integers(1, 8)),
                replicas=len(nodes),
                on=nodes,
                started=now - data.draw(hs.sampled_from((0.0, 30.0, 333.3, 2000.0))),
                attained_gpu_seconds=data.draw(hs.sampled_from((0.0, 899.9, 3600.0, 7777.7))),
            )
            running.append(j)
            jobs[j.key] = j
            cache.add(j)
        else:  # one stops
            j = running.pop(data.draw(hs.integers(0, len(running) - 1)))
            del jobs[j.key]
            cache.remove(j)
        times = sorted({t for r in running for t in service_times(r, rule)})
        pick = data.draw(hs.sampled_from(["on", "after", "before", "back"])) if times else "after"
        if pick == "back":
            now -= 500.0
        elif pick == "after":
            now += data.draw(hs.sampled_from((0.0, 1.0, 900.0)))
        else:
            t = data.draw(hs.sampled_from(times))
            t = t if pick == "on" else math.nextafter(t, -math.inf)
            now = max(now, t)
        _outranked_fresh_and_kept(cache, rule, now, running)


def test_a_new_checkpoint_keeps_the_service_times_and_a_called_off_eviction_schedules_them_again() -> None:
    """The index schedules a running job's level and minimum-run times once per attempt: a new
    checkpoint does not add them again, and a job that stops evicting (whose times next_service_event
    dropped) gets them back, so the cycle memo still expires when it becomes a victim."""
    from dataclasses import replace

    from gpuq.core.model import Checkpoint, Snapshot

    cfg = SchedulerConfig()
    runner = job("ns/r", gpus=8, on=["n0000"], started=NOW - 100)
    s1 = snap(ONE_NODE, [queue()], [runner])
    ix = ClusterIndex(s1, cfg)
    first = NOW - 100 + 3600 / 8  # level 1: one GPU-hour on 8 GPUs, before its minimum run
    assert ix.next_service_event(NOW) == first  # its first call fills the heap (not the build)
    scheduled = len(ix.service_events)
    assert scheduled > 0
    checkpointed = replace(runner, checkpoint=Checkpoint(NOW, 10, "s3://x"))
    s2 = Snapshot(s1.topology, s1.nodes, s1.queues, (checkpointed,))
    ix.apply(s2, jobs=[checkpointed])
    assert len(ix.service_events) == scheduled
    assert ix.next_service_event(NOW) == first
    evicting = replace(checkpointed, evicting=True)
    ix.apply(Snapshot(s1.topology, s1.nodes, s1.queues, (evicting,)), jobs=[evicting])
    assert ix.next_service_event(NOW) == float("inf")  # a leaving gang becomes no victim
    kept = replace(evicting, evicting=False)
    ix.apply(Snapshot(s1.topology, s1.nodes, s1.queues, (kept,)), jobs=[kept])
    assert ix.next_service_event(NOW) == first
