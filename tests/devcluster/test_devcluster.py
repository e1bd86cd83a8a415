"""gpuq.devcluster logic that needs no cluster: the fleet shape, kwok's configuration, start-up
diagnosis and process bookkeeping. (Everything that runs processes is tested in e2e/test_cluster.py.)"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import yaml

from gpuq.devcluster.cluster import PortClash, _diagnose
from gpuq.devcluster.kwok_config import SIM_DURATION, SIM_FAIL_AFTER, kwok_config
from gpuq.devcluster.paths import validate_name
from gpuq.devcluster.processes import ProcessRecord, alive, spawn, stop
from gpuq.devcluster.shape import (
    BLOCK_LABEL,
    GPU_RESOURCE,
    HEARTBEAT_LABEL,
    RACK_LABEL,
    ZONE_LABEL,
    Shape,
    node_manifest,
)


@pytest.mark.parametrize(
    ("racks", "blocks", "zones"), [(4, 2, 1), (8, 4, 2), (5, 2, 2), (3, 3, 1), (7, 3, 2)]
)
def test_racks_split_into_contiguous_balanced_blocks_and_zones(racks: int, blocks: int, zones: int) -> None:
    shape = Shape(racks=racks, nodes_per_rack=3, blocks=blocks, zones=zones).validate()
    nodes = shape.nodes()
    assert len(nodes) == len({n.name for n in nodes}) == shape.node_count == racks * 3
    block_of_rack = {n.rack: n.block for n in nodes}
    zone_of_block = {n.block: n.zone for n in nodes}
    assert len(set(block_of_rack.values())) == blocks and len(set(zone_of_block.values())) == zones
    racks_per_block = Counter(block_of_rack.values()).values()
    assert max(racks_per_block) - min(racks_per_block) <= 1  # balanced
    order = [block_of_rack[f"rack-{r}"] for r in range(racks)]
    assert order == sorted(order, key=lambda b: int(b.split("-")[1]))  # contiguous
    for node in nodes:  # every node carries the hierarchy it sits in
        labels = node_manifest(node, shape)["metadata"]["labels"]
        assert (labels[ZONE_LABEL], labels[BLOCK_LABEL], labels[RACK_LABEL]) == (
            node.zone,
            node.block,
            node.rack,
        )


def test_node_manifest_advertises_gpus_and_is_managed_by_kwok() -> None:
    shape = Shape(racks=2, nodes_per_rack=2, gpus_per_node=4, blocks=1)
    manifests = [node_manifest(n, shape) for n in shape.nodes()]
    assert all(m["status"]["allocatable"][GPU_RESOURCE] == "4" for m in manifests)
    assert all(m["metadata"]["labels"][HEARTBEAT_LABEL] == "on" for m in manifests)
    ips = [a["address"] for m in manifests for a in m["status"]["addresses"] if a["type"] == "InternalIP"]
    assert len(set(ips)) == len(manifests)


@pytest.mark.parametrize(
    ("shape", "complaint"),
    [
        (Shape(racks=1, blocks=2), "--blocks 2 exceeds --racks 1"),
        (Shape(racks=4, blocks=2, zones=3), "--zones 3 exceeds --blocks 2"),
        (Shape(gpus_per_node=0), "--gpus-per-node must be >= 1"),
        (Shape(racks=100, nodes_per_rack=100), "more than the 5000"),
    ],
)
def test_bad_shapes_are_refused_with_the_flag_to_fix(shape: Shape, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        shape.validate()


@pytest.mark.parametrize("name", ["", "Gpuq", "-x", "x-", "a_b", "x" * 41])
def test_bad_cluster_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid cluster name"):
        validate_name(name)


def test_kwok_config_manages_labelled_nodes_and_failure_wins_over_success() -> None:
    options, *stages = yaml.safe_load_all(kwok_config(lease_seconds=6))
    assert options["options"]["manageNodesWithLabelSelector"] == f"{HEARTBEAT_LABEL}=on"
    assert options["options"]["nodeLeaseDurationSeconds"] == 6
    by_name = {s["metadata"]["name"]: s["spec"] for s in stages}
    assert len(by_name) == len(stages) == 6
    succeed = by_name["gpuq-pod-succeed"]["selector"]["matchExpressions"]
    assert {"key": f'.metadata.annotations["{SIM_FAIL_AFTER}"]', "operator": "DoesNotExist"} in succeed
    assert by_name["gpuq-pod-succeed"]["delay"]["durationFrom"]["expressionFrom"].endswith(
        f'["{SIM_DURATION}"]'
    )
    for spec in by_name.values():
        assert "@" not in spec["next"].get("statusTemplate", "")  # every placeholder filled in


def _log_with(tmp_path: Path, *lines: str) -> ProcessRecord:
    log = tmp_path / "kube-apiserver.log"
    log.write_text("\n".join(["I0101 starting", *lines]) + "\n")
    return ProcessRecord("kube-apiserver", 1, None, str(log), ("kube-apiserver",))


def test_diagnosis_names_a_port_clash_and_the_port(tmp_path: Path) -> None:
    rec = _log_with(
        tmp_path,
        'E0101 run.go:72] "command failed" err="listen tcp 127.0.0.1:6443: bind: address already in use"',
    )
    err = _diagnose(rec)
    assert isinstance(err, PortClash)
    assert (
        str(err)
        == f"port clash: kube-apiserver could not bind port 6443 (address already in use) (see {rec.log})"
    )


def test_diagnosis_quotes_the_last_error_line(tmp_path: Path) -> None:
    rec = _log_with(
        tmp_path, "E0101 first problem", "W0101 a warning", "F0101 fatal: etcd unreachable", "I0101 bye"
    )
    assert str(_diagnose(rec)).startswith(
        "kube-apiserver exited during start-up: F0101 fatal: etcd unreachable"
    )


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process identity uses /proc start times")
def test_stop_ends_the_process_and_a_reused_pid_is_not_ours(tmp_path: Path) -> None:
    rec = spawn("sleeper", ["sleep", "60"], tmp_path / "sleeper.log")
    assert alive(rec)
    impostor = ProcessRecord(rec.name, rec.pid, (rec.start_ticks or 0) + 1, rec.log, rec.argv)
    assert not alive(impostor)  # same pid, other start time: never signalled
    stop(rec, grace=2.0)
    assert not alive(rec)
    with pytest.raises(ProcessLookupError):  # gone and reaped, not a zombie
        os.kill(rec.pid, 0)


def test_the_audit_log_for_benchmarks_records_only_pod_creates_and_bindings(tmp_path: Path) -> None:
    from gpuq.devcluster import components as comp
    from gpuq.devcluster.paths import ClusterPaths
    from gpuq.devcluster.pki import Pki

    paths = ClusterPaths(tmp_path)
    comp.write_configs(paths, comp.Timing())
    ports = comp.Ports(1, 2, 3, 4, 5)
    assert not any(a.startswith("--audit") for a in comp.apiserver_argv(tmp_path, Pki(paths.pki), ports))
    argv = comp.apiserver_argv(tmp_path, Pki(paths.pki), ports, audit=paths)
    flags = dict(a.split("=", 1) for a in argv if a.startswith("--audit"))
    assert flags["--audit-log-path"] == str(paths.log("audit")) and flags["--audit-log-format"] == "json"
    policy = yaml.safe_load(Path(flags["--audit-policy-file"]).read_text())
    first, rest = policy["rules"][0], policy["rules"][1:]
    assert first["verbs"] == ["create"]
    assert first["resources"] == [{"group": "", "resources": ["pods", "pods/binding"]}]
    assert rest == [{"level": "None"}]  # nothing else: the log costs the API server only for binds
