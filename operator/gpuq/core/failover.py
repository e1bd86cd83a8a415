"""Failover planning: which running gangs lost a node, and when they may be re-placed.

A gang fails when any of its ranks sits on a node that is FAILED, NotReady/Unknown for at least the
grace period, deleted (absent from the snapshot), tainted NoExecute without a matching toleration, or
reporting fewer healthy GPUs than are bound on it. Jobs already being evicted are left alone: they are
on their way out. Restart back-off: the first restart is immediate, the k-th waits
min(backoff_max, backoff_base * 2**(k - 2)) seconds.

The NoExecute taints the node lifecycle controller adds the moment a node turns NotReady
(node.kubernetes.io/not-ready, node.kubernetes.io/unreachable) are the NotReady condition seen again:
they do not fail a gang by themselves, the grace period (counted from the NotReady transition) does.
Any other NoExecute taint fails the gangs that do not tolerate it at once.

Disruptions: when at least `disruption_fraction` of the nodes of the cluster (or of one zone) and at
least `disruption_min_nodes` are NotReady at once, NotReady is treated as a control-plane or network
event (an API server that froze, a partitioned control plane), as the node lifecycle controller does
with its unhealthy-zone threshold: NotReady alone fails no gang on those nodes for up to
`disruption_max_seconds` after the threshold was crossed. Evidence of a real failure (node deleted,
out-of-service taint, bad GPUs, another NoExecute taint) still fails gangs at once. A node a
disruption held gets a whole grace period after it (Node.disrupted_at, remembered by the shell):
when a disruption dissolves node by node, the nodes still on their way back are not failed over the
moment the NotReady share drops below the threshold.

Nodes that lose their heartbeat together do not turn NotReady together: the transitions spread over
the node lease renewal interval plus the node-monitor-period (15 s with Kubernetes' defaults, more
while the control plane catches up), which can be longer than the grace period. So when at least
`disruption_min_nodes` of a scope are NotReady but fewer than the share, their failover waits until
no new NotReady transition came for `disruption_settle_seconds` (a forming disruption, unconfirmed),
then the share decides. One or two nodes failing alone fail over after the grace period as before.

Flap damping: a node whose Ready condition left True `node_flap_threshold` times within
`node_flap_window_seconds` receives no new work until the oldest of those transitions leaves the
window (see flap_damped_until); what runs there keeps running unless the node fails for real.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuq.core.config import FailoverConfig
from gpuq.core.constraints import untolerated
from gpuq.core.index import ClusterIndex
from gpuq.core.model import Health, Job, Node, TaintEffect
from gpuq.core.topology import WHOLE_CLUSTER, scope_sizes, zone_of

# Taints that only restate NotReady/Unknown: the grace period applies to them, not the taint.
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


@dataclass(frozen=True, slots=True)
class Disruption:
    """Many nodes NotReady at once in `scope` (WHOLE_CLUSTER or a zone): until `until`, NotReady
    alone fails no gang there. `confirmed` False: a burst still forming (at least
    disruption_min_nodes NotReady, below the share): held until it stops growing, then judged."""

    scope: str
    not_ready: int
    nodes: int
    since: float  # when the threshold was crossed (the NotReady transition that crossed it)
    until: float
    confirmed: bool = True


def disruptions(
    not_ready: Iterable[tuple[str | None, float]], sizes: Mapping[str, int], now: float, cfg: FailoverConfig
) -> dict[str, Disruption]:
    """Active disruptions by scope. `not_ready`: (zone, NotReady since) of each NotReady node that has
    not failed for another reason; `sizes`: nodes per scope (scope_sizes)."""
    times: dict[str, list[float]] = {}
    for zone, since in not_ready:
        times.setdefault(WHOLE_CLUSTER, []).append(since)
        if zone is not None:
            times.setdefault(zone, []).append(since)
    out = {}
    for scope, ts in times.items():
        size = sizes.get(scope, 0)
        if size == 0 or cfg.disruption_fraction <= 0 or len(ts) < cfg.disruption_min_nodes:
            continue
        ts.sort()
        need = max(cfg.disruption_min_nodes, math.ceil(cfg.disruption_fraction * size))
        if len(ts) >= need:
            since, until, confirmed = ts[need - 1], ts[need - 1] + cfg.disruption_max_seconds, True
        else:
            # Nodes that lost their heartbeat together turn NotReady over a spread (lease renewal
            # interval + node-monitor-period, more when the control plane lags): wait until the
            # burst stops growing before failing any of it, never longer than a disruption lasts.
            since = ts[cfg.disruption_min_nodes - 1]
            until = min(ts[-1] + cfg.disruption_settle_seconds, since + cfg.disruption_max_seconds)
            confirmed = False
        if now < until:
            out[scope] = Disruption(scope, len(ts), size, since, until, confirmed)
    return out


def held(node: Node, active: Mapping[str, Disruption]) -> bool:
    """Whether a disruption holds back the failover of this (NotReady) node."""
    zone = zone_of(node)
    return WHOLE_CLUSTER in active or (zone is not None and zone in active)


def node_disruptions(
    nodes: Sequence[Node], now: float, cfg: FailoverConfig, sizes: Mapping[str, int] | None = None
) -> dict[str, Disruption]:
    """Active disruptions of a node list (the shell's view; the core uses the index's counts).
    With `sizes` (scope_sizes of the whole cluster), `nodes` need hold only the NotReady and failed
    ones: the shell keeps those apart, so a cycle need not walk every node."""
    not_ready = [
        (zone_of(nd), nd.not_ready_since)
        for nd in nodes
        if nd.not_ready_since is not None and nd.health is not Health.FAILED
    ]
    if not not_ready:
        return {}
    return disruptions(not_ready, scope_sizes(nodes) if sizes is None else sizes, now, cfg)


def remember_disruptions(
    nodes: Sequence[Node], active: Mapping[str, Disruption], now: float, memory: Mapping[str, float]
) -> dict[str, float]:
    """The shell's memory of Node.disrupted_at after a cycle: `now` for each NotReady node a
    disruption holds, the remembered time for other NotReady nodes, nothing for Ready ones."""
    out = {}
    for nd in nodes:
        if nd.not_ready_since is None:
            continue
        if held(nd, {k: d for k, d in active.items() if d.confirmed}):
            out[nd.name] = now
        elif nd.name in memory:
            out[nd.name] = memory[nd.name]
    return out


def grace_start(nd: Node) -> float | None:
    """When a NotReady node's failover grace period started: its NotReady transition, or the last
    time a disruption held it, whichever is later."""
    if nd.not_ready_since is None:
        return None
    return max(nd.not_ready_since, nd.disrupted_at) if nd.disrupted_at is not None else nd.not_ready_since


def not_ready_failed(nd: Node, now: float, cfg: FailoverConfig, active: Mapping[str, Disruption]) -> bool:
    """NotReady long enough to fail its gangs, and no disruption holds it."""
    start = grace_start(nd)
    return start is not None and now - start >= cfg.not_ready_grace_seconds and not held(nd, active)


def failed_nodes(
    nodes: Sequence[Node], now: float, cfg: FailoverConfig, sizes: Mapping[str, int] | None = None
) -> frozenset[str]:
    """Nodes that fail every gang on them now for health alone (FAILED, or NotReady past the grace
    period and not held by a disruption): the shell force-deletes pods there. `sizes`: as for
    node_disruptions."""
    active = node_disruptions(nodes, now, cfg, sizes)
    return frozenset(
        nd.name for nd in nodes if nd.health is Health.FAILED or not_ready_failed(nd, now, cfg, active)
    )


@dataclass(frozen=True, slots=True)
class Failure:
    job: str
    nodes: tuple[str, ...]  # the failed nodes under this job, sorted
    reason: str


def index_disruptions(ix: ClusterIndex, now: float, cfg: FailoverConfig) -> dict[str, Disruption]:
    """Active disruptions, from the index (NotReady nodes are always among its suspects)."""
    not_ready = [
        (zone_of(nd), nd.not_ready_since)
        for nd in (ix.nodes[i] for i in ix.suspects)
        if nd.not_ready_since is not None and nd.health is not Health.FAILED
    ]
    return disruptions(not_ready, ix.scope_sizes, now, cfg) if not_ready else {}


def node_failure(
    ix: ClusterIndex, i: int, now: float, cfg: FailoverConfig, active: Mapping[str, Disruption] | None = None
) -> str | None:
    """Why node i fails every gang on it (None if it does not, or only per job: NoExecute)."""
    nd = ix.nodes[i]
    if nd.health is Health.FAILED:
        return f"node {nd.name} failed"
    if nd.not_ready_since is not None and not_ready_failed(nd, now, cfg, active or {}):
        return (
            f"node {nd.name} NotReady for {now - nd.not_ready_since:.0f}s "
            f"(grace {cfg.not_ready_grace_seconds:.0f}s)"
        )
    if nd.healthy_gpus is not None:
        bound = nd.used_by_others.gpus + ix.used_gpu[i]
        if nd.healthy_gpus < bound:
            return f"node {nd.name} reports {nd.healthy_gpus} healthy GPUs for {bound} bound"
    return None


def detect(ix: ClusterIndex, now: float, cfg: FailoverConfig) -> list[Failure]:
    """Every running job that lost a node, sorted by job key."""
    per_job: dict[str, list[tuple[str, str]]] = {}
    active = index_disruptions(ix, now, cfg)
    for i in sorted(ix.suspects):
        keys = ix.on_node.get(i)
        if not keys:
            continue
        whole = node_failure(ix, i, now, cfg, active)
        nd = ix.nodes[i]
        for key in keys:
            if key in ix.evicting:
                continue
            reason = whole or _evicted_by_taint(nd, ix.jobs[key])
            if reason is not None:
                per_job.setdefault(key, []).append((nd.name, reason))
    for key, names in ix.orphans.items():
        if key not in ix.evicting:
            per_job.setdefault(key, []).extend((n, f"node {n} deleted") for n in names)
    for key, items in per_job.items():
        # The gang restarts anyway: its other nodes that are NotReady (still within grace) count as
        # failed with it, so it is not re-placed onto them and they are recorded once, not later.
        listed = {n for n, _ in items}
        for i, _count in ix.job_nodes.get(key, ()):
            nd = ix.nodes[i]
            if nd.not_ready_since is not None and nd.name not in listed:
                items.append((nd.name, f"node {nd.name} NotReady (within grace; its gang restarts anyway)"))
    out = []
    for key in sorted(per_job):
        items = sorted(per_job[key])
        reason = items[0][1] + (f" (and {len(items) - 1} more nodes)" if len(items) > 1 else "")
        out.append(Failure(key, tuple(n for n, _ in items), reason))
    return out


def _evicted_by_taint(nd: Node, job: Job) -> str | None:
    """Why a NoExecute taint the job does not tolerate fails it on this node (None if none does)."""
    bad = [
        t
        for t in untolerated(nd, job.constraints.tolerations, (TaintEffect.NO_EXECUTE,))
        if t.key not in NOT_READY_TAINTS
    ]
    return f"node {nd.name} tainted {bad[0].key}={bad[0].value}:NoExecute" if bad else None


def gang_fails(ix: ClusterIndex, key: str, now: float, cfg: FailoverConfig) -> bool:
    """Whether a running gang sits on a node that fails it now (detect's rule for one gang,
    whether or not it is being evicted)."""
    if key in ix.orphans:
        return True
    suspect = [i for i, _ in ix.job_nodes.get(key, ()) if i in ix.suspects]
    if not suspect:
        return False
    active = index_disruptions(ix, now, cfg)
    job = ix.jobs[key]
    return any(
        node_failure(ix, i, now, cfg, active) is not None or _evicted_by_taint(ix.nodes[i], job) is not None
        for i in suspect
    )


def backoff_seconds(restart_count: int, cfg: FailoverConfig) -> float:
    """Delay before re-placing a job that has already restarted `restart_count` times."""
    if restart_count <= 0:
        return 0.0
    return float(min(cfg.backoff_max_seconds, cfg.backoff_base_seconds * 2 ** (restart_count - 1)))


def flap_damped_until(not_ready_times: Sequence[float], cfg: FailoverConfig) -> float | None:
    """Until when a node is damped for flapping, given the times its Ready condition left True.

    Damped while `node_flap_threshold` of those transitions lie within the last
    `node_flap_window_seconds`: that is, until the threshold-th most recent one is a window old.
    None when it never flapped that often (the caller compares the result with its `now`).
    """
    n = cfg.node_flap_threshold
    if n <= 0 or len(not_ready_times) < n:
        return None
    return sorted(not_ready_times)[-n] + cfg.node_flap_window_seconds
