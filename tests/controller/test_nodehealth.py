"""Node health in the shell: which taints fail a node at once, and the NotReady history that drives
flap damping (recorded from watch events, carried across updates, turned into Node.flapping)."""

from __future__ import annotations

from builders import T0, node

from gpuq.controller.cache import ClusterCache
from gpuq.controller.nodehealth import HISTORY_LIMIT
from gpuq.controller.snapshot import SnapshotBuilder
from gpuq.core.config import FailoverConfig, SchedulerConfig
from gpuq.core.model import Health

CFG = SchedulerConfig(failover=FailoverConfig(node_flap_threshold=3, node_flap_window_seconds=600))


def flap(cache: ClusterCache, name: str, *down_at: float) -> None:
    """The watch events of a node going NotReady at each time and Ready again a second later."""
    for t in down_at:
        cache.upsert_node(node(name, ready=False, since=t))
        cache.upsert_node(node(name, ready=True, since=t + 1))


def test_history_records_each_not_ready_transition_once() -> None:
    cache = ClusterCache()
    cache.upsert_node(node("n1"))
    flap(cache, "n1", T0 + 10, T0 + 20)
    cache.upsert_node(node("n1", ready=False, since=T0 + 30))
    cache.upsert_node(node("n1", ready=False, since=T0 + 30))  # a status update while still down
    assert cache.nodes["n1"].not_ready_history == (T0 + 10, T0 + 20, T0 + 30)


def test_history_is_bounded() -> None:
    cache = ClusterCache()
    flap(cache, "n1", *(T0 + i for i in range(HISTORY_LIMIT + 5)))
    assert len(cache.nodes["n1"].not_ready_history) == HISTORY_LIMIT


def test_flapping_node_is_damped_until_its_flaps_leave_the_window() -> None:
    cache = ClusterCache()
    flap(cache, "n1", T0 + 10, T0 + 20, T0 + 30)
    cache.upsert_node(node("n2"))
    view = SnapshotBuilder().build(cache, T0 + 40, CFG)
    nodes = {n.name: n for n in view.snapshot.nodes}
    assert nodes["n1"].flapping and not nodes["n2"].flapping
    assert nodes["n1"].health is Health.HEALTHY  # it keeps its gangs
    assert view.wake_at == T0 + 10 + 600  # the loop wakes to lift the damping
    later = SnapshotBuilder().build(cache, T0 + 611, CFG)
    assert not later.snapshot.nodes[0].flapping


def test_two_flaps_under_a_threshold_of_three_are_not_damped() -> None:
    cache = ClusterCache()
    flap(cache, "n1", T0 + 10, T0 + 20)
    assert not SnapshotBuilder().build(cache, T0 + 40, CFG).snapshot.nodes[0].flapping


def test_out_of_service_taint_fails_the_node_at_once() -> None:
    oos = node("oos")
    oos["spec"]["taints"] = [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]
    cache = ClusterCache()
    cache.upsert_node(oos)
    assert SnapshotBuilder().build(cache, T0, CFG).snapshot.nodes[0].health is Health.FAILED
