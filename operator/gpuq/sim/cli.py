"""`gpuq simulate`: run a trace through gpuq.core and/or the baselines in virtual time."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpuq.config import ConfigError
from gpuq.sim.cluster import ClusterShape, shape_for_gpus
from gpuq.sim.engine import SimOptions, SimulationError
from gpuq.sim.policy import POLICIES
from gpuq.sim.queues import QueueFileError
from gpuq.sim.readers import FORMATS
from gpuq.sim.report import print_results, to_json, write_json
from gpuq.sim.scenario import Scenario, load_scenario
from gpuq.sim.speed import SpeedModel
from gpuq.sim.trace import TraceError

EPILOG = """examples:
  gpuq simulate /path/philly.csv --gpus 512 --policy all --plots out/
  gpuq simulate jobs.csv --racks-per-block 2 --nodes-per-rack 8 --queues queues.yaml --json -
  gpuq simulate pods.csv --nodes-file nodes.csv --worker-gpus whole
trace formats: canonical CSV `submit_time,duration,gpus,queue,priority` (docs/simulator.md),
Philly `timestamp,duration,num_gpus,gpu_time,cluster`, Alibaba 2023 pod list."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="trace-driven simulation of gpuq and baseline schedulers",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, help="trace CSV file")
    p.add_argument(
        "--format", choices=FORMATS, default="auto", help="trace format (default: from the header)"
    )
    p.add_argument("--skip-bad", action="store_true", help="skip malformed rows (counted and reported)")
    p.add_argument("--default-duration", type=float, help="run time (s) for pod lists without time columns")
    p.add_argument("--limit", type=int, help="only the first N jobs of the trace")
    p.add_argument("--policy", default="gpuq", help=f"comma-separated, or 'all' ({', '.join(POLICIES)})")
    p.add_argument("--config", type=Path, help="scheduler config.yaml (same file the operator reads)")
    p.add_argument("--queues", type=Path, help="GPUQueue YAML; default: one queue per trace tenant")
    g = p.add_argument_group("cluster (flags, or --nodes-file)")
    g.add_argument(
        "--nodes-file", type=Path, help="node list CSV (Alibaba format sn,cpu_milli,memory_mib,gpu,model)"
    )
    g.add_argument("--gpus", type=int, help="total GPUs: whole racks of --nodes-per-rack nodes")
    g.add_argument("--zones", type=int, default=1)
    g.add_argument("--blocks-per-zone", type=int, default=1)
    g.add_argument("--racks-per-block", type=int, default=4)
    g.add_argument("--nodes-per-rack", type=int, default=16)
    g.add_argument("--gpus-per-node", type=int, default=8)
    g.add_argument("--gpu-model", help="GPU model of generated nodes")
    w = p.add_argument_group("workload")
    w.add_argument("--target-load", type=float, help="rescale arrivals to this offered load (e.g. 0.8)")
    w.add_argument(
        "--worker-gpus",
        choices=("whole", "1"),
        default="whole",
        help="whole: one worker per node-sized chunk; 1: one worker per GPU",
    )
    w.add_argument(
        "--large-job-gpus", type=int, default=8, help="jobs with at least this many GPUs are 'large'"
    )
    s = p.add_argument_group("speed and failures")
    s.add_argument("--no-slowdown", action="store_true", help="placement does not change job speed")
    s.add_argument(
        "--slowdown", default="", help="factors per level crossed, e.g. node=1.2,rack=1.1,block=1.1,zone=1.5"
    )
    s.add_argument("--mtbf-hours", type=float, help="mean time between failures of each node (default: none)")
    s.add_argument("--repair-hours", type=float, default=2.0, help="time to repair a failed node")
    defaults = SimOptions()
    for flag, name, text in (
        ("--checkpoint-minutes", "checkpoint_minutes", "periodic checkpoint interval of every job (0: none)"),
        (
            "--checkpoint-save-seconds",
            "checkpoint_save_seconds",
            "a checkpoint saved on a preemption request holds the victim's GPUs this long",
        ),
        (
            "--restart-overhead-seconds",
            "restart_overhead_seconds",
            "start-up of every restarted gang before it makes progress",
        ),
    ):
        s.add_argument(
            flag, type=float, default=getattr(defaults, name), help=f"{text} (default %(default)s)"
        )
    s.add_argument(
        "--cycle-seconds", type=float, default=0.0, help="decide at most once per period (0: every event)"
    )
    s.add_argument("--seed", type=int, default=0)
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help="write results as JSON ('-' for stdout)")
    o.add_argument("--plots", type=Path, metavar="DIR", help="write PNG plots to DIR")
    o.add_argument("--per-queue", action="store_true", help="also print per-queue tables")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def speed_model(spec: str, disabled: bool) -> SpeedModel:
    factors: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        level, _, value = item.partition("=")
        if level not in ("node", "rack", "block", "zone"):
            raise ValueError(f"--slowdown: unknown level {level!r} (node, rack, block, zone)")
        try:
            factor = float(value)
        except ValueError:
            raise ValueError(f"--slowdown: {item!r} needs a number, e.g. {level}=1.2") from None
        if factor < 1.0:
            raise ValueError(f"--slowdown: {level} factor {factor} must be >= 1 (a slowdown)")
        factors[level] = factor
    return SpeedModel(enabled=not disabled, **factors)


def policies(spec: str) -> list[str]:
    names = list(POLICIES) if spec == "all" else [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in POLICIES]
    if unknown or not names:
        raise ValueError(f"--policy: unknown {unknown or spec!r}; choose from {', '.join(POLICIES)} or all")
    return names


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    if args.gpus is not None:
        shape = shape_for_gpus(args.gpus, args.gpus_per_node, args.nodes_per_rack, args.racks_per_block)
    else:
        shape = ClusterShape(
            args.zones, args.blocks_per_zone, args.racks_per_block, args.nodes_per_rack, args.gpus_per_node
        )
    if args.gpu_model:
        shape = replace(shape, gpu_model=args.gpu_model)
    options = SimOptions(
        worker_gpus=args.worker_gpus,
        speed=speed_model(args.slowdown, args.no_slowdown),
        mtbf_hours=args.mtbf_hours,
        repair_hours=args.repair_hours,
        checkpoint_minutes=args.checkpoint_minutes or None,
        checkpoint_save_seconds=args.checkpoint_save_seconds,
        restart_overhead_seconds=args.restart_overhead_seconds,
        cycle_seconds=args.cycle_seconds,
        large_job_gpus=args.large_job_gpus,
        seed=args.seed,
    )
    return load_scenario(
        args.trace,
        fmt=args.format,
        skip_bad=args.skip_bad,
        default_duration=args.default_duration,
        config_path=args.config,
        queues_path=args.queues,
        nodes_path=args.nodes_file,
        shape=shape,
        target_load=args.target_load,
        options=options,
        limit=args.limit,
    )


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True, soft_wrap=True)  # errors stay on one line (greppable)
    out = Console()
    try:
        names = policies(args.policy)
        scenario = scenario_from_args(args)
    except (TraceError, QueueFileError, ConfigError, ValueError) as exc:
        err.print(f"[red]gpuq simulate: {exc}[/red]", highlight=False)
        return 2
    if scenario.load_report is not None:
        err.print(scenario.load_report.summary(), highlight=False)
    if not scenario.jobs:
        err.print("[red]gpuq simulate: the trace has no jobs to simulate[/red]")
        return 2
    info = scenario.describe()
    err.print(
        f"{info['jobs']} jobs on {info['nodes']} nodes / {info['gpus']} GPUs, {info['queues']} queues, "
        f"offered load {info['offered_load']:.2f}, workers {info['worker_gpus']}",
        highlight=False,
    )
    results = []
    try:
        for name in names:
            results.append(
                _run_one(scenario, name, show=not args.no_progress and err.is_terminal, console=err)
            )
    except SimulationError as exc:
        err.print(f"[red]gpuq simulate: {exc}[/red]", highlight=False)
        return 1
    title = f"{args.trace.name}: {info['gpus']} GPUs, workers {info['worker_gpus']}"
    if args.json:
        write_json(args.json, to_json(info, results), out)
    if args.json != "-":
        print_results(results, title, args.per_queue, out)
    if args.plots:
        from gpuq.sim.plots import write_plots

        for path in write_plots(results, args.plots, title):
            err.print(f"wrote {path}", highlight=False)
    return 0


def _run_one(scenario: Scenario, policy: str, show: bool, console: Console) -> dict[str, Any]:
    if not show:
        return scenario.run(policy)
    columns = (
        TextColumn(f"{policy:>12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(policy, total=len(scenario.jobs))

        def advance(finished: int) -> None:
            if finished % 200 == 0 or finished == len(scenario.jobs):
                progress.update(task, completed=finished)

        return scenario.run(policy, on_finish=advance)
