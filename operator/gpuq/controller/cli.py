"""`gpuq operator run` (the kopf operator) and `gpuq crds` (render the CRDs from gpuq.api)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpuq.controller.kubeapi import ApiPolicy
from gpuq.controller.leader import LeaseConfig

_LEASE, _API = LeaseConfig(), ApiPolicy()  # the defaults the flags show


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    crds = subparsers.add_parser("crds", help="print or write the CRDs generated from gpuq.api")
    crds.add_argument("--write", metavar="DIR", type=Path, help="write one YAML file per CRD into DIR")
    crds.add_argument(
        "--check", metavar="DIR", type=Path, help="exit 1 if the CRDs in DIR drift from gpuq.api"
    )
    crds.add_argument("--docs", metavar="FILE", type=Path, help="also refresh the field reference in FILE")
    crds.set_defaults(func=_crds)

    op = subparsers.add_parser("operator", help="the gpuq operator")
    op_sub = op.add_subparsers(dest="operator_command", required=True)
    run = op_sub.add_parser("run", help="run the operator (kopf) against the current kubeconfig / in-cluster")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch TrainingJobs only here (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    run.add_argument(
        "--config", type=Path, help="scheduler config.yaml (default: read ConfigMap from the API)"
    )
    run.add_argument(
        "--config-namespace", default="gpuq-system", help="namespace of ConfigMap gpuq-scheduler-config"
    )
    run.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off)")
    run.add_argument(
        "--debounce", type=float, default=0.05, help="seconds to coalesce changes before a cycle"
    )
    run.add_argument(
        "--kubeconfig", help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    run.add_argument("--health-port", type=int, default=0, help="liveness endpoint /healthz (0: off)")
    run.add_argument(
        "--admission-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="test hook: wait this long between persisting an admission and creating its pods",
    )
    le = run.add_argument_group("leader election (a Lease; only the leader schedules and writes)")
    le.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="take part in leader election (default: on; --no-leader-elect only for a single instance)",
    )
    le.add_argument(
        "--leader-elect-namespace",
        help="namespace of the Lease (default: $POD_NAMESPACE, else --config-namespace)",
    )
    le.add_argument("--lease-name", default=_LEASE.name, help="name of the Lease")
    le.add_argument("--lease-duration", type=float, default=_LEASE.lease_duration, metavar="SECONDS")
    le.add_argument("--renew-deadline", type=float, default=_LEASE.renew_deadline, metavar="SECONDS")
    le.add_argument("--retry-period", type=float, default=_LEASE.retry_period, metavar="SECONDS")
    api = run.add_argument_group("API client (rate limit and retries)")
    api.add_argument(
        "--kube-api-qps", type=float, default=_API.qps, help="sustained requests/s (0: no limit)"
    )
    api.add_argument("--kube-api-burst", type=int, default=_API.burst, help="requests allowed in a burst")
    api.add_argument(
        "--api-retries",
        type=int,
        default=_API.max_retries,
        help="retries of a request on 429/5xx/no answer",
    )
    run.set_defaults(func=_run)


def _crds(args: argparse.Namespace) -> int:
    from gpuq.api import crd, reference

    if args.check:
        drift = crd.drifted(args.check)
        if args.docs and reference.docs_drifted(args.docs):
            drift.append(str(args.docs))
        for name in drift:
            sys.stdout.write(
                f"drift: {name} differs from gpuq.api; run `gpuq crds --write crds/ --docs docs/api.md`\n"
            )
        return 1 if drift else 0
    if args.write or args.docs:
        for path in crd.write_all(args.write) if args.write else []:
            sys.stdout.write(f"wrote {path}\n")
        if args.docs and reference.write_docs(args.docs):
            sys.stdout.write(f"updated {args.docs}\n")
        return 0
    sys.stdout.write("---\n".join(crd.render_all().values()))
    return 0


def _run(args: argparse.Namespace) -> int:
    from gpuq.controller.operator import OperatorOptions, run_operator

    options = OperatorOptions(
        namespaces=tuple(args.namespace),
        config_path=args.config,
        config_namespace=args.config_namespace,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        admission_delay=args.admission_delay,
        debounce_seconds=args.debounce,
        kubeconfig=args.kubeconfig,
        leader_elect=args.leader_elect,
        lease=LeaseConfig(
            namespace=args.leader_elect_namespace or os.environ.get("POD_NAMESPACE") or args.config_namespace,
            name=args.lease_name,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        ),
        api=ApiPolicy(qps=args.kube_api_qps, burst=args.kube_api_burst, max_retries=args.api_retries),
    )
    return run_operator(options)
