"""How placement changes a job: communication spread and the resulting slowdown.

A placement is measured at GPU granularity, so `--worker-gpus whole` and `--worker-gpus 1` are
comparable: two GPUs on one node talk over NVLink/PCIe; any pair on different nodes crosses the
network, and further levels (rack, block, zone) cross more switches.

Slowdown defaults (multiplicative, per level the job's ranks span; see docs/simulator.md):
- crossing nodes  x1.20: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN
  Training Workloads" (Philly, USENIX ATC'19, sec. 3.1.2) report lower GPU utilization the more
  servers a job spans; Gu et al., Tiresias (NSDI'19, sec. 2.3) and Xiao et al., Gandiva (OSDI'18)
  measure consolidation-sensitive models (VGG, AlexNet-like) markedly slower when scattered
  across servers and ResNet/Inception-like models close to 1x. 1.2 is a middle of that range.
- crossing racks  x1.10, blocks x1.10: oversubscribed ToR/spine uplinks add contention (no single
  published figure; conservative).
- crossing zones  x1.50: inter-zone links are an order of magnitude thinner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuq.core.config import ScoringWeights


@dataclass(frozen=True, slots=True)
class SpeedModel:
    """Slowdown per topology level crossed, outermost first (zone, block, rack, node)."""

    zone: float = 1.5
    block: float = 1.1
    rack: float = 1.1
    node: float = 1.2
    enabled: bool = True

    def factors(self) -> tuple[float, float, float, float]:
        return (self.zone, self.block, self.rack, self.node)

    def slowdown(self, crossed: Sequence[bool]) -> float:
        """`crossed[i]`: the job's GPUs span more than one domain at level i (outermost first)."""
        if not self.enabled:
            return 1.0
        result = 1.0
        for factor, crosses in zip(self.factors(), crossed, strict=True):
            if crosses:
                result *= factor
        return result


@dataclass(frozen=True, slots=True)
class Spread:
    """GPU pairs of one placement and how many of them cross each level (outermost first)."""

    gpus: int
    pairs: int
    crossing: tuple[int, ...]  # pairs whose two GPUs are in different domains at each level

    @property
    def crossed(self) -> tuple[bool, ...]:
        return tuple(count > 0 for count in self.crossing)

    def fraction(self, level: int) -> float:
        return self.crossing[level] / self.pairs if self.pairs else 0.0

    def cost_per_pair(self, weights: ScoringWeights) -> float:
        """Mean communication cost of a GPU pair with the core's weights: a pair split at node
        level costs weights.node, at rack level weights.rack, and so on (same scale as the core)."""
        if not self.pairs:
            return 0.0
        by_level = (weights.zone, weights.block, weights.rack, weights.node)
        cost, outer = 0.0, 0
        for weight, crossing in zip(by_level, self.crossing, strict=True):
            cost += weight * (crossing - outer)  # pairs split exactly at this level
            outer = crossing
        return cost / self.pairs


def _pairs(n: int) -> int:
    return n * (n - 1) // 2


def spread(placement: Sequence[str], gpus_per_worker: int, paths: Mapping[str, tuple[str, ...]]) -> Spread:
    """Pairs crossing level i = all pairs - pairs inside one domain of level i."""
    gpus = len(placement) * gpus_per_worker
    total = _pairs(gpus)
    depth = len(next(iter(paths.values()))) if paths else 0
    if len(set(placement)) <= 1:  # one node (most jobs): nothing crosses
        return Spread(gpus, total, (0,) * depth)
    per_node = Counter(placement)
    crossing: list[int] = []
    for level in range(depth):
        per_domain: Counter[tuple[str, ...]] = Counter()
        for node, ranks in per_node.items():
            per_domain[paths[node][: level + 1]] += ranks * gpus_per_worker  # prefix: names may repeat
        crossing.append(total - sum(_pairs(n) for n in per_domain.values()))
    return Spread(gpus, total, tuple(crossing))
