"""`Cluster`: start, find, inspect, break and stop a named local control plane.

State lives in ~/.cache/gpuq/clusters/<name>/ (state.json, pki/, config/, logs/, etcd-data/, kubeconfig),
so `down` and `status` work from any process and differently named clusters run side by side.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import signal
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuq.devcluster import components as comp
from gpuq.devcluster import fakenodes
from gpuq.devcluster.binaries import ensure_binaries
from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.paths import ClusterPaths, clusters_root, validate_name
from gpuq.devcluster.pki import Pki, write_kubeconfig
from gpuq.devcluster.processes import ProcessRecord, alive, log_tail, spawn, stop, stop_all
from gpuq.devcluster.rest import ApiError, Rest
from gpuq.devcluster.shape import (
    GPU_RESOURCE,
    HEARTBEAT_OFF,
    HEARTBEAT_ON,
    RACK_LABEL,
    Shape,
)
from gpuq.logs import get_logger


def _log() -> Any:
    # Looked up per call: a logger bound at import time would miss gpuq.logs.configure() run later.
    return get_logger("gpuq.devcluster")


Progress = Callable[[str], None]
OPERATOR_NAMESPACE = "gpuq-system"
_PORT_ATTEMPTS = 3


# Mutating verbs as apiserver_request_total names them (APPLY: a server-side apply patch).
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def api_write_counts(metrics: str) -> Counter[str]:
    """Mutating requests an API server has answered so far, by resource[/subresource], from its
    /metrics text (apiserver_request_total); Lease renewals (node heartbeats, leader election) are
    left out: they follow the clock, not the work."""
    out: Counter[str] = Counter()
    for line in metrics.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
        if labels.get("verb") not in WRITE_VERBS or labels.get("resource") == "leases":
            continue
        sub = labels.get("subresource")
        resource = labels.get("resource", "") + (f"/{sub}" if sub else "")
        out[resource] += int(float(line.rsplit(" ", 1)[1]))
    return out


class PortClash(DevClusterError):
    """A component could not bind its port (someone else took it)."""


class AlreadyRunning(DevClusterError):
    pass


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    log: str


@dataclass(frozen=True)
class ClusterStatus:
    name: str
    server: str
    kubeconfig: Path
    components: tuple[ComponentStatus, ...]
    nodes_total: int | None  # None: the API server did not answer
    nodes_ready: int | None
    gpus_ready: int | None
    not_ready: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        return (
            all(c.alive for c in self.components)
            and self.nodes_total is not None
            and self.nodes_ready == self.nodes_total
        )


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise up/down of one cluster name across processes."""
    clusters_root().mkdir(parents=True, exist_ok=True)
    with open(clusters_root() / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _diagnose(rec: ProcessRecord) -> DevClusterError:
    """One line saying why a component died at start, from the end of its log."""
    tail = log_tail(rec.log)
    clashes = [line for line in tail if "address already in use" in line]
    if clashes:
        port = re.search(r":(\d+): bind", clashes[-1])
        where = f"port {port.group(1)}" if port else "its port"
        return PortClash(
            f"port clash: {rec.name} could not bind {where} (address already in use)", Path(rec.log)
        )
    errors = [line for line in tail if re.search(r"\b(error|fatal|failed|panic)\b|^[EF]\d{4} ", line, re.I)]
    hint = (errors or tail or ["no output"])[-1].strip()
    return DevClusterError(f"{rec.name} exited during start-up: {hint[:200]}", Path(rec.log))


class Cluster:
    """A running local control plane. Create with `Cluster.up(...)`, find with `Cluster.attach(name)`."""

    def __init__(self, paths: ClusterPaths, state: dict[str, Any]) -> None:
        self.paths = paths
        self.state = state

    # -- identity -----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.state["name"])

    @property
    def kubeconfig(self) -> Path:
        return self.paths.kubeconfig

    @property
    def audit_log(self) -> Path:
        """Pod creates and bindings, one JSON line each, when started with audit_pod_writes."""
        return self.paths.log("audit")

    @property
    def server(self) -> str:
        return str(self.state["server"])

    @property
    def shape(self) -> Shape:
        return Shape(**self.state["shape"])

    @property
    def processes(self) -> list[ProcessRecord]:
        return [ProcessRecord.from_json(p) for p in self.state.get("processes", [])]

    @property
    def timings(self) -> dict[str, float]:
        """Seconds from the start of `up` until each milestone (certs, etcd, apiserver, nodes_ready)."""
        return dict(self.state.get("timings", {}))

    def api_writes(self) -> Counter[str]:
        """`api_write_counts` of this cluster's API server now (benchmarks take the difference
        around a phase)."""
        return api_write_counts(self.rest().call("GET", "/metrics")[1])

    def rest(self, timeout: float = 10.0) -> Rest:
        pki = Pki(self.paths.pki)
        return Rest(self.server, pki.ca, pki.client("admin"), timeout=timeout)

    def _reread(self) -> None:
        """Take the state file again before acting on the processes: another handle (`gpuq cluster up
        --scheduler-extender` on this running cluster) may have restarted a component since."""
        with contextlib.suppress(OSError, ValueError):
            self.state = json.loads(self.paths.state.read_text())

    def _save(self) -> None:
        tmp = self.paths.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        tmp.replace(self.paths.state)

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def up(
        cls,
        name: str = "gpuq",
        shape: Shape | None = None,
        *,
        timing: comp.Timing | None = None,
        apiserver_port: int | None = None,
        tie_to_process: bool = False,
        progress: Progress | None = None,
        timeout: float = 120.0,
        extender_url: str | None = None,
        audit_pod_writes: bool = False,
        apiserver_args: tuple[str, ...] = (),
    ) -> Cluster:
        """Start a cluster and return once every fake node is Ready and schedulable.

        extender_url: kube-scheduler calls gpuq's scheduler extender there (gpuq.schedconfig).
        audit_pod_writes: the API server logs every pod create and binding to `audit_log`, with
        microsecond timestamps (benchmarks time drains by it).
        apiserver_args: more kube-apiserver flags (a benchmark matching another control plane's).

        tie_to_process: the processes die with the calling process (and thread), even on SIGKILL
        (Linux); used by test sessions. Without it the cluster outlives the caller until `down`.
        apiserver_port: a fixed port (clear error if taken); by default free ports are picked and,
        should another process grab one first, picked again.
        Raises DevClusterError (one line naming the cause and the log to read); on any failure,
        including Ctrl-C, everything already started is stopped again.
        """
        validate_name(name)
        shape = (shape or Shape()).validate()
        timing = timing or comp.Timing()
        say = progress or (lambda _msg: None)
        paths = ClusterPaths.for_name(name)
        with _locked(name):
            cls._clear_previous(paths, name)
            bin_dir = ensure_binaries()
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                ports = comp.Ports.free(apiserver_port)
                cluster = cls(
                    paths,
                    {
                        "name": name,
                        "shape": asdict(shape),
                        "server": f"https://127.0.0.1:{ports.apiserver}",
                        "ports": ports.to_json(),
                        "bin_dir": str(bin_dir),
                        "owner_pid": os.getpid() if tie_to_process else None,
                        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                        "processes": [],
                        "timings": {},
                    },
                )
                try:
                    cluster._start(
                        bin_dir,
                        ports,
                        timing,
                        tie_to_process,
                        say,
                        timeout,
                        extender_url,
                        audit_pod_writes,
                        apiserver_args,
                    )
                    return cluster
                except PortClash:
                    if apiserver_port is not None or attempt == _PORT_ATTEMPTS:
                        raise
                    say(f"a port was taken while starting (attempt {attempt}); retrying with new ports")
        raise AssertionError("unreachable")

    @staticmethod
    def _clear_previous(paths: ClusterPaths, name: str) -> None:
        """Refuse to replace a live cluster; clean up a dead or abandoned one."""
        if paths.state.exists():
            previous = Cluster(paths, json.loads(paths.state.read_text()))
            live = [p for p in previous.processes if alive(p)]
            owner = previous.state.get("owner_pid")
            abandoned = owner is not None and not _pid_alive(int(owner))
            if live and not abandoned:
                raise AlreadyRunning(
                    f"cluster {name!r} is already running at {previous.server}; "
                    f"stop it first with `gpuq cluster down --name {name}`"
                )
            stop_all(list(reversed(live)))
        shutil.rmtree(paths.root, ignore_errors=True)

    def _start(
        self,
        bin_dir: Path,
        ports: comp.Ports,
        timing: comp.Timing,
        tie: bool,
        say: Progress,
        timeout: float,
        extender_url: str | None = None,
        audit_pod_writes: bool = False,
        apiserver_args: tuple[str, ...] = (),
    ) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout
        paths = self.paths

        def mark(milestone: str) -> None:
            self.state["timings"][milestone] = round(time.monotonic() - t0, 3)
            say(f"{milestone}: {self.state['timings'][milestone]:.1f}s")
            _log().debug(
                "devcluster.milestone",
                cluster=self.name,
                milestone=milestone,
                seconds=self.state["timings"][milestone],
            )

        for d in (paths.root, paths.logs, paths.config):
            d.mkdir(parents=True, exist_ok=True)
        pki = Pki(paths.pki)
        pki.create(comp.IDENTITIES)
        for component in comp.IDENTITIES:
            target = paths.kubeconfig if component == "admin" else paths.component_kubeconfig(component)
            write_kubeconfig(target, self.server, pki.ca.cert, pki.client(component), f"gpuq-{self.name}")
        comp.write_configs(paths, timing, extender_url)
        mark("certs")

        env = dict(os.environ)
        env.pop("KUBECONFIG", None)

        def start(component: str, argv: list[str], extra_env: dict[str, str] | None = None) -> ProcessRecord:
            rec = spawn(
                component, argv, paths.log(component), env={**env, **(extra_env or {})}, tie_to_parent=tie
            )
            self.state["processes"].append(rec.to_json())
            self._save()  # recorded before waiting, so a crash of *this* process still lets `down` clean up
            return rec

        try:
            start("etcd", comp.etcd_argv(bin_dir, paths, ports))
            self._await("etcd", lambda: _http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"), deadline)
            mark("etcd")
            audit = paths if audit_pod_writes else None
            start("kube-apiserver", [*comp.apiserver_argv(bin_dir, pki, ports, audit), *apiserver_args])
            # short probe timeout: a port someone else listens on accepts and then never answers TLS
            probe = self.rest(timeout=1.0)
            self._await("kube-apiserver", lambda: probe.call("GET", "/readyz")[0] == 200, deadline)
            rest = self.rest(timeout=10.0)
            mark("apiserver")
            start("kube-controller-manager", comp.controller_manager_argv(bin_dir, paths, pki, ports, timing))
            start("kube-scheduler", comp.scheduler_argv(bin_dir, paths, ports))
            # kwok reads ~/.kwok/kwok.yaml before --config; a private HOME keeps a user's file out of it.
            start("kwok", comp.kwok_argv(bin_dir, paths), {"HOME": str(paths.config)})
            self._create_nodes(rest)
            mark("nodes_created")
            self._await("kube-scheduler", lambda: _https_ok(ports.scheduler, "/readyz"), deadline)
            self._await(
                "service accounts",
                lambda: rest.call("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
                deadline,
                log_of="kube-controller-manager",
            )
            self._await(
                f"{self.shape.node_count} Ready nodes",
                lambda: self._count_ready(rest),
                deadline,
                log_of="kwok",
            )
            mark("nodes_ready")
        except BaseException:
            stop_all(list(reversed(self.processes)))
            self.paths.state.unlink(missing_ok=True)
            shutil.rmtree(paths.etcd_data, ignore_errors=True)  # logs and config stay for diagnosis
            raise
        _log().info(
            "devcluster.up",
            cluster=self.name,
            server=self.server,
            nodes=self.shape.node_count,
            seconds=self.state["timings"]["nodes_ready"],
        )

    def _await(
        self, what: str, check: Callable[[], bool], deadline: float, log_of: str | None = None
    ) -> None:
        """Poll `check` until it holds; fail fast if any started process died, or at the deadline."""
        while True:
            for rec in self.processes:
                if not alive(rec):
                    raise _diagnose(rec)
            with contextlib.suppress(OSError, ApiError, ValueError):
                if check():
                    return
            if time.monotonic() > deadline:
                culprit = log_of or what
                raise DevClusterError(f"{what} not ready in time", self.paths.log(culprit))
            time.sleep(0.1)

    def _create_nodes(self, rest: Rest) -> None:
        fakenodes.create_nodes(rest, self.shape)
        # The operator's own namespace (its leader-election Lease and config live there), as
        # `kubectl apply -k manifests/` would create it, so `gpuq operator run` works at once.
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
        rest.json("POST", "/api/v1/namespaces", namespace, ok=(409,))

    def _count_ready(self, rest: Rest) -> bool:
        return fakenodes.ready_count(rest) >= self.shape.node_count

    @classmethod
    def attach(cls, name: str = "gpuq") -> Cluster:
        """The running cluster called `name`; DevClusterError if there is none."""
        paths = ClusterPaths.for_name(name)
        try:
            state = json.loads(paths.state.read_text())
        except (OSError, ValueError):
            raise DevClusterError(
                f"no cluster named {name!r} is running; start one with `gpuq cluster up --name {name}`"
            ) from None
        return cls(paths, state)

    @staticmethod
    def remove_leftovers(name: str) -> bool:
        """Delete the files of a cluster that is not running (e.g. logs kept after a failed start)."""
        paths = ClusterPaths.for_name(name)
        with _locked(name):
            if paths.state.exists() or not paths.root.exists():
                return False
            shutil.rmtree(paths.root, ignore_errors=True)
            return True

    @staticmethod
    def reap_abandoned(prefix: str = "", keep_logs_for: float = 86400.0) -> list[str]:
        """Clean up after test sessions that are gone: stop and delete clusters named `prefix*` whose
        owning process died, and delete their kept logs once older than `keep_logs_for` seconds.
        Returns the names of the clusters stopped."""
        reaped = []
        root = clusters_root()
        for path in sorted(root.iterdir()) if root.is_dir() else []:
            if not path.is_dir() or not path.name.startswith(prefix):
                continue
            if not (path / "state.json").exists():
                if time.time() - path.stat().st_mtime > keep_logs_for:
                    Cluster.remove_leftovers(path.name)
                continue
            with contextlib.suppress(DevClusterError, OSError, ValueError):
                cluster = Cluster.attach(path.name)
                owner = cluster.state.get("owner_pid")
                if owner is not None and not _pid_alive(int(owner)):
                    cluster.down()
                    reaped.append(path.name)
        return reaped

    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path) -> Cluster | None:
        """The running dev cluster whose admin kubeconfig is `kubeconfig`, if any."""
        target = kubeconfig.resolve()
        for name in cls.names():
            with contextlib.suppress(DevClusterError):
                cluster = cls.attach(name)
                if cluster.kubeconfig.resolve() == target:
                    return cluster
        return None

    @staticmethod
    def names() -> list[str]:
        root = clusters_root()
        return sorted(p.name for p in root.iterdir() if (p / "state.json").exists()) if root.is_dir() else []

    def down(self, keep_logs: bool = False) -> None:
        """Stop every process of this cluster and delete its state (logs too unless keep_logs)."""
        with _locked(self.name):
            self._reread()
            stop_all(list(reversed(self.processes)))
            if keep_logs:
                for child in self.paths.root.iterdir():
                    if child != self.paths.logs:
                        shutil.rmtree(child) if child.is_dir() else child.unlink()
            else:
                shutil.rmtree(self.paths.root, ignore_errors=True)
        _log().info("devcluster.down", cluster=self.name)

    # -- chaos: break the control plane on purpose -------------------------------------------
    @property
    def _tied(self) -> bool:
        """Started with tie_to_process by this very process: restarted components are tied too."""
        return self.state.get("owner_pid") == os.getpid()

    def _record(self, component: str) -> ProcessRecord:
        for rec in self.processes:
            if rec.name == component:
                return rec
        raise DevClusterError(f"cluster {self.name} has no component {component!r}")

    def restart_component(
        self, component: str, set_flags: dict[str, str] | None = None, timeout: float = 60.0
    ) -> None:
        """Stop a component and start it again (SIGTERM, SIGKILL after 5 s), optionally with some
        `--flag=value`s replaced or added; returns once the API server answers /readyz again (for the
        API server, etcd and kwok alike: nothing else can be checked without it)."""
        self._reread()
        old = self._record(component)
        stop(old)
        argv = [a for a in old.argv if not any(a.startswith(f"--{f}=") for f in set_flags or {})]
        argv += [f"--{f}={v}" for f, v in (set_flags or {}).items()]
        env = {**os.environ, **({"HOME": str(self.paths.config)} if component == "kwok" else {})}
        env.pop("KUBECONFIG", None)
        rec = spawn(component, argv, self.paths.log(component), env=env, tie_to_parent=self._tied)
        self.state["processes"] = [
            rec.to_json() if p["name"] == component else p for p in self.state.get("processes", [])
        ]
        self._save()
        probe = self.rest(timeout=1.0)
        self._await(
            f"{component} after restart",
            lambda: probe.call("GET", "/readyz")[0] == 200,
            time.monotonic() + timeout,
            log_of=component,
        )

    def use_scheduler_extender(self, extender_url: str | None) -> None:
        """Restart kube-scheduler calling gpuq's extender at extender_url (None: its defaults again)."""
        comp.write_scheduler_config(self.paths, extender_url)
        self.restart_component("kube-scheduler")
        port = self.state["ports"]["scheduler"]
        self._await("kube-scheduler", lambda: _https_ok(port, "/readyz"), time.monotonic() + 60)

    @property
    def scheduler_config_path(self) -> Path:
        return self.paths.config / "kube-scheduler.yaml"

    @property
    def scheduler_extender_url(self) -> str | None:
        """Where kube-scheduler calls gpuq's extender (None: it does not)."""
        config = yaml.safe_load(self.scheduler_config_path.read_text()) or {}
        urls = [e.get("urlPrefix") for e in config.get("extenders") or []]
        return urls[0] if urls else None

    def pause_component(self, component: str) -> None:
        """SIGSTOP: the process freezes mid-flight (connections stay open, nothing answers)."""
        os.kill(self._record(component).pid, signal.SIGSTOP)

    def resume_component(self, component: str) -> None:
        os.kill(self._record(component).pid, signal.SIGCONT)

    # -- inspection ---------------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        comps = tuple(ComponentStatus(p.name, p.pid, alive(p), p.log) for p in self.processes)
        total = ready = gpus = None
        not_ready: tuple[str, ...] = ()
        with contextlib.suppress(OSError, ApiError, ValueError):
            nodes = self.rest(timeout=3.0).get("/api/v1/nodes")["items"]
            ready_nodes = [n for n in nodes if fakenodes.node_ready(n)]
            total, ready = len(nodes), len(ready_nodes)
            gpus = sum(int(n["status"].get("allocatable", {}).get(GPU_RESOURCE, 0)) for n in ready_nodes)
            not_ready = tuple(
                sorted((n["metadata"]["name"] for n in nodes if not fakenodes.node_ready(n)), key=_natural)
            )
        return ClusterStatus(self.name, self.server, self.kubeconfig, comps, total, ready, gpus, not_ready)

    def nodes_by_rack(self) -> dict[str, list[str]]:
        """Node names grouped by their gpuq.dev/rack label, racks and nodes in natural order."""
        racks: dict[str, list[str]] = {}
        for node in self.rest().get("/api/v1/nodes")["items"]:
            rack = node["metadata"].get("labels", {}).get(RACK_LABEL)
            if rack is not None:
                racks.setdefault(rack, []).append(node["metadata"]["name"])
        return {
            rack: sorted(names, key=_natural)
            for rack, names in sorted(racks.items(), key=lambda kv: _natural(kv[0]))
        }

    def node_ready(self, node: str) -> bool:
        return fakenodes.node_ready(self._get_node(node))

    # -- faults -------------------------------------------------------------------------------
    def fail_node(self, node: str, wait: float | None = None) -> None:
        """Kill the node's simulated kubelet: kwok stops renewing its lease and status, so the
        controller-manager marks it NotReady (Ready=Unknown) after node-monitor-grace-period and taints
        it unreachable, exactly as for a real dead node. Its pods stay as they were (no kubelet to
        update them). wait: seconds to wait for NotReady (None: return at once)."""
        self._set_heartbeat(node, HEARTBEAT_OFF, expect_ready=False, wait=wait)

    def recover_node(self, node: str, wait: float | None = None) -> None:
        """Restart the node's simulated kubelet: kwok resumes it and marks it Ready again."""
        self._set_heartbeat(node, HEARTBEAT_ON, expect_ready=True, wait=wait)

    def wait_node(self, node: str, ready: bool, timeout: float) -> None:
        try:
            fakenodes.wait_node(self.rest(), node, ready, timeout, self._where)
        except DevClusterError as exc:
            raise DevClusterError(str(exc), self.paths.log("kube-controller-manager")) from None

    @property
    def _where(self) -> str:
        return f"cluster {self.name!r} (see `kubectl get nodes` with KUBECONFIG={self.kubeconfig})"

    def _get_node(self, node: str) -> dict[str, Any]:
        return fakenodes.get_node(self.rest(), node, self._where)

    def _set_heartbeat(self, node: str, value: str, expect_ready: bool, wait: float | None) -> None:
        fakenodes.set_heartbeat(self.rest(), node, value, self._where)
        if wait is not None:
            self.wait_node(node, expect_ready, wait)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def _https_ok(port: int, path: str) -> bool:
    """Health endpoint of a component serving a self-signed certificate on loopback."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=2, context=ctx) as resp:
        return bool(resp.status == 200)
