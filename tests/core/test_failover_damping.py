"""Failure detection semantics and storm control: lifecycle taints honour the grace period, flapping
nodes are damped, restart back-off grows, and an avoided node is a last resort rather than never."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.core import FailoverConfig, SchedulerConfig
from gpuq.core.failover import NOT_READY_TAINTS, backoff_seconds, flap_damped_until
from gpuq.core.model import Constraints, Taint, TaintEffect, Toleration

from .helpers import NOW, admitted, cluster, codes, job, queue, run, snap

NODES = cluster(racks=2, nodes_per_rack=2)  # n0000 n0001 | n0010 n0011, 8 GPUs each
GRACE = SchedulerConfig().failover.not_ready_grace_seconds


def with_node(name: str, nodes: list = NODES, **kw: object) -> list:  # type: ignore[type-arg]
    return [replace(n, **kw) if n.name == name else n for n in nodes]


@pytest.mark.parametrize("key", sorted(NOT_READY_TAINTS))
def test_lifecycle_taint_waits_for_the_grace_period(key: str) -> None:
    """The controller-manager taints a node the moment it turns NotReady; that is no failure yet."""
    taint = Taint(key, "", TaintEffect.NO_EXECUTE)
    gang = [job("ns/a", gpus=8, on=["n0000"])]
    early = with_node("n0000", taints=(taint,), not_ready_since=NOW - GRACE + 1)
    assert run(snap(early, [queue()], gang)).restart == ()
    late = with_node("n0000", taints=(taint,), not_ready_since=NOW - GRACE)
    d = run(snap(late, [queue()], gang))
    assert [r.job for r in d.restart] == ["ns/a"] and "NotReady for 10s (grace 10s)" in d.restart[0].reason


def test_lifecycle_taint_on_a_ready_node_is_not_a_failure() -> None:
    """On recovery the taint may outlive the NotReady condition by a moment: the node is fine."""
    taint = Taint("node.kubernetes.io/unreachable", "", TaintEffect.NO_EXECUTE)
    d = run(snap(with_node("n0000", taints=(taint,)), [queue()], [job("ns/a", gpus=8, on=["n0000"])]))
    assert d.restart == ()


def test_other_no_execute_taint_fails_at_once_even_while_not_ready_within_grace() -> None:
    taint = Taint("gpuq.dev/xid", "79", TaintEffect.NO_EXECUTE)
    nodes = with_node("n0000", taints=(taint,), not_ready_since=NOW - 1)
    d = run(snap(nodes, [queue()], [job("ns/a", gpus=8, on=["n0000"])]))
    assert d.restart[0].reason == "node n0000 tainted gpuq.dev/xid=79:NoExecute"


def test_tolerating_every_taint_still_fails_after_the_grace_period() -> None:
    """Tolerations say nothing about a dead node: NotReady beyond grace fails the gang regardless."""
    tolerant = job(
        "ns/a", gpus=8, on=["n0000"], constraints=Constraints(tolerations=(Toleration("", "Exists"),))
    )
    taint = Taint("node.kubernetes.io/unreachable", "", TaintEffect.NO_EXECUTE)
    nodes = with_node("n0000", taints=(taint,), not_ready_since=NOW - GRACE - 5)
    assert [r.job for r in run(snap(nodes, [queue()], [tolerant])).restart] == ["ns/a"]


def test_flap_damping_rule() -> None:
    cfg = FailoverConfig(node_flap_threshold=3, node_flap_window_seconds=600)
    assert flap_damped_until([], cfg) is None
    assert flap_damped_until([10.0, 20.0], cfg) is None
    # The third-most-recent transition sets the end: damped until it is a window old.
    assert flap_damped_until([30.0, 10.0, 20.0], cfg) == 610.0
    assert flap_damped_until([10.0, 20.0, 30.0, 700.0], cfg) == 620.0


def test_flapping_node_gets_no_new_work_but_keeps_what_runs() -> None:
    nodes = with_node("n0000", flapping=True)
    nodes = [n for n in nodes if n.name in ("n0000", "n0001")]
    d = run(snap(nodes, [queue()], [job("ns/running", gpus=4, on=["n0000"]), job("ns/new", gpus=8)]))
    assert d.restart == ()
    assert admitted(d) == {"ns/new": ("n0001",)}
    empty = run(snap(nodes, [queue()], [job("ns/x", replicas=2, gpus=8)]))
    assert empty.admit == () and "ns/x" in codes(empty)  # n0000 is free but damped: the gang waits


def test_restart_back_off_doubles_and_is_capped() -> None:
    cfg = FailoverConfig(backoff_base_seconds=5, backoff_max_seconds=60)
    assert [backoff_seconds(k, cfg) for k in range(7)] == [0.0, 5.0, 10.0, 20.0, 40.0, 60.0, 60.0]


def test_recovering_job_returns_to_a_recovered_node_when_nothing_else_fits() -> None:
    """No spare capacity: the job waits, then resumes once its failed node is back."""
    nodes = [n for n in NODES if n.name in ("n0000", "n0001")]
    recovering = job(
        "ns/r",
        replicas=2,
        gpus=8,
        recovering=True,
        previous_placement=("n0000", "n0001"),
        avoid_nodes=frozenset({"n0001"}),
    )
    down = run(snap(with_node("n0001", nodes, not_ready_since=NOW - 1), [queue()], [recovering]))
    assert "avoiding 1 failed nodes" in down.pending[0].reason
    back = run(snap(nodes, [queue()], [recovering]))
    assert sorted(admitted(back)["ns/r"]) == ["n0000", "n0001"] and back.admit[0].restart
    damped = run(snap(with_node("n0001", nodes, flapping=True), [queue()], [recovering]))
    assert damped.admit == ()  # but never onto a node that keeps flapping


def test_recovering_job_still_prefers_nodes_it_did_not_fail_on() -> None:
    recovering = job(
        "ns/r", gpus=8, recovering=True, previous_placement=("n0000",), avoid_nodes=frozenset({"n0000"})
    )
    d = run(snap(NODES, [queue()], [recovering]))
    assert admitted(d)["ns/r"] != ("n0000",)


def test_failed_nodes_stay_avoided_after_the_recovery() -> None:
    """Issue 33: a job back in its queue (drained, preempted, refused by a kubelet) after a failover
    was placed on a node of its failedNodes while equal nodes were free. The rule is the recovery's:
    avoided while anything else fits, a recovered one taken rather than waiting."""
    queued = job("ns/q", gpus=8, avoid_nodes=frozenset({"n0000"}), restart_count=1)
    d = run(snap(NODES, [queue()], [queued]))
    assert admitted(d)["ns/q"] != ("n0000",)  # best fit would take n0000, the first empty node
    alone = [n for n in NODES if n.name in ("n0000", "n0001")]
    busy = job("ns/busy", gpus=8, on=["n0001"])
    assert admitted(run(snap(alone, [queue()], [busy, queued])))["ns/q"] == ("n0000",)


def test_a_job_preempts_rather_than_return_to_a_failed_node() -> None:
    """Preemption searches avoid them too, as the recovery's do: a victim elsewhere, not the node."""
    alone = [n for n in NODES if n.name in ("n0000", "n0001")]
    low = job("ns/low", gpus=8, on=["n0001"], priority=0)
    high = job("ns/high", gpus=8, priority=5, avoid_nodes=frozenset({"n0000"}), restart_count=1)
    other = job("ns/other", gpus=8, on=["n0000"], priority=0)
    d = run(snap(alone, [queue()], [low, other, high]))
    assert [p.victim for p in d.preempt] == ["ns/low"]
