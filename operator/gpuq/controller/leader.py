"""Leader election on a coordination.k8s.io/v1 Lease: one writer at a time.

The rules are client-go's (tools/leaderelection), with the fence made explicit:
- A candidate takes the lease when it is free (no holder), released, or expired: unchanged for its
  leaseDurationSeconds as measured on *this* host's monotonic clock from when this host first saw
  that version (no clock comparison across hosts). Every take and renewal is a compare-and-swap on
  the Lease's resourceVersion, so two candidates never both succeed.
- The leader renews every retry period. It may write only until `renew_deadline` after *sending*
  its last successful renewal (`may_write`, checked by the API client before every write). Others
  wait `lease_duration` after *seeing* that renewal, so the old leader stops writing at least
  lease_duration - renew_deadline (5 s by default) before anyone else can start.
- Standbys watch the Lease (and re-read it every retry period), so a takeover happens when the
  lease really expires, not up to a poll later: lease_duration after the standby saw the leader's
  last renewal, plus the latency of that watch event and of its own Lease write.
- A graceful stop releases the lease (empty holder, duration 1 s): a standby takes over at once.
- The Lease's requests (its watch, reads and writes) have connections of their own: a renewal
  never waits for a connection behind the operator's writes, which under a burst hold every
  connection of its client for seconds (bench/kueue_perf.py lost seven terms in six minutes so).

Why not a library: kubernetes' leaderelection package is thread-based on the synchronous client,
measures with the wall clock, never releases the lease on shutdown, and offers no check a write path
can make; kopf's peering pauses peers by priority but has no lease semantics (no bound on when the
old instance stops). See docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuq.api import meta
from gpuq.controller.informer import Informer
from gpuq.controller.kubeapi import ApiError, KubeApi
from gpuq.logs import get_logger

log = get_logger("gpuq.leader")

LEASE_NAME = "gpuq-operator"
LEASE_CONNECTIONS = 3  # the Lease's watch, a renewal and a read


def default_identity() -> str:
    """Pod name (or host name) plus a random suffix: a restarted process is a new candidate."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "gpuq"
    return f"{base}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    namespace: str = "gpuq-system"
    name: str = LEASE_NAME
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # The API user this process runs as and its groups (whoami()); the leader shows them on the
    # Lease (meta.ANNOTATION_LEADER_USER/GROUPS). Empty: unknown, nothing shown.
    user: str = ""
    groups: tuple[str, ...] = ()

    def validate(self) -> LeaseConfig:
        if not self.lease_duration > self.renew_deadline > 1.2 * self.retry_period > 0:
            raise ValueError(
                "leader election needs lease duration > renew deadline > 1.2 x retry period > 0, got "
                f"{self.lease_duration}/{self.renew_deadline}/{self.retry_period}"
            )
        return self


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str
    duration: float
    acquire_time: str | None
    transitions: int
    resource_version: str
    renew_time: str | None = None


async def whoami(api: KubeApi) -> tuple[str, tuple[str, ...]] | None:
    """The user name and groups the API server authenticates this process as (a SelfSubjectReview,
    which every authenticated user may create); None when the server does not say."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        answer = await api.request(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review, fenced=False, retries=1
        )
    except ApiError as exc:
        log.info("cannot tell which API user this operator runs as", error=str(exc))
        return None
    info = (answer.get("status") or {}).get("userInfo") or {}
    user = info.get("username")
    return (str(user), tuple(str(g) for g in info.get("groups") or ())) if user else None


def micro_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_lease(body: Mapping[str, Any] | None) -> LeaseRecord | None:
    if not body:
        return None
    spec = body.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration=float(spec.get("leaseDurationSeconds") or 0),
        acquire_time=spec.get("acquireTime"),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((body.get("metadata") or {}).get("resourceVersion") or ""),
        renew_time=spec.get("renewTime"),
    )


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        cfg: LeaseConfig,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api.dedicated(LEASE_CONNECTIONS)
        self.cfg = (cfg if cfg.identity else dataclasses.replace(cfg, identity=default_identity())).validate()
        self.mono = mono
        self.record: LeaseRecord | None = None
        self.observed_at = mono()  # when this host first saw `record` (monotonic)
        self.leading = asyncio.Event()
        self.acquisitions = 0
        self._valid_until: float | None = None
        self._changed = asyncio.Event()

    @property
    def identity(self) -> str:
        return self.cfg.identity

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.cfg.namespace}/leases"

    def informer(self) -> Informer:
        """Watches the one Lease so a standby sees each renewal (and a release) when it happens."""
        return Informer(
            self.api, "lease", self.path, self, params={"fieldSelector": f"metadata.name={self.cfg.name}"}
        )

    # -- the fence ---------------------------------------------------------------------------
    def may_write(self) -> bool:
        return self._valid_until is not None and self.mono() < self._valid_until

    # -- observation (informer sink) ---------------------------------------------------------
    def replace(
        self, kind: str, bodies: list[dict[str, Any]], resource_version: str, scope: str | None
    ) -> None:
        self._observe(
            next((b for b in bodies if (b.get("metadata") or {}).get("name") == self.cfg.name), None)
        )

    def apply(self, kind: str, event_type: str, body: Mapping[str, Any]) -> None:
        self._observe(None if event_type == "DELETED" else body)

    def _observe(self, body: Mapping[str, Any] | None) -> None:
        record = parse_lease(body)
        if record == self.record:
            return
        same_version = (
            record is not None
            and self.record is not None
            and record.resource_version == self.record.resource_version
        )
        self.record = record
        if not same_version:
            self.observed_at = self.mono()
        self._changed.set()

    def expires_in(self) -> float:
        """Seconds until the observed lease may be taken (<= 0: now)."""
        r = self.record
        if r is None or not r.holder or r.holder == self.identity:
            return 0.0
        return self.observed_at + r.duration - self.mono()

    # -- campaigning -------------------------------------------------------------------------
    async def run(self, on_started: Callable[[], None], on_stopped: Callable[[], None]) -> None:
        """Campaign forever; each leadership term runs on_started() ... on_stopped()."""
        while True:
            await self._acquire()
            self.acquisitions += 1
            self.leading.set()
            log.info("became leader", identity=self.identity, lease=f"{self.cfg.namespace}/{self.cfg.name}")
            try:
                on_started()
                await self._renew_until_lost()
            finally:
                self._valid_until = None
                self.leading.clear()
                on_stopped()
            log.warning("lost leadership", identity=self.identity)

    async def _acquire(self) -> None:
        while True:
            wait = self.expires_in()
            if wait <= 0:
                if await self._try_take():
                    return
                wait = self.cfg.retry_period
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(wait, self.cfg.retry_period) + 0.01)
            except TimeoutError:
                await self._refresh()

    async def _refresh(self) -> None:
        try:
            self._observe(
                await self.api.request(
                    "GET", self._lease_path(), retries=0, timeout=self.cfg.retry_period, limited=False
                )
            )
        except ApiError as exc:
            if exc.not_found:
                self._observe(None)
            else:
                log.debug("lease not readable", error=str(exc))

    def _lease_path(self) -> str:
        return f"{self.path}/{self.cfg.name}"

    def _body(
        self, holder: str, duration: float, acquire_time: str | None, transitions: int, rv: str | None
    ) -> dict[str, Any]:
        now = micro_time(self.api.clock.now())
        shown = {
            meta.ANNOTATION_LEADER_USER: self.cfg.user,
            meta.ANNOTATION_LEADER_GROUPS: ",".join(self.cfg.groups),
        }
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.cfg.name,
                "namespace": self.cfg.namespace,
                **({"resourceVersion": rv} if rv else {}),
                # A write replaces the object: the holder's identity goes with it (a release drops it).
                **({"annotations": shown} if holder and self.cfg.user else {}),
            },
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": max(1, round(duration)),
                "acquireTime": acquire_time or now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    async def _write(self, body: dict[str, Any], create: bool, timeout: float) -> bool:
        """One compare-and-swap of the lease; True when it went through."""
        sent = self.mono()
        method, path = ("POST", self.path) if create else ("PUT", self._lease_path())
        call = self.api.request(method, path, body, fenced=False, retries=0, timeout=timeout, limited=False)
        try:
            answer = await asyncio.wait_for(call, timeout)  # bounded in all, connection wait included
        except TimeoutError:
            log.info("lease write timed out", seconds=round(timeout, 2))
            return False
        except ApiError as exc:
            if exc.not_found and create:
                log.error(
                    "cannot create the leader-election lease: namespace missing",
                    namespace=self.cfg.namespace,
                    hint="create the namespace or pass --leader-elect-namespace",
                )
            elif not exc.conflict:
                log.info("lease write failed", error=str(exc))
            return False
        self._observe(answer)
        self._valid_until = sent + self.cfg.renew_deadline
        return True

    async def _try_take(self) -> bool:
        await self._refresh()
        r = self.record
        if r is None:
            body = self._body(self.identity, self.cfg.lease_duration, None, 0, None)
            return await self._write(body, create=True, timeout=self.cfg.retry_period * 2)
        if self.expires_in() > 0:
            return False
        mine = r.holder == self.identity
        body = self._body(
            self.identity,
            self.cfg.lease_duration,
            r.acquire_time if mine else None,
            r.transitions if mine else r.transitions + 1,
            r.resource_version,
        )
        return await self._write(body, create=False, timeout=self.cfg.retry_period * 2)

    async def _renew_until_lost(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.retry_period)
            while True:
                remaining = (self._valid_until or 0.0) - self.mono()
                if remaining <= 0:
                    return  # could not renew in time: the fence is already shut
                if await self._renew(remaining):
                    break
                if self.record is not None and self.record.holder not in ("", self.identity):
                    return  # someone else holds it now
                await asyncio.sleep(min(self.cfg.retry_period, max(0.0, remaining)))

    async def _renew(self, timeout: float) -> bool:
        r = self.record
        if r is None or r.holder != self.identity:
            await self._refresh()
            r = self.record
            if r is None or r.holder != self.identity:
                return False
        body = self._body(
            self.identity, self.cfg.lease_duration, r.acquire_time, r.transitions, r.resource_version
        )
        if await self._write(body, create=False, timeout=timeout):
            return True
        await self._refresh()  # a conflict: someone edited the lease; retry on its current version
        return False

    async def close(self) -> None:
        """Close the Lease's own connections (after `release`)."""
        await self.api.close()

    async def release(self) -> None:
        """Stop writing, then give the lease up so a standby takes over at once."""
        if self._valid_until is None:
            return
        self._valid_until = None
        r = self.record
        if r is None or r.holder != self.identity:
            return
        body = self._body("", 1, r.acquire_time, r.transitions, r.resource_version)
        try:
            await self.api.request(
                "PUT", self._lease_path(), body, fenced=False, retries=1, timeout=2.0, limited=False
            )
            log.info("released leadership", identity=self.identity)
        except ApiError as exc:
            log.warning("lease not released; it expires by itself", error=str(exc))
