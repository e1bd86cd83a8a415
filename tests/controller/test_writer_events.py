"""Routine Events are rate-limited (a burst of admissions must not spend the API budget on them);
Warnings always go out. Against a real HTTP server."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestServer
from builders import job
from fakeapi import FakeApi, Reply, client

from gpuq.controller import status as st
from gpuq.controller.cache import ClusterCache
from gpuq.controller.metrics import Metrics
from gpuq.controller.objects import parse_job
from gpuq.controller.writer import NORMAL_EVENTS_BURST, Writer

EVENTS = "/api/v1/namespaces/ns/events"


async def test_a_burst_of_normal_events_is_capped_warnings_are_not(fake: FakeApi, server: TestServer) -> None:
    fake.on("POST", EVENTS, Reply(201, {"kind": "Event"}))
    metrics = Metrics()
    writer = Writer(client(server), ClusterCache(), metrics, on_done=lambda: None)
    for i in range(NORMAL_EVENTS_BURST + 20):
        await writer.object_event("ns", "TrainingJob", f"j{i}", "uid", st.normal("Admitted", "admitted"))
    for i in range(5):
        await writer.object_event("ns", "TrainingJob", f"w{i}", "uid", st.warning("Failed", "boom"))
    posted = [s.body["reason"] for s in fake.requests("POST", EVENTS)]
    # The bucket refills at NORMAL_EVENTS_PER_SECOND while the test runs: allow a few more.
    assert NORMAL_EVENTS_BURST <= posted.count("Admitted") < NORMAL_EVENTS_BURST + 10
    assert posted.count("Failed") == 5
    dropped = metrics.registry.get_sample_value("gpuq_events_dropped_total", {"reason": "Admitted"})
    assert dropped == NORMAL_EVENTS_BURST + 20 - posted.count("Admitted")


async def test_a_waiting_jobs_status_takes_the_routine_budget_not_the_admissions(
    fake: FakeApi, server: TestServer
) -> None:
    """A burst of new jobs brings a status write each (Queued, reason, position); in the client's
    main bucket they queued ahead of every admission and every Succeeded, and finished jobs' quota
    came free minutes late. They spend a budget of their own."""
    path = "/apis/gpuq.dev/v1alpha1/namespaces/team-a/trainingjobs/a/status"
    fake.on("PATCH", path, Reply(200, job("a")))
    async with client(server, qps=1.0, burst=4) as api:
        writer = Writer(api, ClusterCache(), Metrics(), on_done=lambda: None)
        entry = parse_job(job("a"))
        for _ in range(3):
            api.limiter.reserve()  # admissions have spent most of the main bucket
        main = api.limiter._tokens
        await writer.patch_job_status(entry, {"phase": "Queued"}, routine=True)
        assert api.limiter._tokens == main and api.routine_limiter._tokens < api.routine_limiter.burst
        await writer.patch_job_status(entry, {"phase": "Running"})
        assert api.limiter._tokens < main  # what is not routine pays the main bucket
    assert len(fake.requests("PATCH", path)) == 2


async def test_an_admission_supersedes_the_jobs_status_write_still_waiting_for_its_budget(
    fake: FakeApi, server: TestServer
) -> None:
    """Under a burst the routine budget has minutes of writes queued; a queue head whose Queued
    status is among them must not wait that long to be admitted. Its waiting write is cancelled
    (nothing was sent) and the admission runs at once; writes already sent are never cancelled."""
    for name in ("a", "b"):
        path = f"/apis/gpuq.dev/v1alpha1/namespaces/team-a/trainingjobs/{name}/status"
        fake.on("PATCH", path, Reply(200, job(name), delay=0.3 if name == "b" else 0.0))
    async with client(server, qps=4.0, burst=4) as api:  # routine budget: 1/s, burst 1
        writer = Writer(api, ClusterCache(), Metrics(), on_done=lambda: None)
        a, b = parse_job(job("a")), parse_job(job("b"))
        admitted = asyncio.Event()

        async def admit() -> None:
            admitted.set()

        assert writer.submit(b.key, lambda: writer.patch_job_status(b, {"phase": "Queued"}, routine=True))
        assert writer.submit(a.key, lambda: writer.patch_job_status(a, {"phase": "Queued"}, routine=True))
        await asyncio.sleep(0.05)  # b took the one token and was sent; a waits about a second
        assert not writer.supersede(b.key)  # in flight: it stays
        assert writer.supersede(a.key)
        writer.submit(a.key, admit)
        await asyncio.wait_for(admitted.wait(), 0.5)
        await writer.drain()
    assert fake.requests("PATCH", "/apis/gpuq.dev/v1alpha1/namespaces/team-a/trainingjobs/a/status") == []
    assert len(fake.requests("PATCH", "/apis/gpuq.dev/v1alpha1/namespaces/team-a/trainingjobs/b/status")) == 1
    assert writer.busy == set()
