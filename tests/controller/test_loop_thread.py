"""The loop runs the core off the event loop, and still isolates jobs the core fails on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from builders import RecordingWriter

from gpuq.controller import bodies as b
from gpuq.controller.cache import ClusterCache
from gpuq.controller.loop import BACKLOG_PAUSE_SECONDS, SchedulingLoop
from gpuq.controller.metrics import Metrics
from gpuq.core import SchedulerConfig
from gpuq.core.decisions import Decisions
from gpuq.core.model import Snapshot


def loop_with(schedule: Any) -> tuple[SchedulingLoop, RecordingWriter]:
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team")], "1")
    cache.replace("node", [b.node("n0")], "1")
    cache.replace("queue", [b.queue("q")], "1")
    jobs = [b.job(name, ns="team", replicas=1, gpus=1) for name in ("a", "bad")]
    cache.replace("job", jobs, "1")
    cache.replace("pod", [], "1")
    metrics = Metrics()
    writer = RecordingWriter(cache, metrics)
    return SchedulingLoop(
        cache, writer, SchedulerConfig(), metrics, schedule=schedule, clock=lambda: b.T0
    ), writer


async def test_the_event_loop_keeps_running_while_the_core_decides() -> None:
    released = threading.Event()
    seen: dict[str, Any] = {}

    def slow_core(snap: Snapshot, now: float, cfg: SchedulerConfig, explain: bool = True) -> Decisions:
        seen["thread"] = threading.current_thread()
        seen["released"] = released.wait(timeout=5)  # only the event loop can set it
        return Decisions()

    loop, _ = loop_with(slow_core)
    cycle = asyncio.create_task(loop.cycle_async())
    await asyncio.sleep(0.05)
    released.set()
    await cycle
    assert seen["released"] is True
    assert seen["thread"] is not threading.main_thread()
    assert loop.metrics.cycle._sum.get() > 0  # the second half ran: the cycle was recorded


async def test_a_job_the_core_fails_on_is_quarantined_and_the_rest_scheduled() -> None:
    calls: list[list[str]] = []

    def picky_core(snap: Snapshot, now: float, cfg: SchedulerConfig, explain: bool = True) -> Decisions:
        keys = [j.key for j in snap.jobs]
        calls.append(keys)
        if "team/bad" in keys:
            raise ValueError("the core cannot handle this job")
        return Decisions()

    loop, _ = loop_with(picky_core)
    await loop.cycle_async()
    assert sorted(calls[0]) == ["team/a", "team/bad"]
    assert calls[-1] == ["team/a"]  # the last run is the real one, without the culprit
    assert "team/bad" in loop.quarantine.active({"team/a": 1, "team/bad": 1})


def test_cycles_slow_down_while_admissions_wait_for_the_writer() -> None:
    """With admissions queued behind the writer's slots, a cycle could bind nothing sooner: the loop
    waits BACKLOG_PAUSE_SECONDS; without a backlog, only the debounce."""
    loop, writer = loop_with(lambda snap, now, cfg: Decisions())
    assert loop._pause() == loop.debounce < BACKLOG_PAUSE_SECONDS
    writer.admissions_waiting = 3
    assert loop._pause() == BACKLOG_PAUSE_SECONDS
    writer.admissions_waiting = 0
    assert loop._pause() == loop.debounce


def test_a_term_s_first_cycle_runs_without_the_collector_and_freezes_what_it_made() -> None:
    """With freeze_first_cycle (the operator's), the first cycle pauses Python's collector and then
    freezes what it made (later collections skip it); the cycles after it leave the collector be."""
    import gc

    seen: list[bool] = []

    def core(snap: Snapshot, now: float, cfg: SchedulerConfig, explain: bool = True) -> Decisions:
        seen.append(gc.isenabled())
        return Decisions()

    loop, _ = loop_with(core)
    loop._freeze_first = True
    frozen = gc.get_freeze_count()
    try:
        loop.cycle()
        assert seen == [False] and gc.isenabled()
        assert gc.get_freeze_count() > frozen
        after = gc.get_freeze_count()
        loop.cycle()
        assert seen == [False, True] and gc.get_freeze_count() <= after  # (frozen objects still die)
    finally:
        gc.unfreeze()  # the rest of the test session as it was (pytest collects normally)
        gc.enable()
    plain, _ = loop_with(core)  # tests and tools that do not ask for it keep the collector on
    plain.cycle()
    assert seen[-1] is True
