"""The cache's part for gangs gpuq did not create: their owners, the pods that wait for an owner to
be seen (an owner's watch event may come after its pods'), and the JobEntry a gang is scheduled as.
No I/O; ClusterCache calls it from its informer sink."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuq.api import meta
from gpuq.api.trainingjob import TrainingJobStatus
from gpuq.controller.gangs.demand import mapping
from gpuq.controller.gangs.owner import suspended_by_gpuq
from gpuq.controller.gangs.record import restored
from gpuq.controller.gangs.resolve import KINDS, Kind, Member, Stray, gang_key, resolve
from gpuq.controller.objects import JobEntry, parse_time


@dataclass(slots=True)
class OwnerEntry:
    kind: Kind
    namespace: str
    name: str
    uid: str
    body: Mapping[str, Any]

    @property
    def gang(self) -> str:
        return gang_key(self.namespace, self.kind.kind, self.name)


class GangTable:
    def __init__(self) -> None:
        self.owners: dict[str, dict[str, OwnerEntry]] = {k.kind: {} for k in KINDS.values()}
        self.strays: dict[str, Stray] = {}  # pod key -> why it belongs to no gang (yet)
        self.stray_uids: dict[str, str] = {}  # pod key -> uid, for the Event on a stray
        # Owner uid -> pod key -> body: strays that name an owner, which may claim them once seen.
        self._waiting: dict[str, dict[str, Mapping[str, Any]]] = {}
        # Node label -> topology level name (the scheduler config's levels): Kueue's topology
        # annotations name a node label.
        self.topology_labels: Mapping[str, str] = {}
        # Gang key -> (owner uid, the status the operator keeps for it): what its Gang object says
        # (gpuq.api.gang, watched) or the operator last wrote. Before either, the latest attempt its
        # pods carry (pods bound by an operator that had no Gang to write to).
        self.status: dict[str, tuple[str, TrainingJobStatus]] = {}
        self.attempts: dict[str, int] = {}
        self.records: dict[str, str] = {}  # Gang objects seen (key -> uid): the informer's table

    def owner_by_gang(self, gang: str) -> OwnerEntry | None:
        ns, _, rest = gang.partition("/")
        kind, _, name = rest.partition(".")
        for k, table in self.owners.items():
            if k.lower() == kind:
                return table.get(f"{ns}/{name}")
        return None

    def queue_of(self, gang: str) -> str:
        """The queue label of a gang's owner ("" if unknown)."""
        owner = self.owner_by_gang(gang)
        labels = mapping(mapping(owner.body.get("metadata")).get("labels")) if owner is not None else {}
        return str(labels.get(meta.LABEL_QUEUE, ""))

    def saw_attempt(self, gang: str, attempt: int) -> bool:
        """A pod of the gang carries `attempt`; True when that changes the gang's restored status."""
        if gang in self.status or attempt <= self.attempts.get(gang, 0):
            return False
        self.attempts[gang] = attempt
        return True

    def owner_of(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        owner = self.owners.get(kind, {}).get(f"{namespace}/{name}")
        return owner.body if owner is not None else None

    def put_owner(self, kind: Kind, body: Mapping[str, Any]) -> tuple[OwnerEntry, list[Mapping[str, Any]]]:
        """Store an owner; returns it and the bodies of the stray pods it may claim now."""
        md = mapping(body.get("metadata"))
        owner = OwnerEntry(
            kind, str(md.get("namespace", "")), str(md.get("name", "")), str(md.get("uid", "")), body
        )
        old = self.owners[kind.kind].get(f"{owner.namespace}/{owner.name}")
        if old is not None and old.uid != owner.uid:  # deleted and created again: a new gang
            self.status.pop(owner.gang, None)
            self.attempts.pop(owner.gang, None)
        self.owners[kind.kind][f"{owner.namespace}/{owner.name}"] = owner
        return owner, list(self._waiting.get(owner.uid, {}).values())

    def drop_owner(self, kind: Kind, key: str) -> OwnerEntry | None:
        owner = self.owners[kind.kind].pop(key, None)
        if owner is not None:
            self.status.pop(owner.gang, None)
            self.attempts.pop(owner.gang, None)
        return owner

    def resolve_pod(self, key: str, body: Mapping[str, Any]) -> Member | None:
        """The pod's gang, or None (then `strays` says why, until the pod or its owner changes)."""
        found = resolve(body, self.owner_of)
        self.drop_pod(key)
        if isinstance(found, Stray):
            self.strays[key] = found
            self.stray_uids[key] = str(mapping(body.get("metadata")).get("uid", ""))
            if found.owner is not None:
                self._waiting.setdefault(found.owner.uid, {})[key] = body
            return None
        return found

    def drop_pod(self, key: str) -> None:
        stray = self.strays.pop(key, None)
        self.stray_uids.pop(key, None)
        if stray is not None and stray.owner is not None:
            waiting = self._waiting.get(stray.owner.uid, {})
            waiting.pop(key, None)
            if not waiting:
                self._waiting.pop(stray.owner.uid, None)

    def status_of(self, owner: OwnerEntry) -> TrainingJobStatus:
        kept = self.status.get(owner.gang)
        if kept is not None and kept[0] == owner.uid:
            return kept[1]
        return restored(self.attempts.get(owner.gang))

    def job_entry(self, owner: OwnerEntry) -> JobEntry:
        """The gang as the scheduler sees a job: the owner's demand as its spec, the status the
        operator keeps for it (gangs.record)."""
        demand = owner.kind.demand(owner.body, self.topology_labels)
        md = mapping(owner.body.get("metadata"))
        generation = md.get("generation", 0)
        return JobEntry(
            namespace=owner.namespace,
            name=owner.gang.split("/", 1)[1],
            uid=owner.uid,
            created_at=parse_time(md.get("creationTimestamp")) or 0.0,
            spec=demand.spec,
            status=self.status_of(owner),
            generation=generation if isinstance(generation, int) else 0,
            error=f"{demand.error.code}: {demand.error.message}" if demand.error is not None else None,
            error_reason=str(demand.error.code) if demand.error is not None else "Invalid",
            deleting=md.get("deletionTimestamp") is not None,
            source=owner.kind.kind,
            parked=demand.suspended and suspended_by_gpuq(md),
            ended=owner.kind.ended(owner.body),
        )
