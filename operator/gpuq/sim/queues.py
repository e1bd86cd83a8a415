"""Queues for a simulation: read from GPUQueue YAML (what `kubectl apply` takes), or derived from
the trace: one queue per tenant, nominal GPUs proportional to the tenant's GPU-time, all in one
cohort so idle quota is lent (the usual way a shared cluster is set up)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuq.api.gpuqueue import GPUQueueSpec
from gpuq.core.model import Queue
from gpuq.sim.trace import TraceJob

DERIVED_COHORT = "trace"


class QueueFileError(ValueError):
    pass


def derive_queues(jobs: Iterable[TraceJob], total_gpus: int) -> tuple[Queue, ...]:
    """Nominal share proportional to GPU-time, by largest remainder so the shares sum to the cluster."""
    usage: dict[str, float] = {}
    for job in jobs:
        usage[job.queue] = usage.get(job.queue, 0.0) + job.gpus * job.duration
    total = sum(usage.values())
    if not usage or total <= 0:
        return ()
    exact = {name: total_gpus * used / total for name, used in usage.items()}
    nominal = {name: int(value) for name, value in exact.items()}
    by_remainder = sorted(exact, key=lambda name: (-(exact[name] - nominal[name]), name))
    for name in by_remainder[: total_gpus - sum(nominal.values())]:
        nominal[name] += 1
    return tuple(Queue(name, nominal[name], cohort=DERIVED_COHORT) for name in sorted(nominal))


def queue_from_object(obj: Mapping[str, Any], where: str) -> Queue:
    """One GPUQueue object (kind GPUQueue), validated by the API model gpuq.api, as a core Queue."""
    if obj.get("kind") != "GPUQueue":
        raise QueueFileError(f"{where}: expected kind GPUQueue, got {obj.get('kind')!r}")
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise QueueFileError(f"{where}: metadata.name is missing")
    try:
        spec = GPUQueueSpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise QueueFileError(f"{where} (GPUQueue {name}): {problems}") from None
    return spec.to_core(name)


def read_queue_file(path: Path) -> tuple[Queue, ...]:
    """GPUQueues from a YAML file: several documents, or one `kind: List` with `items`."""
    try:
        documents = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    except (OSError, yaml.YAMLError) as exc:
        raise QueueFileError(f"{path}: cannot read GPUQueue YAML: {exc}") from exc
    objects: list[tuple[str, Mapping[str, Any]]] = []
    for number, doc in enumerate(documents, start=1):
        if not isinstance(doc, Mapping):
            raise QueueFileError(f"{path} document {number}: not a mapping")
        items = doc.get("items") if doc.get("kind") == "List" else [doc]
        for index, item in enumerate(items or []):
            objects.append(
                (f"{path} document {number}" + (f" item {index}" if len(items or []) > 1 else ""), item)
            )
    queues = [queue_from_object(obj, where) for where, obj in objects]
    names = [queue.name for queue in queues]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise QueueFileError(f"{path}: GPUQueue {duplicates[0]!r} defined twice")
    if not queues:
        raise QueueFileError(f"{path}: no GPUQueue objects")
    return tuple(sorted(queues, key=lambda queue: queue.name))
