"""Quantities and pod requests, computed the way kube-scheduler does."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuq.controller import bodies as b
from gpuq.controller.objects import parse_node
from gpuq.controller.resources import QuantityError, parse_quantity, pod_requests, resources_from_list
from gpuq.core.model import Resources


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1Gi", Decimal(2**30)),
        ("1.5k", Decimal(1500)),
        ("1e3", Decimal(1000)),
        ("100Mi", Decimal(100 * 2**20)),
        (4, Decimal(4)),
    ],
)
def test_parse_quantity(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1Xi", "--1"])
def test_bad_quantity_is_rejected(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_resource_list_rounds_up_and_keeps_extended_resources() -> None:
    r = resources_from_list(
        {"cpu": "1500m", "memory": "1Ki", "nvidia.com/gpu": "8", "rdma/hca": "1", "pods": "110"},
        "status.allocatable",
    )
    assert (r.cpu_millis, r.memory_bytes, r.gpus) == (1500, 1024, 8)
    assert r.extra == {"rdma/hca": 1}


def test_pod_requests_sum_containers_and_take_the_init_peak() -> None:
    spec = {
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "4"}}},  # limits only
        ],
        "initContainers": [
            {"name": "init", "resources": {"requests": {"cpu": "8"}}},
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"memory": "1Gi"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    r = pod_requests(spec)
    assert r.gpus == 4
    assert r.cpu_millis == 8000 + 100  # init container (8) exceeds containers+sidecar (3)
    assert r.memory_bytes == 2 * 2**30  # containers + sidecar


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (
            {"containers": [{"name": "a", "resources": {"requests": {"cpu": "lots"}}}]},
            "containers[0].resources.requests.cpu",
        ),
        (
            {
                "containers": [
                    {"name": "a"},
                    {"name": "b", "resources": {"limits": {"memory": "x"}, "requests": {"memory": "1"}}},
                ]
            },
            "containers[1].resources.limits.memory",  # a bad limit is bad even where a request wins
        ),
        (
            {"containers": [], "initContainers": [{"name": "i", "resources": {"requests": {"cpu": [1]}}}]},
            "initContainers[0].resources.requests.cpu",
        ),
        ({"containers": [], "overhead": {"cpu": True}}, "overhead.cpu"),
    ],
)
def test_a_bad_quantity_names_its_field(spec: dict[str, object], path: str) -> None:
    with pytest.raises(
        QuantityError,
        match=r"^spec\.workers\.template\.spec\."
        + path.replace("[", r"\[").replace("]", r"\]")
        + ": not a Kubernetes quantity",
    ):
        pod_requests(spec, "spec.workers.template.spec")


def test_a_node_with_a_bad_quantity_names_the_field() -> None:
    """The API server validates a Node's quantities, so this is about gpuq never printing one without
    its path: the node is kept, with no allocatable and the error saying where."""
    node = parse_node(b.node("n0") | {"status": {"allocatable": {"cpu": "lots"}, "capacity": {}}})
    assert node.allocatable == Resources()
    assert node.error == "status.allocatable.cpu: not a Kubernetes quantity: 'lots'"
