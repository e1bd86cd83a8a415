"""Live copies of the demo's TrainingJobs and GPUQueues, kept by list+watch in background threads.

A watch (not polling) so that no state is missed: a failover's Recovering phase can last less than a
refresh. Every phase change is kept in a `Transition` history, which the demo narrates and the e2e
test asserts on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import watch

from gpuq.logs import get_logger

WATCH_SECONDS = 5  # each watch request ends after this long, so a stop is noticed promptly
RETRY_SECONDS = 1.0

Obj = dict[str, Any]
_Watch: Any = watch.Watch  # the client's watch helper is untyped


def _log() -> Any:
    return get_logger("gpuq.demo")


@dataclass(frozen=True)
class Transition:
    """A job's phase, restarts, placement or queue position changed, `at` s after watching began."""

    at: float
    job: str
    phase: str | None
    restarts: int
    attempt: int
    nodes: tuple[str, ...]
    position: int | None
    message: str


def transition_of(obj: Mapping[str, Any], at: float) -> Transition:
    status = obj.get("status") or {}
    placement = sorted(status.get("placement") or [], key=lambda p: int(p.get("rank", 0)))
    return Transition(
        at=round(at, 3),
        job=obj["metadata"]["name"],
        phase=status.get("phase"),
        restarts=int(status.get("restarts") or 0),
        attempt=int(status.get("attempt") or 0),
        nodes=tuple(str(p["node"]) for p in placement),
        position=status.get("queuePosition"),
        message=str(status.get("message") or ""),
    )


def _key(t: Transition) -> tuple[Any, ...]:
    return (t.phase, t.restarts, t.attempt, t.nodes, t.position)


class Collection:
    """The objects one list call returns, kept current by a watch thread; waiters wake on each change.

    `list_call(*args, **kw)` is a kubernetes client list method returning dicts (CustomObjectsApi).
    `track`: keep a `Transition` history (for TrainingJobs).
    """

    def __init__(
        self, kind: str, list_call: Callable[..., Any], *args: Any, track: bool = False, **kwargs: Any
    ) -> None:
        self.kind, self.track = kind, track
        self._list_call, self._args, self._kwargs = list_call, args, kwargs
        self._objects: dict[str, Obj] = {}
        self._history: list[Transition] = []
        self._last: dict[str, Transition] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"demo-watch-{kind}", daemon=True)
        self._t0 = time.monotonic()
        self.error: str | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Collection:
        self._t0 = time.monotonic()
        self._relist()  # the first state is there before start() returns
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        # A daemon thread: it ends with its current watch request (<= WATCH_SECONDS) or with the process.
        self._thread.join(timeout=2.0)

    def __enter__(self) -> Collection:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading ----------------------------------------------------------------------------------
    def items(self) -> list[Obj]:
        with self._cond:
            return list(self._objects.values())

    def get(self, name: str) -> Obj | None:
        with self._cond:
            return self._objects.get(name)

    def history(self) -> list[Transition]:
        with self._cond:
            return list(self._history)

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def wait(self, timeout: float) -> None:
        """Block until the next change (or `timeout` seconds)."""
        with self._cond:
            self._cond.wait(timeout)

    # -- the watch thread -------------------------------------------------------------------------
    def _apply(self, kind: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        with self._cond:
            if kind == "DELETED":
                self._objects.pop(name, None)
            else:
                self._objects[name] = obj
                step = transition_of(obj, self.elapsed())
                if self.track and (name not in self._last or _key(self._last[name]) != _key(step)):
                    self._last[name] = step
                    self._history.append(step)
            self._cond.notify_all()

    def _relist(self) -> str:
        listing = self._list_call(*self._args, **self._kwargs)
        items = listing.get("items") or []
        with self._cond:
            gone = set(self._objects) - {o["metadata"]["name"] for o in items}
        for name in gone:
            self._apply("DELETED", {"metadata": {"name": name}})
        for obj in items:
            self._apply("MODIFIED", obj)
        return str(listing["metadata"]["resourceVersion"])

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                version = version or self._relist()
                stream = _Watch().stream(
                    self._list_call,
                    *self._args,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=WATCH_SECONDS + 5,
                    **self._kwargs,
                )
                for event in stream:
                    if event["type"] == "ERROR":  # e.g. 410 Gone: the version expired; relist
                        raise ValueError(f"watch error: {event['object']}")
                    obj = event["object"]
                    version = obj["metadata"].get("resourceVersion") or version
                    self._apply(event["type"], obj)
                    if self._stop.is_set():
                        break
                self.error = None
            except Exception as exc:  # expired version, API server restart, protocol error: relist
                self.error = f"{type(exc).__name__}: {exc}"
                _log().info("demo.watch_restart", kind=self.kind, error=self.error[:200])
                version = None
                self._stop.wait(RETRY_SECONDS)
