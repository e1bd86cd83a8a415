"""A pool's per-domain counts built at once (Pool._fill, an index's first build) equal the counts
that adding its members one by one gives (Pool.add, what the kept index does as nodes change)."""

from __future__ import annotations

import random

import pytest

from gpuq.core.model import Topology
from gpuq.core.pools import Pool
from gpuq.core.topology import DomainTree


def _tree(rnd: random.Random, levels: tuple[str, ...]) -> tuple[DomainTree, int]:
    paths = []
    for i in range(rnd.randint(1, 60)):
        prefix = tuple(f"{level}-{rnd.randint(0, 3)}" for level in levels[:-1])
        paths.append((*prefix, f"node-{i:03d}"))
    paths.sort()
    return DomainTree(Topology(levels=levels, labels=levels), paths), len(paths)


@pytest.mark.parametrize("levels", [("node",), ("rack", "node"), ("zone", "block", "rack", "node")])
def test_a_pool_built_at_once_counts_what_adding_its_members_counts(levels: tuple[str, ...]) -> None:
    rnd = random.Random(7)
    for _ in range(50):
        tree, n = _tree(rnd, levels)
        width = rnd.randint(1, 9)
        capacity = [rnd.randint(0, 10) for _ in range(n)]
        free = [rnd.randint(-2, 12) for _ in range(n)]  # negative and above width: clamped
        members = sorted(rnd.sample(range(n), rnd.randint(0, n)))
        at_once = Pool(tree, width, n, members, free, capacity, None, "at-once")
        one_by_one = Pool(tree, width, n, [], free, capacity, None, "one-by-one")
        for m in members:
            one_by_one.add(m, free[m], capacity[m])
        assert at_once.size == one_by_one.size == len(members)
        assert at_once.member == one_by_one.member
        assert at_once.hist == one_by_one.hist
        assert at_once.free_sum == one_by_one.free_sum
        assert at_once.cap_sum == one_by_one.cap_sum
