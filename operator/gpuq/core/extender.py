"""The scheduler extender's rules: which nodes a GPU pod of another scheduler may take, and where it
hurts gpuq's gangs least (pure: a snapshot in, answers out; the HTTP side is gpuq.controller.extender).

kube-scheduler places inference servers, notebooks and other GPU pods gpuq does not own. It sees the
GPUs of bound pods only, so without help it takes GPUs gpuq has already promised:
- **reserved**: a gang being admitted (its placement is decided and persisted, its pods not bound yet)
  or re-placed after a failure;
- **draining**: a node of a preemption victim: its GPUs are about to be freed for the preemptor.
`filter` removes nodes without enough GPUs once those are counted, and every draining node.

`prioritize` keeps whole nodes and whole racks free for gangs, in the spirit of fragmentation-gradient
descent (FGD, ATC'23): a node's fragmentation for a gang shape is the free GPUs that cannot host one of
its workers (free mod GPUs-per-worker); a small pod goes where it raises the expected fragmentation of
the likely shapes least (the shapes of pending gangs, weighted by their GPUs, plus whole nodes), then
where it leaves the fewest free GPUs on the node (best fit), then in the rack with the fewest free GPUs.
Scores are 0-10 (kube-scheduler's MaxExtenderPriority), by rank among the candidate nodes.

gpuq's part of the view changes once per scheduling cycle, but other schedulers' pods bind between
cycles (kube-scheduler places a burst of 200 pods in seconds): `set_others` updates one node's usage
by them as the watch reports it, so each answer sees the pods placed just before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuq.core.constraints import is_schedulable
from gpuq.core.decisions import Admit
from gpuq.core.model import Snapshot

MAX_SCORE = 10


@dataclass(slots=True)
class ExtenderView:
    """What the extender answers from: rebuilt each scheduling cycle, other schedulers' usage kept
    current in between (`set_others`)."""

    capacity: dict[str, int] = field(default_factory=dict)  # node -> allocatable GPUs
    free: dict[str, int] = field(default_factory=dict)  # node -> GPUs left for pods of other schedulers
    reserved: dict[str, str] = field(default_factory=dict)  # node -> which gang holds GPUs there, unbound
    draining: dict[str, str] = field(default_factory=dict)  # node -> the preemption freeing it
    rack: dict[str, str] = field(default_factory=dict)  # node -> its innermost non-node domain
    rack_free: dict[str, int] = field(default_factory=dict)  # rack -> free GPUs in it
    shapes: tuple[tuple[int, float], ...] = ()  # (GPUs per worker, weight), weights summing to 1
    held: dict[str, int] = field(default_factory=dict)  # node -> GPUs gpuq's placements claim there
    others: dict[str, int] = field(default_factory=dict)  # node -> GPUs other pods use there
    unusable: frozenset[str] = frozenset()  # nodes no pod should go to (not ready, cordoned)

    def set_others(self, node: str, gpus: int) -> None:
        """Other pods now use `gpus` GPUs on `node` (a pod of another scheduler bound or left)."""
        if node not in self.capacity or self.others.get(node, 0) == gpus:
            return
        self.others[node] = gpus
        before = self.free[node]
        self.free[node] = _free(self.capacity[node], gpus, self.held.get(node, 0), node not in self.unusable)
        self.rack_free[self.rack[node]] += self.free[node] - before


def _free(capacity: int, others: int, held: int, usable: bool) -> int:
    return max(0, capacity - others - held) if usable else 0


def extender_view(
    snapshot: Snapshot,
    bound: Iterable[tuple[str, str]] = (),
    admitting: Iterable[Admit] = (),
    others: Mapping[str, int] | None = None,
) -> ExtenderView:
    """`bound`: (job key, node) of each gpuq worker pod already bound (kube-scheduler counts those
    itself); the rest of each placement is reserved. `admitting`: the admissions of the cycle that
    built the snapshot (reserved at once, before any status or pod shows them). `others`: GPUs other
    pods use per node, when fresher than the snapshot's."""
    bound_ranks: dict[tuple[str, str], int] = {}
    for key, node in bound:
        bound_ranks[(key, node)] = bound_ranks.get((key, node), 0) + 1
    capacity: dict[str, int] = {}
    used: dict[str, int] = {}
    held: dict[str, int] = {}
    rack: dict[str, str] = {}
    unusable: set[str] = set()
    for nd in snapshot.nodes:
        if not is_schedulable(nd):
            unusable.add(nd.name)
        capacity[nd.name] = nd.allocatable.gpus
        used[nd.name] = nd.used_by_others.gpus if others is None else others.get(nd.name, 0)
        rack[nd.name] = "/".join(nd.path[:-1])
    reserved: dict[str, str] = {}
    draining: dict[str, str] = {}
    pending: dict[int, float] = {}
    for job in snapshot.jobs:
        g = job.workers.gpus_per_worker
        if job.running is None:
            if g > 0:
                pending[g] = pending.get(g, 0.0) + g * job.workers.replicas
            continue
        per_node: dict[str, int] = {}
        for node in job.running.placement:
            per_node[node] = per_node.get(node, 0) + 1
        for node, ranks in per_node.items():
            if node not in capacity:
                continue
            held[node] = held.get(node, 0) + ranks * g
            if job.evicting:
                draining[node] = f"gpuq is freeing it: {job.key} is being preempted"
            elif ranks > bound_ranks.get((job.key, node), 0):
                reserved[node] = f"{ranks * g} GPUs reserved for gang {job.key} (binding)"
    jobs = {j.key: j for j in snapshot.jobs}
    for a in admitting:
        admitted = jobs.get(a.job)
        if admitted is None or admitted.running is not None:
            continue
        g = admitted.workers.gpus_per_worker
        pending[g] = max(0.0, pending.get(g, 0.0) - g * admitted.workers.replicas)
        for node in a.placement:
            if node in capacity:
                held[node] = held.get(node, 0) + g
                reserved[node] = f"GPUs reserved for gang {a.job} (being admitted)"
    free = {n: _free(c, used[n], held.get(n, 0), n not in unusable) for n, c in capacity.items()}
    rack_free: dict[str, int] = {}
    for node, f in free.items():
        rack_free[rack[node]] = rack_free.get(rack[node], 0) + f
    largest = max(capacity.values(), default=0)
    if largest:
        pending[largest] = pending.get(largest, 0.0) + largest  # whole nodes are always worth keeping
    total = sum(pending.values()) or 1.0
    shapes = tuple(sorted((g, w / total) for g, w in pending.items() if w > 0))
    return ExtenderView(
        capacity, free, reserved, draining, rack, rack_free, shapes, held, used, frozenset(unusable)
    )


def filter_nodes(view: ExtenderView, gpus: int, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(nodes that pass, node -> why not). Unknown nodes pass: gpuq has nothing to say about them."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        if name in view.draining:
            failed[name] = view.draining[name]
        elif name in view.free and view.free[name] < gpus:
            why = view.reserved.get(name, "not enough GPUs")
            failed[name] = f"{view.free[name]} of {view.capacity[name]} GPUs free for other schedulers; {why}"
        else:
            passed.append(name)
    return passed, failed


def fragmentation(free: int, shapes: Sequence[tuple[int, float]]) -> float:
    """Expected GPUs of a node with `free` GPUs that no worker of a likely shape could use."""
    return sum(w * (free % g if g <= free else free) for g, w in shapes)


def prioritize(view: ExtenderView, gpus: int, names: Sequence[str]) -> list[tuple[str, int]]:
    """(node, score 0-10) for each candidate; higher is better for gpuq's gangs. O(candidates): a
    node's key depends on its free GPUs (a handful of values) and its rack's."""
    free, rack, rack_free, shapes = view.free, view.rack, view.rack_free, view.shapes
    by_free: dict[int, tuple[float, int]] = {}
    keys: list[tuple[float, int, int]] = []
    for name in names:
        f = free.get(name)
        if f is None:
            keys.append((0.0, 0, 0))  # not a node gpuq knows: neutral
            continue
        k = by_free.get(f)
        if k is None:
            after = max(0, f - gpus)
            k = by_free[f] = (round(fragmentation(after, shapes) - fragmentation(f, shapes), 6), after)
        keys.append((k[0], k[1], rack_free.get(rack.get(name, ""), 0)))
    ranked = sorted(set(keys))
    if len(ranked) <= 1:
        return [(name, MAX_SCORE) for name in names]
    step = MAX_SCORE / (len(ranked) - 1)
    score = {k: round(MAX_SCORE - i * step) for i, k in enumerate(ranked)}
    return [(name, score[k]) for name, k in zip(names, keys, strict=True)]
