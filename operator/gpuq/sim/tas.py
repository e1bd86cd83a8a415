"""Placement of `kueue-tas`: Kueue's topology-aware scheduling as its users run it for training, a
preferred topology level per pod set with the BestFit algorithm (Kueue's default TAS profile).

1. Count, per node, the workers of this gang that fit (resources and GPU model).
2. Find the lowest level (node, rack, block, zone, cluster) with a domain that holds the whole gang;
   among such domains take the one with the fewest free worker slots (best fit).
3. Inside it, level by level: children by free slots, largest first, as few as needed; the last one
   is replaced by the smallest child that still holds what remains (best fit).
Nothing is weighed by communication cost: that is the difference from gpuq's placement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from gpuq.core.model import Job, Node
from gpuq.sim.baselines import Free, model_ok

Domain = tuple[str, ...]  # a prefix of a node's topology path; () is the whole cluster


def worker_slots(job: Job, nodes: Sequence[Node], free: Free) -> dict[str, int]:
    w = job.workers
    slots: dict[str, int] = {}
    for node in nodes:
        slot = free[node.name]
        if slot[0] < w.gpus_per_worker or not model_ok(job, node):
            continue
        n = slot[0] // w.gpus_per_worker if w.gpus_per_worker else 1 << 30
        if w.cpu_millis:
            n = min(n, slot[1] // w.cpu_millis)
        if w.memory_bytes:
            n = min(n, slot[2] // w.memory_bytes)
        if n > 0:
            slots[node.name] = n
    return slots


def tas_place(job: Job, nodes: Sequence[Node], free: Free) -> tuple[str, ...] | None:
    """A placement of every worker, or None; resources are not taken (the caller does)."""
    slots = worker_slots(job, nodes, free)
    need = job.workers.replicas
    if sum(slots.values()) < need:
        return None
    paths = {node.name: node.path for node in nodes if node.name in slots}
    depth = len(next(iter(paths.values())))
    # Free slots per domain at every depth (depth 0: the cluster, depth `depth`: single nodes).
    totals: list[dict[Domain, int]] = [defaultdict(int) for _ in range(depth + 1)]
    for name, path in paths.items():
        for d in range(depth + 1):
            totals[d][path[:d]] += slots[name]
    for d in range(depth, -1, -1):  # lowest level first
        fitting = [(count, dom) for dom, count in totals[d].items() if count >= need]
        if fitting:
            _, domain = min(fitting)
            break
    else:  # pragma: no cover - the cluster total was checked above
        return None
    chosen: dict[Domain, int] = {domain: need}
    for d in range(len(domain), depth):
        below: dict[Domain, int] = {}
        for parent, count in chosen.items():
            children = sorted(
                ((total, dom) for dom, total in totals[d + 1].items() if dom[:d] == parent),
                key=lambda item: (-item[0], item[1]),
            )
            below.update(_best_fit_split(children, count))
        chosen = below
    placement: list[str] = []
    for dom, count in sorted(chosen.items()):
        placement.extend([dom[-1]] * count)
    return tuple(placement)


def _best_fit_split(children: list[tuple[int, Domain]], need: int) -> dict[Domain, int]:
    """Largest children first, as few as needed; the last one swapped for the smallest that fits."""
    taken: dict[Domain, int] = {}
    left = need
    for i, (total, dom) in enumerate(children):
        if left <= 0:
            break
        if total >= left:
            rest = [c for c in children[i:] if c[0] >= left]
            _, best = min(rest, key=lambda item: (item[0], item[1]))
            taken[best] = left
            left = 0
            break
        taken[dom] = total
        left -= total
    return taken
