"""The one error type the dev cluster raises for anything a user can fix."""

from __future__ import annotations

from pathlib import Path


class DevClusterError(Exception):
    """A one-line, user-facing failure: names the cause and, when there is one, the log to read."""

    def __init__(self, cause: str, log: Path | None = None) -> None:
        self.cause = cause
        self.log = log
        super().__init__(f"{cause} (see {log})" if log else cause)
