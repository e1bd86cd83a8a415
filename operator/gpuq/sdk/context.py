"""Where the SDK runs: the pod's own name and namespace (downward API env the operator injects) and
how to reach the API server (the in-cluster service-account config, overridable for tests)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Env the operator sets on every worker pod (fieldRef metadata.name / metadata.namespace).
ENV_POD_NAME = "GPUQ_POD_NAME"
ENV_POD_NAMESPACE = "GPUQ_POD_NAMESPACE"
# Directory of the downward-API volume holding the pod's live annotations (file `annotations`).
ENV_PODINFO_DIR = "GPUQ_PODINFO_DIR"
# Overrides for running outside a pod (tests, debugging): API server URL, token file, CA file.
ENV_API_SERVER = "GPUQ_API_SERVER"
ENV_TOKEN_FILE = "GPUQ_TOKEN_FILE"
ENV_CA_FILE = "GPUQ_CA_FILE"


class SdkError(RuntimeError):
    """The SDK cannot do what was asked; the message says why and what to check."""


@dataclass(frozen=True, slots=True)
class PodContext:
    pod: str
    namespace: str
    server: str  # https://host:port
    token_file: Path  # re-read on every call: projected tokens rotate
    ca_file: Path | None
    podinfo_dir: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PodContext:
        env = os.environ if env is None else env
        pod = env.get(ENV_POD_NAME)
        if not pod:
            raise SdkError(
                f"{ENV_POD_NAME} is not set: gpuq.sdk runs inside a gpuq worker pod "
                "(the operator injects it from the downward API)"
            )
        namespace = env.get(ENV_POD_NAMESPACE) or _read(SA_DIR / "namespace")
        if not namespace:
            raise SdkError(f"{ENV_POD_NAMESPACE} is not set and {SA_DIR / 'namespace'} is unreadable")
        server = env.get(ENV_API_SERVER)
        if not server:
            host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise SdkError(
                    f"no API server: KUBERNETES_SERVICE_HOST is not set (outside a pod set {ENV_API_SERVER})"
                )
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        ca = env.get(ENV_CA_FILE)
        podinfo = env.get(ENV_PODINFO_DIR)
        return cls(
            pod=pod,
            namespace=namespace,
            server=server.rstrip("/"),
            token_file=Path(env.get(ENV_TOKEN_FILE) or SA_DIR / "token"),
            ca_file=Path(ca) if ca else (SA_DIR / "ca.crt" if (SA_DIR / "ca.crt").exists() else None),
            podinfo_dir=Path(podinfo) if podinfo else None,
        )

    def token(self) -> str:
        token = _read(self.token_file)
        if not token:
            raise SdkError(
                f"no service-account token at {self.token_file} (automountServiceAccountToken off?)"
            )
        return token


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
