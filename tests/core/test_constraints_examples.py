"""Example tests of pod constraints beyond tests/core/test_constraints.py (issue 7): Kubernetes corner
cases of node affinity and tolerations, every resource kind, GPU model rules and pending reasons."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.core import SchedulerConfig
from gpuq.core.constraints import requirement_holds
from gpuq.core.decisions import PendingCode
from gpuq.core.model import (
    Constraints,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Resources,
    Running,
    Taint,
    TaintEffect,
    Toleration,
    WorkerSpec,
)

from .helpers import GI, admitted, codes, job, node, pending, queue, run, snap

TEAM_X = Taint("dedicated", "team-x", TaintEffect.NO_SCHEDULE)
TOLERATE_X = Toleration("dedicated", "Equal", "team-x")


def req(key: str, op: str, *values: str) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(key, op, values)


def needs(**kw: object) -> Constraints:
    return Constraints(**kw)  # type: ignore[arg-type]


def placed(nodes: list, constraints: Constraints, replicas: int = 1, gpus: int = 1, **kw: object) -> tuple:
    d = run(
        snap(nodes, [queue()], [job("ns/j", replicas=replicas, gpus=gpus, constraints=constraints)]), **kw
    )
    return admitted(d).get("ns/j", ())


# ---- node affinity corner cases --------------------------------------------------------------------


def test_an_empty_required_term_selects_no_node() -> None:
    nodes = [node("a", labels={"pool": "x"})]
    assert placed(nodes, needs(required_terms=(NodeSelectorTerm(),))) == ()
    # ...but another term of the same job may still match (terms are ORed).
    terms = (NodeSelectorTerm(), NodeSelectorTerm((req("pool", "In", "x"),)))
    assert placed(nodes, needs(required_terms=terms)) == ("a",)


def test_match_fields_pin_or_exclude_nodes_by_name() -> None:
    nodes = [node("a"), node("b"), node("c")]
    pin = NodeSelectorTerm(match_fields=(req("metadata.name", "In", "b"),))
    assert placed(nodes, needs(required_terms=(pin,))) == ("b",)
    # Expressions and fields of one term are ANDed.
    avoid = NodeSelectorTerm((req("zone", "DoesNotExist"),), (req("metadata.name", "NotIn", "a"),))
    assert placed(nodes, needs(required_terms=(avoid,)), replicas=2, gpus=8) == ("b", "c")


@pytest.mark.parametrize("value", ["1_0", " 10", "10.0", "0x10", ""])
def test_gt_lt_accept_only_plain_integers_like_kubernetes(value: str) -> None:
    assert not requirement_holds({"k": value}, req("k", "Gt", "1"))
    assert not requirement_holds({"k": value}, req("k", "Lt", "100"))


def test_gt_lt_compare_signed_integers() -> None:
    assert requirement_holds({"k": "-3"}, req("k", "Lt", "-2"))
    assert requirement_holds({"k": "+7"}, req("k", "Gt", "06"))


@pytest.mark.parametrize(
    ("c", "words"),
    [
        (needs(required_terms=(NodeSelectorTerm((req("k", "Exists", "v"),)),)), "takes no values"),
        (needs(required_terms=(NodeSelectorTerm((req("k", "Near", "v"),)),)), "operator 'Near'"),
        (needs(required_terms=(NodeSelectorTerm((req("k", "Gt", "x"),)),)), "one integer value"),
        (
            needs(required_terms=(NodeSelectorTerm(match_fields=(req("metadata.uid", "In", "u"),)),)),
            "matchFields",
        ),
        (
            needs(required_terms=(NodeSelectorTerm(match_fields=(req("metadata.name", "In", "a", "b"),)),)),
            "one value",
        ),
        (needs(tolerations=(Toleration("k", "Exists", "v"),)), "must not have a value"),
        (needs(tolerations=(Toleration("", "Equal", "v"),)), "empty key"),
    ],
)
def test_malformed_constraints_pend_as_invalid_with_the_cause(c: Constraints, words: str) -> None:
    """The API server would refuse such pods at creation: gpuq says so up front instead of binding."""
    d = run(snap([node("a")], [queue()], [job("ns/j", constraints=c)]))
    assert codes(d)["ns/j"] == PendingCode.INVALID
    assert words in pending(d)["ns/j"]


# ---- taints ---------------------------------------------------------------------------------------------


def test_no_execute_taint_keeps_new_work_away_unless_tolerated() -> None:
    drained = [node("d", taints=(Taint("drain", "", TaintEffect.NO_EXECUTE),))]
    assert placed(drained, needs()) == ()
    assert placed(
        drained, needs(tolerations=(Toleration("drain", "Exists", effect=TaintEffect.NO_EXECUTE),))
    ) == ("d",)
    # A toleration for another effect does not count.
    assert (
        placed(drained, needs(tolerations=(Toleration("drain", "Exists", effect=TaintEffect.NO_SCHEDULE),)))
        == ()
    )


def test_a_tolerated_prefer_no_schedule_taint_costs_nothing() -> None:
    soft = node("soft", taints=(Taint("maint", "", TaintEffect.PREFER_NO_SCHEDULE),), gpus=4)
    clean = node("clean", gpus=8)  # best fit would pick the fuller node "soft"
    assert placed([soft, clean], needs(), gpus=4) == ("clean",)
    tolerant = needs(tolerations=(Toleration("maint", "Exists"),))
    assert placed([soft, clean], tolerant, gpus=4) == ("soft",)


def test_a_prefer_no_schedule_node_is_used_when_nothing_else_fits() -> None:
    soft = node("soft", taints=(Taint("maint", "", TaintEffect.PREFER_NO_SCHEDULE),))
    assert placed([soft, node("small", gpus=2)], needs(), gpus=4) == ("soft",)


# ---- resources --------------------------------------------------------------------------------------------


def test_ephemeral_storage_and_memory_must_fit_next_to_other_pods() -> None:
    disk = 100 * GI
    n = replace(
        node("n", mem=64 * GI),
        allocatable=Resources(8, 64_000, 64 * GI, {"ephemeral-storage": disk}),
        used_by_others=Resources(0, 0, 32 * GI, {"ephemeral-storage": 70 * GI}),
    )
    fits = WorkerSpec(1, 1, memory_bytes=16 * GI, extra={"ephemeral-storage": 30 * GI})
    too_much_disk = WorkerSpec(1, 1, memory_bytes=16 * GI, extra={"ephemeral-storage": 31 * GI})
    too_much_mem = WorkerSpec(1, 1, memory_bytes=33 * GI)
    for workers, ok in [(fits, True), (too_much_disk, False), (too_much_mem, False)]:
        d = run(snap([n], [queue()], [replace(job("ns/j"), workers=workers)]))
        assert ("ns/j" in admitted(d)) is ok, workers
    d = run(snap([n], [queue()], [replace(job("ns/j"), workers=too_much_disk)]))
    assert (
        pending(d)["ns/j"] == "needs 1x1 GPUs; not enough ephemeral-storage on eligible nodes with free GPUs"
    )


def test_an_extended_resource_the_node_lacks_is_never_assumed() -> None:
    d = run(
        snap([node("n")], [queue()], [replace(job("ns/j"), workers=WorkerSpec(1, 1, extra={"rdma/hca": 1}))])
    )
    assert d.admit == () and "rdma/hca" in pending(d)["ns/j"]


def test_cpu_only_workers_still_honour_every_constraint() -> None:
    nodes = [node("gpu", gpu_model="H100"), node("tainted", taints=(TEAM_X,), gpus=0)]
    cpu_job = replace(job("ns/cpu", replicas=2, gpus=0), workers=WorkerSpec(2, 0, cpu_millis=32_000))
    d = run(snap(nodes, [queue()], [cpu_job]))
    assert admitted(d)["ns/cpu"] == ("gpu", "gpu")


# ---- GPU models -------------------------------------------------------------------------------------------


def test_any_of_gpu_models_keeps_one_model_per_gang() -> None:
    nodes = [node("a1", gpu_model="A100"), node("h1", gpu_model="H100"), node("h2", gpu_model="H100")]
    either = needs(gpu_models=("A100", "H100"))
    assert sorted(placed(nodes, either, replicas=2, gpus=8)) == ["h1", "h2"]
    d = run(snap(nodes[:2], [queue()], [job("ns/j", replicas=2, gpus=8, constraints=either)]))
    assert d.admit == () and "one GPU model per gang" in pending(d)["ns/j"]


def test_mixed_models_spans_models_but_only_those_listed() -> None:
    nodes = [node("a1", gpu_model="A100"), node("h1", gpu_model="H100"), node("l1", gpu_model="L4")]
    c = needs(gpu_models=("A100", "H100"), mixed_models=True)
    assert sorted(placed(nodes, c, replicas=2, gpus=8)) == ["a1", "h1"]


def test_nodes_without_a_model_are_a_model_of_their_own() -> None:
    """An unlabelled node's GPUs are unknown: a gang does not mix them with a known model."""
    nodes = [node("known", gpu_model="H100"), node("unknown")]
    assert placed(nodes, needs(), replicas=2, gpus=8) == ()
    assert placed(nodes, needs(gpu_models=("H100",)), replicas=1, gpus=8) == ("known",)


def test_the_gpu_model_label_is_configurable() -> None:
    nodes = [node("a", labels={"example.com/gpu": "A100"}), node("h", labels={"example.com/gpu": "H100"})]
    cfg = SchedulerConfig(gpu_model_label="example.com/gpu")
    assert placed(nodes, needs(gpu_models=("H100",)), config=cfg) == ("h",)
    # The default label is not read when another one is configured.
    relabelled = [node("x", labels={"nvidia.com/gpu.product": "H100"})]
    assert placed(relabelled, needs(gpu_models=("H100",)), config=cfg) == ()


def test_model_quota_counts_running_gangs_and_leaves_other_models_to_nominal() -> None:
    nodes = [node("h1", gpu_model="H100"), node("h2", gpu_model="H100"), node("a1", gpu_model="A100")]
    q = queue(nominal=24, model_quotas={"H100": 8})
    running = replace(job("ns/old", gpus=8), running=Running(("h1",), 0.0))
    want_h100 = job("ns/new", gpus=8, created=901, constraints=needs(gpu_models=("H100",)))
    anywhere = job("ns/any", gpus=8, created=902)
    d = run(snap(nodes, [q], [running, want_h100, anywhere]))
    assert admitted(d) == {"ns/any": ("a1",)}  # h2 is free, but H100 quota is used by ns/old
    assert codes(d)["ns/new"] == PendingCode.QUOTA_EXCEEDED
    assert pending(d)["ns/new"] == "queue q uses 8 H100 GPUs (model quota 8); this job needs 8"


def test_a_mixed_gang_must_fit_every_model_quota() -> None:
    nodes = [node("h1", gpu_model="H100", gpus=4), node("a1", gpu_model="A100", gpus=4)]
    q = queue(model_quotas={"H100": 2})
    mixed = job("ns/m", replicas=2, gpus=4, constraints=needs(mixed_models=True))
    d = run(snap(nodes, [q], [mixed]))
    assert d.admit == ()  # one worker would take 4 H100 GPUs, over the quota of 2
    assert pending(d)["ns/m"] == "queue q uses 0 H100 GPUs (model quota 2); a worker of this job needs 4"
    assert codes(d)["ns/m"] == PendingCode.QUOTA_EXCEEDED


def test_a_recovering_gang_takes_its_model_quota_along() -> None:
    """Re-placed after a failure it keeps its nominal quota, but GPUs it moves onto a quota'd model
    count there at once: later admissions in the same cycle cannot overrun that model."""
    failing = node("a", gpu_model="A100", taints=(Taint("drain", "", TaintEffect.NO_EXECUTE),))
    nodes = [failing, node("l", gpu_model="L4")]
    q = queue(model_quotas={"L4": 4})
    old = replace(job("ns/old", gpus=1), running=Running(("a",), 0.0))
    new = job("ns/new", gpus=4, created=901, constraints=needs(gpu_models=("L4",)))
    d = run(snap(nodes, [q], [old, new]))
    assert admitted(d) == {"ns/old": ("l",)} and [r.job for r in d.restart] == ["ns/old"]
    assert pending(d)["ns/new"] == "queue q uses 1 L4 GPU (model quota 4); this job needs 4"


# ---- pending reasons name the constraint that binds -----------------------------------------------------


def test_reason_names_the_taints_of_the_nodes_the_job_selects() -> None:
    nodes = [
        node("x1", labels={"pool": "x"}, taints=(TEAM_X,)),
        node("x2", labels={"pool": "x"}, taints=(TEAM_X,)),
        node("y", labels={"pool": "y"}),
    ]
    d = run(snap(nodes, [queue()], [job("ns/j", constraints=needs(node_selector={"pool": "x"}))]))
    assert pending(d)["ns/j"] == (
        "every node matching its other constraints has a taint the job does not tolerate: "
        "dedicated=team-x:NoSchedule (2 nodes) (job asks for nodeSelector {pool: x}); "
        "nodes rejected: 1 by nodeSelector, 2 by taints"
    )
    assert codes(d)["ns/j"] == PendingCode.NO_MATCHING_NODES


def test_reason_names_the_selector_or_affinity_nobody_matches() -> None:
    nodes = [node("a", labels={"pool": "a"})]
    d = run(snap(nodes, [queue()], [job("ns/j", constraints=needs(node_selector={"pool": "z"}))]))
    assert pending(d)["ns/j"].startswith("no schedulable node matches nodeSelector {pool: z}")
    aff = needs(required_terms=(NodeSelectorTerm((req("pool", "In", "q"),)),))
    d = run(snap(nodes, [queue()], [job("ns/j", constraints=aff)]))
    assert pending(d)["ns/j"].startswith("no schedulable node matches the job's required node affinity")


def test_reason_for_a_model_missing_among_tolerated_nodes() -> None:
    nodes = [node("h", gpu_model="H100", taints=(TEAM_X,)), node("a", gpu_model="A100")]
    c = needs(gpu_models=("H100",), node_selector={})
    d = run(snap(nodes, [queue()], [job("ns/j", constraints=c)]))
    assert pending(d)["ns/j"].startswith(
        "no node matches gpuModels [H100] among the nodes matching its other"
    )


def test_no_rack_has_room_reason_names_model_and_toleration() -> None:
    """The issue's example: "no rack has 4 free H100 nodes that tolerate team-x"."""
    nodes = [
        node(f"r{r}n{i}", rack=f"r{r}", gpu_model="H100", taints=(TEAM_X,))
        for r in range(2)
        for i in range(3)
    ]
    c = needs(gpu_models=("H100",), tolerations=(TOLERATE_X,))
    gang = job("ns/j", replicas=4, gpus=8, level="rack", constraints=c)
    d = run(snap(nodes, [queue()], [gang]))
    assert pending(d)["ns/j"] == (
        "needs 4x8 GPUs in one rack; the largest eligible rack has 24 GPUs "
        "(eligible: gpuModels [H100], tolerating dedicated=team-x)"
    )
