"""The API calls of the CLI, with errors a person can act on (no tracebacks)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpuq.api import crd, meta
from gpuq.config import CONFIG_MAP_NAME, ConfigError, config_from_config_map
from gpuq.controller.gangs.record import suspend_patch
from gpuq.controller.gangs.resolve import KINDS, collection_path
from gpuq.core.config import SchedulerConfig

PLURALS = {"TrainingJob": "trainingjobs", "GPUQueue": "gpuqueues"}


class CtlError(Exception):
    """A failure to report in one line (exit code 2 for the cluster, 1 for the object)."""

    def __init__(self, message: str, code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status  # the HTTP status it comes from, if any


class Client:
    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        cfg = k8s.Configuration()
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
        except (k8s_config.ConfigException, OSError) as exc:
            raise CtlError(f"no usable kubeconfig ({exc}); set KUBECONFIG or pass --kubeconfig", 2) from None
        # A missing cluster should fail fast and in one line: no retries (the pool reads this when it
        # is built; with retries, urllib3 also prints a "Retrying ..." warning for each).
        cfg.retries = 0
        self.api: Any = k8s.ApiClient(cfg)  # the client library is untyped
        self.server = cfg.host

    def _get(self, path: str) -> Any:
        return self._call("GET", path)

    def _patch(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("PATCH", path, body)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        try:
            request = self.api.param_serialize(
                method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            resp = self.api.call_api(*request, _request_timeout=15)
            data = resp.read()
            if not 200 <= resp.status < 300:
                raise k8s.ApiException(
                    status=resp.status, reason=resp.reason, body=data.decode(errors="replace")
                )
        except k8s.ApiException as exc:
            raise self._api_error(exc, path) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise CtlError(f"cannot reach the API server at {self.server}: {_short(exc)}", 2) from None
        return json.loads(data)

    def _api_error(self, exc: k8s.ApiException, path: str) -> CtlError:
        group = f"/apis/{meta.GROUP}/{meta.VERSION}"
        if exc.status == 404 and path.startswith(group) and (path == group or not self._crds_installed()):
            return CtlError(f"the gpuq CRDs are not installed in this cluster: {crd.INSTALL_COMMAND}", 2)
        try:
            message = json.loads(exc.body or "{}").get("message") or exc.reason
        except ValueError:
            message = exc.reason
        return CtlError(f"{message} (HTTP {exc.status})", 2 if exc.status in (401, 403) else 1, exc.status)

    def _crds_installed(self) -> bool:
        try:
            self._call("GET", f"/apis/{meta.GROUP}/{meta.VERSION}")
        except CtlError:
            return False
        return True

    # ---- reads ----------------------------------------------------------------------------------
    def items(self, path: str, kind: str, api_version: str) -> list[dict[str, Any]]:
        """A list's items, each with the kind and apiVersion the API server leaves out of list items."""
        return [{"kind": kind, "apiVersion": api_version, **o} for o in self._get(path)["items"]]

    def jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        scope = f"/namespaces/{namespace}" if namespace else ""
        return self.items(
            f"/apis/{meta.GROUP}/{meta.VERSION}{scope}/trainingjobs", "TrainingJob", meta.API_VERSION
        )

    def gang_owners(self) -> list[dict[str, Any]]:
        """Indexed Jobs and PyTorchJobs that opted in (gpuq.dev/queue): gangs gpuq did not create.
        A kind the cluster does not serve (no training-operator) or this user may not read is left
        out, as the operator leaves it out."""
        out: list[dict[str, Any]] = []
        for kind in KINDS.values():
            path = f"{collection_path(kind)}?labelSelector={quote(meta.LABEL_QUEUE)}"
            out += self._optional(partial(self.items, path, kind.kind, kind.api_version))
        return out

    def gangs(self) -> list[dict[str, Any]]:
        """gpuq's records of those gangs (Gang objects), where the CRD is installed."""
        path = f"/apis/{meta.GROUP}/{meta.VERSION}/gangs"
        return self._optional(lambda: self.items(path, "Gang", meta.API_VERSION))

    def _optional(self, read: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        try:
            return read()
        except CtlError as exc:
            if exc.status in (403, 404):
                return []
            raise

    def queues(self) -> list[dict[str, Any]]:
        return self.items(f"/apis/{meta.GROUP}/{meta.VERSION}/gpuqueues", "GPUQueue", meta.API_VERSION)

    def nodes(self) -> list[dict[str, Any]]:
        return self.items("/api/v1/nodes", "Node", "v1")

    def pods(self) -> list[dict[str, Any]]:
        return self.items("/api/v1/pods", "Pod", "v1")

    def namespaces(self) -> list[dict[str, Any]]:
        return self.items("/api/v1/namespaces", "Namespace", "v1")

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{namespace}/trainingjobs/{name}"
        try:
            return dict(self._get(path))
        except CtlError as exc:
            if exc.status == 404:
                raise CtlError(f"trainingjob {namespace}/{name} not found") from None
            raise

    def queue(self, name: str) -> dict[str, Any]:
        try:
            return dict(self._get(f"/apis/{meta.GROUP}/{meta.VERSION}/gpuqueues/{name}"))
        except CtlError as exc:
            if exc.status == 404:
                raise CtlError(f"gpuqueue {name} not found") from None
            raise

    def scheduler_config(self, namespace: str = "gpuq-system") -> SchedulerConfig:
        """The operator's ConfigMap (defaults when there is none, as the operator does)."""
        try:
            cm = self._get(f"/api/v1/namespaces/{namespace}/configmaps/{CONFIG_MAP_NAME}")
        except CtlError as exc:
            if exc.status in (403, 404):
                return SchedulerConfig()
            raise
        try:
            return config_from_config_map(cm.get("data"))
        except ConfigError as exc:
            raise CtlError(f"ConfigMap {namespace}/{CONFIG_MAP_NAME} is invalid: {exc}", 2) from None

    # ---- writes ---------------------------------------------------------------------------------
    def patch_job_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        self.job(namespace, name)  # a readable 404 first
        path = f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{namespace}/trainingjobs/{name}"
        return dict(self._patch(path, {"spec": spec}))

    def suspend_gang_owner(self, namespace: str, gang: str, suspend: bool) -> str:
        """Suspend or resume the owner of the gang `gang` (`job.NAME`, `pytorchjob.NAME`) as its user
        would, taking over a suspension gpuq made to evict it (its marker removed). Its kind and name."""
        prefix, _, name = gang.partition(".")
        kind = next((k for k in KINDS.values() if k.kind.lower() == prefix), None)
        if kind is None or not name:
            raise CtlError(f"{gang} names no gang: gangs are job.NAME or pytorchjob.NAME", code=2)
        path = f"{collection_path(kind, namespace)}/{name}"
        try:
            self._get(path)
        except CtlError as exc:
            if exc.status == 404:
                raise CtlError(f"{kind.kind.lower()} {namespace}/{name} not found") from None
            raise
        self._patch(path, suspend_patch(kind, suspend, None))
        return f"{kind.kind} {namespace}/{name}"

    def patch_queue_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        self.queue(name)
        return dict(self._patch(f"/apis/{meta.GROUP}/{meta.VERSION}/gpuqueues/{name}", {"spec": spec}))


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "reason", None) or exc)
    return text.split(": ", 1)[-1][:200]
