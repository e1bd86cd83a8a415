"""What a worker pod needs to know about itself for gpuq.sdk: its own name and namespace (downward-API
env) and its live annotations (a downward-API volume the kubelet keeps current, so polling
checkpoint_requested() costs no API call). Env and volume names match gpuq.sdk.context."""

from __future__ import annotations

from typing import Any

from gpuq.sdk.context import ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_PODINFO_DIR

PODINFO_VOLUME = "gpuq-podinfo"
PODINFO_DIR = "/etc/gpuq/podinfo"


def identity_env() -> list[dict[str, Any]]:
    return [
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": ENV_POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": ENV_PODINFO_DIR, "value": PODINFO_DIR},
    ]


def add_podinfo_volume(pod_spec: dict[str, Any]) -> None:
    """Mount the pod's annotations read-only at PODINFO_DIR in every container (idempotent)."""
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != PODINFO_VOLUME]
    items = [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
    pod_spec["volumes"] = [*volumes, {"name": PODINFO_VOLUME, "downwardAPI": {"items": items}}]
    for container in pod_spec.get("containers") or []:
        mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != PODINFO_VOLUME]
        container["volumeMounts"] = [
            *mounts,
            {"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True},
        ]
