"""The chaos invariants on hand-made API states: each violation is caught, a healthy state passes,
and the partial-binding clock stops while no leader (or no API server) could fix the gang."""

from __future__ import annotations

from typing import Any

from gpuq.chaos.invariants import PARTIAL_LIMIT, InvariantChecker, Sample


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def pod(
    job: str, rank: int, node_name: str | None, gpus: int = 8, attempt: int = 1, **kw: Any
) -> dict[str, Any]:
    md: dict[str, Any] = {
        "name": f"{job}-{attempt}-{rank}",
        "namespace": "ns",
        "labels": {"gpuq.dev/job-name": job, "gpuq.dev/rank": str(rank), "gpuq.dev/attempt": str(attempt)},
    }
    if kw.get("deleting"):
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if "name" in kw:
        md["name"] = kw["name"]
    spec: dict[str, Any] = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": md, "spec": spec, "status": {"phase": kw.get("phase", "Running")}}


def job(name: str, phase: str = "Running", replicas: int = 2, attempt: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"workers": {"replicas": replicas}},
        "status": {"phase": phase, "attempt": attempt},
    }


NODES = [node("n1"), node("n2")]


def test_a_healthy_state_has_no_violations() -> None:
    c = InvariantChecker()
    c.submit("ns/a", 0.0)
    c.observe(Sample(1.0, [job("a")], [pod("a", 0, "n1"), pod("a", 1, "n2")], NODES))
    v = c.finish([job("a", "Succeeded")], {"ns/a": 1})
    assert v.total == 0


def test_each_violation_is_caught() -> None:
    c = InvariantChecker()
    c.submit("ns/gone", 0.0)
    c.submit("ns/late", 5.0)  # created after the sample's list started: not lost
    pods = [
        pod("a", 0, "n1"),
        pod("a", 0, "n1", name="a-dup-0"),  # rank 0 twice, and n1 holds 16 GPUs
        pod("b", 0, "n2", deleting=True),  # terminating: holds its GPUs, is not a duplicate
        pod("b", 0, "n2", gpus=4, attempt=2),
    ]
    c.observe(Sample(1.0, [job("a"), job("b", attempt=2), job("f", "Failed")], pods, NODES))
    v = c.finish([job("a"), job("b", "Succeeded", attempt=2)], {"ns/b": 3})
    assert v.lost == {"ns/gone"} and v.failed == {"ns/f"}
    assert list(v.duplicate_pods) == [("ns/a", "0")]
    assert v.overcommitted == {"n1": (16, 8), "n2": (12, 8)}
    assert v.double_admissions == {"ns/b": (3, 2)} and v.unfinished == {"ns/a"}


def test_partial_binding_counts_only_while_it_could_be_fixed() -> None:
    c = InvariantChecker()
    half = [pod("a", 0, "n1"), pod("a", 1, None)]
    t = 0.0
    for _ in range(int(PARTIAL_LIMIT) * 2):  # leaderless: the clock stands still
        t += 1.0
        c.observe(Sample(t, [job("a", "Admitted")], half, NODES, leader=False))
    assert c.longest_partial == 0.0 and c.longest_partial_raw >= PARTIAL_LIMIT
    t += 30.0  # the API server did not answer for 30 s: that gap does not count either
    c.observe(Sample(t, [job("a", "Admitted")], half, NODES))
    assert c.longest_partial == 0.0
    for _ in range(int(PARTIAL_LIMIT) + 2):
        t += 1.0
        c.observe(Sample(t, [job("a", "Admitted")], half, NODES))
    assert c.longest_partial > PARTIAL_LIMIT and "ns/a" in c.v.partial_too_long


def test_a_half_created_gang_of_a_job_not_placed_yet_counts_as_partial() -> None:
    """Pods come before the status (gpuq.controller.record): a queued job's next attempt is checked."""
    c = InvariantChecker()
    half = [pod("a", 0, "n1", attempt=1)]
    t = 0.0
    for _ in range(int(PARTIAL_LIMIT) + 2):
        t += 1.0
        c.observe(Sample(t, [job("a", "Queued", attempt=0)], half, NODES))
    assert "ns/a" in c.v.partial_too_long
    whole = InvariantChecker()
    for i in range(int(PARTIAL_LIMIT) + 2):
        gang = [pod("a", 0, "n1", attempt=1), pod("a", 1, "n2", attempt=1)]
        whole.observe(Sample(float(i), [job("a", "Queued", attempt=0)], gang, NODES))
    assert whole.longest_partial == 0.0
