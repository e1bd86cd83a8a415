"""The API error policy, against a real HTTP server: what is retried, what is not, the fence on
writes, the rate limiter, optimistic-concurrency preconditions and long watch lines."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestServer
from fakeapi import FakeApi, Reply, client, serve

from gpuq.controller.kubeapi import ApiError, ApiPolicy, NotLeader, TokenBucket, backoff_delay

PATH = "/api/v1/namespaces/a/pods"


async def test_throttled_and_failing_requests_are_retried(fake: FakeApi, server: TestServer) -> None:
    fake.on(
        "POST",
        PATH,
        Reply(429, {"reason": "TooManyRequests"}, {"Retry-After": "0"}),
        Reply(503, {"reason": "ServiceUnavailable"}),
        Reply(201, {"kind": "Pod"}),
    )
    async with client(server) as api:
        assert await api.create(PATH, {"kind": "Pod"}) == {"kind": "Pod"}
        assert len(fake.requests("POST", PATH)) == 3 and api.retries == 2


async def test_permanent_errors_are_not_retried(fake: FakeApi, server: TestServer) -> None:
    fake.on("POST", PATH, Reply(422, {"reason": "Invalid", "message": "bad pod"}))
    async with client(server) as api:
        with pytest.raises(ApiError) as err:
            await api.create(PATH, {})
    assert err.value.status == 422 and not err.value.transient and err.value.message == "bad pod"
    assert len(fake.requests("POST", PATH)) == 1


async def test_retries_give_up_with_a_transient_error(fake: FakeApi, server: TestServer) -> None:
    fake.on("GET", PATH, Reply(500, {"reason": "InternalError"}))
    async with client(server, max_retries=2) as api:
        with pytest.raises(ApiError) as err:
            await api.get(PATH)
    assert err.value.status == 500 and err.value.transient
    assert len(fake.requests("GET", PATH)) == 3


async def test_no_answer_is_a_transient_error() -> None:
    fake = FakeApi()
    async for server in serve(fake):
        api = client(server, max_retries=1)
    with pytest.raises(ApiError) as err:  # the server is gone: connection refused
        await api.get(PATH)
    await api.close()
    assert err.value.status == 0 and err.value.transient


async def test_the_fence_stops_writes_but_not_reads_or_the_lease(fake: FakeApi, server: TestServer) -> None:
    fake.on("GET", PATH, Reply(200, {"items": []}))
    fake.on("POST", PATH, Reply(201, {}))
    async with client(server) as api:
        api.fence = lambda: False
        with pytest.raises(NotLeader):
            await api.create(PATH, {})
        assert fake.requests("POST", PATH) == []
        await api.get(PATH)
        await api.request("POST", PATH, {}, fenced=False)
        assert len(fake.requests("POST", PATH)) == 1


async def test_the_fence_is_checked_before_every_retry(fake: FakeApi, server: TestServer) -> None:
    fake.on("POST", PATH, Reply(503, {}))
    open_ = [True]
    async with client(server) as api:
        api.fence = lambda: open_[0]
        api.observe = lambda _verb, _code: open_.__setitem__(0, False)  # lost the lease meanwhile
        with pytest.raises(NotLeader):
            await api.create(PATH, {})
    assert len(fake.requests("POST", PATH)) == 1


async def test_a_write_that_waited_for_a_connection_checks_the_fence_again(
    fake: FakeApi, server: TestServer
) -> None:
    """Every connection stuck (on a frozen API server, say): a write queued behind them must not go
    out once it finally gets one, if the lease was lost meanwhile."""
    fake.on("GET", PATH, Reply(200, {}, delay=0.3))
    fake.on("POST", PATH, Reply(201, {}))
    open_ = [True]
    async with client(server, max_connections=1) as api:
        api.fence = lambda: open_[0]
        slow = asyncio.create_task(api.get(PATH))
        await asyncio.sleep(0.05)  # the GET holds the only connection
        write = asyncio.create_task(api.create(PATH, {}))
        await asyncio.sleep(0.05)  # the write passed the first check and waits for the connection
        open_[0] = False
        await slow
        with pytest.raises(NotLeader):
            await write
    assert fake.requests("POST", PATH) == []


async def test_the_lease_never_queues_behind_writes_and_refused_writes_take_no_token(
    fake: FakeApi, server: TestServer
) -> None:
    """A renewal stuck behind a backlog of writes in the rate limiter lets the fence close while
    the backlog waits for it to open again: a livelock bench/chaos.py found after API server restarts."""
    fake.on("PUT", PATH, Reply(200, {}))
    async with client(server, qps=1.0, burst=1) as api:
        api.limiter.reserve()
        api.limiter.reserve()  # in debt: the next limited request would wait about a second
        tokens = api.limiter._tokens
        api.fence = lambda: False
        with pytest.raises(NotLeader):
            await api.create(PATH, {})
        assert api.limiter._tokens == tokens  # refused before queueing
        await api.request("PUT", PATH, {}, fenced=False, limited=False)
        assert api.limiter.waited == 0.0


async def test_events_have_a_rate_budget_of_their_own(fake: FakeApi, server: TestServer) -> None:
    """Like client-go's event recorders: a backlog of pod creates must not delay Events, nor
    Events spend the tokens pods need."""
    events = "/api/v1/namespaces/ns/events"
    fake.on("POST", events, Reply(201, {}))
    async with client(server, qps=1.0, burst=1) as api:
        api.limiter.reserve()
        api.limiter.reserve()  # writes in debt: the next one would wait about a second
        tokens = api.limiter._tokens
        await api.create_event("ns", {"reason": "Admitted"})
        assert api.limiter._tokens == tokens and api.limiter.waited == 0.0
        assert api.event_limiter._tokens < 1.0  # the event paid its own bucket
    assert len(fake.requests("POST", events)) == 1


async def test_preconditions_are_sent(fake: FakeApi, server: TestServer) -> None:
    fake.on("PATCH", f"{PATH}/p/status", Reply(200, {}))
    fake.on("DELETE", f"{PATH}/p", Reply(200, {}))
    async with client(server) as api:
        await api.merge_patch(f"{PATH}/p/status", {"status": {"phase": "Admitted"}}, resource_version="41")
        await api.delete(f"{PATH}/p", grace_seconds=0, uid="u-1")
    patch = fake.requests("PATCH", f"{PATH}/p/status")[0].body
    assert patch == {"status": {"phase": "Admitted"}, "metadata": {"resourceVersion": "41"}}
    delete = fake.requests("DELETE", f"{PATH}/p")[0].body
    assert delete["preconditions"] == {"uid": "u-1"} and delete["gracePeriodSeconds"] == 0


async def test_watch_reads_lines_longer_than_readline_allows(fake: FakeApi, server: TestServer) -> None:
    big = {
        "type": "ADDED",
        "object": {"metadata": {"name": "x", "resourceVersion": "7"}, "data": "y" * 300_000},
    }
    fake.on(
        "WATCH",
        PATH,
        Reply(stream=[big, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}]),
    )
    async with client(server) as api:
        events = [e async for e in api.watch(PATH, "5")]
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"] and len(
        events[0]["object"]["data"]
    ) == 300_000
    query = fake.requests("GET", PATH)[0].query
    assert query["resourceVersion"] == "5" and query["allowWatchBookmarks"] == "true"


def test_backoff_grows_is_jittered_capped_and_honours_retry_after() -> None:
    policy = ApiPolicy(backoff_base=0.2, backoff_max=10.0)
    assert [backoff_delay(a, policy, None, 1.0) for a in range(4)] == [0.2, 0.4, 0.8, 1.6]
    assert backoff_delay(3, policy, None, 0.0) == 0.8  # jitter takes up to half away
    assert backoff_delay(20, policy, None, 1.0) == 10.0
    assert backoff_delay(0, policy, 3.0, 0.5) == 3.0
    assert backoff_delay(0, policy, 60.0, 0.5) == 10.0


def test_token_bucket_allows_a_burst_then_paces() -> None:
    t = [0.0]
    bucket = TokenBucket(qps=2.0, burst=3, mono=lambda: t[0])
    assert [bucket.reserve() for _ in range(5)] == [0.0, 0.0, 0.0, 0.5, 1.0]
    t[0] = 10.0  # idle: the bucket refills to its burst, no more
    assert [bucket.reserve() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]
    assert TokenBucket(qps=0, burst=1).reserve() == 0.0  # 0: no limit
