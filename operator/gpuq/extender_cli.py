"""`gpuq extender config`: the kube-scheduler configuration that calls gpuq's extender, or the
translation of a legacy `kind: Policy` (docs/extender.md). YAML on stdout, the report on stderr."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from gpuq.schedconfig import DEFAULT_EXTENDER_WEIGHT, DEFAULT_URL

    ext = subparsers.add_parser("extender", help="gpuq's scheduler extender for kube-scheduler")
    sub = ext.add_subparsers(dest="extender_command", required=True)
    cfg = sub.add_parser(
        "config",
        help="print a KubeSchedulerConfiguration that calls gpuq (or translate a legacy Policy)",
        description=(
            "Print a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) with gpuq's extender. "
            "With --from-policy, translate a legacy kind: Policy (or a ConfigMap holding one): the "
            "configuration goes to stdout, what maps to what and what has no equivalent to stderr."
        ),
    )
    cfg.add_argument(
        "--from-policy", type=Path, metavar="FILE", help="a legacy Policy, JSON or YAML, or its ConfigMap"
    )
    cfg.add_argument("--url", default=DEFAULT_URL, help=f"the extender's URL (default {DEFAULT_URL})")
    cfg.add_argument("--timeout", default="3s", help="httpTimeout (default 3s)")
    cfg.add_argument("--weight", type=int, default=DEFAULT_EXTENDER_WEIGHT, help="the extender's weight")
    cfg.add_argument("--scheduler-name", default="default-scheduler", help="the profile's schedulerName")
    cfg.set_defaults(func=_config)


def _config(args: argparse.Namespace) -> int:
    from gpuq.schedconfig import PolicyError, dump, load_policy, scheduler_configuration, translate

    if args.from_policy is None:
        config = scheduler_configuration(args.url, args.timeout, args.weight, args.scheduler_name)
        sys.stdout.write(dump(config))
        return 0
    try:
        t = translate(load_policy(args.from_policy.read_text()), args.scheduler_name)
    except OSError as exc:
        sys.stderr.write(f"gpuq: cannot read {args.from_policy}: {exc.strerror}\n")
        return 2
    except PolicyError as exc:
        sys.stderr.write(f"gpuq: {args.from_policy}: {exc}\n")
        return 2
    sys.stdout.write(dump(t.configuration))
    sys.stderr.write(t.report() + "\n")
    return 0
