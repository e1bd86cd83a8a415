"""kopf watch handlers: they only feed the ClusterCache (no scheduling, no I/O).

`on.event` handlers are used on purpose: they receive raw watch events and make kopf store no
progress annotations on the objects, so watching a cluster's pods costs no writes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import kopf

from gpuq.api import meta
from gpuq.controller.cache import ClusterCache
from gpuq.logs import get_logger

log = get_logger("gpuq.handlers")

Upsert = Callable[[Mapping[str, Any]], None]


def _dispatch(upsert: Upsert, delete: Upsert) -> Callable[..., None]:
    def handler(event: Mapping[str, Any], **_: Any) -> None:
        body = event.get("object")
        if not isinstance(body, Mapping):
            return
        md = body.get("metadata") or {}
        log.debug(
            "watch event",
            type=event.get("type"),
            kind=body.get("kind"),
            name=md.get("name"),
            rv=md.get("resourceVersion"),
        )
        if event.get("type") == "DELETED":
            delete(body)
        else:
            upsert(body)

    return handler


def register(registry: kopf.OperatorRegistry, cache: ClusterCache, namespaces: Collection[str] = ()) -> None:
    """Watch TrainingJobs (optionally only in `namespaces`), GPUQueues, Nodes, Namespaces and Pods."""

    def in_scope(namespace: str | None, **_: Any) -> bool:
        return not namespaces or namespace in namespaces

    kopf.on.event(meta.GROUP, meta.VERSION, "trainingjobs", registry=registry, when=in_scope)(
        _dispatch(cache.upsert_job, cache.delete_job)
    )
    kopf.on.event(meta.GROUP, meta.VERSION, "gpuqueues", registry=registry)(
        _dispatch(cache.upsert_queue, cache.delete_queue)
    )
    kopf.on.event("", "v1", "nodes", registry=registry)(_dispatch(cache.upsert_node, cache.delete_node))
    kopf.on.event("", "v1", "namespaces", registry=registry)(
        _dispatch(cache.upsert_namespace, cache.delete_namespace)
    )
    # Every pod: ours (label gpuq.dev/job-name) and, on any node, other schedulers' pods whose
    # requests gpuq must count (the cache drops unbound foreign pods right away).
    kopf.on.event("", "v1", "pods", registry=registry)(_dispatch(cache.upsert_pod, cache.delete_pod))
