"""A gang's status, for owners whose object has no place for gpuq's (Indexed Jobs, PyTorchJobs).

A TrainingJob keeps what gpuq knows of it (phase, attempt, placement, conditions) in its own
`status`. An owner of another kind has no such field, so the operator applies the same merge
patches to a status it keeps, and writes that to a Gang object (gpuq.api.gang) named like the
gang's entry (`job.llama`), owned by the owner: users read it, a new leader lists it. The bound
pods stay the durable record of an admission (each carries `gpuq.dev/attempt`, written with its
binding): without the Gang CRD, or before the first write, the status is rebuilt from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuq.api import meta
from gpuq.api.trainingjob import TrainingJobStatus
from gpuq.controller.gangs.resolve import KINDS, Kind
from gpuq.controller.objects import JobEntry


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
    return TrainingJobStatus.model_validate(merge_patch(whole(status), patch))


def whole(status: TrainingJobStatus) -> dict[str, Any]:
    """The status as a merge patch that sets every field it has."""
    return status.model_dump(by_alias=True, mode="json", exclude_none=True)


def gang_object(job: JobEntry, queue: str) -> dict[str, Any]:
    """The Gang that records `job` (a gang entry of queue `queue`, its owner's label: the entry has
    no spec when gpuq cannot run it), owned by its owner: garbage collected with it."""
    assert job.source is not None
    kind = kind_of(job.source)
    owner = {"apiVersion": kind.api_version, "kind": kind.kind, "name": owner_name(job.name), "uid": job.uid}
    return {
        "apiVersion": meta.API_VERSION,
        "kind": "Gang",
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "labels": {meta.LABEL_QUEUE: queue} if queue else {},
            "ownerReferences": [{**owner, "controller": False, "blockOwnerDeletion": False}],
        },
        "spec": {"owner": owner, "queue": queue, "workers": job.spec.workers.replicas if job.spec else 0},
    }


def restored(latest: int | None) -> TrainingJobStatus:
    """The status of a gang first seen with pods bound by an earlier operator (the latest attempt
    they carry): the attempt before it, so that the latest is found as a gang whose status is still
    to be written (and the lifecycle writes it)."""
    return TrainingJobStatus(attempt=max(0, (latest or 0) - 1))


def suspend_patch(kind: Kind, on: bool, marker: str | None) -> dict[str, Any]:
    """A merge patch setting the owner's suspend field to `on` and gpuq's marker to `marker`
    (None: removed; a suspension without it is its user's)."""
    patch: dict[str, Any] = {kind.suspend[-1]: on}
    for part in reversed(kind.suspend[:-1]):
        patch = {part: patch}
    patch["metadata"] = {"annotations": {meta.ANNOTATION_SUSPENDED_BY: marker}}
    return patch


def kind_of(source: str) -> Kind:
    """The owner kind a gang entry's `source` names."""
    return next(k for k in KINDS.values() if k.kind == source)


def owner_name(gang_name: str) -> str:
    """The owner's name in a gang entry's name (`job.llama` -> `llama`)."""
    return gang_name.split(".", 1)[1]
