"""Routine Events are rate-limited (a burst of admissions must not spend the API budget on them);
Warnings always go out. Against a real HTTP server."""

from __future__ import annotations

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
