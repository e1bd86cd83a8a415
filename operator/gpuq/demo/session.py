"""The imperative shell of `gpuq demo`: local cluster, CRDs, operator process, scenario, teardown.

`run_scenario` is what the e2e test runs too (on the test session's cluster); `run_demo` adds the
cluster of its own around it. Nothing is left behind: the cluster and the operator are tied to this
process (the kernel kills them if it dies, even by SIGKILL) unless --keep, and are stopped on exit,
also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
from kubernetes import config as k8s_config
from rich.console import Console, RenderableType

from gpuq.api import meta
from gpuq.controller import testing
from gpuq.controller.testing import GpuqClient, install_crds
from gpuq.demo.display import LiveDisplay, PlainDisplay
from gpuq.demo.scenario import JOB_ORDER, Report, Scenario, Stage, rack_map
from gpuq.demo.view import Narration, gang_as_job, screen
from gpuq.demo.watch import Collection
from gpuq.devcluster import Cluster, Shape, ensure_binaries
from gpuq.devcluster.binaries import bin_dir, missing_binaries
from gpuq.devcluster.cluster import AlreadyRunning
from gpuq.devcluster.paths import cache_root
from gpuq.devcluster.processes import ProcessRecord, alive, log_tail, spawn, stop, wait_until
from gpuq.devcluster.testing import E2ECluster, wait_for
from gpuq.peers.training_operator import (
    TrainingOperatorBuild,
    TrainingOperatorStack,
    cached_build,
    ensure_training_operator,
)

# 2 blocks x 2 racks x 4 nodes x 8 GPUs = 128 GPUs: a rack holds exactly one 4x8 gang.
DEMO_SHAPE = Shape(racks=4, nodes_per_rack=4, gpus_per_node=8, blocks=2, zones=1)
DEMO_NAMESPACE = "demo"
DEFAULT_NAME = "demo"
# Fail a dead node's gangs once it has been NotReady for 5 s (default 10 s), so the demo does not idle.
OPERATOR_CONFIG = "failover: {notReadyGraceSeconds: 5}\n"


@dataclass(frozen=True)
class Options:
    name: str = DEFAULT_NAME
    keep: bool = False
    live: bool = True
    speed: float = 1.0


def work_dir(name: str) -> Path:
    """Logs, the operator's config and (with --keep) its process record: ~/.cache/gpuq/demo/<name>/."""
    path = cache_root() / "demo" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- the operator process -----------------------------------------------------------------------------
def start_operator(kubeconfig: Path, work: Path, tie: bool) -> ProcessRecord:
    """`gpuq operator run` as a child process in its own session, JSON logs to work/operator.log."""
    config = work / "operator-config.yaml"
    config.write_text(OPERATOR_CONFIG)
    log = work / "operator.log"
    log.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "gpuq.cli", "operator", "run", "--metrics-port", "0"]
    argv += ["--kubeconfig", str(kubeconfig), "--config", str(config)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return spawn("gpuq-operator", argv, log, env=env, tie_to_parent=tie)


def stop_operator(rec: ProcessRecord, grace: float = 10.0) -> None:
    """One SIGTERM to the operator alone (kopf treats a second one as an error), SIGKILL if it hangs."""
    if not alive(rec):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(rec.pid, signal.SIGTERM)
    if not wait_until(lambda: not alive(rec), grace):
        stop(rec, grace=0)


def _record_path(name: str) -> Path:
    return work_dir(name) / "operator.json"


def stop_kept(name: str) -> list[str]:
    """Stop a demo left running by --keep (its operator, then its cluster); says what was stopped."""
    stopped: list[str] = []
    record = _record_path(name)
    if record.exists():
        rec = ProcessRecord.from_json(json.loads(record.read_text()))
        if alive(rec):
            stop_operator(rec)
            stopped.append(f"operator (pid {rec.pid})")
        record.unlink()
    if not Cluster.remove_leftovers(name) and name in Cluster.names():
        Cluster.attach(name).down()
        stopped.append(f"cluster {name!r}")
    return stopped


# -- Kubeflow's training-operator (act 5) ---------------------------------------------------------------
def training_operator_build(console: Console) -> TrainingOperatorBuild:
    """Built from its Go module on the first run (a few minutes on 2 cores, with progress), cached."""
    if cached_build().missing():
        console.print("building Kubeflow's training-operator for act 5 (first run only; ~3 min on 2 cores)")
    return ensure_training_operator(progress=sys.stderr)


def start_training_operator(cluster: E2ECluster, work: Path, console: Console) -> TrainingOperatorStack:
    """Its install on the cluster and the controller as a local process (it stops with this one)."""
    stack = TrainingOperatorStack(
        training_operator_build(console), ensure_binaries() / "kubectl", cluster.kubeconfig, work
    )
    stack.up(say=lambda m: console.print(m, highlight=False))
    console.print(f"training-operator: log in {stack.log_path}", highlight=False)
    return stack


# -- running the scenario ----------------------------------------------------------------------------
def cluster_handle(dev: Cluster) -> E2ECluster:
    new_client: Any = k8s_config.new_client_from_config  # untyped in the client
    api = new_client(config_file=str(dev.kubeconfig))
    return E2ECluster(
        "local",
        dev.kubeconfig,
        api,
        simulated_pods=True,
        shape=dev.shape,
        _fail=dev.fail_node,
        _recover=dev.recover_node,
    )


def ensure_namespace(cluster: E2ECluster, name: str) -> None:
    testing.ensure_namespace(cluster.core, name)
    wait_for(
        lambda: (
            cluster.core.list_namespaced_service_account(name, field_selector="metadata.name=default").items
        ),
        30,
        f"service account default in namespace {name}",
    )


def run_scenario(
    cluster: E2ECluster,
    namespace: str,
    work: Path,
    console: Console,
    *,
    live: bool = False,
    speed: float = 1.0,
    keep_operator: bool = False,
    name: str = DEFAULT_NAME,
) -> Report:
    """Install the CRDs, start Kubeflow's training-operator and gpuq's operator, play the five acts,
    stop both (the operator unless kept)."""
    install_crds(cluster.api)
    gpuq = GpuqClient(cluster.api)
    kubeflow = start_training_operator(cluster, work, console)
    operator = start_operator(cluster.kubeconfig, work, tie=not keep_operator)
    console.print(f"operator: pid {operator.pid}, JSON logs in {operator.log}", highlight=False)
    try:
        jobs = Collection(
            "trainingjobs",
            gpuq.custom.list_namespaced_custom_object,
            meta.GROUP,
            meta.VERSION,
            namespace,
            "trainingjobs",
            track=True,
        )
        queues = Collection(
            "gpuqueues", gpuq.custom.list_cluster_custom_object, meta.GROUP, meta.VERSION, "gpuqueues"
        )
        gangs = Collection(
            "gangs",
            gpuq.custom.list_namespaced_custom_object,
            meta.GROUP,
            meta.VERSION,
            namespace,
            "gangs",
            track=True,
        )
        racks = rack_map(cluster)

        def frame(narration: Narration | None) -> RenderableType:
            rows = [*jobs.items(), *(gang_as_job(g) for g in gangs.items())]
            return screen(narration, rows, queues.items(), racks, JOB_ORDER, jobs.elapsed())

        with jobs, queues, gangs:
            display = LiveDisplay(console, frame) if live else PlainDisplay(console, frame, jobs.elapsed)
            with display:
                stage = Stage(
                    cluster, gpuq, namespace, jobs, queues, gangs, display, speed, lambda: alive(operator)
                )
                return Scenario(stage).run()
    finally:
        if keep_operator:
            _record_path(name).write_text(json.dumps(operator.to_json()))
        else:
            stop_operator(operator)
        kubeflow.down()


# -- the whole demo --------------------------------------------------------------------------------
def _sigterm_as_interrupt(_sig: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # the same orderly teardown as Ctrl-C


@contextmanager
def _uninterruptible() -> Iterator[None]:
    """A second Ctrl-C must not cut the teardown short."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _log_to(path: Path) -> None:
    """Send this process's own logs (structlog and stdlib) to a file: stderr belongs to the table."""
    stream = path.open("a", buffering=1)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=stream))
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(logging.StreamHandler(stream))


def _start_cluster(opts: Options, console: Console) -> Cluster:
    if missing_binaries(bin_dir()):
        console.print("building the control-plane binaries (first run only; ~10 min on 2 cores)")
    ensure_binaries(progress=sys.stderr)
    training_operator_build(console)
    console.print(f"starting local cluster {opts.name!r}: {DEMO_SHAPE.describe()}", highlight=False)
    return Cluster.up(
        opts.name, DEMO_SHAPE, tie_to_process=not opts.keep, progress=lambda m: console.print(f"  {m}")
    )


def _summary(report: Report, console: Console, operator_log: Path) -> None:
    for act in report.acts:
        mark = "[green]ok[/]" if act.ok else "[bold red]FAILED[/]"
        console.print(f"  act {act.number} {act.title}: {mark} ({act.seconds:.0f}s) {act.detail}")
    if report.ok:
        console.print(f"[bold green]demo complete[/] in {report.seconds:.0f}s")
        return
    console.print(f"[bold red]demo did not complete[/]: {report.failure}")
    console.print(f"operator log {operator_log}, last lines:")
    for line in log_tail(operator_log, 10):
        console.print(f"  {line}", markup=False, highlight=False)


def _kept_help(dev: Cluster, console: Console) -> None:
    console.print(
        f"\nthe demo keeps running (--keep). Look around:\n"
        f"  export KUBECONFIG={dev.kubeconfig}\n"
        f"  export PATH={bin_dir()}:$PATH          # kubectl\n"
        f"  kubectl get tj -n {DEMO_NAMESPACE}; kubectl get gq\n"
        f"  kubectl get pods -n {DEMO_NAMESPACE} -o wide\n"
        f"  kubectl describe tj -n {DEMO_NAMESPACE} b-bert   # events: CheckpointRequested, Preempted, ...\n"
        f"Stop it with: gpuq demo --down" + ("" if dev.name == DEFAULT_NAME else f" --name {dev.name}"),
        highlight=False,
    )


def run_demo(opts: Options, console: Console) -> int:
    """`gpuq demo`: the exit code is 0 when every act happened, 1 if one did not, 130 on Ctrl-C."""
    work = work_dir(opts.name)
    _log_to(work / "demo.log")
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored (`cmd &`)
    try:
        dev = _start_cluster(opts, console)
    except AlreadyRunning:
        console.print(
            f"a demo cluster {opts.name!r} is still running (left by --keep?): "
            f"stop it with `gpuq demo --down`" + ("" if opts.name == DEFAULT_NAME else f" --name {opts.name}")
        )
        return 1
    except KeyboardInterrupt:
        console.print("interrupted while starting; nothing left running")
        return 130
    console.print(
        f"cluster ready in {dev.timings.get('nodes_ready', 0):.1f}s; KUBECONFIG={dev.kubeconfig}",
        highlight=False,
    )
    code = 130
    try:
        handle = cluster_handle(dev)
        ensure_namespace(handle, DEMO_NAMESPACE)
        report = run_scenario(
            handle,
            DEMO_NAMESPACE,
            work,
            console,
            live=opts.live,
            speed=opts.speed,
            keep_operator=opts.keep,
            name=opts.name,
        )
        _summary(report, console, work / "operator.log")
        code = 0 if report.ok else 1
    except KeyboardInterrupt:
        console.print("\ninterrupted")
    finally:
        if opts.keep:
            _kept_help(dev, console)
        else:
            with _uninterruptible():
                dev.down()
            console.print(f"cluster {opts.name!r} and the operator stopped; logs in {work}", highlight=False)
    return code
