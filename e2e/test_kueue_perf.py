"""Kueue's own scheduler benchmark, small, through both sides (bench/kueue_perf.py at test size):
Kueue v0.17.0's runner and minimalkueue as its Makefile runs them, and gpuq on a local cluster
with the same generator file translated. Every workload must be admitted and finished on each side;
nothing here is timed (the figures are bench/kueue_perf.py's).

Each side starts its own control plane (the runner its envtest, gpuq a local cluster), so this needs
the local backend's binaries, not the session's cluster. Kueue is built from Go modules on first use
(hack/kueue.sh); without Go this skips, unless GPUQ_REQUIRE_KUEUE is set (as in .ci/run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuq.devcluster import ensure_binaries
from gpuq.devcluster.testing import required_build
from gpuq.peers import perf_generator, perf_gpuq, perf_kueue
from gpuq.peers.kueue_binaries import BENCHMARK, KueueBuild, ensure_kueue

CONFIGS = Path(__file__).resolve().parents[1] / "bench" / "kueue-configs"
TIMEOUT_S = 600.0

pytestmark = pytest.mark.skipif(
    os.environ.get("GPUQ_E2E_CLUSTER", "local") != "local",
    reason="each side starts its own local control plane (GPUQ_E2E_CLUSTER=local)",
)


@pytest.fixture(scope="module")
def kueue() -> KueueBuild:
    return required_build("kueue", lambda progress: ensure_kueue(progress, BENCHMARK))


@pytest.mark.parametrize("config", ["smoke", "smoke-tas"])
def test_every_workload_is_admitted_and_finished_on_both_sides(
    kueue: KueueBuild, config: str, tmp_path: Path
) -> None:
    generator = CONFIGS / config / "generator.yaml"
    plan = perf_generator.expand(perf_generator.load(generator))
    lines: list[str] = []

    k = perf_kueue.run(
        kueue, ensure_binaries(), generator, tmp_path / "kueue", TIMEOUT_S, plan.topology, lines.append
    )
    assert (k.summary.seen, k.summary.admitted, k.summary.finished) == (plan.jobs, plan.jobs, plan.jobs)
    assert set(k.summary.workloads) == set(plan.classes)

    g = perf_gpuq.run_on_local_cluster(plan, tmp_path, TIMEOUT_S, lines.append)
    assert g.finished_all, (
        f"not every job finished: {g.progress}; operator log {tmp_path / 'gpuq-operator.log'}"
    )
    assert (g.summary.seen, g.summary.admitted, g.summary.finished) == (plan.jobs, plan.jobs, plan.jobs)
    assert set(g.summary.workloads) == set(plan.classes)
    assert g.progress.failed == 0 and g.progress.errors == []
    # The queues held quota while jobs ran: both sides' usage integrals come from the queues' status.
    for side in (k.summary, g.summary):
        assert side.min_usage_pct > 0
    assert g.stats.wall_s > 0 and g.stats.cpu_s > 0 and g.stats.max_rss_mib > 0
