"""`gpuq cluster ...`: the local control plane from the command line (see docs/devcluster.md)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from gpuq.devcluster.cluster import AlreadyRunning, Cluster
from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.shape import Shape

DEFAULT_NAME = "gpuq"
DEFAULT_EXTENDER_URL = "http://127.0.0.1:8888"  # the operator's default extenderBindAddress/Port
_D = Shape()  # the defaults of `up`'s shape flags (--blocks: min(2, racks))


def up_command(name: str, shape: Shape, extender_url: str | None = None) -> str:
    """The `gpuq cluster up` of a running cluster (its name and shape: anything else is refused),
    with --scheduler-extender when given: what turns the extender on for it."""
    flags = [
        ("--name", name, DEFAULT_NAME),
        ("--racks", shape.racks, _D.racks),
        ("--nodes-per-rack", shape.nodes_per_rack, _D.nodes_per_rack),
        ("--gpus-per-node", shape.gpus_per_node, _D.gpus_per_node),
        ("--blocks", shape.blocks, min(2, shape.racks)),
        ("--zones", shape.zones, _D.zones),
        ("--gpu-product", shape.gpu_product, _D.gpu_product),
    ]
    parts = ["gpuq cluster up", *(f"{flag} {value}" for flag, value, default in flags if value != default)]
    if extender_url is not None:
        parts.append("--scheduler-extender")
        if extender_url != DEFAULT_EXTENDER_URL:
            parts.append(extender_url)
    return " ".join(parts)


def _err(msg: object) -> None:
    print(f"gpuq cluster: error: {msg}", file=sys.stderr)


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _handles_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except DevClusterError as exc:
            _err(exc)
            return 1
        except ValueError as exc:
            _err(exc)
            return 2

    return run


def _sigterm_as_interrupt(_sig: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # so `up` stops what it started, as on Ctrl-C


@_handles_errors
def cmd_up(args: argparse.Namespace) -> int:
    shape = Shape(
        racks=args.racks,
        nodes_per_rack=args.nodes_per_rack,
        gpus_per_node=args.gpus_per_node,
        blocks=args.blocks if args.blocks is not None else min(2, args.racks),
        zones=args.zones,
        gpu_product=args.gpu_product,
    ).validate()
    _note(f"starting cluster {args.name!r}: {shape.describe()}")
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        cluster = Cluster.up(
            args.name,
            shape,
            apiserver_port=args.apiserver_port,
            timeout=args.timeout,
            progress=lambda m: _note(f"  {m}"),
            extender_url=args.scheduler_extender,
        )
    except AlreadyRunning:
        cluster = Cluster.attach(args.name)
        if cluster.shape != shape:
            raise DevClusterError(
                f"cluster {args.name!r} is already running with a different shape "
                f"({cluster.shape.describe()}); stop it first with `gpuq cluster down --name {args.name}` "
                "or pick another --name"
            ) from None
        _note(f"cluster {args.name!r} is already running with this shape")
        wanted = args.scheduler_extender
        if wanted is not None and cluster.scheduler_extender_url != wanted:
            cluster.use_scheduler_extender(wanted)
            _note(f"kube-scheduler restarted: it now calls gpuq's extender at {wanted}")
    else:
        _note(f"cluster {args.name!r} ready in {cluster.timings['nodes_ready']:.1f}s at {cluster.server}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


@_handles_errors
def cmd_down(args: argparse.Namespace) -> int:
    if not args.all and Cluster.remove_leftovers(args.name):
        _note(f"cluster {args.name!r} was not running; removed its leftover files")
        return 0
    for name in Cluster.names() if args.all else [args.name]:
        Cluster.attach(name).down()
        _note(f"cluster {name!r} stopped")
    return 0


@_handles_errors
def cmd_status(args: argparse.Namespace) -> int:
    st = Cluster.attach(args.name).status()
    print(f"cluster {st.name}: {'healthy' if st.healthy else 'DEGRADED'}")
    print(f"  server      {st.server}")
    print(f"  kubeconfig  {st.kubeconfig}")
    for c in st.components:
        print(f"  {c.name:<24} pid {c.pid:<8} {'running' if c.alive else 'DEAD':<8} {c.log}")
    if st.nodes_total is None:
        print("  nodes       API server not answering")
    else:
        print(f"  nodes       {st.nodes_ready}/{st.nodes_total} Ready, {st.gpus_ready} GPUs schedulable")
        if st.not_ready:
            print(f"  not ready   {' '.join(st.not_ready)}")
    return 0 if st.healthy else 1


@_handles_errors
def cmd_kubeconfig(args: argparse.Namespace) -> int:
    print(Cluster.attach(args.name).kubeconfig)
    return 0


@_handles_errors
def cmd_list(_args: argparse.Namespace) -> int:
    for name in Cluster.names():
        print(name)
    return 0


@_handles_errors
def cmd_fail_node(args: argparse.Namespace) -> int:
    Cluster.attach(args.name).fail_node(args.node, wait=args.wait)
    _note(f"node {args.node}: heartbeat stopped" + (" and NotReady" if args.wait is not None else ""))
    return 0


@_handles_errors
def cmd_recover_node(args: argparse.Namespace) -> int:
    Cluster.attach(args.name).recover_node(args.node, wait=args.wait)
    _note(f"node {args.node}: heartbeat restored" + (" and Ready" if args.wait is not None else ""))
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="local Kubernetes control plane with simulated GPU nodes",
        description="Run a local control plane (etcd, kube-apiserver, kube-controller-manager, "
        "kube-scheduler) with kwok-simulated GPU nodes. See docs/devcluster.md.",
    )
    sub = parser.add_subparsers(dest="cluster_command", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
        p.set_defaults(func=func)
        return p

    up = add(
        "up", cmd_up, "start a cluster; returns when every node is Ready and prints `export KUBECONFIG=...`"
    )
    up.add_argument("--racks", type=int, default=_D.racks, help=f"number of racks (default {_D.racks})")
    up.add_argument(
        "--nodes-per-rack",
        type=int,
        default=_D.nodes_per_rack,
        help=f"nodes in each rack (default {_D.nodes_per_rack})",
    )
    up.add_argument(
        "--gpus-per-node",
        type=int,
        default=_D.gpus_per_node,
        help=f"nvidia.com/gpu per node (default {_D.gpus_per_node})",
    )
    up.add_argument(
        "--blocks", type=int, default=None, help="blocks the racks are split into (default min(2, racks))"
    )
    up.add_argument(
        "--zones", type=int, default=_D.zones, help=f"zones the blocks are split into (default {_D.zones})"
    )
    up.add_argument("--gpu-product", default=_D.gpu_product, help="nvidia.com/gpu.product label value")
    up.add_argument(
        "--apiserver-port", type=int, default=None, help="fixed API server port (default: a free one)"
    )
    up.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for readiness (default 120)"
    )
    up.add_argument(
        "--scheduler-extender",
        nargs="?",
        const=DEFAULT_EXTENDER_URL,
        metavar="URL",
        help=f"kube-scheduler calls gpuq's extender (default URL {DEFAULT_EXTENDER_URL}; on a running "
        "cluster: restarts its kube-scheduler so; docs/extender.md)",
    )

    down = add("down", cmd_down, "stop a cluster and delete its state")
    down.add_argument("--all", action="store_true", help="stop every cluster started by gpuq on this machine")
    add("status", cmd_status, "show components, nodes and GPUs; exit 1 if anything is unhealthy")
    add(
        "kubeconfig",
        cmd_kubeconfig,
        "print the kubeconfig path: export KUBECONFIG=$(gpuq cluster kubeconfig)",
    )
    add("list", cmd_list, "list clusters with state on this machine")
    for name, func, verb in (
        ("fail-node", cmd_fail_node, "stop a node's heartbeat, as if it died"),
        ("recover-node", cmd_recover_node, "restore a failed node's heartbeat"),
    ):
        p = add(name, func, verb)
        p.add_argument("node", help="node name, e.g. gpu-r0-n0")
        p.add_argument(
            "--wait",
            type=float,
            default=None,
            metavar="SECONDS",
            help="wait up to SECONDS until the node's Ready condition has changed",
        )
