"""Lifecycle rules the runtime relies on: kubelet refusals re-place a gang without a restart, stale
checkpoint requests are cleared, preemptions of jobs that left their placement are dropped, and
only the current attempt's pods report checkpoints (older ones are fenced off)."""

from __future__ import annotations

import json

from builders import T0, gang_pods, iso, job, placed_status

from gpuq.api import meta
from gpuq.controller.lifecycle import REJECTIONS_BEFORE_AVOIDING, Plan, observe
from gpuq.controller.objects import parse_job, parse_pod
from gpuq.core.config import FailoverConfig

CFG = FailoverConfig(backoff_base_seconds=5, backoff_max_seconds=60)
NOW = T0 + 1000
NODES = ["n1", "n2"]


def run(job_body: dict, *pod_bodies: dict) -> Plan:
    return observe(parse_job(job_body), [parse_pod(p) for p in pod_bodies], NOW, CFG)


def refused(reason: str, rejections: int = 0) -> Plan:
    pods = gang_pods("a", NODES, phase="Pending")
    pods[1]["status"] = {"phase": "Failed", "reason": reason, "message": f"Pod was rejected: {reason}"}
    return run(job("a", status=placed_status(NODES, "Admitted", rejections=rejections)), *pods)


def test_kubelet_refusal_requeues_the_gang_without_a_restart() -> None:
    plan = refused("OutOfnvidia.com/gpu")
    s = plan.status
    assert s["phase"] == "Queued" and s["placement"] == [] and s["rejections"] == 1
    assert "restarts" not in s and "failedNodes" not in s and "notBefore" not in s
    assert "n2" in s["message"] and "OutOfnvidia.com/gpu" in s["message"]
    assert [e.reason for e in plan.events] == ["AdmissionRejected"]
    assert plan.delete_pods == ("team-a/a-1-0",)  # the live rank; the refused one holds nothing


def test_repeated_refusals_back_off_and_finally_avoid_the_node() -> None:
    second = refused("UnexpectedAdmissionError", rejections=1)
    assert second.status["rejections"] == 2 and "notBefore" in second.status
    assert "failedNodes" not in second.status
    last = refused("UnexpectedAdmissionError", rejections=REJECTIONS_BEFORE_AVOIDING - 1)
    assert last.status["failedNodes"] == ["n2"]


def test_a_worker_that_crashed_is_not_a_refusal() -> None:
    pods = gang_pods("a", NODES)
    pods[1]["status"] = {
        "phase": "Failed",
        "containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
    }
    plan = run(job("a", status=placed_status(NODES, "Running")), *pods)
    assert plan.status["phase"] == "Recovering" and plan.status["restarts"] == 1


def test_running_resets_the_refusal_count() -> None:
    plan = run(job("a", status=placed_status(NODES, "Admitted", rejections=2)), *gang_pods("a", NODES))
    assert plan.status["phase"] == "Running" and plan.status["rejections"] == 0


def _requested(pods: list[dict]) -> list[dict]:
    for p in pods:
        p["metadata"]["annotations"][meta.ANNOTATION_CHECKPOINT_REQUESTED] = iso(T0 + 500)
    return pods


def test_a_checkpoint_request_without_a_preemption_is_cleared() -> None:
    """e.g. left by an operator that stopped mid-preemption: training code would checkpoint forever."""
    plan = run(job("a", status=placed_status(NODES)), *_requested(gang_pods("a", NODES)))
    assert set(plan.clear_checkpoint_request) == {"team-a/a-1-0", "team-a/a-1-1"}


def test_a_checkpoint_request_of_a_preemption_in_progress_stays() -> None:
    preemption = {"preemptor": "team-a/b", "requestedAt": iso(T0 + 500), "deadline": iso(T0 + 560)}
    plan = run(
        job("a", status=placed_status(NODES, preemption=preemption)), *_requested(gang_pods("a", NODES))
    )
    assert not plan.clear_checkpoint_request


def test_a_preemption_of_a_finished_job_is_dropped() -> None:
    preemption = {"preemptor": "team-a/b", "requestedAt": iso(T0 + 500), "deadline": iso(T0 + 560)}
    conditions = [
        {"type": "PreemptionRequested", "status": "True", "reason": "CheckpointRequested", "message": "x"}
    ]
    status = placed_status(NODES, "Succeeded", preemption=preemption, conditions=conditions)
    plan = run(job("a", status=status), *gang_pods("a", NODES, phase="Succeeded"))
    assert plan.status["preemption"] is None
    assert all(c["type"] != "PreemptionRequested" for c in plan.status["conditions"])


def test_only_the_current_attempt_reports_checkpoints() -> None:
    report = json.dumps({"step": 900, "path": "/ckpt/900", "time": T0 + 900})
    old = gang_pods("a", NODES, attempt=1)
    for p in old:
        p["metadata"]["annotations"][meta.ANNOTATION_CHECKPOINT] = report
    plan = run(
        job("a", status=placed_status(NODES, "Admitted", attempt=2)), *old, *gang_pods("a", NODES, attempt=2)
    )
    assert "lastCheckpoint" not in plan.status
    current = gang_pods("a", NODES, attempt=2)
    current[0]["metadata"]["annotations"][meta.ANNOTATION_CHECKPOINT] = report
    plan = run(job("a", status=placed_status(NODES, "Running", attempt=2)), *current)
    assert plan.status["lastCheckpoint"]["step"] == 900
