"""A small, seeded synthetic workload (the one shipped in tests/sim/fixtures/synthetic_mixed.csv).

Shaped like the traces the studies describe: mostly 1-GPU jobs, a tail of multi-node gangs, heavy-
tailed run times, Poisson arrivals, several teams with different priorities. Deterministic for a
given seed, so the shipped CSV can always be regenerated (`python -m gpuq.sim.synthetic OUT.csv`).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from gpuq.sim.readers import write_canonical
from gpuq.sim.trace import TraceJob

# (GPUs, probability): Philly-like, with a heavier tail of multi-node gangs.
SIZE_MIX = ((1, 0.55), (2, 0.1), (4, 0.1), (8, 0.12), (16, 0.07), (32, 0.04), (64, 0.02))
TEAMS = (("team-a", 0, 0.4), ("team-b", 0, 0.3), ("team-c", 10, 0.2), ("research", 0, 0.1))


def generate(jobs: int = 600, cluster_gpus: int = 256, load: float = 0.9, seed: int = 7) -> list[TraceJob]:
    rng = random.Random(seed)
    sizes, size_weights = zip(*SIZE_MIX, strict=True)
    teams = [(name, prio) for name, prio, _ in TEAMS]
    team_weights = [share for _, _, share in TEAMS]
    drawn: list[tuple[int, float, tuple[str, int]]] = []
    for _ in range(jobs):
        gpus = rng.choices(sizes, size_weights)[0]
        duration = min(rng.lognormvariate(7.5, 1.3), 14 * 24 * 3600.0)  # median ~30 min, long tail
        drawn.append((gpus, round(duration), rng.choices(teams, team_weights)[0]))
    gpu_seconds = sum(g * d for g, d, _ in drawn)
    mean_gap = gpu_seconds / (cluster_gpus * load) / jobs  # arrivals that offer `load`
    t = 0.0
    out: list[TraceJob] = []
    for index, (gpus, duration, (team, prio)) in enumerate(drawn):
        out.append(TraceJob(f"syn-{index:04d}", round(t), max(duration, 1.0), gpus, team, prio))
        t += rng.expovariate(1.0 / mean_gap)
    return out


if __name__ == "__main__":  # pragma: no cover - regeneration helper
    write_canonical(generate(), Path(sys.argv[1]))
