"""The rules of Kueue's benchmark runner and checker (gpuq.peers.perf_recorder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.peers.perf_recorder import (
    CmdStats,
    RangeSpec,
    Recorder,
    check,
    read_cmd_stats,
    read_rangespec,
    read_summary,
)


def test_time_to_admission_is_to_the_last_admission_and_evictions_are_counted() -> None:
    r = Recorder()
    r.workload("a", "small", 10.0, admitted=False, evicted=False, finished=False)
    r.workload("a", "small", 12.0, admitted=True, evicted=False, finished=False)
    r.workload("a", "small", 13.0, admitted=True, evicted=False, finished=False)  # no transition
    r.workload("a", "small", 14.0, admitted=False, evicted=True, finished=False)
    r.workload("a", "small", 15.0, admitted=False, evicted=True, finished=False)  # still the one eviction
    r.workload("a", "small", 17.0, admitted=True, evicted=False, finished=False)
    r.workload("a", "small", 18.0, admitted=False, evicted=False, finished=True)
    r.workload("b", "small", 11.0, admitted=False, evicted=False, finished=False)
    s = r.summary()
    small = s.workloads["small"]
    assert small.count == 2
    assert small.avg_time_to_admission_s == pytest.approx((7.0 + 0.0) / 2)  # b never admitted: 0, as in Kueue
    assert small.avg_time_to_finish_s == pytest.approx(8.0 / 2)
    assert small.evictions == 1
    assert (s.seen, s.admitted, s.finished) == (2, 1, 1)


def test_queue_usage_is_integrated_over_status_changes_as_the_checker_computes() -> None:
    r = Recorder()
    r.queue("q1", "cq", 0.0, usage=0, nominal=10)
    r.queue("q1", "cq", 1.0, usage=10, nominal=10)  # full from 1 s
    r.queue("q1", "cq", 3.0, usage=5, nominal=10)  # half from 3 s
    r.queue("q1", "cq", 5.0, usage=0, nominal=10)
    r.queue("q2", "cq", 0.0, usage=0, nominal=10)
    r.queue("q2", "cq", 5.0, usage=0, nominal=10)
    q = r.summary().queues["cq"]
    assert q.used == pytest.approx(10 * 2 + 5 * 2)
    assert q.nominal == 20 and (q.first, q.last) == (0.0, 5.0)
    assert q.usage_pct == pytest.approx(30 * 100 / (20 * 5))


def test_kueues_own_files_read_into_the_same_summary(tmp_path: Path) -> None:
    (tmp_path / "summary.yaml").write_text(
        "clusterQueueClasses:\n"
        "  cq:\n"
        "    cpuAverageUsage: 0\n"
        "    cpuUsed: 6000000000\n"  # mCPU x ms: 6,000 CPU-seconds of 20 CPUs over 500 s = 60%
        "    firstEventTime: '2026-01-01T00:00:00Z'\n"
        "    lastEventTime: '2026-01-01T00:08:20Z'\n"
        "    nominalQuota: 20000\n"
        "droppedWorkloadEvents: 3\n"
        "workloadClasses:\n"
        "  small: {averageTimeToAdmissionMs: 2500, averageTimeToFinishMs: 3000,"
        " count: 4, totalEvictions: 1}\n"
    )
    (tmp_path / "wlStates.csv").write_text(
        "id,class name,namespace,name,ms to admitted,ms to finish,num evictions\n"
        "0,small,n,a,100,300,0\n1,small,n,b,0,0,0\n2,small,n,c,50,0,1\n3,small,n,d,20,90,0\n"
    )
    (tmp_path / "stats.yaml").write_text("wallMs: 351000\nuserMs: 120000\nsysMs: 30000\nmaxrss: 512000\n")
    s = read_summary(tmp_path / "summary.yaml", tmp_path / "wlStates.csv")
    assert s.queues["cq"].usage_pct == pytest.approx(60.0)
    assert s.workloads["small"].avg_time_to_admission_s == pytest.approx(2.5)
    assert (s.seen, s.admitted, s.finished, s.dropped_events) == (4, 3, 2, 3)
    st = read_cmd_stats(tmp_path / "stats.yaml")
    assert (st.wall_s, st.cpu_s, st.max_rss_mib) == (351.0, 150.0, 500.0)


def test_the_checker_names_every_miss(tmp_path: Path) -> None:
    (tmp_path / "range.yaml").write_text(
        "cmd:\n  maxWallMs: 425_000\nclusterQueueClassesMinUsage:\n  cq: 55\n"
        "wlClassesMaxAvgTimeToAdmissionMs:\n  small: 2_000\n"
    )
    spec = read_rangespec(tmp_path / "range.yaml")
    assert spec == RangeSpec(425.0, {"cq": 55.0}, {"small": 2.0})
    r = Recorder()
    r.queue("q", "cq", 0.0, usage=10, nominal=10)
    r.queue("q", "cq", 10.0, usage=10, nominal=10)  # 100%
    r.workload("a", "small", 0.0, admitted=False, evicted=False, finished=False)
    r.workload("a", "small", 1.5, admitted=True, evicted=False, finished=False)
    assert check(r.summary(), CmdStats(400.0, 1.0, 1.0), spec) == []
    r.workload("b", "large", 0.0, admitted=False, evicted=False, finished=False)
    r.workload("c", "small", 0.0, admitted=False, evicted=False, finished=False)
    r.workload("c", "small", 9.0, admitted=True, evicted=False, finished=False)
    misses = check(r.summary(), CmdStats(500.0, 1.0, 1.0), spec)
    assert len(misses) == 3
    assert "wall time 500.0 s" in misses[0]
    assert any("large: not in the rangespec" in m for m in misses)
    assert any("small: average time to admission 5.2 s is more than 2.0 s" in m for m in misses)
