"""`gpuq doctor` knows a dev cluster by the API server its kubeconfig talks to, not by the file's
path: `gpuq cluster up` writes a self-contained kubeconfig meant to be copied, and users merge it
into ~/.kube/config (`kubectl config view --flatten`), renaming its context. Any of those gets the
dev cluster's advice; a kubeconfig whose current context is another cluster keeps the advice for
real clusters."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuq.cli import build_parser
from gpuq.devcluster import Shape
from gpuq.doctor import checks

DEV_SERVER = "https://127.0.0.1:46443"


def kubeconfig(path: Path, current: str, servers: dict[str, str]) -> Path:
    """A kubeconfig with one context per server (token auth: nothing is contacted here)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": n, "cluster": {"server": s, "insecure-skip-tls-verify": True}}
            for n, s in servers.items()
        ],
        "users": [{"name": n, "user": {"token": "t"}} for n in servers],
        "contexts": [{"name": n, "context": {"cluster": n, "user": n}} for n in servers],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def dev_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The state `gpuq cluster up --name h1` leaves (only what doctor reads), its kubeconfig beside it."""
    monkeypatch.setenv("GPUQ_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "cache" / "clusters" / "h1"
    root.mkdir(parents=True)
    shape = dataclasses.asdict(Shape(racks=2, nodes_per_rack=4, blocks=2))
    (root / "state.json").write_text(json.dumps({"name": "h1", "server": DEV_SERVER, "shape": shape}))
    return kubeconfig(root / "kubeconfig", "gpuq-h1", {"gpuq-h1": DEV_SERVER})


def doctor_context(monkeypatch: pytest.MonkeyPatch, config: Path) -> Any:
    """Run `gpuq doctor --kubeconfig config` up to its checks; the Context they would get."""
    seen: list[Any] = []
    monkeypatch.setattr(checks, "run_checks", lambda ctx: seen.append(ctx) or [])
    args = build_parser("gpuq").parse_args(["doctor", "--json", "--kubeconfig", str(config)])
    assert args.func(args) == 0
    (ctx,) = seen
    return ctx


def test_the_dev_clusters_own_kubeconfig(monkeypatch: pytest.MonkeyPatch, dev_cluster: Path) -> None:
    ctx = doctor_context(monkeypatch, dev_cluster)
    assert ctx.dev_cluster.name == "h1"
    assert ctx.scheduler_config == dev_cluster.parent / "config" / "kube-scheduler.yaml"


def test_a_merged_kubeconfig_with_the_dev_cluster_current(
    monkeypatch: pytest.MonkeyPatch, dev_cluster: Path, tmp_path: Path
) -> None:
    merged = kubeconfig(tmp_path / "config", "dev", {"prod": "https://10.0.0.1:6443", "dev": DEV_SERVER})
    ctx = doctor_context(monkeypatch, merged)
    assert ctx.dev_cluster is not None and ctx.dev_cluster.name == "h1"
    assert ctx.scheduler_config == dev_cluster.parent / "config" / "kube-scheduler.yaml"
    assert checks._scheduler_fix(ctx).startswith("gpuq cluster up --name h1 --racks 2 --nodes-per-rack 4")


def test_a_merged_kubeconfig_with_another_cluster_current(
    monkeypatch: pytest.MonkeyPatch, dev_cluster: Path, tmp_path: Path
) -> None:
    merged = kubeconfig(tmp_path / "config", "prod", {"prod": "https://10.0.0.1:6443", "dev": DEV_SERVER})
    ctx = doctor_context(monkeypatch, merged)
    assert ctx.dev_cluster is None and ctx.scheduler_config is None
    assert checks._scheduler_fix(ctx).startswith("gpuq extender config")
