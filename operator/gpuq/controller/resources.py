"""Kubernetes resource quantities and pod requests as the core's `Resources` vectors."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from gpuq.core.model import CPU, GPU, MEMORY, Resources

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    pass


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "2", "16Gi", "1e3") into a Decimal of base units."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"not a Kubernetes quantity: {value!r}")
    match = _QUANTITY.match(value.strip())
    if not match:
        raise QuantityError(f"not a Kubernetes quantity: {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        base = Decimal(number)
    except InvalidOperation:
        raise QuantityError(f"not a Kubernetes quantity: {value!r}") from None
    return base * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def _quantities(values: Mapping[str, Any] | None, where: str) -> dict[str, Decimal]:
    """Each quantity of a ResourceList; a bad one is a QuantityError naming its field (`where`.name)."""
    out: dict[str, Decimal] = {}
    for name, raw in (values or {}).items():
        try:
            out[name] = parse_quantity(raw)
        except QuantityError as exc:
            raise QuantityError(f"{where}.{name}: {exc}") from None
    return out


def _resources(quantities: Mapping[str, Decimal]) -> Resources:
    """CPU in millicores, others rounded up to whole units."""
    gpus = cpu = memory = 0
    extra: dict[str, int] = {}
    for name, qty in quantities.items():
        if name == CPU:
            cpu = math.ceil(qty * 1000)
        elif name == MEMORY:
            memory = math.ceil(qty)
        elif name == GPU:
            gpus = math.ceil(qty)
        elif name != "pods":
            extra[name] = math.ceil(qty)
    return Resources(gpus, cpu, memory, extra)


def resources_from_list(values: Mapping[str, Any] | None, where: str) -> Resources:
    """A ResourceList (requests, allocatable) as Resources; errors name the field, `where`.name
    (`where` is the list's path, e.g. status.allocatable: no message without one)."""
    return _resources(_quantities(values, where)) if values else Resources()


def add(a: Resources, b: Resources) -> Resources:
    extra = dict(a.extra)
    for k, v in b.extra.items():
        extra[k] = extra.get(k, 0) + v
    return Resources(a.gpus + b.gpus, a.cpu_millis + b.cpu_millis, a.memory_bytes + b.memory_bytes, extra)


def _max(a: Resources, b: Resources) -> Resources:
    extra = {k: max(a.extra.get(k, 0), b.extra.get(k, 0)) for k in {*a.extra, *b.extra}}
    return Resources(
        max(a.gpus, b.gpus), max(a.cpu_millis, b.cpu_millis), max(a.memory_bytes, b.memory_bytes), extra
    )


def total(items: Iterable[Resources]) -> Resources:
    out = Resources()
    for item in items:
        out = add(out, item)
    return out


def _requests(container: Mapping[str, Any], where: str) -> Resources:
    res = container.get("resources") or {}
    limits = _quantities(res.get("limits"), f"{where}.resources.limits")
    # Kubernetes defaults requests to limits when only limits are given.
    return _resources({**limits, **_quantities(res.get("requests"), f"{where}.resources.requests")})


def pod_requests(pod_spec: Mapping[str, Any], where: str = "spec") -> Resources:
    """Effective requests of a pod, as kube-scheduler computes them: the sum of its containers (and
    restartable sidecar init containers), at least the largest init container, plus overhead.
    `where` is the pod spec's field path, for errors (e.g. spec.workers.template.spec)."""
    inits = list(enumerate(pod_spec.get("initContainers") or []))
    containers = [(f"{where}.containers[{i}]", c) for i, c in enumerate(pod_spec.get("containers") or [])]
    sidecars = [(f"{where}.initContainers[{i}]", c) for i, c in inits if c.get("restartPolicy") == "Always"]
    regular = total(_requests(c, path) for path, c in [*containers, *sidecars])
    init_peak = Resources()
    for i, c in inits:
        if c.get("restartPolicy") != "Always":
            init_peak = _max(init_peak, _requests(c, f"{where}.initContainers[{i}]"))
    return add(_max(regular, init_peak), resources_from_list(pod_spec.get("overhead"), f"{where}.overhead"))
