"""Names and building blocks shared by the gpuq API kinds.

The pydantic models in this package are the one source of truth of the API: the CRDs in crds/ and
the field reference in docs/api.md are generated from them (`gpuq crds`), and the operator parses
objects with them.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from gpuq.sdk.protocol import ANNOTATION_CHECKPOINT as ANNOTATION_CHECKPOINT
from gpuq.sdk.protocol import ANNOTATION_CHECKPOINT_REQUESTED as ANNOTATION_CHECKPOINT_REQUESTED

GROUP = "gpuq.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "gpuq"
SCHEDULER_NAME = "gpuq"

# Labels gpuq puts on the pods (and Service) it creates.
LABEL_JOB_NAME = "gpuq.dev/job-name"
LABEL_QUEUE = "gpuq.dev/queue"
LABEL_RANK = "gpuq.dev/rank"
LABEL_ATTEMPT = "gpuq.dev/attempt"
# Which admission created a worker pod (operator identity / admission id): after a lost answer or a
# change of leader, an admission rolls back only the pods it created itself.
ANNOTATION_CREATED_BY = "gpuq.dev/created-by"
# On the leader-election Lease: the API user (and its groups, comma-separated) the leader runs as,
# as the API server authenticated it, so `gpuq doctor` checks the permissions of that very identity.
ANNOTATION_LEADER_USER = "gpuq.dev/leader-user"
ANNOTATION_LEADER_GROUPS = "gpuq.dev/leader-groups"
# On the owner of a gang gpuq did not create (an Indexed Job, a PyTorchJob): docs/existing-workloads.md.
# Its queue is LABEL_QUEUE (the opt-in); the rest default as a TrainingJob's spec fields do.
LABEL_PRIORITY = "gpuq.dev/priority"
LABEL_PREEMPTIBLE = "gpuq.dev/preemptible"
ANNOTATION_MIN_RUNTIME = "gpuq.dev/min-runtime-seconds"
ANNOTATION_MAX_RESTARTS = "gpuq.dev/max-restarts"
ANNOTATION_CHECKPOINT_GRACE = "gpuq.dev/checkpoint-grace-seconds"
ANNOTATION_TOPOLOGY_LEVEL = "gpuq.dev/topology-level"
ANNOTATION_TOPOLOGY_MODE = "gpuq.dev/topology-mode"
# Kueue's pod-template annotations for the same (value: the node label of a topology level).
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
# Set with `suspend: true` when gpuq suspends an owner to evict its gang (it resumes it itself);
# a suspend without it is the user's.
ANNOTATION_SUSPENDED_BY = "gpuq.dev/suspended-by"
# Annotations: a checkpoint report ({"step", "path", "time"}) on a job or its pods, and the
# operator's request for one (RFC 3339 time of the request) on the pods of a preemption victim.
# (defined in gpuq.sdk.protocol, standard library only, so worker images need no operator dependencies)

# Kubernetes object names that must also be DNS-1035 labels (Service names, pod hostnames).
DNS_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Kubernetes label values (e.g. queue names carried in the gpuq.dev/queue label).
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# Label keys and values as Kubernetes validates them (apimachinery's IsQualifiedName and
# IsValidLabelValue): an optional DNS-subdomain prefix and '/', then a name of at most 63
# alphanumerics, '-', '_', '.', starting and ending alphanumeric. Written without backslashes so the
# same text is a valid CEL string and an RE2 / Python pattern.
_DNS_SUBDOMAIN = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_NAME = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = f"^({_DNS_SUBDOMAIN}/)?{_LABEL_NAME}$"
LABEL_VALUE_PATTERN = f"^({_LABEL_NAME})?$"

LabelKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=317,  # prefix (253) + '/' + name (63)
        pattern=LABEL_KEY_PATTERN,
        description="a label key: [prefix/]name, the name at most 63 alphanumerics, '-', '_', '.'",
    ),
]
LabelValue = Annotated[
    str,
    Field(
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description="a label value: at most 63 alphanumerics, '-', '_', '.' (or empty)",
    ),
]
# A GPU model is the value of the nodes' GPU model label (nvidia.com/gpu.product by default).
GpuModel = Annotated[
    str,
    Field(
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description="a GPU model as the nodes' GPU model label shows it, e.g. NVIDIA-H100-80GB-HBM3",
    ),
]


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, snake_case in Python, unknown fields kept out."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", use_enum_values=False
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-ready dict as the API server stores it (camelCase), omitting unset fields."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


def field_path(loc: tuple[int | str, ...], root: str = "") -> str:
    """A pydantic error location as Kubernetes spells a field path: `spec.containers[0].name`."""
    path = root
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]":  # pydantic's marker for a dict key (the part before it is the key)
            path += " (key)"
        elif loc[i + 1 : i + 2] == ("[key]",):  # a bad key, quoted: it may be empty or hold spaces
            path += f"[{json.dumps(part)}]"
        else:
            path += f".{part}" if path else part
    return path or "<root>"


def validation_text(exc: ValidationError, root: str = "") -> str:
    """Every error of a pydantic validation, each prefixed with the field path it concerns."""
    return "; ".join(
        f"{field_path(e['loc'], root)}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
    )


def with_rules(*rules: dict[str, str]) -> ConfigDict:
    """Model config that adds CEL rules (x-kubernetes-validations) to the model's schema."""
    extra: dict[str, Any] = {"x-kubernetes-validations": list(rules)}
    return ConfigDict(**ApiModel.model_config, json_schema_extra=extra)


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One x-kubernetes-validations entry."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A standard Kubernetes condition: one observation about the object, keyed by `type`."""

    type: str = Field(
        min_length=1, max_length=316, description="Condition type, e.g. Admitted, QueueNotFound."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(default="", max_length=1024, description="CamelCase machine-readable reason.")
    message: str = Field(default="", max_length=32768, description="Human-readable explanation.")
    last_transition_time: datetime | None = Field(
        default=None, description="When the condition last changed status (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


CONDITIONS_SCHEMA_EXTRA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


def conditions_field(description: str) -> Any:
    return Field(
        default_factory=list,
        max_length=32,
        description=description,
        json_schema_extra=CONDITIONS_SCHEMA_EXTRA,
    )
