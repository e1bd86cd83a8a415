"""The e2e fixture is a real cluster: GPU nodes with topology, kube-scheduler placing pods, nodes that
die and come back, and pods that finish when their simulated work is done."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from gpuq.devcluster import (
    SIM_DURATION,
    SIM_EXIT_CODE,
    SIM_FAIL_AFTER,
    Cluster,
    DevClusterError,
    PortClash,
    Shape,
    ensure_binaries,
)
from gpuq.devcluster.shape import (
    BLOCK_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    RACK_LABEL,
    ZONE_LABEL,
)
from gpuq.devcluster.testing import E2ECluster, node_is_ready, wait_for

pytestmark = pytest.mark.e2e


def gpu_pod(name: str, gpus: int, annotations: dict[str, str] | None = None) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, annotations=annotations),
        spec=k8s.V1PodSpec(
            restart_policy="Never",
            termination_grace_period_seconds=0,
            containers=[
                k8s.V1Container(
                    name="main",
                    image=E2ECluster.IMAGE,
                    resources=k8s.V1ResourceRequirements(limits={GPU_RESOURCE: str(gpus)}),
                )
            ],
        ),
    )


def pod_phase_is(cluster: E2ECluster, ns: str, name: str, phase: str) -> Any:
    pod = cluster.core.read_namespaced_pod(name, ns)
    return pod if pod.status.phase == phase else None


def test_nodes_are_ready_gpu_nodes_with_topology_labels(cluster: E2ECluster) -> None:
    nodes = cluster.core.list_node(label_selector=RACK_LABEL).items
    assert len(nodes) >= 2
    if cluster.shape is not None:
        assert len(nodes) == cluster.shape.node_count
        assert len(cluster.nodes_by_rack) == cluster.shape.racks
        assert cluster.gpus_per_node == cluster.shape.gpus_per_node
    for node in nodes:
        labels = node.metadata.labels
        assert node_is_ready(node), node.metadata.name
        assert int(node.status.allocatable[GPU_RESOURCE]) == cluster.gpus_per_node
        assert int(node.status.capacity[GPU_RESOURCE]) == cluster.gpus_per_node
        assert labels[HOSTNAME_LABEL] == node.metadata.name
        assert labels[GPU_PRODUCT_LABEL].startswith("NVIDIA-")
        for key in (ZONE_LABEL, BLOCK_LABEL, RACK_LABEL):
            assert labels.get(key), f"{node.metadata.name} lacks {key}"
    # the hierarchy is consistent: a rack lies in one block, a block in one zone
    by_rack = {n.metadata.labels[RACK_LABEL]: set() for n in nodes}
    for n in nodes:
        by_rack[n.metadata.labels[RACK_LABEL]].add(
            (n.metadata.labels[BLOCK_LABEL], n.metadata.labels[ZONE_LABEL])
        )
    assert all(len(parents) == 1 for parents in by_rack.values()), by_rack


def test_full_node_gpu_pod_is_bound_by_kube_scheduler_and_runs(cluster: E2ECluster, namespace: str) -> None:
    gpus = cluster.gpus_per_node
    cluster.core.create_namespaced_pod(namespace, gpu_pod("full-node", gpus))
    pod = wait_for(lambda: pod_phase_is(cluster, namespace, "full-node", "Running"), 60, "pod Running")
    assert pod.spec.node_name in cluster.node_names
    assert pod.status.pod_ip and pod.status.host_ip
    assert all(c.ready and c.state.running for c in pod.status.container_statuses)
    scheduled = [c for c in pod.status.conditions if c.type == "PodScheduled"]
    assert scheduled and scheduled[0].status == "True"

    def scheduled_event() -> bool:
        events = cluster.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=full-node"
        ).items
        return any(
            e.reason == "Scheduled" and "default-scheduler" in (e.reporting_component, e.source.component)
            for e in events
        )

    wait_for(scheduled_event, 30, "a Scheduled event from default-scheduler")


def test_pod_wanting_more_gpus_than_any_node_stays_pending(cluster: E2ECluster, namespace: str) -> None:
    too_many = cluster.gpus_per_node + 1  # 9 on 8-GPU nodes
    cluster.core.create_namespaced_pod(namespace, gpu_pod("too-big", too_many))

    def unschedulable() -> Any:
        pod = cluster.core.read_namespaced_pod("too-big", namespace)
        conds = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
        return pod if conds and conds[0].status == "False" and conds[0].reason == "Unschedulable" else None

    pod = wait_for(unschedulable, 60, "PodScheduled=False/Unschedulable")
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None
    assert GPU_RESOURCE in next(c.message for c in pod.status.conditions if c.type == "PodScheduled")


def test_failed_node_turns_not_ready_and_recovers(cluster: E2ECluster) -> None:
    if not cluster.can_fail_nodes:
        pytest.skip(f"backend {cluster.backend} cannot fail nodes")
    node = cluster.node_names[-1]
    cluster.fail_node(node)
    try:
        failed = cluster.core.read_node(node)
        ready = next(c for c in failed.status.conditions if c.type == "Ready")
        assert ready.status == "Unknown"  # the controller-manager's verdict on a silent node
        assert ready.reason == "NodeStatusUnknown"
        wait_for(
            lambda: any(
                t.key == "node.kubernetes.io/unreachable"
                for t in cluster.core.read_node(node).spec.taints or []
            ),
            30,
            "unreachable taint",
        )
        others = [n for n in cluster.node_names if n != node]
        assert all(node_is_ready(cluster.core.read_node(n)) for n in others)
    finally:
        cluster.recover_node(node)
    wait_for(lambda: not cluster.core.read_node(node).spec.taints, 30, "taints removed after recovery")


def test_pod_with_sim_duration_succeeds(cluster: E2ECluster, namespace: str) -> None:
    cluster.require_simulated_pods("pod completion by annotation")
    cluster.core.create_namespaced_pod(namespace, gpu_pod("short-job", 1, {SIM_DURATION: "2s"}))
    running = wait_for(lambda: pod_phase_is(cluster, namespace, "short-job", "Running"), 60, "pod Running")
    assert running.status.container_statuses[0].state.running
    done = wait_for(lambda: pod_phase_is(cluster, namespace, "short-job", "Succeeded"), 60, "pod Succeeded")
    terminated = done.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0 and terminated.reason == "Completed"
    assert (terminated.finished_at - running.status.start_time).total_seconds() >= 1


def test_pod_with_sim_fail_after_fails_with_its_exit_code(cluster: E2ECluster, namespace: str) -> None:
    cluster.require_simulated_pods("pod failure by annotation")
    annotations = {
        SIM_FAIL_AFTER: "1s",
        SIM_EXIT_CODE: "137",
        SIM_DURATION: "1s",
    }  # failure wins over success
    cluster.core.create_namespaced_pod(namespace, gpu_pod("crashing", 1, annotations))
    failed = wait_for(lambda: pod_phase_is(cluster, namespace, "crashing", "Failed"), 60, "pod Failed")
    assert failed.status.container_statuses[0].state.terminated.exit_code == 137


def test_deleted_pod_goes_away_and_frees_its_gpus(cluster: E2ECluster, namespace: str) -> None:
    cluster.core.create_namespaced_pod(namespace, gpu_pod("victim", cluster.gpus_per_node))
    pod = wait_for(lambda: pod_phase_is(cluster, namespace, "victim", "Running"), 60, "pod Running")
    cluster.core.delete_namespaced_pod("victim", namespace)

    def gone() -> bool:
        try:
            cluster.core.read_namespaced_pod("victim", namespace)
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 60, "pod deleted")
    # the node's GPUs are free again: a same-size pod pinned to it runs
    again = gpu_pod("successor", cluster.gpus_per_node)
    again.spec.node_selector = {HOSTNAME_LABEL: pod.spec.node_name}
    cluster.core.create_namespaced_pod(namespace, again)
    wait_for(lambda: pod_phase_is(cluster, namespace, "successor", "Running"), 60, "successor Running")


# -- the dev cluster itself: side by side, and bad input -----------------------------------------------

needs_devcluster = pytest.mark.skipif(
    os.environ.get("GPUQ_E2E_CLUSTER", "local") != "local" or not Path("/proc").is_dir(),
    reason="exercises gpuq.devcluster processes (local backend, Linux /proc)",
)


def processes_under(directory: Path) -> list[str]:
    """Command lines of live processes that mention `directory` (every component's flags do)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(directory) in args:
            found.append(args)
    return found


def tiny() -> Shape:
    return Shape(racks=1, nodes_per_rack=1, blocks=1, zones=1)


@needs_devcluster
def test_second_cluster_runs_beside_the_first_and_down_leaves_nothing(cluster: E2ECluster) -> None:
    side = Cluster.up(f"e2e-side-{os.getpid()}", tiny(), tie_to_process=True)
    try:
        assert side.server not in cluster.api.configuration.host
        assert side.nodes_by_rack() == {"rack-0": ["gpu-r0-n0"]}
        assert side.status().healthy
        assert len(cluster.node_names) > 1  # the session's cluster is untouched
    finally:
        side.down()
    assert not processes_under(side.paths.root)
    assert not side.paths.root.exists()
    assert all(cluster.node_ready(n) for n in cluster.node_names[:2])


@needs_devcluster
def test_a_component_restarted_by_another_handle_is_restarted_not_doubled() -> None:
    """`gpuq cluster up --scheduler-extender` on a running cluster restarts kube-scheduler from another
    process; a handle opened before must stop that one, not start a second that cannot bind its port."""
    side = Cluster.up(f"e2e-stale-{os.getpid()}", tiny(), tie_to_process=True)
    try:
        Cluster.attach(side.name).restart_component("kube-scheduler")
        side.restart_component("kube-scheduler")  # its own record names the process stopped above
        schedulers = [p for p in processes_under(side.paths.root) if "kube-scheduler " in p]
        assert len(schedulers) == 1, schedulers
        assert side.status().healthy
    finally:
        side.down()
    assert not processes_under(side.paths.root)


@needs_devcluster
def test_port_clash_is_one_clear_error_and_leaves_nothing_running() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        name = f"e2e-clash-{os.getpid()}"
        with pytest.raises(PortClash) as err:
            Cluster.up(name, tiny(), apiserver_port=port, tie_to_process=True)
    message = str(err.value)
    assert f"port {port}" in message and "kube-apiserver.log" in message and "\n" not in message
    assert not processes_under(Path(err.value.log or "").parents[1])
    assert Cluster.remove_leftovers(name)  # the logs were kept for diagnosis; now they go


@needs_devcluster
def test_binary_dying_at_start_names_it_and_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    for binary in ensure_binaries().iterdir():
        (bins / binary.name).symlink_to(binary)
    (bins / "kube-scheduler").unlink()
    (bins / "kube-scheduler").write_text(
        '#!/bin/sh\necho \'E0101 run.go:72] "command failed" err="broken"\'\nexit 3\n'
    )
    (bins / "kube-scheduler").chmod(0o755)
    monkeypatch.setenv("GPUQ_BIN_DIR", str(bins))
    name = f"e2e-dies-{os.getpid()}"
    with pytest.raises(DevClusterError) as err:
        Cluster.up(name, tiny(), tie_to_process=True)
    message = str(err.value)
    assert message.startswith("kube-scheduler exited during start-up") and "broken" in message
    assert message.endswith("kube-scheduler.log)")
    assert not processes_under(Path(err.value.log or "").parents[1])
    assert Cluster.remove_leftovers(name)


def test_missing_go_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUQ_CACHE_DIR", str(tmp_path))  # nothing built there
    monkeypatch.delenv("GPUQ_BIN_DIR", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(DevClusterError, match=r"^Go is not installed"):
        Cluster.up("e2e-nogo", tiny())
    assert not (tmp_path / "clusters" / "e2e-nogo" / "state.json").exists()
