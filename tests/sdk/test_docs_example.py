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


def torch_python() -> str:
    """The interpreter that runs the example: GPUQ_TORCH_PYTHON (`make test` sets it to its cached
    PyTorch venv, and then it must work), else this one if it has torch, else the test skips."""
    python = os.environ.get("GPUQ_TORCH_PYTHON")
    if python:
        assert Path(python).is_file(), f"GPUQ_TORCH_PYTHON={python} does not exist (run make torch)"
        return python
    pytest.importorskip("torch")
    return sys.executable


def test_example_saves_reports_and_resumes(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    python = torch_python()
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
        # gpuq.sdk from this checkout (stdlib only), whatever venv the interpreter belongs to.
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "operator"),
    }
    subprocess.run([python, "-c", example()], env=env, check=True, timeout=120)
    reports = [
        json.loads(b["metadata"]["annotations"][ANNOTATION_CHECKPOINT])
        for m, _, _, b in state.requests
        if m == "PATCH"
    ]
    assert [r["step"] for r in reports] == [100, 200]
    resume = {"GPUQ_RESUME_FROM": reports[-1]["path"], "GPUQ_RESUME_STEP": "200", "STEPS": "300"}
    subprocess.run([python, "-c", example()], env={**env, **resume}, check=True, timeout=120)
    assert json.loads(state.requests[-1][3]["metadata"]["annotations"][ANNOTATION_CHECKPOINT])["step"] == 300


def test_sdk_imports_with_the_standard_library_only() -> None:
    """A worker image may hold gpuq.sdk and nothing else: no pydantic, kopf or kubernetes."""
    heavy = ("pydantic", "kopf", "kubernetes", "yaml", "structlog")
    blocked = f"import sys\nfor m in {heavy!r}: sys.modules[m] = None\n"
    code = blocked + "from gpuq import sdk\nprint(sdk.resume_info({}))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "operator")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
