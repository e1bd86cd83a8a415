"""Informers: the watch starts at the list's version, and a relist after 410 Gone replaces the
cache, so objects deleted while the watch was down do not linger as ghosts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from builders import job, namespace, pod
from fakeapi import FakeApi, Reply, client, serve

from gpuq.controller.cache import ClusterCache
from gpuq.controller.informer import Informer

PATH = "/api/v1/namespaces"


def listing(rv: str, *names: str) -> Reply:
    items = [namespace(n) for n in names]
    for item in items:
        item["metadata"]["resourceVersion"] = "5"
    return Reply(body={"metadata": {"resourceVersion": rv}, "items": items})


def event(kind: str, name: str, rv: str) -> dict:
    body = namespace(name)
    body["metadata"]["resourceVersion"] = rv
    return {"type": kind, "object": body}


async def test_watch_expiry_relists_and_drops_what_the_list_lacks() -> None:
    fake = FakeApi()
    fake.on("GET", PATH, listing("10", "a", "b"), listing("20", "a", "c", "d"))
    fake.on(
        "WATCH",
        PATH,
        Reply(
            stream=[
                event("ADDED", "c", "11"),
                {"type": "ERROR", "object": {"code": 410, "reason": "Expired"}},
            ]
        ),
        Reply(stream=[event("DELETED", "d", "21")], hold=True),
    )
    cache = ClusterCache()
    async for server in serve(fake):
        async with client(server) as api:
            inf = Informer(api, "namespace", PATH, cache)
            task = asyncio.create_task(inf.run())
            for _ in range(200):
                if inf.lists == 2 and "d" not in cache.namespaces:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
    assert sorted(cache.namespaces) == ["a", "c"]  # b was deleted while the watch was down
    watches = [s.query["resourceVersion"] for s in fake.requests("GET", PATH) if s.query.get("watch")]
    assert watches == ["10", "20"]  # each watch starts exactly where its list ended


async def list_once(fake: FakeApi, cache: ClusterCache, held: tuple[str, ...]) -> Informer:
    """The cache holding namespaces `held` (at version 3) lists them once from `fake`."""
    for name in held:
        body = namespace(name)
        body["metadata"]["resourceVersion"] = "3"
        cache.apply("namespace", "ADDED", body)
    async for server in serve(fake):
        async with client(server) as api:
            inf = Informer(api, "namespace", PATH, cache)
            task = asyncio.create_task(inf.run())
            await asyncio.wait_for(inf.synced.wait(), 5)
            task.cancel()
    return inf


class PageCountingCache(ClusterCache):
    def __init__(self) -> None:
        super().__init__()
        self.pages: list[int] = []

    def list_page(self, kind: str, bodies: Iterable[Mapping[str, Any]], listed: set[str]) -> None:
        bodies = list(bodies)
        self.pages.append(len(bodies))
        super().list_page(kind, bodies, listed)


async def test_a_list_is_applied_page_by_page_and_drops_what_no_page_had() -> None:
    # The cache takes each page as it arrives (100,000 decoded pods are never held at once); what
    # the whole list lacked is dropped once its last page is in, not what an early page lacked.
    first = listing("10", "a")
    first.body["metadata"] = {"continue": "page-2"}  # a page that is not the last
    fake = FakeApi()
    fake.on("GET", PATH, first, listing("10", "b"))
    fake.on("WATCH", PATH, Reply(stream=[], hold=True))
    cache = PageCountingCache()
    inf = await list_once(fake, cache, held=("b", "gone"))
    assert cache.pages == [1, 1]  # each page went in on its own
    assert sorted(cache.namespaces) == ["a", "b"]
    assert inf.resource_version == "10"
    pages = [s.query for s in fake.requests("GET", PATH) if not s.query.get("watch")]
    assert [q.get("continue") for q in pages] == [None, "page-2"]


class FailingPageCache(ClusterCache):
    def list_page(self, kind: str, bodies: Iterable[Mapping[str, Any]], listed: set[str]) -> None:
        raise RuntimeError("a bug in the sink")


async def test_a_page_the_cache_failed_on_drops_nothing() -> None:
    # The keys of a page it failed on may be missing from those listed: nothing is dropped then, as
    # nothing was when a whole list failed.
    fake = FakeApi()
    fake.on("GET", PATH, listing("10", "kept"))
    fake.on("WATCH", PATH, Reply(stream=[], hold=True))
    cache = FailingPageCache()
    await list_once(fake, cache, held=("kept",))
    assert list(cache.namespaces) == ["kept"]


def test_replace_keeps_objects_newer_than_the_list() -> None:
    """A pod the writer just created (its version is later than the list's) is not a deletion."""
    cache = ClusterCache()
    old = pod("old", node_name="n1", job_name="j")
    fresh = pod("fresh", node_name="n1", job_name="j")
    old["metadata"]["resourceVersion"], fresh["metadata"]["resourceVersion"] = "5", "30"
    cache.upsert_pod(old)
    cache.upsert_pod(fresh)
    cache.replace("pod", [], "20")
    assert list(cache.pods) == ["team-a/fresh"]


def test_replace_in_a_namespace_scope_leaves_other_namespaces_alone() -> None:
    cache = ClusterCache()
    a, b = job("x", ns="team-a"), job("y", ns="team-b")
    a["metadata"]["resourceVersion"] = b["metadata"]["resourceVersion"] = "1"
    cache.upsert_job(a)
    cache.upsert_job(b)
    cache.replace("job", [], "5", scope="team-a")
    assert list(cache.jobs) == ["team-b/y"]
    assert "uid-team-a-x" in cache.deleted_jobs  # its pods become orphans, as on a DELETED event
