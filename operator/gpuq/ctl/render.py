"""Output formats of the CLI: table, wide, json, yaml."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

FORMATS = ("table", "wide", "json", "yaml")


def structured(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, default=str) + "\n"
    return str(yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False))


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """Columns are (header, row key); None prints as '-'."""
    cells = [[h for h, _ in columns]] + [[_cell(r.get(k)) for _, k in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def age(seconds: float) -> str:
    """kubectl's style: 45s, 12m, 3h, 2d."""
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= 2 * size or (unit == "m" and s >= size):
            return f"{s // size}{unit}"
    return f"{s}s"
