"""Node health facts the shell hands to the core: which taints mean "failed now", and the history of
NotReady transitions that flap damping needs (Kubernetes keeps only the latest transition).

The history lives in the operator's memory: it starts empty after an operator restart, apart from a
node that is NotReady at that moment. Times are the API's lastTransitionTime, never the local clock.
"""

from __future__ import annotations

from gpuq.controller.objects import NodeEntry
from gpuq.core.config import FailoverConfig
from gpuq.core.failover import flap_damped_until

# An administrator's statement that the node is gone (non-graceful node shutdown): no grace period.
# The not-ready/unreachable taints are NotReady restated; the core applies the grace period to them.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
HISTORY_LIMIT = 64  # far above any sensible flap threshold


def with_history(previous: NodeEntry | None, entry: NodeEntry) -> NodeEntry:
    """`entry` carrying the NotReady transitions seen so far, plus its own if it is a new one."""
    history = previous.not_ready_history if previous is not None else ()
    since = entry.not_ready_since
    if not entry.ready and since is not None and since not in history:
        history = (*history, since)[-HISTORY_LIMIT:]
    entry.not_ready_history = history
    return entry


def damped_until(entry: NodeEntry, now: float, cfg: FailoverConfig) -> float | None:
    """When a flapping node's damping ends (None if it is not damped now)."""
    until = flap_damped_until(entry.not_ready_history, cfg)
    return until if until is not None and until > now else None
