"""A scenario = trace jobs + cluster + queues + scheduler config + options; run it under any policy.

Shared by `gpuq simulate` and bench/placement_quality.py so both run exactly the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuq.config import load_config
from gpuq.core.config import SchedulerConfig
from gpuq.core.model import Node, Queue
from gpuq.sim.cluster import ClusterShape, build_nodes, read_node_list
from gpuq.sim.engine import SimOptions, Simulation, offered_load, rescale_arrivals
from gpuq.sim.policy import make_policy
from gpuq.sim.queues import derive_queues, read_queue_file
from gpuq.sim.readers import read_trace
from gpuq.sim.trace import LoadReport, TraceJob


@dataclass
class Scenario:
    jobs: list[TraceJob]
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    config: SchedulerConfig
    options: SimOptions = field(default_factory=SimOptions)
    load_report: LoadReport | None = None

    @property
    def total_gpus(self) -> int:
        return sum(node.allocatable.gpus for node in self.nodes)

    def describe(self) -> dict[str, Any]:
        return {
            "jobs": len(self.jobs),
            "nodes": len(self.nodes),
            "gpus": self.total_gpus,
            "queues": len(self.queues),
            "offered_load": offered_load(self.jobs, self.total_gpus),
            "worker_gpus": self.options.worker_gpus,
        }

    def run(
        self, policy: str, on_finish: Callable[[int], None] | None = None, options: SimOptions | None = None
    ) -> dict[str, Any]:
        sim = Simulation(
            self.jobs,
            self.nodes,
            self.queues,
            self.config,
            make_policy(policy, (options or self.options).seed),
            options or self.options,
            on_finish,
        )
        summary = sim.run()
        summary["timeline"] = sim.recorder.timeline
        summary["jct_samples"] = [o.jct for o in sim.recorder.outcomes]
        summary["outcomes"] = list(sim.recorder.outcomes)
        return summary


def load_scenario(
    trace: Path,
    *,
    fmt: str = "auto",
    skip_bad: bool = False,
    default_duration: float | None = None,
    config_path: Path | None = None,
    queues_path: Path | None = None,
    nodes_path: Path | None = None,
    shape: ClusterShape | None = None,
    target_load: float | None = None,
    options: SimOptions | None = None,
    limit: int | None = None,
) -> Scenario:
    config = load_config(config_path)
    jobs, report = read_trace(trace, fmt, skip_bad, default_duration)
    if limit is not None:
        jobs = jobs[:limit]
    if nodes_path is not None:
        nodes = read_node_list(
            nodes_path,
            config,
            (shape or ClusterShape()).nodes_per_rack,
            (shape or ClusterShape()).racks_per_block,
        )
    else:
        nodes = build_nodes(shape or ClusterShape(), config)
    total = sum(node.allocatable.gpus for node in nodes)
    if target_load is not None:
        jobs = rescale_arrivals(jobs, total, target_load)
    queues = read_queue_file(queues_path) if queues_path is not None else derive_queues(jobs, total)
    return Scenario(jobs, nodes, queues, config, options or SimOptions(), report)
