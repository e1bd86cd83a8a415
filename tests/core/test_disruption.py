"""Many nodes NotReady at once is a disruption (control plane, network), not that many node
failures: NotReady alone fails no gang there until disruption_max_seconds have passed, while real
evidence (a deleted node, an out-of-service node) still fails gangs at once."""

from __future__ import annotations

from dataclasses import replace

from gpuq.core import SchedulerConfig
from gpuq.core.config import FailoverConfig
from gpuq.core.failover import disruptions, failed_nodes, node_disruptions
from gpuq.core.model import Health
from gpuq.core.topology import WHOLE_CLUSTER

from .helpers import NOW, cluster, job, queue, run, snap

NODES = cluster(racks=4, nodes_per_rack=3)  # 12 nodes, one zone
CFG = SchedulerConfig()
GRACE = CFG.failover.not_ready_grace_seconds


def not_ready(names: set[str], since: float = NOW - GRACE - 5) -> list:  # type: ignore[type-arg]
    return [replace(n, not_ready_since=since) if n.name in names else n for n in NODES]


def gangs_on(names: list[str]) -> list:  # type: ignore[type-arg]
    return [job(f"ns/{n}", gpus=8, on=[n]) for n in names]


def test_a_third_of_the_nodes_not_ready_at_once_fails_no_gang() -> None:
    down = [n.name for n in NODES[:4]]  # 4 of 12
    d = run(snap(not_ready(set(down)), [queue()], gangs_on(down)))
    assert d.restart == ()


def test_two_nodes_not_ready_still_fail_over() -> None:
    down = [n.name for n in NODES[:2]]
    d = run(snap(not_ready(set(down)), [queue()], gangs_on(down)))
    assert sorted(r.job for r in d.restart) == sorted(f"ns/{n}" for n in down)


def test_failover_resumes_once_the_disruption_lasts_too_long() -> None:
    down = [n.name for n in NODES[:4]]
    since = NOW - CFG.failover.disruption_max_seconds - 1
    d = run(snap(not_ready(set(down), since), [queue()], gangs_on(down)))
    assert len(d.restart) == 4


def test_real_failures_are_not_held() -> None:
    down = {n.name for n in NODES[:5]}  # 4 NotReady besides the failed one: still a disruption
    nodes = [replace(n, health=Health.FAILED) if n.name == NODES[0].name else n for n in not_ready(down)]
    d = run(snap(nodes, [queue()], gangs_on([NODES[0].name, NODES[1].name])))
    assert [r.job for r in d.restart] == [f"ns/{NODES[0].name}"]


def test_one_zone_disrupted_is_held_even_when_the_cluster_is_not() -> None:
    cfg = FailoverConfig()
    zones = [("z1", 100.0)] * 3 + [("z2", 100.0)]
    sizes = {WHOLE_CLUSTER: 40, "z1": 5, "z2": 35}
    active = disruptions(zones, sizes, 150.0, cfg)
    assert set(active) == {"z1"} and active["z1"].until == 100.0 + cfg.disruption_max_seconds


def test_the_disruption_starts_when_the_threshold_is_crossed() -> None:
    cfg = FailoverConfig(disruption_fraction=0.3, disruption_min_nodes=3, disruption_max_seconds=60)
    times = [(None, t) for t in (10.0, 20.0, 30.0, 40.0)]
    active = disruptions(times, {WHOLE_CLUSTER: 10}, 50.0, cfg)
    assert active[WHOLE_CLUSTER].since == 30.0 and active[WHOLE_CLUSTER].until == 90.0
    assert disruptions(times, {WHOLE_CLUSTER: 10}, 95.0, cfg) == {}


def test_the_shell_and_the_core_agree_on_failed_nodes() -> None:
    held = not_ready({n.name for n in NODES[:4]})
    assert failed_nodes(held, NOW, CFG.failover) == frozenset() and node_disruptions(held, NOW, CFG.failover)
    two = not_ready({NODES[0].name, NODES[1].name})
    assert failed_nodes(two, NOW, CFG.failover) == {NODES[0].name, NODES[1].name}


def test_a_node_a_disruption_held_gets_a_whole_grace_period_after_it() -> None:
    """A disruption dissolving node by node: the nodes still on their way back are not failed over
    the moment the NotReady share drops below the threshold."""
    name = NODES[0].name
    late = replace(NODES[0], not_ready_since=NOW - 200, disrupted_at=NOW - GRACE + 2)
    nodes = [late, *NODES[1:]]
    assert run(snap(nodes, [queue()], gangs_on([name]))).restart == ()
    expired = replace(late, disrupted_at=NOW - GRACE - 1)
    assert len(run(snap([expired, *NODES[1:]], [queue()], gangs_on([name]))).restart) == 1


def test_the_shell_remembers_held_nodes_until_they_are_ready() -> None:
    from gpuq.core.failover import remember_disruptions

    held = not_ready({n.name for n in NODES[:4]})
    active = node_disruptions(held, NOW, CFG.failover)
    memory = remember_disruptions(held, active, NOW, {})
    assert memory == {n.name: NOW for n in NODES[:4]}
    # Two came back: the disruption is over; the other two keep the time they were last held.
    two = not_ready({NODES[0].name, NODES[1].name})
    later = remember_disruptions(two, node_disruptions(two, NOW + 5, CFG.failover), NOW + 5, memory)
    assert later == {NODES[0].name: NOW, NODES[1].name: NOW}


def test_a_burst_still_forming_holds_failover_until_it_stops_growing() -> None:
    """Heartbeats lost together turn NotReady over a spread that can exceed the grace period: three
    of twelve NotReady (below the share) wait until no node turned NotReady for the settle time."""
    cfg = CFG.failover
    down = [n.name for n in NODES[:3]]
    first, last = NOW - GRACE - 5, NOW - cfg.disruption_settle_seconds + 3
    nodes = [
        replace(n, not_ready_since=first if n.name != down[-1] else last) if n.name in down else n
        for n in NODES
    ]
    gangs = gangs_on(down[:2])  # on the two that are past their grace period
    assert run(snap(nodes, [queue()], gangs)).restart == ()
    forming = node_disruptions(nodes, NOW, cfg)[WHOLE_CLUSTER]
    assert not forming.confirmed and forming.until == last + cfg.disruption_settle_seconds
    settled = [replace(n, not_ready_since=n.not_ready_since - 4) if n.not_ready_since else n for n in nodes]
    restarted = sorted(r.job for r in run(snap(settled, [queue()], gangs)).restart)
    assert restarted == sorted(f"ns/{n}" for n in down[:2])


def test_a_forming_burst_is_not_remembered_as_a_disruption() -> None:
    """Nodes a forming burst held have had their grace period: once it settles below the share they
    fail over at once instead of waiting a second grace period."""
    from gpuq.core.failover import remember_disruptions

    three = not_ready({n.name for n in NODES[:3]}, since=NOW - 1)
    active = node_disruptions(three, NOW, CFG.failover)
    assert active and not active[WHOLE_CLUSTER].confirmed
    assert remember_disruptions(three, active, NOW, {}) == {}


def test_a_trickle_of_failures_is_not_held_longer_than_a_disruption() -> None:
    cfg = FailoverConfig(disruption_fraction=0.5, disruption_min_nodes=3, disruption_max_seconds=60)
    times = [(None, 10.0 * k) for k in range(8)]  # one more every 10 s (below 15): never settles
    assert disruptions(times, {WHOLE_CLUSTER: 20}, 75.0, cfg)[WHOLE_CLUSTER].until == 20.0 + 60
    assert disruptions(times, {WHOLE_CLUSTER: 20}, 80.0, cfg) == {}
