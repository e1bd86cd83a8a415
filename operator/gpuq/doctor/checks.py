"""`gpuq doctor`'s checks: is the cluster set up for gpuq, and is gpuq working?

Each check returns a Result: pass, warn (works, but probably not what you want), fail (broken: the
detail says what and `fix` says how to repair it), or skip (cannot be checked from here). The exit
code is 0 only when nothing fails.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from gpuq.api import crd, meta
from gpuq.api.gpuqueue import GPUQueueSpec
from gpuq.config import CONFIG_MAP_KEY, CONFIG_MAP_NAME, ConfigError, config_from_config_map
from gpuq.controller.queuehealth import cannot_admit
from gpuq.core.config import SchedulerConfig
from gpuq.devcluster.cli import up_command
from gpuq.schedconfig import GPU_RESOURCE

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
OPERATOR_SA = "system:serviceaccount:gpuq-system:gpuq-operator"  # the Deployment's (manifests/)
OPERATOR_SA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:gpuq-system", "system:authenticated")
# What the operator does with the API (manifests/rbac.yaml): (group, resource, verb, namespace, name).
Access = tuple[str, str, str, str | None, str | None]
OPERATOR_ACCESS: tuple[Access, ...] = (
    *(
        (meta.GROUP, r, v, None, None)
        for r in ("trainingjobs", "gpuqueues")
        for v in ("get", "list", "watch")
    ),
    (meta.GROUP, "trainingjobs/status", "patch", None, None),
    (meta.GROUP, "gpuqueues/status", "patch", None, None),
    *(("", "pods", v, None, None) for v in ("list", "watch", "create", "patch", "delete")),
    ("", "pods/binding", "create", None, None),
    ("", "services", "create", None, None),
    *(("", r, v, None, None) for r in ("nodes", "namespaces") for v in ("list", "watch")),
    ("", "events", "create", None, None),
    ("", "configmaps", "get", "gpuq-system", CONFIG_MAP_NAME),
    ("coordination.k8s.io", "leases", "update", "gpuq-system", "gpuq-operator"),
    ("coordination.k8s.io", "leases", "watch", "gpuq-system", None),
)


@dataclass
class Result:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Context:
    api: Any  # kubernetes.client.ApiClient
    namespace: str = "gpuq-system"
    lease: str = "gpuq-operator"
    extender_url: str | None = None  # None: where the config (extenderBindAddress/Port) says
    metrics_url: str | None = None
    scheduler_config: Path | None = None  # a kube-scheduler config file to read (a dev cluster's)
    dev_cluster: Any = None  # the gpuq.devcluster.Cluster checked, if it is one
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    core: Any = None
    custom: Any = None

    def __post_init__(self) -> None:
        self.core = k8s.CoreV1Api(self.api)
        self.custom = k8s.CustomObjectsApi(self.api)

    @property
    def extender(self) -> str:
        """The extender's URL: --extender-url, else the address the config has it listen on."""
        if self.extender_url:
            return self.extender_url
        host = self.config.extender_bind_address
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"http://{host}:{self.config.extender_port}"

    def whoami(self) -> tuple[str, tuple[str, ...]] | None:
        """The user and groups this client is authenticated as (a SelfSubjectReview); None when the
        server does not say."""
        auth: Any = k8s.AuthenticationV1Api(self.api)
        try:
            info = auth.create_self_subject_review(k8s.V1SelfSubjectReview()).status.user_info
        except k8s.ApiException:
            return None
        return (str(info.username), tuple(info.groups or ())) if info and info.username else None

    def lease_object(self) -> Any:
        """The leader-election Lease, None when there is none."""
        coord: Any = k8s.CoordinationV1Api(self.api)
        try:
            return coord.read_namespaced_lease(self.lease, self.namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise


def check_api(ctx: Context) -> Result:
    try:
        v = k8s.VersionApi(ctx.api).get_code()
    except Exception as exc:  # connection refused, TLS, auth: all mean "not reachable for us"
        return Result(
            "api", FAIL, f"API server not reachable: {exc}", "check KUBECONFIG / the server address"
        )
    return Result("api", PASS, f"Kubernetes {v.git_version}")


NAME_FIELDS = ("kind", "plural", "singular", "shortNames", "categories")
VERSION_FIELDS = ("name", "served", "storage", "schema", "subresources", "additionalPrinterColumns")


def _comparable(obj: dict[str, Any]) -> Any:
    """The parts of a CRD this build defines (the API server adds defaults elsewhere)."""
    spec = obj.get("spec") or {}
    return {
        "names": {
            k: spec.get("names", {}).get(k)
            for k in ("kind", "plural", "singular", "shortNames", "categories")
        },
        "versions": [
            {
                k: v.get(k)
                for k in ("name", "served", "storage", "schema", "subresources", "additionalPrinterColumns")
            }
            for v in spec.get("versions") or []
        ],
    }


def check_crds(ctx: Context) -> Result:
    ext: Any = k8s.ApiextensionsV1Api(ctx.api)
    stale = []
    for kind in crd.KINDS:
        try:
            live = ctx.api.sanitize_for_serialization(ext.read_custom_resource_definition(kind.crd_name))
        except k8s.ApiException as exc:
            if exc.status == 404:
                return Result("crds", FAIL, f"CRD {kind.crd_name} is not installed", crd.INSTALL_COMMAND)
            raise
        ours = json.loads(json.dumps(crd.crd(kind)))
        if _comparable(live) != _comparable(ours):
            stale.append(kind.crd_name)
    if stale:
        return Result(
            "crds",
            FAIL,
            f"{', '.join(stale)} differ from this build of gpuq",
            f"{crd.INSTALL_COMMAND} (from this build's checkout)",
        )
    return Result("crds", PASS, "TrainingJob and GPUQueue CRDs installed and current")


def check_config(ctx: Context) -> Result:
    try:
        cm = ctx.core.read_namespaced_config_map(CONFIG_MAP_NAME, ctx.namespace)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return Result("config", PASS, f"no ConfigMap {CONFIG_MAP_NAME}: the defaults apply")
        raise
    try:
        ctx.config = config_from_config_map(cm.data)
    except ConfigError as exc:
        return Result(
            "config",
            FAIL,
            str(exc).replace("\n", " "),
            f"kubectl -n {ctx.namespace} edit configmap {CONFIG_MAP_NAME} (key {CONFIG_MAP_KEY})",
        )
    return Result("config", PASS, f"ConfigMap {CONFIG_MAP_NAME} parses")


def _age(stamp: Any) -> float | None:
    if stamp is None:
        return None
    if isinstance(stamp, str):
        stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return float((datetime.now(UTC) - stamp).total_seconds())


def _operator_fix(ctx: Context) -> str:
    if ctx.dev_cluster is None:
        start = "kubectl apply -k manifests/ (or gpuq operator run)"
        return f"kubectl -n {ctx.namespace} get pods,lease; start it: {start}"
    # kwok plays a dev cluster's kubelets: the Deployment's pod would look Running and run nothing.
    return f"gpuq operator run --kubeconfig {ctx.dev_cluster.kubeconfig} (from the checkout)"


def check_operator(ctx: Context) -> Result:
    fix = _operator_fix(ctx)
    lease = ctx.lease_object()
    if lease is None:
        return Result("operator", FAIL, f"no Lease {ctx.namespace}/{ctx.lease}: no operator ever led", fix)
    holder, spec = lease.spec.holder_identity, lease.spec
    age = _age(spec.renew_time)
    if not holder:
        return Result("operator", FAIL, "the leader released the Lease and nobody took it", fix)
    if age is None or age > (spec.lease_duration_seconds or 15) + 5:
        return Result("operator", FAIL, f"leader {holder} last renewed {age or 0:.0f}s ago: it is gone", fix)
    detail = f"leader {holder}, renewed {max(age, 0.0):.1f}s ago"  # clocks differ by a little
    metrics = _metrics(ctx, holder)
    if metrics is None:
        return Result("operator", PASS, detail + "; metrics not checked (pass --metrics-url)")
    if isinstance(metrics, str):
        return Result("operator", FAIL, f"{detail}; metrics: {metrics}", "check the leader's --metrics-port")
    return Result("operator", PASS, detail + "; metrics answer")


def _metrics(ctx: Context, holder: str) -> str | bool | None:
    """True when the leader's metrics answer, an error string when not, None when not checkable."""
    if ctx.metrics_url:
        try:
            with urllib.request.urlopen(ctx.metrics_url, timeout=3) as resp:
                return True if b"gpuq_" in resp.read() else "no gpuq_ metrics in the answer"
        except (OSError, urllib.error.URLError) as exc:
            return str(exc)
    pod = holder.rsplit("_", 1)[0]
    try:
        text = ctx.core.connect_get_namespaced_pod_proxy_with_path(f"{pod}:9090", ctx.namespace, "metrics")
    except k8s.ApiException as exc:
        return None if exc.status == 404 else f"pod proxy: {exc.status} {exc.reason}"
    return True if "gpuq_" in str(text) else "no gpuq_ metrics in the answer"


def _gpu_nodes(ctx: Context) -> list[Any]:
    return [
        n
        for n in ctx.core.list_node().items
        if int((n.status.allocatable or {}).get(GPU_RESOURCE, 0) or 0) > 0
    ]


def _post(url: str, body: Any) -> Any:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3) as resp:
        return json.loads(resp.read())


def check_extender(ctx: Context) -> Result:
    if not ctx.config.extender_enabled:
        return Result("extender", SKIP, "extenderEnabled is false in the config")
    names = [n.metadata.name for n in _gpu_nodes(ctx)[:8]]
    pod = {"metadata": {"name": "gpuq-doctor-probe", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {GPU_RESOURCE: "1"}}}]}}  # fmt: skip
    url = ctx.extender
    fix = f"is the operator leading and listening at {url}? (extenderBindAddress/extenderPort)"
    t0 = time.perf_counter()
    try:
        filtered = _post(url + "/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        scores = _post(url + "/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names})
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return Result("extender", FAIL, f"{url} does not answer: {exc}", fix)
    ms = (time.perf_counter() - t0) * 1000
    if not isinstance(filtered, dict) or "NodeNames" not in filtered or not isinstance(scores, list):
        return Result("extender", FAIL, f"{url} answers, but not as an extender", fix)
    return Result("extender", PASS, f"{url} answered filter and prioritize in {ms:.0f} ms")


def _scheduler_configs(ctx: Context) -> list[dict[str, Any]]:
    texts = []
    if ctx.scheduler_config is not None and ctx.scheduler_config.exists():
        texts.append(ctx.scheduler_config.read_text())
    try:
        for cm in ctx.core.list_namespaced_config_map("kube-system").items:
            texts.extend(v for v in (cm.data or {}).values() if "KubeSchedulerConfiguration" in v)
    except k8s.ApiException:
        pass
    out = []
    for text in texts:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "KubeSchedulerConfiguration":
            out.append(doc)
    return out


def check_scheduler(ctx: Context) -> Result:
    configs = _scheduler_configs(ctx)
    if not configs:
        return Result("kube-scheduler", SKIP, "its configuration is not visible from here")
    url = ctx.extender
    for doc in configs:
        for e in doc.get("extenders") or []:
            if e.get("urlPrefix", "").rstrip("/") == url.rstrip("/"):
                return _extender_entry(url, e)
    return Result("kube-scheduler", FAIL, f"its configuration does not call {url}", _scheduler_fix(ctx))


def _scheduler_fix(ctx: Context) -> str:
    if ctx.dev_cluster is None:
        return "gpuq extender config > kube-scheduler.yaml; start kube-scheduler with --config"
    # A dev cluster's kube-scheduler is gpuq's to configure: `up` on the running cluster restarts it.
    command = up_command(ctx.dev_cluster.name, ctx.dev_cluster.shape, ctx.extender)
    return f"{command} (restarts this dev cluster's kube-scheduler)"


def _extender_entry(url: str, e: dict[str, Any]) -> Result:
    managed = [m.get("name") for m in e.get("managedResources") or []]
    if GPU_RESOURCE not in managed:
        fix = f"add managedResources {GPU_RESOURCE} (gpuq extender config)"
        return Result("kube-scheduler", WARN, f"calls {url} but not only for GPU pods", fix)
    if not e.get("ignorable"):
        fix = "set ignorable: true (gpuq extender config)"
        return Result(
            "kube-scheduler", WARN, "the extender is not ignorable: gpuq down stops scheduling", fix
        )
    return Result("kube-scheduler", PASS, f"configured to call {url} for {GPU_RESOURCE}")


@dataclass(frozen=True)
class Subject:
    """Whose permissions the rbac check asks the API server about, and why that identity."""

    user: str
    groups: tuple[str, ...]
    why: str


def operator_subject(ctx: Context) -> Subject:
    """The identity the leader runs as, which it shows on its Lease (an operator run from a
    checkout runs as the kubeconfig's user, in the cluster as its ServiceAccount); else, on a dev
    cluster, this kubeconfig's user, and elsewhere the Deployment's ServiceAccount, saying which."""
    lease = ctx.lease_object()
    annotations = (lease.metadata.annotations or {}) if lease is not None else {}
    user = annotations.get(meta.ANNOTATION_LEADER_USER)
    if user and lease.spec.holder_identity:
        groups = tuple(g for g in annotations.get(meta.ANNOTATION_LEADER_GROUPS, "").split(",") if g)
        return Subject(user, groups, f"the leader {lease.spec.holder_identity} runs as it")
    why = (
        "no operator leads"
        if lease is None
        else "no operator leads: the Lease is released"
        if not lease.spec.holder_identity
        else "the leader does not say whom it runs as"
    )
    me = ctx.whoami() if ctx.dev_cluster is not None else None
    if me is not None:
        # A dev cluster's operator runs from the checkout (the operator check's fix): as this user.
        return Subject(*me, f"{why}; the user of this kubeconfig, as `gpuq operator run` here would be")
    return Subject(OPERATOR_SA, OPERATOR_SA_GROUPS, f"the Deployment's ServiceAccount: {why}")


def check_rbac(ctx: Context) -> Result:
    authz: Any = k8s.AuthorizationV1Api(ctx.api)
    subject = operator_subject(ctx)
    denied = []
    for group, resource, verb, ns, name in OPERATOR_ACCESS:
        res, _, sub = resource.partition("/")
        review = k8s.V1SubjectAccessReview(
            spec=k8s.V1SubjectAccessReviewSpec(
                user=subject.user,
                groups=list(subject.groups),
                resource_attributes=k8s.V1ResourceAttributes(
                    group=group, resource=res, subresource=sub or None, verb=verb, namespace=ns, name=name
                ),
            )
        )
        if not authz.create_subject_access_review(review).status.allowed:
            denied.append(f"{verb} {resource}" + (f" in {ns}" if ns else ""))
    who = f"{subject.user} ({subject.why})"
    if denied:
        fix = "kubectl apply -f manifests/rbac.yaml"
        if subject.user != OPERATOR_SA:
            fix = (
                f"bind {subject.user} to ClusterRole gpuq-operator and Role gpuq-operator-config in "
                "gpuq-system (manifests/rbac.yaml), or run the operator as its ServiceAccount"
            )
        return Result("rbac", FAIL, f"{who} may not: {', '.join(denied)}", fix)
    return Result("rbac", PASS, f"{who} has every permission gpuq uses ({len(OPERATOR_ACCESS)} checked)")


def check_nodes(ctx: Context) -> Result:
    nodes = _gpu_nodes(ctx)
    if not nodes:
        return Result(
            "gpu-nodes",
            FAIL,
            f"no node has allocatable {GPU_RESOURCE}",
            "install the NVIDIA device plugin (or label and patch fake nodes)",
        )
    labels = ctx.config.topology.labels[:-1]
    missing = {lbl: sum(1 for n in nodes if lbl not in (n.metadata.labels or {})) for lbl in labels}
    gpus = sum(int(n.status.allocatable[GPU_RESOURCE]) for n in nodes)
    gaps = {lbl: n for lbl, n in missing.items() if n}
    if gaps:
        what = ", ".join(f"{n} without {lbl}" for lbl, n in gaps.items())
        return Result(
            "gpu-nodes",
            WARN,
            f"{len(nodes)} GPU nodes, {gpus} GPUs; {what}",
            "label nodes with their topology (docs/operations.md) or set topology.levels",
        )
    return Result("gpu-nodes", PASS, f"{len(nodes)} GPU nodes, {gpus} GPUs, topology labels on all")


def check_queues(ctx: Context) -> Result:
    try:
        queues = ctx.custom.list_cluster_custom_object(meta.GROUP, meta.VERSION, "gpuqueues")["items"]
    except k8s.ApiException as exc:
        if exc.status == 404:  # the crds check has said so, with its fix
            return Result("queues", SKIP, "the GPUQueue CRD is not installed")
        raise
    if not queues:
        return Result(
            "queues", WARN, "no GPUQueue: every TrainingJob waits", "kubectl apply -k manifests/samples/"
        )
    invalid, specs = [], {}
    for q in queues:
        name = q["metadata"]["name"]
        try:
            specs[name] = GPUQueueSpec.model_validate(q.get("spec") or {})
        except ValueError as exc:
            invalid.append(f"{name}: {str(exc).splitlines()[0]}")
    if invalid:
        return Result(
            "queues",
            FAIL,
            "invalid: " + "; ".join(invalid),
            "kubectl edit gq <name> (see its condition Active)",
        )
    notes = []
    capacity = sum(int(n.status.allocatable[GPU_RESOURCE]) for n in _gpu_nodes(ctx))
    nominal = sum(s.nominal_gpus for s in specs.values())
    if nominal > capacity:
        notes.append(f"nominal quotas add up to {nominal} GPUs, the nodes have {capacity}")
    cohorts: dict[str, int] = {}
    for s in specs.values():
        if s.cohort:
            cohorts[s.cohort] = cohorts.get(s.cohort, 0) + 1
    notes += [f"cohort {c} has one queue: nothing to lend or borrow" for c, n in cohorts.items() if n == 1]
    cores = {name: s.to_core(name) for name, s in specs.items()}
    for name, q in cores.items():
        why = cannot_admit(q, cores)
        if why:
            notes.append(f"queue {name}: {why}")
    jobs = ctx.custom.list_cluster_custom_object(meta.GROUP, meta.VERSION, "trainingjobs")["items"]
    dangling = sorted({j.get("spec", {}).get("queue") for j in jobs} - set(specs) - {None})
    if dangling:
        notes.append(f"jobs name missing queues: {', '.join(dangling)}")
    detail = f"{len(specs)} queues, {nominal} nominal GPUs of {capacity}"
    if notes:
        return Result("queues", WARN, f"{detail}; " + "; ".join(notes), "review quotas with kubectl get gq")
    return Result("queues", PASS, detail)


CHECKS: tuple[Callable[[Context], Result], ...] = (
    check_api,
    check_crds,
    check_config,
    check_operator,
    check_extender,
    check_scheduler,
    check_rbac,
    check_nodes,
    check_queues,
)


def _one_line(exc: Exception) -> str:
    if isinstance(exc, k8s.ApiException):  # its str() is the whole response, headers and body
        return f"the API server answered {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def run_checks(ctx: Context) -> list[Result]:
    results = []
    for check in CHECKS:
        name = check.__name__.removeprefix("check_").replace("_", "-")
        try:
            r = check(ctx)
        except Exception as exc:  # a check that cannot run fails with the reason, never a traceback
            r = Result(name, FAIL, f"could not run: {_one_line(exc)}")
        results.append(r)
        if r.name == "api" and r.status == FAIL:
            break  # nothing else can be checked
    return results
