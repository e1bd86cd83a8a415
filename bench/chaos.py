"""Chaos figures: each fault on its own under a mixed load, on a fresh 128-node local cluster per
scenario, with the invariants of gpuq.chaos.invariants checked twice a second; and leader takeover
times (SIGKILL and graceful stop of the leader, default lease timings 15/10/2 s).

Takeover = from the signal to the Lease naming a new, live holder (polled every 20 ms). After a
SIGKILL the standby waits for the lease to expire (lease duration after it saw the last renewal, plus
the latency of that watch event and of its Lease write); after a
SIGTERM the leader releases it on its way out.

Reproduce: .venv/bin/python bench/chaos.py [--jobs 500] [--only kill-2,stop-2] [--kills 20]
(a full run takes about an hour: every scenario drains its whole load)
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq import logs
from gpuq.chaos import faults
from gpuq.chaos.harness import ChaosRun, LeaseTimings, RunReport
from gpuq.chaos.invariants import PARTIAL_LIMIT
from gpuq.chaos.load import job_mix
from gpuq.devcluster import Cluster, Shape, ensure_binaries
from gpuq.sim.metrics import percentile

SHAPE = Shape(racks=16, nodes_per_rack=8, blocks=4, zones=2)  # 128 nodes, 1024 GPUs
DEFAULT = LeaseTimings()  # 15 / 10 / 2 s, client-go's recommendation and gpuq's default
RACING = LeaseTimings(duration=2, renew=1.5, retry=0.5)


@dataclass
class Scenario:
    name: str
    what: str
    replicas: int
    inject: Callable[[ChaosRun, argparse.Namespace, random.Random], None]
    timings: LeaseTimings = DEFAULT
    load_seconds: float = 180.0


def repeat(
    label: str,
    times: Callable[[argparse.Namespace], int],
    fault: Callable[[ChaosRun], Any],
    gap: tuple[float, float],
) -> Callable[[ChaosRun, argparse.Namespace, random.Random], None]:
    def inject(run: ChaosRun, args: argparse.Namespace, rng: random.Random) -> None:
        for _ in range(times(args)):
            time.sleep(rng.uniform(*gap))
            run.fault(label, lambda: fault(run))

    return inject


def once(label: str, fault: Callable[[ChaosRun], Any], delay: float = 20.0) -> Callable[..., None]:
    def inject(run: ChaosRun, _args: argparse.Namespace, _rng: random.Random) -> None:
        time.sleep(delay)
        run.fault(label, lambda: fault(run))

    return inject


def _none(_run: ChaosRun, _args: argparse.Namespace, _rng: random.Random) -> None:
    return None


def _freeze(run: ChaosRun, seconds: float) -> dict[str, Any]:
    return faults.freeze(run, "kube-apiserver", seconds)


def _restart_apiserver_3(run: ChaosRun, _args: argparse.Namespace, rng: random.Random) -> None:
    for _ in range(3):
        time.sleep(rng.uniform(10, 30))
        run.fault("restart kube-apiserver", lambda: faults.restart_apiserver(run))


SCENARIOS = [
    Scenario("baseline", "no fault, 2 replicas", 2, _none),
    Scenario(
        "kill-1", "leader SIGKILLed N times, 1 replica", 1,
        repeat("SIGKILL", lambda a: a.kills, lambda r: faults.kill_leader(r), (2, 10)), load_seconds=400,
    ),
    Scenario(
        "kill-2", "leader SIGKILLed N times, 2 replicas", 2,
        repeat("SIGKILL", lambda a: a.kills, lambda r: faults.kill_leader(r), (2, 10)), load_seconds=400,
    ),
    Scenario(
        "stop-2", "leader stopped (SIGTERM) 10 times, 2 replicas", 2,
        repeat("SIGTERM", lambda a: 10, faults.stop_leader, (3, 10)),
    ),
    Scenario("apiserver-restart", "kube-apiserver restarted 3 times", 2, _restart_apiserver_3),
    Scenario("freeze-20", "kube-apiserver frozen 20 s", 2, once("freeze 20s", lambda r: _freeze(r, 20))),
    Scenario("freeze-60", "kube-apiserver frozen 60 s", 2, once("freeze 60s", lambda r: _freeze(r, 60))),
    Scenario("etcd-10", "etcd paused 10 s", 2, once("pause etcd", lambda r: faults.freeze(r, "etcd", 10))),
    Scenario(
        "429-storm", "API server at 8/4 max in-flight for 60 s", 2,
        once("429 storm 60s", lambda r: faults.throttle_apiserver(r, 60)),
    ),
    Scenario(
        "third-not-ready", "43 of 128 nodes NotReady for 60 s", 2,
        once("third NotReady 60s", lambda r: faults.nodes_not_ready(r, 1 / 3, 60)),
    ),
    Scenario(
        "racing", "2 replicas racing: leader SIGSTOPped past its 2 s lease, 10 times", 2,
        repeat("stall", lambda a: 10, lambda r: faults.stall_leader(r, 3.0), (2, 6)), timings=RACING,
    ),
]  # fmt: skip


def run_scenario(sc: Scenario, args: argparse.Namespace, work: Path) -> RunReport:
    dev = Cluster.up(f"bench-chaos-{os.getpid()}", SHAPE, tie_to_process=True)
    try:
        with ChaosRun(dev, work, replicas=sc.replicas, timings=sc.timings) as run:
            run.submit(
                job_mix(args.jobs, seed=11, min_seconds=5, max_seconds=30), over_seconds=sc.load_seconds
            )
            sc.inject(run, args, random.Random(2026))
            return run.finish(expected=args.jobs, timeout=args.timeout)
    finally:
        dev.down()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs in the kill-1 and kill-2 scenarios")
    p.add_argument(
        "--only", default="", help="comma-separated scenario names: " + ",".join(s.name for s in SCENARIOS)
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a scenario may take to drain")
    args = p.parse_args()
    logs.configure("WARNING")
    ensure_binaries(progress=sys.stderr)
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only.split(",")]
    rows: list[tuple[Scenario, RunReport]] = []
    for sc in chosen:
        work = Path(tempfile.mkdtemp(prefix=f"gpuq-chaos-{sc.name}-"))
        print(f"== {sc.name}: {sc.what} ({args.jobs} jobs; logs {work})", flush=True)
        t0 = time.monotonic()
        report = run_scenario(sc, args, work)
        v = report.violations.counts()
        print(f"   {time.monotonic() - t0:.0f}s, violations {sum(v.values())}: {v}", flush=True)
        rows.append((sc, report))

    print(
        "\nInvariant violations per scenario (all should be 0), 128 nodes x 8 GPUs, "
        f"{args.jobs}-job mixed load, sampled every 0.5 s:\n"
    )
    cols = ("lost", "failed", "dup", "overc", f">{PARTIAL_LIMIT:.0f}s", "2xadm", "unfin")
    print(f"| scenario | replicas | {' | '.join(cols)} | longest partial s (raw) | restarts | preempt | s |")
    print("|---" * (len(cols) + 7) + "|")
    for sc, r in rows:
        counts = list(r.violations.counts().values())
        print(
            f"| {sc.what} | {sc.replicas} | {' | '.join(str(c) for c in counts)} | "
            f"{r.longest_partial:.1f} ({r.longest_partial_raw:.1f}) | {r.restarts} | {r.preemptions} | "
            f"{r.seconds:.0f} |"
        )
    for sc, r in rows:
        notes = [d for name, _, d in r.faults if "restarts_during" in d]
        for d in notes:
            down = f"{d['nodes']} of {d['of']} nodes NotReady"
            print(f"\n{sc.name}: {down}: {d['restarts_during']} gang restarts meanwhile")
    for label in ("SIGKILL", "SIGTERM"):
        samples = [d["takeover_s"] for sc, r in rows if sc.replicas == 2 for name, _, d in r.faults
                   if name == label and "takeover_s" in d]  # fmt: skip
        if samples:
            print(
                f"\nleader takeover after {label} (lease {DEFAULT.duration:.0f}/{DEFAULT.renew:.0f}/"
                f"{DEFAULT.retry:.0f} s, 2 replicas, n={len(samples)}): p50 {percentile(samples, 50):.2f} s,"
                f" p99 {percentile(samples, 99):.2f} s, max {max(samples):.2f} s"
            )
    single = [
        d["takeover_s"] for sc, r in rows if sc.replicas == 1 for name, _, d in r.faults if "takeover_s" in d
    ]
    if single:
        print(
            f"one replica, killed and restarted 1 s later (n={len(single)}): leading again after "
            f"p50 {percentile(single, 50):.2f} s, p99 {percentile(single, 99):.2f} s"
        )
    print(f"\nreproduce: .venv/bin/python bench/chaos.py {shlex.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
