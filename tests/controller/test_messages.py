"""Status and Event texts count what they say (issue 33: a node listed once per worker, "node(s)")."""

from __future__ import annotations

from gpuq.controller.intents import admission_message, all_workers
from gpuq.core.reasons import counted


def test_an_admission_names_each_node_once_and_counts_workers_and_nodes() -> None:
    assert admission_message(("n1", "n0", "n1")) == "admitted: 3 workers on 2 nodes: n0, n1"
    assert admission_message(("n0",)) == "admitted: 1 worker on 1 node: n0"
    many = tuple(f"n{i:02d}" for i in range(10) for _ in range(2))
    assert admission_message(many) == (
        "admitted: 20 workers on 10 nodes: n00, n01, n02, n03, n04, n05, n06, n07 ..."
    )


def test_counts_take_the_number_of_their_noun() -> None:
    assert [counted(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]


def test_a_single_worker_is_its_worker_not_all_1_workers() -> None:
    assert all_workers(1, "running") == "its worker running"
    assert all_workers(3, "succeeded") == "all 3 workers succeeded"
