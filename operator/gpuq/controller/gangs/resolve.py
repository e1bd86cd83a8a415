"""Which gang a pod gpuq did not create belongs to, and its rank in it.

A pod is a candidate when its schedulerName is gpuq and it has no gpuq.dev/job-name label (pods of
TrainingJobs carry that). Its gang is its controller owner, when that is a kind gpuq reads
(`KINDS`) and the owner is known with the gpuq.dev/queue label (the owner watch selects on it).
Everything else is a stray with a reason, reported once per pod and never bound."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuq.api import meta
from gpuq.controller.gangs import indexed_job, pytorchjob
from gpuq.controller.gangs.demand import GangDemand, mapping


@dataclass(frozen=True, slots=True)
class Kind:
    """An owner kind gpuq reads as a gang."""

    api_version: str
    kind: str
    plural: str
    suspend: tuple[str, ...]  # the path of the owner's suspend field
    demand: Callable[[Mapping[str, Any], Mapping[str, str]], GangDemand]
    rank: Callable[[Mapping[str, Any], Mapping[str, Any]], int | None]  # (pod, owner body) -> rank
    ended: Callable[[Mapping[str, Any]], str | None]  # owner body -> Succeeded / Failed, or None


KINDS: dict[tuple[str, str], Kind] = {
    (k.api_version, k.kind): k
    for k in (
        Kind(m.API_VERSION, m.KIND, m.PLURAL, m.SUSPEND, m.demand, m.rank_in, m.ended)
        for m in (indexed_job, pytorchjob)
    )
}


class StrayCode(StrEnum):
    """Why a pod that asks for gpuq belongs to no gang gpuq can place (a Warning Event on the pod)."""

    NO_OWNER = "NoOwner"
    UNKNOWN_OWNER_KIND = "UnknownOwnerKind"
    MISSING_QUEUE = "MissingQueue"
    NO_RANK = "NoRank"


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Member:
    """A pod of a gang: the gang's key, its owner's uid, and the pod's rank."""

    gang: str
    owner_uid: str
    rank: int


@dataclass(frozen=True, slots=True)
class Stray:
    code: StrayCode
    message: str
    owner: OwnerRef | None = None


def collection_path(kind: Kind, namespace: str = "") -> str:
    """The API path of an owner kind's objects (in one namespace, if given)."""
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{kind.api_version}{ns}/{kind.plural}"


def gang_key(namespace: str, kind: str, name: str) -> str:
    """`ns/job.llama`, `ns/pytorchjob.bert`: TrainingJob names are DNS-1035 labels (no dots), so
    these keys never collide with a TrainingJob's `ns/name`."""
    return f"{namespace}/{kind.lower()}.{name}"


def controller_ref(pod: Mapping[str, Any]) -> OwnerRef | None:
    for ref in mapping(pod.get("metadata")).get("ownerReferences") or []:
        ref = mapping(ref)
        if ref.get("controller") is True:
            return OwnerRef(
                str(ref.get("apiVersion", "")),
                str(ref.get("kind", "")),
                str(ref.get("name", "")),
                str(ref.get("uid", "")),
            )
    return None


def is_candidate(pod: Mapping[str, Any]) -> bool:
    """A pod that asks for gpuq and is not a TrainingJob's."""
    labels = mapping(mapping(pod.get("metadata")).get("labels"))
    return (
        mapping(pod.get("spec")).get("schedulerName") == meta.SCHEDULER_NAME
        and meta.LABEL_JOB_NAME not in labels
    )


def resolve(
    pod: Mapping[str, Any], owner_of: Callable[[str, str, str], Mapping[str, Any] | None]
) -> Member | Stray:
    """The gang of a candidate pod. `owner_of(kind, namespace, name)` is a labelled owner the cache
    holds (None when it holds none: unlabelled, or not seen yet)."""
    md = mapping(pod.get("metadata"))
    namespace, name = str(md.get("namespace", "")), str(md.get("name", ""))
    ref = controller_ref(pod)
    if ref is None:
        return Stray(
            StrayCode.NO_OWNER,
            f"pod {namespace}/{name} asks for scheduler {meta.SCHEDULER_NAME} but has no controller: gpuq "
            "places only the pods of a TrainingJob, an Indexed Job or a PyTorchJob; it stays Pending",
        )
    kind = KINDS.get((ref.api_version, ref.kind))
    if kind is None:
        known = ", ".join(f"{k.kind} ({k.api_version})" for k in KINDS.values())
        return Stray(
            StrayCode.UNKNOWN_OWNER_KIND,
            f"pod {namespace}/{name} is owned by {ref.kind} ({ref.api_version}) {ref.name}, a kind gpuq "
            f"does not place (it places TrainingJob, {known}); it stays Pending",
            ref,
        )
    owner = owner_of(ref.kind, namespace, ref.name)
    if owner is not None and mapping(owner.get("metadata")).get("uid") != ref.uid:
        return Stray(
            StrayCode.NO_OWNER,
            f"pod {namespace}/{name} belongs to a {ref.kind} {ref.name} that is gone (another has its "
            "name now); garbage collection removes it",
            ref,
        )
    if owner is None:
        return Stray(
            StrayCode.MISSING_QUEUE,
            f"pod {namespace}/{name} asks for scheduler {meta.SCHEDULER_NAME}, but its {ref.kind} {ref.name} "
            f"has no {meta.LABEL_QUEUE} label: label the {ref.kind} with the GPUQueue to charge",
            ref,
        )
    rank = kind.rank(pod, owner)
    if rank is None:
        return Stray(
            StrayCode.NO_RANK, f"pod {namespace}/{name} carries no rank its {ref.kind} gives its pods", ref
        )
    return Member(gang_key(namespace, ref.kind, ref.name), ref.uid, rank)
