"""The controller tests' object bodies (they live in gpuq.controller.bodies, shared with bench/),
and a writer that records instead of calling the API."""

from typing import Any

from gpuq.controller.bodies import (  # noqa: F401
    T0,
    TEMPLATE,
    gang_pods,
    iso,
    job,
    namespace,
    node,
    placed_status,
    pod,
    queue,
)
from gpuq.controller.cache import ClusterCache
from gpuq.controller.metrics import Metrics
from gpuq.controller.writer import Writer


class RecordingWriter(Writer):
    """Records what a cycle hands to the writer instead of calling the API."""

    def __init__(self, cache: ClusterCache, metrics: Metrics) -> None:
        super().__init__(None, cache, metrics, on_done=lambda: None)  # type: ignore[arg-type]
        self.submitted: list[str] = []

    def submit(self, key: str, work: Any, minor: bool = False) -> bool:
        self.submitted.append(key)
        return True
