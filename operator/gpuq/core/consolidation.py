"""Consolidation: move small gangs off partly used nodes so that a starving gang fits (config:
Consolidation; KAI Scheduler's consolidation action is the model).

Free GPUs scattered over partly used nodes are no use to a gang of whole-node workers. When a
starving queue head fits its quota and the free GPUs in number but not in shape, the search clears
nodes for it inside one domain at a time, at the smallest level (rack, block, zone, cluster) whose
domains could hold it at all, so that it lands as compactly as it would in an empty cluster; the
plan moving the fewest GPUs wins. In a domain, nodes are cleared cheapest first (fewest GPUs of
jobs still running, then of all movers): a node's movers (running single-node gangs the head may
move) are released, and all movers so far are placed, in the order their queues will take them
back, on other nodes' free GPUs of their GPU model, never on a node being cleared; a node whose
movers do not all fit is left as it was. After each cleared node the head is tried. The scenario
runs on the cycle state and is rolled back: the caller commits the plan (the movers become victims
that checkpoint and restart on the free GPUs the plan found).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpuq.core.fit import slots_on
from gpuq.core.index import OrderKey
from gpuq.core.placement import Placement, Request, place
from gpuq.core.pools import Pool
from gpuq.core.preemption import Victim
from gpuq.core.state import CycleState
from gpuq.core.topology import DomainTree

# Candidate nodes tried per domain, beyond the head's replicas, and domains tried per level (the
# roomiest): they bound a search's cost on large clusters.
EXTRA_CANDIDATES = 16
DOMAINS_PER_LEVEL = 8


@dataclass(frozen=True, slots=True)
class Move:
    victim: Victim
    target: Placement  # where it fits once it has left


@dataclass(frozen=True, slots=True)
class Plan:
    moves: tuple[Move, ...]
    placement: Placement  # the head's, with every move done
    nodes: tuple[int, ...]  # the nodes cleared
    moved: int  # GPUs of the gangs it stops (not counting those already being evicted)


def search(
    st: CycleState,
    req: Request,
    tiers: Sequence[Sequence[Pool]],
    weights: Sequence[float],
    movers: Iterable[Victim],
    mover_tiers: Callable[[Victim], Sequence[Sequence[Pool]]],
    mover_order: Callable[[Victim], OrderKey],
    max_moved_gpus: int,
) -> Plan | None:
    """The plan moving the fewest GPUs after which `req` fits inside one domain of the smallest level
    whose domains could hold it (never above the request's Required level), or None. Leaves the
    state unchanged."""
    by_node: dict[int, list[Victim]] = {}
    for v in movers:
        by_node.setdefault(v.assign[0][0], []).append(v)
    pools = [p for tier in tiers for p in tier]

    def cost(n: int) -> tuple[int, int, int]:
        vs = by_node[n]
        return (sum(v.gpus for v in vs if not v.evicting), sum(v.gpus for v in vs), n)

    order = sorted((n for n in by_node if any(p.member[n] for p in pools)), key=cost)
    tree = st.tree
    movable_gpus = [0] * tree.n_domains  # GPUs of movers per domain
    for n in order:
        for dom in tree.ancestors[n]:
            movable_gpus[dom] += sum(v.gpus for v in by_node[n])
    G = req.demand.gpus * req.replicas
    top = tree.depth[req.within]
    if req.required_depth is not None:
        top = max(req.required_depth, top)
    for t in range(tree.node_depth - 1, top - 1, -1):
        doms = _domains(tree, req.within, t)
        if not any(_capacity(pools, dom) >= G for dom in doms):
            continue  # no domain of this level could ever hold the head
        # A domain can hold the head once its movers leave: capacity, and free plus movable GPUs.
        roomy = sorted(
            (
                dom
                for dom in doms
                if _capacity(pools, dom) >= G and _free(pools, dom) + movable_gpus[dom] >= G
            ),
            key=lambda dom: (-_free(pools, dom), dom),
        )[:DOMAINS_PER_LEVEL]
        best: Plan | None = None
        for dom in roomy:
            cands = [n for n in order if tree.contains(dom, n)][: req.replicas + EXTRA_CANDIDATES]
            if not cands:
                continue
            inside = Request(req.demand, req.replicas, req.required_depth, within=dom, exclude=req.exclude)
            plan = _clear(
                st, inside, tiers, weights, by_node, cands, mover_tiers, mover_order, max_moved_gpus
            )
            if plan is not None and (best is None or plan.moved < best.moved):
                best = plan
        # Only the smallest level that could hold the head: a plan that spreads it wider than
        # waiting would is not worth its moves (it costs every step of the head in communication).
        return best
    return None


def _clear(
    st: CycleState,
    req: Request,
    tiers: Sequence[Sequence[Pool]],
    weights: Sequence[float],
    by_node: dict[int, list[Victim]],
    order: list[int],
    mover_tiers: Callable[[Victim], Sequence[Sequence[Pool]]],
    mover_order: Callable[[Victim], OrderKey],
    max_moved_gpus: int,
) -> Plan | None:
    """Clear the nodes of `order` one by one (see the module) until `req` fits."""
    d = req.demand
    outer = st.begin()
    try:
        cleared: list[int] = []
        leaving: list[Victim] = []
        moved = 0
        for n in order:
            vs = by_node[n]
            paying = sum(v.gpus for v in vs if not v.evicting)
            if moved + paying > max_moved_gpus:
                continue
            before = slots_on(st.free_gpu[n], st.free_cpu[n], st.free_mem[n], st.free_extra.get(n), d)
            released = st.begin()
            for v in vs:
                st.use_all(v.assign, v.demand, -1)
            after = slots_on(st.free_gpu[n], st.free_cpu[n], st.free_mem[n], st.free_extra.get(n), d)
            trial = sorted([*leaving, *vs], key=mover_order)
            placing = st.begin()
            moves = (
                _replace(st, trial, frozenset((*cleared, n)), mover_tiers, weights)
                if after > before
                else None
            )
            p = place(st, tiers, req, weights) if moves is not None else None
            st.rollback(placing)
            if moves is None:
                st.rollback(released)
                continue
            st.commit(released)
            cleared.append(n)
            leaving = trial
            moved += paying
            if p is not None:
                return Plan(tuple(moves), p, tuple(cleared), moved)
        return None
    finally:
        st.rollback(outer)


def _domains(tree: DomainTree, within: int, depth: int) -> list[int]:
    """The domains at `depth` inside domain `within`."""
    out = []
    for dom in tree.by_depth[depth]:
        up = dom
        while tree.depth[up] > tree.depth[within]:
            up = tree.parent[up]
        if up == within:
            out.append(dom)
    return out


def _free(pools: Sequence[Pool], dom: int) -> int:
    return max(p.free_sum[dom] for p in pools)


def _capacity(pools: Sequence[Pool], dom: int) -> int:
    return max(p.cap_sum[dom] for p in pools)


def _replace(
    st: CycleState,
    victims: list[Victim],
    exclude: frozenset[int],
    mover_tiers: Callable[[Victim], Sequence[Sequence[Pool]]],
    weights: Sequence[float],
) -> list[Move] | None:
    """Place each victim in turn away from `exclude`, taking its resources; None if one does not fit
    (the caller rolls back)."""
    out = []
    for v in victims:
        replicas = sum(k for _, k in v.assign)
        p = place(st, mover_tiers(v), Request(v.demand, replicas, None, exclude=exclude), weights)
        if p is None:
            return None
        st.use_all(p.assign, v.demand, 1)
        out.append(Move(v, p))
    return out
