"""`gpuq` command line: one subcommand group per subsystem.

Each subsystem owns its own `cli.py` with `register(subparsers)`; this module only wires them,
so the dev cluster, the operator and the simulator can grow their commands independently.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (subcommand, module that provides `register(subparsers)`)
SUBSYSTEMS: tuple[str, ...] = (
    "gpuq.devcluster.cli",
    "gpuq.controller.cli",
    "gpuq.sim.cli",
    "gpuq.demo.cli",
    "gpuq.extender_cli",
    "gpuq.doctor.cli",
    "gpuq.ctl.cli",
)


def build_parser(prog: str = "gpuq") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="GPU training scheduler for Kubernetes")
    parser.add_argument("--log-level", default="INFO", help="structlog level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBSYSTEMS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # subsystem not present in this build
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "gpuq") -> int:
    from gpuq import logs

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
