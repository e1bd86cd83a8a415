"""The README's main command (`make demo` = `gpuq demo`) kept honest: the demo's own scenario, run by
the same code (gpuq.demo.session.run_scenario) against the session's cluster and the real operator,
and every act checked here from what the API server recorded: the watch history of the jobs, their
status, their pods and Events, the queues.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpuq.api import meta
from gpuq.controller.testing import GpuqClient
from gpuq.demo import scenario as sc
from gpuq.demo.scenario import Report
from gpuq.demo.session import ensure_namespace, run_scenario
from gpuq.demo.watch import Transition
from gpuq.devcluster.processes import log_tail
from gpuq.devcluster.testing import E2ECluster, wait_for
from test_existing_workloads import owner_events

pytestmark = pytest.mark.e2e

SPEED = 2.0  # run times and pauses halved: ~1 minute; the story's margins hold up to 3


@dataclass
class Run:
    report: Report
    gpuq: GpuqClient
    namespace: str
    operator_log: Path

    def why(self) -> str:
        """Context for a failed assertion: the scenario's verdict and the end of the operator log."""
        tail = "\n".join(log_tail(self.operator_log, 30))
        return f"{self.report.failure or 'all acts completed'}\n--- operator log ---\n{tail}"

    def history(self, job: str) -> list[Transition]:
        return [t for t in self.report.history if t.job == job]

    def status(self, job: str) -> dict[str, Any]:
        return self.gpuq.status(self.namespace, job)

    def worker_env(self, job: str) -> dict[str, str]:
        """Env of the rank-0 worker of the job's current attempt, read from the API."""
        attempt = str(self.status(job)["attempt"])
        pod = next(
            p
            for p in self.gpuq.pods(self.namespace, job)
            if p.metadata.labels[meta.LABEL_ATTEMPT] == attempt and p.metadata.labels[meta.LABEL_RANK] == "0"
        )
        return {e.name: e.value for e in pod.spec.containers[0].env or []}

    def event_reasons(self, job: str) -> set[str]:
        return {e.reason for e in self.gpuq.events(self.namespace, job)}


def first(history: list[Transition], after: float = -1.0, **match: Any) -> Transition | None:
    """The first transition after `after` whose fields equal `match`."""
    return next(
        (t for t in history if t.at > after and all(getattr(t, k) == v for k, v in match.items())), None
    )


@pytest.fixture(scope="module")
def run(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    if not (cluster.can_fail_nodes and cluster.simulated_pods):
        pytest.skip(f"the demo needs a gpuq dev cluster (backend {cluster.backend!r} cannot fail nodes)")
    if len(cluster.node_names) != sc.FLEET_NODES:
        pytest.skip(
            f"the demo needs {sc.FLEET_NODES} GPU nodes; GPUQ_E2E_SHAPE gives {len(cluster.node_names)}"
        )
    namespace = f"demo-{uuid.uuid4().hex[:6]}"
    ensure_namespace(cluster, namespace)
    gpuq = GpuqClient(cluster.api)
    work = tmp_path_factory.mktemp("demo")
    console = Console(file=sys.stdout, width=160, color_system=None)  # shown by pytest when a test fails
    try:
        report = run_scenario(cluster, namespace, work, console, speed=SPEED)
        yield Run(report, gpuq, namespace, work / "operator.log")
    finally:
        _clean_up(cluster, gpuq, namespace)


def _clean_up(cluster: E2ECluster, gpuq: GpuqClient, namespace: str) -> None:
    """Free the fleet for the next tests: no demo pods, queues or failed nodes left."""
    for node in cluster.node_names:
        if not cluster.node_ready(node):
            cluster.recover_node(node)
    for job in gpuq.jobs(namespace):
        gpuq.delete_job(namespace, job["metadata"]["name"])
    gpuq.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(lambda: not gpuq.core.list_namespaced_pod(namespace).items, 60, f"pods of {namespace} gone")
    for queue in sc.QUEUES:
        gpuq.delete_queue(queue.name)
    with contextlib.suppress(Exception):
        gpuq.core.delete_namespace(namespace)


def test_every_act_completes(run: Run) -> None:
    acts = [(a.number, a.ok) for a in run.report.acts]
    assert acts == [(1, True), (2, True), (3, True), (4, True), (5, True)], run.why()


def test_act1_jobs_are_admitted_and_one_waits_with_a_position_and_reason_while_a_team_borrows(
    run: Run,
) -> None:
    for job in (sc.PRETRAIN, sc.FINETUNE, sc.SWEEP, sc.BERT, sc.VISION):
        assert first(run.history(job), phase="Running", attempt=1), (job, run.why())
    waiting = first(run.history(sc.EVAL), phase="Queued", position=1)
    assert waiting is not None and "borrow" in waiting.message, run.why()  # the reason: its borrowing limit
    # a-eval was not admitted before a-finetune's quota came back (act 4)
    done = first(run.history(sc.FINETUNE), phase="Succeeded")
    admitted = first(run.history(sc.EVAL), phase="Running")
    assert done and admitted and admitted.at >= done.at, run.why()
    team_a = run.gpuq.queue(sc.TEAM_A)
    status, nominal = team_a["status"], team_a["spec"]["nominalGPUs"]
    assert status["usedGPUs"] > nominal and status["borrowedGPUs"] == status["usedGPUs"] - nominal, status


def test_act2_low_priority_gang_checkpoints_is_preempted_whole_and_requeued(run: Run) -> None:
    bert = run.history(sc.BERT)
    preempted = first(bert, phase="Preempted")
    assert preempted is not None and preempted.nodes == (), run.why()  # the whole gang, no worker kept
    requeued = first(bert, after=preempted.at, phase="Queued", position=1)
    assert requeued is not None, run.why()
    urgent = first(run.history(sc.URGENT), phase="Running")
    assert urgent is not None and urgent.at >= preempted.at, run.why()
    status = run.status(sc.BERT)
    assert status["preemptions"] == 1 and status["restarts"] == 0, status
    saved = run.report.checkpoints[sc.BERT][0]
    assert status["lastCheckpoint"]["step"] == saved.step and status["lastCheckpoint"]["path"] == saved.path
    assert {"CheckpointRequested", "Preempted"} <= run.event_reasons(sc.BERT)
    assert "PreemptedVictim" in run.event_reasons(sc.URGENT)


def test_act3_failed_node_gang_recovers_on_other_nodes_from_its_checkpoint(run: Run) -> None:
    dead = run.report.failed_node
    pretrain = run.history(sc.PRETRAIN)
    before = first(pretrain, phase="Running", attempt=1)
    assert dead is not None and before is not None and dead in before.nodes, run.why()
    recovering = first(pretrain, after=before.at, phase="Recovering", restarts=1)
    assert recovering is not None, run.why()
    again = first(pretrain, after=recovering.at, phase="Running", restarts=1)
    assert again is not None and dead not in again.nodes and len(again.nodes) == len(before.nodes), run.why()
    saved = run.report.checkpoints[sc.PRETRAIN][-1]
    env = run.worker_env(sc.PRETRAIN)
    assert env["GPUQ_RESUME_FROM"] == saved.path and env["GPUQ_RESUME_STEP"] == str(saved.step), env
    assert env["GPUQ_RESTART_COUNT"] == "1", env
    assert "NodeFailed" in run.event_reasons(sc.PRETRAIN)


def test_act4_jobs_complete_and_the_queued_ones_are_admitted(run: Run) -> None:
    for job in sc.FINISHERS:
        assert run.status(job)["phase"] == "Succeeded", (job, run.why())
    freed = first(run.history(sc.URGENT), phase="Succeeded")
    resumed = first(run.history(sc.BERT), phase="Running", attempt=2)
    assert freed and resumed and resumed.at >= freed.at, run.why()
    assert run.worker_env(sc.BERT)["GPUQ_RESUME_FROM"] == run.report.checkpoints[sc.BERT][0].path
    for job in (sc.BERT, sc.EVAL, sc.PRETRAIN, sc.SWEEP):
        assert run.status(job)["phase"] == "Running", (job, run.why())


def test_act5_a_pytorchjob_is_bound_as_one_gang_beside_the_trainingjobs_and_succeeds(run: Run) -> None:
    gang = run.history(sc.LLM_GANG)
    running = first(gang, phase="Running", attempt=1)
    assert running is not None and len(running.nodes) == sc.LLM_JOB.replicas, run.why()
    assert len(set(running.nodes)) == 1, running  # two half-node workers: packed onto one node
    assert first(gang, after=running.at, phase="Succeeded") is not None, run.why()
    group, version, plural = sc.PYTORCHJOBS
    body = run.gpuq.custom.get_namespaced_custom_object(
        group, version, run.namespace, plural, sc.LLM_JOB.name
    )
    done = {c["type"]: c["status"] for c in body["status"]["conditions"]}
    assert done.get("Succeeded") == "True", body["status"]
    # It took a free node: the TrainingJobs kept theirs, and nobody was preempted for it.
    for job in (sc.BERT, sc.EVAL, sc.PRETRAIN, sc.SWEEP):
        assert not set(running.nodes) & set(node_names(run, job)), (job, running.nodes)
    assert run.status(sc.BERT)["preemptions"] == 1, run.why()  # act 2's only
    assert "Admitted" in owner_events(run.gpuq, run.namespace, sc.LLM_JOB.name, "PyTorchJob"), run.why()


def node_names(run: Run, job: str) -> list[str]:
    return [p["node"] for p in run.status(job).get("placement") or []]
