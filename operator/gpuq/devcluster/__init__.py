"""The local Kubernetes control plane used by tests, the demo and benchmarks.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from Go modules (hack/), plus
kwok playing the kubelet of simulated GPU nodes. See docs/devcluster.md.

    cluster = Cluster.up("gpuq", Shape(racks=4, nodes_per_rack=8))
    cluster.kubeconfig, cluster.nodes_by_rack(), cluster.fail_node("gpu-r0-n0"), cluster.down()
"""

from gpuq.devcluster.binaries import ensure_binaries
from gpuq.devcluster.cluster import AlreadyRunning, Cluster, ClusterStatus, PortClash
from gpuq.devcluster.components import Timing
from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.kwok_config import SIM_DURATION, SIM_EXIT_CODE, SIM_FAIL_AFTER, SIM_TERMINATION_DELAY
from gpuq.devcluster.shape import Shape

__all__ = [
    "SIM_DURATION",
    "SIM_EXIT_CODE",
    "SIM_FAIL_AFTER",
    "SIM_TERMINATION_DELAY",
    "AlreadyRunning",
    "Cluster",
    "ClusterStatus",
    "DevClusterError",
    "PortClash",
    "Shape",
    "Timing",
    "ensure_binaries",
]
