"""Run the operator: informers keep the cache warm in every replica; only the leader schedules.

Start-up: check the CRDs are served, start the informers (list, then watch) and wait until each has
listed once, then campaign for the Lease. On winning, a leadership term starts: a fresh Writer and
SchedulingLoop (in-memory state rebuilt from the API: preemptions in progress come from the
victims' status), whose first cycle runs at once on the warm cache. On losing the lease the term's
tasks are cancelled and its assumptions dropped; the process stays a warm standby. A graceful stop
(SIGTERM/SIGINT, through kopf) ends the term, lets in-flight writes finish for a moment, then
releases the lease so a standby takes over at once.

kopf runs the process: signals, the login handler (our credentials), and the liveness endpoint
with its probes. The watches are gpuq's own informers (gpuq.controller.informer): see
docs/architecture.md for why kopf's watch streams are not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from gpuq.api import crd, meta
from gpuq.config import CONFIG_MAP_NAME, ConfigError, config_from_config_map, load_config
from gpuq.controller.cache import GC_THRESHOLDS, ClusterCache
from gpuq.controller.extender import ExtenderServer
from gpuq.controller.informer import Informer
from gpuq.controller.kubeapi import (
    MERGE_PATCH,
    ApiError,
    ApiPolicy,
    Credentials,
    KubeApi,
    load_credentials,
    pod_path,
)
from gpuq.controller.leader import LeaderElector, LeaseConfig, whoami
from gpuq.controller.loop import ScheduleFn, SchedulingLoop
from gpuq.controller.metrics import Metrics
from gpuq.controller.watches import informers
from gpuq.controller.writer import Writer
from gpuq.core.config import SchedulerConfig
from gpuq.logs import get_logger

log = get_logger("gpuq.operator")

LEADER_LABEL = "gpuq.dev/leader"


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    config_path: Path | None = None
    config_namespace: str = "gpuq-system"
    metrics_port: int = 9090
    health_port: int = 0  # kopf's liveness endpoint (/healthz); 0: off
    debounce_seconds: float = 0.05
    kubeconfig: str | None = None
    leader_elect: bool = True
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    api: ApiPolicy = field(default_factory=ApiPolicy)
    # Graceful stop: in-flight writes may finish this long before the lease is released (whatever is
    # cut short was persisted first and the next leader finishes it; a long drain delays the takeover).
    drain_seconds: float = 1.0
    admission_delay: float = 0.0  # test hook: seconds between persisting an admission and its pods


async def scheduler_config(api: KubeApi, options: OperatorOptions) -> SchedulerConfig:
    """--config file if given, else ConfigMap gpuq-scheduler-config, else the defaults."""
    if options.config_path is not None:
        return load_config(options.config_path)
    try:
        cm = await api.get(f"/api/v1/namespaces/{options.config_namespace}/configmaps/{CONFIG_MAP_NAME}")
    except ApiError as exc:
        if exc.status in (403, 404):
            log.info("no scheduler config map; using defaults", namespace=options.config_namespace)
            return SchedulerConfig()
        raise
    return config_from_config_map(cm.get("data"))


async def check_crds(api: KubeApi) -> None:
    try:
        await api.get(f"/apis/{meta.GROUP}/{meta.VERSION}")
    except ApiError as exc:
        if exc.not_found:
            raise SystemExit(f"gpuq CRDs are not installed: {crd.INSTALL_COMMAND}") from None
        raise


async def with_api_user(api: KubeApi, options: OperatorOptions) -> OperatorOptions:
    """The options with the API user this process runs as, which the leader shows on its Lease."""
    who = await whoami(api)
    if who is None:
        return options
    user, groups = who
    return dataclasses.replace(options, lease=dataclasses.replace(options.lease, user=user, groups=groups))


class Term:
    """One leadership term: the writer and the scheduling loop, alive only while leading."""

    def __init__(
        self,
        api: KubeApi,
        cache: ClusterCache,
        config: SchedulerConfig,
        metrics: Metrics,
        schedule: ScheduleFn | None,
        debounce: float,
        admission_delay: float = 0.0,
    ) -> None:
        self.cache = cache
        self.writer = Writer(
            api, cache, metrics, on_done=self._wake, clock=api.clock.now, admission_delay=admission_delay
        )
        self.loop = SchedulingLoop(
            cache,
            self.writer,
            config,
            metrics,
            schedule=schedule,
            clock=api.clock.now,
            debounce=debounce,
            freeze_first_cycle=True,
        )
        self.task: asyncio.Task[None] | None = None
        self.extender: ExtenderServer | None = None
        if config.extender_enabled:
            self.extender = ExtenderServer(
                config.extender_bind_address, config.extender_port, lambda: self.loop.extender_view
            )

    def _wake(self) -> None:
        self.loop.mark_dirty()

    def start(self, ready: Callable[[], Awaitable[None]]) -> None:
        """Schedule once `ready` (fresh lists) is done: decisions are made on a view that holds every
        write committed before this term began."""
        self.cache.assumed.clear()
        self.cache.on_change = self.loop.mark_dirty
        self.task = asyncio.create_task(self._run(ready), name="gpuq-scheduling-loop")

    async def _run(self, ready: Callable[[], Awaitable[None]]) -> None:
        if self.extender is not None:
            await self.extender.start()  # answers 503 ("no opinion") until the first cycle
        await ready()
        self.loop.restore()
        self.loop.synced.set()
        await self.loop.run()

    def stop_scheduling(self) -> None:
        self.cache.on_change = lambda: None
        self.loop.close()
        if self.task is not None:
            self.task.cancel()
        if self.extender is not None:
            asyncio.get_running_loop().create_task(self.extender.stop())
            self.extender = None

    def abort(self) -> None:
        """The lease is lost: drop everything at once (persisted intent is finished by the next leader)."""
        self.stop_scheduling()
        self.writer.abort()
        self.cache.assumed.clear()


class Runtime:
    """Everything one operator process runs."""

    def __init__(
        self,
        api: KubeApi,
        config: SchedulerConfig,
        metrics: Metrics,
        options: OperatorOptions,
        schedule: ScheduleFn | None = None,
    ) -> None:
        self.api = api
        self.config = config
        self.metrics = metrics
        self.options = options
        self.schedule = schedule
        self.cache = ClusterCache()
        self.informers: list[Informer] = informers(api, self.cache, options.namespaces)
        self.elector: LeaderElector | None = None
        if options.leader_elect:
            self.elector = LeaderElector(api, options.lease)
            api.fence = self.elector.may_write
        self.term: Term | None = None
        self.synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._watches: dict[Informer, asyncio.Task[None]] = {}

    @property
    def leading(self) -> bool:
        return self.term is not None

    def _watch(self, inf: Informer) -> None:
        self._watches[inf] = asyncio.create_task(inf.run(), name=f"gpuq-informer:{inf.kind}")

    async def fresh_lists(self) -> None:
        """List every kind again (a consistent read) and replace the cache. A new term waits for it:
        writes the previous leader sent before its fence closed may have been committed only now
        (an API server that was frozen, an etcd that was paused), after the watches last spoke."""
        t0 = asyncio.get_running_loop().time()
        for inf in self.informers:  # no await in here: a cancelled term never leaves a kind unwatched
            self._watches.pop(inf).cancel()  # it stops at its next await, before touching anything
            inf.resource_version = ""
            inf.synced.clear()
            self._watch(inf)
        await asyncio.gather(*(inf.synced.wait() for inf in self.informers))
        log.info("fresh lists for the new term", seconds=round(asyncio.get_running_loop().time() - t0, 3))

    async def start(self) -> None:
        for inf in self.informers:
            self._watch(inf)
        await asyncio.gather(*(inf.synced.wait() for inf in self.informers))
        self.synced.set()
        gc.freeze()  # the first full list stays: no collection needs to scan it again
        c = self.cache
        log.info("cache synced", nodes=len(c.nodes), queues=len(c.queues), jobs=len(c.jobs), pods=len(c.pods))
        if self.elector is None:
            self._begin_term()
            return
        self._tasks.append(asyncio.create_task(self._report_api_trouble(), name="gpuq-api-trouble"))
        self._tasks.append(asyncio.create_task(self.elector.informer().run(), name="gpuq-informer:lease"))
        self._tasks.append(
            asyncio.create_task(self.elector.run(self._begin_term, self._end_term), name="gpuq-elector")
        )

    async def _report_api_trouble(self, every: float = 30.0) -> None:
        """One line per period in which the API server throttled or failed requests (each retried)."""
        seen = dict(self.api.answers)
        while True:
            await asyncio.sleep(every)
            now = dict(self.api.answers)
            delta = {code: n - seen.get(code, 0) for code, n in now.items() if n > seen.get(code, 0)}
            seen = now
            trouble = {str(c): n for c, n in sorted(delta.items()) if c == 0 or c == 429 or c >= 500}
            if trouble:
                log.warning("API server trouble; requests retried", answers=trouble, seconds=every)

    def _begin_term(self) -> None:
        o = self.options
        self.term = Term(
            self.api,
            self.cache,
            self.config,
            self.metrics,
            self.schedule,
            o.debounce_seconds,
            o.admission_delay,
        )
        self.term.start(self.fresh_lists)
        self._label_self(True)
        self.metrics.leader.set(1)
        self.metrics.leader_terms.inc()

    def _end_term(self) -> None:
        if self.term is not None:
            self.term.abort()
            self.term = None
            self._label_self(False)
        self.metrics.leader.set(0)
        self.metrics.standby()

    def _label_self(self, leading: bool) -> None:
        """In a cluster, label this replica's pod gpuq.dev/leader=true while it leads: Service
        gpuq-extender selects it, so kube-scheduler reaches the leader's extender."""
        pod, ns = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
        if not pod or not ns:
            return
        body = {"metadata": {"labels": {LEADER_LABEL: "true" if leading else None}}}

        async def patch() -> None:
            try:  # about this very pod, not the cluster: allowed outside the fence
                await self.api.request(
                    "PATCH", pod_path(ns, pod), body, content_type=MERGE_PATCH, fenced=False, retries=3
                )
            except ApiError as exc:
                log.warning("could not label this replica's pod", leading=leading, error=str(exc))

        self._tasks.append(asyncio.get_running_loop().create_task(patch()))

    async def stop(self) -> None:
        """Graceful: stop deciding, let writes finish briefly, release the lease, stop watching.
        Runs once: from kopf's cleanup activity (right after a signal) or when kopf returns."""
        if self._stopping:
            return
        self._stopping = True
        term = self.term
        if term is not None:
            term.stop_scheduling()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(term.writer.drain(), self.options.drain_seconds)
            term.writer.abort()
        if self.elector is not None:
            await self.elector.release()
        tasks = [*self._tasks, *self._watches.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.elector is not None:
            await self.elector.close()
        self.term = None

    def probe(self) -> dict[str, Any]:
        term = self.term
        return {
            "synced": self.synced.is_set(),
            "leader": self.leading,
            "identity": self.elector.identity if self.elector else None,
            "cycles": term.loop.cycles if term else 0,
        }


def _kopf_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False  # gpuq posts its own Events
    settings.networking.request_timeout = 60
    return settings


def _register(registry: kopf.OperatorRegistry, creds: Credentials, runtime: Runtime) -> None:
    def login(**_: Any) -> kopf.ConnectionInfo:
        token = creds.authorization()
        return kopf.ConnectionInfo(
            server=creds.host,
            ca_path=creds.ca_file,
            insecure=not creds.verify,
            certificate_path=creds.cert_file,
            private_key_path=creds.key_file,
            token=token.split(" ", 1)[1] if token and " " in token else token,
        )

    def probe(**_: Any) -> dict[str, Any]:
        return runtime.probe()

    async def cleanup(**_: Any) -> None:
        # kopf runs this as soon as its root tasks stop after a signal, before it waits up to 5 s
        # for every other task of the loop: release the lease first, so a standby takes over now.
        await runtime.stop()

    kopf.on.login(registry=registry)(login)
    kopf.on.probe(registry=registry, id="gpuq")(probe)
    kopf.on.cleanup(registry=registry)(cleanup)


async def operate(
    options: OperatorOptions,
    stop_flag: asyncio.Event | None = None,
    schedule: ScheduleFn | None = None,
) -> None:
    creds = load_credentials(options.kubeconfig)
    metrics = Metrics()
    async with KubeApi(creds, policy=options.api, observe=metrics.api_answer) as api:
        await check_crds(api)
        options = await with_api_user(api, options)
        config = await scheduler_config(api, options)
        if options.metrics_port:
            metrics.serve(options.metrics_port)
        runtime = Runtime(api, config, metrics, options, schedule)
        registry = kopf.OperatorRegistry()
        _register(registry, creds, runtime)
        await runtime.start()
        log.info(
            "operator started",
            namespaces=list(options.namespaces) or "all",
            metrics_port=options.metrics_port,
            leader_election=options.leader_elect,
            identity=runtime.elector.identity if runtime.elector else None,
            user=options.lease.user or None,
        )
        try:
            await kopf.operator(
                registry=registry,
                settings=_kopf_settings(),
                clusterwide=True,
                standalone=True,
                stop_flag=stop_flag,
                liveness_endpoint=f"http://0.0.0.0:{options.health_port}/healthz"
                if options.health_port
                else None,
            )
        finally:
            await runtime.stop()


def run_operator(options: OperatorOptions) -> int:
    """Exit codes: 0 stopped by a signal, 2 bad configuration or credentials."""
    from kubernetes.config import ConfigException

    gc.set_threshold(*GC_THRESHOLDS)

    logging.getLogger("kopf").setLevel(logging.WARNING)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    try:
        if options.config_path is not None:
            load_config(options.config_path)  # fail before connecting to anything
        options.lease.validate()
        asyncio.run(operate(options))
    except ConfigError as exc:
        log.error("bad scheduler config", error=str(exc))
        return 2
    except ValueError as exc:
        log.error("bad options", error=str(exc))
        return 2
    except ConfigException as exc:
        log.error("no usable kubeconfig or in-cluster credentials", error=str(exc))
        return 2
    return 0
