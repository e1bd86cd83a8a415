"""Kueue's own scheduler benchmark, run for Kueue and for gpuq on this machine, side by side.

Kueue side: Kueue v0.17.0's performance-scheduler runner and minimalkueue, built from its Go module
(hack/kueue.sh), run exactly as `make run-performance-scheduler` runs them (gpuq.peers.perf_kueue),
on an envtest control plane the runner starts itself from the etcd and kube-apiserver hack/ builds.
gpuq side: the same generator file translated to GPUQueues and TrainingJobs (gpuq.peers.perf_generator),
created on the runner's schedule on a freshly started local cluster (same etcd and kube-apiserver,
the same inflight limits as the runner gives envtest, kwok GPU nodes), with the gpuq operator as
its users run it (leader election on, default config, pods created and bound), recorded by the
runner's own rules (gpuq.peers.perf_gpuq, gpuq.peers.perf_recorder).

Printed for both, from the same definitions: the manager's wall time (process start to exit after
the last workload finished), average time to admission per workload class, minimum queue usage
(the checker's: usage integrated from the queues' status over nominal quota and time), workloads
admitted per second of wall time, the manager's CPU seconds and peak RSS; and each side checked
against the rangespec.yaml beside the generator file (Kueue's thresholds). What the two sides do
differently: docs/throughput.md, "Kueue's benchmark".

Reproduce: .venv/bin/python bench/kueue_perf.py [--config GENERATOR.yaml] [--sides kueue,gpuq] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuq import logs
from gpuq.devcluster import ensure_binaries
from gpuq.peers import perf_generator, perf_gpuq, perf_kueue
from gpuq.peers.kueue_binaries import BENCHMARK, ensure_kueue
from gpuq.peers.perf_recorder import CmdStats, RangeSpec, Summary, check, read_rangespec


def say(msg: str) -> None:
    print(msg, flush=True)


def figures(summary: Summary, stats: CmdStats) -> dict[str, Any]:
    return {
        "wall_s": round(stats.wall_s, 1),
        "min_usage_pct": round(summary.min_usage_pct, 2),
        "admitted": summary.admitted,
        "finished": summary.finished,
        "workloads": summary.seen,
        "evictions": sum(c.evictions for c in summary.workloads.values()),
        "admissions_per_s": round(summary.admitted / stats.wall_s, 1) if stats.wall_s else 0.0,
        "cpu_s": round(stats.cpu_s, 1),
        "peak_rss_mib": round(stats.max_rss_mib, 0),
        "avg_time_to_admission_s": {
            c: round(w.avg_time_to_admission_s, 2) for c, w in summary.workloads.items()
        },
    }


def run_kueue(
    args: argparse.Namespace, plan: perf_generator.Plan, control_plane: Path, work: Path
) -> dict[str, Any]:
    build = ensure_kueue(binaries=BENCHMARK)
    say(f"== Kueue {build.version}: runner + minimalkueue (load average {os.getloadavg()[0]:.1f})")
    run = perf_kueue.run(build, control_plane, args.config, work / "kueue", args.timeout, plan.topology, say)
    say(f"kueue: done in {run.runner_wall_s:.0f} s (artifacts {run.out})")
    return {"summary": run.summary, "stats": run.stats, "writes": run.writes}


def run_gpuq(args: argparse.Namespace, plan: perf_generator.Plan, work: Path) -> dict[str, Any]:
    say(f"== gpuq: {plan.shape.describe()} (load average {os.getloadavg()[0]:.1f})")
    extra = (
        ("--kube-api-qps", str(args.gpuq_qps), "--kube-api-burst", str(args.gpuq_burst))
        if args.gpuq_qps
        else ()
    )
    run = perf_gpuq.run_on_local_cluster(plan, work, args.timeout, say, operator_args=extra)
    p = run.progress
    say(
        f"gpuq: done; generation {run.generation_s:.0f} s, pods marked Succeeded {p.patched} "
        f"(again after kwok's Running: {p.repatched}), jobs Failed {p.failed}, errors {len(p.errors)}"
    )
    for err in p.errors[:5]:
        say(f"  {err}")
    if not run.finished_all:
        say(f"gpuq: NOT every job finished within {args.timeout:.0f} s")
    return {"summary": run.summary, "stats": run.stats, "writes": run.writes}


def table(results: dict[str, dict[str, Any]], classes: tuple[str, ...]) -> None:
    sides = list(results)
    f = {s: figures(r["summary"], r["stats"]) for s, r in results.items()}
    head = "".join(f"{s:>14}" for s in sides) + ("   gpuq / kueue" if len(sides) == 2 else "")
    say(f"\n{'':38}{head}")

    def row(label: str, values: list[float], fmt: str, ratio: bool = True) -> None:
        cells = "".join(format(v, fmt).rjust(14) for v in values)
        r = f"   {values[1] / values[0]:13.2f}" if ratio and len(values) == 2 and values[0] else ""
        say(f"{label:38}{cells}{r}")

    row("wall time (s)", [f[s]["wall_s"] for s in sides], ".1f")
    for c in classes:
        row(
            f"avg time to admission {c} (s)",
            [f[s]["avg_time_to_admission_s"].get(c, float("nan")) for s in sides],
            ".2f",
        )
    row("min queue usage (%)", [f[s]["min_usage_pct"] for s in sides], ".2f")
    row("workloads admitted / finished", [f[s]["admitted"] for s in sides], "d", ratio=False)
    row("", [f[s]["finished"] for s in sides], "d", ratio=False)
    row("evictions", [f[s]["evictions"] for s in sides], "d", ratio=False)
    row("admissions/s (of wall time)", [f[s]["admissions_per_s"] for s in sides], ".1f")
    row("scheduler CPU (s)", [f[s]["cpu_s"] for s in sides], ".1f")
    row("scheduler peak RSS (MiB)", [f[s]["peak_rss_mib"] for s in sides], ".0f")
    say("API writes per workload (all clients; Leases aside; Kueue's from its envtest's last scrape):")
    for s in sides:
        writes, n = results[s]["writes"], max(f[s]["workloads"], 1)
        top = ", ".join(f"{res} {c / n:.2f}" for res, c in writes.most_common(7))
        say(f"  {s:6} {sum(writes.values()) / n:5.2f}   {top}")


def verdicts(results: dict[str, dict[str, Any]], spec: RangeSpec | None, where: Path | None) -> None:
    if spec is None:
        say("\nno rangespec.yaml beside the generator file: nothing to check against")
        return
    say(f"\nKueue's checker against {where}:")
    for side, r in results.items():
        misses = check(r["summary"], r["stats"], spec)
        say(f"  {side}: " + ("within every threshold" if not misses else f"{len(misses)} miss(es)"))
        for m in misses:
            say(f"    {m}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config", type=Path, help="a generator file in the runner's format (default: Kueue's baseline)"
    )
    ap.add_argument("--rangespec", type=Path, help="thresholds (default: rangespec.yaml beside --config)")
    ap.add_argument(
        "--sides", default="kueue,gpuq", help="which to run, comma-separated (default kueue,gpuq)"
    )
    ap.add_argument("--timeout", type=float, default=3600, help="seconds each side may take (default 3600)")
    ap.add_argument(
        "--node-gpus",
        type=int,
        help="GPUs per node without a topology (default: one node with the whole nominal quota)",
    )
    ap.add_argument(
        "--gpuq-qps", type=float, default=0, help="the operator's client qps (default: its own, 200)"
    )
    ap.add_argument("--gpuq-burst", type=int, default=400, help="with --gpuq-qps: the operator's burst")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--out", type=Path, help="keep artifacts (runner output, logs) here")
    args = ap.parse_args(argv)
    logs.configure("WARNING")
    cmd = "bench/kueue_perf.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    say(f"# Kueue's scheduler benchmark, Kueue and gpuq   reproduce: .venv/bin/python {cmd}".rstrip())
    control_plane = ensure_binaries()
    if args.config is None:
        args.config = ensure_kueue(binaries=BENCHMARK).perf_configs / "baseline" / "generator.yaml"
    args.config = args.config.resolve()
    rangespec = args.rangespec or args.config.with_name("rangespec.yaml")
    spec = read_rangespec(rangespec) if rangespec.exists() else None
    plan = perf_generator.expand(perf_generator.load(args.config), args.node_gpus)
    say(
        f"generator: {args.config}: {len(plan.queues)} queues, {plan.jobs} workloads, "
        f"classes {', '.join(plan.classes)}"
    )
    for note in plan.notes:
        say(f"  translation: {note}")
    work = args.out or Path(tempfile.mkdtemp(prefix="gpuq-kueue-perf-"))
    work.mkdir(parents=True, exist_ok=True)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    results: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    for side in sides:
        if side == "kueue":
            results[side] = run_kueue(args, plan, control_plane, work)
        elif side == "gpuq":
            results[side] = run_gpuq(args, plan, work)
        else:
            ap.error(f"--sides: unknown side {side!r} (kueue, gpuq)")
    table(results, plan.classes)
    verdicts(results, spec, rangespec if spec else None)
    if args.json:
        args.json.write_text(
            json.dumps({s: figures(r["summary"], r["stats"]) for s, r in results.items()}, indent=2)
        )
        say(f"\nfigures written to {args.json}")
    say(f"\nboth sides in {time.monotonic() - t0:.0f} s; artifacts in {work}")
    say(f"reproduce: .venv/bin/python {cmd}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
