"""Pod constraints gpuq must honor because it binds pods itself (issue 7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.core.constraints import requirement_holds
from gpuq.core.decisions import PendingCode
from gpuq.core.model import (
    Constraints,
    Health,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredTerm,
    Resources,
    Taint,
    TaintEffect,
    Toleration,
    WorkerSpec,
)

from .helpers import NOW, admitted, codes, job, node, pending, queue, run, snap


def test_node_selector_restricts_nodes() -> None:
    nodes = [node("a", labels={"pool": "x"}), node("b", labels={"pool": "y"})]
    d = run(snap(nodes, [queue()], [job("ns/j", constraints=Constraints(node_selector={"pool": "y"}))]))
    assert admitted(d)["ns/j"] == ("b",)


@pytest.mark.parametrize(
    ("op", "values", "labels", "holds"),
    [
        ("In", ("x", "y"), {"k": "y"}, True),
        ("In", ("x",), {"k": "y"}, False),
        ("In", ("x",), {}, False),
        ("NotIn", ("x",), {"k": "y"}, True),
        ("NotIn", ("x",), {}, True),
        ("NotIn", ("y",), {"k": "y"}, False),
        ("Exists", (), {"k": ""}, True),
        ("Exists", (), {}, False),
        ("DoesNotExist", (), {}, True),
        ("DoesNotExist", (), {"k": "1"}, False),
        ("Gt", ("3",), {"k": "4"}, True),
        ("Gt", ("3",), {"k": "3"}, False),
        ("Gt", ("3",), {"k": "abc"}, False),
        ("Lt", ("3",), {"k": "2"}, True),
        ("Lt", ("3",), {}, False),
    ],
)
def test_required_affinity_operators(
    op: str, values: tuple[str, ...], labels: dict[str, str], holds: bool
) -> None:
    assert requirement_holds(labels, NodeSelectorRequirement("k", op, values)) is holds


def test_required_affinity_terms_are_ored_and_expressions_anded() -> None:
    gpu_a = NodeSelectorRequirement("gen", "In", ("a",))
    fast = NodeSelectorRequirement("net", "Exists")
    terms = (
        NodeSelectorTerm((gpu_a, fast)),
        NodeSelectorTerm((NodeSelectorRequirement("gen", "In", ("c",)),)),
    )
    nodes = [
        node("only-a", labels={"gen": "a"}),
        node("a-fast", labels={"gen": "a", "net": "ib"}, gpus=2),
        node("c", labels={"gen": "c"}, gpus=2),
    ]
    d = run(
        snap(
            nodes, [queue()], [job("ns/j", replicas=2, gpus=2, constraints=Constraints(required_terms=terms))]
        )
    )
    assert sorted(admitted(d)["ns/j"]) == ["a-fast", "c"]


def test_preferred_affinity_is_a_score_not_a_filter() -> None:
    prefer_b = (PreferredTerm(10, NodeSelectorTerm((NodeSelectorRequirement("pool", "In", ("b",)),))),)
    nodes = [node("a", labels={"pool": "a"}), node("b", labels={"pool": "b"})]
    jobs = [
        job("ns/j1", gpus=8, constraints=Constraints(preferred_terms=prefer_b)),
        job("ns/j2", gpus=8, created=901, constraints=Constraints(preferred_terms=prefer_b)),
    ]
    d = run(snap(nodes, [queue()], jobs))
    assert admitted(d) == {"ns/j1": ("b",), "ns/j2": ("a",)}


def test_no_schedule_taint_needs_a_toleration() -> None:
    tainted = node("t", taints=(Taint("dedicated", "team-x", TaintEffect.NO_SCHEDULE),))
    d = run(
        snap(
            [tainted],
            [queue()],
            [
                job("ns/plain"),
                job(
                    "ns/tol",
                    constraints=Constraints(tolerations=(Toleration("dedicated", "Equal", "team-x"),)),
                ),
            ],
        )
    )
    assert "ns/tol" in admitted(d) and "ns/plain" not in admitted(d)
    assert codes(d)["ns/plain"] == PendingCode.NO_MATCHING_NODES
    assert "taints" in pending(d)["ns/plain"]


def test_toleration_operators_and_effects() -> None:
    taint = Taint("k", "v", TaintEffect.NO_SCHEDULE)
    tainted = [node("t", taints=(taint,))]
    for tol, ok in [
        (Toleration(operator="Exists"), True),
        (Toleration("k", "Exists"), True),
        (Toleration("k", "Equal", "v", TaintEffect.NO_SCHEDULE), True),
        (Toleration("k", "Equal", "v", TaintEffect.NO_EXECUTE), False),
        (Toleration("k", "Equal", "other"), False),
    ]:
        d = run(snap(tainted, [queue()], [job("ns/j", constraints=Constraints(tolerations=(tol,)))]))
        assert ("ns/j" in admitted(d)) is ok, tol


def test_prefer_no_schedule_taint_avoided_when_possible() -> None:
    soft = node("soft", taints=(Taint("maint", "", TaintEffect.PREFER_NO_SCHEDULE),), gpus=8)
    clean = node("clean", gpus=4)
    d = run(snap([soft, clean], [queue()], [job("ns/a", gpus=4), job("ns/b", gpus=4, created=901)]))
    assert admitted(d) == {"ns/a": ("clean",), "ns/b": ("soft",)}


def test_cordoned_node_receives_nothing() -> None:
    nodes = [node("c", health=Health.CORDONED)]
    d = run(snap(nodes, [queue()], [job("ns/j")]))
    assert d.admit == () and pending(d)["ns/j"] == "no schedulable node in the cluster"


def test_not_ready_node_receives_nothing_even_within_grace() -> None:
    nodes = [node("nr", not_ready_since=NOW - 1), node("ok", gpus=1)]
    d = run(snap(nodes, [queue()], [job("ns/j", gpus=1), job("ns/k", gpus=1)]))
    assert admitted(d) == {"ns/j": ("ok",)}


def test_gpu_model_filter_and_missing_model_reason() -> None:
    nodes = [node("a", gpu_model="A100"), node("h", gpu_model="H100")]
    jobs = [
        job("ns/h", constraints=Constraints(gpu_models=("H100",))),
        job("ns/b", constraints=Constraints(gpu_models=("B200",))),
    ]
    d = run(snap(nodes, [queue()], jobs))
    assert admitted(d) == {"ns/h": ("h",)}
    assert pending(d)["ns/b"] == "no node matches gpuModels [B200]"


def test_gpu_model_read_from_configured_label_when_field_missing() -> None:
    nodes = [
        node("a", labels={"nvidia.com/gpu.product": "A100"}),
        node("h", labels={"nvidia.com/gpu.product": "H100"}),
    ]
    d = run(snap(nodes, [queue()], [job("ns/h", constraints=Constraints(gpu_models=("H100",)))]))
    assert admitted(d) == {"ns/h": ("h",)}


def test_gang_never_mixes_gpu_models_unless_allowed() -> None:
    nodes = [node("a", gpu_model="A100"), node("h", gpu_model="H100")]
    strict = job("ns/strict", replicas=2, gpus=8)
    d = run(snap(nodes, [queue()], [strict]))
    assert d.admit == ()
    mixed = replace(strict, constraints=Constraints(mixed_models=True))
    d = run(snap(nodes, [queue()], [mixed]))
    assert sorted(admitted(d)["ns/strict"]) == ["a", "h"]


def test_gpus_used_by_other_schedulers_are_counted() -> None:
    busy = node("busy", used_by_others=Resources(gpus=6))
    d = run(snap([busy], [queue()], [job("ns/a", gpus=2), job("ns/b", gpus=1, created=901)]))
    assert admitted(d) == {"ns/a": ("busy",)}


def test_cpu_memory_and_extended_resources_must_fit() -> None:
    gi = 1 << 30
    n = node("n", cpu=10_000, mem=100 * gi)
    n = replace(n, allocatable=Resources(8, 10_000, 100 * gi, {"rdma/hca": 1}))
    cpu_heavy = replace(job("ns/cpu", replicas=2, gpus=1), workers=WorkerSpec(2, 1, cpu_millis=6_000))
    rdma = replace(job("ns/rdma", gpus=1, created=901), workers=WorkerSpec(1, 1, extra={"rdma/hca": 1}))
    rdma2 = replace(job("ns/rdma2", gpus=1, created=902), workers=WorkerSpec(1, 1, extra={"rdma/hca": 1}))
    d = run(snap([n], [queue()], [cpu_heavy, rdma, rdma2]))
    assert set(admitted(d)) == {"ns/rdma"}
    assert pending(d)["ns/cpu"] == (  # 2 x 6000m on a 10000m node: not even when it is empty
        "needs 2x1 GPUs (1 GPU, 6000m CPU per worker); more than the cluster holds even when empty: "
        "its 1 eligible node holds 1 such worker at most (short of CPU)"
    )


def test_model_quota_caps_gpus_of_that_model() -> None:
    nodes = [node("h", gpu_model="H100"), node("a", gpu_model="A100")]
    q = queue(model_quotas={"H100": 4})
    d = run(
        snap(
            nodes,
            [q],
            [
                job("ns/h1", gpus=4, constraints=Constraints(gpu_models=("H100",))),
                job("ns/h2", gpus=4, created=901, constraints=Constraints(gpu_models=("H100",))),
                job("ns/any", gpus=4, created=902),
            ],
        )
    )
    assert admitted(d) == {"ns/h1": ("h",), "ns/any": ("a",)}
    assert pending(d)["ns/h2"].startswith("queue q uses 4 H100 GPUs (model quota 4); this job needs 4")
