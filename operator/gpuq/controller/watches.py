"""What the operator watches: one informer per resource, all feeding the ClusterCache.

TrainingJobs (every namespace, or only the ones given), GPUQueues, Nodes, Namespaces (labels for
GPUQueue.namespaceSelector), every Pod: gpuq's own workers and, on any node, other schedulers'
pods whose requests gpuq must count (the cache drops unbound foreign pods at once), and the owners
of gangs gpuq did not create (Indexed Jobs, PyTorchJobs) that carry the gpuq.dev/queue label. Those
are optional: a cluster without the PyTorchJob CRD, or an operator without RBAC to read them,
starts all the same (docs/existing-workloads.md).
"""

from __future__ import annotations

from collections.abc import Collection

from gpuq.api import meta
from gpuq.controller.cache import ClusterCache, owner_kind
from gpuq.controller.gangs.resolve import KINDS, collection_path
from gpuq.controller.informer import Informer
from gpuq.controller.kubeapi import KubeApi, gang_path, job_path, queue_path


def informers(api: KubeApi, cache: ClusterCache, namespaces: Collection[str] = ()) -> list[Informer]:
    if namespaces:
        jobs = [Informer(api, "job", job_path(ns), cache, scope=ns) for ns in sorted(namespaces)]
    else:
        jobs = [Informer(api, "job", f"/apis/{meta.GROUP}/{meta.VERSION}/trainingjobs", cache)]
    return [
        Informer(api, "node", "/api/v1/nodes", cache),
        Informer(api, "namespace", "/api/v1/namespaces", cache),
        Informer(api, "queue", queue_path(), cache),
        *jobs,
        Informer(api, "pod", "/api/v1/pods", cache),
        *owner_informers(api, cache, namespaces),
        *(  # gpuq's records of those gangs (optional: an install whose CRDs predate the Gang kind)
            Informer(
                api,
                "gang",
                gang_path(ns) if ns else f"/apis/{meta.API_VERSION}/gangs",
                cache,
                scope=ns or None,
                optional=True,
            )
            for ns in (sorted(namespaces) or [""])
        ),
    ]


def owner_informers(api: KubeApi, cache: ClusterCache, namespaces: Collection[str] = ()) -> list[Informer]:
    """One informer per owner kind (per namespace, if given), selecting owners that opted in."""
    params = {"labelSelector": meta.LABEL_QUEUE}
    return [
        Informer(
            api, owner_kind(k), collection_path(k, ns), cache, scope=ns or None, params=params, optional=True
        )
        for k in KINDS.values()
        for ns in (sorted(namespaces) or [""])
    ]
