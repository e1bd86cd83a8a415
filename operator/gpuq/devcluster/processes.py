"""Starting and stopping the control-plane processes so that none is ever left behind.

Each process gets its own session (Ctrl-C in the caller's terminal does not reach it; `down` stops its
whole group) and a log file. A recorded process is identified by pid *and* start time, so a stale
state file can never make `down` signal an unrelated process that reused the pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int | None  # /proc/<pid>/stat starttime; None where /proc is unavailable
    log: str
    argv: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(data["name"], int(data["pid"]), data.get("start_ticks"), data["log"], tuple(data["argv"]))


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc, or None if unknown."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def die_with_parent() -> None:
    """preexec hook (Linux): the kernel kills the child if the thread that started it dies, even by
    SIGKILL, so a killed test session cannot orphan its cluster. SIGKILL, not SIGTERM: the state is
    throwaway, and an API server whose etcd died alongside it would hang in graceful shutdown."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    tie_to_parent: bool = False,
) -> ProcessRecord:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=die_with_parent if tie_to_parent and sys.platform == "linux" else None,
        )
    stat = _proc_stat(proc.pid)
    return ProcessRecord(name, proc.pid, stat[1] if stat else None, str(log), tuple(argv))


def _reap(pid: int) -> None:
    """Collect our own exited child so it does not linger as a zombie (no-op for non-children)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def alive(rec: ProcessRecord) -> bool:
    _reap(rec.pid)
    stat = _proc_stat(rec.pid)
    if stat is not None:
        state, ticks = stat
        return state not in ("Z", "X") and (rec.start_ticks is None or ticks == rec.start_ticks)
    if Path("/proc").is_dir():
        return False  # Linux and no /proc entry: gone
    try:
        os.kill(rec.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def stop(rec: ProcessRecord, grace: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is still there after `grace` seconds."""
    if not alive(rec):
        return
    steps = ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)) if grace > 0 else ((signal.SIGKILL, 5.0),)
    for sig, wait in steps:
        # One signal per step: the group when the process leads one, else the process alone
        # (a second SIGTERM makes some programs, kopf among them, abort their graceful shutdown).
        try:
            os.killpg(rec.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(rec.pid, sig)
        if wait_until(lambda: not alive(rec), wait):
            return


def log_tail(path: Path | str, lines: int = 40) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            return fh.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def stop_all(records: Sequence[ProcessRecord], grace: float = 5.0) -> None:
    """Stop processes one after another in the given order (clients before the API server before etcd:
    an API server whose etcd is gone hangs in its graceful shutdown until killed)."""
    for rec in records:
        stop(rec, grace)
