"""Restart history in conditions, and worker failures that blame the node."""

from __future__ import annotations

from builders import T0, gang_pods, job, placed_status

from gpuq.controller.lifecycle import HISTORY_ENTRIES, RESTARTS, observe
from gpuq.controller.objects import parse_job, parse_pod
from gpuq.core.config import FailoverConfig

CFG = FailoverConfig()
NODES = ["n1", "n2"]


def fail(pods: list[dict], rank: int, reason: str) -> list[dict]:
    pods[rank]["status"] = {"phase": "Failed", "reason": reason}
    return pods


def restart(status: dict, now: float, reason: str = "Error", max_restarts: int = 20) -> dict:
    body = job("a", maxRestarts=max_restarts, status=status)
    return observe(
        parse_job(body), [parse_pod(p) for p in fail(gang_pods("a", NODES), 1, reason)], now, CFG
    ).status


def test_each_restart_adds_a_line_to_the_restarts_condition_and_failed_points_at_it() -> None:
    status = placed_status(NODES)
    for n in range(1, HISTORY_ENTRIES + 3):
        patch = restart(status, T0 + n)
        history = next(c for c in patch["conditions"] if c["type"] == RESTARTS)
        status = placed_status(NODES, restarts=n, conditions=patch["conditions"])
    lines = history["message"].splitlines()
    assert len(lines) == HISTORY_ENTRIES and lines[-1].startswith(f"#{HISTORY_ENTRIES + 2} ")
    assert "worker rank 1 failed on n2" in lines[-1] and history["status"] == "True"
    final = restart(status, T0 + 100, max_restarts=HISTORY_ENTRIES + 2)
    assert final["phase"] == "Failed" and f"earlier restarts in condition {RESTARTS}" in final["message"]


def test_node_related_pod_failure_marks_the_node_failed() -> None:
    assert restart(placed_status(NODES), T0 + 1, reason="NodeLost")["failedNodes"] == ["n2"]
    assert restart(placed_status(NODES), T0 + 1, reason="Error").get("failedNodes", []) == []
