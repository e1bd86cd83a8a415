"""Consolidation on and off: what moving small gangs for starving ones buys and costs.

The Philly trace with whole-node workers and quotas, exactly the scenario of
bench/placement_quality.py (512 GPUs, 16-node racks, Llama 3's failure rate, the same checkpoint,
save and restart costs), run by gpuq with consolidation off, after 300 s of waiting, and with the
default (after an hour), each with two failure seeds: the failure seed alone moves JCT and the
communication cost, so one seed cannot tell a real effect from luck.

    .venv/bin/python bench/consolidation.py            # 6 simulations, about 10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuq import logs
from gpuq.core.config import Consolidation
from gpuq.sim.cluster import ClusterShape
from gpuq.sim.report import SERIES_KEYS
from placement_quality import PHILLY, Case  # bench/ is the script's directory: on sys.path

HOUR = 3600.0
VARIANTS: dict[str, Consolidation] = {
    "off": Consolidation(enabled=False),
    "after 300 s": Consolidation(min_wait_seconds=300.0),
    "after 1 h (default)": Consolidation(),
}


def run(trace: Path, variant: str, seed: int, limit: int | None) -> tuple[str, int, dict[str, Any]]:
    logs.configure("WARNING")
    case = Case("philly", trace, ClusterShape(racks_per_block=4, nodes_per_rack=16), "whole", "quotas", limit)
    scenario = case.scenario()
    scenario.options = replace(scenario.options, seed=seed)
    scenario.config = dataclasses.replace(scenario.config, consolidation=VARIANTS[variant])
    result = scenario.run("gpuq")
    for key in SERIES_KEYS:
        result.pop(key, None)
    return variant, seed, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--philly", type=Path, default=PHILLY)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--limit", type=int, help="only the first N jobs (quick look)")
    args = parser.parse_args()
    console = Console(width=150)
    if not args.philly.exists():
        console.print(f"SKIPPED: trace {args.philly} not found (../shared/traces is not on this machine)")
        return
    console.print(f"reproduce: .venv/bin/python bench/consolidation.py {shlex.join(sys.argv[1:])}".rstrip())
    started = time.monotonic()
    jobs = [(v, s) for v in VARIANTS for s in range(args.seeds)]
    results: dict[tuple[str, int], dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run, args.philly, v, s, args.limit) for v, s in jobs]
        for done, fut in enumerate(futures, start=1):
            variant, seed, result = fut.result()
            results[(variant, seed)] = result
            console.print(f"[{done}/{len(jobs)}] {variant}, seed {seed}: {time.monotonic() - started:.0f} s")
    table = Table(title="gpuq on the Philly trace (whole-node workers, quotas): consolidation variants")
    for col in (
        "variant",
        "seed",
        "avg JCT (h)",
        "avg queueing (h)",
        "makespan (d)",
        "fragmentation %",
        "comm cost / pair",
        "preemptions",
        "restart/ckpt GPU-h",
    ):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for (variant, seed), r in results.items():
        table.add_row(
            variant,
            str(seed),
            f"{r['jct']['avg'] / HOUR:.2f}",
            f"{r['queueing_delay']['avg'] / HOUR:.2f}",
            f"{r['makespan'] / 86400:.2f}",
            f"{100 * r['fragmentation']:.2f}",
            f"{r['comm_multi_gpu']['cost_per_pair']:.3f}",
            str(r["preemptions"]),
            f"{r['overhead_gpu_hours']:.0f}",
        )
    console.print(table)
    console.print(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
