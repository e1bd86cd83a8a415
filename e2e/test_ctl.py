"""`kubectl gpuq ...` against a real API server with the operator running: explain gives the reason
code the operator wrote for each way a job can wait, and stop/resume and queue hold/release do what
they say. The plugin is the installed console script `kubectl-gpuq`, found by kubectl on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

import test_operator as shared
from gpuq.controller.testing import GpuqClient, OperatorProcess
from gpuq.devcluster.testing import E2ECluster, wait_for
from test_failover import pinned_job
from test_operator_install import kubectl

pytestmark = pytest.mark.e2e

gpuq = shared.gpuq
operator = shared.operator
ns = shared.ns
queue = shared.queue


RACK = {"level": "rack", "mode": "Required"}


def plugin(cluster: E2ECluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    return subprocess.run(
        [kubectl(cluster), "gpuq", *args], env=env, capture_output=True, text=True, timeout=60
    )


def explain(cluster: E2ECluster, ns: str, name: str) -> dict[str, Any]:
    out = plugin(cluster, "explain", f"{ns}/{name}", "-o", "json")
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def reason_is(gpuq: GpuqClient, ns: str, name: str, code: str) -> bool:
    return gpuq.status(ns, name).get("reason") == code


def test_explain_gives_the_operators_reason_code_for_every_way_to_wait(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Any
) -> None:
    g = cluster.gpus_per_node
    nodes = len(cluster.node_names)
    cohort_a, cohort_b = f"c-{uuid.uuid4().hex[:5]}", f"c-{uuid.uuid4().hex[:5]}"
    qa = queue(g)
    queue(g, cohort=cohort_a)  # lends to the borrower, which may not borrow
    borrower = queue(g, cohort=cohort_a, borrowingLimitGPUs=0)
    peer, tight = queue(g, cohort=cohort_b), queue(g, cohort=cohort_b)
    strict = queue(g, queueingStrategy="StrictFIFO")
    held = queue(g, stopPolicy="Hold")
    big = queue(nodes * g * 2)
    locked = queue(g, namespaceSelector={"matchLabels": {"team": "nobody"}})
    # Two whole nodes busy, then every other node but one GPU: 1 free GPU on each of nodes - 2 nodes.
    gpuq.submit(ns, "fill-a", qa, 1, g)
    gpuq.submit(ns, "fill-peer", peer, 1, g)
    for name in ("fill-a", "fill-peer"):
        gpuq.wait_phase(ns, name, "Running", timeout=60)
    fillers = [f"fill-{i}" for i in range(nodes - 2)]
    for name in fillers:  # a long checkpoint grace keeps "urgent" WaitingForPreemption throughout
        gpuq.submit(ns, name, big, 1, g - 1, checkpoint={"gracePeriodSeconds": 900})
    for name in fillers:
        gpuq.wait_phase(ns, name, "Running", timeout=60)

    expected = {
        "quota": ("QuotaExceeded", dict(queue=qa, replicas=1, gpus=g)),
        "borrow": ("BorrowingLimit", dict(queue=borrower, replicas=2, gpus=g)),
        "exhaust": ("CohortExhausted", dict(queue=tight, replicas=2, gpus=g)),
        "head": ("QuotaExceeded", dict(queue=strict, replicas=2, gpus=g, priority=1)),  # first in its queue
        "behind": ("BehindQueueHead", dict(queue=strict, replicas=1, gpus=1)),
        "held": ("Held", dict(queue=held, replicas=1, gpus=1)),
        "model": ("NoMatchingNodes", dict(queue=big, replicas=1, gpus=1, workers={"gpuModels": ["B200"]})),
        "rack": ("TopologyUnsatisfiable", dict(queue=big, replicas=3, gpus=g, topology=RACK)),
        "huge": ("ExceedsCapacity", dict(queue=big, replicas=nodes + 4, gpus=g)),
        "orphan": ("QueueNotFound", dict(queue=f"missing-{uuid.uuid4().hex[:5]}", replicas=1, gpus=1)),
        "paused": ("Suspended", dict(queue=big, replicas=1, gpus=1, suspend=True)),
        "frag": ("Fragmented", dict(queue=big, replicas=1, gpus=2)),
        "short": ("InsufficientCapacity", dict(queue=big, replicas=2, gpus=g)),
        "urgent": ("WaitingForPreemption", dict(queue=big, replicas=1, gpus=g, priority=10)),
        "outsider": ("NamespaceNotAllowed", dict(queue=locked, replicas=1, gpus=1)),
        "badlevel": ("UnknownTopologyLevel", dict(queue=big, replicas=1, gpus=1, topology={"level": "pod"})),
    }  # fmt: skip
    for name, (_, spec) in expected.items():
        spec = dict(spec)
        gpuq.submit(ns, name, spec.pop("queue"), spec.pop("replicas"), spec.pop("gpus"), **spec)
    # The schema refuses a template without containers now; a bad quantity only the operator sees.
    bad_cpu = gpuq.job_body("notemplate", big, 1, 1)
    lots = {"name": "trainer", "image": "train:1", "resources": {"requests": {"cpu": "lots"}}}
    bad_cpu["spec"]["workers"]["template"] = {"spec": {"containers": [lots]}}
    gpuq.create_job(ns, bad_cpu)
    expected["notemplate"] = ("InvalidPodTemplate", {})
    for name, (code, _) in expected.items():
        wait_for(
            lambda n=name, c=code: reason_is(gpuq, ns, n, c),
            60,
            f"{name}: reason {code}\n{operator.log_tail(20)}",
        )  # type: ignore[misc]
    for name, (code, _) in expected.items():
        ex = explain(cluster, ns, name)
        assert ex["reason"] == code, (name, ex)
        assert ex["sections"].get("What would unblock it"), (name, ex)
    quota = explain(cluster, ns, "quota")
    assert quota["sections"]["What would unblock it"][0] == f"nominalGPUs of {qa} raised to {2 * g} (now {g})"
    assert explain(cluster, ns, "held")["sections"]["What would unblock it"] == [
        f"release the queue: gpuq queue release {held}"
    ]
    assert explain(cluster, ns, "outsider")["sections"]["What would unblock it"] == [
        f"label namespace {ns} to match the namespaceSelector of GPUQueue {locked}, "
        "or submit to another queue"
    ]
    running = explain(cluster, ns, "fill-a")
    assert running["phase"] == "Running" and len(running["nodes"]) == 1

    # Issue 33: the victim's message named its preemptor twice ("preempted by X (preempted by X (...")).
    def urgents_victim() -> dict[str, Any] | None:
        statuses = (gpuq.status(ns, f) for f in fillers)
        return next(
            (s for s in statuses if (s.get("preemption") or {}).get("preemptor") == f"{ns}/urgent"), None
        )

    victim: dict[str, Any] = wait_for(urgents_victim, 30, "the victim of urgent records its preemption")
    assert victim["message"].startswith(f"preempted by {ns}/urgent (priority 10 > 0) in queue {big} ")
    assert victim["message"].count("preempted by") == 1, victim["message"]

    table = plugin(cluster, "jobs", "-n", ns, "--status", "pending")
    assert table.returncode == 0 and "Fragmented" in table.stdout and "fill-0" not in table.stdout
    queues = json.loads(plugin(cluster, "queues", "-o", "json").stdout)
    row = next(q for q in queues if q["name"] == held)
    assert row["stopPolicy"] == "Hold" and row["pending"] == 1
    # The other output formats carry the same answers.
    wide = plugin(cluster, "jobs", "-n", ns, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-4:] == ["PRIORITY", "ATTEMPT", "NODES", "MESSAGE"]
    assert any(line.split()[1] == "urgent" and "WaitingForPreemption" in line for line in wide[1:])
    jobs_yaml = yaml.safe_load(plugin(cluster, "jobs", "-n", ns, "-o", "yaml").stdout)
    assert {r["name"]: r["reason"] for r in jobs_yaml}["frag"] == "Fragmented"
    queues_wide = plugin(cluster, "queues", "-o", "wide").stdout.splitlines()
    assert queues_wide[0].split()[-3:] == ["WEIGHT", "BORROW-LIMIT", "ERROR"]
    assert any(line.split()[0] == held and " Hold " in f"{line} " for line in queues_wide[1:])
    held_yaml = yaml.safe_load(plugin(cluster, "explain", f"{ns}/held", "-o", "yaml").stdout)
    held_json = explain(cluster, ns, "held")
    assert held_yaml["reason"] == "Held" and held_yaml["summary"] == held_json["summary"]
    assert held_yaml["sections"]["What would unblock it"] == held_json["sections"]["What would unblock it"]


def test_a_lender_reclaiming_its_quota_waits_for_preemption_and_explain_agrees(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Any
) -> None:
    """Issue 33: while the borrower's gang checkpointed for it, the lender's job said
    InsufficientCapacity (explain: "no peer in cohort ... runs on borrowed quota")."""
    g = cluster.gpus_per_node
    nodes = cluster.node_names[-4:]
    cohort = f"c-{uuid.uuid4().hex[:5]}"
    lender, borrower = queue(2 * g, cohort=cohort), queue(2 * g, cohort=cohort)
    slow = {"requestOnPreemption": True, "gracePeriodSeconds": 900}
    gpuq.create_job(ns, pinned_job(gpuq, "borrowed", borrower, 4, nodes, checkpoint=slow))
    gpuq.wait_phase(ns, "borrowed", "Running", timeout=60)
    gpuq.create_job(ns, pinned_job(gpuq, "owner", lender, 2, nodes))
    wait_for(lambda: gpuq.condition(ns, "borrowed", "PreemptionRequested"), 30, "borrower asked to save")
    wait_for(lambda: reason_is(gpuq, ns, "owner", "WaitingForPreemption"), 30, "owner waits for its victim")
    # The cycles after the victim's status recorded the preemption (it is evicting now) agree.
    for _ in range(10):
        time.sleep(0.3)
        assert reason_is(gpuq, ns, "owner", "WaitingForPreemption"), gpuq.status(ns, "owner")
    ex = explain(cluster, ns, "owner")
    assert ex["reason"] == "WaitingForPreemption", ex
    assert ex["sections"]["What would unblock it"] == [f"its victims releasing their GPUs: {ns}/borrowed"]
    victim = gpuq.status(ns, "borrowed")["message"]
    assert victim.startswith(f"reclaimed by queue {lender} for {ns}/owner") and "preempted by" not in victim


def test_stop_resume_hold_drain_release(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Any
) -> None:
    q = queue(2 * cluster.gpus_per_node)
    quick = {"requestOnPreemption": True, "gracePeriodSeconds": 2}
    gpuq.submit(ns, "train", q, 1, cluster.gpus_per_node, checkpoint=quick)
    gpuq.wait_phase(ns, "train", "Running", timeout=60)

    out = plugin(cluster, "stop", f"{ns}/train")
    assert out.returncode == 0, out.stderr
    st = gpuq.wait_phase(ns, "train", "Suspended", timeout=60)
    assert st.get("preemptions", 0) == 0  # a stop is not a preemption
    wait_for(
        lambda: not [p for p in gpuq.core.list_namespaced_pod(ns).items if not p.metadata.deletion_timestamp],
        30,
        "pods gone",
    )
    wait_for(lambda: reason_is(gpuq, ns, "train", "Suspended"), 30, "reason Suspended")
    assert explain(cluster, ns, "train")["reason"] == "Suspended"
    # Issue 33: one stop, one Suspended Event (the eviction's), not a second when it turns Blocked.
    wait_for(lambda: (gpuq.condition(ns, "train", "Blocked") or {}).get("status") == "True", 30, "Blocked")
    time.sleep(2)  # an Event posted after that status write has landed by now
    suspended = [e.message for e in gpuq.events(ns, "train") if e.reason == "Suspended"]
    assert len(suspended) == 1, suspended

    assert plugin(cluster, "resume", f"{ns}/train").returncode == 0
    st = gpuq.wait_phase(ns, "train", "Running", timeout=60)
    assert st["attempt"] == 2

    assert plugin(cluster, "queue", "hold", q, "--drain").returncode == 0
    wait_for(
        lambda: reason_is(gpuq, ns, "train", "Held"),
        60,
        f"drained into the held queue\n{operator.log_tail(20)}",
    )
    assert gpuq.status(ns, "train")["phase"] == "Queued"
    assert plugin(cluster, "queue", "release", q).returncode == 0
    st = gpuq.wait_phase(ns, "train", "Running", timeout=60)
    assert st["attempt"] == 3 and st.get("reason") is None


def test_errors_are_one_readable_line(cluster: E2ECluster, gpuq: GpuqClient, ns: str) -> None:
    missing = plugin(cluster, "explain", f"{ns}/nope")
    assert missing.returncode == 1 and missing.stderr == f"gpuq explain: trainingjob {ns}/nope not found\n"
    env_less = subprocess.run(
        [sys.executable, "-m", "gpuq.cli", "queues", "--kubeconfig", "/nonexistent/kubeconfig"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert env_less.returncode == 2 and "Traceback" not in env_less.stderr
    assert env_less.stderr.startswith("gpuq queues: no usable kubeconfig")


def test_explain_a_gang_backing_off_after_repeated_failures(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Any
) -> None:
    """Each worker fails a second after it starts; from the third restart on the back-off (5 s x 2^(n-2))
    is long enough to ask explain while it lasts."""
    from gpuq.devcluster import SIM_FAIL_AFTER

    cluster.require_simulated_pods("a worker that fails on cue")
    q = queue(cluster.gpus_per_node)
    gpuq.submit(ns, "crashy", q, 1, cluster.gpus_per_node, maxRestarts=10, annotations={SIM_FAIL_AFTER: "1s"})
    gpuq.wait_status(
        ns,
        "crashy",
        lambda s: s.get("reason") == "BackingOff" and s.get("restarts", 0) >= 3,
        120,
        "a long restart back-off",
    )
    ex = explain(cluster, ns, "crashy")
    assert ex["reason"] == "BackingOff" and ex["phase"] == "Recovering", ex
    assert ex["sections"]["What would unblock it"][0].startswith("time: its restart back-off ends in ")
