"""Topology domains (cluster > zone > block > rack > node) and the communication cost of a placement.

Domains are numbered in canonical order (sorted by path), so every walk over them is deterministic.
Depth 0 is the whole cluster; depth d (1 <= d < L) is the domain of `levels[d - 1]`; nodes sit at depth
L = len(levels). A domain is identified by its path prefix, so rack "r1" of block "b1" and rack "r1" of
block "b2" are different domains.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from gpuq.core.config import ScoringWeights
from gpuq.core.model import Node, Topology

CLUSTER = "cluster"
WHOLE_CLUSTER = "\0cluster"  # a scope key no zone name can equal (zones are keyed by name)


def zone_of(node: Node) -> str | None:
    """The node's outermost topology domain, when the topology has more than the node level."""
    return node.path[0] if len(node.path) > 1 else None


def scope_sizes(nodes: Iterable[Node]) -> dict[str, int]:
    """Nodes in the whole cluster (WHOLE_CLUSTER) and in each zone."""
    sizes: dict[str, int] = {WHOLE_CLUSTER: 0}
    for nd in nodes:
        sizes[WHOLE_CLUSTER] += 1
        zone = zone_of(nd)
        if zone is not None:
            sizes[zone] = sizes.get(zone, 0) + 1
    return sizes


class DomainTree:
    """The domain hierarchy over nodes given in canonical order (sorted by path, then name)."""

    __slots__ = (
        "ancestors",
        "by_depth",
        "child_domains",
        "child_nodes",
        "depth",
        "levels",
        "n_domains",
        "names",
        "node_depth",
        "parent",
        "prefixes",
    )

    def __init__(self, topology: Topology, paths: Sequence[tuple[str, ...]]) -> None:
        self.levels = topology.levels
        L = len(topology.levels)
        self.node_depth = L
        self.prefixes: list[tuple[str, ...]] = [()]
        self.depth: list[int] = [0]
        self.parent: list[int] = [-1]
        self.child_domains: list[list[int]] = [[]]
        self.child_nodes: list[list[int]] = [[]]
        self.ancestors: list[tuple[int, ...]] = []
        index: dict[tuple[str, ...], int] = {(): 0}
        for n, path in enumerate(paths):
            chain = [0]
            for d in range(1, L):
                prefix = path[:d]
                dom = index.get(prefix)
                if dom is None:
                    dom = len(self.prefixes)
                    index[prefix] = dom
                    self.prefixes.append(prefix)
                    self.depth.append(d)
                    self.parent.append(chain[-1])
                    self.child_domains.append([])
                    self.child_nodes.append([])
                    self.child_domains[chain[-1]].append(dom)
                chain.append(dom)
            self.child_nodes[chain[-1]].append(n)
            self.ancestors.append(tuple(chain))
        self.n_domains = len(self.prefixes)
        self.names = [CLUSTER if not p else "/".join(p) for p in self.prefixes]
        self.by_depth: list[list[int]] = [[] for _ in range(L)]
        for dom in range(self.n_domains):
            self.by_depth[self.depth[dom]].append(dom)

    def level_name(self, depth: int) -> str:
        """Human name of a depth: 'cluster', a topology level, or the node level."""
        return CLUSTER if depth == 0 else self.levels[depth - 1]

    def depth_of_level(self, level: str) -> int | None:
        """Depth of a topology level name (the node level is the deepest); None if unknown."""
        if level == CLUSTER:
            return 0
        if level in self.levels:
            return self.levels.index(level) + 1
        return None

    def common_domain(self, nodes: Sequence[int]) -> tuple[int, int]:
        """(domain, depth) of the smallest domain holding all nodes; depth L means a single node."""
        if not nodes:
            return 0, 0
        first = nodes[0]
        if all(n == first for n in nodes):
            return self.ancestors[first][-1], self.node_depth
        chains = [self.ancestors[n] for n in nodes]
        best = 0
        for d in range(len(chains[0])):
            dom = chains[0][d]
            if all(c[d] == dom for c in chains):
                best = dom
            else:
                break
        return best, self.depth[best]

    def contains(self, domain: int, node: int) -> bool:
        d = self.depth[domain]
        return self.ancestors[node][d] == domain


def level_weights(topology: Topology, weights: ScoringWeights) -> tuple[float, ...]:
    """Weight of a rank pair that first splits at each level (index = level position, outermost first).

    Level names that are fields of ScoringWeights use them; other (custom) levels get 4**k, k counted
    from the node level, which keeps the default ordering node < rack < block < zone.
    """
    L = len(topology.levels)
    out = []
    for i, name in enumerate(topology.levels):
        default = float(4 ** (L - 1 - i))
        out.append(float(getattr(weights, name, default)) if name in ScoringWeights.__slots__ else default)
    return tuple(out)


def comm_cost(paths: Sequence[tuple[str, ...]], weights: Sequence[float]) -> float:
    """Communication cost of a placement given each rank's node path.

    Sum over rank pairs of the weight of the outermost level at which the two ranks differ; two ranks
    on one node cost 0. Computed from per-prefix counts in O(ranks x levels), not over pairs.
    """
    L = len(weights)
    if len(paths) < 2:
        return 0.0
    # same[d] = number of pairs sharing the path prefix of length d (d=0: all pairs).
    same = []
    for d in range(L + 1):
        counts = Counter(p[:d] for p in paths)
        same.append(sum(c * (c - 1) // 2 for c in counts.values()))
    # Pairs that agree on the first d levels but differ at level d split at level d.
    return float(sum(weights[d] * (same[d] - same[d + 1]) for d in range(L)))
