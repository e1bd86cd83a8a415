"""Deltas from the source: the snapshot builder updates what the cache reports changed and hands the
core's kept index exactly those changes. Through random event sequences of every kind, each kept
build must equal a fresh builder's, the delta must name every change a comparison of the snapshots
finds, and the kept index must decide exactly what a fresh index decides."""

from __future__ import annotations

import random

import pytest
from builders import T0, gang_pods, iso, job, namespace, node, placed_status, pod, queue

from gpuq.controller.cache import ClusterCache
from gpuq.controller.snapshot import SnapshotBuilder, View
from gpuq.core import schedule
from gpuq.core.config import SchedulerConfig
from gpuq.core.failover import failed_nodes, node_disruptions
from gpuq.core.incremental import IncrementalSchedule, snapshot_delta
from gpuq.core.model import Snapshot

CFG = SchedulerConfig()


class World:
    """A cache and the random events a cluster sends it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.cache = ClusterCache()
        self.nodes = [f"n{i}" for i in range(6)]
        self.node_bodies = {n: node(n, rack=f"r{i % 2}", zone=f"z{i % 2}") for i, n in enumerate(self.nodes)}
        for body in self.node_bodies.values():
            self.cache.upsert_node(body)
        self.cache.upsert_queue(queue("q", nominal=32))
        self.cache.upsert_queue(queue("r", nominal=8, cohort="c"))
        self.cache.upsert_queue(queue("s", nominal=8, cohort="c"))
        for ns in ("team-a", "team-b", "web"):
            self.cache.upsert_namespace(namespace(ns))
        self.jobs: dict[str, tuple[str, str, int, int]] = {}  # key -> job()'s arguments
        self.foreign: list[str] = []
        self.now = T0 + 100
        self.evicting: frozenset[str] = frozenset()

    def step(self, i: int) -> None:
        rng, cache = self.rng, self.cache
        op = rng.randrange(14)
        key = rng.choice(sorted(self.jobs)) if self.jobs else None
        if op <= 2 or key is None:
            ns = rng.choice(["team-a", "team-b"])
            key = f"{ns}/j{i}"
            self.jobs[key] = (
                ns,
                rng.choice(["q", "r", "s", "missing"]),
                rng.randint(1, 3),
                rng.choice([1, 4, 8]),
            )
            cache.upsert_job(job(f"j{i}", *self.jobs[key]))
            return
        ns, name = key.split("/")
        if op == 3:  # placed, with or without its pods
            placement = [rng.choice(self.nodes) for _ in range(self.jobs[key][2])]
            raw = job(name, *self.jobs[key])
            raw["status"] = placed_status(placement, phase=rng.choice(["Admitted", "Running"]))
            cache.upsert_job(raw)
            if rng.random() < 0.7:
                for p in gang_pods(
                    name, placement, ns=ns, phase=rng.choice(["Running", "Running", "Succeeded"])
                ):
                    cache.upsert_pod(p)
        elif op == 4:  # waits with a back-off
            raw = job(name, *self.jobs[key])
            raw["status"] = {
                "phase": "Recovering",
                "attempt": 1,
                "notBefore": iso(self.now + rng.choice([-5, 5, 30])),
            }
            cache.upsert_job(raw)
        elif op == 5:
            if rng.random() < 0.6:
                cache.assume(
                    key, 1, tuple(rng.choice(self.nodes) for _ in range(self.jobs[key][2])), self.now
                )
            else:
                cache.forget(key)
        elif op == 6:
            for p in list(cache.pods_of(key)):
                cache.delete_pod({"metadata": {"name": p.name, "namespace": p.namespace}})
        elif op == 7:
            cache.delete_job({"metadata": {"name": name, "namespace": ns}})
            del self.jobs[key]
        elif op == 8:
            self.node_health(rng.choice(self.nodes))
        elif op == 9:
            self.foreign_pod(i)
        elif op == 10:
            self.node_joins_or_leaves(i)
        elif op == 11:
            cache.upsert_queue(queue("r", nominal=rng.choice([4, 8]), cohort="c"))
        elif op == 12:
            self.evicting = frozenset(rng.sample(sorted(self.jobs), k=min(len(self.jobs), rng.randint(0, 2))))
        else:
            self.now += rng.choice([0.0, 3.0, 20.0, 400.0])

    def node_health(self, name: str) -> None:
        """NotReady (now or a while ago), Ready again, cordoned or uncordoned."""
        body = self.node_bodies[name]
        roll = self.rng.random()
        if roll < 0.5:
            ready = roll < 0.2
            since = self.now - self.rng.choice([1.0, 100.0, 1000.0])
            body["status"]["conditions"] = [
                {"type": "Ready", "status": "True" if ready else "Unknown", "lastTransitionTime": iso(since)}
            ]
        else:
            body["spec"] = {"unschedulable": True} if roll < 0.75 else {}
        self.node_bodies[name] = {**body, "metadata": {**body["metadata"]}}
        self.cache.upsert_node(self.node_bodies[name])

    def foreign_pod(self, i: int) -> None:
        """Another scheduler binds a pod, or one of its pods goes away."""
        if self.foreign and self.rng.random() < 0.4:
            name = self.foreign.pop(self.rng.randrange(len(self.foreign)))
            self.cache.delete_pod({"metadata": {"name": name, "namespace": "web"}})
            return
        name = f"web-{i}"
        self.foreign.append(name)
        gpus = self.rng.choice([0, 1, 2])
        self.cache.upsert_pod(pod(name, "web", self.rng.choice(self.nodes), gpus=gpus, scheduler="other"))

    def node_joins_or_leaves(self, i: int) -> None:
        if self.rng.random() < 0.5 and len(self.nodes) > 3:
            gone = self.nodes.pop(self.rng.randrange(len(self.nodes)))
            del self.node_bodies[gone]
            self.cache.delete_node({"metadata": {"name": gone, "uid": f"uid--{gone}"}})
        else:
            name = f"m{i}"
            self.nodes.append(name)
            self.node_bodies[name] = node(name, rack="r9", zone=self.rng.choice(["z0", "z1"]))
            self.cache.upsert_node(self.node_bodies[name])


def fresh_view(w: World) -> View:
    builder = SnapshotBuilder(verify=False)
    try:
        return builder.build(w.cache, w.now, CFG, w.evicting)
    finally:
        builder.close()


def covered(view: View, before: Snapshot) -> bool:
    """The view's delta names every node and job that comparing it with `before` finds changed."""
    assert view.delta is not None and view.delta.base is before
    d, found = view.delta, snapshot_delta(before, view.snapshot)
    return (
        {n.name for n in found.nodes} <= {n.name for n in d.nodes}
        and {j.key for j in found.jobs} <= {j.key for j in d.jobs}
        and set(found.removed_jobs) <= set(d.removed_jobs)
        and not found.removed_nodes
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_deltas_from_the_cache_decide_as_a_fresh_build(seed: int) -> None:
    w = World(random.Random(seed))
    kept = SnapshotBuilder(verify=False)
    core = IncrementalSchedule()
    before: Snapshot | None = None
    for i in range(300):
        w.step(i)
        view, fresh = kept.build(w.cache, w.now, CFG, w.evicting), fresh_view(w)
        where = f"seed {seed}, step {i}"
        assert view == fresh, where
        assert (view.tally, view.scope_sizes, view.suspects) == (
            fresh.tally,
            fresh.scope_sizes,
            fresh.suspects,
        )
        # The suspects and zone sizes give the failover what all the nodes give it.
        nodes, f = view.snapshot.nodes, CFG.failover
        assert node_disruptions(view.suspects, w.now, f, view.scope_sizes) == node_disruptions(
            nodes, w.now, f
        )
        assert failed_nodes(view.suspects, w.now, f, view.scope_sizes) == failed_nodes(nodes, w.now, f)
        if view.delta is not None:
            assert before is not None and covered(view, before), where
        decided = core(view.snapshot, w.now, CFG, delta=view.delta)
        assert decided == schedule(fresh.snapshot, w.now, CFG), where
        before = view.snapshot
    kept.close()
    assert core.handed > 150  # most cycles took the builder's delta, not a comparison


def test_a_kept_build_after_nothing_changed_hands_an_empty_delta() -> None:
    w = World(random.Random(0))
    for i in range(20):
        w.step(i)
    kept = SnapshotBuilder(verify=False)
    first = kept.build(w.cache, w.now, CFG)
    again = kept.build(w.cache, w.now, CFG)
    assert first.delta is None and again.snapshot == first.snapshot
    assert again.delta is not None and again.delta.size == 0 and again.changed == frozenset()
