"""Leader election against a real HTTP server: the Lease's requests never wait for a connection
behind the operator's other requests. Under a burst every connection of the operator's client can
be busy for seconds (gang creates, status writes on a loaded API server); a renewal queued behind
them timed out, the fence closed, and each new term's relist made the next loss likelier
(bench/kueue_perf.py on Kueue's baseline: seven terms lost in six minutes, 9 of 15,000 jobs done)."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestServer
from fakeapi import FakeApi, Reply, client

from gpuq.controller.leader import LeaderElector, LeaseConfig

LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpuq-system/leases"
BUSY = "/api/v1/namespaces/a/pods"


def lease(holder: str, rv: str) -> dict[str, object]:
    return {
        "metadata": {"name": "gpuq-operator", "namespace": "gpuq-system", "resourceVersion": rv},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


async def test_a_renewal_does_not_wait_for_the_writers_connections(fake: FakeApi, server: TestServer) -> None:
    cfg = LeaseConfig(identity="me", lease_duration=3.0, renew_deadline=2.0, retry_period=0.5)
    fake.on("GET", f"{LEASES}/gpuq-operator", Reply(404, {"reason": "NotFound"}))
    fake.on("POST", LEASES, Reply(201, lease("me", "1")))
    fake.on("PUT", f"{LEASES}/gpuq-operator", Reply(200, lease("me", "2")))
    fake.on("POST", BUSY, Reply(201, {}, delay=3.0))  # a loaded API server: each create takes 3 s
    async with client(server, max_connections=2) as api:
        elector = LeaderElector(api, cfg)
        try:
            assert await elector._try_take()
            # The writer's creates take every connection of the operator's client.
            busy = [asyncio.create_task(api.create(BUSY, {})) for _ in range(4)]
            await asyncio.sleep(0.1)
            assert await elector._renew(1.0)  # within the fence, while every connection is busy
            assert elector.may_write()
            for task in busy:
                task.cancel()
            await asyncio.gather(*busy, return_exceptions=True)
        finally:
            await elector.close()
    assert len(fake.requests("PUT", f"{LEASES}/gpuq-operator")) == 1
