"""The API server's clock, estimated from the `Date` header of its responses.

Grace periods and back-offs compare "now" with timestamps the control plane wrote (a node's
NotReady lastTransitionTime, a job's notBefore). Taking "now" from this host's wall clock would
shift every one of them by the skew between the hosts; this clock follows the API server's instead.

`Date` has one-second resolution, so each response bounds the offset (server minus local time):
the server's time lay in [date, date + 1) somewhere between sending and receiving. The estimate is
the middle of the intersection of recent bounds: within half a second after a few responses. When
the bounds contradict each other (a clock was stepped), only the newest sample is kept.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from email.utils import parsedate_to_datetime

SAMPLES = 64


def parse_http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


class ServerClock:
    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall
        self._bounds: deque[tuple[float, float]] = deque(maxlen=SAMPLES)
        self._offset = 0.0

    def observe(self, sent: float, received: float, date_header: str | None) -> None:
        """One response: sent/received are this host's wall-clock times around the request."""
        date = parse_http_date(date_header)
        if date is None or received < sent:
            return
        self._bounds.append((date - received, date + 1.0 - sent))
        low = max(lo for lo, _ in self._bounds)
        high = min(hi for _, hi in self._bounds)
        if low > high:  # contradictory: a clock jumped; start over from this sample
            self._bounds.clear()
            self._bounds.append((date - received, date + 1.0 - sent))
            low, high = self._bounds[0]
        self._offset = (low + high) / 2

    @property
    def offset(self) -> float:
        """Seconds to add to this host's wall clock to get the API server's."""
        return self._offset

    def now(self) -> float:
        return self.wall() + self._offset
