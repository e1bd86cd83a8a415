"""What every owner kind says the same way: its queue, priority, preemptibility, topology and
restart budget (labels and annotations on the owner, Kueue's topology annotations on the pod
template) and its GPUs per worker (the template's nvidia.com/gpu requests). Read into the
TrainingJobSpec the gang is scheduled as, so one set of rules applies to every kind.

Pure and total: anything wrong becomes a GangDemand with an error naming the label, annotation or
field to fix, never an exception."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpuq.api import meta
from gpuq.api.trainingjob import TrainingJobSpec
from gpuq.controller.gangs.demand import GangCode, GangDemand, GangError, mapping
from gpuq.controller.resources import QuantityError, pod_requests
from gpuq.core.model import TopologyMode

# Where each spec field of a foreign gang comes from, for error messages.
SOURCES = {
    "queue": f"label {meta.LABEL_QUEUE}",
    "priority": f"label {meta.LABEL_PRIORITY}",
    "preemptible": f"label {meta.LABEL_PREEMPTIBLE}",
    "minRuntimeSeconds": f"annotation {meta.ANNOTATION_MIN_RUNTIME}",
    "maxRestarts": f"annotation {meta.ANNOTATION_MAX_RESTARTS}",
    "checkpoint": f"annotation {meta.ANNOTATION_CHECKPOINT_GRACE}",
    "topology": f"annotations {meta.ANNOTATION_TOPOLOGY_LEVEL} / {meta.ANNOTATION_TOPOLOGY_MODE}",
}


class _Bad(Exception):
    def __init__(self, code: GangCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _int(raw: str, source: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise _Bad(GangCode.INVALID, f"{source}: {raw!r} is not an integer") from None


def _bool(raw: str, source: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise _Bad(GangCode.INVALID, f"{source}: {raw!r} is neither true nor false")
    return value == "true"


def _topology(
    annotations: Mapping[str, str],
    template_annotations: Mapping[str, str],
    levels_by_label: Mapping[str, str],
) -> dict[str, str]:
    """gpuq's annotations on the owner first; else Kueue's on the pod template (a node label,
    mapped to the topology level that uses it)."""
    level = annotations.get(meta.ANNOTATION_TOPOLOGY_LEVEL)
    if level is not None:
        mode = annotations.get(meta.ANNOTATION_TOPOLOGY_MODE, TopologyMode.PREFERRED.value)
        return {"level": level, "mode": mode}
    for key, mode in (
        (meta.KUEUE_REQUIRED_TOPOLOGY, TopologyMode.REQUIRED),
        (meta.KUEUE_PREFERRED_TOPOLOGY, TopologyMode.PREFERRED),
    ):
        label = template_annotations.get(key)
        if label is None:
            continue
        if label not in levels_by_label:
            known = ", ".join(f"{v}={k}" for k, v in sorted(levels_by_label.items())) or "none"
            raise _Bad(
                GangCode.INVALID,
                f"pod template annotation {key}: node label {label!r} is no topology level's "
                f"(levels: {known})",
            )
        return {"level": levels_by_label[label], "mode": mode.value}
    return {}


def _gpus_per_worker(template: Mapping[str, Any], where: str) -> int:
    try:
        gpus = pod_requests(mapping(template.get("spec")), f"{where}.spec").gpus
    except QuantityError as exc:
        raise _Bad(GangCode.INVALID, str(exc)) from None
    if gpus < 1:
        raise _Bad(GangCode.INVALID, f"{where}.spec requests no nvidia.com/gpu: gpuq schedules GPU gangs")
    return gpus


def _spec(
    metadata: Mapping[str, Any],
    template: Mapping[str, Any],
    where: str,
    size: int,
    levels_by_label: Mapping[str, str],
    suspended: bool,
) -> dict[str, Any]:
    labels = mapping(metadata.get("labels"))
    annotations = mapping(metadata.get("annotations"))
    scheduler = mapping(template.get("spec")).get("schedulerName")
    if scheduler != meta.SCHEDULER_NAME:
        raise _Bad(
            GangCode.SCHEDULER_NAME,
            f"{where}.spec.schedulerName is {scheduler or 'unset (default-scheduler)'}, not "
            f"{meta.SCHEDULER_NAME}: its pods go to another scheduler, and gpuq only counts their GPUs",
        )
    spec: dict[str, Any] = {
        # Suspended by its user: stopped like a TrainingJob with spec.suspend. Suspended by gpuq
        # (the marker): how gpuq evicts it; the gang is simply not placed meanwhile.
        "suspend": suspended and not suspended_by_gpuq(metadata),
        "queue": labels.get(meta.LABEL_QUEUE, ""),
        "workers": {
            "replicas": size,
            "gpusPerWorker": _gpus_per_worker(template, where),
            "template": dict(template),
        },
    }
    if (raw := labels.get(meta.LABEL_PRIORITY)) is not None:
        spec["priority"] = _int(raw, SOURCES["priority"])
    if (raw := labels.get(meta.LABEL_PREEMPTIBLE)) is not None:
        spec["preemptible"] = _bool(raw, SOURCES["preemptible"])
    if (raw := annotations.get(meta.ANNOTATION_MIN_RUNTIME)) is not None:
        spec["minRuntimeSeconds"] = _int(raw, SOURCES["minRuntimeSeconds"])
    if (raw := annotations.get(meta.ANNOTATION_MAX_RESTARTS)) is not None:
        spec["maxRestarts"] = _int(raw, SOURCES["maxRestarts"])
    # Images gpuq did not build rarely report checkpoints: asked for one only if the owner says so.
    grace = annotations.get(meta.ANNOTATION_CHECKPOINT_GRACE)
    spec["checkpoint"] = (
        {"requestOnPreemption": True, "gracePeriodSeconds": _int(grace, SOURCES["checkpoint"])}
        if grace is not None
        else {"requestOnPreemption": False}
    )
    topology = _topology(
        annotations, mapping(mapping(template.get("metadata")).get("annotations")), levels_by_label
    )
    if topology:
        spec["topology"] = topology
    return spec


def suspended_by_gpuq(metadata: Mapping[str, Any]) -> bool:
    """The owner carries gpuq's suspension marker: gpuq suspended it to evict its gang."""
    return mapping(metadata.get("annotations")).get(meta.ANNOTATION_SUSPENDED_BY) == meta.SCHEDULER_NAME


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = e["loc"]
        first = str(loc[0]) if loc else ""
        source = SOURCES.get(first) or ".".join(str(p) for p in loc)
        parts.append(f"{source}: {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def gang_demand(
    metadata: Mapping[str, Any],
    template: Any,
    where: str,
    size: int,
    levels_by_label: Mapping[str, str],
    suspended: bool = False,
) -> GangDemand:
    """An owner's gang of `size` workers made from its pod `template` (at field path `where`)."""
    if not isinstance(template, Mapping):
        return GangDemand.refused(GangCode.INVALID, f"{where} is missing", size)
    try:
        spec = _spec(metadata, template, where, size, levels_by_label, suspended)
    except _Bad as bad:
        return GangDemand(size, None, GangError(bad.code, bad.message), suspended)
    try:
        return GangDemand(size, TrainingJobSpec.model_validate(spec), None, suspended)
    except ValidationError as exc:
        return GangDemand(size, None, GangError(GangCode.INVALID, _validation_message(exc)), suspended)


def ended(body: Mapping[str, Any], outcomes: Mapping[str, str]) -> str | None:
    """How the owner ended, by the first of its status conditions that is True and names an
    outcome (`outcomes`: condition type -> Succeeded / Failed), or None while it runs."""
    for cond in mapping(body.get("status")).get("conditions") or []:
        cond = mapping(cond)
        outcome = outcomes.get(str(cond.get("type", "")))
        if outcome is not None and cond.get("status") == "True":
            return outcome
    return None
