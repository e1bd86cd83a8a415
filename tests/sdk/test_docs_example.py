"""The PyTorch example of docs/failover.md runs: it reports checkpoints, and a second run resumes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq.api.meta import ANNOTATION_CHECKPOINT

from .conftest import FakeApi

DOC = Path(__file__).resolve().parents[2] / "docs" / "failover.md"


def example() -> str:
    match = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert match, "docs/failover.md lost its PyTorch example"
    return match.group(1)


def test_example_saves_reports_and_resumes(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    state, server = api
    (tmp_path / "token").write_text("t")
    env = {
        **os.environ,
        "GPUQ_POD_NAME": "job-1-0",
        "GPUQ_POD_NAMESPACE": "ns",
        "GPUQ_API_SERVER": server,
        "GPUQ_TOKEN_FILE": str(tmp_path / "token"),
        "CKPT_DIR": str(tmp_path),
        "STEPS": "250",
    }
    subprocess.run([sys.executable, "-c", example()], env=env, check=True, timeout=120)
    reports = [
        json.loads(b["metadata"]["annotations"][ANNOTATION_CHECKPOINT])
        for m, _, _, b in state.requests
        if m == "PATCH"
    ]
    assert [r["step"] for r in reports] == [100, 200]
    resume = {"GPUQ_RESUME_FROM": reports[-1]["path"], "GPUQ_RESUME_STEP": "200", "STEPS": "300"}
    subprocess.run([sys.executable, "-c", example()], env={**env, **resume}, check=True, timeout=120)
    assert json.loads(state.requests[-1][3]["metadata"]["annotations"][ANNOTATION_CHECKPOINT])["step"] == 300
