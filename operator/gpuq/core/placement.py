"""Gang placement: all workers of a job or none, in the smallest topology domain that holds them.

Search (see docs/scheduling.md, "Placement"):
- Target depths: Preferred (or no level) tries one node, then one rack, one block, one zone, the cluster;
  Required tries the same but stops at the requested level, so every rank shares that domain.
- At a target depth the search walks down from the cluster, at each level visiting the fullest child
  (fewest free GPUs) that could still hold the gang first, and backtracks if a subtree turns out short:
  gangs fill partly used domains and leave whole racks/blocks free for big gangs.
- Inside the chosen domain, `fill` spreads the workers over the fewest children: if one child holds all
  remaining workers, take the best fit (fewest free slots that suffice); otherwise take the largest child
  and repeat. Nodes are checked exactly (GPU, CPU, memory, extended resources); domains by pool
  aggregates, which are exact for GPUs and an upper bound otherwise.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from gpuq.core.fit import Demand, slots_on
from gpuq.core.pools import Pool
from gpuq.core.state import CycleState
from gpuq.core.topology import comm_cost

Assign = list[tuple[int, int]]  # (node, workers there)


@dataclass(frozen=True, slots=True)
class Request:
    demand: Demand
    replicas: int
    required_depth: int | None  # Required topology: ranks must share a domain at this depth
    within: int = 0  # search only inside this domain (0 = the whole cluster)
    exclude: frozenset[int] = frozenset()  # nodes this job must avoid (failover)


@dataclass(frozen=True, slots=True)
class Placement:
    nodes: tuple[int, ...]  # node of each rank, ranks in topology order
    assign: tuple[tuple[int, int], ...]  # (node, workers)
    depth: int  # depth of the smallest domain holding every rank (node depth: one node)
    cost: float
    pool: Pool


class _Search:
    __slots__ = ("d", "exclude", "fc", "fg", "fm", "fx", "g", "pool", "tree")

    def __init__(self, st: CycleState, pool: Pool, d: Demand, exclude: frozenset[int]) -> None:
        self.pool = pool
        self.tree = st.tree
        self.d = d
        self.g = d.gpus
        self.exclude = exclude
        self.fg, self.fc, self.fm, self.fx = st.free_gpu, st.free_cpu, st.free_mem, st.free_extra

    def exact(self, n: int, cap: int) -> int:
        if not self.pool.member[n] or n in self.exclude:
            return 0
        s = slots_on(self.fg[n], self.fc[n], self.fm[n], self.fx.get(n), self.d)
        return s if s < cap else cap

    def upper(self, dom: int, cap: int) -> int:
        return self.pool.slots(dom, self.g, cap)

    def can_host(self, dom: int, t: int, R: int) -> bool:
        if t == self.tree.node_depth:
            return self.pool.max_free(dom) >= R * self.g
        return self.upper(dom, R) >= R

    def fill(self, dom: int, R: int) -> Assign:
        """Up to R workers inside dom on the fewest children (may return fewer if bounds were loose)."""
        tree = self.tree
        if tree.depth[dom] == tree.node_depth - 1:
            leaves = [(s, n) for n in tree.child_nodes[dom] if (s := self.exact(n, R)) > 0]
            return self._split(leaves, R, True)
        kids = [(u, c) for c in tree.child_domains[dom] if (u := self.upper(c, R)) > 0]
        return self._split(kids, R, False)

    def _split(self, cands: list[tuple[int, int]], R: int, leaf: bool) -> Assign:
        out: Assign = []
        remaining = R
        fullness = self.fg if leaf else self.pool.free_sum
        while remaining > 0 and cands:
            best: tuple[int, int] | None = None
            best_key: tuple[int, int, int] | None = None
            for item in cands:
                s, x = item
                if s >= remaining:
                    key = (s, fullness[x], x)
                    if best_key is None or key < best_key:
                        best, best_key = item, key
            if best is None:
                best = max(cands, key=lambda it: (it[0], -it[1]))
            cands.remove(best)
            s, x = best
            want = min(s, remaining)
            got = [(x, want)] if leaf else self.fill(x, want)
            out.extend(got)
            remaining -= sum(k for _, k in got)
        return out

    def find(self, dom: int, t: int, R: int) -> Assign | None:
        """Workers placed inside one domain at depth t below dom, or None."""
        tree = self.tree
        depth = tree.depth[dom]
        if depth == t:
            if self.upper(dom, R) < R:
                return None
            got = self.fill(dom, R)
            return got if sum(k for _, k in got) == R else None
        if depth == tree.node_depth - 1:  # t is the node depth: best fit = fewest free GPUs that suffice
            fg, need = self.fg, R * self.g
            for _, n in sorted((fg[n], n) for n in tree.child_nodes[dom] if fg[n] >= need):
                if self.exact(n, R) >= R:
                    return [(n, R)]
            return None
        fs = self.pool.free_sum
        # Fullest child first (sorted is stable: ties keep canonical order); check bounds lazily.
        for c in sorted(tree.child_domains[dom], key=fs.__getitem__):
            if self.can_host(c, t, R):
                found = self.find(c, t, R)
                if found is not None:
                    return found
        return None


def place_in_pool(st: CycleState, pool: Pool, req: Request, weights: Sequence[float]) -> Placement | None:
    """The best placement of the request in one pool, or None. Does not change the state."""
    if pool.size == 0 or req.demand.gpus * req.replicas > st.free_gpus_bound:
        return None  # (the second: fewer GPUs free in the whole cluster than the gang needs)
    tree = st.tree
    memo_key: Hashable = (pool.name, id(pool), req.demand, req.required_depth, req.within, req.exclude)
    seen = st.fail_memo.get(memo_key)
    if seen is not None and seen[0] == st.gives and req.replicas >= seen[1]:
        return None
    search = _Search(st, pool, req.demand, req.exclude)
    L = tree.node_depth
    start = tree.depth[req.within]
    stop = start if req.required_depth is None else max(req.required_depth, start)
    R = req.replicas
    for t in range(L, stop - 1, -1):
        if not search.can_host(req.within, t, R):
            continue
        got = search.find(req.within, t, R)
        if got is not None:
            return _placement(st, pool, got, weights)
    st.fail_memo[memo_key] = (st.gives, R)
    return None


def _placement(st: CycleState, pool: Pool, got: Assign, weights: Sequence[float]) -> Placement:
    assign = tuple(sorted(got))
    nodes = tuple(n for n, k in assign for _ in range(k))
    _dom, depth = st.tree.common_domain([n for n, _ in assign])
    paths = st.ix.paths
    return Placement(nodes, assign, depth, comm_cost([paths[n] for n in nodes], weights), pool)


def better(a: Placement, b: Placement) -> bool:
    """Is a better than b: more local, then cheaper to communicate, then fewer nodes."""
    return (-a.depth, a.cost, len(a.assign)) < (-b.depth, b.cost, len(b.assign))


def place(
    st: CycleState, tiers: Sequence[Sequence[Pool]], req: Request, weights: Sequence[float]
) -> Placement | None:
    """First tier with any placement; inside a tier the best over its alternative pools."""
    for tier in tiers:
        best: Placement | None = None
        for pool in tier:
            p = place_in_pool(st, pool, req, weights)
            if p is not None and (best is None or better(p, best)):
                best = p
        if best is not None:
            return best
    return None
