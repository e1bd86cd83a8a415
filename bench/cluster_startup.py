"""How long the local control plane takes: building its binaries (cold and cached) and `up`/`down`.

Cold build: the per-binary times hack/build-binaries.sh recorded when it last built them
(<bin dir>/build-times.tsv), or, with --cold, a real build now into throwaway GPUQ_CACHE_DIR and
GOCACHE (downloads from the Go module cache are reused; ~10 min on 2 cores).
Cached build: the build script and ensure_binaries() when everything is already built.
up: `Cluster.up` of the 4 racks x 8 nodes x 8 GPUs cluster, against a 1-node cluster measured in the
same run as the baseline (fixed control-plane cost vs. cost of the nodes), median of --repeat runs.

Reproduce: .venv/bin/python bench/cluster_startup.py [--repeat 3] [--cold]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpuq import logs
from gpuq.devcluster import Cluster, Shape, ensure_binaries
from gpuq.devcluster.binaries import bin_dir, hack_dir

SCRIPT = hack_dir() / "build-binaries.sh"
BIG = Shape(racks=4, nodes_per_rack=8, gpus_per_node=8, blocks=2, zones=1)
BASELINE = Shape(racks=1, nodes_per_rack=1, gpus_per_node=8, blocks=1, zones=1)


def recorded_build_times(directory: Path) -> dict[str, float]:
    """Latest recorded seconds per binary from build-times.tsv (name, seconds, when, cores)."""
    times: dict[str, float] = {}
    path = directory / "build-times.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 2:
                times[fields[0]] = float(fields[1])
    return times


def cold_build_now() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gpuq-cold-") as tmp:
        env = {**os.environ, "GPUQ_CACHE_DIR": f"{tmp}/cache", "GOCACHE": f"{tmp}/gocache"}
        subprocess.run(["bash", str(SCRIPT)], env=env, check=True, stdout=subprocess.DEVNULL)
        key = bin_dir().name
        return recorded_build_times(Path(tmp) / "cache" / "bin" / key)


def timed(func: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    func()
    return time.perf_counter() - t0


def measure_up(shape: Shape, repeat: int) -> tuple[list[float], list[float], dict[str, float]]:
    ups, downs = [], []
    milestones: dict[str, float] = {}
    for i in range(repeat):
        t0 = time.perf_counter()
        cluster = Cluster.up(f"bench-startup-{os.getpid()}-{i}", shape, tie_to_process=True)
        ups.append(time.perf_counter() - t0)
        milestones = cluster.timings
        downs.append(timed(cluster.down))
    return ups, downs, milestones


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3, help="up/down runs per shape (default 3)")
    parser.add_argument("--cold", action="store_true", help="really build from scratch now (slow)")
    args = parser.parse_args()
    logs.configure("WARNING")
    directory = ensure_binaries()

    print("== build (hack/build-binaries.sh; Go module downloads not included when cached)")
    cold = cold_build_now() if args.cold else recorded_build_times(directory)
    source = "measured now" if args.cold else f"recorded in {directory / 'build-times.tsv'}"
    if cold:
        for name, seconds in cold.items():
            print(f"  cold  {name:<24} {seconds:7.0f} s")
        print(f"  cold  {'total':<24} {sum(cold.values()):7.0f} s  ({source})")
    else:
        print("  cold  unknown: no build-times.tsv (binaries built elsewhere); run with --cold")
    script_cached = timed(lambda: subprocess.run(["bash", str(SCRIPT)], check=True, capture_output=True))
    python_cached = timed(ensure_binaries)
    print(f"  cached build script        {script_cached * 1000:7.0f} ms")
    print(f"  cached ensure_binaries()   {python_cached * 1000:7.1f} ms")

    print(f"\n== up / down, median of {args.repeat} (baseline: {BASELINE.describe()})")
    base_up, base_down, base_ms = measure_up(BASELINE, args.repeat)
    big_up, big_down, big_ms = measure_up(BIG, args.repeat)
    for label, shape, ups, downs, ms in (
        ("baseline", BASELINE, base_up, base_down, base_ms),
        ("4x8", BIG, big_up, big_down, big_ms),
    ):
        steps = ", ".join(f"{k} {v:.1f}" for k, v in ms.items())
        print(
            f"  {label:<9} {shape.node_count:>3} nodes  up {statistics.median(ups):5.1f} s "
            f"(min {min(ups):.1f}, max {max(ups):.1f})  down {statistics.median(downs):4.1f} s  "
            f"[last run, s since start: {steps}]"
        )
    ratio = statistics.median(big_up) / statistics.median(base_up)
    per_node = (statistics.median(big_up) - statistics.median(base_up)) / (
        BIG.node_count - BASELINE.node_count
    )
    print(f"  4x8 / baseline up: {ratio:.2f}x; {per_node * 1000:.0f} ms per extra node; target <= 30 s")
    print(
        f"\nreproduce: .venv/bin/python bench/cluster_startup.py --repeat {args.repeat}"
        + (" --cold" if args.cold else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
