"""Failover planning: which running gangs lost a node, and when they may be re-placed.

A gang fails when any of its ranks sits on a node that is FAILED, NotReady/Unknown for at least the
grace period, deleted (absent from the snapshot), tainted NoExecute without a matching toleration, or
reporting fewer healthy GPUs than are bound on it. Jobs already being evicted are left alone: they are
on their way out. Restart back-off: the first restart is immediate, the k-th waits
min(backoff_max, backoff_base * 2**(k - 2)) seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuq.core.config import FailoverConfig
from gpuq.core.constraints import untolerated
from gpuq.core.index import ClusterIndex
from gpuq.core.model import Health, TaintEffect


@dataclass(frozen=True, slots=True)
class Failure:
    job: str
    nodes: tuple[str, ...]  # the failed nodes under this job, sorted
    reason: str


def node_failure(ix: ClusterIndex, i: int, now: float, cfg: FailoverConfig) -> str | None:
    """Why node i fails every gang on it (None if it does not, or only per job: NoExecute)."""
    nd = ix.nodes[i]
    if nd.health is Health.FAILED:
        return f"node {nd.name} failed"
    if nd.not_ready_since is not None and now - nd.not_ready_since >= cfg.not_ready_grace_seconds:
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
    for i in sorted(ix.suspects):
        keys = ix.on_node.get(i)
        if not keys:
            continue
        whole = node_failure(ix, i, now, cfg)
        nd = ix.nodes[i]
        for key in keys:
            if key in ix.evicting:
                continue
            reason = whole
            if reason is None:
                bad = untolerated(nd, ix.jobs[key].constraints.tolerations, (TaintEffect.NO_EXECUTE,))
                if bad:
                    reason = f"node {nd.name} tainted {bad[0].key}={bad[0].value}:NoExecute"
            if reason is not None:
                per_job.setdefault(key, []).append((nd.name, reason))
    for key, names in ix.orphans.items():
        if key not in ix.evicting:
            per_job.setdefault(key, []).extend((n, f"node {n} deleted") for n in names)
    out = []
    for key in sorted(per_job):
        items = sorted(per_job[key])
        reason = items[0][1] + (f" (and {len(items) - 1} more nodes)" if len(items) > 1 else "")
        out.append(Failure(key, tuple(n for n, _ in items), reason))
    return out


def backoff_seconds(restart_count: int, cfg: FailoverConfig) -> float:
    """Delay before re-placing a job that has already restarted `restart_count` times."""
    if restart_count <= 0:
        return 0.0
    return float(min(cfg.backoff_max_seconds, cfg.backoff_base_seconds * 2 ** (restart_count - 1)))
