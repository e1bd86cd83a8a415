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
  runs with --enable-aggregator-routing (every dev cluster does), so it calls webhooks and the
  visibility API through those endpoints instead of ClusterIPs nothing routes here;
- the webhook certificates are Kueue's own internal certificate management (its default): the
  manager makes the CA and the serving certificate for kueue-webhook-service.kueue-system.svc into
  the Secret kueue-webhook-server-cert and injects the CA into its webhook configurations and CRDs,
  as in a cluster. There a kubelet mounts that Secret where the manager reads its certificate; here
  the Secret's keys are copied into a directory of the run (gpuq.peers.local_controller).
The manager runs with the admin kubeconfig (a cluster runs it under its ServiceAccount's RBAC).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from gpuq.core.model import Queue
from gpuq.devcluster.shape import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL
from gpuq.peers.kueue_binaries import KueueBuild
from gpuq.peers.local_controller import LocalController, free_port, host_address
from gpuq.peers.replay_slice import dns_label

NAMESPACE = "kueue-system"
# What a dry run sends through Kueue's webhooks to see that they answer.
_PROBE = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "probe"}}
# The client budget the benches give every controller on the dev cluster (kube-scheduler,
# kube-controller-manager, gpuq's default): Kueue's own default, 50 qps / burst 100, would hold its
# admissions below what the API server takes here and flatter gpuq.
BENCH_CLIENT = {"clientConnection": {"qps": 200, "burst": 400}}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"  # names a WorkloadPriorityClass
PODSET_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
PODSET_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
_SERVICE_PORTS = {  # Service -> the manager's port (by what the Deployment's container names it)
    "kueue-webhook-service": "webhook",
    "kueue-visibility-server": "visibility",
    "kueue-controller-manager-metrics-service": "metrics",
}


class KueueStack(LocalController):
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
        super().__init__(kubectl, kubeconfig, work)
        self.build = build
        self.overrides = dict(config or {})
        self.ports: dict[str, int] = {}
        self.certs = work / "kueue-certs"

    def render_install(self) -> list[dict[str, Any]]:
        """Kueue's install manifests: config/default through kubectl's kustomize."""
        return self.render(self.build.module / "config" / "default")

    def up(self, say: Callable[[str], None] = lambda _m: None, timeout: float = 180.0) -> None:
        docs = self.render_install()
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        config_map = next(
            d for d in docs if d["kind"] == "ConfigMap" and "manager-config" in d["metadata"]["name"]
        )
        config = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
        self.ports = {name: free_port() for name in ("health", "metrics", "webhook", "visibility")}
        address = host_address()
        objects = []
        for d in docs:
            if d["kind"] == "Deployment":
                continue
            if d["kind"] == "Service" and d["metadata"]["name"] in _SERVICE_PORTS:
                d["spec"].pop("selector", None)
            objects.append(d)
        say(f"kueue: applying {len(objects)} objects of its install (config/default, Deployment excepted)")
        self.apply(objects, "kueue-install.yaml")
        self.run_kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        for svc in objects:
            if svc["kind"] == "Service" and svc["metadata"]["name"] in _SERVICE_PORTS:
                port = self.ports[_SERVICE_PORTS[svc["metadata"]["name"]]]
                self.endpoints(svc, {p.get("name", ""): port for p in svc["spec"]["ports"]}, address)
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
        self.launch("Kueue's manager", cmd, "kueue-manager.log", timeout)

    def ready(self, what: str) -> bool:
        self.mount_secret(NAMESPACE, "kueue-webhook-server-cert", self.certs)
        return self.answers(what, self.ports["health"], _PROBE)

    def down(self) -> None:
        """Stop the manager and remove what would call it (webhook configurations, APIServices), so
        the cluster works on without Kueue; its CRDs and objects stay."""
        self.stop()
        for kind, name in (
            ("mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration"),
            ("validatingwebhookconfiguration", "kueue-validating-webhook-configuration"),
            ("apiservice", "v1beta1.visibility.kueue.x-k8s.io"),
            ("apiservice", "v1beta2.visibility.kueue.x-k8s.io"),
        ):
            self.run_kubectl("delete", kind, name, "--ignore-not-found", "--wait=false")
        # Its leader-election Lease too: a manager started again would wait out the old one.
        self.run_kubectl("delete", "lease", "-n", NAMESPACE, "--all", "--ignore-not-found")
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


def priority_class(priority: int) -> str:
    """The WorkloadPriorityClass of a priority (a DNS name, so negative ones spelled out)."""
    return f"priority-{priority}" if priority >= 0 else f"priority-minus-{-priority}"


def kueue_objects(
    queues: Sequence[Queue],
    priorities: set[int],
    namespace: str,
    unbounded: Mapping[str, int | str] | None = None,
) -> list[dict[str, Any]]:
    """What a Kueue user applies for these queues: one Topology and TAS flavor over the GPU nodes, a
    ClusterQueue per GPUQueue (same cohort, quota, borrowing limit, gpuq's default preemption),
    its LocalQueue in `namespace`, a WorkloadPriorityClass per priority. The Topology ends at the
    hostname level, which TAS needs to replace a failed node. `unbounded`: other resources the pods
    request (cpu, memory), each ClusterQueue covering them with the whole cluster's amount, since
    Kueue admits nothing that asks for a resource no ClusterQueue covers and a GPUQueue bounds GPUs
    only."""
    api = API
    levels = [{"nodeLabel": label} for label in (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)]
    out: list[dict[str, Any]] = [
        {"apiVersion": api, "kind": "Topology", "metadata": {"name": "gpus"}, "spec": {"levels": levels}},
        {
            "apiVersion": api,
            "kind": "ResourceFlavor",
            "metadata": {"name": "gpus"},
            "spec": {"nodeLabels": {"type": "kwok"}, "topologyName": "gpus"},
        },
    ]
    for value in sorted(priorities):
        out.append(
            {
                "apiVersion": api,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": priority_class(value)},
                "value": value,
            }
        )
    for q in queues:
        resource: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": q.nominal_gpus}
        if q.borrowing_limit_gpus is not None:
            resource["borrowingLimit"] = q.borrowing_limit_gpus
        others = [{"name": name, "nominalQuota": amount} for name, amount in (unbounded or {}).items()]
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu", *(r["name"] for r in others)],
                    "flavors": [{"name": "gpus", "resources": [resource, *others]}],
                }
            ],
            # gpuq's GPUQueue defaults (withinQueue LowerPriority, reclaimWithinCohort Any) in Kueue's words.
            "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
        }
        if q.cohort:
            spec["cohortName"] = q.cohort
        name = dns_label(q.name)
        out.append({"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec})
        out.append(
            {
                "apiVersion": api,
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": name},
            }
        )
    return out


def create(custom: k8s.CustomObjectsApi, obj: Mapping[str, Any], namespace: str) -> None:
    """Create one object a Kueue user writes: a LocalQueue in `namespace`, the others cluster-wide."""
    group, version = obj["apiVersion"].split("/")
    if obj["kind"] == "LocalQueue":
        custom.create_namespaced_custom_object(group, version, namespace, plural(obj["kind"]), dict(obj))
    else:
        custom.create_cluster_custom_object(group, version, plural(obj["kind"]), dict(obj))


def plural(kind: str) -> str:
    """The resource name of a Kueue kind (Topology -> topologies, WorkloadPriorityClass ->
    workloadpriorityclasses)."""
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + ("es" if lower.endswith("s") else "s")


def indexed_job(
    name: str,
    queue: str,
    replicas: int,
    gpus: int,
    image: str,
    topology: tuple[str, str] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A batch/v1 Indexed Job as a Kueue user writes one for a gang of `replicas` workers of `gpus`
    GPUs (and `requests` of other resources each): the queue-name label, and for a multi-pod gang
    the podset topology annotation (`topology`: ("preferred"|"required", node label)). Kueue
    suspends it until admitted."""
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
                            "resources": {"requests": {**limits, **(requests or {})}, "limits": limits},
                        }
                    ],
                },
            },
        },
    }
