"""Cluster generation / node lists and queue setup (GPUQueue YAML or derived from the trace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.core.config import SchedulerConfig
from gpuq.core.model import QueueingStrategy
from gpuq.sim.cluster import ClusterShape, build_nodes, read_node_list, shape_for_gpus
from gpuq.sim.queues import QueueFileError, derive_queues, read_queue_file
from gpuq.sim.trace import TraceError, TraceJob

FIXTURES = Path(__file__).parent / "fixtures"
CONFIG = SchedulerConfig()


def test_shape_nodes_carry_topology_path_and_labels() -> None:
    nodes = build_nodes(ClusterShape(zones=2, blocks_per_zone=1, racks_per_block=2, nodes_per_rack=3), CONFIG)
    assert len(nodes) == 12 and sum(n.allocatable.gpus for n in nodes) == 96
    last = nodes[-1]
    assert last.path == ("z1", "z1-b0", "z1-b0-r1", "z1-b0-r1-n02")
    assert last.labels["gpuq.dev/rack"] == "z1-b0-r1"
    assert last.labels["kubernetes.io/hostname"] == last.name


def test_shape_for_512_gpus_is_four_16_node_racks() -> None:
    shape = shape_for_gpus(512, gpus_per_node=8, nodes_per_rack=16, racks_per_block=4)
    assert (shape.zones, shape.blocks_per_zone, shape.racks_per_block, shape.nodes_per_rack) == (1, 1, 4, 16)
    with pytest.raises(ValueError, match="whole number"):
        shape_for_gpus(500, 8, 16, 4)


def test_node_list_gives_models_and_groups_nodes_into_racks() -> None:
    nodes = read_node_list(FIXTURES / "alibaba_nodes_small.csv", CONFIG, nodes_per_rack=2, racks_per_block=1)
    assert [(n.name, n.allocatable.gpus, n.gpu_model) for n in nodes] == [
        ("node-0", 2, "P100"),
        ("node-1", 4, "T4"),
        ("node-2", 8, "V100M16"),
        ("node-3", 8, "V100M32"),
    ]
    assert nodes[1].path[2] != nodes[2].path[2]  # third node starts a new rack
    assert nodes[0].labels["nvidia.com/gpu.product"] == "P100"


def test_node_list_rejects_duplicate_names(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\na,1,1,8,X\na,1,1,8,X\n")
    with pytest.raises(TraceError, match=r"nodes.csv:3: field 'sn': duplicate"):
        read_node_list(path, CONFIG)


def test_derived_queues_share_the_cluster_by_gpu_time_in_one_cohort() -> None:
    jobs = [
        TraceJob("a", 0, 100, 3, "big"),  # 300 GPU-s
        TraceJob("b", 0, 100, 1, "small"),  # 100 GPU-s
    ]
    queues = {q.name: q for q in derive_queues(jobs, 10)}
    assert queues["big"].nominal_gpus == 8 and queues["small"].nominal_gpus == 2  # 7.5/2.5, remainder to big
    assert {q.cohort for q in queues.values()} == {"trace"}
    assert sum(q.nominal_gpus for q in queues.values()) == 10


def test_queue_yaml_is_read_through_the_api_model() -> None:
    queues = {q.name: q for q in read_queue_file(FIXTURES / "queues.yaml")}
    assert queues["team-a"].nominal_gpus == 24 and queues["team-a"].cohort == "lab"
    assert queues["team-b"].borrowing_limit_gpus == 8
    assert queues["team-b"].strategy is QueueingStrategy.STRICT_FIFO


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: GPUQueue\nmetadata: {name: q}\nspec: {nominalGPUs: -1}\n", "spec.nominalGPUs"),
        (
            "kind: GPUQueue\nmetadata: {name: q}\nspec: {nominalGPUs: 1, queueingStrategy: Random}\n",
            "queueingStrategy",
        ),
        ("kind: TrainingJob\nmetadata: {name: q}\n", "expected kind GPUQueue"),
        ("kind: GPUQueue\nspec: {nominalGPUs: 1}\n", "metadata.name"),
        (
            "kind: GPUQueue\nmetadata: {name: q}\nspec: {nominalGPUs: 1}\n---\n"
            "kind: GPUQueue\nmetadata: {name: q}\nspec: {nominalGPUs: 2}\n",
            "defined twice",
        ),
        ("{unclosed", "cannot read GPUQueue YAML"),
    ],
)
def test_bad_queue_yaml_is_reported_with_the_queue_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(text)
    with pytest.raises(QueueFileError, match=message):
        read_queue_file(path)


def test_queue_list_kind_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(
        "kind: List\nitems:\n- {kind: GPUQueue, metadata: {name: a}, spec: {nominalGPUs: 4}}\n"
        "- {kind: GPUQueue, metadata: {name: b}, spec: {nominalGPUs: 2}}\n"
    )
    assert [q.name for q in read_queue_file(path)] == ["a", "b"]
