"""The demo's story in five acts, on a fleet of 16 GPU nodes (128 GPUs with 8 per node).

Two teams share the fleet in cohort `research`: team-a (nominal 8 nodes' worth of GPUs, may borrow 4
more) and team-b (nominal 8). Every act acts on the API and then waits until the operator has
really done what the act is about, so the same code is the live demo (`gpuq demo`) and the e2e test
that keeps it honest (e2e/test_demo.py):

1. queue and admit: six jobs (gangs of 4, 2 and 1 workers); team-a borrows from team-b, and a-eval
   waits in the queue with a position and the reason (team-a's borrowing limit);
2. preemption: b-urgent (priority 100) arrives while the fleet is full; b-bert (priority 0) is asked
   to checkpoint, saves, is preempted as a whole gang and goes back to Queued;
3. failover: a node under a-pretrain dies; the gang goes Recovering and Running again on healthy
   nodes with restarts=1, its workers resuming from the checkpoint reported just before;
4. completion: jobs whose pods finish (kwok `gpuq.dev/sim-duration`) succeed, and the queued jobs
   (b-bert, resuming from its checkpoint, and a-eval) are admitted;
5. a job teams already have: team-b submits a Kubeflow PyTorchJob (Master + Worker), opted in by a
   queue label and `schedulerName: gpuq`; gpuq binds its pods as one gang beside the TrainingJobs,
   records it in its Gang, and it succeeds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, pytorchjob_body
from gpuq.demo.trainer import Checkpoint, Trainer
from gpuq.demo.view import nodes_of
from gpuq.demo.watch import Collection, Transition
from gpuq.devcluster import SIM_DURATION
from gpuq.devcluster.shape import GPU_RESOURCE, RACK_LABEL
from gpuq.devcluster.testing import E2ECluster, node_is_ready

FLEET_NODES = 16
COHORT = "research"
TEAM_A, TEAM_B = "team-a", "team-b"
DWELL_SECONDS = 10.0  # pause after each act so a viewer can read the table (divided by --speed)
ACT_TIMEOUT = 90.0
CHECKPOINT_GRACE_SECONDS = 30  # how long a victim may take to checkpoint before it is evicted anyway


@dataclass(frozen=True)
class QueuePlan:
    name: str
    nominal_nodes: int
    borrow_nodes: int | None = None  # borrowingLimitGPUs in nodes' worth; None: no limit


@dataclass(frozen=True)
class JobPlan:
    name: str
    queue: str
    replicas: int
    priority: int
    runs_for: float | None = None  # seconds its pods run before succeeding (at speed 1); None: until the end


QUEUES = (QueuePlan(TEAM_A, 8, borrow_nodes=4), QueuePlan(TEAM_B, 8))
PRETRAIN, FINETUNE, SWEEP, EVAL = "a-pretrain", "a-finetune", "a-sweep", "a-eval"
BERT, VISION, URGENT = "b-bert", "b-vision", "b-urgent"
ACT1_JOBS = (
    JobPlan(PRETRAIN, TEAM_A, 4, 50),
    JobPlan(FINETUNE, TEAM_A, 4, 50, runs_for=85),
    JobPlan(SWEEP, TEAM_A, 2, 50),
    # Would take team-a to 14 nodes' worth, over its 8 nominal + 4 borrowable: waits. Its lower priority
    # puts it behind the others in the queue (creation times tie within a second; names would decide).
    JobPlan(EVAL, TEAM_A, 4, 40),
    JobPlan(BERT, TEAM_B, 4, 0),
    JobPlan(VISION, TEAM_B, 1, 50, runs_for=70),
)
URGENT_JOB = JobPlan(URGENT, TEAM_B, 4, 100, runs_for=45)
ALL_JOBS = (*ACT1_JOBS, URGENT_JOB)
# Act 5's PyTorchJob (Master + 1 Worker, half a node each) and the Gang that records it
# (docs/existing-workloads.md). Priority 0, as b-bert: it preempts nobody, and it fits one of the two
# nodes free after act 4 (a gang holds out for the smallest domain that could hold it: one node).
LLM_JOB = JobPlan("b-llm", TEAM_B, 2, 0, runs_for=20)
LLM_GANG = f"pytorchjob.{LLM_JOB.name}"
PYTORCHJOBS = ("kubeflow.org", "v1", "pytorchjobs")
JOB_ORDER = (*(j.name for j in ALL_JOBS), LLM_GANG)
FINISHERS = tuple(j.name for j in ALL_JOBS if j.runs_for is not None)
# Phases worth a note of their own (the table shows the rest).
NOTABLE = ("Preempted", "Recovering", "Succeeded", "Failed")
ACTS = 5


class ScenarioError(RuntimeError):
    """The cluster cannot stage the demo (wrong size, GPUs already in use, ...)."""


class ActFailed(RuntimeError):
    """What an act waits for did not happen in time."""


class Display(Protocol):
    def act(self, title: str) -> None: ...
    def note(self, text: str) -> None: ...
    def act_done(self) -> None: ...


@dataclass
class Stage:
    """Everything the scenario acts on and watches."""

    cluster: E2ECluster
    gpuq: GpuqClient
    namespace: str
    jobs: Collection
    queues: Collection
    gangs: Collection  # the Gangs of other owners' jobs (act 5's PyTorchJob)
    display: Display
    speed: float = 1.0
    operator_alive: Callable[[], bool] = field(default=lambda: True)


@dataclass(frozen=True)
class ActResult:
    number: int
    title: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Report:
    acts: list[ActResult] = field(default_factory=list)
    history: list[Transition] = field(default_factory=list)
    failed_node: str | None = None
    checkpoints: dict[str, list[Checkpoint]] = field(default_factory=dict)
    resume_env: dict[str, dict[str, str]] = field(default_factory=dict)  # job -> GPUQ_RESUME_* of rank 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return len(self.acts) == ACTS and all(a.ok for a in self.acts)

    @property
    def failure(self) -> str:
        return next((f"act {a.number} ({a.title}): {a.detail}" for a in self.acts if not a.ok), "")


def rack_map(cluster: E2ECluster) -> dict[str, str]:
    return {n.metadata.name: n.metadata.labels[RACK_LABEL] for n in cluster.gpu_nodes()}


def _gpus_in_use(cluster: E2ECluster) -> int:
    """GPUs requested by pods bound to a node and not finished, whoever created them."""
    pods: list[Any] = cluster.core.list_pod_for_all_namespaces().items
    total = 0
    for pod in pods:
        if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
            for c in pod.spec.containers:
                total += int(((c.resources and c.resources.requests) or {}).get(GPU_RESOURCE, 0))
    return total


def check_fleet(cluster: E2ECluster, timeout: float = 60.0) -> int:
    """The fleet must be 16 Ready GPU nodes with no GPU in use; returns GPUs per node."""
    nodes = cluster.gpu_nodes()
    if len(nodes) != FLEET_NODES:
        raise ScenarioError(f"the demo needs exactly {FLEET_NODES} GPU nodes (found {len(nodes)})")
    if not cluster.simulated_pods or not cluster.can_fail_nodes:
        raise ScenarioError("the demo needs a gpuq dev cluster (simulated pods, node failures)")
    deadline = time.monotonic() + timeout
    while (busy := _gpus_in_use(cluster)) or not all(node_is_ready(n) for n in cluster.gpu_nodes()):
        if time.monotonic() > deadline:
            raise ScenarioError(f"the fleet is not idle: {busy} GPUs in use or nodes not Ready")
        time.sleep(1.0)
    return cluster.gpus_per_node


def _status(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("status") or {}


class Scenario:
    def __init__(self, stage: Stage) -> None:
        self.s = stage
        self.trainer = Trainer(stage.gpuq, stage.namespace, stage.display.note)
        self.report = Report()
        self._seen: dict[str, int] = {}  # transitions already narrated, per collection
        self.gpus = 0

    # -- helpers ----------------------------------------------------------------------------------
    def job(self, name: str) -> Mapping[str, Any]:
        return _status(self.s.jobs.get(name))

    def phase(self, name: str) -> str | None:
        return self.job(name).get("phase")

    def _narrate_transitions(self) -> None:
        for collection in (self.s.jobs, self.s.gangs):
            history = collection.history()
            for t in history[self._seen.get(collection.kind, 0) :]:
                if t.phase in NOTABLE or (t.phase == "Running" and t.attempt > 1):
                    extra = f" (restarts {t.restarts})" if t.phase == "Recovering" else ""
                    self.s.display.note(f"{t.job}: {t.phase}{extra}")
            self._seen[collection.kind] = len(history)

    def _tick(self) -> None:
        self.trainer.answer_requests(self.s.jobs.items())
        self._narrate_transitions()

    def wait_until(self, what: str, check: Callable[[], Any], timeout: float = ACT_TIMEOUT) -> Any:
        """Keep the trainer answering and the notes flowing until `check()` is truthy."""
        deadline = time.monotonic() + timeout
        while True:
            self._tick()
            result = check()
            if result:
                return result
            if not self.s.operator_alive():
                raise ActFailed(f"{what}: the operator exited (see its log)")
            if time.monotonic() > deadline:
                raise ActFailed(f"{what}: not seen within {timeout:.0f}s")
            self.s.jobs.wait(0.25)

    def hold(self, seconds: float = DWELL_SECONDS) -> None:
        """Let the viewer read the table (scaled by --speed)."""
        end = time.monotonic() + seconds / self.s.speed
        while (left := end - time.monotonic()) > 0:
            self._tick()
            self.s.jobs.wait(min(0.25, left))

    def submit(self, plan: JobPlan) -> None:
        annotations = {}
        if plan.runs_for is not None:
            annotations[SIM_DURATION] = f"{max(1, round(plan.runs_for / self.s.speed))}s"
        self.s.gpuq.submit(
            self.s.namespace,
            plan.name,
            plan.queue,
            plan.replicas,
            self.gpus,
            annotations=annotations,
            priority=plan.priority,
            checkpoint={"requestOnPreemption": True, "gracePeriodSeconds": CHECKPOINT_GRACE_SECONDS},
        )

    def create_queues(self) -> None:
        for q in QUEUES:
            self.s.gpuq.delete_queue(q.name)  # a leftover from an interrupted run on a kept cluster
        for q in QUEUES:
            self.s.gpuq.create_queue(q.name, q.nominal_nodes * self.gpus, **self._queue_spec(q))

    def _queue_spec(self, q: QueuePlan) -> dict[str, Any]:
        spec: dict[str, Any] = {"cohort": COHORT, "preemption": {"reclaimWithinCohort": "LowerPriority"}}
        if q.borrow_nodes is not None:
            spec["borrowingLimitGPUs"] = q.borrow_nodes * self.gpus
        return spec

    def queue_status(self, name: str) -> Mapping[str, Any]:
        return _status(self.s.queues.get(name))

    def running(self, *names: str) -> bool:
        return all(self.phase(n) == "Running" for n in names)

    def resume_env(self, name: str) -> dict[str, str]:
        """GPUQ_RESUME_* of the rank-0 worker of the job's current attempt."""
        attempt = str(self.job(name).get("attempt"))
        for pod in self.s.gpuq.pods(self.s.namespace, name):
            labels = pod.metadata.labels or {}
            if labels.get(meta.LABEL_ATTEMPT) == attempt and labels.get(meta.LABEL_RANK) == "0":
                env = pod.spec.containers[0].env or []
                return {e.name: e.value for e in env if e.name.startswith("GPUQ_")}
        return {}

    # -- the acts ---------------------------------------------------------------------------------
    def run(self) -> Report:
        self.gpus = check_fleet(self.s.cluster)
        acts: Sequence[tuple[str, Callable[[], None]]] = (
            ("queue and admit", self.act_queue),
            ("preempt for a high-priority job", self.act_preempt),
            ("fail a node under a running gang", self.act_failover),
            ("complete jobs and admit the queued ones", self.act_complete),
            ("bind a PyTorchJob as one gang", self.act_pytorchjob),
        )
        assert len(acts) == ACTS
        t0 = time.monotonic()
        try:
            for number, (title, body) in enumerate(acts, start=1):
                started = time.monotonic()
                try:
                    body()
                except ActFailed as exc:
                    self.report.acts.append(
                        ActResult(number, title, False, time.monotonic() - started, str(exc))
                    )
                    self.s.display.note(f"act {number} failed: {exc}")
                    self.s.display.act_done()
                    break
                self.report.acts.append(ActResult(number, title, True, time.monotonic() - started))
                self.s.display.act_done()
                self.hold()
        finally:
            self._narrate_transitions()
            self.report.history = sorted(
                [*self.s.jobs.history(), *self.s.gangs.history()], key=lambda t: t.at
            )
            self.report.checkpoints = dict(self.trainer.reports)
            self.report.seconds = time.monotonic() - t0
        return self.report

    def act_queue(self) -> None:
        fleet = FLEET_NODES * self.gpus
        self.s.display.act(
            f"Act 1/5: teams a and b share {fleet} GPUs in cohort '{COHORT}' (nominal {fleet // 2} each); "
            "they submit gangs of 4, 2 and 1 workers"
        )
        self.create_queues()
        for plan in ACT1_JOBS:
            self.submit(plan)
        admitted = [j.name for j in ACT1_JOBS if j.name != EVAL]
        self.wait_until(f"{', '.join(admitted)} Running", lambda: self.running(*admitted))
        waiting = self.wait_until(
            f"{EVAL} Queued with a position and a reason",
            lambda: (s := self.job(EVAL)).get("phase") == "Queued" and s.get("queuePosition") and s,
        )
        borrowed = self.wait_until(
            f"{TEAM_A} reports borrowed GPUs", lambda: self.queue_status(TEAM_A).get("borrowedGPUs")
        )
        self.s.display.note(f"{TEAM_A} borrows {borrowed} GPUs that {TEAM_B} does not use")
        self.s.display.note(
            f"{EVAL} waits at position {waiting['queuePosition']}: {waiting.get('message', '')}"
        )

    def act_preempt(self) -> None:
        self.s.display.act(
            f"Act 2/5: {URGENT} (priority {URGENT_JOB.priority}) arrives in {TEAM_B} with the fleet full: "
            f"{BERT} (priority 0) must checkpoint and give way, as a whole gang"
        )
        self.submit(URGENT_JOB)
        self.wait_until(f"{URGENT} Running", lambda: self.running(URGENT))
        back = self.wait_until(
            f"{BERT} preempted and Queued again",
            lambda: (s := self.job(BERT)).get("phase") == "Queued" and s.get("preemptions") and s,
        )
        step = (back.get("lastCheckpoint") or {}).get("step")
        self.s.display.note(
            f"{BERT} is back in the queue at position {back.get('queuePosition')}; "
            f"it will resume from step {step}"
        )

    def act_failover(self) -> None:
        self.s.display.act(
            f"Act 3/5: a node under {PRETRAIN} dies; gpuq evicts the whole gang and re-places it on healthy "
            "nodes, resuming from its last checkpoint"
        )
        obj = self.s.jobs.get(PRETRAIN) or {}
        before = nodes_of(obj)
        if self.phase(PRETRAIN) != "Running" or not before:
            raise ActFailed(f"{PRETRAIN} is not running (phase {self.phase(PRETRAIN)})")
        ckpt = self.trainer.save(obj)
        self.s.display.note(f"{PRETRAIN} saves a checkpoint at step {ckpt.step}: {ckpt.path}")
        self.wait_until(
            "the operator records the checkpoint",
            lambda: (self.job(PRETRAIN).get("lastCheckpoint") or {}).get("step") == ckpt.step,
        )
        node = before[-1]
        self.report.failed_node = node
        failed_at = self.s.jobs.elapsed()
        self.s.display.note(f"{node} dies: its kubelet stops heartbeating")
        self.s.cluster.fail_node(node)
        self.s.display.note(f"{node} is NotReady {self.s.jobs.elapsed() - failed_at:.1f}s after it died")
        self.wait_until(
            f"{PRETRAIN} Recovering",
            lambda: any(
                t.job == PRETRAIN and t.phase == "Recovering" and t.at >= failed_at
                for t in self.s.jobs.history()
            ),
        )
        after = self.wait_until(
            f"{PRETRAIN} Running again with restarts=1 away from {node}",
            lambda: (
                self.running(PRETRAIN)
                and self.job(PRETRAIN).get("restarts") == 1
                and node not in (nodes := nodes_of(self.s.jobs.get(PRETRAIN) or {}))
                and nodes
            ),
        )
        env = self.report.resume_env[PRETRAIN] = self.resume_env(PRETRAIN)
        self.s.display.note(
            f"{PRETRAIN} runs again {self.s.jobs.elapsed() - failed_at:.1f}s after the node died, on "
            f"{', '.join(after)}, resuming from {env.get('GPUQ_RESUME_FROM', '(no checkpoint)')}"
        )
        self.hold(DWELL_SECONDS / 2)
        self.s.cluster.recover_node(node)
        self.s.display.note(f"{node} is back and Ready")

    def act_complete(self) -> None:
        self.s.display.act(
            "Act 4/5: jobs finish (their pods exit after their run time); quota and nodes return and the "
            f"queued {BERT} and {EVAL} are admitted"
        )
        longest = max(j.runs_for or 0 for j in ALL_JOBS) / self.s.speed
        self.wait_until(
            f"{', '.join(FINISHERS)} Succeeded; {BERT} and {EVAL} Running",
            lambda: all(self.phase(n) == "Succeeded" for n in FINISHERS) and self.running(BERT, EVAL),
            timeout=longest + ACT_TIMEOUT,
        )
        env = self.report.resume_env[BERT] = self.resume_env(BERT)
        self.s.display.note(f"{BERT} resumed from {env.get('GPUQ_RESUME_FROM', '(no checkpoint)')}")

    def act_pytorchjob(self) -> None:
        plan = LLM_JOB
        self.s.display.act(
            f"Act 5/5: {TEAM_B}'s pipeline submits the Kubeflow PyTorchJob it always has ({plan.name}: "
            f"a Master and a Worker of {self.gpus // 2} GPUs each), opted in by a queue label and "
            "schedulerName gpuq; gpuq binds it as one gang beside the TrainingJobs, on one node"
        )
        group, version, plural = PYTORCHJOBS
        seconds = max(1, round((plan.runs_for or 0) / self.s.speed))
        body = pytorchjob_body(
            plan.name, plan.queue, plan.replicas, self.gpus // 2, {SIM_DURATION: f"{seconds}s"}, plan.priority
        )
        custom = self.s.gpuq.custom
        custom.create_namespaced_custom_object(group, version, self.s.namespace, plural, body)
        running = self.wait_until(
            f"{LLM_GANG} Running",
            lambda: (g := self.s.gangs.get(LLM_GANG)) and _status(g).get("phase") == "Running" and g,
        )
        self.s.display.note(
            f"{plan.name}: its Master and Worker pods, made by the training-operator, bound together on "
            f"{', '.join(dict.fromkeys(nodes_of(running)))}; gpuq records the gang in Gang {LLM_GANG}"
        )
        self.wait_until(
            f"{LLM_GANG} Succeeded",
            lambda: _status(self.s.gangs.get(LLM_GANG)).get("phase") == "Succeeded",
            timeout=seconds + ACT_TIMEOUT,
        )
        self.s.display.note(
            f"{plan.name} Succeeded (the training-operator says so; gpuq records its gang so)"
        )
