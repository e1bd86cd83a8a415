"""A gang's status, for owners whose object has no place for gpuq's (Indexed Jobs, PyTorchJobs).

A TrainingJob keeps what gpuq knows of it (phase, attempt, placement, conditions) in its own
`status`. An owner of another kind has no such field, so the operator keeps the same status in
memory and applies the same merge patches to it. It is not the durable record: the gang's bound
pods are (each carries `gpuq.dev/attempt`, written with its binding). An operator that restarts
finds them, as it finds a TrainingJob's gang created before its status (gpuq.controller.record),
and rebuilds the status from them; what is lost is history (restart counts, conditions' times).
A durable record of its own is the next step (docs/existing-workloads.md, "The plan").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuq.api.trainingjob import TrainingJobStatus
from gpuq.controller.gangs.resolve import KINDS, Kind


def merge_patch(doc: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch: objects merge key by key, None deletes, anything else replaces."""
    out = dict(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out


def patched(status: TrainingJobStatus, patch: Mapping[str, Any]) -> TrainingJobStatus:
    """The status after a merge patch, as the API server would store it for a TrainingJob."""
    raw = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    return TrainingJobStatus.model_validate(merge_patch(raw, patch))


def restored(attempts: Sequence[int | None]) -> TrainingJobStatus:
    """The status of a gang first seen with pods bound by an earlier operator: the attempt before
    the latest one they carry, so that the latest is found as a gang whose status is still to be
    written (and the lifecycle writes it)."""
    latest = max((a for a in attempts if a is not None), default=0)
    return TrainingJobStatus(attempt=max(0, latest - 1))


def kind_of(source: str) -> Kind:
    """The owner kind a gang entry's `source` names."""
    return next(k for k in KINDS.values() if k.kind == source)


def owner_name(gang_name: str) -> str:
    """The owner's name in a gang entry's name (`job.llama` -> `llama`)."""
    return gang_name.split(".", 1)[1]
