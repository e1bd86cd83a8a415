"""The simulated GPU nodes kwok runs, through any API server: create them, read their readiness,
and fail or recover one by turning its heartbeat label off or on. The local control plane and the
kind e2e backend (kwok running inside the kind cluster) share these."""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.rest import ApiError, Rest
from gpuq.devcluster.shape import HEARTBEAT_LABEL, HEARTBEAT_ON, Shape, node_manifest
from gpuq.logs import get_logger

_UNREADY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t.get("key") in _UNREADY_TAINTS for t in taints)


def create_nodes(rest: Rest, shape: Shape) -> None:
    def create(manifest: dict[str, Any]) -> None:
        rest.json("POST", "/api/v1/nodes", manifest, ok=(409,))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, [node_manifest(n, shape) for n in shape.nodes()]))


def ready_count(rest: Rest, selector: str = "") -> int:
    """Ready nodes (matching a label selector such as `type=kwok`)."""
    query = f"?labelSelector={quote(selector)}" if selector else ""
    return sum(node_ready(n) for n in rest.get(f"/api/v1/nodes{query}")["items"])


def get_node(rest: Rest, node: str, where: str) -> dict[str, Any]:
    status, text = rest.call("GET", f"/api/v1/nodes/{node}")
    if status == 404:
        raise DevClusterError(f"no node named {node!r} in {where}")
    if status != 200:
        raise DevClusterError(f"cannot read node {node!r}: HTTP {status} {text[:200]}")
    result: dict[str, Any] = json.loads(text)
    return result


def set_heartbeat(rest: Rest, node: str, value: str, where: str) -> None:
    """Stop (HEARTBEAT_OFF) or restart (HEARTBEAT_ON) the node's simulated kubelet."""
    labels = get_node(rest, node, where)["metadata"].get("labels", {})
    if HEARTBEAT_LABEL not in labels:
        raise DevClusterError(f"node {node!r} is not a simulated gpuq node (no {HEARTBEAT_LABEL} label)")
    rest.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {HEARTBEAT_LABEL: value}}})
    get_logger("gpuq.devcluster").info("devcluster.heartbeat", cluster=where, node=node, heartbeat=value)
    if value == HEARTBEAT_ON:
        resync_pods(rest, node)


def resync_pods(rest: Rest, node: str) -> None:
    """A kubelet coming back syncs every pod bound to its node; kwok only acts on pod events, so a
    pod bound while the node was down would stay Pending forever. Touch each such pod once."""
    pods = rest.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")["items"]
    for pod in pods:
        md = pod["metadata"]
        if pod.get("status", {}).get("phase", "Pending") == "Pending" and "deletionTimestamp" not in md:
            with contextlib.suppress(ApiError):
                rest.merge_patch(
                    f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}",
                    {"metadata": {"annotations": {"gpuq.dev/sim-resync": str(time.time())}}},
                )


def wait_node(rest: Rest, node: str, ready: bool, timeout: float, where: str) -> None:
    deadline = time.monotonic() + timeout
    while node_ready(get_node(rest, node, where)) != ready:
        if time.monotonic() > deadline:
            state = "Ready" if ready else "NotReady"
            raise DevClusterError(f"node {node} did not become {state} within {timeout:.0f}s")
        time.sleep(0.2)
