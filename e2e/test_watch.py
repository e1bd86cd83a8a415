"""Watches against a real API server: when a watch's resourceVersion is gone (410 Gone after the
API server restarted with a fresh watch cache), the informer lists again and the list *replaces*
the cache: an object deleted while the watch was down does not linger as a ghost."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import test_operator as shared
from gpuq.controller.cache import ClusterCache
from gpuq.controller.informer import Informer
from gpuq.controller.kubeapi import KubeApi, load_credentials, queue_path
from gpuq.controller.testing import GpuqClient
from gpuq.devcluster.testing import E2ECluster

pytestmark = pytest.mark.e2e

gpuq = shared.gpuq


async def until(check: object, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_watch_expiry_relists_and_drops_what_was_deleted_meanwhile(
    cluster: E2ECluster, gpuq: GpuqClient
) -> None:
    if cluster.dev is None:
        pytest.skip("needs a gpuq dev cluster: the test restarts its API server")
    tag = uuid.uuid4().hex[:6]
    keep, gone, new = f"keep-{tag}", f"gone-{tag}", f"new-{tag}"
    gpuq.create_queue(keep, 8)
    gpuq.create_queue(gone, 8)
    cache = ClusterCache()
    try:
        async with KubeApi(load_credentials(str(cluster.kubeconfig))) as api:
            inf = Informer(api, "queue", queue_path(), cache)
            task = asyncio.create_task(inf.run())
            await until(lambda: {keep, gone} <= set(cache.queues), 30, "both queues in the cache")
            task.cancel()  # the watch is down; the informer keeps its resourceVersion
            gpuq.delete_queue(gone)
            gpuq.create_queue(new, 8)
            await asyncio.to_thread(cluster.dev.restart_component, "kube-apiserver")
            lists = inf.lists
            task = asyncio.create_task(inf.run())
            await until(lambda: inf.lists > lists, 60, "a relist after 410 Gone")
            await until(lambda: new in cache.queues, 30, "the new queue")
            task.cancel()
        assert keep in cache.queues and gone not in cache.queues
    finally:
        for name in (keep, gone, new):
            gpuq.delete_queue(name)
