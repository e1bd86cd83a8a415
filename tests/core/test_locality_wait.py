"""Locality wait: a Preferred gang holds out for its smallest domain, then takes a wider placement."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpuq.core.config import Consolidation, SchedulerConfig, ServiceOrdering
from gpuq.core.model import Job, Node

from .helpers import NOW, admitted, cluster, job, pending, queue, run, snap
from .strategies import PROPERTY

# Only the locality wait schedules anything later: no attained service, moves or reservations.
QUIET = SchedulerConfig(
    service=ServiceOrdering(thresholds_gpu_hours=()),
    consolidation=Consolidation(enabled=False),
    starvation_seconds=10_000.0,
    locality_wait_seconds=1800.0,
)
WAIT = QUIET.locality_wait_seconds
CREATED = NOW - 100.0


def racks(placement: tuple[str, ...]) -> set[str]:
    return {n[:-1] for n in placement}  # cluster() names nodes n<zone><block><rack><node>


def one_free_node_per_rack() -> tuple[list[Node], list[Job]]:
    """Two racks of four 8-GPU nodes, three nodes of each busy: 16 GPUs free, in two racks."""
    nodes = cluster(racks=2, nodes_per_rack=4)
    busy = [f"n00{r}{n}" for r in range(2) for n in range(3)]
    return nodes, [job(f"ns/busy-{name}", gpus=8, on=[name]) for name in busy]


def gang(**kw: object) -> Job:
    return job("ns/a", replicas=2, gpus=8, required=False, created=CREATED, **kw)


def test_a_gang_holds_out_for_one_rack_while_only_a_wider_placement_exists() -> None:
    nodes, busy = one_free_node_per_rack()
    d = run(snap(nodes, [queue()], [*busy, gang()]), config=QUIET)
    assert "ns/a" not in admitted(d)
    assert pending(d)["ns/a"] == (
        "needs 2x8 GPUs in one rack; best rack has 8 free (holds out for one rack for 1700s more, "
        "then takes a wider placement: localityWaitSeconds)"
    )
    assert d.wake_at == CREATED + WAIT  # decided again when the wait ends, without another event


def test_once_the_wait_is_over_the_gang_takes_the_wider_placement() -> None:
    nodes, busy = one_free_node_per_rack()
    d = run(snap(nodes, [queue()], [*busy, gang()]), now=CREATED + WAIT, config=QUIET)
    assert len(racks(admitted(d)["ns/a"])) == 2


def test_a_local_placement_is_taken_at_once() -> None:
    nodes, busy = one_free_node_per_rack()
    d = run(snap(nodes, [queue()], [*busy[:3], gang()]), config=QUIET)  # rack 1 is empty
    assert len(racks(admitted(d)["ns/a"])) == 1


def test_the_wait_counts_from_when_the_job_last_entered_its_queue() -> None:
    nodes, busy = one_free_node_per_rack()
    requeued = replace(gang(), created_at=0.0, queued_since=NOW - 10.0)  # preempted 10 s ago
    d = run(snap(nodes, [queue()], [*busy, requeued]), config=QUIET)
    assert "ns/a" not in admitted(d)
    assert d.wake_at == NOW - 10.0 + WAIT


def test_no_wait_when_it_is_off_or_the_level_is_required() -> None:
    nodes, busy = one_free_node_per_rack()
    off = replace(QUIET, locality_wait_seconds=0.0)
    d = run(snap(nodes, [queue()], [*busy, gang()]), config=off)
    assert len(racks(admitted(d)["ns/a"])) == 2
    block = job("ns/a", replicas=2, gpus=8, level="block", created=CREATED)  # Required: one block
    d = run(snap(nodes, [queue()], [*busy, block]), config=QUIET)
    assert len(racks(admitted(d)["ns/a"])) == 2


def test_a_gang_that_fits_nowhere_keeps_the_plain_reason() -> None:
    nodes, busy = one_free_node_per_rack()
    full = snap(nodes, [queue()], [*busy, job("ns/b", gpus=8, on=["n0003"]), gang()])  # 8 GPUs free
    d = run(full, config=QUIET)
    plain = run(full, config=replace(QUIET, locality_wait_seconds=0.0))
    assert pending(d)["ns/a"] == pending(plain)["ns/a"] == "needs 2x8 GPUs; 8 free on eligible nodes"


def test_the_smallest_domain_is_counted_in_worker_slots_not_gpus() -> None:
    # A rack of two 8-GPU nodes has 16 GPUs but holds only four 3-GPU workers: five need two racks,
    # so the gang has nothing to hold out for on an empty cluster.
    nodes = cluster(racks=2, nodes_per_rack=2)
    d = run(
        snap(nodes, [queue()], [job("ns/a", replicas=5, gpus=3, required=False, created=CREATED)]),
        config=QUIET,
    )
    assert len(racks(admitted(d)["ns/a"])) == 2


def test_a_gang_past_its_wait_is_not_held_back_by_a_class_mate_still_in_its_own() -> None:
    nodes, busy = one_free_node_per_rack()
    # Same class (shape, priority): the older one was requeued 10 s ago, the younger waited past it.
    older = replace(gang(), created_at=NOW - 3000.0, queued_since=NOW - 10.0)
    younger = job("ns/b", replicas=2, gpus=8, required=False, created=NOW - WAIT - 1.0)
    d = run(snap(nodes, [queue()], [*busy, older, younger]), config=QUIET)
    assert "ns/a" not in admitted(d) and "holds out for one rack" in pending(d)["ns/a"]
    assert len(racks(admitted(d)["ns/b"])) == 2


@PROPERTY
@given(
    used=st.lists(st.integers(0, 8), min_size=8, max_size=8),
    replicas=st.integers(2, 4),
    gpus=st.sampled_from([1, 2, 4, 8]),
    waited=st.sampled_from([0.0, WAIT - 1.0, WAIT, 2 * WAIT]),
)
def test_within_its_wait_a_gang_starts_only_in_its_smallest_domain(
    used: list[int], replicas: int, gpus: int, waited: float
) -> None:
    """Within the wait: admitted exactly when one domain of the deepest level that could hold the gang
    on an empty cluster (a node, else a rack) has room, and then inside it. After it: admitted exactly
    when the cluster has room anywhere."""
    nodes = cluster(racks=2, nodes_per_rack=4)
    busy = [job(f"ns/busy-{n.name}", gpus=u, on=[n.name]) for n, u in zip(nodes, used, strict=True) if u]
    a = job("ns/a", replicas=replicas, gpus=gpus, required=False, created=NOW - waited)
    d = run(snap(nodes, [queue()], [*busy, a]), config=QUIET)
    slots = {n.name: (8 - u) // gpus for n, u in zip(nodes, used, strict=True)}
    by_rack: dict[str, int] = {}
    for name, k in slots.items():
        by_rack[name[:-1]] = by_rack.get(name[:-1], 0) + k
    got = admitted(d).get("ns/a")
    if waited >= WAIT:
        assert (got is not None) == (sum(slots.values()) >= replicas)
    elif replicas * gpus <= 8:  # one node could hold it
        assert (got is not None) == any(k >= replicas for k in slots.values())
        assert got is None or len(set(got)) == 1
    else:
        assert (got is not None) == any(k >= replicas for k in by_rack.values())
        assert got is None or len(racks(got)) == 1


def test_a_kept_index_rereads_the_smallest_domain_when_nodes_change() -> None:
    """The depth a gang holds out for is kept by the index until nodes change: when no rack could
    hold the gang any more (its nodes' CPU shrank), it stops waiting for one, as a fresh index says."""
    from gpuq.core import ClusterIndex, schedule
    from gpuq.core.model import WorkerSpec

    nodes, busy = one_free_node_per_rack()
    a = replace(gang(), workers=WorkerSpec(2, 8, cpu_millis=40_000))
    s1 = snap(nodes, [queue()], [*busy, a])
    ix = ClusterIndex(s1, QUIET)
    assert schedule(s1, NOW, QUIET, ix).admit == ()  # holds out for one rack
    # Only each rack's free node still holds a worker: no rack holds two, so the wait is pointless.
    busy_nodes = [n for n in nodes if n.name != "n0003" and n.name != "n0013"]
    small = [replace(n, allocatable=replace(n.allocatable, cpu_millis=20_000)) for n in busy_nodes]
    changed = {n.name: n for n in small}
    s2 = snap([changed.get(n.name, n) for n in nodes], [queue()], [*busy, a])
    ix.apply(s2, nodes=small)
    kept = schedule(s2, NOW + 1, QUIET, ix)
    assert kept == schedule(s2, NOW + 1, QUIET)
    assert racks(admitted(kept)["ns/a"]) == {"n000", "n001"}
