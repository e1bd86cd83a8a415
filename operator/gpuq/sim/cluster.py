"""The simulated cluster: nodes generated from a shape (zones > blocks > racks > nodes) or read
from a node list (the Alibaba 2023 format `sn,cpu_milli,memory_mib,gpu,model`, optionally with
`zone,block,rack` columns; without them nodes are grouped into racks/blocks in file order)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuq.core.config import SchedulerConfig
from gpuq.core.model import Node, Resources, Topology
from gpuq.sim.readers import MIB, csv_rows
from gpuq.sim.trace import TraceError

NODE_LIST_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu")
GIB = 1024 * MIB


@dataclass(frozen=True, slots=True)
class ClusterShape:
    zones: int = 1
    blocks_per_zone: int = 1
    racks_per_block: int = 4
    nodes_per_rack: int = 16
    gpus_per_node: int = 8
    cpu_per_node: int = 96  # cores
    memory_gib_per_node: int = 1024
    gpu_model: str | None = None

    @property
    def nodes(self) -> int:
        return self.zones * self.blocks_per_zone * self.racks_per_block * self.nodes_per_rack

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def validate(self) -> None:
        for name in ("zones", "blocks_per_zone", "racks_per_block", "nodes_per_rack", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"cluster shape: {name} must be >= 1, got {getattr(self, name)}")


def shape_for_gpus(
    total_gpus: int, gpus_per_node: int, nodes_per_rack: int, racks_per_block: int
) -> ClusterShape:
    """The smallest shape with at least `total_gpus` (whole racks; blocks of `racks_per_block`)."""
    nodes = -(-total_gpus // gpus_per_node)
    racks = -(-nodes // nodes_per_rack)
    if racks * nodes_per_rack * gpus_per_node != total_gpus:
        raise ValueError(
            f"--gpus {total_gpus} is not a whole number of {nodes_per_rack}-node racks "
            f"of {gpus_per_node}-GPU nodes"
        )
    blocks = -(-racks // racks_per_block)
    if racks % blocks:
        raise ValueError(f"{racks} racks do not split evenly into blocks of {racks_per_block}")
    return ClusterShape(1, blocks, racks // blocks, nodes_per_rack, gpus_per_node)


def _node(
    name: str,
    path: tuple[str, ...],
    topology: Topology,
    model_label: str,
    gpus: int,
    cpu: int,
    memory: int,
    model: str | None,
) -> Node:
    labels = dict(zip(topology.labels, path, strict=True))
    if model:
        labels[model_label] = model
    return Node(name, Resources(gpus, cpu, memory), path, labels, gpu_model=model)


def build_nodes(shape: ClusterShape, config: SchedulerConfig) -> tuple[Node, ...]:
    """Nodes named `z{z}-b{b}-r{r}-n{n}`, whose topology path follows config.topology's levels."""
    shape.validate()
    topology = config.topology
    _check_levels(topology)
    nodes: list[Node] = []
    for z in range(shape.zones):
        for b in range(shape.blocks_per_zone):
            for r in range(shape.racks_per_block):
                for n in range(shape.nodes_per_rack):
                    zone, block, rack = f"z{z}", f"z{z}-b{b}", f"z{z}-b{b}-r{r}"
                    name = f"{rack}-n{n:02d}"
                    nodes.append(
                        _node(
                            name,
                            (zone, block, rack, name),
                            topology,
                            config.gpu_model_label,
                            shape.gpus_per_node,
                            shape.cpu_per_node * 1000,
                            shape.memory_gib_per_node * GIB,
                            shape.gpu_model,
                        )
                    )
    return tuple(nodes)


def read_node_list(
    path: Path, config: SchedulerConfig, nodes_per_rack: int = 16, racks_per_block: int = 4
) -> tuple[Node, ...]:
    """Nodes from a node list; GPU models come from its `model` column."""
    topology = config.topology
    _check_levels(topology)
    if not path.is_file():
        raise TraceError(str(path), 0, "<file>", "does not exist or is not a file")
    nodes: list[Node] = []
    seen: set[str] = set()
    for index, row in enumerate(csv_rows(path, NODE_LIST_COLUMNS)):
        name = row.text("sn")
        if name in seen:
            raise row.error("sn", f"duplicate node name {name!r}")
        seen.add(name)
        rack_no = index // nodes_per_rack
        block_no = rack_no // racks_per_block
        zone = row.text("zone", required=False) or "z0"
        block = row.text("block", required=False) or f"{zone}-b{block_no}"
        rack = row.text("rack", required=False) or f"{block}-r{rack_no}"
        nodes.append(
            _node(
                name,
                (zone, block, rack, name),
                topology,
                config.gpu_model_label,
                row.integer("gpu"),
                row.integer("cpu_milli"),
                row.integer("memory_mib") * MIB,
                row.text("model", required=False) or None,
            )
        )
    if not nodes:
        raise TraceError(str(path), 0, "<file>", "node list has no nodes")
    return tuple(nodes)


def _check_levels(topology: Topology) -> None:
    if len(topology.levels) != 4:
        raise ValueError(
            "the simulator builds zone/block/rack/node clusters; "
            f"config topology has levels {topology.levels}"
        )
