"""Run the operator: rebuild the cache from lists, then start the scheduling loop and kopf's watches.

Everything durable lives in the API server, so a fresh process needs nothing else: lists come first
and the first cycle only runs once they are in the cache (an operator restart never double-binds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from gpuq.api import meta
from gpuq.config import CONFIG_MAP_NAME, ConfigError, config_from_config_map, load_config
from gpuq.controller import handlers
from gpuq.controller.cache import ClusterCache
from gpuq.controller.kubeapi import ApiError, Credentials, KubeApi, job_path, load_credentials, queue_path
from gpuq.controller.loop import ScheduleFn, SchedulingLoop
from gpuq.controller.metrics import Metrics
from gpuq.controller.writer import Writer
from gpuq.core.config import SchedulerConfig
from gpuq.logs import get_logger

log = get_logger("gpuq.operator")


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    config_path: Path | None = None
    config_namespace: str = "gpuq-system"
    metrics_port: int = 9090
    debounce_seconds: float = 0.05
    kubeconfig: str | None = None


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


async def initial_sync(api: KubeApi, cache: ClusterCache, namespaces: Collection[str] = ()) -> None:
    """List everything the scheduler looks at before its first cycle."""
    try:
        if namespaces:
            job_lists = await asyncio.gather(*(api.list(job_path(ns)) for ns in namespaces))
            jobs = [j for page in job_lists for j in page]
        else:
            jobs = await api.list(f"/apis/{meta.GROUP}/{meta.VERSION}/trainingjobs")
        queues = await api.list(queue_path())
    except ApiError as exc:
        if exc.not_found:
            raise SystemExit(
                "gpuq CRDs are not installed: kubectl apply -f crds/ (or -k manifests/)"
            ) from None
        raise
    nodes, nss, pods = await asyncio.gather(
        api.list("/api/v1/nodes"), api.list("/api/v1/namespaces"), api.list("/api/v1/pods")
    )
    for body in nodes:
        cache.upsert_node(body)
    for body in nss:
        cache.upsert_namespace(body)
    for body in queues:
        cache.upsert_queue(body)
    for body in jobs:
        cache.upsert_job(body)
    for body in pods:
        cache.upsert_pod(body)
    log.info("cache synced", nodes=len(nodes), queues=len(queues), jobs=len(jobs), pods=len(cache.pods))


def _kopf_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False  # gpuq posts its own Events; event handlers cannot fail
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    return settings


def _register_login(registry: kopf.OperatorRegistry, creds: Credentials) -> None:
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

    kopf.on.login(registry=registry)(login)


async def operate(
    options: OperatorOptions,
    stop_flag: asyncio.Event | None = None,
    schedule: ScheduleFn | None = None,
) -> None:
    creds = load_credentials(options.kubeconfig)
    async with KubeApi(creds) as api:
        config = await scheduler_config(api, options)
        metrics = Metrics()
        if options.metrics_port:
            metrics.serve(options.metrics_port)
        cache = ClusterCache()
        loop_ref: list[SchedulingLoop] = []
        writer = Writer(api, cache, metrics, on_done=lambda: loop_ref[0].mark_dirty())
        loop = SchedulingLoop(
            cache, writer, config, metrics, schedule=schedule, debounce=options.debounce_seconds
        )
        loop_ref.append(loop)
        cache.on_change = loop.mark_dirty
        registry = kopf.OperatorRegistry()
        handlers.register(registry, cache, options.namespaces)
        _register_login(registry, creds)
        await initial_sync(api, cache, options.namespaces)
        loop.synced.set()
        task = asyncio.create_task(loop.run(), name="gpuq-scheduling-loop")
        log.info(
            "operator started",
            namespaces=list(options.namespaces) or "all",
            metrics_port=options.metrics_port,
        )
        try:
            await kopf.operator(
                registry=registry,
                settings=_kopf_settings(),
                clusterwide=True,
                standalone=True,
                stop_flag=stop_flag,
            )
        finally:
            task.cancel()
            await writer.drain()


def run_operator(options: OperatorOptions) -> int:
    """Exit codes: 0 stopped by a signal, 2 bad configuration or credentials."""
    from kubernetes.config import ConfigException

    logging.getLogger("kopf").setLevel(logging.WARNING)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    try:
        if options.config_path is not None:
            load_config(options.config_path)  # fail before connecting to anything
        asyncio.run(operate(options))
    except ConfigError as exc:
        log.error("bad scheduler config", error=str(exc))
        return 2
    except ConfigException as exc:
        log.error("no usable kubeconfig or in-cluster credentials", error=str(exc))
        return 2
    return 0
