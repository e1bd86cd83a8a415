"""Kueue's manager installed as its users install it, on a gpuq local cluster, for the benches that
run training as a Kueue user does (batch/v1 Jobs + Kueue + the Job controller + kube-scheduler).

Kueue's release manifests are its config/default rendered by kustomize; here `kubectl kustomize`
renders the same from the module's config/ (hack/kueue.sh copies it), and every object is applied
but the Deployment: there is no container runtime, so the manager runs as a local process with the
Deployment's arguments and the configuration of its ConfigMap. What changes, and why:
- the ports (health, metrics, webhook, visibility server) are free ones picked here, so that two
  runs or other servers on the machine do not collide;
- the Services keep their names, but without a selector: an EndpointSlice per Service points them
  at this host's address (not loopback, which EndpointSlices refuse), and the cluster's API server
  runs with --enable-aggregator-routing, so it calls webhooks and the visibility API through those
  endpoints instead of ClusterIPs nothing routes here;
- the webhook certificates are Kueue's own internal certificate management (its default): the
  manager makes the CA and the serving certificate for kueue-webhook-service.kueue-system.svc into
  the Secret kueue-webhook-server-cert and injects the CA into its webhook configurations and CRDs,
  as in a cluster. There a kubelet mounts that Secret where the manager reads its certificate; here
  this class copies the Secret's keys into a directory of the run (`_mount_secret`).
The manager runs with the admin kubeconfig (a cluster runs it under its ServiceAccount's RBAC).
"""

from __future__ import annotations

import base64
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.processes import die_with_parent
from gpuq.devcluster.testing import wait_for
from gpuq.peers.kueue_binaries import KueueBuild

NAMESPACE = "kueue-system"
# The API server must route webhooks and aggregated APIs through endpoints (see the module doc).
APISERVER_ARGS = ("--enable-aggregator-routing=true",)
# The client budget the benches give every controller on the dev cluster (kube-scheduler,
# kube-controller-manager, gpuq's default): Kueue's own default, 50 qps / burst 100, would hold its
# admissions below what the API server takes here and flatter gpuq.
BENCH_CLIENT = {"clientConnection": {"qps": 200, "burst": 400}}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PODSET_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
PODSET_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
_SERVICE_PORTS = {  # Service -> the manager's port (by what the Deployment's container names it)
    "kueue-webhook-service": "webhook",
    "kueue-visibility-server": "visibility",
    "kueue-controller-manager-metrics-service": "metrics",
}


def host_address() -> str:
    """This host's first global IPv4 address: where the API server reaches the manager."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    raise DevClusterError(
        "the Kueue manager needs a non-loopback IPv4 address on this host for the API server to reach "
        "its webhooks (EndpointSlices refuse 127.0.0.0/8); none found by `ip -4 addr show scope global`"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port: int = s.getsockname()[1]
        return port


class KueueStack:
    """Install (`up`) and remove (`down`) Kueue's manager on the cluster of `kubeconfig`."""

    def __init__(
        self,
        build: KueueBuild,
        kubectl: Path,
        kubeconfig: Path,
        work: Path,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        """`config`: keys merged over the ConfigMap's Configuration (e.g. waitForPodsReady)."""
        self.build = build
        self.kubectl = kubectl
        self.kubeconfig = kubeconfig
        self.work = work
        self.overrides = dict(config or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}
        self.certs = work / "kueue-certs"

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        cmd = [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise DevClusterError(f"kubectl {' '.join(args[:3])}: {res.stderr.strip()[-500:]}")
        return res.stdout

    def render(self) -> list[dict[str, Any]]:
        """Kueue's install manifests: config/default through kubectl's kustomize."""
        out = subprocess.run(
            [str(self.kubectl), "kustomize", str(self.build.module / "config" / "default")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            raise DevClusterError(f"kubectl kustomize of Kueue's config/default: {out.stderr.strip()[-500:]}")
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    def up(self, say: Callable[[str], None] = lambda _m: None, timeout: float = 180.0) -> None:
        docs = self.render()
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        config_map = next(
            d for d in docs if d["kind"] == "ConfigMap" and "manager-config" in d["metadata"]["name"]
        )
        config = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
        self.ports = {name: _free_port() for name in ("health", "metrics", "webhook", "visibility")}
        address = host_address()
        objects = []
        for d in docs:
            if d["kind"] == "Deployment":
                continue
            if d["kind"] == "Service" and d["metadata"]["name"] in _SERVICE_PORTS:
                d["spec"].pop("selector", None)
            objects.append(d)
        self.work.mkdir(parents=True, exist_ok=True)
        manifest = self.work / "kueue-install.yaml"
        manifest.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        say(f"kueue: applying {len(objects)} objects of its install (config/default, Deployment excepted)")
        self._kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
        self._kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        self._endpoints(objects, address)
        config["health"] = {**config.get("health", {}), "healthProbeBindAddress": f":{self.ports['health']}"}
        config["metrics"] = {**config.get("metrics", {}), "bindAddress": f":{self.ports['metrics']}"}
        certs = self.work / "kueue-certs"
        shutil.rmtree(certs, ignore_errors=True)
        config["webhook"] = {
            **config.get("webhook", {}),
            "port": self.ports["webhook"],
            "certDir": str(certs),
        }
        config["visibilityServer"] = {"bindPort": self.ports["visibility"]}
        # In a pod both come from the service account's namespace file; out of one they must be said.
        config["namespace"] = NAMESPACE
        config["leaderElection"] = {**config.get("leaderElection", {}), "resourceNamespace": NAMESPACE}
        config.update(self.overrides)
        config_path = self.work / "kueue-config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        args = [a for a in container.get("args", []) if not a.startswith("--config=")]
        cmd = [str(self.build.manager), f"--config={config_path}", f"--kubeconfig={self.kubeconfig}", *args]
        say(f"kueue: starting the manager ({' '.join(args)}; webhooks at {address}:{self.ports['webhook']})")
        with (self.work / "kueue-manager.log").open("ab") as log:
            # Tied to this process: a bench killed mid-run must not leave Kueue's manager behind.
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            )
        try:
            wait_for(self._ready, timeout, "Kueue's manager ready and its webhooks answering", 0.5)
        except TimeoutError:
            self.down()
            raise DevClusterError(
                f"Kueue's manager did not get ready; its log: {self.work / 'kueue-manager.log'}"
            ) from None

    def _endpoints(self, objects: list[dict[str, Any]], address: str) -> None:
        for svc in objects:
            name = svc["metadata"]["name"]
            if svc["kind"] != "Service" or name not in _SERVICE_PORTS:
                continue
            port = self.ports[_SERVICE_PORTS[name]]
            slice_ = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-local",
                    "namespace": NAMESPACE,
                    "labels": {
                        "kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "gpuq-bench",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                "ports": [
                    {"name": p.get("name", ""), "port": port, "protocol": "TCP"} for p in svc["spec"]["ports"]
                ],
            }
            self._kubectl(
                "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump(slice_)
            )

    def _mount_secret(self) -> None:
        """What the kubelet's secret volume does for the Deployment: the webhook Secret's keys as files
        in the manager's certificate directory, once the manager has written them."""
        try:
            raw = self._kubectl("get", "secret", "-n", NAMESPACE, "kueue-webhook-server-cert", "-o", "json")
        except DevClusterError:
            return
        data = (yaml.safe_load(raw) or {}).get("data") or {}
        if "tls.crt" not in data or (self.certs / "tls.crt").exists():
            return
        self.certs.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            tmp = self.certs / f".{key}.tmp"
            tmp.write_bytes(base64.b64decode(value))
            tmp.replace(self.certs / key)

    def _ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise DevClusterError(f"Kueue's manager exited; its log: {self.work / 'kueue-manager.log'}")
        self._mount_secret()
        try:
            url = f"http://127.0.0.1:{self.ports['health']}/readyz"
            if urllib.request.urlopen(url, timeout=2).status != 200:
                return False
        except OSError:
            return False
        # The webhooks answer: a server-side dry run of a ResourceFlavor goes through them.
        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "probe"},
        }
        try:
            self._kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(probe))
        except DevClusterError:
            return False
        return True

    def down(self) -> None:
        """Stop the manager and remove what would call it (webhook configurations, APIServices), so
        the cluster works on without Kueue; its CRDs and objects stay."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for kind, name in (
            ("mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration"),
            ("validatingwebhookconfiguration", "kueue-validating-webhook-configuration"),
            ("apiservice", "v1beta1.visibility.kueue.x-k8s.io"),
            ("apiservice", "v1beta2.visibility.kueue.x-k8s.io"),
        ):
            self._kubectl("delete", kind, name, "--ignore-not-found", "--wait=false")
        # Its leader-election Lease too: a manager started again would wait out the old one.
        self._kubectl("delete", "lease", "-n", NAMESPACE, "--all", "--ignore-not-found")
        time.sleep(0.5)  # let the API server's webhook informer drop them


# -- the objects a Kueue user writes for training -------------------------------------------------
API = "kueue.x-k8s.io/v1beta2"


def queue_objects(
    name: str, namespace: str, gpus: int, levels: tuple[str, ...], node_labels: Mapping[str, str], held: bool
) -> list[dict[str, Any]]:
    """A TAS ResourceFlavor over the nodes with `node_labels`, its Topology (`levels`: node labels,
    outermost first), a ClusterQueue of `gpus` nvidia.com/gpu (held: stopPolicy Hold, admitting
    nothing until released) and the LocalQueue of the same name in `namespace`."""
    cq_spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}],
            }
        ],
    }
    if held:
        cq_spec["stopPolicy"] = "Hold"
    return [
        {"apiVersion": API, "kind": "Topology", "metadata": {"name": name},
         "spec": {"levels": [{"nodeLabel": lvl} for lvl in levels]}},
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name},
         "spec": {"nodeLabels": dict(node_labels), "topologyName": name}},
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": cq_spec},
        {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
         "spec": {"clusterQueue": name}},
    ]  # fmt: skip


def plural(kind: str) -> str:
    """The resource name of a Kueue kind (Topology -> topologies)."""
    lower = kind.lower()
    return lower[:-1] + "ies" if lower.endswith("y") else lower + "s"


def indexed_job(
    name: str,
    queue: str,
    replicas: int,
    gpus: int,
    image: str,
    topology: tuple[str, str] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A batch/v1 Indexed Job as a Kueue user writes one for a gang of `replicas` workers of `gpus`
    GPUs: the queue-name label, and for a multi-pod gang the podset topology annotation
    (`topology`: ("preferred"|"required", node label)). Kueue suspends it until admitted."""
    annotations = dict(pod_annotations or {})
    if topology is not None:
        annotations[PODSET_PREFERRED if topology[0] == "preferred" else PODSET_REQUIRED] = topology[1]
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": replicas,
            "completions": replicas,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": image,
                            "resources": {"requests": limits, "limits": limits},
                        }
                    ],
                },
            },
        },
    }
