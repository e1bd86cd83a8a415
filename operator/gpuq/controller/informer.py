"""Informers: list, then watch from the list's resourceVersion, and relist when the watch expires.

client-go's reflector, kept small. The guarantees the cache relies on:
- no gap: the watch starts at exactly the version the list returned, so nothing between the two is
  missed;
- a relist replaces: after a 410 Gone (the version was compacted away) or a first list, the sink
  receives the whole list and drops what the list lacks (deletions that happened while the watch
  was down are not lost as they are when a relist only re-adds what it sees); a `PagedSink` (the
  cache) takes it a page at a time as each arrives and drops what no page had after the last;
- a watch that ends or breaks resumes from the last version seen (events or bookmarks), so an API
  server restart costs a relist only when the version is gone.
The sink is called synchronously on the event loop and must not raise; an exception in it is
logged and the event skipped, never the informer stopped.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from gpuq.controller.kubeapi import ApiError, KubeApi
from gpuq.logs import get_logger

log = get_logger("gpuq.informer")

RETRY_MIN = 0.5
RETRY_MAX = 10.0
OPTIONAL_RETRY = 60.0


class Sink(Protocol):
    def replace(
        self, kind: str, bodies: list[dict[str, Any]], resource_version: str, scope: str | None
    ) -> None:
        """The complete list of `kind` (within namespace `scope`, if set) at `resource_version`."""

    def apply(self, kind: str, event_type: str, body: Mapping[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""


@runtime_checkable
class PagedSink(Sink, Protocol):
    """A sink that takes a list page by page (`replace` in parts), so the informer never holds a
    whole list decoded: at 100,000 pods that was ~200 MiB the process kept after its first list."""

    def list_page(self, kind: str, bodies: list[dict[str, Any]], listed: set[str]) -> None:
        """One page of the list; `listed` collects the keys of the list's objects."""

    def list_done(self, kind: str, listed: set[str], resource_version: str, scope: str | None) -> None:
        """The list ended at `resource_version`: what `listed` lacks was deleted meanwhile."""


class Informer:
    def __init__(
        self,
        api: KubeApi,
        kind: str,
        path: str,
        sink: Sink,
        *,
        scope: str | None = None,
        params: Mapping[str, str] | None = None,
        optional: bool = False,
    ) -> None:
        self.api = api
        self.kind = kind
        self.path = path
        self.sink = sink
        self.scope = scope
        self.params = dict(params or {})
        # A kind the cluster may not serve (a CRD not installed) or the operator may not read (RBAC):
        # until it can be listed it counts as synced and empty, and the list is tried again.
        self.optional = optional
        self.served = True
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.lists = 0  # how many times it listed (1 + relists)
        self._rand = random.Random()

    def __repr__(self) -> str:
        return f"Informer({self.kind}{'/' + self.scope if self.scope else ''})"

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                if not self.resource_version:
                    await self._list()
                await self._watch()
                failures = 0
            except ApiError as exc:
                if self.optional and not self.resource_version and exc.status in (403, 404):
                    await self._unavailable(exc)
                    continue
                if exc.gone:
                    log.info("watch expired; listing again", kind=self.kind, scope=self.scope)
                    self.resource_version = ""
                    continue
                failures += 1
                delay = min(RETRY_MAX, RETRY_MIN * 2 ** min(failures, 6)) * (0.5 + self._rand.random() / 2)
                log.warning(
                    "watch failed; retrying", kind=self.kind, error=str(exc), retry_in=round(delay, 2)
                )
                await asyncio.sleep(delay)

    async def _unavailable(self, exc: ApiError) -> None:
        if self.served:
            log.info(
                "optional kind not watched: not served or not readable; checking again every minute",
                kind=self.kind,
                scope=self.scope,
                status=exc.status,
                error=exc.message,
            )
        self.served = False
        self.synced.set()
        await asyncio.sleep(OPTIONAL_RETRY)

    async def _list(self) -> None:
        if isinstance(self.sink, PagedSink):
            count, rv = await self._list_pages(self.sink)
        else:
            items, rv = await self.api.list_page(self.path, self.params)
            self._safely(self.sink.replace, self.kind, items, rv, self.scope)
            count = len(items)
        self.resource_version = rv
        self.lists += 1
        if not self.served:
            log.info("optional kind now watched", kind=self.kind, scope=self.scope)
        self.served = True
        self.synced.set()
        log.debug("listed", kind=self.kind, scope=self.scope, items=count, rv=rv)

    async def _list_pages(self, sink: PagedSink) -> tuple[int, str]:
        """Apply the list page by page as each arrives (other tasks run between pages: a page's
        objects are then what watch events in the list's order would have brought), and drop what
        it lacks once it ends. How many objects it had, and its resourceVersion."""
        listed: set[str] = set()
        count, rv, whole = 0, "", True
        async for items, page_rv in self.api.list_pages(self.path, self.params):
            whole &= self._safely(sink.list_page, self.kind, items, listed)
            count, rv = count + len(items), page_rv  # the last page's version is the list's
        if whole:  # a page the sink failed on may lack keys it listed: then nothing is dropped
            self._safely(sink.list_done, self.kind, listed, rv, self.scope)
        return count, rv

    def _safely(self, call: Callable[..., None], *args: Any) -> bool:
        """A sink call, its exception logged (the sink must not raise; see the module's docstring).
        Whether it returned."""
        try:
            call(*args)
        except Exception:
            log.exception("cache replace failed", kind=self.kind)
            return False
        return True

    async def _watch(self) -> None:
        timeout = self._rand.randint(300, 600)  # client-go's spread: watches do not all end at once
        async for event in self.api.watch(self.path, self.resource_version, self.params, timeout):
            kind = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, Mapping):
                continue
            if kind == "ERROR":
                raise ApiError(
                    int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", ""))
                )
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                try:
                    self.sink.apply(self.kind, kind, obj)
                except Exception:
                    log.exception("cache update failed", kind=self.kind, event=kind)
            if rv:
                self.resource_version = str(rv)
