"""Which stray pods to tell about: a pod that asks for gpuq but belongs to no gang it can place
(gangs.resolve.Stray) gets one Warning Event, once it has been a stray for STRAY_GRACE seconds with
the same reason. The grace is for watch order: a pod's event may come before its owner's, and for
that moment it looks like a pod whose owner has no queue label."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuq.controller.gangs.resolve import Stray

STRAY_GRACE = 10.0


@dataclass(slots=True)
class _Seen:
    code: str
    since: float
    told: bool = False


class StrayReporter:
    def __init__(self, grace: float = STRAY_GRACE) -> None:
        self.grace = grace
        self._seen: dict[str, _Seen] = {}

    def due(self, strays: Mapping[str, Stray], now: float) -> tuple[list[tuple[str, Stray]], float | None]:
        """The strays to report now (pod key, why), and when to look again (None: nothing waits)."""
        for key in [k for k in self._seen if k not in strays]:
            del self._seen[key]
        out: list[tuple[str, Stray]] = []
        next_at: float | None = None
        for key, stray in strays.items():
            seen = self._seen.get(key)
            if seen is None or seen.code != stray.code:
                seen = self._seen[key] = _Seen(stray.code, now)
            if seen.told:
                continue
            if now - seen.since >= self.grace:
                seen.told = True
                out.append((key, stray))
            else:
                at = seen.since + self.grace
                next_at = at if next_at is None else min(next_at, at)
        return out, next_at
