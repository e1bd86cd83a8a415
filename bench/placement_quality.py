"""Placement quality: gpuq.core against the baselines on the same trace and cluster, in one run.

For each workload (the Philly trace on 512 GPUs in 8-GPU nodes and 16-node racks, and the synthetic
workload shipped in tests/sim/fixtures) and each worker shape (`whole`, `1`), every policy runs the
same scenario; the table shows each metric and gpuq's ratio to each baseline (< 1 = gpuq lower).
It ends with the verdict on the article's claim: topology-aware scheduling cuts inter-node
communication of large training jobs by up to 30% (against kube-scheduler's LeastRequested spreading).

    .venv/bin/python bench/placement_quality.py                 # everything (Philly takes a while)
    .venv/bin/python bench/placement_quality.py --skip-philly   # the shipped synthetic workload only
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuq.sim.cluster import ClusterShape
from gpuq.sim.engine import SimOptions
from gpuq.sim.policy import POLICIES
from gpuq.sim.report import METRICS, fmt, ratio
from gpuq.sim.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parent.parent
PHILLY = ROOT.parent / "shared" / "traces" / "philly-2017-09-10.csv"
SYNTHETIC = ROOT / "tests" / "sim" / "fixtures" / "synthetic_mixed.csv"
BASELINES = [p for p in POLICIES if p != "gpuq"]
CLAIM = 0.30  # "cuts inter-node communication of large training jobs by up to 30%"


def workloads(args: argparse.Namespace, console: Console) -> list[tuple[str, Path, ClusterShape]]:
    chosen = [("synthetic", SYNTHETIC, ClusterShape(racks_per_block=2, nodes_per_rack=16, gpus_per_node=8))]
    if args.skip_philly:
        console.print("Philly: skipped (--skip-philly)")
    elif not args.philly.is_file():
        console.print(
            f"[yellow]Philly: SKIPPED, trace not found at {args.philly} (pass --philly PATH)[/yellow]"
        )
    else:
        chosen.insert(
            0, ("philly", args.philly, ClusterShape(racks_per_block=4, nodes_per_rack=16, gpus_per_node=8))
        )
    return chosen


def comparison_table(title: str, results: dict[str, dict[str, Any]]) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    for policy in POLICIES:
        table.add_column(policy, justify="right")
    for base in BASELINES:
        table.add_column(f"gpuq/{base}", justify="right")
    for metric in METRICS:
        values = {p: metric.get(results[p]) for p in POLICIES}
        ratios = [ratio(values["gpuq"], values[b]) for b in BASELINES]
        table.add_row(
            metric.label,
            *(fmt(metric, values[p]) for p in POLICIES),
            *("n/a" if math.isnan(r) else f"{r:.2f}" for r in ratios),
        )
    table.add_row("simulated in (s)", *(f"{results[p]['sim']['wall_seconds']:.1f}" for p in POLICIES), "", "")
    return table


def verdicts(results: dict[str, dict[str, Any]]) -> list[str]:
    g, k, b = (results[p] for p in ("gpuq", "kube-default", "gang-binpack"))
    lines = []
    large_k, large_g = k["comm_large"]["cross_node"], g["comm_large"]["cross_node"]
    if large_k > 0:
        cut = 1 - large_g / large_k
        holds = "HOLDS" if cut >= CLAIM else "does NOT hold"
        lines.append(
            f"claim (>=30% less inter-node communication of large jobs vs kube-default): {holds} here: "
            f"cross-node GPU pairs {100 * large_k:.1f}% -> {100 * large_g:.1f}% ({100 * cut:.0f}% less)"
        )
    else:
        lines.append("claim: not measurable here (kube-default placed no large job across nodes)")
    rack_k, rack_g = k["comm_large"]["cross_rack"], g["comm_large"]["cross_rack"]
    if rack_k > 0:
        lines.append(
            f"large jobs, GPU pairs across racks: {100 * rack_k:.1f}% -> {100 * rack_g:.1f}% "
            f"({100 * (1 - rack_g / rack_k):.0f}% less)"
        )
    cost_k, cost_g = k["comm_multi_gpu"]["cost_per_pair"], g["comm_multi_gpu"]["cost_per_pair"]
    if cost_k > 0:
        lines.append(
            f"target comm cost >=30% below kube-default: {'met' if cost_g <= 0.7 * cost_k else 'MISSED'} "
            f"({100 * (1 - cost_g / cost_k):.0f}% below)"
        )
    for key, label in (("jct", "avg JCT"), ("queueing_delay", "avg queueing delay")):
        ours, theirs = g[key]["avg"], min(k[key]["avg"], b[key]["avg"])
        lines.append(
            f"target {label} below both baselines: {'met' if ours < theirs else 'MISSED'} "
            f"(gpuq {ours / 3600:.2f} h, best baseline {theirs / 3600:.2f} h)"
        )
    met = "met" if g["fragmentation"] < b["fragmentation"] else "MISSED"
    lines.append(
        f"target fragmentation below gang-binpack: {met} "
        f"({100 * g['fragmentation']:.2f}% vs {100 * b['fragmentation']:.2f}% of GPUs)"
    )
    return lines


def run_scenario(scenario: Scenario, console: Console) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for policy in POLICIES:
        started = time.perf_counter()
        with console.status(f"  {policy}: simulating {len(scenario.jobs)} jobs"):
            results[policy] = scenario.run(policy)
        r = results[policy]
        console.print(
            f"  {policy}: {time.perf_counter() - started:.1f} s ({r['sim']['cycles']} cycles, "
            f"{r['sim']['schedule_seconds']:.1f} s in schedule)",
            highlight=False,
        )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--philly", type=Path, default=PHILLY, help="Philly trace CSV")
    parser.add_argument("--skip-philly", action="store_true")
    parser.add_argument("--worker-gpus", choices=("both", "whole", "1"), default="both")
    parser.add_argument("--limit", type=int, help="only the first N jobs of each trace (quick look)")
    parser.add_argument("--json", type=Path, help="also write all results as JSON")
    parser.add_argument("--plots", type=Path, metavar="DIR", help="write PNG plots per workload and shape")
    args = parser.parse_args()
    console = Console(soft_wrap=True, width=150)
    command = (
        "cd "
        + shlex.quote(str(ROOT))
        + " && .venv/bin/python bench/placement_quality.py "
        + shlex.join(sys.argv[1:])
    )
    console.print(f"reproduce: {command}", highlight=False)
    shapes = ["whole", "1"] if args.worker_gpus == "both" else [args.worker_gpus]
    everything: dict[str, Any] = {}
    for name, trace, shape in workloads(args, console):
        for worker_gpus in shapes:
            scenario = load_scenario(
                trace, shape=shape, options=SimOptions(worker_gpus=worker_gpus), limit=args.limit
            )
            info = scenario.describe()
            title = (
                f"{name}: {info['jobs']} jobs, {info['gpus']} GPUs ({shape.gpus_per_node}-GPU nodes, "
                f"{shape.nodes_per_rack}-node racks), offered load {info['offered_load']:.2f}, "
                f"workers {worker_gpus}"
            )
            console.print(f"\n[bold]{title}[/bold]")
            results = run_scenario(scenario, console)
            console.print(comparison_table(title, results))
            for line in verdicts(results):
                console.print("  " + line, highlight=False)
            if args.plots:
                from gpuq.sim.plots import write_plots

                for path in write_plots(list(results.values()), args.plots / f"{name}-{worker_gpus}", title):
                    console.print(f"  wrote {path}", highlight=False)
            everything[f"{name}/{worker_gpus}"] = {
                "scenario": info,
                "results": {
                    p: {k: v for k, v in r.items() if k not in ("timeline", "jct_samples")}
                    for p, r in results.items()
                },
                "verdicts": verdicts(results),
            }
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2, default=lambda v: None) + "\n")
        console.print(f"wrote {args.json}")
    console.print(f"\nreproduce: {command}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
