"""CycleState: the scratch copy of the cluster one scheduling cycle mutates.

Admissions take resources, restarts and evictions release them. A statement (begin/rollback/commit)
journals every change so a preemption scenario can be simulated and undone, like KAI's Statement.
Copying the index's flat arrays is a few memcpy-like list copies, so a cycle never re-indexes nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from gpuq.core.constraints import constraints_key, preference_score
from gpuq.core.fit import Demand, Extra
from gpuq.core.index import ClusterIndex
from gpuq.core.model import Constraints, Job
from gpuq.core.pools import Pool

NO_CONSTRAINTS = Constraints()
MIXED_ONLY = Constraints(mixed_models=True)
MAX_PREFERENCE_TIERS = 3  # distinct preference scores tried before "any eligible node"

Undo = Callable[[], None]


class CycleState:
    def __init__(self, ix: ClusterIndex) -> None:
        self.ix = ix
        self.tree = ix.tree
        self.free_gpu = ix.free_gpu[:]  # int64 arrays: memcpy
        self.free_cpu = ix.free_cpu[:]
        self.free_mem = ix.free_mem[:]
        # GPUs free on all nodes (negative nodes count 0): no gang larger than this fits anywhere.
        self.free_gpus_bound = sum(f for f in self.free_gpu if f > 0)
        self.free_extra = dict(ix.free_extra)  # sparse; inner dicts are replaced on write, never mutated
        self.open_all = ix.open_all.copy()
        # One pool per GPU model, read only by a gang that may not mix models (pool_tiers' `split`),
        # which needs more than one model: with one, no copy is kept current (every change moves each
        # live pool).
        self.open_by_model = {m: p.copy() for m, p in ix.open_by_model.items()} if len(ix.models) > 1 else {}
        self.live_pools: list[Pool] = [self.open_all, *self.open_by_model.values()]
        self.dyn_pools: dict[Hashable, Pool] = {}
        self.journal: list[Undo] | None = None
        self._depth = 0
        # Bumped whenever resources are released: a failed search can only succeed after one.
        self.gives = 0
        self.version = 0  # bumped on every change (memo key of pending reasons)
        self.fail_memo: dict[Hashable, tuple[int, int]] = {}
        self._scores: dict[Hashable, dict[int, int]] = {}
        self.memo: dict[Hashable, object] = {}  # per-cycle memo of derived, state-independent facts

    # ---- resource changes -----------------------------------------------------------------------

    def delta(self, n: int, gpus: int, cpu: int, mem: int, extra: Extra) -> None:
        """Take (positive) or give back (negative) raw resources on node n."""
        if gpus:
            old = self.free_gpu[n]
            new = old - gpus
            self.free_gpu[n] = new
            self.free_gpus_bound += (new if new > 0 else 0) - (old if old > 0 else 0)
            for p in self.live_pools:
                if p.member[n]:
                    p.move(n, old, new)
        if cpu:
            self.free_cpu[n] -= cpu
        if mem:
            self.free_mem[n] -= mem
        if extra:
            cur = dict(self.free_extra.get(n) or {})
            for k, v in extra:
                cur[k] = cur.get(k, 0) - v
            self.free_extra[n] = cur
        self.version += 1
        if gpus < 0 or cpu < 0 or mem < 0 or (extra and any(v < 0 for _, v in extra)):
            self.gives += 1
        if self.journal is not None:
            neg = tuple((k, -v) for k, v in extra) if extra else ()
            self.journal.append(lambda: self.delta(n, -gpus, -cpu, -mem, neg))

    def use(self, n: int, d: Demand, k: int) -> None:
        """Take k workers of d on node n (negative k gives them back)."""
        if k:  # (most demands have no extended resources: no tuple to build)
            extra = tuple((x, v * k) for x, v in d.extra) if d.extra else ()
            self.delta(n, d.gpus * k, d.cpu * k, d.mem * k, extra)

    def use_all(self, placed: Sequence[tuple[int, int]], d: Demand, sign: int) -> None:
        for n, k in placed:
            self.use(n, d, sign * k)

    def record(self, undo: Undo) -> None:
        """Journal an undo step of a change made outside this class (quota usage)."""
        if self.journal is not None:
            self.journal.append(undo)

    # ---- statements -----------------------------------------------------------------------------

    def begin(self) -> int:
        if self.journal is None:
            self.journal = []
        self._depth += 1
        return len(self.journal)

    def rollback(self, mark: int) -> None:
        journal = self.journal
        assert journal is not None
        undo = journal[mark:]
        del journal[mark:]
        self.journal = None
        for step in reversed(undo):
            step()
        self.journal = journal
        self._end()

    def commit(self, mark: int) -> None:
        self._end()

    def _end(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.journal = None

    # ---- pools ----------------------------------------------------------------------------------

    def _dyn_pool(self, key: Hashable, members: Sequence[int], model: str | None, name: str) -> Pool:
        pool = self.dyn_pools.get(key)
        if pool is None:
            ix = self.ix
            pool = Pool(
                self.tree, ix.width, len(self.free_gpu), members, self.free_gpu, ix.cap_gpu, model, name
            )
            self.dyn_pools[key] = pool
            self.live_pools.append(pool)
        return pool

    def _scores_for(self, job: Job, eligible: Sequence[int]) -> dict[int, int]:
        key = constraints_key(job.constraints)
        scores = self._scores.get(key)
        if scores is None:
            nodes = self.ix.nodes
            scores = {n: preference_score(nodes[n], job.constraints) for n in eligible}
            self._scores[key] = scores
        return scores

    def pool_tiers(self, job: Job, replicas: int, allowed_models: frozenset[str] | None) -> list[list[Pool]]:
        """Pools to try for a job, best tier first; each tier lists alternative pools (one per GPU model
        when a gang may not mix models). A later tier is a superset of the earlier one."""
        ix = self.ix
        split = replicas > 1 and not job.constraints.mixed_models and len(ix.models) > 1
        models = [m for m in ix.models if allowed_models is None or m in allowed_models]
        tiers: list[list[Pool]] = []
        plain = job.constraints == NO_CONSTRAINTS or job.constraints == MIXED_ONLY
        if plain:
            if split:
                tiers.append([self.open_by_model[m] for m in models])
            elif allowed_models is None:
                tiers.append([self.open_all])
            else:
                members = [n for m in models for n in ix.open_by_model[m].member_list()]
                tiers.append([self._dyn_pool(("open", tuple(models)), sorted(members), None, "open")])
            if not ix.soft_tainted:
                return tiers
        eligible = ix.eligibility(job).nodes
        sig = constraints_key(job.constraints)
        scores = self._scores_for(job, eligible)
        thresholds = sorted(set(scores.values()), reverse=True)
        if len(thresholds) > MAX_PREFERENCE_TIERS:
            thresholds = [*thresholds[: MAX_PREFERENCE_TIERS - 1], thresholds[-1]]
        if plain:
            thresholds = thresholds[-1:]  # open nodes were tier 1; now everything without hard taints
        for thr in thresholds:
            members = [n for n in eligible if scores[n] >= thr]
            if split:
                tier = []
                for m in models:
                    sub = [n for n in members if ix.model[n] == m]
                    if sub:
                        tier.append(self._dyn_pool((sig, thr, m), sub, m, f"{m}"))
                tiers.append(tier)
            else:
                if allowed_models is not None:
                    members = [n for n in members if ix.model[n] in allowed_models]
                key = (sig, thr, None if allowed_models is None else tuple(models))
                tiers.append([self._dyn_pool(key, members, None, "eligible")])
        return tiers or [[]]
