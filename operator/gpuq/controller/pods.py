"""Render the worker pods and the rendezvous Service of a TrainingJob (pure functions).

Pods are created already bound (`spec.nodeName`, one API call per pod) with `schedulerName: gpuq`,
so no other scheduler ever races us for them; the writer binds through the pods/binding subresource
only a pod that exists unbound (created by a gpuq before 0.2). docs/operations.md, "Binding".
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpuq.api import meta
from gpuq.api.trainingjob import CheckpointReport, PodTemplateShape, TrainingJobSpec
from gpuq.controller.podinfo import add_podinfo_volume, identity_env
from gpuq.core.model import GPU

MASTER_PORT = 29500
TEMPLATE_PATH = "spec.workers.template"


class TemplateError(ValueError):
    """The pod template cannot produce a valid worker pod."""


def pod_name(job: str, attempt: int, rank: int) -> str:
    return f"{job}-{attempt}-{rank}"


def service_name(job: str) -> str:
    return job


def needs_service(spec: TrainingJobSpec) -> bool:
    """Only a multi-worker gang needs DNS names for rendezvous; a single worker talks to itself."""
    return spec.workers.replicas > 1


def owner_reference(job_name: str, job_uid: str) -> dict[str, Any]:
    return {
        "apiVersion": meta.API_VERSION,
        "kind": "TrainingJob",
        "name": job_name,
        "uid": job_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def check_template(template: Mapping[str, Any]) -> None:
    """The template against the shape the CRD schema gives it (gpuq.api.trainingjob.PodTemplateShape):
    a job stored before the schema said so, or under an older CRD, is caught here."""
    try:
        PodTemplateShape.model_validate(template)
    except ValidationError as exc:
        raise TemplateError(meta.validation_text(exc, TEMPLATE_PATH)) from None


def worker_env(
    namespace: str,
    job: str,
    spec: TrainingJobSpec,
    rank: int,
    attempt: int,
    restarts: int,
    resume: CheckpointReport | None,
) -> list[dict[str, str]]:
    """torch.distributed rendezvous variables plus gpuq's own (GPUQ_*)."""
    env = {
        "MASTER_ADDR": f"worker-0.{service_name(job)}.{namespace}.svc"
        if needs_service(spec)
        else "localhost",
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(spec.workers.replicas),
        "RANK": str(rank),
        "NODE_RANK": str(rank),
        "GPUQ_JOB_NAME": job,
        "GPUQ_JOB_NAMESPACE": namespace,
        "GPUQ_QUEUE": spec.queue,
        "GPUQ_GPUS_PER_WORKER": str(spec.workers.gpus_per_worker),
        "GPUQ_ATTEMPT": str(attempt),
        "GPUQ_RESTART_COUNT": str(restarts),
    }
    if resume is not None:
        env["GPUQ_RESUME_FROM"] = resume.path
        env["GPUQ_RESUME_STEP"] = str(resume.step)
    return [{"name": k, "value": v} for k, v in env.items()]


def _with_env(container: dict[str, Any], env: list[dict[str, str]]) -> None:
    ours = {e["name"] for e in env}
    container["env"] = [e for e in container.get("env") or [] if e.get("name") not in ours] + env


def _with_gpus(container: dict[str, Any], gpus: int) -> None:
    res = container.setdefault("resources", {})
    for kind in ("requests", "limits"):
        res.setdefault(kind, {})[GPU] = str(gpus)


def worker_labels(job: str, queue: str, rank: int, attempt: int) -> dict[str, str]:
    return {
        meta.LABEL_JOB_NAME: job,
        meta.LABEL_QUEUE: queue,
        meta.LABEL_RANK: str(rank),
        meta.LABEL_ATTEMPT: str(attempt),
    }


def worker_pod(
    namespace: str,
    job: str,
    job_uid: str,
    spec: TrainingJobSpec,
    rank: int,
    attempt: int,
    restarts: int = 0,
    resume: CheckpointReport | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """The pod of one rank, bound to `node` when given. The template's metadata and spec are kept;
    gpuq's fields win."""
    template = copy.deepcopy(spec.workers.template)
    tmeta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template.get("spec") or {}
    pod_spec["schedulerName"] = meta.SCHEDULER_NAME
    if node is not None:
        pod_spec["nodeName"] = node
    pod_spec.setdefault("restartPolicy", "Never")
    pod_spec["hostname"] = f"worker-{rank}"
    if needs_service(spec):
        pod_spec["subdomain"] = service_name(job)
    env = worker_env(namespace, job, spec, rank, attempt, restarts, resume) + identity_env()
    add_podinfo_volume(pod_spec)  # gpuq.sdk: the pod's own name and live annotations
    containers = pod_spec.get("containers") or []
    for container in containers:
        _with_env(container, env)
    if containers:
        _with_gpus(containers[0], spec.workers.gpus_per_worker)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(job, attempt, rank),
            "namespace": namespace,
            "labels": {**(tmeta.get("labels") or {}), **worker_labels(job, spec.queue, rank, attempt)},
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [owner_reference(job, job_uid)],
        },
        "spec": pod_spec,
    }


def rendezvous_service(namespace: str, job: str, job_uid: str) -> dict[str, Any]:
    """Headless Service giving every worker a stable DNS name: worker-<rank>.<job>.<namespace>.svc."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job),
            "namespace": namespace,
            "labels": {meta.LABEL_JOB_NAME: job},
            "ownerReferences": [owner_reference(job, job_uid)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {meta.LABEL_JOB_NAME: job},
            "ports": [{"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT}],
        },
    }


def binding(pod: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
