"""What every owner kind is read into, and the reasons a gang cannot be scheduled."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuq.api.trainingjob import TrainingJobSpec


class GangCode(StrEnum):
    """Why an owner's gang is not scheduled (status.reason of its record, and a Warning Event)."""

    UNSUPPORTED = "UnsupportedGang"  # a shape gpuq cannot run as one gang (non-Indexed Job, elastic, ...)
    SCHEDULER_NAME = "SchedulerNameNotGpuq"  # labelled for a queue, but its pods go to another scheduler
    INVALID = "InvalidGang"  # a gpuq.dev/* label or annotation, or the template, fails validation


@dataclass(frozen=True, slots=True)
class GangError:
    code: GangCode
    message: str


@dataclass(frozen=True, slots=True)
class GangDemand:
    """An owner object read as a gang: `size` ranks (0..size-1), scheduled as `spec`; or why not."""

    size: int
    spec: TrainingJobSpec | None
    error: GangError | None = None
    suspended: bool = False  # the owner is suspended (by its user or by gpuq: see the marker annotation)

    @classmethod
    def refused(cls, code: GangCode, message: str, size: int = 0) -> GangDemand:
        return cls(size, None, GangError(code, message))


def mapping(value: Any) -> Mapping[str, Any]:
    """`value` if it is an object, else empty: owners are read as they come, malformed or not."""
    return value if isinstance(value, Mapping) else {}
