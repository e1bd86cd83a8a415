"""Kubernetes object bodies shaped as the API server returns them: for controller tests and bench/scale.py."""

from __future__ import annotations

import itertools
from typing import Any

from gpuq.api import meta

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
_rv = itertools.count(1000)


def iso(epoch: float) -> str:
    from gpuq.controller.objects import format_time

    return format_time(epoch)


def _md(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    md: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{namespace or ''}-{name}",
        "resourceVersion": str(next(_rv)),
        "creationTimestamp": iso(T0),
        "generation": 1,
    }
    if namespace:
        md["namespace"] = namespace
    md.update(extra)
    return md


def node(
    name: str,
    rack: str = "rack-0",
    block: str = "block-0",
    zone: str = "zone-0",
    gpus: int = 8,
    ready: bool = True,
    since: float = T0,
    **md: Any,
) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "gpuq.dev/rack": rack,
        "gpuq.dev/block": block,
        "topology.kubernetes.io/zone": zone,
        "nvidia.com/gpu.product": "H100",
    }
    alloc = {"cpu": "95", "memory": "1000Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": _md(name, labels=labels, **md),
        "spec": {},
        "status": {
            "capacity": dict(alloc),
            "allocatable": alloc,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "Unknown", "lastTransitionTime": iso(since)}
            ],
        },
    }


def queue(name: str, nominal: int = 16, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": meta.API_VERSION,
        "kind": "GPUQueue",
        "metadata": _md(name),
        "spec": {"nominalGPUs": nominal, **spec},
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _md(name, labels=labels)}


TEMPLATE = {
    "spec": {
        "containers": [
            {"name": "trainer", "image": "train:1", "resources": {"requests": {"cpu": "4", "memory": "16Gi"}}}
        ]
    }
}


def job(
    name: str,
    ns: str = "team-a",
    queue_name: str = "q",
    replicas: int = 2,
    gpus: int = 8,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    md = _md(name, ns)
    if annotations:
        md["annotations"] = annotations
    body: dict[str, Any] = {
        "apiVersion": meta.API_VERSION,
        "kind": "TrainingJob",
        "metadata": md,
        "spec": {
            "queue": queue_name,
            "workers": {
                "replicas": replicas,
                "gpusPerWorker": gpus,
                "template": spec.pop("template", TEMPLATE),
            },
            **spec,
        },
    }
    if status is not None:
        body["status"] = status
    return body


def placed_status(nodes: list[str], phase: str = "Running", attempt: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "phase": phase,
        "attempt": attempt,
        "placement": [{"rank": r, "node": n} for r, n in enumerate(nodes)],
        "admittedAt": iso(T0 + 10),
        **({"startedAt": iso(T0 + 20)} if phase == "Running" else {}),
        **extra,
    }


def pod(
    name: str,
    ns: str = "team-a",
    node_name: str | None = None,
    phase: str = "Running",
    job_name: str | None = None,
    attempt: int = 1,
    rank: int = 0,
    gpus: int = 8,
    scheduler: str = "gpuq",
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    labels = {}
    if job_name:
        labels = {
            meta.LABEL_JOB_NAME: job_name,
            meta.LABEL_ATTEMPT: str(attempt),
            meta.LABEL_RANK: str(rank),
        }
    md = _md(name, ns, labels=labels, annotations=annotations or {})
    if job_name:
        md["ownerReferences"] = [{"kind": "TrainingJob", "name": job_name, "uid": f"uid-{ns}-{job_name}"}]
    if deleting:
        md["deletionTimestamp"] = iso(T0 + 100)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {"name": "c", "image": "i", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": str(gpus)}}}
        ],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec, "status": {"phase": phase}}


def gang_pods(
    job_name: str, nodes: list[str], phase: str = "Running", attempt: int = 1, ns: str = "team-a"
) -> list[dict[str, Any]]:
    return [pod(f"{job_name}-{attempt}-{r}", ns, n, phase, job_name, attempt, r) for r, n in enumerate(nodes)]
