"""When the core raises on a snapshot, find the jobs that make it raise and keep them out.

The shell checks every field it hands the core, but a scheduler that stops for everyone because of
one object it did not foresee is an outage. So a failed cycle is retried on halves of the job list
(bisection, O(k log n) extra runs for k culprits) until the jobs that fail on their own are found;
they are kept out of the snapshot, with condition Blocked reason InternalError and an Event, until
their spec changes (a new metadata.generation), and the cycle runs again without them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpuq.core.model import Job

# A failure that needs several jobs together is not pinned on a larger group than this.
MAX_GROUP = 4
MESSAGE = (
    "gpuq's scheduler failed on this job (an internal error, logged by the operator); it is kept out "
    "of scheduling until its spec changes"
)


def culprits(jobs: Sequence[Job], fails: Callable[[Sequence[Job]], bool]) -> list[str]:
    """Keys of the jobs on which `fails` holds alone (or in a group of at most MAX_GROUP that fails
    only together). Empty when the whole list does not fail (the failure was not about the input)."""
    if not fails(jobs):
        return []
    out: list[str] = []
    stack = [list(jobs)]
    while stack:
        part = stack.pop()
        if len(part) == 1:
            out.append(part[0].key)
            continue
        half = len(part) // 2
        left, right = part[:half], part[half:]
        bad = [p for p in (left, right) if fails(p)]
        stack.extend(bad)
        if not bad and len(part) <= MAX_GROUP:
            out.extend(j.key for j in part)
    return sorted(out)


class Quarantine:
    """job key -> the generation that failed; a new generation lifts it."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}

    def add(self, keys: Sequence[str], generations: Mapping[str, int]) -> None:
        for key in keys:
            self.held[key] = generations.get(key, 0)

    def active(self, generations: Mapping[str, int]) -> dict[str, int]:
        self.held = {k: g for k, g in self.held.items() if generations.get(k) == g}
        return dict(self.held)
