"""The nodes of the snapshot, kept between builds and updated where the cache says they changed.

A node's core `Node` depends on its cache entry, the usage of other pods bound to it (those no held
gpuq placement accounts for) and, for a NotReady or flapping node, the time. The cache reports
nodes whose entry or bound pods change (`ClusterCache.watch_nodes`); the job side reports placements
that change (which decides whether their pods count as ours). A build touches those, the NotReady
and flapping nodes, and nothing else; capacity, zone sizes and the nodes that may fail gangs are
kept as running sums.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from gpuq.controller.cache import ClusterCache
from gpuq.controller.nodehealth import OUT_OF_SERVICE_TAINT, damped_until
from gpuq.controller.objects import NodeEntry, PodEntry
from gpuq.core.config import SchedulerConfig
from gpuq.core.model import Health, Node, Resources, TaintEffect, Topology
from gpuq.core.topology import WHOLE_CLUSTER, zone_of

NOTHING = Resources()
# A held placement as the node side needs it: ((job uid, attempt), node names).
Placement = tuple[tuple[str, int], tuple[str, ...]]
K = TypeVar("K")


def node_path(name: str, labels: Mapping[str, str], topology: Topology) -> tuple[str, ...]:
    """Domain of each level; a missing label does not split its parent (the node inherits the
    parent's domain), so partially labelled clusters still get the levels they do label."""
    path: list[str] = []
    parent = ""
    for level_label in topology.labels[:-1]:
        parent = labels.get(level_label, parent)
        path.append(parent)
    return (*path, name)


def node_health(node: NodeEntry) -> Health:
    """What the shell knows for sure. NotReady (and the not-ready/unreachable taints that restate it)
    is passed on as `not_ready_since`: the core applies the failover grace period itself."""
    if node.deleting or (
        node.taints
        and any(t.effect == TaintEffect.NO_EXECUTE and t.key == OUT_OF_SERVICE_TAINT for t in node.taints)
    ):
        return Health.FAILED
    if node.unschedulable:
        return Health.CORDONED
    return Health.HEALTHY


def grace_ends(node: NodeEntry, now: float, grace: float) -> float | None:
    """When a NotReady node's grace period ends (the loop wakes up then to fail it over)."""
    if node.ready or node.not_ready_since is None:
        return None
    end = node.not_ready_since + grace
    return end if end > now else None


def foreign_usage(pods: Iterable[PodEntry], ours: Mapping[tuple[str, int], int]) -> Resources:
    """The requests of these live bound pods that no held gpuq placement accounts for (other
    schedulers' pods, and ours of attempts no longer current). Plain ints: a term's first snapshot
    runs it for 100,000 pods."""
    g = c = m = 0
    extra: dict[str, int] = {}
    for pod in pods:
        owner = pod.owner_uid
        if owner is not None and (owner, pod.attempt) in ours:
            continue  # counted through the job's placement (whether it is live or not)
        if pod.node_name is None or not pod.live:
            continue
        r = pod.requests
        g, c, m = g + r.gpus, c + r.cpu_millis, m + r.memory_bytes
        for k, v in r.extra.items():
            extra[k] = extra.get(k, 0) + v
    if not (g or c or m or extra):
        return NOTHING  # the common case: every pod on the node is of a held placement
    return Resources(g, c, m, extra)


def bump(counter: Counter[K], key: K, by: int) -> int:
    """Add `by` to a count, dropping it at zero (so the counter equals one counted afresh)."""
    n = counter.get(key, 0) + by  # not counter[key]: Counter.__missing__ is a Python call
    if n > 0:
        counter[key] = n
    else:
        del counter[key]
    return n


@dataclass(slots=True)
class _NodeMemo:
    entry: NodeEntry
    others: Resources
    flapping: bool
    node: Node


def _gone_node(name: str, topo: Topology) -> Node:
    """A node deleted under a running job: kept, failed, so the core plans the failover."""
    return Node(
        name=name,
        allocatable=Resources(),
        path=(*[f"~{name}"] * (len(topo.levels) - 1), name),
        health=Health.FAILED,
    )


@dataclass(slots=True)
class NodeSide:
    """The kept node half of the snapshot builder (see the module's docstring)."""

    memo: dict[str, _NodeMemo] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)  # the cache's nodes, as in the snapshot
    order: list[str] = field(default_factory=list)  # their names, sorted
    gone: dict[str, Node] = field(default_factory=dict)  # placed on, but no longer in the cache
    others: dict[str, Resources] = field(default_factory=dict)  # other pods' usage per node
    ours: Counter[tuple[str, int]] = field(default_factory=Counter)  # (uid, attempt) of held placements
    placed: Counter[str] = field(default_factory=Counter)  # held placements per node name
    timed: set[str] = field(default_factory=set)  # nodes whose Node or wake changes with time alone
    wakes: dict[str, float] = field(default_factory=dict)
    suspects: dict[str, Node] = field(default_factory=dict)  # NotReady or failed: they may fail gangs
    sizes: Counter[str] = field(default_factory=Counter)  # nodes per zone and in all (disruptions)
    gpus: Counter[int] = field(default_factory=Counter)  # allocatable GPUs of each non-failed node
    total_gpus: int = 0
    dirty_jobs: set[str] = field(default_factory=set)  # jobs whose placement changed since the last build
    placed_since: set[str] = field(default_factory=set)  # nodes placed on since the last build
    unplaced_gone: bool = False  # a gone node lost its last placement since the last build
    tuple_: tuple[Node, ...] | None = None  # the snapshot's nodes, while none changed

    def hold(self, key: str, old: Placement | None, new: Placement | None) -> None:
        """A job's held placement changed from `old` to `new` ((uid, attempt), node names)."""
        if old == new:
            return
        self.dirty_jobs.add(key)
        if old is not None:
            bump(self.ours, old[0], -1)
            for n in old[1]:
                if bump(self.placed, n, -1) <= 0:
                    self.unplaced_gone |= n in self.gone
        if new is not None:
            bump(self.ours, new[0], 1)
            placed = self.placed
            for n in new[1]:  # not Counter.update: its checks cost more than a gang's few nodes
                placed[n] = placed.get(n, 0) + 1
            self.placed_since.update(new[1])

    def _count(self, node: Node, sign: int) -> None:
        """Add (1) or take away (-1) a node's part of the running sums."""
        bump(self.sizes, WHOLE_CLUSTER, sign)
        zone = zone_of(node)
        if zone is not None:
            bump(self.sizes, zone, sign)
        if node.health is not Health.FAILED:
            self.total_gpus += sign * node.allocatable.gpus
            bump(self.gpus, node.allocatable.gpus, sign)
        if node.not_ready_since is not None or node.health is Health.FAILED:
            if sign > 0:
                self.suspects[node.name] = node
            else:
                self.suspects.pop(node.name, None)

    def _set(self, table: dict[str, Node], name: str, node: Node | None, changed: list[Node]) -> None:
        old = table.get(name)
        if old is node:
            return
        self.tuple_ = None
        if old is not None:
            self._count(old, -1)
        if node is None:
            del table[name]
            return
        table[name] = node
        self._count(node, 1)
        changed.append(node)

    def update(
        self, cache: ClusterCache, touched: set[str], now: float, config: SchedulerConfig
    ) -> tuple[list[Node], bool]:
        """Bring the nodes up to the cache at `now`, given the nodes the cache reported touched (the
        caller drains that set). The Node objects that changed, and whether a node came or went."""
        dirty = set(touched)
        touched.clear()
        for key in self.dirty_jobs:
            dirty.update(p.node_name for p in cache.pods_of(key) if p.node_name is not None)
        self.dirty_jobs.clear()
        for name in dirty:
            usage = foreign_usage(cache.pods_by_node.get(name, {}).values(), self.ours)
            if usage == NOTHING:
                self.others.pop(name, None)
            else:
                self.others[name] = usage
        changed: list[Node] = []
        came_or_went = False
        for name in sorted(dirty | self.timed):  # in name order: new names append to self.order
            entry = cache.nodes.get(name)
            if entry is None:
                if name in self.nodes:
                    came_or_went = True
                    self.memo.pop(name, None)
                    self._set(self.nodes, name, None, changed)
                    del self.order[bisect_left(self.order, name)]
                self.timed.discard(name)
                self.wakes.pop(name, None)
                continue
            if name not in self.nodes:
                came_or_went = True
                insort(self.order, name)
            self._set(self.nodes, name, self._node(name, entry, now, config), changed)
        if came_or_went or self.unplaced_gone or any(n not in cache.nodes for n in self.placed_since):
            came_or_went |= self._update_gone(cache, config.topology, changed)
        self.placed_since.clear()
        self.unplaced_gone = False
        return changed, came_or_went

    def _node(self, name: str, entry: NodeEntry, now: float, config: SchedulerConfig) -> Node:
        grace = grace_ends(entry, now, config.failover.not_ready_grace_seconds)
        damped = damped_until(entry, now, config.failover)
        wake = grace if damped is None else damped if grace is None else min(grace, damped)
        if wake is None:
            self.wakes.pop(name, None)
        else:
            self.wakes[name] = wake
        # NotReady, or damped for flapping: the Node (flapping) or the wake changes with time alone.
        if (not entry.ready and entry.not_ready_since is not None) or damped is not None:
            self.timed.add(name)
        else:
            self.timed.discard(name)
        used = self.others.get(name, NOTHING)
        m = self.memo.get(name)
        if m is None or m.entry is not entry or m.others != used or m.flapping != (damped is not None):
            # The device plugin lowers allocatable below capacity when GPUs turn unhealthy.
            lost_gpus = entry.capacity_gpus > entry.allocatable.gpus
            node = Node(
                name=name,
                allocatable=entry.allocatable,
                path=node_path(name, entry.labels, config.topology),
                labels=entry.labels,
                health=node_health(entry),
                taints=entry.taints,
                gpu_model=entry.labels.get(config.gpu_model_label),
                used_by_others=used,
                not_ready_since=None if entry.ready else entry.not_ready_since,
                healthy_gpus=entry.allocatable.gpus if lost_gpus else None,
                flapping=damped is not None,
            )
            m = self.memo[name] = _NodeMemo(entry, used, damped is not None, node)
        return m.node

    def _update_gone(self, cache: ClusterCache, topo: Topology, changed: list[Node]) -> bool:
        """Nodes deleted under held placements: in the snapshot, failed, while a placement holds them."""
        want = {n for n in self.placed if n not in cache.nodes}
        if want == self.gone.keys():
            return False
        for name in self.gone.keys() - want:
            self._set(self.gone, name, None, changed)
        for name in sorted(want - self.gone.keys()):
            self._set(self.gone, name, _gone_node(name, topo), changed)
        return True

    def snapshot_nodes(self) -> tuple[Node, ...]:
        """The cache's nodes in name order, then the gone ones in name order."""
        if self.tuple_ is None:
            nodes = self.nodes
            self.tuple_ = (*map(nodes.__getitem__, self.order), *(self.gone[n] for n in sorted(self.gone)))
        return self.tuple_

    def sized(self) -> tuple[int, int, bool]:
        """(GPUs of the non-failed nodes, the largest such node's, whether there are any nodes)."""
        return self.total_gpus, max(self.gpus, default=0), bool(self.nodes or self.gone)

    def wake_at(self) -> float | None:
        return min(self.wakes.values(), default=None)
