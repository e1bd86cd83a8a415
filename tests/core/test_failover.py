"""Failover planning: failed gangs restart whole and are re-placed ahead of new work."""

from __future__ import annotations

from gpuq.core import SchedulerConfig
from gpuq.core.decisions import PendingCode
from gpuq.core.model import Constraints, Health, Resources, Taint, TaintEffect, Toleration

from .helpers import NOW, admitted, cluster, codes, job, node, pending, queue, run, snap, with_node

NODES = cluster(racks=2, nodes_per_rack=2)  # racks r000 (n0000, n0001) and r001 (n0010, n0011)


def test_failed_node_restarts_every_gang_on_it() -> None:
    nodes = with_node(NODES, "n0000", health=Health.FAILED)
    jobs = [
        job("ns/a", replicas=2, gpus=4, on=["n0000", "n0001"]),
        job("ns/b", gpus=4, on=["n0000"]),
        job("ns/c", gpus=8, on=["n0010"]),
    ]
    d = run(snap(nodes, [queue()], jobs))
    assert [(r.job, r.failed_nodes) for r in d.restart] == [("ns/a", ("n0000",)), ("ns/b", ("n0000",))]
    assert d.restart[0].reason == "node n0000 failed"


def test_not_ready_within_grace_is_not_a_failure_but_beyond_it_is() -> None:
    cfg = SchedulerConfig()
    grace = cfg.failover.not_ready_grace_seconds
    jobs = [job("ns/a", gpus=8, on=["n0000"])]
    early = run(snap(with_node(NODES, "n0000", not_ready_since=NOW - grace + 1), [queue()], jobs))
    assert early.restart == ()
    late = run(snap(with_node(NODES, "n0000", not_ready_since=NOW - grace - 1), [queue()], jobs))
    assert late.restart[0].reason == f"node n0000 NotReady for {grace + 1:.0f}s (grace {grace:.0f}s)"


def test_deleted_node_restarts_its_gang() -> None:
    nodes = [n for n in NODES if n.name != "n0001"]
    d = run(snap(nodes, [queue()], [job("ns/a", replicas=2, gpus=8, on=["n0000", "n0001"])]))
    assert d.restart[0].failed_nodes == ("n0001",) and d.restart[0].reason == "node n0001 deleted"


def test_no_execute_taint_fails_only_gangs_that_do_not_tolerate_it() -> None:
    taint = Taint("gpu-error", "xid", TaintEffect.NO_EXECUTE)
    nodes = with_node(NODES, "n0000", taints=(taint,))
    tolerant = job(
        "ns/tolerant",
        gpus=4,
        on=["n0000"],
        constraints=Constraints(tolerations=(Toleration("gpu-error", "Exists"),)),
    )
    plain = job("ns/plain", gpus=4, on=["n0000"])
    d = run(snap(nodes, [queue()], [tolerant, plain]))
    assert [r.job for r in d.restart] == ["ns/plain"]
    assert d.restart[0].reason == "node n0000 tainted gpu-error=xid:NoExecute"


def test_fewer_healthy_gpus_than_bound_fails_the_gangs_on_the_node() -> None:
    nodes = with_node(NODES, "n0000", healthy_gpus=6)
    d = run(snap(nodes, [queue()], [job("ns/a", gpus=4, on=["n0000"]), job("ns/b", gpus=4, on=["n0000"])]))
    assert {r.job for r in d.restart} == {"ns/a", "ns/b"}
    assert "reports 6 healthy GPUs for 8 bound" in d.restart[0].reason


def test_degraded_node_offers_only_its_healthy_gpus() -> None:
    nodes = with_node(NODES, "n0000", healthy_gpus=4)
    nodes = [n for n in nodes if n.name == "n0000"]
    d = run(snap(nodes, [queue()], [job("ns/a", gpus=4), job("ns/b", gpus=4, created=901)]))
    assert set(admitted(d)) == {"ns/a"}


def test_restarted_gang_is_re_placed_in_the_same_cycle_in_its_previous_rack() -> None:
    nodes = with_node(NODES, "n0010", health=Health.FAILED)
    nodes = [*nodes, *cluster(racks=3, nodes_per_rack=2)[4:]]  # add a third, empty rack r002
    gang = job("ns/gang", replicas=2, gpus=4, on=["n0010", "n0011"])
    d = run(snap(nodes, [queue()], [gang]))
    assert d.restart[0].not_before == NOW  # first restart: no back-off
    a = d.admit[0]
    assert a.restart and a.job == "ns/gang"
    assert set(a.placement) == {"n0011"}  # its surviving node in rack r001, not the empty rack


def test_restart_goes_ahead_of_new_work_and_keeps_its_quota() -> None:
    nodes = with_node(cluster(racks=1, nodes_per_rack=2), "n0000", health=Health.FAILED)
    q = queue(nominal=8)
    victim = job("ns/old", gpus=8, on=["n0000"], priority=0)
    newer = job("ns/new", gpus=8, priority=9)
    d = run(snap(nodes, [q], [victim, newer]))
    assert admitted(d) == {"ns/old": ("n0001",)}
    assert codes(d)["ns/new"] == PendingCode.QUOTA_EXCEEDED


def test_restart_backoff_delays_re_placement() -> None:
    nodes = with_node(NODES, "n0000", health=Health.FAILED)
    cfg = SchedulerConfig()
    d = run(snap(nodes, [queue()], [job("ns/a", gpus=8, on=["n0000"], restart_count=2)]), config=cfg)
    expected = min(cfg.failover.backoff_max_seconds, cfg.failover.backoff_base_seconds * 2)
    assert d.restart[0].not_before == NOW + expected
    assert d.admit == () and codes(d)["ns/a"] == PendingCode.BACKING_OFF


def test_recovering_job_avoids_its_bad_nodes_and_prefers_its_old_rack() -> None:
    recovering = job(
        "ns/r",
        replicas=2,
        gpus=4,
        recovering=True,
        previous_placement=("n0010", "n0011"),
        avoid_nodes=frozenset({"n0011"}),
    )
    d = run(snap(NODES, [queue()], [recovering]))
    assert admitted(d)["ns/r"] == ("n0010", "n0010")
    assert d.admit[0].restart


def test_recovering_job_not_re_placeable_says_why() -> None:
    nodes = [n for n in NODES if n.name in ("n0000", "n0001")]
    nodes = with_node(nodes, "n0001", not_ready_since=NOW - 1)  # still down: not even a last resort
    recovering = job(
        "ns/r",
        replicas=2,
        gpus=8,
        recovering=True,
        previous_placement=("n0000", "n0001"),
        avoid_nodes=frozenset({"n0001"}),
    )
    d = run(snap(nodes, [queue()], [recovering]))
    assert pending(d)["ns/r"].endswith("(avoiding 1 failed nodes)")


def test_evicting_job_on_failed_node_is_not_restarted() -> None:
    nodes = with_node(NODES, "n0000", health=Health.FAILED)
    d = run(snap(nodes, [queue()], [job("ns/going", gpus=8, on=["n0000"], evicting=True)]))
    assert d.restart == ()


def test_other_schedulers_gpus_count_for_degraded_node_failure() -> None:
    nodes = with_node(NODES, "n0000", healthy_gpus=7, used_by_others=Resources(gpus=4))
    d = run(snap(nodes, [queue()], [job("ns/a", gpus=4, on=["n0000"])]))
    assert [r.job for r in d.restart] == ["ns/a"]


def test_restarted_gangs_old_pods_hold_their_resources_for_others_this_cycle() -> None:
    nodes = with_node(NODES, "n0000", health=Health.FAILED)
    gang = job("ns/gang", replicas=2, gpus=8, on=["n0000", "n0001"])
    d = run(snap(nodes, [queue()], [gang, job("ns/new", gpus=8)]))
    assert set(admitted(d)["ns/gang"]) == {"n0010", "n0011"}  # its old rack has one healthy node left
    assert "ns/new" not in admitted(d)  # n0001 still runs the gang's terminating pod


def test_gang_failing_on_one_node_takes_its_other_not_ready_nodes_with_it() -> None:
    """Two nodes of a gang go NotReady a few seconds apart: one restart lists both and avoids both."""
    grace = SchedulerConfig().failover.not_ready_grace_seconds
    nodes = with_node(NODES, "n0000", not_ready_since=NOW - grace - 1)
    nodes = with_node(nodes, "n0001", not_ready_since=NOW - 2)  # within grace
    jobs = [job("ns/a", replicas=2, gpus=8, on=["n0000", "n0001"])]
    d = run(snap(nodes, [queue()], jobs))
    assert [(r.job, r.failed_nodes) for r in d.restart] == [("ns/a", ("n0000", "n0001"))]
    assert not {"n0000", "n0001"} & set(admitted(d).get("ns/a", ()))


def test_a_gang_is_never_re_placed_on_the_node_failing_it_now() -> None:
    """Found by the clone property: a gang failed by a node's bad GPUs went back onto that node (the
    "recovered node beats waiting" fallback) while its old pods still held it: over-committed, and
    failed again next cycle. Only nodes that failed it in earlier attempts may be a fallback."""
    degraded = node("n-bad", gpus=8, healthy_gpus=7)
    spare = node("n-spare", gpus=8, healthy_gpus=6)  # room for one 4-GPU worker, not two
    gang = job("ns/gang", gpus=4, replicas=2, on=["n-bad", "n-bad"])
    d = run(snap([degraded, spare], [queue()], [gang]))
    assert [r.job for r in d.restart] == ["ns/gang"]
    assert admitted(d) == {}
    assert "ns/gang" in pending(d)
