"""A controller that a cluster runs as a Deployment (Kueue's manager, Kubeflow's training-operator),
run on a gpuq local cluster as a local process, installed otherwise as its users install it.

There is no container runtime on a local cluster, so of an install's manifests everything is
applied but the Deployment, whose arguments the process gets instead. Its webhook Services keep
their names, without a selector: an EndpointSlice per Service points them at this host's address
(not loopback, which EndpointSlices refuse), and the dev cluster's API server runs with
--enable-aggregator-routing, so it calls the webhooks through those endpoints by the Service's DNS
name, which is what the controller's own certificate management issues its certificate for. What a
kubelet does for the Deployment's secret volume (the webhook certificate as files) `mount_secret`
does here.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.processes import die_with_parent
from gpuq.devcluster.testing import wait_for


def host_address() -> str:
    """This host's first global IPv4 address: where the API server reaches a local controller."""
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
        "a local controller's webhooks need a non-loopback IPv4 address on this host for the API server "
        "to reach (EndpointSlices refuse 127.0.0.0/8); none found by `ip -4 addr show scope global`"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port: int = s.getsockname()[1]
        return port


class LocalController:
    """Install a controller's manifests on the cluster of `kubeconfig` and run it as a process."""

    def __init__(self, kubectl: Path, kubeconfig: Path, work: Path) -> None:
        self.kubectl = kubectl
        self.kubeconfig = kubeconfig
        self.work = work
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = work / "controller.log"

    def run_kubectl(self, *args: str, stdin: str | None = None) -> str:
        cmd = [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise DevClusterError(f"kubectl {' '.join(args[:3])}: {res.stderr.strip()[-500:]}")
        return res.stdout

    def render(self, kustomization: Path) -> list[dict[str, Any]]:
        """An install's manifests: a kustomization rendered by kubectl's kustomize."""
        out = subprocess.run(
            [str(self.kubectl), "kustomize", str(kustomization)], capture_output=True, text=True, timeout=120
        )
        if out.returncode != 0:
            raise DevClusterError(f"kubectl kustomize {kustomization}: {out.stderr.strip()[-500:]}")
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    def apply(self, objects: list[dict[str, Any]], name: str) -> None:
        """Server-side apply of `objects` (written to the work directory as `name`)."""
        self.work.mkdir(parents=True, exist_ok=True)
        manifest = self.work / name
        manifest.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        self.run_kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))

    def endpoints(self, service: Mapping[str, Any], ports: Mapping[str, int], address: str) -> None:
        """An EndpointSlice that points `service` (applied without a selector) at `address`, each
        of its ports by name at the local port `ports` gives (its own port where none is given)."""
        name, namespace = service["metadata"]["name"], service["metadata"].get("namespace", "default")
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-local",
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "gpuq-local-controller",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [
                {"name": n, "port": ports.get(n, p["port"]), "protocol": "TCP"}
                for p in service["spec"]["ports"]
                for n in [p.get("name", "")]
            ],
        }
        manifest = yaml.safe_dump(slice_)
        self.run_kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=manifest)

    def mount_secret(self, namespace: str, secret: str, directory: Path) -> bool:
        """What the kubelet's secret volume does: the Secret's keys as files in `directory`, once
        the controller has written a certificate into it (and again whenever it changed). True
        when the files hold one."""
        try:
            raw = self.run_kubectl("get", "secret", "-n", namespace, secret, "-o", "json")
        except DevClusterError:
            return False
        data = (yaml.safe_load(raw) or {}).get("data") or {}
        if "tls.crt" not in data:
            return False
        directory.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            content = base64.b64decode(value)
            path = directory / key
            if path.exists() and path.read_bytes() == content:
                continue
            tmp = directory / f".{key}.tmp"
            tmp.write_bytes(content)
            tmp.replace(path)
        return True

    def launch(
        self, what: str, cmd: list[str], log_name: str, timeout: float, env: Mapping[str, str] | None = None
    ) -> None:
        """Start the controller and wait until `ready` says it serves; `down` if it never does."""
        self.start(cmd, log_name, env)
        try:
            wait_for(lambda: self.ready(what), timeout, f"{what} ready and its webhooks answering", 0.5)
        except TimeoutError:
            self.down()
            raise DevClusterError(f"{what} did not get ready; its log: {self.log_path}") from None

    def ready(self, what: str) -> bool:
        """Whether the controller serves (see `answers`); raises when it exited."""
        raise NotImplementedError

    def answers(self, what: str, health_port: int, probe: Mapping[str, Any]) -> bool:
        """Its readiness probe passes and its webhooks answer the API server: a server-side dry run
        of `probe` goes through them (the CA injected, the endpoints routed)."""
        if self.exited():
            raise DevClusterError(f"{what} exited; its log: {self.log_path}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2).status != 200:
                return False
        except OSError:
            return False
        return self.admits(probe)

    def admits(self, probe: Mapping[str, Any]) -> bool:
        """A server-side dry run of creating `probe` passes (its webhooks, if any, answered)."""
        try:
            self.run_kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(dict(probe)))
        except DevClusterError:
            return False
        return True

    def start(self, cmd: list[str], log_name: str, env: Mapping[str, str] | None = None) -> None:
        """Start the controller, tied to this process: a run killed midway leaves none behind."""
        self.log_path = self.work / log_name
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
                env={**os.environ, **(env or {})},
                cwd=self.work,
            )

    def exited(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def down(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
