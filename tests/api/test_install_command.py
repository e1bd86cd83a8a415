"""One CRD install command everywhere: every `kubectl apply` of crds/ that gpuq's code or docs name is
gpuq.api.crd.INSTALL_COMMAND (e2e/test_crd_install.py runs it against a real API server), and the
places that tell a user to install the CRDs say it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gpuq.api import crd

ROOT = Path(__file__).resolve().parents[2]
# `kubectl apply` (or create, replace) of something named crds (a directory, a file in it), in any
# spelling of the flag, other flags (--server-side, -R) before it.
APPLY_CRDS = re.compile(
    r"kubectl\s+(?:apply|create|replace)\b[^\n`|;&]*?\s(?:-f|-k|--filename|--kustomize)[= ]\s*"
    r"\S*crds[^\s`'\"\\]*"  # the name ends before a quote or an escape (\n in a string)
)
SELF = str(Path(__file__).resolve().relative_to(ROOT))
TEXT = {".md", ".py", ".txt", ".yaml", ".yml", ".tpl", ".sh", ".toml", ".cfg", ".json", ""}


def tracked_texts() -> dict[str, str]:
    """Every tracked text file of the repository (Makefile, e2e/, bench/ and tests/ included)."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    out = {}
    for name in files:
        path = ROOT / name
        if path.suffix in TEXT and path.is_file():
            try:
                out[name] = path.read_text()
            except UnicodeDecodeError:
                continue
    return out


def test_the_pattern_sees_the_spellings_that_drifted() -> None:
    """Otherwise the next test passes whatever the files say."""
    for wrong in (
        "kubectl apply -f crds/",
        "kubectl apply -f ./crds",
        "kubectl apply --server-side -f crds/gpuq.dev_gpuqueues.yaml",
        "kubectl create -f crds/",
        "kubectl apply --filename=crds/",
        "kubectl apply -R -k ../crds",
    ):
        assert APPLY_CRDS.search(f"run `{wrong}` first"), wrong


def test_every_crd_install_command_is_the_one_that_works() -> None:
    mentions = {
        (name, match.group(0).rstrip("`'\").,"))
        for name, text in tracked_texts().items()
        if name != SELF  # its own examples of wrong spellings
        for match in APPLY_CRDS.finditer(text)
    }
    assert mentions, "no mention found: is the pattern still right?"
    wrong = {(name, m) for name, m in mentions if m != crd.INSTALL_COMMAND}
    assert not wrong, f"use `{crd.INSTALL_COMMAND}` (kubectl apply -f trips on crds/kustomization.yaml)"


def test_the_install_command_is_a_kustomization_apply_of_crds() -> None:
    assert crd.INSTALL_COMMAND == "kubectl apply -k crds/"
    assert (ROOT / "crds" / "kustomization.yaml").exists()


def test_the_messages_that_send_users_to_install_the_crds_name_it() -> None:
    texts = tracked_texts()
    for name in (
        "operator/gpuq/controller/operator.py",
        "operator/gpuq/doctor/checks.py",
        "operator/gpuq/ctl/client.py",
    ):
        assert "crd.INSTALL_COMMAND" in texts[name], name
    for name in ("docs/operations.md", "docs/extender.md", "README.md"):
        assert crd.INSTALL_COMMAND in texts[name], name
