"""Kueue's scheduler benchmark, run as Kueue's own Makefile runs it.

`make run-performance-scheduler` (Makefile-test.mk in the Kueue module) starts the runner with
KUBEBUILDER_ASSETS pointing at an etcd, a kube-apiserver and a kubectl; the runner starts them as an
envtest control plane (raising the API server's inflight limits to 800/400), starts minimalkueue
(Kueue's core controllers and scheduler; client 50 qps / burst 100, hard-coded as Kueue's default
configuration has them) against it, generates the objects of the generator file, mimics the
workloads' execution and records. The flags below are the Makefile's: the CRDs of the module's
config/, `--withLogs=true --logToFile=true` (NO_SCALABILITY_KUEUE_LOGS unset), `--metricsScrapeInterval=5s`
(SCALABILITY_SCRAPE_INTERVAL's default), `--enableTAS=true` for a generator with a topology (the
`run-tas-performance-scheduler` target); only `--timeout` is raised (the Makefile's 10 and 20
minutes are for Kueue's CI machines). The etcd, kube-apiserver and kubectl are the ones hack/ builds
for gpuq's local cluster, the same binaries gpuq's side runs on.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuq.controller.kubeapi import load_credentials
from gpuq.devcluster.cluster import api_write_counts
from gpuq.peers.kueue_binaries import KueueBuild
from gpuq.peers.perf_recorder import CmdStats, Summary, read_cmd_stats, read_summary

SCRAPE_EVERY_S = 5.0  # the envtest API server's metrics, for writes per workload


class KueueRunFailed(RuntimeError):
    """The runner exited non-zero (its recorder timed out, or a component failed)."""


@dataclass(frozen=True)
class KueueRun:
    summary: Summary
    stats: CmdStats
    runner_wall_s: float
    out: Path
    writes: Counter[str]  # the envtest API server's writes, by resource, at its last scrape


def _scrape_writes(kubeconfig: Path) -> Counter[str] | None:
    """The envtest API server's write counts, through the kubeconfig the runner writes for
    minimalkueue; None while it is not there (yet, or any more)."""
    if not kubeconfig.exists():
        return None
    try:
        creds = load_credentials(str(kubeconfig))
        ctx = ssl.create_default_context(cafile=creds.ca_file)
        if creds.cert_file and creds.key_file:
            ctx.load_cert_chain(creds.cert_file, creds.key_file)
        with urllib.request.urlopen(f"{creds.host}/metrics", timeout=5, context=ctx) as resp:
            return api_write_counts(resp.read().decode())
    except Exception:  # the control plane is starting or stopping: the last scrape stands
        return None


def command(build: KueueBuild, generator: Path, out: Path, timeout_s: float, tas: bool) -> list[str]:
    return [
        str(build.runner),
        f"--o={out}",
        f"--crds={build.crds}",
        f"--generatorConfig={generator}",
        f"--minimalKueue={build.minimalkueue}",
        *(["--enableTAS=true"] if tas else []),
        f"--timeout={int(timeout_s)}s",
        "--withLogs=true",
        "--logToFile=true",
        "--metricsScrapeInterval=5s",
    ]


def run(
    build: KueueBuild,
    control_plane: Path,
    generator: Path,
    out: Path,
    timeout_s: float,
    tas: bool,
    say: Callable[[str], None],
    report_every_s: float = 30.0,
) -> KueueRun:
    """Run the runner to its end; its own output goes to out/runner.log."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KUBEBUILDER_ASSETS": str(control_plane)}
    env.pop("KUBECONFIG", None)
    t0 = time.monotonic()
    writes: Counter[str] = Counter()
    with (out / "runner.log").open("wb") as log:
        proc = subprocess.Popen(
            command(build, generator, out, timeout_s, tas), stdout=log, stderr=subprocess.STDOUT, env=env
        )
        next_report, next_scrape = t0 + report_every_s, t0
        while proc.poll() is None:
            time.sleep(1.0)
            if time.monotonic() >= next_scrape:
                writes = _scrape_writes(out / "kubeconfig") or writes
                next_scrape = time.monotonic() + SCRAPE_EVERY_S
            if time.monotonic() >= next_report:
                say(
                    f"kueue: {time.monotonic() - t0:5.0f} s  (runner and minimalkueue running; "
                    f"log {out / 'runner.log'})"
                )
                next_report += report_every_s
    wall = time.monotonic() - t0
    summary, stats = out / "summary.yaml", out / "minimalkueue.stats.yaml"
    if proc.returncode != 0 or not summary.exists():
        raise KueueRunFailed(
            f"Kueue's runner exited {proc.returncode} after {wall:.0f} s; its log: {out / 'runner.log'}"
        )
    return KueueRun(read_summary(summary, out / "wlStates.csv"), read_cmd_stats(stats), wall, out, writes)
