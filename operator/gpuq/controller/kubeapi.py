"""A small async Kubernetes REST client (aiohttp): the operator's lists, watches and writes.

Credentials come from the official client's loaders (kubeconfig or in-cluster service account), so
every auth method they support works; requests go straight over aiohttp with JSON dicts, without the
official client's model (de)serialisation, which dominates CPU at a thousand pods a minute.

The API error policy lives here, in one place (docs/operations.md, "API errors"):
- a client-side token bucket (qps/burst, like client-go's) paces every request but watches;
- 429 and 5xx answers and lost connections are retried with jittered exponential back-off, never
  sooner than the server's Retry-After; other errors are permanent and raised at once;
- a mutating request is refused (NotLeader) unless `fence()` says this process may write now: the
  leader-election lease is checked on every write path, including each retry.
Every response also feeds `clock`, the API server's clock as seen from here (gpuq.controller.clock).
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from gpuq.api import meta
from gpuq.controller.clock import ServerClock

MERGE_PATCH = "application/merge-patch+json"
TRANSIENT_STATUSES = frozenset({0, 429, 500, 502, 503, 504})
UNAVAILABLE = 0  # ApiError.status of a request that got no HTTP answer (connection, timeout)


class ApiError(Exception):
    """An error answer of the API server, or (status 0) no answer at all."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Worth retrying later: throttled, a server-side failure, or no answer."""
        return self.status in TRANSIENT_STATUSES

    @property
    def gone(self) -> bool:
        """410: a watch's resourceVersion is too old (compacted); list again."""
        return self.status == 410

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        return self.status == 422


class NotLeader(Exception):
    """A write was refused locally: this process does not (or no longer surely) hold the lease."""


@dataclass(frozen=True, slots=True)
class ApiPolicy:
    """Client-side rate limit and retry policy (flags of `gpuq operator run`)."""

    # Sustained requests per second: gpuq writes what a workload controller (pod creates, status) and
    # a scheduler (placements) write between them; the server's priority and fairness and the 429
    # retries below protect it (docs/operations.md, "API errors").
    qps: float = 200.0
    burst: int = 400
    max_retries: int = 6  # of one request on a transient error: ~13 s of back-off in all
    backoff_base: float = 0.2
    backoff_max: float = 10.0
    timeout: float = 30.0  # one attempt


class TokenBucket:
    """`qps` tokens a second, at most `burst` saved up; acquire() waits for one (FIFO-fair enough:
    each waiter reserves its token before sleeping, so nobody is starved)."""

    def __init__(self, qps: float, burst: int, mono: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self.mono = mono
        self._tokens = float(self.burst)
        self._at = mono()
        self.waited = 0.0  # seconds spent waiting, in all

    def _refill(self) -> None:
        now = self.mono()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now

    def reserve(self) -> float:
        """Take a token (possibly going into debt) and return how long to wait before using it."""
        if self.qps <= 0:
            return 0.0
        self._refill()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def try_take(self) -> bool:
        """Take a token if one is there now (never goes into debt)."""
        if self.qps <= 0:
            return True
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def refund(self) -> None:
        """Give back a reserved token that was never used (its waiter was cancelled)."""
        if self.qps > 0:
            self._refill()
            self._tokens = min(float(self.burst), self._tokens + 1.0)

    async def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            self.waited += delay
            await asyncio.sleep(delay)


# The bucket for a request whose token the caller already took from another bucket: never waits.
PREPAID = TokenBucket(0.0, 1)


def backoff_delay(attempt: int, policy: ApiPolicy, retry_after: float | None, rand: float) -> float:
    """Seconds before retry number `attempt` (0-based): exponential, jittered down to half by
    `rand` in [0, 1), never below the server's Retry-After, capped at backoff_max."""
    delay: float = min(policy.backoff_max, policy.backoff_base * 2.0**attempt) * (0.5 + rand / 2)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, policy.backoff_max)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: rare from the API server; the back-off applies


@dataclass(frozen=True, slots=True)
class Credentials:
    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    config: Any = None  # kubernetes.client.Configuration, for bearer tokens that refresh

    def authorization(self) -> str | None:
        if self.config is None:
            return None
        # The official client stores it as BearerToken (newer) or authorization (older releases).
        token: str | None = self.config.get_api_key_with_prefix("BearerToken", alias="authorization")
        return token


def load_credentials(kubeconfig: str | None = None) -> Credentials:
    """kubeconfig (explicit, $KUBECONFIG, ~/.kube/config), else the in-cluster service account."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        if kubeconfig:
            raise
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return Credentials(
        host=cfg.host.rstrip("/"),
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=cfg.verify_ssl,
        config=cfg,
    )


def _ssl_context(creds: Credentials) -> ssl.SSLContext | bool:
    if not creds.host.startswith("https"):
        return False
    ctx = (
        ssl.create_default_context(cafile=creds.ca_file) if creds.verify else ssl._create_unverified_context()
    )
    if creds.cert_file and creds.key_file:
        ctx.load_cert_chain(creds.cert_file, creds.key_file)
    return ctx


def job_path(namespace: str, name: str = "", sub: str = "") -> str:
    base = f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{quote(namespace)}/trainingjobs"
    return base + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")


def gang_path(namespace: str, name: str = "", sub: str = "") -> str:
    base = f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{quote(namespace)}/gangs"
    return base + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")


def queue_path(name: str = "", sub: str = "") -> str:
    base = f"/apis/{meta.GROUP}/{meta.VERSION}/gpuqueues"
    return base + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")


def pod_path(namespace: str, name: str = "", sub: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/pods"
    return base + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")


class KubeApi:
    def __init__(
        self,
        creds: Credentials,
        max_connections: int = 64,
        policy: ApiPolicy | None = None,
        clock: ServerClock | None = None,
        observe: Callable[[str, int], None] | None = None,
    ) -> None:
        self.creds = creds
        self.policy = policy or ApiPolicy()
        self.clock = clock or ServerClock()
        self.fence: Callable[[], bool] | None = None  # set by leader election: may this process write?
        self.observe = observe or (lambda _verb, _status: None)  # metrics: one call per answer
        self.limiter = TokenBucket(self.policy.qps, self.policy.burst)
        # Events get a bucket of their own, as client-go's event recorders do (kube-scheduler and
        # controller-runtime build a separate client for them): Events must not delay pods.
        self.event_limiter = TokenBucket(self.policy.qps, self.policy.burst)
        # Status writes that only inform (a waiting job's reason and position, a blocked job's
        # condition) have a smaller budget of their own: a burst of 15,000 new jobs once put 15,000
        # of them ahead of every admission and every Succeeded in the bucket above, and a finished
        # job's quota came free minutes late (bench/kueue_perf.py).
        self.routine_limiter = TokenBucket(self.policy.qps / 4, max(1, self.policy.burst // 4))
        self.retries = 0
        self.answers: Counter[int] = Counter()  # HTTP status of every answer (0: none)
        self._session: aiohttp.ClientSession | None = None
        self._max_connections = max_connections
        self._rand = random.Random()

    def dedicated(self, max_connections: int) -> KubeApi:
        """A client with this one's credentials, policy, clock and observer but connections of its
        own: HTTP/1.1 carries one request per connection, so a request that must never wait behind
        this client's backlog (the Lease's) needs a pool nothing else uses."""
        return KubeApi(self.creds, max_connections, self.policy, self.clock, self.observe)

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=_ssl_context(self.creds))
            self._session = aiohttp.ClientSession(connector=connector, trace_configs=[self._fence_trace()])
        return self._session

    def _fence_trace(self) -> aiohttp.TraceConfig:
        """The fence again at the last moment before a write's bytes go out: once it has a connection.
        A request can wait long for one (every connection stuck on a frozen API server); it must not
        go out afterwards on a check made before the wait."""

        async def check(_session: object, ctx: SimpleNamespace, _params: object) -> None:
            if (ctx.trace_request_ctx or {}).get("fenced") and not self.may_write():
                raise NotLeader("not the leader any more when the request got its connection")

        trace = aiohttp.TraceConfig()
        trace.on_connection_reuseconn.append(check)
        trace.on_connection_create_end.append(check)
        return trace

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        auth = self.creds.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    def may_write(self) -> bool:
        return self.fence is None or self.fence()

    async def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        *,
        fenced: bool = True,
        retries: int | None = None,
        timeout: float | None = None,
        limited: bool = True,
        limiter: TokenBucket | None = None,
    ) -> dict[str, Any]:
        """One API call under the error policy. `fenced=False` only for writes about the operator
        itself (its Lease, its own pod's leader label), never for the cluster it schedules.
        `limited=False` (the Lease only) skips the rate limiter: a renewal must never wait behind a
        backlog of writes, or the fence closes while the backlog waits for it. `limiter`: another
        bucket than the client's (Events)."""
        writes = method != "GET" and fenced
        limit = self.policy.max_retries if retries is None else retries
        attempt = 0
        while True:
            if writes and not self.may_write():  # before queueing: a refused write takes no token
                raise NotLeader(f"{method} {path}: not the leader")
            if limited:
                await (limiter or self.limiter).acquire()
            # Again after every wait (the rate limiter's too): the request goes out right after.
            if writes and not self.may_write():
                raise NotLeader(f"{method} {path}: not the leader")
            try:
                return await self._once(method, path, body, params, content_type, timeout, writes)
            except ApiError as exc:
                if not exc.transient or attempt >= limit:
                    raise
                delay = backoff_delay(attempt, self.policy, exc.retry_after, self._rand.random())
            attempt += 1
            self.retries += 1
            await asyncio.sleep(delay)

    async def _once(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None,
        params: Mapping[str, str] | None,
        content_type: str,
        timeout: float | None,
        fenced: bool = False,
    ) -> dict[str, Any]:
        sent = self.clock.wall()
        try:
            async with self._client().request(
                method,
                self.creds.host + path,
                data=None if body is None else orjson.dumps(body),  # several times faster than json
                params=params,
                headers=self._headers(content_type),
                timeout=aiohttp.ClientTimeout(total=timeout or self.policy.timeout),
                trace_request_ctx={"fenced": fenced},
            ) as resp:
                self.clock.observe(sent, self.clock.wall(), resp.headers.get("Date"))
                raw = await resp.read()
                status = resp.status
                retry_after = _retry_after(resp.headers.get("Retry-After"))
                reason = resp.reason or ""
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._answered(method, UNAVAILABLE)
            raise ApiError(UNAVAILABLE, "Unavailable", f"{type(exc).__name__}: {exc}") from None
        self._answered(method, status)
        try:
            data = orjson.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:200].decode(errors="replace")}
        if status >= 400:
            data = data if isinstance(data, dict) else {}
            raise ApiError(status, data.get("reason", reason), data.get("message", ""), retry_after)
        return data if isinstance(data, dict) else {}

    def _answered(self, method: str, status: int) -> None:
        self.answers[status] += 1
        self.observe(method, status)

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self.request("GET", path, params=params)

    async def list_page(
        self, path: str, params: Mapping[str, str] | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every item of a collection (following `continue` tokens) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        rv = ""
        async for page, page_rv in self.list_pages(path, params):
            items.extend(page)
            rv = page_rv  # the last page's is the list's
        return items, rv

    async def list_pages(
        self, path: str, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """A collection one page (500 items) at a time, each with the resourceVersion its page
        gives: the last page's is the list's. Each page is decoded only when it is asked for."""
        query = {"limit": "500", **(params or {})}
        while True:
            page = await self.request("GET", path, params=query)
            md = page.get("metadata") or {}
            token = md.get("continue")
            yield page.get("items") or [], str(md.get("resourceVersion") or "")
            if not token:
                return
            query = {**query, "continue": token}

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        items, _ = await self.list_page(path, {"labelSelector": label_selector} if label_selector else None)
        return items

    async def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, str] | None = None,
        timeout_seconds: int = 300,
        idle_seconds: float = 150.0,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events from `resource_version` until the server ends the stream. Raises ApiError
        (410 when the version is too old). Bookmarks are asked for: the API server sends one at
        least every minute, so `idle_seconds` without a byte means the connection is dead."""
        query = {
            **(params or {}),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        await self.limiter.acquire()
        sent = self.clock.wall()
        try:
            async with self._client().get(
                self.creds.host + path,
                params=query,
                headers=self._headers("application/json"),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=idle_seconds),
            ) as resp:
                self.clock.observe(sent, self.clock.wall(), resp.headers.get("Date"))
                self.observe("WATCH", resp.status)
                if resp.status >= 400:
                    raw = await resp.read()
                    try:
                        data = orjson.loads(raw) if raw else {}
                    except ValueError:
                        data = {}
                    raise ApiError(
                        resp.status, data.get("reason", resp.reason or ""), data.get("message", "")
                    )
                buf = b""
                async for chunk in resp.content.iter_any():  # lines can exceed readline's limit
                    # One split per chunk: a burst delivers many events per chunk, and cutting them
                    # off the buffer one at a time copies the rest of it for each.
                    *lines, buf = (buf + chunk).split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield orjson.loads(line)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ApiError(UNAVAILABLE, "Unavailable", f"watch: {type(exc).__name__}: {exc}") from None

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body)

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{namespace}/events"
        return await self.request("POST", path, body, limiter=self.event_limiter)

    async def replace(
        self, path: str, body: Mapping[str, Any], *, fenced: bool = True, **kw: Any
    ) -> dict[str, Any]:
        return await self.request("PUT", path, body, fenced=fenced, **kw)

    async def merge_patch(
        self,
        path: str,
        body: Mapping[str, Any],
        resource_version: str | None = None,
        limiter: TokenBucket | None = None,
    ) -> dict[str, Any]:
        """A JSON merge patch; with `resource_version` the server applies it only to that version
        of the object and answers 409 Conflict otherwise (optimistic concurrency)."""
        if resource_version:
            body = {**body, "metadata": {**(body.get("metadata") or {}), "resourceVersion": resource_version}}
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH, limiter=limiter)

    async def delete(
        self, path: str, grace_seconds: int | None = None, uid: str | None = None
    ) -> dict[str, Any]:
        """Delete; with `uid` only that incarnation of the object (409 if the name now holds another)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        return await self.request("DELETE", path, body)
