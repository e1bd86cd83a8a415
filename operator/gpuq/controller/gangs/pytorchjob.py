"""Kubeflow PyTorchJobs (training-operator v1) as gangs: the Master (0 or 1) and the Workers form
one gang, rank 0 the master, then the workers by replica index (the order torchrun's ranks take).
The core schedules gangs of equal workers, so Master and Worker must ask for the same GPUs and the
same placement; an elastic job (min != max replicas) has no fixed gang and is refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuq.controller.gangs import owner
from gpuq.controller.gangs.demand import GangCode, GangDemand, mapping
from gpuq.controller.gangs.owner import gang_demand
from gpuq.controller.resources import QuantityError, pod_requests

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
PLURAL = "pytorchjobs"
SUSPEND = ("spec", "runPolicy", "suspend")
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
TYPES = ("Master", "Worker")
# What must agree between Master and Worker templates for the gang to be one shape.
SAME_PLACEMENT = ("schedulerName", "nodeSelector", "affinity", "tolerations")
MAX_SIZE = 4096


def _gpus(template: Mapping[str, Any], where: str) -> int | None:
    try:
        return pod_requests(mapping(template.get("spec")), where).gpus
    except QuantityError:
        return None  # reported by gang_demand for the template it reads


def _heterogeneous(replicas: Mapping[str, Any]) -> str | None:
    master = mapping(mapping(replicas.get("Master")).get("template"))
    worker = mapping(mapping(replicas.get("Worker")).get("template"))
    mg = _gpus(master, "spec.pytorchReplicaSpecs.Master.template.spec")
    wg = _gpus(worker, "spec.pytorchReplicaSpecs.Worker.template.spec")
    if mg != wg:
        return f"Master asks for {mg} GPUs and Worker for {wg}"
    ms, ws = mapping(master.get("spec")), mapping(worker.get("spec"))
    for key in SAME_PLACEMENT:
        if ms.get(key) != ws.get(key):
            return f"Master and Worker templates differ in spec.{key}"
    return None


def _counts(replicas: Mapping[str, Any]) -> dict[str, Any]:
    """Replicas per type present (1 where a type leaves it unset, as the training-operator does)."""
    return {t: mapping(replicas.get(t)).get("replicas", 1) for t in TYPES if t in replicas}


def _replicas(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(body.get("spec")).get("pytorchReplicaSpecs"))


def demand(body: Mapping[str, Any], levels_by_label: Mapping[str, str]) -> GangDemand:
    md, spec = mapping(body.get("metadata")), mapping(body.get("spec"))
    name = f"PyTorchJob {md.get('namespace', '')}/{md.get('name', '')}"
    replicas = _replicas(body)
    other = sorted(set(replicas) - set(TYPES))
    if other or not replicas:
        what = f"replica types {', '.join(other)}" if other else "no pytorchReplicaSpecs"
        return GangDemand.refused(GangCode.UNSUPPORTED, f"{name} has {what}: gpuq runs Master and Worker")
    elastic = mapping(spec.get("elasticPolicy"))
    if elastic and elastic.get("minReplicas") != elastic.get("maxReplicas"):
        return GangDemand.refused(
            GangCode.UNSUPPORTED,
            f"{name} is elastic (minReplicas {elastic.get('minReplicas')}, maxReplicas "
            f"{elastic.get('maxReplicas')}): a gang has one size",
        )
    counts = _counts(replicas)
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in counts.values()):
        return GangDemand.refused(GangCode.INVALID, f"{name}: replicas must be whole numbers >= 0")
    if counts.get("Master", 0) > 1:
        return GangDemand.refused(GangCode.UNSUPPORTED, f"{name} has {counts['Master']} Masters: at most 1")
    size = sum(counts.values())
    if not 1 <= size <= MAX_SIZE:
        return GangDemand.refused(
            GangCode.UNSUPPORTED, f"{name} has {size} replicas: a gang has 1 to {MAX_SIZE}"
        )
    if len(counts) == 2 and (why := _heterogeneous(replicas)) is not None:
        return GangDemand.refused(
            GangCode.UNSUPPORTED, f"{name}: {why}; gpuq places gangs of equal workers", size
        )
    kind = "Worker" if "Worker" in counts else "Master"
    template = mapping(replicas.get(kind)).get("template")
    suspended = bool(mapping(spec.get("runPolicy")).get("suspend"))
    where = f"spec.pytorchReplicaSpecs.{kind}.template"
    return gang_demand(md, template, where, size, levels_by_label, suspended)


def rank(pod: Mapping[str, Any], masters: int) -> int | None:
    """Rank of a PyTorchJob pod: the master 0, worker i `masters + i` (labels the operator sets)."""
    labels = mapping(mapping(pod.get("metadata")).get("labels"))
    kind, index = labels.get(REPLICA_TYPE), labels.get(REPLICA_INDEX)
    if not isinstance(index, str) or not index.isdigit():
        return None
    if kind == "master":
        return int(index)
    if kind == "worker":
        return masters + int(index)
    return None


def ended(body: Mapping[str, Any]) -> str | None:
    """Succeeded or Failed once the owner's controller says it ended (its status conditions)."""
    return owner.ended(body, {"Succeeded": "Succeeded", "Failed": "Failed"})


def rank_in(pod: Mapping[str, Any], owner: Mapping[str, Any]) -> int | None:
    """`rank` of a pod of the PyTorchJob `owner`."""
    masters = _counts(_replicas(owner)).get("Master", 0)
    return rank(pod, masters if isinstance(masters, int) else 0)
