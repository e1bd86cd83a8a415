"""Faults a chaos run injects, each a function of the run returning what it measured.

Operator: SIGKILL or SIGTERM the leader (a replacement starts a second later, as a ReplicaSet's
would), or SIGSTOP it past its lease (a stalled leader that wakes up later: the fence's case).
Control plane: restart kube-apiserver, freeze it (SIGSTOP/SIGCONT), pause etcd, restart kube-apiserver
with tiny max-requests-inflight limits for a while (a 429 storm). Nodes: a fraction NotReady at once.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from typing import Any

from gpuq.chaos.harness import ChaosRun

APISERVER_DEFAULT_INFLIGHT = {
    "max-requests-inflight": "400",
    "max-mutating-requests-inflight": "200",
    "enable-priority-and-fairness": "true",
}


def kill_leader(run: ChaosRun, restart_after: float = 1.0) -> dict[str, Any]:
    """SIGKILL: no release; a standby takes over when the lease expires."""
    reps = run.replicas
    leader = reps.leader()
    before = reps.identity()
    reps.procs[leader].kill()
    reps.restart_later(leader, restart_after)  # with one replica, nobody else can take over
    takeover = reps.wait_new_leader(leader, reps.timings.duration * 4 + 30, before)
    return {"leader": leader, "takeover_s": round(takeover, 3)}


def stop_leader(run: ChaosRun) -> dict[str, Any]:
    """SIGTERM: the leader releases the lease on its way out; a standby takes over at once."""
    reps = run.replicas
    leader = reps.leader()
    proc = reps.procs[leader]
    assert proc.proc is not None
    before = reps.identity()
    proc.proc.send_signal(signal.SIGTERM)
    takeover = reps.wait_new_leader(leader, reps.timings.duration * 4 + 30, before)
    proc.proc.wait(30)
    reps.procs[leader].start()
    return {"leader": leader, "takeover_s": round(takeover, 3)}


def stall_leader(run: ChaosRun, seconds: float | None = None) -> dict[str, Any]:
    """SIGSTOP the leader for longer than its lease, then let it run again: by then another replica
    (or, alone, itself after a new election) leads, and its stale in-flight writes must be fenced."""
    reps = run.replicas
    leader = reps.leader()
    pause = seconds if seconds is not None else reps.timings.duration + 2
    reps.procs[leader].pause()
    time.sleep(pause)
    reps.procs[leader].resume()
    reps.leader(timeout=reps.timings.duration * 4 + 30)
    return {"leader": leader, "stalled_s": pause}


def restart_apiserver(run: ChaosRun) -> dict[str, Any]:
    t0 = time.monotonic()
    run.cluster.restart_component("kube-apiserver")
    return {"down_s": round(time.monotonic() - t0, 2)}


def freeze(run: ChaosRun, component: str, seconds: float) -> dict[str, Any]:
    """SIGSTOP a control-plane process: connections stay open and nothing answers."""
    run.cluster.pause_component(component)
    try:
        time.sleep(seconds)
    finally:
        run.cluster.resume_component(component)
    return {"component": component, "frozen_s": seconds}


def throttle_apiserver(run: ChaosRun, seconds: float, inflight: int = 4, mutating: int = 2) -> dict[str, Any]:
    """A 429 storm: the API server restarted with tiny in-flight limits and without priority and
    fairness (whose queues would absorb the excess), so requests beyond them get 429 at once."""
    run.cluster.restart_component(
        "kube-apiserver",
        {
            "max-requests-inflight": str(inflight),
            "max-mutating-requests-inflight": str(mutating),
            "enable-priority-and-fairness": "false",
        },
    )
    time.sleep(seconds)
    run.cluster.restart_component("kube-apiserver", APISERVER_DEFAULT_INFLIGHT)
    return {"inflight": inflight, "mutating": mutating, "throttled_s": seconds}


SETTLED_SECONDS = 10.0  # every node Ready this long in a row before the next node fault


def nodes_not_ready(run: ChaosRun, fraction: float, seconds: float, seed: int = 7) -> dict[str, Any]:
    """A fraction of the nodes NotReady at once (their kubelets stop), then back. Counts the gang
    restarts that happened meanwhile: gpuq should see a disruption and restart none."""
    names = sorted(n.metadata.name for n in run.core.list_node().items)
    down = random.Random(seed).sample(names, max(1, round(len(names) * fraction)))
    # Start from a settled cluster: nodes NotReady after the previous fault (an API-server restart
    # stops every heartbeat for a while; after a 429 storm some heartbeats lag and nodes flap)
    # belong to that fault, not to this one. Settled: every node Ready for 10 s in a row.
    settle, stable_since = time.monotonic() + 120, time.monotonic()
    while time.monotonic() < settle and time.monotonic() - stable_since < SETTLED_SECONDS:
        if not all(run.cluster.node_ready(n) for n in names):
            stable_since = time.monotonic()
        time.sleep(0.5)
    before = run.restarts()
    _each(run.cluster.fail_node, down)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(not run.cluster.node_ready(n) for n in down):
        time.sleep(0.5)
    spread = _not_ready_spread(run, set(down))
    time.sleep(seconds)
    during = run.restarts() - before
    _each(run.cluster.recover_node, down)
    return {"nodes": len(down), "of": len(names), "restarts_during": during, "not_ready_spread_s": spread}


def _not_ready_spread(run: ChaosRun, names: set[str]) -> float:
    """Seconds between the first and the last NotReady transition of these nodes: how far apart
    nodes that lost their heartbeat together turned NotReady (gpuq waits for such a burst to settle)."""
    times = [
        c.last_transition_time.timestamp()
        for n in run.core.list_node().items
        if n.metadata.name in names
        for c in (n.status.conditions or [])
        if c.type == "Ready" and c.status != "True"
    ]
    return round(max(times) - min(times), 1) if times else 0.0


def _each(fn: Any, items: list[str]) -> None:
    threads = [threading.Thread(target=fn, args=(i,)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
