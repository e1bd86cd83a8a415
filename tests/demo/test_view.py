"""The demo's screen: what each column shows for real TrainingJob/GPUQueue objects."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gpuq.demo.view import Narration, checkpoint_text, gang_as_job, placement_text, screen

RACKS = {f"gpu-r{r}-n{n}": f"rack-{r}" for r in range(4) for n in range(4)}


def job(name: str, phase: str, nodes: tuple[str, ...] | list[str] = (), **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"queue": "team-a", "priority": 50, "workers": {"replicas": 4, "gpusPerWorker": 8}},
        "status": {
            "phase": phase,
            "placement": [{"rank": r, "node": n} for r, n in enumerate(nodes)],
            **status,
        },
    }


def render(width: int, *jobs: dict[str, Any]) -> str:
    console = Console(width=width, record=True, color_system=None)
    queue = {
        "metadata": {"name": "team-a"},
        "spec": {"nominalGPUs": 64, "cohort": "research"},
        "status": {"usedGPUs": 80, "borrowedGPUs": 16, "pendingJobs": 1, "admittedJobs": 3},
    }
    narration = Narration(act="Act 3/5: a node dies")
    narration.note("gpu-r1-n3 dies")
    console.print(screen(narration, list(jobs), [queue], RACKS, order=[j["metadata"]["name"] for j in jobs]))
    return console.export_text()


def test_placement_groups_nodes_by_rack_in_rank_order() -> None:
    nodes = ["gpu-r1-n0", "gpu-r1-n1", "gpu-r2-n3", "gpu-r1-n2"]
    assert placement_text(nodes, RACKS) == "rack-1: n0 n1 n2 | rack-2: n3"
    assert placement_text(["gpu-r2-n0", "gpu-r0-n1"], RACKS) == "rack-2: n0 | rack-0: n1"  # rank order
    assert placement_text(["mystery"], RACKS) == "?: mystery"  # unknown node: full name, unknown rack


def test_checkpoint_column() -> None:
    assert checkpoint_text({"lastCheckpoint": {"step": 218, "path": "s3://x", "time": "t"}}) == "step 218"
    assert checkpoint_text({}) == ""


def test_screen_shows_every_column_of_a_recovered_job_in_140_columns() -> None:
    nodes = ["gpu-r1-n0", "gpu-r1-n1", "gpu-r1-n2", "gpu-r2-n3"]
    recovered = job(
        "a-pretrain",
        "Running",
        nodes,
        restarts=1,
        preemptions=0,
        lastCheckpoint={"step": 218},
        message="all 4 workers running",
    )
    waiting = job(
        "a-eval",
        "Queued",
        queuePosition=1,
        message="queue team-a uses 80 GPUs (nominal quota 64); this job needs 32, 48 above its nominal",
    )
    text = render(140, recovered, waiting)
    row = next(line for line in text.splitlines() if "a-pretrain" in line)
    for cell in (
        "team-a",
        "50",
        "4x8",
        "Running",
        "rack-1: n0 n1 n2 | rack-2: n3",
        "1",
        "step 218",
        "all 4 workers",
    ):
        assert cell in row, (cell, row)
    queued = next(line for line in text.splitlines() if "a-eval" in line)
    assert "Queued" in queued and " 1 " in queued and "queue team-a uses 80 GPUs" in queued
    assert "Act 3/5: a node dies" in text and "gpu-r1-n3 dies" in text
    assert "80 / 64" in text and "research" in text


def test_jobs_follow_the_story_order_not_the_alphabet() -> None:
    text = render(160, job("b-first", "Queued"), job("a-second", "Queued"))
    assert text.index("b-first") < text.index("a-second")


def test_a_gang_of_another_owner_shows_its_queue_workers_and_gpus_from_its_gang_object() -> None:
    gang = {
        "metadata": {"name": "pytorchjob.b-llm"},
        "spec": {"owner": {"kind": "PyTorchJob", "name": "b-llm"}, "queue": "team-b", "workers": 2},
        "status": {
            "phase": "Running",
            "gpus": 16,
            "placement": [{"rank": 0, "node": "gpu-r3-n2"}, {"rank": 1, "node": "gpu-r3-n3"}],
        },
    }
    row = gang_as_job(gang)
    assert row["spec"] == {"queue": "team-b", "priority": "", "workers": {"replicas": 2, "gpusPerWorker": 8}}
    out = render(160, job("a-pretrain", "Running"), row)
    line = next(x.strip() for x in out.splitlines() if x.strip().startswith("pytorchjob.b-llm"))
    assert line.split()[:4] == ["pytorchjob.b-llm", "team-b", "2x8", "Running"]
    assert "rack-3: n2 n3" in line
    pending = gang_as_job({"metadata": {"name": "job.x"}, "spec": {"workers": 4}, "status": {}})
    assert pending["spec"]["workers"] == {"replicas": 4, "gpusPerWorker": "?"}  # no GPUs recorded yet
