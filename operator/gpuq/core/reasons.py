"""Pending reasons: a human sentence naming the constraint that binds, e.g.
"needs 4x8 GPUs in one rack; best rack has 24 free" or "no node matches gpuModels [H100]".
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from gpuq.core.constraints import F_MODELS, F_SELECTOR, F_TAINTS, FILTERS, describe, selector_text
from gpuq.core.decisions import PendingCode
from gpuq.core.fit import Demand
from gpuq.core.index import CapacityShort, Eligibility
from gpuq.core.model import Job
from gpuq.core.pools import Pool
from gpuq.core.state import CycleState


def counted(n: int, noun: str) -> str:
    """'1 node', '2 nodes': a count in a message, in the right number (not 'node(s)')."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def shape(replicas: int, d: Demand) -> str:
    return f"{replicas}x{d.gpus} GPUs" if d.gpus else f"{replicas} workers ({d.describe()})"


def capacity_reason(replicas: int, d: Demand, short: CapacityShort) -> str:
    """The gang needs more than its eligible nodes hold even when nothing else runs."""
    each = f" ({d.describe()} per worker)" if d.cpu or d.mem or d.extra else ""
    why = f"short of {' and '.join(short.lacking)}" if short.lacking else "no node has all of it at once"
    nodes = f"{short.eligible} eligible node{'s hold' if short.eligible != 1 else ' holds'}"
    return (
        f"needs {shape(replicas, d)}{each}; more than the cluster holds even when empty: its {nodes} "
        f"{short.held} such worker{'s' if short.held != 1 else ''} at most ({why})"
    )


def unschedulable_reason(job: Job, el: Eligibility) -> str:
    """No schedulable node passes the job's hard filters. Filters apply in order (FILTERS), so the
    binding one is the last that rejected a node: the nodes it rejected passed all the others."""
    c = job.constraints
    if not el.rejected_by:
        return "no schedulable node in the cluster"
    counts = dict(el.rejected_by)
    binding = max(counts, key=FILTERS.index)
    scope = "matching its other constraints" if len(counts) > 1 else "schedulable"
    if binding == F_MODELS:
        head = f"no node matches gpuModels [{', '.join(c.gpu_models)}]"
        if len(counts) == 1:
            return head
        head += f" among the nodes {scope}"
    elif binding == F_TAINTS:
        worst = sorted(el.taints, key=lambda kv: (-kv[1], kv[0]))[:3]
        taints = ", ".join(f"{t} ({n} node{'s' if n > 1 else ''})" for t, n in worst)
        head = f"every node {scope} has a taint the job does not tolerate: {taints}"
    elif binding == F_SELECTOR:
        head = f"no schedulable node matches nodeSelector {selector_text(c)}"
    else:
        head = f"no schedulable node matches the job's {binding}"
    what = describe(c)
    detail = ", ".join(f"{n} by {f}" for f, n in sorted(counts.items(), key=lambda kv: FILTERS.index(kv[0])))
    return head + (f" (job asks for {what})" if what else "") + f"; nodes rejected: {detail}"


def _on(job: Job, pools: Sequence[Pool]) -> str:
    """Suffix naming what restricts the eligible nodes, e.g. " (eligible: gpuModels [H100])"."""
    what = describe(job.constraints)
    if len([p for p in pools if p.model is not None]) > 1:
        what = (what + "; " if what else "") + "one GPU model per gang"
    return f" (eligible: {what})" if what else ""


def placement_reason(
    st: CycleState,
    job: Job,
    d: Demand,
    replicas: int,
    required_depth: int | None,
    pools: Sequence[Pool],
    memo: dict[Hashable, tuple[str, str]],
) -> tuple[str, str]:
    """(reason, code) for a job whose quota is fine but which no node set can hold now."""
    key = (tuple(id(p) for p in pools), d, replicas, required_depth, st.version)
    hit = memo.get(key)
    if hit is not None:
        return hit
    out = _placement_reason(st, job, d, replicas, required_depth, pools)
    memo[key] = out
    return out


def _placement_reason(
    st: CycleState,
    job: Job,
    d: Demand,
    replicas: int,
    required_depth: int | None,
    pools: Sequence[Pool],
) -> tuple[str, str]:
    tree = st.tree
    static = _static(st, pools, required_depth)
    on = _on(job, pools)
    need = shape(replicas, d)
    if not static.members:
        el = st.ix.eligibility(job)
        if not el.nodes:  # no node passes its constraints: name the one that binds
            return unschedulable_reason(job, el), PendingCode.NO_MATCHING_NODES
        return f"needs {need}; no eligible node{on}", PendingCode.NO_MATCHING_NODES
    biggest = static.biggest
    if d.gpus > biggest:
        return (
            f"needs {d.gpus} GPUs per worker; the largest eligible node has {biggest}{on}",
            PendingCode.EXCEEDS_CAPACITY,
        )
    total = d.gpus * replicas
    free = max(p.free_sum[0] for p in pools)
    # Free GPUs enough for the gang but no node set holds it: fragmentation, not capacity.
    busy = PendingCode.FRAGMENTED if free >= total else PendingCode.INSUFFICIENT_CAPACITY
    if required_depth is not None and required_depth < tree.node_depth:
        level = tree.level_name(required_depth)
        if static.largest_domain < total:
            return (
                f"needs {need} in one {level}; the largest eligible {level} has "
                f"{static.largest_domain} GPUs{on}",
                PendingCode.TOPOLOGY_UNSATISFIABLE,
            )
        best = max(p.free_sum[dom] for p in pools for dom in tree.by_depth[required_depth])
        return f"needs {need} in one {level}; best {level} has {max(best, 0)} free{on}", busy
    capacity = static.capacity
    if capacity < total:
        return f"needs {need}; eligible nodes have {capacity} GPUs in total{on}", PendingCode.EXCEEDS_CAPACITY
    if required_depth == tree.node_depth:
        best_node = max(max(p.max_free(0), 0) for p in pools)
        return f"needs {need} on one node; best node has {best_node} free{on}", busy
    if free < total:
        return f"needs {need}; {free} free on eligible nodes{on}", PendingCode.INSUFFICIENT_CAPACITY
    slots = max(p.slots(0, d.gpus, replicas) for p in pools) if d.gpus else replicas
    if slots < replicas:
        return (
            f"needs {need}; {free} GPUs free on eligible nodes but fragmented: "
            f"room for {slots} workers of {d.gpus} GPUs{on}",
            PendingCode.FRAGMENTED,
        )
    short = _short_resource(st, static.members, d, replicas)
    return (
        f"needs {need}; not enough {short} on eligible nodes with free GPUs{on}",
        PendingCode.INSUFFICIENT_CAPACITY,
    )


@dataclass(frozen=True, slots=True)
class _Static:
    members: tuple[int, ...]
    biggest: int  # GPUs of the largest eligible node
    capacity: int  # GPUs of all eligible nodes
    largest_domain: int  # GPUs of the largest eligible domain at the required depth


def _static(st: CycleState, pools: Sequence[Pool], depth: int | None) -> _Static:
    key = ("static", tuple(id(p) for p in pools), depth)
    hit = st.memo.get(key)
    if isinstance(hit, _Static):
        return hit
    cap = st.ix.cap_gpu
    members = tuple(sorted({n for p in pools for n in p.member_list()}))
    per_domain: dict[int, int] = {}
    if depth is not None and depth < st.tree.node_depth:
        for n in members:
            dom = st.tree.ancestors[n][depth]
            per_domain[dom] = per_domain.get(dom, 0) + cap[n]
    out = _Static(
        members,
        max((cap[n] for n in members), default=0),
        sum(cap[n] for n in members),
        max(per_domain.values(), default=0),
    )
    st.memo[key] = out
    return out


def _short_resource(st: CycleState, members: Sequence[int], d: Demand, replicas: int) -> str:
    """The resource whose free amount alone leaves the fewest worker slots on the eligible nodes."""
    per: dict[str, int] = {}
    needs = [("GPU", d.gpus, st.free_gpu), ("CPU", d.cpu, st.free_cpu), ("memory", d.mem, st.free_mem)]
    for name, need, free in needs:
        if need:
            per[name] = sum(max(free[n], 0) // need for n in members)
    for name, need in d.extra:
        per[name] = sum(max((st.free_extra.get(n) or {}).get(name, 0), 0) // need for n in members)
    if not per:
        return "room"
    worst = min(per.items(), key=lambda kv: (kv[1], kv[0]))
    return worst[0] if worst[1] < replicas else "room on single nodes (resources are spread)"
