"""batch/v1 Jobs as gangs: an Indexed Job whose completions equal its parallelism is one gang of
`parallelism` workers, rank = the pod's completion index. Other Jobs cannot be all-or-nothing (a
NonIndexed Job's pods are interchangeable and may run one after another), so they are refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuq.controller.gangs import owner
from gpuq.controller.gangs.demand import GangCode, GangDemand, mapping
from gpuq.controller.gangs.owner import gang_demand

API_VERSION = "batch/v1"
KIND = "Job"
PLURAL = "jobs"
SUSPEND = ("spec", "suspend")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
MAX_SIZE = 4096  # a TrainingJob's largest gang


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def demand(body: Mapping[str, Any], levels_by_label: Mapping[str, str]) -> GangDemand:
    md = mapping(body.get("metadata"))
    spec = mapping(body.get("spec"))
    name = f"Job {md.get('namespace', '')}/{md.get('name', '')}"
    mode = spec.get("completionMode") or "NonIndexed"
    if mode != "Indexed":
        return GangDemand.refused(
            GangCode.UNSUPPORTED,
            f"{name} has completionMode {mode}: gpuq runs an Indexed Job whose completions equal its "
            "parallelism as one gang",
        )
    parallelism = _count(spec.get("parallelism", 1))
    completions = _count(spec.get("completions"))
    if parallelism is None or completions != parallelism:
        return GangDemand.refused(
            GangCode.UNSUPPORTED,
            f"{name} has parallelism {spec.get('parallelism', 1)} and completions "
            f"{spec.get('completions')}: as a gang both must be equal (every index runs at once)",
        )
    if not 1 <= parallelism <= MAX_SIZE:
        return GangDemand.refused(
            GangCode.UNSUPPORTED, f"{name} has parallelism {parallelism}: a gang has 1 to {MAX_SIZE} workers"
        )
    return gang_demand(
        md, spec.get("template"), "spec.template", parallelism, levels_by_label, bool(spec.get("suspend"))
    )


def rank(pod: Mapping[str, Any]) -> int | None:
    """The pod's completion index (a label since Kubernetes 1.28, an annotation before)."""
    md = mapping(pod.get("metadata"))
    for where in ("labels", "annotations"):
        raw = mapping(md.get(where)).get(COMPLETION_INDEX)
        if isinstance(raw, str) and raw.isdigit():
            return int(raw)
    return None


def ended(body: Mapping[str, Any]) -> str | None:
    """Succeeded or Failed once the owner's controller says it ended (its status conditions)."""
    return owner.ended(body, {"Complete": "Succeeded", "Failed": "Failed"})


def rank_in(pod: Mapping[str, Any], owner: Mapping[str, Any]) -> int | None:
    """`rank` (a Job's pods say their index themselves)."""
    return rank(pod)
