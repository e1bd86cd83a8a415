"""The operator's extender view sees other schedulers' pods as the watch reports them, between
scheduling cycles: kube-scheduler binds a burst of small pods faster than gpuq cycles, and each
answer must pack the next pod next to the ones just bound (in CI a view stale for a whole burst
spread 200 one-GPU pods over every node)."""

from __future__ import annotations

from gpuq.controller import bodies as b
from gpuq.controller.cache import ClusterCache
from gpuq.controller.loop import SchedulingLoop
from gpuq.controller.metrics import Metrics
from gpuq.controller.writer import Writer
from gpuq.core import SchedulerConfig
from gpuq.core.extender import MAX_SCORE, prioritize


def loop_on(nodes: list[str]) -> SchedulingLoop:
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("web")], "1")
    cache.replace("node", [b.node(n) for n in nodes], "1")
    cache.replace("queue", [b.queue("q")], "1")
    cache.replace("job", [], "1")
    cache.replace("pod", [], "1")
    metrics = Metrics()
    writer = Writer(None, cache, metrics, on_done=lambda: None)  # type: ignore[arg-type]
    return SchedulingLoop(cache, writer, SchedulerConfig(), metrics, clock=lambda: b.T0)


def inference(name: str, node: str, gpus: int) -> dict[str, object]:
    return b.pod(name, ns="web", node_name=node, gpus=gpus, scheduler="default-scheduler")


async def test_pods_bound_after_the_cycle_change_the_answers_before_the_next_cycle() -> None:
    loop = loop_on(["n0", "n1"])
    loop.cycle()
    view = loop.extender_view
    assert view is not None and view.free == {"n0": 8, "n1": 8}
    loop.cache.upsert_pod(inference("serve-0", "n0", 3))
    cycles = loop.cycles
    view = loop.extender_view
    assert view is not None and loop.cycles == cycles
    assert view.free == {"n0": 5, "n1": 8}
    assert dict(prioritize(view, 1, ["n0", "n1"])) == {"n0": MAX_SCORE, "n1": 0}
    loop.cache.delete_pod(inference("serve-0", "n0", 3))
    view = loop.extender_view
    assert view is not None and view.free == {"n0": 8, "n1": 8}


async def test_a_new_cycle_starts_from_the_pods_bound_now() -> None:
    loop = loop_on(["n0", "n1"])
    loop.cycle()
    assert loop.extender_view is not None
    loop.cache.upsert_pod(inference("serve-0", "n1", 2))
    loop.cycle()
    loop.cache.upsert_pod(inference("serve-1", "n1", 4))  # after the cycle, before the view is built
    view = loop.extender_view
    assert view is not None and view.free == {"n0": 8, "n1": 2}


async def test_a_lingering_worker_of_a_job_gpuq_no_longer_holds_still_takes_gpus() -> None:
    """kube-scheduler counts it too, but not gpuq's unbound reservations: the view must count both."""
    loop = loop_on(["n0", "n1"])
    loop.cycle()
    assert loop.extender_view is not None
    loop.cache.upsert_pod(b.pod("gone-1-0", ns="web", node_name="n1", job_name="gone", gpus=4))
    view = loop.extender_view
    assert view is not None and view.free == {"n0": 8, "n1": 4}


async def test_a_closed_loop_no_longer_collects_touched_nodes() -> None:
    """The cache outlives leadership terms; each term's loop must not leave a set filling forever."""
    loop = loop_on(["n0"])
    loop.cycle()  # the snapshot builder now watches nodes too
    other = loop.cache.watch_nodes()  # a reader that is not the loop's
    loop.close()
    loop.cache.upsert_pod(inference("serve-0", "n0", 1))
    assert loop._extender_nodes == set() and loop.builder._touched_nodes == set()
    assert other == {"n0"}  # the cache still tells the readers left
