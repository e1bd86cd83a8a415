"""A scheduling policy as the simulator sees it: the core's signature, plus how it preempts.

`gpuq` is the real `gpuq.core.schedule`; the baselines live in gpuq.sim.baselines and return the
same `Decisions`. One convention is specific to the simulator: a pod-at-a-time policy
(kube-default) may hold a partial gang, which appears in the snapshot as `Job.running` with fewer
ranks than `workers.replicas`, and may return `Admit` with a partial placement (the ranks bound so
far, old and new). Gang policies always return whole placements.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Decisions
from gpuq.core.model import Job, Node, Snapshot


@dataclass(slots=True)
class Delta:
    """What changed since the snapshot of the previous call (lets a policy keep an index)."""

    jobs: dict[str, Job] = field(default_factory=dict)  # added or changed
    removed_jobs: set[str] = field(default_factory=set)
    nodes: dict[str, Node] = field(default_factory=dict)

    def clear(self) -> None:
        self.jobs.clear()
        self.removed_jobs.clear()
        self.nodes.clear()


class Policy(Protocol):
    name: str
    # True if a victim is asked to checkpoint before it is evicted (no work lost on preemption).
    checkpoint_on_preempt: bool
    # True if the policy plays a scheduler's timer: the simulator runs a cycle at decisions.wake_at.
    # The gpuq core's wake_at is for the operator; the simulator sees its time-based rules at the
    # next event (docs/simulator.md, "Limits"), so its figures do not hang on timer cycles.
    timers: bool

    def schedule(
        self, snapshot: Snapshot, now: float, config: SchedulerConfig, delta: Delta
    ) -> Decisions: ...


class ShadowMismatch(AssertionError):
    """A cycle decided with the kept index differs from the same cycle decided afresh."""


class GpuqPolicy:
    """The real scheduling core; nothing of its logic is copied here. It keeps the core's
    `ClusterIndex` between cycles and feeds it the deltas (decisions are identical, only faster).
    `verify` (a shadow run; GPUQ_VERIFY_INDEX=1 for `gpuq simulate`): every cycle is decided again
    with a fresh index, so no memo, kept table or recalled failure of the kept one, and must be equal."""

    name = "gpuq"
    checkpoint_on_preempt = True
    timers = False

    def __init__(self, use_index: bool = True, verify: bool = False) -> None:
        self.use_index = use_index
        self.verify = verify
        self.verified = 0  # cycles compared (verify)
        self.index: Any = None

    def schedule(self, snapshot: Snapshot, now: float, config: SchedulerConfig, delta: Delta) -> Decisions:
        from gpuq.core import ClusterIndex, schedule  # late: the core may be absent in a partial build

        if not self.use_index:
            return schedule(snapshot, now, config, explain=False)
        if self.index is None:
            self.index = ClusterIndex(snapshot, config)
        else:
            self.index.apply(
                snapshot,
                nodes=delta.nodes.values(),
                jobs=(job for key, job in delta.jobs.items() if key not in delta.removed_jobs),
                removed_jobs=delta.removed_jobs,
            )
        # The loop never reads pending reasons: skip explaining every waiting job in every cycle.
        decisions = schedule(snapshot, now, config, index=self.index, explain=False)
        if self.verify:
            fresh = schedule(snapshot, now, config, explain=False)
            if fresh != decisions:
                raise ShadowMismatch(f"cycle at t={now}: kept index decided {decisions}, a fresh one {fresh}")
            self.verified += 1
        return decisions


def make_policy(name: str, seed: int = 0) -> Policy:
    from gpuq.sim.kube_default import KubeDefault
    from gpuq.sim.kueue import gang_binpack, kueue_tas

    if name == "gpuq":
        return GpuqPolicy(verify=os.environ.get("GPUQ_VERIFY_INDEX") == "1")
    if name == "kube-default":
        return KubeDefault(seed)
    if name == "gang-binpack":
        return gang_binpack()
    if name == "kueue-tas":
        return kueue_tas()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


POLICIES = ("gpuq", "kube-default", "gang-binpack", "kueue-tas")
BASELINES = POLICIES[1:]
