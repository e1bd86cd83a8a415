"""The replay's record of each job from its pods' events, the same for every side: runs (every
worker bound and started, until one fails or goes) and the finish (every worker succeeded)."""

from __future__ import annotations

from gpuq.peers.replay_figures import Run
from gpuq.peers.replay_tracker import ReplayJob, Tracker


def tracker(workers: int = 2) -> Tracker:
    return Tracker(
        {"j": ReplayJob("j", "q", 0, submit=0.0, duration=10.0, workers=workers, gpus_per_worker=8)}
    )


def test_a_gang_runs_once_all_workers_run_and_finishes_when_all_succeeded() -> None:
    t = tracker()
    t.created("j", 0.5)
    t.pod("j", "j-0", None, "Pending", 0.6)
    t.pod("j", "j-1", None, "Pending", 0.6)
    t.pod("j", "j-0", "n1", "Pending", 1.0)
    t.pod("j", "j-0", "n1", "Running", 1.1)
    assert t.observed()[0].runs == ()  # one worker alone is no run
    t.pod("j", "j-1", "n2", "Pending", 1.2)
    t.pod("j", "j-1", "n2", "Running", 1.3)
    t.pod("j", "j-0", "n1", "Succeeded", 11.3)
    assert t.observed()[0].finished is None and t.unfinished() == 1
    t.pod("j", "j-1", "n2", "Succeeded", 11.4)
    job = t.observed()[0]
    assert job.created == 0.5 and job.runs == (Run(1.3, 11.4, ("n1", "n2")),) and job.finished == 11.4
    t.pod("j", "j-0", "n1", "Succeeded", 12.0, deleted=True)  # cleaned up afterwards: nothing changes
    assert t.observed()[0] == job and t.unfinished() == 0


def test_a_lost_worker_ends_the_run_and_the_replacement_gang_is_a_second_run() -> None:
    t = tracker()
    t.created("j", 0.0)
    for name, node in (("a-0", "n1"), ("a-1", "n2")):
        t.pod("j", name, node, "Running", 1.0)
    t.pod("j", "a-1", "n2", "Running", 4.0, deleted=True)  # its node failed: the pod is gone
    t.pod("j", "a-0", "n1", "Running", 4.1, deleted=True)
    for name, node in (("b-0", "n3"), ("b-1", "n4")):
        t.pod("j", name, node, "Running", 6.0)
    for name, node in (("b-0", "n3"), ("b-1", "n4")):
        t.pod("j", name, node, "Succeeded", 16.0)
    job = t.observed()[0]
    assert job.runs == (Run(1.0, 4.0, ("n1", "n2")), Run(6.0, 16.0, ("n3", "n4")))
    assert job.finished == 16.0


def test_without_gang_scheduling_the_run_starts_when_the_last_worker_starts() -> None:
    t = tracker(workers=2)
    t.created("j", 0.0)
    t.pod("j", "j-0", "n1", "Running", 1.0)
    t.pod("j", "j-0", "n1", "Succeeded", 11.0)  # done before its peer was even bound
    t.pod("j", "j-1", "n1", "Running", 20.0)
    t.pod("j", "j-1", "n1", "Succeeded", 30.0)
    job = t.observed()[0]
    assert job.runs == (Run(20.0, 30.0, ("n1", "n1")),) and job.finished == 30.0


def test_a_job_never_started_is_reported_with_its_submit_time_and_no_run() -> None:
    t = tracker()
    t.pod("other", "x-0", "n1", "Running", 1.0)  # not a job of the replay
    job = t.observed()[0]
    assert job.created == 0.0 and job.runs == () and job.finished is None
