"""Resource fit: what one worker needs and how many workers a node's free resources can hold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuq.core.model import Resources, WorkerSpec

Extra = tuple[tuple[str, int], ...]
UNBOUNDED = 1 << 30  # slots of a node for a worker that requests nothing


@dataclass(frozen=True, slots=True)
class Demand:
    """Per-worker request as plain ints (extra resources sorted by name)."""

    gpus: int
    cpu: int
    mem: int
    extra: Extra = ()

    @staticmethod
    def of(workers: WorkerSpec) -> Demand:
        extra = tuple(sorted((k, v) for k, v in workers.extra.items() if v))
        return Demand(workers.gpus_per_worker, workers.cpu_millis, workers.memory_bytes, extra)

    def times(self, k: int) -> Demand:
        return Demand(self.gpus * k, self.cpu * k, self.mem * k, tuple((n, v * k) for n, v in self.extra))

    def describe(self) -> str:
        parts = [f"{self.gpus} GPU"]
        if self.cpu:
            parts.append(f"{self.cpu}m CPU")
        if self.mem:
            parts.append(f"{self.mem // (1 << 20)}Mi memory")
        parts.extend(f"{v} {k}" for k, v in self.extra)
        return ", ".join(parts)


def invalid_workers(w: WorkerSpec) -> str | None:
    if w.replicas < 1:
        return f"workers.replicas must be >= 1 (got {w.replicas})"
    if w.gpus_per_worker < 0 or w.cpu_millis < 0 or w.memory_bytes < 0:
        return "worker resource requests must not be negative"
    if any(v < 0 for v in w.extra.values()):
        return "worker extended resource requests must not be negative"
    return None


def extra_of(r: Resources) -> Extra:
    return tuple(sorted((k, v) for k, v in r.extra.items() if v))


def slots_on(
    free_gpu: int, free_cpu: int, free_mem: int, free_extra: Mapping[str, int] | None, d: Demand
) -> int:
    """Workers of demand `d` that fit into the given free resources (0 if any resource is short)."""
    s = UNBOUNDED
    if d.gpus:
        s = free_gpu // d.gpus
    if d.cpu:
        s = min(s, free_cpu // d.cpu)
    if d.mem:
        s = min(s, free_mem // d.mem)
    for name, need in d.extra:
        have = free_extra.get(name, 0) if free_extra else 0
        s = min(s, have // need)
    return s if s > 0 else 0
