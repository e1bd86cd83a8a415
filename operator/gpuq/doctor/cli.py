"""`gpuq doctor [--json]`: one line per check; exit code 0 only when none fails."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuq.devcluster import Cluster

SYMBOL = {"pass": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    doc = subparsers.add_parser(
        "doctor",
        help="check that the cluster is set up for gpuq and that gpuq works",
        description="API, CRDs, config, the operator's leader and metrics, the extender, kube-scheduler's "
        "configuration, the operator's RBAC, GPU nodes and queues. Exit code 0 only when no check fails.",
    )
    doc.add_argument("--json", action="store_true", help="print the results as JSON")
    doc.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config)")
    doc.add_argument("--namespace", default="gpuq-system", help="the operator's namespace")
    doc.add_argument("--lease", default="gpuq-operator", help="the operator's leader-election Lease")
    doc.add_argument(
        "--extender-url",
        help="where the extender answers (default: the config's extenderBindAddress:extenderPort)",
    )
    doc.add_argument(
        "--metrics-url", help="the leader's /metrics (default: through the API server's pod proxy)"
    )
    doc.add_argument("--scheduler-config", type=Path, help="a kube-scheduler config file to check")
    doc.set_defaults(func=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    from kubernetes import config as k8s_config

    from gpuq.doctor.checks import FAIL, Context, run_checks

    try:
        api = k8s_config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    except (k8s_config.ConfigException, OSError) as exc:
        sys.stderr.write(f"gpuq doctor: no usable kubeconfig: {exc}\n")
        return 2
    scheduler_config = args.scheduler_config
    dev = _dev_cluster(api.configuration.host)
    if scheduler_config is None and dev is not None:
        scheduler_config = dev.scheduler_config_path
    ctx = Context(
        api,
        args.namespace,
        args.lease,
        args.extender_url,
        args.metrics_url,
        scheduler_config,
        dev,
    )
    results = run_checks(ctx)
    if args.json:
        sys.stdout.write(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            sys.stdout.write(f"{SYMBOL[r.status]}  {r.name:<{width}}  {r.detail}\n")
            if r.fix and r.status in ("fail", "warn"):
                sys.stdout.write(f"      {'':<{width}}  fix: {r.fix}\n")
    return 1 if any(r.status == FAIL for r in results) else 0


def _dev_cluster(server: str) -> Cluster | None:
    """The running dev cluster at `server`, the API server the kubeconfig's current context names.
    Not matched on the kubeconfig's path: `gpuq cluster up` writes a self-contained one to be copied
    or merged into ~/.kube/config (its context renamed), where another cluster may be current."""
    from gpuq.devcluster import Cluster, DevClusterError

    for name in Cluster.names():
        with contextlib.suppress(DevClusterError, OSError, KeyError, ValueError):  # a half-written state
            cluster = Cluster.attach(name)
            if cluster.server.rstrip("/") == server.rstrip("/"):
                return cluster
    return None
