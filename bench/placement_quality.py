"""Placement quality and job times: gpuq against every baseline on the same trace and cluster, in one run.

For each workload (the Philly trace on 512 GPUs in 8-GPU nodes and 16-node racks, and the synthetic
workload shipped in tests/sim/fixtures), each worker shape (`whole`, `1`) and each queue set-up
(`quotas`: one queue per tenant, nominal share by GPU-time, one cohort; `one-queue`: every job in one
queue, no quotas, so fairness costs nothing and placement is all that differs), every policy runs the
same scenario with the same costs: periodic checkpoints every 30 min, a 60 s save when a victim is
asked to checkpoint, 120 s start-up per restart, node failures at Llama 3's rate (419 interruptions
in 54 days on 16,384 GPUs). Tables print every metric, gpuq's ratio to the best baseline on that
metric, per-tenant figures, then the verdicts on issue 13's targets.

    .venv/bin/python bench/placement_quality.py                  # everything (<= 20 min on 2 cores)
    .venv/bin/python bench/placement_quality.py --skip-philly    # the shipped synthetic workload only
    .venv/bin/python bench/placement_quality.py --skip-synthetic --setup quotas --seeds 3
        # the targets' cases, each simulation with three node-failure seeds (the mean is judged)
    .venv/bin/python bench/placement_quality.py --config my-config.yaml ...   # gpuq with other rules
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuq import logs
from gpuq.core.model import Queue
from gpuq.sim.cluster import ClusterShape
from gpuq.sim.engine import SimOptions
from gpuq.sim.policy import BASELINES, POLICIES
from gpuq.sim.report import HOUR, METRICS, SERIES_KEYS, Metric, fmt, ratio
from gpuq.sim.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parent.parent
PHILLY = ROOT.parent / "shared" / "traces" / "philly-2017-09-10.csv"
SYNTHETIC = ROOT / "tests" / "sim" / "fixtures" / "synthetic_mixed.csv"
# Llama 3 (Meta, 2024): 419 unexpected interruptions in 54 days of training on 16,384 GPUs.
LLAMA3_GPU_HOURS_PER_FAILURE = 54 * 24 * 16_384 / 419
SETUPS = ("quotas", "one-queue")
TARGETS = {"jct": 1.0, "queueing_delay": 1.0, "comm": 0.4, "fragmentation": 0.6, "ettr": 0.95}


@dataclass(frozen=True)
class Case:
    workload: str
    trace: Path
    shape: ClusterShape
    worker_gpus: str
    setup: str
    limit: int | None
    seed: int = 0  # of the node failures and kube-default's random tie-breaks
    config: Path | None = None  # scheduler config YAML (gpuq's rules); None: the defaults

    @property
    def title(self) -> str:
        return f"{self.workload}, workers {self.worker_gpus}, {self.setup}"

    def scenario(self) -> Scenario:
        mtbf = LLAMA3_GPU_HOURS_PER_FAILURE / self.shape.gpus_per_node
        options = SimOptions(worker_gpus=self.worker_gpus, mtbf_hours=mtbf, seed=self.seed)
        scenario = load_scenario(
            self.trace, shape=self.shape, options=options, limit=self.limit, config_path=self.config
        )
        if self.setup == "one-queue":
            scenario.queues = (Queue("all", scenario.total_gpus),)
            scenario.jobs = [replace(job, queue="all") for job in scenario.jobs]
        return scenario


def run_case(case: Case, policy: str) -> dict[str, Any]:
    """One simulation (in a worker process); raw series are dropped to keep the result small, and the
    scenario's description rides along so the parent need not read the trace again."""
    logs.configure("WARNING")
    scenario = case.scenario()
    result = scenario.run(policy)
    for key in SERIES_KEYS:
        result.pop(key, None)
    result["scenario"] = scenario.describe()
    return result


def cases(args: argparse.Namespace, console: Console) -> list[Case]:
    workloads: list[tuple[str, Path, ClusterShape]] = []
    if args.skip_philly:
        console.print("Philly: skipped (--skip-philly)")
    elif not args.philly.is_file():
        console.print(
            f"[yellow]Philly: SKIPPED, trace not found at {args.philly} (pass --philly PATH)[/yellow]"
        )
    else:
        workloads.append(("philly", args.philly, ClusterShape(racks_per_block=4, nodes_per_rack=16)))
    if not args.skip_synthetic:
        workloads.append(("synthetic", SYNTHETIC, ClusterShape(racks_per_block=2, nodes_per_rack=16)))
    shapes = ["whole", "1"] if args.worker_gpus == "both" else [args.worker_gpus]
    setups = list(SETUPS) if args.setup == "both" else [args.setup]
    return [
        Case(name, trace, shape, workers, setup, args.limit, config=args.config)
        for name, trace, shape in workloads
        for workers in shapes
        for setup in setups
    ]


def best_baseline(metric: Metric, results: dict[str, dict[str, Any]]) -> tuple[str, float]:
    values = [(metric.get(results[b]), b) for b in BASELINES if not math.isnan(metric.get(results[b]))]
    if not values:
        return "", math.nan
    value, name = min(values) if metric.lower_is_better else max(values)
    return name, value


def comparison_table(title: str, results: dict[str, dict[str, Any]]) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    for policy in POLICIES:
        table.add_column(policy, justify="right")
    table.add_column("gpuq / best baseline", justify="right")
    for metric in METRICS:
        name, best = best_baseline(metric, results)
        r = ratio(metric.get(results["gpuq"]), best)
        table.add_row(
            metric.label,
            *(fmt(metric, metric.get(results[p])) for p in POLICIES),
            "n/a" if math.isnan(r) else f"{r:.2f} ({name})",
        )
    table.add_row("simulated in (s)", *(f"{results[p]['sim']['wall_seconds']:.0f}" for p in POLICIES), "")
    return table


def tenant_table(title: str, results: dict[str, dict[str, Any]]) -> Table:
    table = Table(title=f"{title}: avg JCT / avg queueing delay per tenant (h)")
    table.add_column("tenant")
    table.add_column("jobs", justify="right")
    for policy in POLICIES:
        table.add_column(policy, justify="right")
    for queue, q in results["gpuq"]["per_queue"].items():
        cells = []
        for policy in POLICIES:
            mine = results[policy]["per_queue"].get(queue)
            cells.append(
                "-"
                if mine is None
                else f"{mine['jct']['avg'] / HOUR:.1f} / {mine['queueing_delay']['avg'] / HOUR:.1f}"
            )
        table.add_row(queue, str(q["jobs"]), *cells)
    return table


def target_ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The figures issue 13's targets judge (TARGETS), from one set of results."""
    g = results["gpuq"]
    out = {
        key: ratio(g[key]["avg"], min(results[b][key]["avg"] for b in BASELINES))
        for key in ("jct", "queueing_delay")
    }
    out["comm"] = ratio(
        g["comm_multi_gpu"]["cost_per_pair"], results["kube-default"]["comm_multi_gpu"]["cost_per_pair"]
    )
    out["fragmentation"] = ratio(g["fragmentation"], results["gang-binpack"]["fragmentation"])
    out["ettr"] = g["ettr"]
    return out


def mean_result(runs: list[Any]) -> Any:
    """The per-metric mean of the same policy's results over failure seeds (values every run shares,
    such as counts of jobs and names, are kept as they are)."""
    first = runs[0]
    if isinstance(first, dict):
        return {k: mean_result([r[k] for r in runs]) for k in first if all(k in r for r in runs)}
    if all(v == first for v in runs) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in runs
    ):
        return first
    return sum(runs) / len(runs)


def seed_spread(per_seed: list[dict[str, dict[str, Any]]]) -> str:
    """Each target figure per failure seed: how much of a difference is luck."""
    figures = [target_ratios(results) for results in per_seed]
    return (
        "per failure seed "
        + ", ".join(str(s) for s in range(len(per_seed)))
        + ": "
        + "; ".join(f"{key} " + " / ".join(f"{f[key]:.2f}" for f in figures) for key in TARGETS)
    )


def verdicts(results: dict[str, dict[str, Any]]) -> list[str]:
    g = results["gpuq"]
    figures = target_ratios(results)
    lines = []
    for key, label in (("jct", "avg JCT"), ("queueing_delay", "avg queueing delay")):
        name, theirs = min((results[b][key]["avg"], b) for b in BASELINES)[::-1]
        r = figures[key]
        lines.append(
            f"{label} gpuq / best baseline ({name}) = {r:.3f}: "
            f"{'met' if r < TARGETS[key] else 'MISSED'} (target < {TARGETS[key]}; "
            f"gpuq {g[key]['avg'] / HOUR:.2f} h, {name} {theirs / HOUR:.2f} h)"
        )
    r = figures["comm"]
    lines.append(
        f"comm cost per pair gpuq / kube-default = {r:.2f}: {_met(r, TARGETS['comm'])} (target <= 0.4)"
    )
    r = figures["fragmentation"]
    lines.append(
        f"fragmentation gpuq / gang-binpack = {r:.2f}: {_met(r, TARGETS['fragmentation'])} (target <= 0.6)"
    )
    large_k, large_g = results["kube-default"]["comm_large"], g["comm_large"]
    if large_k["cross_node"] > 0:
        cut = 1 - large_g["cross_node"] / large_k["cross_node"]
        lines.append(
            f"article's claim, up to 30% less inter-node communication of large jobs than kube-default: "
            f"GPU pairs across nodes {100 * large_k['cross_node']:.1f}% -> "
            f"{100 * large_g['cross_node']:.1f}% "
            f"({100 * cut:.0f}% less), across racks {100 * large_k['cross_rack']:.1f}% -> "
            f"{100 * large_g['cross_rack']:.1f}%"
        )
    met = "met" if figures["ettr"] >= TARGETS["ettr"] else "MISSED"
    lines.append(f"ETTR gpuq = {figures['ettr']:.3f}: {met} (target >= 0.95)")
    lines.append("Jain fairness: " + ", ".join(f"{p} {results[p]['jain_fairness']:.3f}" for p in POLICIES))
    return lines


def _met(value: float, target: float) -> str:
    return "n/a" if math.isnan(value) else ("met" if value <= target else "MISSED")


def report(case: Case, per_seed: list[dict[str, dict[str, Any]]], console: Console) -> dict[str, Any]:
    """Print one case's tables and verdicts (on the mean over failure seeds, and each seed's target
    figures when there are several); return them for the JSON file."""
    results = {p: mean_result([r[p] for r in per_seed]) for p in POLICIES}
    info = results["gpuq"]["scenario"]
    seeds = f", mean of {len(per_seed)} failure seeds" if len(per_seed) > 1 else ""
    title = (
        f"{case.title}: {info['jobs']} jobs, {info['gpus']} GPUs, {info['queues']} queues, "
        f"offered load {info['offered_load']:.2f}{seeds}"
    )
    console.print()
    console.print(comparison_table(title, results))
    if case.setup == "quotas":
        console.print(tenant_table(title, results))
    lines = verdicts(results) + ([seed_spread(per_seed)] if len(per_seed) > 1 else [])
    for line in lines:
        console.print("  " + line, highlight=False)
    console.print()
    return {"scenario": info, "results": results, "verdicts": lines, "per_seed": per_seed}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--philly", type=Path, default=PHILLY, help="Philly trace CSV")
    parser.add_argument("--skip-philly", action="store_true")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--worker-gpus", choices=("both", "whole", "1"), default="both")
    parser.add_argument("--setup", choices=("both", *SETUPS), default="both")
    parser.add_argument("--limit", type=int, help="only the first N jobs of each trace (quick look)")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run every simulation with this many node-failure seeds; tables and verdicts show the mean",
    )
    parser.add_argument(
        "--config", type=Path, help="scheduler config YAML for every policy (as gpuq-scheduler-config)"
    )
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="simulations in parallel")
    parser.add_argument("--json", type=Path, help="also write all results as JSON")
    args = parser.parse_args()
    console = Console(soft_wrap=True, width=170)
    script = "bench/placement_quality.py"
    command = f"cd {shlex.quote(str(ROOT))} && .venv/bin/python {script} {shlex.join(sys.argv[1:])}"
    console.print(f"reproduce: {command}", highlight=False)
    chosen = cases(args, console)
    started = time.perf_counter()
    seeds = range(max(1, args.seeds))
    done: dict[Case, dict[tuple[int, str], dict[str, Any]]] = {case: {} for case in chosen}
    everything: dict[str, Any] = {}
    total = len(chosen) * len(POLICIES) * len(seeds)
    with ProcessPoolExecutor(max_workers=max(1, args.processes)) as pool:
        futures = {
            pool.submit(run_case, replace(case, seed=seed), policy): (case, seed, policy)
            for seed in seeds
            for case in chosen
            for policy in POLICIES
        }
        for count, future in enumerate(as_completed(futures), start=1):
            case, seed, policy = futures[future]
            result = future.result()
            done[case][seed, policy] = result
            console.print(
                f"  [{count}/{total}] {time.perf_counter() - started:6.0f} s  {case.title}, seed {seed}: "
                f"{policy} ({result['sim']['wall_seconds']:.0f} s)",
                highlight=False,
            )
            if len(done[case]) == len(POLICIES) * len(seeds):  # the case is complete: report it now
                per_seed = [{p: done[case][s, p] for p in POLICIES} for s in seeds]
                everything[case.title] = report(case, per_seed, console)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2, default=lambda v: None) + "\n")
        console.print(f"wrote {args.json}")
    console.print(
        f"\nall {total} simulations in {time.perf_counter() - started:.0f} s on {args.processes} processes"
    )
    console.print(f"reproduce: {command}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
