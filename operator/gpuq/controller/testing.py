"""Helpers for e2e tests, the demo and benchmarks: install the CRDs, run the operator as a real
process (so tests can kill it), and a small client for queues and jobs.

    from gpuq.controller.testing import GpuqClient, OperatorProcess, install_crds
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from gpuq.api import crd, meta
from gpuq.devcluster.processes import die_with_parent
from gpuq.devcluster.testing import wait_for

DEFAULT_IMAGE = "registry.k8s.io/pause:3.10"


def install_crds(api: k8s.ApiClient, timeout: float = 30.0) -> None:
    """Create or update the gpuq CRDs (rendered from gpuq.api) and wait until they are served."""
    ext: Any = k8s.ApiextensionsV1Api(api)
    for kind in crd.KINDS:
        body = yaml.safe_load(crd.render(kind))
        try:
            current = ext.read_custom_resource_definition(kind.crd_name)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(kind.crd_name, body)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(body)

    def established() -> bool:
        for kind in crd.KINDS:
            conds = ext.read_custom_resource_definition(kind.crd_name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conds):
                return False
        return True

    wait_for(established, timeout, "gpuq CRDs established")


def ensure_namespace(core: k8s.CoreV1Api, name: str) -> None:
    """Create the namespace unless it exists."""
    try:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise


class ContainerImage:
    """Runs `gpuq` from the operator image instead of this interpreter, as the Deployment would:
    non-root (the image's user), read-only root filesystem, host network (to reach a local API
    server), the kubeconfig and config mounted read-only at the same paths."""

    def __init__(self, engine: str, image: str) -> None:
        """`engine`: a command line, e.g. what hack/container-engine.sh prints."""
        self.engine, self.image = shlex.split(engine), image
        self.name = f"gpuq-operator-{os.getpid()}-{id(self):x}"

    def command(self, args: list[str], files: list[Path], env: Mapping[str, str]) -> list[str]:
        run = [*self.engine, "run", "--rm", "--name", self.name, "--network", "host", "--read-only"]
        run += ["--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        for f in files:
            run += ["-v", f"{f}:{f}:ro"]
        for k, v in env.items():
            run += ["-e", f"{k}={v}"]
        return [*run, self.image, *args]

    def kill(self) -> None:
        subprocess.run([*self.engine, "kill", "-s", "KILL", self.name], capture_output=True, timeout=60)

    def remove(self) -> None:
        subprocess.run([*self.engine, "rm", "-f", self.name], capture_output=True, timeout=60)


class OperatorProcess:
    """`gpuq operator run` in a child process, logging to a file."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        config_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
        log_level: str = "INFO",
        env: dict[str, str] | None = None,
        image: ContainerImage | None = None,
        tie_to_parent: bool = False,
    ) -> None:
        """tie_to_parent: the operator dies with the thread that starts it, even on SIGKILL
        (Linux), as the local cluster's processes can; a killed benchmark leaves no operator behind."""
        self.tie_to_parent = tie_to_parent
        self.env = dict(env or {})
        self.image = image
        self.log_level = log_level
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.config_path = config_path
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        args = ["--log-level", self.log_level, "operator", "run", "--metrics-port", "0"]
        args += ["--kubeconfig", str(self.kubeconfig), *self.extra_args]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        files = [self.kubeconfig, *([self.config_path] if self.config_path else [])]
        if self.image is not None:
            args = self.image.command(args, files, self.env)
        else:
            args = [sys.executable, "-m", "gpuq.cli", *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        tie = die_with_parent if self.tie_to_parent and sys.platform == "linux" else None
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=tie)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the operator gets no chance to clean up, as in a node or OOM kill."""
        if self.proc is not None and self.alive:
            if self.image is not None:  # the container, not just the engine's client
                self.image.kill()
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: a process that stalls (GC pause, CPU starvation, a hung VM) yet lives on."""
        if self.proc is not None and self.alive:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.alive:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or not self.alive:
            return
        self.proc.send_signal(signal.SIGTERM)  # the engine's client forwards it to the container
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.image is not None:
            self.image.remove()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def owner_pod_template(
    gpus: int, annotations: Mapping[str, str] | None = None, container: str = "train"
) -> dict[str, Any]:
    """The pod template of a Job or PyTorchJob that opted in to gpuq: its pods ask for the gpuq
    scheduler and `gpus` GPUs each (docs/existing-workloads.md)."""
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": "gpuq",
            "containers": [{"name": container, "image": "trainer:1", "resources": {"limits": limits}}],
        },
    }


def indexed_job_body(
    name: str,
    queue: str,
    workers: int,
    gpus: int,
    annotations: Mapping[str, str] | None = None,
    backoff_limit: int = 6,
) -> dict[str, Any]:
    """A batch/v1 Indexed Job as a pipeline emits it, plus the opt-in: the queue label and gpuq as
    its pods' scheduler."""
    template = owner_pod_template(gpus, annotations)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {meta.LABEL_QUEUE: queue}},
        "spec": {
            "completionMode": "Indexed",
            "completions": workers,
            "parallelism": workers,
            "backoffLimit": backoff_limit,
            "template": template,
        },
    }


def pytorchjob_body(
    name: str,
    queue: str,
    workers: int,
    gpus: int,
    annotations: Mapping[str, str] | None = None,
    priority: int | None = None,
    restart: str = "OnFailure",
) -> dict[str, Any]:
    """A Kubeflow PyTorchJob (one Master, `workers - 1` Workers) as its users write it, plus the
    opt-in. With restartPolicy Never the training-operator fails the job when a pod is lost (a node
    failure); OnFailure lets it make the pod again, and gpuq fail the gang over."""

    def replicas(count: int) -> dict[str, Any]:
        template = owner_pod_template(gpus, annotations, container="pytorch")
        return {"replicas": count, "restartPolicy": restart, "template": template}

    labels = {meta.LABEL_QUEUE: queue}
    if priority is not None:
        labels[meta.LABEL_PRIORITY] = str(priority)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {"pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(workers - 1)}},
    }


class GpuqClient:
    """TrainingJobs and GPUQueues through the official client, as plain dicts."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self.custom: Any = k8s.CustomObjectsApi(api)  # returns plain dicts
        self.core = k8s.CoreV1Api(api)

    # queues
    def create_queue(self, name: str, nominal: int, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": meta.API_VERSION,
            "kind": "GPUQueue",
            "metadata": {"name": name},
            "spec": {"nominalGPUs": nominal, **spec},
        }
        result: dict[str, Any] = self.custom.create_cluster_custom_object(
            meta.GROUP, meta.VERSION, "gpuqueues", body
        )
        return result

    def queue(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.get_cluster_custom_object(
            meta.GROUP, meta.VERSION, "gpuqueues", name
        )
        return result

    def patch_queue(self, name: str, spec: Mapping[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(
            meta.GROUP, meta.VERSION, "gpuqueues", name, {"spec": dict(spec)}
        )

    def delete_queue(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "gpuqueues", name)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise

    # jobs
    @staticmethod
    def job_body(
        name: str,
        queue: str,
        replicas: int,
        gpus: int,
        annotations: Mapping[str, str] | None = None,
        image: str = DEFAULT_IMAGE,
        **spec: Any,
    ) -> dict[str, Any]:
        template = {
            "metadata": {"annotations": dict(annotations or {})},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "trainer", "image": image}]},
        }
        workers = {
            "replicas": replicas,
            "gpusPerWorker": gpus,
            "template": template,
            **spec.pop("workers", {}),
        }
        return {
            "apiVersion": meta.API_VERSION,
            "kind": "TrainingJob",
            "metadata": {"name": name},
            "spec": {"queue": queue, "workers": workers, **spec},
        }

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "trainingjobs", dict(body)
        )
        return result

    def submit(
        self, namespace: str, name: str, queue: str, replicas: int, gpus: int, **kw: Any
    ) -> dict[str, Any]:
        return self.create_job(namespace, self.job_body(name, queue, replicas, gpus, **kw))

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "trainingjobs", name
        )
        return result

    def jobs(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "trainingjobs"
        )["items"]
        return items

    def patch_job(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.patch_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "trainingjobs", name, dict(patch)
        )
        return result

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                meta.GROUP, meta.VERSION, namespace, "trainingjobs", name
            )
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise

    def clear_namespace(self, namespace: str, timeout: float = 60) -> None:
        """Delete every TrainingJob and pod of the namespace and wait until the pods (and so the GPUs
        they hold) are gone; the namespace stays."""
        for job in self.jobs(namespace):
            self.delete_job(namespace, job["metadata"]["name"])
        self.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        pods = self.core.list_namespaced_pod
        wait_for(lambda: not pods(namespace).items, timeout, f"pods of {namespace} gone")

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.job(namespace, name).get("status") or {}
        return result

    def wait_phase(
        self, namespace: str, name: str, phases: str | tuple[str, ...], timeout: float = 60
    ) -> dict[str, Any]:
        wanted = (phases,) if isinstance(phases, str) else phases

        def check() -> dict[str, Any] | None:
            st = self.status(namespace, name)
            return st if st.get("phase") in wanted else None

        result: dict[str, Any] = wait_for(
            check, timeout, f"TrainingJob {namespace}/{name} in {'/'.join(wanted)}"
        )
        return result

    def wait_status(
        self, namespace: str, name: str, check: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        result: dict[str, Any] = wait_for(
            lambda: (lambda s: s if check(s) else None)(self.status(namespace, name)), timeout, what
        )
        return result

    def pods(self, namespace: str, job: str) -> list[Any]:
        return list(
            self.core.list_namespaced_pod(namespace, label_selector=f"{meta.LABEL_JOB_NAME}={job}").items
        )

    def events(self, namespace: str, name: str) -> list[Any]:
        return [e for e in self.core.list_namespaced_event(namespace).items if e.involved_object.name == name]

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        for c in self.status(namespace, name).get("conditions") or []:
            if c.get("type") == type_:
                found: dict[str, Any] = c
                return found
        return None
