"""The controller tests' object bodies (they live in gpuq.controller.bodies, shared with bench/)."""

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
