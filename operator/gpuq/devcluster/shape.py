"""The simulated GPU fleet: how many zones/blocks/racks/nodes, and what each fake node looks like.

Racks are split into contiguous, balanced groups per block, and blocks per zone, so any counts with
zones <= blocks <= racks work (e.g. 4 racks in 2 blocks in 1 zone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
ZONE_LABEL = "topology.kubernetes.io/zone"
BLOCK_LABEL = "gpuq.dev/block"
RACK_LABEL = "gpuq.dev/rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# kwok manages (heartbeats, runs pods on) exactly the nodes labelled HEARTBEAT_LABEL=on; fail-node flips it.
HEARTBEAT_LABEL = "gpuq.dev/sim-heartbeat"
HEARTBEAT_ON, HEARTBEAT_OFF = "on", "off"

# An 8x H100 80GB server as a GPU operator (GPU feature discovery) would label it.
DEFAULT_GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_MEMORY_MIB = "81559"
NODE_CAPACITY = {"cpu": "96", "memory": "1Ti", "pods": "110", "ephemeral-storage": "3500Gi"}
# Allocatable = capacity minus what a kubelet would reserve for the system.
NODE_ALLOCATABLE = {"cpu": "95", "memory": "1000Gi", "pods": "110", "ephemeral-storage": "3400Gi"}
MAX_NODES = 5000


@dataclass(frozen=True)
class FakeNode:
    name: str
    zone: str
    block: str
    rack: str
    index: int  # position in the fleet, for a unique InternalIP


@dataclass(frozen=True)
class Shape:
    racks: int = 4
    nodes_per_rack: int = 8
    gpus_per_node: int = 8
    blocks: int = 2
    zones: int = 1
    gpu_product: str = DEFAULT_GPU_PRODUCT

    def validate(self) -> Shape:
        for field in ("racks", "nodes_per_rack", "gpus_per_node", "blocks", "zones"):
            if getattr(self, field) < 1:
                raise ValueError(f"--{field.replace('_', '-')} must be >= 1 (got {getattr(self, field)})")
        if self.blocks > self.racks:
            raise ValueError(f"--blocks {self.blocks} exceeds --racks {self.racks}: every block needs a rack")
        if self.zones > self.blocks:
            raise ValueError(f"--zones {self.zones} exceeds --blocks {self.blocks}: every zone needs a block")
        if self.node_count > MAX_NODES:
            raise ValueError(f"{self.node_count} nodes is more than the {MAX_NODES} a dev cluster supports")
        return self

    @property
    def node_count(self) -> int:
        return self.racks * self.nodes_per_rack

    @property
    def gpu_count(self) -> int:
        return self.node_count * self.gpus_per_node

    def nodes(self) -> list[FakeNode]:
        nodes: list[FakeNode] = []
        for rack in range(self.racks):
            block = rack * self.blocks // self.racks
            zone = block * self.zones // self.blocks
            for n in range(self.nodes_per_rack):
                nodes.append(
                    FakeNode(
                        name=f"gpu-r{rack}-n{n}",
                        zone=f"zone-{zone}",
                        block=f"block-{block}",
                        rack=f"rack-{rack}",
                        index=len(nodes),
                    )
                )
        return nodes

    def describe(self) -> str:
        return (
            f"{self.node_count} nodes x {self.gpus_per_node} GPUs ({self.gpu_count} {self.gpu_product}) in "
            f"{self.racks} racks, {self.blocks} blocks, {self.zones} zones"
        )


def node_manifest(node: FakeNode, shape: Shape) -> dict[str, Any]:
    """The Node object to create: labels and capacity as a real GPU node reports them. Conditions are
    left to kwok, which marks the node Ready and keeps its lease fresh."""
    gpus = str(shape.gpus_per_node)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {
                HOSTNAME_LABEL: node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                ZONE_LABEL: node.zone,
                BLOCK_LABEL: node.block,
                RACK_LABEL: node.rack,
                GPU_PRODUCT_LABEL: shape.gpu_product,
                "nvidia.com/gpu.count": gpus,
                "nvidia.com/gpu.memory": GPU_MEMORY_MIB,
                HEARTBEAT_LABEL: HEARTBEAT_ON,
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {
            "capacity": {**NODE_CAPACITY, GPU_RESOURCE: gpus},
            "allocatable": {**NODE_ALLOCATABLE, GPU_RESOURCE: gpus},
            "addresses": [
                {"type": "InternalIP", "address": f"10.64.{node.index // 250}.{node.index % 250 + 1}"},
                {"type": "Hostname", "address": node.name},
            ],
        },
    }
