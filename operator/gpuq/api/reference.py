"""Render the field reference of docs/api.md from the same structural schemas as the CRDs.

docs/api.md keeps hand-written prose; only the part between the markers below is generated, so the
reference can never disagree with the CRDs (tests/api/test_crds.py checks it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuq.api.crd import KINDS, Kind, structural_schema

BEGIN = "<!-- BEGIN GENERATED REFERENCE (gpuq crds --docs docs/api.md) -->"
END = "<!-- END GENERATED REFERENCE -->"


def _type(node: dict[str, Any]) -> str:
    typ = node.get("type", "object")
    if typ == "array":
        return f"[]{_type(node.get('items', {}))}"
    if typ == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    if node.get("format") == "date-time":
        return "time (RFC 3339)"
    return str(typ)


def _constraints(node: dict[str, Any], required: bool) -> str:
    parts = ["required"] if required else []
    if "enum" in node:
        parts.append(" \\| ".join(f"`{v}`" for v in node["enum"]))
    if "minimum" in node:
        parts.append((">" if node.get("exclusiveMinimum") else ">=") + f" {node['minimum']}")
    if "maximum" in node:
        parts.append(f"<= {node['maximum']}")
    for key, label in (
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("maxProperties", "max entries"),
    ):
        if key in node:
            parts.append(f"{label} {node[key]}")
    if "pattern" in node:
        parts.append(f"pattern `{node['pattern']}`")
    for rule in node.get("x-kubernetes-validations", []):
        where = f"{rule['fieldPath'].lstrip('.')}: " if "fieldPath" in rule else ""
        parts.append(f"rule: {where}{rule['message']}")
    # A map's values and a list's scalar items (object items get rows of their own).
    for key, label in (("additionalProperties", "values"), ("items", "items")):
        inner = node.get(key)
        if isinstance(inner, dict) and "properties" not in inner:
            inner_text = _constraints(inner, False)
            if inner_text:
                parts.append(f"{label}: {inner_text}")
    return "; ".join(parts)


def _rows(node: dict[str, Any], prefix: str) -> Iterator[str]:
    required = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        path = f"{prefix}.{name}"
        default = f"`{json.dumps(child['default'])}`" if "default" in child else ""
        desc = " ".join(str(child.get("description", "")).split()).replace("|", "\\|")
        yield f"| `{path}` | {_type(child)} | {default} | {_constraints(child, name in required)} | {desc} |"
        target = child.get("items", child) if child.get("type") == "array" else child
        if "properties" in target:
            yield from _rows(target, path + ("[]" if target is not child else ""))


def kind_reference(kind: Kind) -> str:
    scope = "namespaced" if kind.namespaced else "cluster-scoped"
    lines = [
        f"### {kind.kind}",
        "",
        f"{kind.description} ({scope}, short name `{kind.short_name}`, category `gpuq`)",
        "",
    ]
    lines += [f"- {rule['message']}" for rule in kind.root_validations]
    lines += [
        "",
        "| field | type | default | constraints | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for part, model in (("spec", kind.spec), ("status", kind.status)):
        lines.extend(_rows(structural_schema(model), part))
    cols = ", ".join(c["name"] for c in kind.printer_columns)
    lines += [
        "",
        f"`kubectl get {kind.short_name}` columns: {cols} (`-o wide` adds the priority-1 ones).",
        "",
    ]
    return "\n".join(lines)


def reference() -> str:
    return "\n".join([BEGIN, "", *(kind_reference(k) for k in KINDS), END])


def splice(document: str) -> str:
    """Replace the generated section of `document` (or append one) with a fresh rendering."""
    if BEGIN in document and END in document:
        head, rest = document.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + reference() + tail
    return document.rstrip("\n") + "\n\n" + reference() + "\n"


def write_docs(path: Path) -> bool:
    """Update the generated section of `path`; True when the file changed."""
    old = path.read_text() if path.exists() else ""
    new = splice(old)
    if new != old:
        path.write_text(new)
    return new != old


def docs_drifted(path: Path) -> bool:
    return not path.exists() or splice(path.read_text()) != path.read_text()
