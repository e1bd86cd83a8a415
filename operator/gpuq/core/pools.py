"""Per-domain free-GPU aggregates over a set of nodes (a pool), so a gang search skips whole domains.

For every domain a pool keeps a histogram of its member nodes' free-GPU counts and their sum. From the
histogram, the number of workers of g GPUs a domain could hold is sum(count[v] * (v // g)): exact in
GPUs, an upper bound once CPU, memory or exclusions also bind (placement then checks nodes exactly).
Moving one node's free count costs O(depth).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from gpuq.core.topology import DomainTree


class Pool:
    __slots__ = ("cap_sum", "free_sum", "hist", "member", "model", "name", "size", "tree", "width")

    def __init__(
        self,
        tree: DomainTree,
        width: int,
        n_nodes: int,
        members: Iterable[int],
        free_gpu: Sequence[int],
        capacity: Sequence[int],
        model: str | None,
        name: str,
    ) -> None:
        self.tree = tree
        self.width = width
        self.model = model  # the single GPU model of its nodes, or None for a mixed pool
        self.name = name
        self.member = bytearray(n_nodes)
        # int64 arrays: copying a pool for a cycle is a memcpy.
        self.hist = array("q", bytes(8 * tree.n_domains * width))
        self.free_sum = array("q", bytes(8 * tree.n_domains))
        self.cap_sum = array("q", bytes(8 * tree.n_domains))  # GPU capacity of member nodes per domain
        self.size = 0
        self._fill(members, free_gpu, capacity)

    def _fill(self, members: Iterable[int], free_gpu: Sequence[int], capacity: Sequence[int]) -> None:
        """add() for every member at once: counted in its deepest domain, then each domain's counts
        added to its parent's, deepest first (a node's 3 counts once, not once per ancestor: an
        index built at 10,000 nodes)."""
        tree, w, h, fs, cs = self.tree, self.width, self.hist, self.free_sum, self.cap_sum
        ancestors, member = tree.ancestors, self.member
        for n in members:
            member[n] = 1
            self.size += 1
            v = self._clamp(free_gpu[n])
            leaf = ancestors[n][-1]
            h[leaf * w + v] += 1
            fs[leaf] += v
            cs[leaf] += capacity[n]
        for depth in range(len(tree.by_depth) - 1, 0, -1):
            for dom in tree.by_depth[depth]:
                parent = tree.parent[dom]
                base, up = dom * w, parent * w
                for v in range(w):
                    h[up + v] += h[base + v]
                fs[parent] += fs[dom]
                cs[parent] += cs[dom]

    def copy(self) -> Pool:
        """A copy whose counts can change independently (membership is shared: it never changes)."""
        clone = Pool.__new__(Pool)
        clone.tree, clone.width, clone.model, clone.name = self.tree, self.width, self.model, self.name
        clone.member, clone.size, clone.cap_sum = self.member, self.size, self.cap_sum
        clone.hist = self.hist[:]
        clone.free_sum = self.free_sum[:]
        return clone

    def member_list(self) -> list[int]:
        return [n for n, m in enumerate(self.member) if m]

    def _clamp(self, v: int) -> int:
        return 0 if v < 0 else (v if v < self.width else self.width - 1)

    def add(self, n: int, free: int, cap: int) -> None:
        self._count(n, free, cap, 1)

    def remove(self, n: int, free: int, cap: int) -> None:
        self._count(n, free, cap, -1)

    def _count(self, n: int, free: int, cap: int, sign: int) -> None:
        self.member[n] = 1 if sign > 0 else 0
        self.size += sign
        v = self._clamp(free)
        w, h, fs, cs = self.width, self.hist, self.free_sum, self.cap_sum
        for a in self.tree.ancestors[n]:
            h[a * w + v] += sign
            fs[a] += sign * v
            cs[a] += sign * cap

    def move(self, n: int, old: int, new: int) -> None:
        """Node n's free GPUs changed from old to new (caller checked membership)."""
        w = self.width  # _clamp, inline: this runs for every resource change of a cycle
        vo = 0 if old < 0 else (old if old < w else w - 1)
        vn = 0 if new < 0 else (new if new < w else w - 1)
        if vo == vn:
            return
        h, fs = self.hist, self.free_sum
        for a in self.tree.ancestors[n]:
            base = a * w
            h[base + vo] -= 1
            h[base + vn] += 1
            fs[a] += vn - vo

    def slots(self, dom: int, gpus: int, cap: int) -> int:
        """Upper bound of workers of `gpus` GPUs the domain's members can hold (at most `cap`)."""
        if gpus <= 0:
            return cap if self.hist_nodes(dom) else 0
        base = dom * self.width
        h = self.hist
        total = 0
        for v in range(gpus, self.width):
            c = h[base + v]
            if c:
                total += c * (v // gpus)
        return total

    def hist_nodes(self, dom: int) -> int:
        base = dom * self.width
        return sum(self.hist[base : base + self.width])

    def max_free(self, dom: int) -> int:
        """Largest free-GPU count of a member node in the domain (-1 if it has no member)."""
        base = dom * self.width
        h = self.hist
        for v in range(self.width - 1, -1, -1):
            if h[base + v]:
                return v
        return -1
