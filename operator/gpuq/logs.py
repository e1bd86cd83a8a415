"""structlog JSON logging shared by the operator, the dev cluster and the CLI.

Library code logs through `get_logger(...)` with job/queue/node keys; nothing prints.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class _StderrLogger:
    """Writes each line to whatever sys.stderr is *now*: a logger that kept the stream it saw at
    configure() time would write to a closed file once a test harness swapped stderr out."""

    def msg(self, message: str) -> None:
        stream = sys.stderr
        stream.write(message + "\n")
        stream.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _stderr_logger(*_args: Any) -> _StderrLogger:
    return _StderrLogger()


_level = logging.INFO


def debug_enabled() -> bool:
    """Whether debug lines are written: for callers whose debug arguments cost O(jobs) to build."""
    return _level <= logging.DEBUG


def configure(level: str = "INFO", json: bool = True) -> None:
    """Configure structlog once per process; safe to call again (last call wins)."""
    global _level
    _level = logging.getLevelName(level.upper())
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str, **bound: Any) -> Any:
    # Stays a lazy proxy (no .bind() here), so module-level loggers honour a later configure().
    return structlog.get_logger(logger_name=name, **bound)
