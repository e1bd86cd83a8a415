"""`gpuq demo`: the README's main command (see docs/demo.md)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from gpuq.devcluster.errors import DevClusterError

LOG_WIDTH = 160
MAX_SPEED = 3.0  # faster, and jobs would finish before the acts that need them running


def _speed(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if not 0.1 <= value <= MAX_SPEED:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and {MAX_SPEED:g} (got {value:g})")
    return value


def cmd_demo(args: argparse.Namespace) -> int:
    from gpuq.demo.session import Options, run_demo, stop_kept

    console = Console(highlight=False)
    if not console.is_terminal:  # a log or a pipe: wide enough for the whole table
        console = Console(highlight=False, width=LOG_WIDTH)
    try:
        if args.down:
            stopped = stop_kept(args.name)
            console.print(f"stopped {', '.join(stopped)}" if stopped else f"no demo {args.name!r} is running")
            return 0
        return run_demo(Options(args.name, args.keep, not args.no_live, args.speed), console)
    except DevClusterError as exc:
        console.print(f"[bold red]gpuq demo: error:[/] {exc}")
        return 1


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="live demo: local cluster + operator; jobs queued, admitted, preempted, failed over",
        description=(
            "Start a local cluster (128 simulated GPUs), the gpuq operator and two team queues, then play a "
            "scripted scenario (queueing and borrowing, preemption with checkpoint, node failover, "
            "completions) in a live table. Takes about 2 minutes, then stops everything. See docs/demo.md."
        ),
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the cluster and operator running at the end (stop: --down)"
    )
    parser.add_argument(
        "--no-live", action="store_true", help="print the tables after each act instead of a live table"
    )
    parser.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        metavar="F",
        help=f"play the scripted run times and pauses F times faster (0.1..{MAX_SPEED:g}, default 1)",
    )
    parser.add_argument("--down", action="store_true", help="stop a demo left running by --keep")
    parser.add_argument("--name", default="demo", help="name of the demo's local cluster (default demo)")
    parser.set_defaults(func=cmd_demo)
