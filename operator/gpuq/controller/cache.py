"""ClusterCache: the operator's in-memory view of the cluster, fed incrementally by watch events.

Handlers and the writer call `upsert_*`/`delete_*` with API objects; nothing here does I/O. An
update that changes nothing the scheduler looks at does not wake the loop, so a quiet cluster
costs nothing. `assume`/`forget` overlay an admission the writer is carrying out, so the next
cycle already counts its GPUs (Kueue's assume/forget).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpuq.api.trainingjob import TrainingJobStatus
from gpuq.controller.gangs.demand import mapping
from gpuq.controller.gangs.resolve import KINDS, Kind, is_candidate
from gpuq.controller.gangs.table import GangTable, OwnerEntry
from gpuq.controller.nodehealth import with_history
from gpuq.controller.objects import (
    JobEntry,
    NodeEntry,
    PodEntry,
    QueueEntry,
    job_status,
    parse_job,
    parse_node,
    parse_pod,
    parse_queue,
)
from gpuq.controller.record import ADMITTED_STATUS_DELAY, status_delay

TOMBSTONES = 100_000  # remembered deletions (uids); far more than can race in flight
# Python's collector scans young objects every 700 allocations and, now and then, everything the
# cache holds: with 15,000 jobs that was a fifth of each scheduling cycle (bench/kueue_perf.py).
# What the cache holds is freed by reference counting (it makes no cycles), so the operator runs
# the collector less often (gc.set_threshold) and freezes the first full list out of its scans
# (gc.freeze): gpuq.controller.operator, and bench/scale.py as the operator does.
GC_THRESHOLDS = (50_000, 20, 20)


@dataclass(frozen=True, slots=True)
class Assumed:
    """An admission in flight: the job holds `placement` for `attempt` before the API says so (its
    pods are being created, or exist and the status that records them is not written yet)."""

    attempt: int
    placement: tuple[str, ...]
    started_at: float
    note: str = ""  # what the decision adds to the admission message (gpuq.controller.intents)
    status_delay: float = ADMITTED_STATUS_DELAY  # how long its status may wait for Running


def _rv_after(a: str | None, b: str | None) -> bool:
    """Version a is strictly later than version b (False when either is unknown or not an integer)."""
    try:
        return a is not None and b is not None and int(a) > int(b)
    except ValueError:
        return False


def _newer_or_same(old_rv: str | None, new_rv: str | None) -> bool:
    """resourceVersions are opaque, but etcd's are integers: use that to drop stale events
    (a watch event can arrive after the writer stored the response of a later write)."""
    if old_rv is None or new_rv is None:
        return True
    try:
        return int(new_rv) >= int(old_rv)
    except ValueError:
        return True


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


# Kinds whose entry is a function of the object alone (and, for a node, of its previous entry): a
# list need not parse again a version the cache holds (ClusterCache.replace).
_PURE_KINDS = frozenset({"node", "queue", "namespace", "job", "pod"})


def _listed_kind(entry: Any) -> bool:
    """Whether an entry came from its table's own list: the jobs table also holds the gangs of
    other owners, which a TrainingJob list must not drop."""
    return getattr(entry, "source", None) is None


def owner_kind(kind: Kind) -> str:
    """The informer kind (and cache table) of an owner kind: `owner:Job`, `owner:PyTorchJob`."""
    return f"owner:{kind.kind}"


class ClusterCache:
    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self.nodes: dict[str, NodeEntry] = {}
        self.queues: dict[str, QueueEntry] = {}
        self.jobs: dict[str, JobEntry] = {}
        self.pods: dict[str, PodEntry] = {}
        self.namespaces: dict[str, dict[str, str]] = {}
        self.assumed: dict[str, Assumed] = {}
        self.deleted_jobs: dict[str, str] = {}  # uid -> key of jobs seen deleted whose pods may linger
        # Each job's pods by key, the dict kept in key order as they come (_add_to_job): a term's
        # first cycle reads every job's in that order, and sorting 15,000 jobs' there cost 30 ms.
        self._pods_by_job: dict[str, dict[str, PodEntry]] = {}
        self._claimed: dict[str, tuple[str | None, tuple[PodEntry, ...]]] = {}  # pods_of's answer, by uid
        # Jobs whose object or pods changed since the loop last took them: the lifecycle, a pure
        # function of a job and its pods, needs to look at no other job.
        self.touched: set[str] = set()
        # Bound pods per node, by key (the snapshot builder re-sums other schedulers' usage only on
        # nodes whose entry or bound pods changed: watch_nodes). Entries, not keys: that sum walks
        # all 100,000 pods in a term's first cycle, and a small dict is smaller than a small set.
        self.pods_by_node: dict[str, dict[str, PodEntry]] = {}
        self._job_sinks: list[set[str]] = []  # one set per reader of changed jobs (watch_jobs)
        self._node_sinks: list[set[str]] = []  # one set per reader of touched nodes (watch_nodes)
        # kind -> key -> the last resourceVersion applied, and the object's uid (a table per kind:
        # (kind, key) tuples as keys cost two tuples an object, at 100,000 pods 11 MiB)
        self._rv: defaultdict[str, dict[str, str]] = defaultdict(dict)
        self._uid: defaultdict[str, dict[str, str]] = defaultdict(dict)
        # uids of deleted objects: the response to our own write can arrive after the DELETED event
        # and must not bring the object back (a ghost pod would hold its node forever).
        self._tombstones: OrderedDict[str, None] = OrderedDict()
        self.on_change = on_change
        self.changes = 0  # bumped on every change that matters to scheduling
        self.gangs = GangTable()  # owners of gangs gpuq did not create, and pods waiting for them
        self._sinks = self._kinds()  # built once: apply() runs for every watch event

    # -- generic bookkeeping -------------------------------------------------------------------
    def _accept(self, kind: str, key: str, body: Mapping[str, Any]) -> bool:
        md = _meta(body)
        rv, uid = md.get("resourceVersion"), md.get("uid")
        if uid is not None and uid in self._tombstones:
            return False
        if (
            uid is not None
            and self._uid[kind].get(key) == uid
            and not _newer_or_same(self._rv[kind].get(key), rv)
        ):
            return False
        if rv is not None:
            self._rv[kind][key] = rv
        if uid is not None:
            self._uid[kind][key] = uid
        return True

    def _forget_object(self, kind: str, key: str, body: Mapping[str, Any]) -> bool:
        """True when the deleted object is the one we hold (not an older one of the same name)."""
        uid = _meta(body).get("uid")
        if uid is not None and self._uid[kind].get(key) not in (None, uid):
            return False
        self._rv[kind].pop(key, None)
        self._uid[kind].pop(key, None)
        if uid is not None:
            self._tombstones[uid] = None
            while len(self._tombstones) > TOMBSTONES:
                self._tombstones.popitem(last=False)
        return True

    def resource_version(self, kind: str, key: str) -> str | None:
        return self._rv[kind].get(key)

    # -- the informers' sink -------------------------------------------------------------------
    def _kinds(
        self,
    ) -> dict[
        str, tuple[dict[str, Any], Callable[[Mapping[str, Any]], None], Callable[[Mapping[str, Any]], None]]
    ]:
        return {
            "node": (self.nodes, self.upsert_node, self.delete_node),
            "queue": (self.queues, self.upsert_queue, self.delete_queue),
            "namespace": (self.namespaces, self.upsert_namespace, self.delete_namespace),
            "job": (self.jobs, self.upsert_job, self.delete_job),
            "pod": (self.pods, self.upsert_pod, self.delete_pod),
            "gang": (self.gangs.records, self.upsert_gang, self.delete_gang),
            **{
                owner_kind(k): (
                    self.gangs.owners[k.kind],
                    partial(self.upsert_owner, k),
                    partial(self.delete_owner, k),
                )
                for k in KINDS.values()
            },
        }

    def apply(self, kind: str, event_type: str, body: Mapping[str, Any]) -> None:
        _, upsert, delete = self._sinks[kind]
        (delete if event_type == "DELETED" else upsert)(body)

    def replace(
        self, kind: str, bodies: Iterable[Mapping[str, Any]], resource_version: str, scope: str | None = None
    ) -> None:
        """A full list of `kind` (in namespace `scope`, if set) at `resource_version`: what it lacks
        was deleted meanwhile, unless the cache holds a later version (a write of ours that the list
        predates)."""
        listed: set[str] = set()
        self.list_page(kind, bodies, listed)
        self.list_done(kind, listed, resource_version, scope)

    def list_page(self, kind: str, bodies: Iterable[Mapping[str, Any]], listed: set[str]) -> None:
        """One page of a list of `kind` (`replace` in parts: the informer applies each page as it
        arrives, so 100,000 decoded pods are never held at once); `listed` collects its keys."""
        _, upsert, _ = self._sinks[kind]
        rvs, uids, pure = self._rv[kind], self._uid[kind], kind in _PURE_KINDS
        for body in bodies:
            md = _meta(body)
            key = f"{md['namespace']}/{md['name']}" if md.get("namespace") else md["name"]
            listed.add(key)
            # The very version the cache holds (a new term's fresh lists, a relist after a watch
            # gap): nothing to parse again, unless its entry depends on other objects (a pod of a
            # gang of another owner is resolved against the owners the cache holds).
            rv = md.get("resourceVersion")
            held = pure and rv is not None and rvs.get(key) == rv and uids.get(key) == md.get("uid")
            if held and (kind != "pod" or not is_candidate(body)):
                continue
            upsert(body)

    def list_done(self, kind: str, listed: set[str], resource_version: str, scope: str | None = None) -> None:
        """The list whose pages `listed` collected ended at `resource_version`: drop what it lacks."""
        table, _, delete = self._sinks[kind]
        prefix = f"{scope}/" if scope else ""
        for key in [k for k in table if k not in listed and k.startswith(prefix) and _listed_kind(table[k])]:
            if _rv_after(self._rv[kind].get(key), resource_version):
                continue
            ns, _, name = key.rpartition("/")
            uid = self._uid[kind].get(key)
            delete(
                {
                    "metadata": {
                        "name": name,
                        **({"namespace": ns} if ns else {}),
                        **({"uid": uid} if uid else {}),
                    }
                }
            )

    def _changed(self) -> None:
        self.changes += 1
        self.on_change()

    def _store(self, table: dict[str, Any], kind: str, key: str, body: Mapping[str, Any], entry: Any) -> None:
        if not self._accept(kind, key, body):
            return
        if table.get(key) != entry:
            table[key] = entry
            if kind == "job":
                self._touch(key)
            elif kind == "node":
                self._tell_node_sinks(key)
            self._changed()

    def _tell_node_sinks(self, node: str) -> None:
        for sink in self._node_sinks:
            sink.add(node)

    def _touch(self, job: str) -> None:
        self._claimed.pop(job, None)
        self.touched.add(job)
        self._tell_job_sinks(job)

    def _tell_job_sinks(self, job: str) -> None:
        for sink in self._job_sinks:
            sink.add(job)

    def watch_jobs(self) -> set[str]:
        """A set that from now on collects every job whose entry, pods or assumption changes (or
        that is deleted); the caller drains it. Unlike `touched`, each reader has its own."""
        sink: set[str] = set()
        self._job_sinks.append(sink)
        return sink

    def unwatch_jobs(self, sink: set[str]) -> None:
        self._job_sinks = [s for s in self._job_sinks if s is not sink]

    def watch_nodes(self) -> set[str]:
        """A set that from now on collects every node whose entry or bound pods change (or that is
        deleted); the caller drains it."""
        sink: set[str] = set()
        self._node_sinks.append(sink)
        return sink

    def unwatch_nodes(self, sink: set[str]) -> None:
        """Stop filling a set watch_nodes returned (its reader is gone: a leadership term ended)."""
        self._node_sinks = [s for s in self._node_sinks if s is not sink]

    def _place(self, pod: PodEntry, old: str | None, new: str | None) -> None:
        """Keep pods_by_node and the watch_nodes sets for a pod (its current entry) that was on
        `old` and is now on `new`."""
        for sink in self._node_sinks:
            sink.update(n for n in (old, new) if n is not None)
        if old is not None and old != new:
            on = self.pods_by_node.get(old)
            if on is not None:
                on.pop(pod.key, None)
                if not on:
                    del self.pods_by_node[old]
        if new is not None:
            self.pods_by_node.setdefault(new, {})[pod.key] = pod

    def take_touched(self) -> set[str]:
        """The jobs touched since the last call (see `touched`), and forget them."""
        out, self.touched = self.touched, set()
        return out

    # -- nodes, queues, namespaces --------------------------------------------------------------
    def upsert_node(self, body: Mapping[str, Any]) -> None:
        entry = with_history(self.nodes.get(_meta(body)["name"]), parse_node(body))
        self._store(self.nodes, "node", entry.name, body, entry)

    def delete_node(self, body: Mapping[str, Any]) -> None:
        name = _meta(body)["name"]
        if self._forget_object("node", name, body) and self.nodes.pop(name, None) is not None:
            self._tell_node_sinks(name)
            self._changed()

    def upsert_queue(self, body: Mapping[str, Any]) -> None:
        entry = parse_queue(body)
        old = self.queues.get(entry.name)
        if old is not None and old.spec is not None and old.spec == entry.spec and old.uid == entry.uid:
            # A status write (usage, every cycle) leaves the spec as it was: keep the very object,
            # so what was derived from it (SnapshotBuilder's per-job memo) stays valid.
            entry.spec = old.spec
        self._store(self.queues, "queue", entry.name, body, entry)

    def delete_queue(self, body: Mapping[str, Any]) -> None:
        name = _meta(body)["name"]
        if self._forget_object("queue", name, body) and self.queues.pop(name, None) is not None:
            self._changed()

    def upsert_namespace(self, body: Mapping[str, Any]) -> None:
        md = _meta(body)
        self._store(self.namespaces, "namespace", md["name"], body, dict(md.get("labels") or {}))

    def delete_namespace(self, body: Mapping[str, Any]) -> None:
        name = _meta(body)["name"]
        if self._forget_object("namespace", name, body) and self.namespaces.pop(name, None) is not None:
            self._changed()

    # -- jobs ---------------------------------------------------------------------------------
    def upsert_job(self, body: Mapping[str, Any]) -> None:
        entry = parse_job(body)
        assumed = self.assumed.get(entry.key)
        if assumed is not None and entry.status.attempt >= assumed.attempt:
            del self.assumed[entry.key]  # the API now records the admission (or a later one)
            self._tell_job_sinks(entry.key)
        self._store(self.jobs, "job", entry.key, body, entry)

    def delete_job(self, body: Mapping[str, Any]) -> None:
        md = _meta(body)
        key = f"{md['namespace']}/{md['name']}"
        if self._forget_object("job", key, body) and (gone := self.jobs.pop(key, None)) is not None:
            self.assumed.pop(key, None)
            self.deleted_jobs[gone.uid] = key
            self._tell_job_sinks(key)
            self._changed()

    def assume(
        self,
        job: str,
        attempt: int,
        placement: tuple[str, ...],
        now: float,
        note: str = "",
        decided_with: int = 0,
    ) -> None:
        """Count an admission before the API records it; one made while many others await their
        status, or decided in one cycle with many others (`decided_with`), is part of a burst and
        lets its status wait longer for Running (gpuq.controller.record)."""
        delay = status_delay(max(len(self.assumed), decided_with))
        self.assumed[job] = Assumed(attempt, placement, now, note, delay)
        self._tell_job_sinks(job)
        self._changed()

    def forget(self, job: str) -> None:
        if self.assumed.pop(job, None) is not None:
            self._tell_job_sinks(job)
            self._changed()

    # -- owners of gangs gpuq did not create (Indexed Jobs, PyTorchJobs) -----------------------
    def upsert_owner(self, kind: Kind, body: Mapping[str, Any]) -> None:
        md = _meta(body)
        if not self._accept(owner_kind(kind), f"{md['namespace']}/{md['name']}", body):
            return
        owner, claimed = self.gangs.put_owner(kind, body)
        self._store_gang(owner)
        for pod in claimed:  # pods seen before their owner
            self.upsert_pod(pod)

    def delete_owner(self, kind: Kind, body: Mapping[str, Any]) -> None:
        md = _meta(body)
        key = f"{md['namespace']}/{md['name']}"
        if not self._forget_object(owner_kind(kind), key, body):
            return
        owner = self.gangs.drop_owner(kind, key)
        if owner is not None and self.jobs.pop(owner.gang, None) is not None:
            # Its pods go with it (garbage collection): they are not orphans gpuq deletes.
            self.assumed.pop(owner.gang, None)
            self._tell_job_sinks(owner.gang)
            self._changed()

    def _store_gang(self, owner: OwnerEntry) -> None:
        entry = self.gangs.job_entry(owner)
        if self.jobs.get(owner.gang) != entry:
            self.jobs[owner.gang] = entry
            self._touch(owner.gang)
            self._changed()

    def set_gang_status(self, gang: str, status: TrainingJobStatus) -> JobEntry | None:
        """The status the operator keeps for a gang of another owner (gangs.record): its entry now."""
        owner = self.gangs.owner_by_gang(gang)
        if owner is None:
            return None
        self.gangs.status[gang] = (owner.uid, status)
        self._store_gang(owner)
        return self.jobs.get(gang)

    # -- Gang objects: the status of those gangs, as the API server holds it ------------------
    def upsert_gang(self, body: Mapping[str, Any]) -> None:
        md = _meta(body)
        key = f"{md['namespace']}/{md['name']}"
        if not self._accept("gang", key, body):
            return
        self.gangs.records[key] = str(md.get("uid", ""))
        if not body.get("status"):
            return  # created, its status not written yet: it says nothing the operator does not know
        owner_uid = str(mapping(mapping(body.get("spec")).get("owner")).get("uid", ""))
        self.gangs.status[key] = (owner_uid, job_status(body.get("status")))
        owner = self.gangs.owner_by_gang(key)
        if owner is not None:
            self._store_gang(owner)

    def delete_gang(self, body: Mapping[str, Any]) -> None:
        """Its status stays with the operator (which writes a new Gang on its next change)."""
        md = _meta(body)
        key = f"{md['namespace']}/{md['name']}"
        if self._forget_object("gang", key, body):
            self.gangs.records.pop(key, None)

    def set_topology_labels(self, labels: Mapping[str, str]) -> None:
        """The scheduler config's node label per topology level (gangs may name a level by it)."""
        if dict(labels) != dict(self.gangs.topology_labels):
            self.gangs.topology_labels = dict(labels)
            for table in self.gangs.owners.values():
                for owner in table.values():
                    self._store_gang(owner)

    # -- pods ---------------------------------------------------------------------------------
    def upsert_pod(self, body: Mapping[str, Any]) -> None:
        entry = parse_pod(body)
        if entry.job is None and is_candidate(body):
            member = self.gangs.resolve_pod(entry.key, body)
            if member is not None:
                entry.job, entry.owner_uid, entry.rank = member.gang, member.owner_uid, member.rank
                if entry.attempt is not None and self.gangs.saw_attempt(member.gang, entry.attempt):
                    owner = self.gangs.owner_by_gang(member.gang)
                    if owner is not None:
                        self._store_gang(owner)
        if entry.job is None and entry.node_name is None and entry.key not in self.pods:
            return  # neither ours nor holding node resources: nothing the scheduler needs
        if not self._accept("pod", entry.key, body):
            return
        old = self.pods.get(entry.key)
        if old == entry:
            return
        if old is not None and old.job != entry.job and old.job is not None:
            self._drop_from_job(old.job, entry.key)
            self._touch(old.job)
        self.pods[entry.key] = entry
        self._place(entry, old.node_name if old is not None else None, entry.node_name)
        if entry.job is not None:
            self._add_to_job(entry.job, entry)
            self._touch(entry.job)
        self._changed()

    def delete_pod(self, body: Mapping[str, Any]) -> None:
        md = _meta(body)
        key = f"{md['namespace']}/{md['name']}"
        if not self._forget_object("pod", key, body):
            return
        self.gangs.drop_pod(key)
        entry = self.pods.pop(key, None)
        if entry is None:
            return
        self._place(entry, entry.node_name, None)
        if entry.job is not None:
            self._touch(entry.job)
            self._drop_from_job(entry.job, key)
        self._changed()

    def _add_to_job(self, job: str, pod: PodEntry) -> None:
        """Put the pod's entry among its job's, keeping them in key order: a new key that sorts
        last (a gang's pods mostly come in name order) is appended, any other reorders them."""
        members = self._pods_by_job.get(job)
        if members is None:
            self._pods_by_job[job] = {pod.key: pod}
            return
        appended = pod.key in members or pod.key > next(reversed(members))
        members[pod.key] = pod
        if not appended:
            self._pods_by_job[job] = dict(sorted(members.items()))

    def _drop_from_job(self, job: str, key: str) -> None:
        members = self._pods_by_job.get(job)
        if members is not None:
            members.pop(key, None)
            if not members:
                del self._pods_by_job[job]

    def set_pod_node(self, key: str, node: str, attempt: int | None = None) -> None:
        """Record a binding the writer just made (the API returns no pod for a Binding), and the
        attempt it wrote with it on a pod of a gang gpuq did not create."""
        pod = self.pods.get(key)
        if pod is None or (pod.node_name == node and (attempt is None or pod.attempt == attempt)):
            return
        self._place(pod, pod.node_name, node)
        pod.node_name = node
        if attempt is not None:
            pod.attempt = attempt
        if pod.job is not None:
            self._touch(pod.job)
        self._changed()

    def has_pods(self, job: str) -> bool:
        return bool(self._pods_by_job.get(job))

    def pods_of(self, job: str, uid: str | None = None) -> tuple[PodEntry, ...]:
        """The workers of `job`, of any attempt; with `uid`, only those owned by that incarnation of
        it. Not the unclaimed pods of a gang gpuq did not create (`unclaimed_of`). Kept until they
        change: the snapshot and the lifecycle ask for every job's in a term's first cycle."""
        kept = self._claimed.get(job)
        if kept is not None and kept[0] == uid:
            return kept[1]
        pods = tuple(self._pods(job, uid, unclaimed=False))
        if pods:  # none: nothing kept (a deleted job's key is asked about for a while)
            self._claimed[job] = (uid, pods)
        return pods

    def unclaimed_of(self, job: str, uid: str | None = None) -> list[PodEntry]:
        """A gang's pods that its owner's controller created and no admission has bound yet."""
        return self._pods(job, uid, unclaimed=True)

    def _pods(self, job: str, uid: str | None, unclaimed: bool) -> list[PodEntry]:
        """The job's pods in key order, of incarnation `uid` (None: any) and PodEntry.unclaimed or
        not, in one pass without the property's call per pod (a first cycle asks for 100,000)."""
        members = self._pods_by_job.get(job)
        if not members:
            return []
        return [
            p
            for p in members.values()
            if (uid is None or p.owner_uid in (uid, None))
            and (p.attempt is None and p.node_name is None) is unclaimed
        ]

    def orphans(self) -> list[PodEntry]:
        """Live pods of deleted jobs. Garbage collection removes them too, but only after it has
        discovered the CRD; deleting them right away releases their GPUs at once."""
        out = []
        for uid, key in list(self.deleted_jobs.items()):
            pods = [p for p in self.pods_of(key) if p.owner_uid == uid]
            out += [p for p in pods if p.live and not p.deleting]
            if not pods:
                del self.deleted_jobs[uid]
        return out
