"""Command lines and config files of the five control-plane processes, and why each flag is there.

Everything listens on 127.0.0.1 only. Timing is tuned so a dead node is noticed within ~5 s
(node-monitor-grace-period) while a healthy one, renewing its lease every lease/4 s, never flaps.
"""

from __future__ import annotations

import os
import socket
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuq.devcluster.kwok_config import kwok_config
from gpuq.devcluster.paths import ClusterPaths
from gpuq.devcluster.pki import SERVICE_CIDR, Identity, Pki

# Client identities (certificate CN / O). The controller-manager and scheduler use the users the
# bootstrap RBAC policy already grants; kwok plays every kubelet, so it gets cluster-admin.
IDENTITIES: dict[str, Identity] = {
    "admin": Identity("gpuq-admin", ("system:masters",)),
    "kube-controller-manager": Identity("system:kube-controller-manager"),
    "kube-scheduler": Identity("system:kube-scheduler"),
    "kwok": Identity("kwok-controller", ("system:masters",)),
}
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def free(cls, apiserver: int | None = None) -> Ports:
        """Ports the kernel reports free right now (all held open together, so they are distinct)."""
        with ExitStack() as stack:
            picked = []
            for _ in range(5):
                sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                sock.bind(("127.0.0.1", 0))
                picked.append(sock.getsockname()[1])
        return cls(picked[0], picked[1], apiserver or picked[2], picked[3], picked[4])

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    node_monitor_grace_seconds: int = 5
    node_monitor_period_seconds: int = 1
    node_lease_seconds: int = 6  # kwok renews every 6/4 = 1.5 s


# Upstream's node timings (kubelet lease 40 s renewed every 10 s, node-monitor-grace-period 50 s):
# for benchmarks that load the API server, where the fast-failover timings above would have
# hundreds of fake nodes renew every 1.5 s and flap NotReady whenever a burst starves kwok.
UPSTREAM_TIMING = Timing(node_monitor_grace_seconds=50, node_monitor_period_seconds=5, node_lease_seconds=40)


def etcd_argv(bin_dir: Path, paths: ClusterPaths, ports: Ports) -> list[str]:
    client, peer = f"http://127.0.0.1:{ports.etcd_client}", f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=gpuq",
        f"--data-dir={paths.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=gpuq={peer}",
        "--unsafe-no-fsync=true",  # throwaway data: durability costs seconds per test run for nothing
        "--log-level=warn",
    ]


# Benchmarks only (Cluster.up(audit_pod_writes=True)): pod creates and bindings, with the API
# server's microsecond timestamps; object timestamps are truncated to the second.
AUDIT_POD_WRITES_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["create"],
            "resources": [{"group": "", "resources": ["pods", "pods/binding"]}],
        },
        {"level": "None"},
    ],
}


def audit_policy_path(paths: ClusterPaths) -> Path:
    return paths.config / "audit-policy.yaml"


def audit_argv(paths: ClusterPaths) -> list[str]:
    """The API server's flags for the audit log; its policy file comes from write_configs."""
    return [
        f"--audit-policy-file={audit_policy_path(paths)}",
        f"--audit-log-path={paths.log('audit')}",
        "--audit-log-format=json",
    ]


def apiserver_argv(bin_dir: Path, pki: Pki, ports: Ports, audit: ClusterPaths | None = None) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        f"--client-ca-file={pki.ca.cert}",  # authentication: client certificates
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # The `kubernetes` Service cannot point at a loopback address (EndpointSlice validation rejects
        # it), and nothing in-cluster needs to reach the API server through it.
        "--endpoint-reconciler-type=none",
        # Controllers run here as local processes (Kueue's manager, Kubeflow's training-operator) serve
        # their webhooks behind Services without pods: the API server calls them through the
        # Services' EndpointSlices (nothing here routes ClusterIPs), by the name their certificate has.
        "--enable-aggregator-routing=true",
        # GPUQ_APISERVER_PROFILING=1 serves /debug/pprof (how docs/throughput.md profiled a drain).
        f"--profiling={'true' if os.environ.get('GPUQ_APISERVER_PROFILING') == '1' else 'false'}",
        *(audit_argv(audit) if audit is not None else []),
    ]


def controller_manager_argv(
    bin_dir: Path, paths: ClusterPaths, pki: Pki, ports: Ports, timing: Timing
) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={paths.component_kubeconfig('kube-controller-manager')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        f"--cert-dir={paths.config / 'kube-controller-manager-serving'}",
        "--leader-elect=false",  # one instance; election only delays start-up
        "--use-service-account-credentials=true",  # each controller acts as its own service account
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        f"--node-monitor-grace-period={timing.node_monitor_grace_seconds}s",
        f"--node-monitor-period={timing.node_monitor_period_seconds}s",
        "--kube-api-qps=200",
        "--kube-api-burst=400",  # many fake nodes change at once
    ]


def scheduler_config(paths: ClusterPaths, extender_url: str | None = None) -> dict[str, Any]:
    """kube-scheduler's defaults, or with extender_url gpuq's recommended configuration (the seed's
    scores and gpuq's extender at that URL: gpuq.schedconfig)."""
    from gpuq.schedconfig import scheduler_configuration

    base = scheduler_configuration(extender_url) if extender_url else {}
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(paths.component_kubeconfig("kube-scheduler")),
            "qps": 200,
            "burst": 400,
        },
        "leaderElection": {"leaderElect": False},
        **{k: v for k, v in base.items() if k in ("profiles", "extenders")},
    }


def write_scheduler_config(paths: ClusterPaths, extender_url: str | None = None) -> Path:
    path = paths.config / "kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(scheduler_config(paths, extender_url), sort_keys=False))
    return path


def scheduler_argv(bin_dir: Path, paths: ClusterPaths, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        f"--config={paths.config / 'kube-scheduler.yaml'}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        f"--cert-dir={paths.config / 'kube-scheduler-serving'}",
    ]


def kwok_argv(bin_dir: Path, paths: ClusterPaths) -> list[str]:
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={paths.component_kubeconfig('kwok')}",
        f"--config={paths.config / 'kwok.yaml'}",
        # INFO logs every lease renewal (~20 lines/s for 32 nodes); GPUQ_KWOK_LOG_LEVEL=INFO to debug stages.
        f"--v={os.environ.get('GPUQ_KWOK_LOG_LEVEL', 'WARN')}",
    ]


def write_configs(paths: ClusterPaths, timing: Timing, extender_url: str | None = None) -> None:
    paths.config.mkdir(parents=True, exist_ok=True)
    write_scheduler_config(paths, extender_url)
    (paths.config / "kwok.yaml").write_text(kwok_config(timing.node_lease_seconds))
    audit_policy_path(paths).write_text(yaml.safe_dump(AUDIT_POD_WRITES_POLICY, sort_keys=False))
