"""What the demo shows: the narration line and two tables (jobs, queues), built from API objects.

Pure functions of plain dicts (as the API server returns TrainingJobs, Gangs and GPUQueues), so the live
display, the `--no-live` printout and the unit tests render the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

PHASE_STYLE = {
    "Queued": "yellow",
    "Admitted": "cyan",
    "Running": "green",
    "Recovering": "bold magenta",
    "Preempted": "bold red",
    "Succeeded": "blue",
    "Failed": "bold red",
}
NOTES_SHOWN = 4


@dataclass
class Narration:
    """The story so far: the current act (one line above the tables) and the latest notes."""

    act: str = "setting up"
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes = [*self.notes, text][-NOTES_SHOWN:]


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def nodes_of(obj: Mapping[str, Any]) -> list[str]:
    """Nodes of the job's current placement, in rank order."""
    placement = sorted(_status(obj).get("placement") or [], key=lambda p: int(p.get("rank", 0)))
    return [str(p["node"]) for p in placement]


def _short_node(node: str, rack: str) -> str:
    """gpu-r0-n3 -> n3 (the rack is already named); other names stay whole."""
    head, _, tail = node.rpartition("-")
    return tail if head and rack != "?" else node


def placement_text(nodes: Sequence[str], rack_of: Mapping[str, str]) -> str:
    """Nodes grouped by rack, e.g. 'rack-0: n0 n1 n2 | rack-2: n3'."""
    racks: dict[str, list[str]] = {}
    for node in nodes:
        rack = rack_of.get(node, "?")
        racks.setdefault(rack, []).append(_short_node(node, rack))
    return " | ".join(f"{rack}: {' '.join(names)}" for rack, names in racks.items())


def gang_text(spec: Mapping[str, Any]) -> str:
    workers = spec.get("workers") or {}
    return f"{workers.get('replicas', '?')}x{workers.get('gpusPerWorker', '?')}"


def gang_as_job(gang: Mapping[str, Any]) -> dict[str, Any]:
    """A Gang (gpuq's record of another owner's gang) as a jobs-table row: its queue, workers x GPUs
    each from its status, no priority column (that is its owner's label)."""
    spec, status = gang.get("spec") or {}, _status(gang)
    workers, gpus = int(spec.get("workers") or 0), int(status.get("gpus") or 0)
    per_worker = gpus // workers if workers and gpus else "?"
    return {
        "metadata": {"name": gang["metadata"]["name"]},
        "spec": {
            "queue": spec.get("queue", ""),
            "priority": "",
            "workers": {"replicas": workers, "gpusPerWorker": per_worker},
        },
        "status": status,
    }


def checkpoint_text(status: Mapping[str, Any]) -> str:
    ckpt = status.get("lastCheckpoint")
    return f"step {ckpt['step']}" if ckpt else ""


def _ordered(jobs: Sequence[Mapping[str, Any]], order: Sequence[str]) -> list[Mapping[str, Any]]:
    """Jobs in the order the story introduces them; any others after, by name."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(jobs, key=lambda j: (rank.get(j["metadata"]["name"], len(rank)), j["metadata"]["name"]))


def jobs_table(
    jobs: Sequence[Mapping[str, Any]], rack_of: Mapping[str, str], order: Sequence[str] = ()
) -> Table:
    table = Table(
        title="TrainingJobs, and gangs of other kinds (kind.name)",
        title_justify="left",
        expand=True,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for name, kw in (
        ("job", {"no_wrap": True}),
        ("queue", {"no_wrap": True}),
        ("prio", {"justify": "right"}),
        ("GPUs", {"no_wrap": True}),
        ("phase", {"no_wrap": True}),
        ("pos", {"justify": "right"}),
        ("placed on (rack: nodes)", {}),  # wraps at ' | ' in a narrow terminal
        ("restarts", {"justify": "right"}),
        ("preempted", {"justify": "right"}),
        ("ckpt", {"no_wrap": True}),
        ("message", {"ratio": 1, "overflow": "ellipsis", "no_wrap": True, "min_width": 24}),
    ):
        table.add_column(name, **kw)
    for job in _ordered(jobs, order):
        spec, status = job.get("spec") or {}, _status(job)
        phase = str(status.get("phase") or "")
        table.add_row(
            job["metadata"]["name"],
            str(spec.get("queue", "")),
            str(spec.get("priority", 0)),
            gang_text(spec),
            Text(phase, style=PHASE_STYLE.get(phase, "")),
            str(status.get("queuePosition") or ""),
            placement_text(nodes_of(job), rack_of),
            str(status.get("restarts") or 0),
            str(status.get("preemptions") or 0),
            checkpoint_text(status),
            str(status.get("message") or ""),
        )
    return table


def queues_table(queues: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="GPUQueues", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("queue", "cohort", "used / nominal", "borrowed", "pending", "admitted"):
        table.add_column(name, justify="left" if name in ("queue", "cohort") else "right")
    for queue in sorted(queues, key=lambda q: q["metadata"]["name"]):
        spec, status = queue.get("spec") or {}, _status(queue)
        borrowed = int(status.get("borrowedGPUs") or 0)
        table.add_row(
            queue["metadata"]["name"],
            str(spec.get("cohort") or ""),
            f"{status.get('usedGPUs') or 0} / {spec.get('nominalGPUs', '?')}",
            Text(str(borrowed), style="bold cyan" if borrowed else ""),
            str(status.get("pendingJobs") or 0),
            str(status.get("admittedJobs") or 0),
        )
    return table


def screen(
    narration: Narration | None,
    jobs: Sequence[Mapping[str, Any]],
    queues: Sequence[Mapping[str, Any]],
    rack_of: Mapping[str, str],
    order: Sequence[str] = (),
    elapsed: float | None = None,
) -> RenderableType:
    """The act line and the latest notes (unless narration is None), the jobs table, the queues table."""
    parts: list[RenderableType] = []
    if narration is not None:
        clock = f"[{elapsed:5.1f}s] " if elapsed is not None else ""
        parts.append(Text(f"{clock}{narration.act}", style="bold"))
        parts += [Text(f"  {note}", style="dim") for note in narration.notes]
    parts += [jobs_table(jobs, rack_of, order), queues_table(queues)]
    return Group(*parts)
