"""Generate the CustomResourceDefinitions from the pydantic models.

pydantic's JSON Schema is close to, but not, a Kubernetes structural schema: references must be
inlined, `anyOf [X, null]` becomes plain X (absence means unset), titles go, and the
x-kubernetes-* extensions carried in `json_schema_extra` stay. The result is deterministic, so the
checked-in crds/*.yaml can be compared with a fresh rendering (tests/api/test_crds.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from gpuq.api import gang, gpuqueue, trainingjob
from gpuq.api.meta import CATEGORY, GROUP, VERSION, cel

_DROP = {"title", "$defs"}


@dataclass(frozen=True, slots=True)
class Kind:
    kind: str
    plural: str
    short_name: str
    namespaced: bool
    spec: type[BaseModel]
    status: type[BaseModel]
    printer_columns: tuple[dict[str, Any], ...]
    root_validations: tuple[dict[str, str], ...] = ()
    description: str = ""

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def file_name(self) -> str:
        return f"{GROUP}_{self.plural}.yaml"


def _col(
    name: str, path: str, typ: str = "string", priority: int = 0, description: str = ""
) -> dict[str, Any]:
    col: dict[str, Any] = {"name": name, "type": typ, "jsonPath": path}
    if description:
        col["description"] = description
    if priority:
        col["priority"] = priority
    return col


_AGE = _col("Age", ".metadata.creationTimestamp", "date")

TRAINING_JOB = Kind(
    kind="TrainingJob",
    plural="trainingjobs",
    short_name="tj",
    namespaced=True,
    spec=trainingjob.TrainingJobSpec,
    status=trainingjob.TrainingJobStatus,
    description="A distributed training job: a gang of GPU workers scheduled whole by gpuq.",
    printer_columns=(
        _col("Queue", ".spec.queue"),
        _col("Workers", ".spec.workers.replicas", "integer"),
        _col("GPUs", ".status.gpus", "integer", description="Total GPUs of the gang"),
        _col("Priority", ".spec.priority", "integer"),
        _col("Phase", ".status.phase"),
        _col("Position", ".status.queuePosition", "integer", description="Position in its queue"),
        _col("Restarts", ".status.restarts", "integer", priority=1),
        _col("Message", ".status.message", priority=1),
        _AGE,
    ),
    root_validations=tuple(trainingjob.ROOT_VALIDATIONS),
)

GPU_QUEUE = Kind(
    kind="GPUQueue",
    plural="gpuqueues",
    short_name="gq",
    namespaced=False,
    spec=gpuqueue.GPUQueueSpec,
    status=gpuqueue.GPUQueueStatus,
    description="A team's GPU quota; queues in one cohort lend and borrow unused quota.",
    printer_columns=(
        _col("Cohort", ".spec.cohort"),
        _col("Nominal", ".spec.nominalGPUs", "integer"),
        _col("Used", ".status.usedGPUs", "integer"),
        _col("Borrowed", ".status.borrowedGPUs", "integer"),
        _col("Pending", ".status.pendingJobs", "integer"),
        _col("Admitted", ".status.admittedJobs", "integer"),
        _col("Strategy", ".spec.queueingStrategy", priority=1),
        _AGE,
    ),
    root_validations=(
        cel(
            "self.metadata.name.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$') && "
            "size(self.metadata.name) <= 63",
            "queue names are used as label values: at most 63 lowercase alphanumerics, '-', '.'",
            ".metadata.name",
        ),
    ),
)

GANG = Kind(
    kind="Gang",
    plural="gangs",
    short_name="gang",
    namespaced=True,
    spec=gang.GangSpec,
    status=gang.GangStatus,
    description=(
        "gpuq's record of a gang it did not create (an Indexed Job's, a PyTorchJob's): the status a "
        "TrainingJob keeps in its own. Written by the operator only."
    ),
    printer_columns=(
        _col("Owner", ".spec.owner.kind"),
        _col("Queue", ".spec.queue"),
        _col("Workers", ".spec.workers", "integer"),
        _col("GPUs", ".status.gpus", "integer", description="Total GPUs of the gang"),
        _col("Phase", ".status.phase"),
        _col("Position", ".status.queuePosition", "integer", description="Position in its queue"),
        _col("Message", ".status.message", priority=1),
        _AGE,
    ),
)

KINDS: tuple[Kind, ...] = (TRAINING_JOB, GPU_QUEUE, GANG)


def _cel_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _map_keys(node: dict[str, Any]) -> dict[str, Any]:
    """A map whose keys are constrained (pydantic: propertyNames, and patternProperties for a key
    pattern) as a structural schema allows it: additionalProperties for the values and a CEL rule
    over the keys (a structural schema has neither propertyNames nor patternProperties)."""
    node = dict(node)
    names = node.pop("propertyNames", {})
    patterns = node.pop("patternProperties", {})
    if len(patterns) > 1:
        raise ValueError(f"cannot express several key patterns {list(patterns)} in a structural schema")
    checks = []
    if "minLength" in names:
        checks.append(f"size(k) >= {names['minLength']}")
    if "maxLength" in names:
        checks.append(f"size(k) <= {names['maxLength']}")
    for pattern, values in patterns.items():
        checks.append(f"k.matches({_cel_string(pattern)})")
        node["additionalProperties"] = values
    if not checks:
        return node
    ok = " && ".join(checks)
    what = names.get("description", "valid")
    head, tail = _cel_string("key '"), _cel_string("' must be " + what)
    rule = {
        "rule": f"self.all(k, {ok})",
        "message": "every key must be " + what,
        # Names the first bad key, as the API server names a bad field.
        "messageExpression": f"{head} + self.filter(k, !({ok}))[0] + {tail}",
    }
    node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", []), rule]
    return node


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Turn one pydantic JSON-schema node into a structural-schema node."""
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "propertyNames" in node or "patternProperties" in node:
        node = _map_keys(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**_inline(target, defs), **{k: v for k, v in node.items()}}
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {options} in a structural schema")
        node = {**_inline(options[0], defs), **node}
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
            # JSON Schema 2020 spells it as a number; OpenAPI 3.0 (Kubernetes) as a flag on the bound.
            node[plain] = node[bound]
            node[bound] = True
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", 0) is None:
        del node["default"]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        node.pop("additionalProperties", None)
    elif node.get("additionalProperties") is True or node.get("additionalProperties") is False:
        node.pop("additionalProperties")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _inline(v, defs) for name, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _inline(value, defs)
        else:
            out[key] = value
    if "properties" in out:
        out.setdefault("type", "object")
    return out


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _inline(raw, raw.get("$defs", {}))
    return schema


def _openapi_schema(kind: Kind) -> dict[str, Any]:
    root: dict[str, Any] = {
        "description": kind.description,
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # name declared so that rules on it can name it (fieldPath), as the API server does
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": structural_schema(kind.spec),
            "status": structural_schema(kind.status),
        },
    }
    if kind.root_validations:
        root["x-kubernetes-validations"] = list(kind.root_validations)
    return root


def crd(kind: Kind) -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "shortNames": [kind.short_name],
                "categories": [CATEGORY],
            },
            "scope": "Namespaced" if kind.namespaced else "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _openapi_schema(kind)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": list(kind.printer_columns),
                }
            ],
        },
    }


HEADER = "# Generated from gpuq.api by `gpuq crds --write crds/`. Do not edit by hand.\n"
# The one command that installs (or upgrades) the CRDs, wherever gpuq names it (the operator's and
# the CLI's errors, `gpuq doctor`, the docs; tests/api/test_install_command.py holds them to it).
# `-k`: crds/ holds a kustomization.yaml (manifests/ includes the directory), which `kubectl apply -f`
# would try to apply as an object and fail on.
INSTALL_COMMAND = "kubectl apply -k crds/"


class _NoAliasDumper(yaml.SafeDumper):
    """Repeated sub-schemas are written out in full: CRD readers should not need YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(kind: Kind) -> str:
    return HEADER + yaml.dump(crd(kind), Dumper=_NoAliasDumper, sort_keys=False, width=100)


def render_all() -> dict[str, str]:
    """File name -> YAML text of every CRD."""
    return {kind.file_name: render(kind) for kind in KINDS}


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


def drifted(directory: Path) -> list[str]:
    """Names of CRD files in `directory` that are missing or differ from the models."""
    out = []
    for name, text in render_all().items():
        path = directory / name
        if not path.exists() or path.read_text() != text:
            out.append(name)
    return out
