"""Per-job transitions driven by pod phases: the status patch comes first, then pod actions."""

from __future__ import annotations

from builders import T0, gang_pods, iso, job, placed_status, pod

from gpuq.controller.lifecycle import Plan, Recording, backoff, observe
from gpuq.controller.objects import parse_job, parse_pod
from gpuq.controller.record import ADMITTED_STATUS_DELAY, BURST_GANGS, status_delay
from gpuq.core.config import FailoverConfig

CFG = FailoverConfig(backoff_base_seconds=5, backoff_max_seconds=60)
NOW = T0 + 1000


def run(job_body: dict, *pod_bodies: dict, now: float = NOW) -> Plan:
    return observe(parse_job(job_body), [parse_pod(p) for p in pod_bodies], now, CFG)


def test_new_job_needs_no_write_of_its_own() -> None:
    """Its first status comes with the cycle's decision (pending, blocked or admitted)."""
    assert not run(job("a", replicas=4, gpus=8))


def test_nothing_to_do_for_a_waiting_job() -> None:
    assert not run(job("a", status={"phase": "Queued", "gpus": 16}))


def test_admitted_becomes_running_when_every_worker_runs() -> None:
    nodes = ["n1", "n2"]
    plan = run(job("a", status=placed_status(nodes, "Admitted")), *gang_pods("a", nodes))
    assert plan.status["phase"] == "Running" and "startedAt" in plan.status
    half = run(
        job("a", status=placed_status(nodes, "Admitted")),
        *gang_pods("a", nodes, phase="Pending")[:1],
        gang_pods("a", nodes)[1],
    )
    assert "phase" not in half.status


def test_missing_or_unbound_workers_are_completed_not_restarted() -> None:
    """After an operator restart mid-admission: create what is missing, bind what is unbound."""
    nodes = ["n1", "n2"]
    unbound = pod("a-1-1", job_name="a", rank=1, phase="Pending")
    plan = run(job("a", status=placed_status(nodes, "Admitted")), gang_pods("a", nodes)[0], unbound)
    assert plan.complete_admission and "phase" not in plan.status
    assert run(job("a", status=placed_status(nodes, "Admitted"))).complete_admission


def test_all_succeeded_finishes_the_job() -> None:
    nodes = ["n1", "n2"]
    plan = run(job("a", status=placed_status(nodes)), *gang_pods("a", nodes, phase="Succeeded"))
    assert plan.status["phase"] == "Succeeded" and "finishedAt" in plan.status
    assert plan.delete_pods == ()


def test_failed_worker_restarts_the_whole_gang() -> None:
    nodes = ["n1", "n2"]
    pods = gang_pods("a", nodes)
    pods[1]["status"] = {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "c", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
        ],
    }
    ckpt = {"step": 10, "path": "p", "time": "2023-11-14T22:13:50Z"}  # T0 + 30
    status = placed_status(nodes, restarts=0, lastCheckpoint=ckpt, attainedGPUSeconds=500.0)
    plan = run(job("a", maxRestarts=2, status=status), *pods)
    s = plan.status
    assert s["phase"] == "Recovering" and s["restarts"] == 1 and s["placement"] == []
    assert s["previousPlacement"] == [{"rank": 0, "node": "n1"}, {"rank": 1, "node": "n2"}]
    assert "rank 1 failed on n2" in s["message"] and "OOMKilled" in s["message"]
    assert s["lostGPUSeconds"] == (NOW - (T0 + 30)) * 16  # since the checkpoint, not the start
    assert s["attainedGPUSeconds"] == 500.0 + (NOW - (T0 + 20)) * 16  # the whole attempt, added once
    assert plan.delete_pods == ("team-a/a-1-0",)  # the still-running worker; the failed one is done
    assert plan.events[0].reason == "WorkerFailed"


def test_no_restarts_left_fails_the_job() -> None:
    nodes = ["n1"]
    pods = gang_pods("a", nodes, phase="Failed")
    plan = run(job("a", replicas=1, maxRestarts=1, status=placed_status(nodes, restarts=1)), *pods)
    assert plan.status["phase"] == "Failed" and "no restarts left" in plan.status["message"]


def test_worker_deleted_while_running_counts_as_lost() -> None:
    nodes = ["n1", "n2"]
    plan = run(job("a", status=placed_status(nodes)), gang_pods("a", nodes)[0])
    assert plan.status["phase"] == "Recovering" and plan.events[0].reason == "WorkerLost"


def test_preempted_job_is_requeued_once_its_pods_are_gone() -> None:
    status = {"phase": "Preempted", "attempt": 1, "preemptions": 1}
    assert "phase" not in run(job("a", status=status), *gang_pods("a", ["n1", "n2"])).status
    plan = run(job("a", status=status))
    assert plan.status["phase"] == "Queued"


def test_leftover_pods_of_other_attempts_are_deleted() -> None:
    nodes = ["n1", "n2"]
    plan = run(
        job("a", status=placed_status(nodes, attempt=2)),
        *gang_pods("a", nodes, attempt=2),
        *gang_pods("a", nodes, attempt=1),
    )
    assert set(plan.delete_pods) == {"team-a/a-1-0", "team-a/a-1-1"}
    queued = run(job("a", status={"phase": "Queued", "attempt": 1}), *gang_pods("a", nodes))
    assert len(queued.delete_pods) == 2  # a rolled-back admission's pods


def test_checkpoint_reports_are_folded_into_status() -> None:
    nodes = ["n1"]
    pods = gang_pods("a", nodes)
    pods[0]["metadata"]["annotations"] = {
        "gpuq.dev/checkpoint": '{"step": 7, "path": "s3://c/7", "time": 1700000500}'
    }
    plan = run(job("a", replicas=1, status=placed_status(nodes)), *pods)
    assert plan.status["lastCheckpoint"]["step"] == 7


def test_bad_checkpoint_annotation_sets_a_condition_once() -> None:
    body = job("a", status={"phase": "Queued"}, annotations={"gpuq.dev/checkpoint": "{not json"})
    plan = run(body)
    cond = plan.status["conditions"][0]
    assert cond["type"] == "CheckpointReportInvalid" and "not JSON" in cond["message"]
    assert plan.events[0].type == "Warning"
    body["status"] = {"phase": "Queued", "conditions": plan.status["conditions"]}
    assert not run(body)


def test_invalid_spec_is_reported_not_raised() -> None:
    body = job("a")
    body["spec"]["workers"]["replicas"] = 0  # the schema forbids it; a stale CRD might not
    plan = run(body)
    assert plan.status["conditions"][0]["reason"] == "Invalid"
    assert "replicas" in plan.status["message"]


def test_backoff_is_exponential_and_capped() -> None:
    assert [backoff(n, CFG) for n in range(1, 7)] == [0, 5, 10, 20, 40, 60]


# -- the admission record: pods first, the status follows (gpuq.controller.record) --------------


def queued(**status: object) -> dict:
    return job("a", replicas=2, status={"phase": "Queued", "attempt": 0, **status})


def test_a_created_gang_whose_workers_run_gets_its_status_in_one_write() -> None:
    nodes = ["n2", "n1"]
    plan = run(queued(), *gang_pods("a", nodes), now=T0 + 1)
    s = plan.status
    assert s["phase"] == "Running" and s["attempt"] == 1 and "startedAt" in s
    assert s["placement"] == [{"rank": 0, "node": "n2"}, {"rank": 1, "node": "n1"}]
    assert s["admittedAt"] == iso(T0)  # when its first pod was created
    assert plan.delete_pods == () and plan.recheck_at is None


def test_a_created_gang_still_starting_says_admitted_after_the_delay() -> None:
    nodes = ["n1", "n2"]
    starting = gang_pods("a", nodes, phase="Pending")
    early = run(queued(), *starting, now=T0 + 1)
    assert not early and early.recheck_at == T0 + ADMITTED_STATUS_DELAY  # no write yet: look again then
    late = run(queued(), *starting, now=T0 + ADMITTED_STATUS_DELAY)
    assert late.status["phase"] == "Admitted" and late.status["attempt"] == 1 and late.recheck_at is None


def test_a_created_gang_is_recorded_even_if_its_workers_already_finished() -> None:
    """Short workers can finish before their admission is recorded (while no operator runs, or in a
    burst's status delay): one write records the attempt, its placement and that it succeeded; the
    next attempt must not reuse their names."""
    plan = run(queued(), *gang_pods("a", ["n1", "n2"], phase="Succeeded"), now=T0 + 30)
    assert plan.status["attempt"] == 1 and plan.status["phase"] == "Succeeded"
    assert [p["node"] for p in plan.status["placement"]] == ["n1", "n2"] and plan.status["finishedAt"]
    assert plan.status["message"] == "all 2 workers succeeded"
    assert [e.reason for e in plan.events] == ["Succeeded"]


def test_a_partly_created_gang_is_deleted_and_the_job_stays_queued() -> None:
    """An operator stopped mid-creation: the pods that exist are no admission; the job is decided again."""
    first = gang_pods("a", ["n1", "n2"])[0]
    plan = run(queued(), first, now=T0 + 30)
    assert plan.delete_pods == ("team-a/a-1-0",)
    assert "phase" not in plan.status and "attempt" not in plan.status
    other_job = gang_pods("a", ["n1", "n2"])
    for p in other_job:
        p["metadata"]["ownerReferences"][0]["uid"] = "uid-of-an-earlier-job-of-that-name"
    assert "attempt" not in run(queued(), *other_job, now=T0 + 30).status


def test_a_recovering_job_is_readmitted_from_its_new_gang() -> None:
    status = {"phase": "Recovering", "attempt": 1, "restarts": 1}
    plan = run(job("a", replicas=2, status=status), *gang_pods("a", ["n3", "n4"], attempt=2), now=T0 + 1)
    assert plan.status["attempt"] == 2 and plan.status["phase"] == "Running"


def test_under_a_burst_the_status_waits_longer_for_running() -> None:
    starting = [parse_pod(p) for p in gang_pods("a", ["n1", "n2"], phase="Pending")]
    burst = status_delay(BURST_GANGS + 1)
    assert burst > status_delay(1) == ADMITTED_STATUS_DELAY
    plan = observe(parse_job(queued()), starting, T0 + ADMITTED_STATUS_DELAY, CFG, Recording("", burst))
    assert not plan and plan.recheck_at == T0 + burst


def test_under_a_burst_the_status_waits_out_the_delay_even_when_the_workers_run() -> None:
    """Binding the burst goes first: one status write per gang, after the delay, saying Running."""
    running = [parse_pod(p) for p in gang_pods("a", ["n1", "n2"])]
    burst = Recording("", status_delay(BURST_GANGS + 1))
    early = observe(parse_job(queued()), running, T0 + 1, CFG, burst)
    assert not early and early.recheck_at == T0 + burst.status_delay
    late = observe(parse_job(queued()), running, T0 + burst.status_delay, CFG, burst)
    assert late.status["phase"] == "Running" and late.status["attempt"] == 1
    assert late.status["admittedAt"] == iso(T0) and late.recheck_at is None


def test_a_job_admitted_before_its_waiting_phase_was_rewritten_is_recorded_too() -> None:
    """A resumed job can be admitted while its status still says Suspended (or Preempted, once its
    old pods are gone): its gang is the record all the same."""
    for phase in ("Suspended", "Preempted"):
        status = {"phase": phase, "attempt": 1}
        plan = run(job("a", replicas=2, status=status), *gang_pods("a", ["n1", "n2"], attempt=2), now=T0 + 1)
        assert plan.status["attempt"] == 2 and plan.status["phase"] == "Running", phase
