"""Worker pod and rendezvous Service rendering."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuq.api import meta
from gpuq.api.trainingjob import CheckpointReport, TrainingJobSpec
from gpuq.controller.pods import TemplateError, check_template, rendezvous_service, worker_pod


def spec(**template_spec: object) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate(
        {
            "queue": "team-a",
            "workers": {
                "replicas": 4,
                "gpusPerWorker": 8,
                "template": {
                    "metadata": {"labels": {"app": "llm", meta.LABEL_RANK: "99"}, "annotations": {"x": "y"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "t:1",
                                "env": [{"name": "RANK", "value": "bogus"}, {"name": "KEEP", "value": "1"}],
                            },
                            {"name": "sidecar", "image": "s:1"},
                        ],
                        **template_spec,
                    },
                },
            },
        }
    )


def env_of(container: dict[str, object]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}  # type: ignore[index,union-attr,attr-defined]


def test_worker_pod_carries_gang_identity_and_rendezvous() -> None:
    pod = worker_pod("ns1", "llm", "uid-1", spec(), rank=2, attempt=3, restarts=1)
    md, ps = pod["metadata"], pod["spec"]
    assert md["name"] == "llm-3-2"
    assert md["labels"] == {
        "app": "llm",
        meta.LABEL_JOB_NAME: "llm",
        meta.LABEL_QUEUE: "team-a",
        meta.LABEL_RANK: "2",
        meta.LABEL_ATTEMPT: "3",
    }
    assert md["annotations"] == {"x": "y"}
    owner = md["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", "uid-1", True)
    assert ps["schedulerName"] == "gpuq" and "nodeName" not in ps
    assert ps["restartPolicy"] == "Never"
    assert (ps["hostname"], ps["subdomain"]) == ("worker-2", "llm")
    trainer, sidecar = ps["containers"]
    assert trainer["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "resources" not in sidecar  # GPUs go to the first container only
    env = env_of(trainer)
    assert env["RANK"] == "2" and env["NODE_RANK"] == "2" and env["WORLD_SIZE"] == "4"
    assert env["MASTER_ADDR"] == "worker-0.llm.ns1.svc" and env["MASTER_PORT"] == "29500"
    assert env["GPUQ_RESTART_COUNT"] == "1" and env["GPUQ_ATTEMPT"] == "3" and env["KEEP"] == "1"
    assert "GPUQ_RESUME_FROM" not in env
    assert env_of(sidecar)["RANK"] == "2"


def test_resume_env_on_restart() -> None:
    ckpt = CheckpointReport(step=1200, path="s3://ckpt/1200", time=datetime(2024, 1, 1, tzinfo=UTC))
    pod = worker_pod("ns1", "llm", "uid-1", spec(), rank=0, attempt=2, restarts=1, resume=ckpt)
    env = env_of(pod["spec"]["containers"][0])
    assert env["GPUQ_RESUME_FROM"] == "s3://ckpt/1200" and env["GPUQ_RESUME_STEP"] == "1200"


def test_rendering_does_not_mutate_the_spec() -> None:
    s = spec()
    worker_pod("ns1", "llm", "uid-1", s, rank=0, attempt=1)
    assert "schedulerName" not in s.workers.template["spec"]


def test_single_worker_needs_no_rendezvous_service() -> None:
    one = TrainingJobSpec.model_validate(
        {"queue": "q", "workers": {"replicas": 1, "gpusPerWorker": 1, "template": spec().workers.template}}
    )
    pod = worker_pod("ns1", "solo", "uid-1", one, rank=0, attempt=1)
    assert env_of(pod["spec"]["containers"][0])["MASTER_ADDR"] == "localhost"
    assert "subdomain" not in pod["spec"]


def test_service_is_headless_and_owned() -> None:
    svc = rendezvous_service("ns1", "llm", "uid-1")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == {meta.LABEL_JOB_NAME: "llm"}
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ({}, "spec.workers.template.spec: Field required"),
        ({"spec": {"containers": []}}, "spec.workers.template.spec.containers: List should have at least 1"),
        (
            {"spec": {"containers": [{"name": "a"}]}},
            r"spec.workers.template.spec.containers\[0\].image: Field",
        ),
        (
            {"spec": {"containers": [{"name": "a", "image": "i"}], "restartPolicy": "Always"}},
            "restartPolicy: Input should be 'Never' or 'OnFailure'",
        ),
        (
            {"spec": {"containers": [{"name": "a", "image": "i"}], "nodeName": "n1"}},
            "spec.workers.template.spec: nodeName must not be set",
        ),
    ],
)
def test_template_errors_are_explained(template: dict[str, object], fragment: str) -> None:
    with pytest.raises(TemplateError, match=fragment):
        check_template(template)


def test_the_documented_torchrun_line_uses_the_per_pod_variables_gpuq_sets() -> None:
    """docs/api.md: WORLD_SIZE and RANK count pods (as Kubeflow's PyTorchJob sets them), and the
    torchrun line there turns them into per-process values; every variable it reads is set."""
    import re
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", docs, re.S) if "torchrun" in b]
    pod = worker_pod("ns1", "llm", "uid-1", spec(), rank=2, attempt=1)
    env = env_of(pod["spec"]["containers"][0])
    used = set(re.findall(r"\$\{?([A-Z_]+)", block))
    assert used and used <= env.keys(), used - env.keys()
    assert '--nnodes="$WORLD_SIZE"' in block and '--node_rank="$RANK"' in block
    assert '--nproc_per_node="$GPUQ_GPUS_PER_WORKER"' in block
    # Per pod: the gang has 4 workers of 8 GPUs; WORLD_SIZE counts the workers, RANK is this one's.
    assert (env["WORLD_SIZE"], env["RANK"], env["GPUQ_GPUS_PER_WORKER"]) == ("4", "2", "8")
    assert "pods (workers), not processes" in docs


def test_the_documented_worker_env_is_exactly_what_the_pod_builder_sets() -> None:
    """docs/api.md lists the env gpuq sets on every worker; a variable added to (or dropped from)
    the pod builder without the list fails here, so the list cannot drift."""
    import re
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    section = docs.split("### What gpuq sets on every worker pod", 1)[1].lstrip("\n").split("\n\n", 1)[0]
    (item,) = [b for b in re.split(r"\n- ", section) if b.startswith("env on every container")]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]*)[=`]", item))
    ckpt = CheckpointReport(step=1, path="/ckpt/1", time=datetime(2024, 1, 1, tzinfo=UTC))
    pod = worker_pod("ns1", "llm", "uid-1", spec(), rank=1, attempt=2, restarts=1, resume=ckpt)
    fixed = {k: v for k, v in re.findall(r"`([A-Z][A-Z0-9_]*)=([^`<]+)`", item)}  # no <placeholder>
    assert fixed, item
    for container in pod["spec"]["containers"]:
        set_here = {e["name"] for e in container["env"]} - {"KEEP"}  # KEEP: the template's own
        assert documented == set_here, (sorted(documented - set_here), sorted(set_here - documented))
        assert {k: env_of(container)[k] for k in fixed} == fixed
