"""gpuq.sdk against a real (local, plain HTTP) server that records what it is sent: the report the SDK
writes is exactly what the operator parses, tokens are re-read, failures come back as SdkError."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuq import sdk
from gpuq.api.meta import ANNOTATION_CHECKPOINT, ANNOTATION_CHECKPOINT_REQUESTED
from gpuq.api.trainingjob import TrainingJobSpec
from gpuq.controller.objects import parse_checkpoint
from gpuq.controller.podinfo import PODINFO_DIR, PODINFO_VOLUME
from gpuq.controller.pods import worker_pod
from gpuq.sdk.rbac import worker_rbac

from .conftest import FakeApi


def ctx(server: str, tmp_path: Path, **extra: str) -> sdk.PodContext:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text("tok-1\n")
    env = {
        "GPUQ_POD_NAME": "job-1-0",
        "GPUQ_POD_NAMESPACE": "team-a",
        "GPUQ_API_SERVER": server,
        "GPUQ_TOKEN_FILE": str(token),
        **extra,
    }
    return sdk.PodContext.from_env(env)


def test_report_patches_its_own_pod_with_what_the_operator_reads(
    api: tuple[FakeApi, str], tmp_path: Path
) -> None:
    state, server = api
    when = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    sdk.report_checkpoint(1200, "s3://b/run/1200", when=when, ctx=ctx(server, tmp_path))
    method, path, headers, body = state.requests[-1]
    assert (method, path) == ("PATCH", "/api/v1/namespaces/team-a/pods/job-1-0")
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert headers["Authorization"] == "Bearer tok-1"
    report, error = parse_checkpoint(body["metadata"]["annotations"][ANNOTATION_CHECKPOINT])
    assert error is None and report is not None
    assert (report.step, report.path, report.time) == (1200, "s3://b/run/1200", when)


def test_rotated_token_is_used(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    state, server = api
    c = ctx(server, tmp_path)
    (tmp_path / "token").write_text("tok-2")
    sdk.report_checkpoint(1, "/ckpt/1", ctx=c)
    assert state.requests[-1][2]["Authorization"] == "Bearer tok-2"


def test_checkpoint_requested_from_the_api_and_from_the_downward_volume(
    api: tuple[FakeApi, str], tmp_path: Path
) -> None:
    state, server = api
    assert sdk.checkpoint_requested(ctx(server, tmp_path)) is False
    state.pod["metadata"]["annotations"][ANNOTATION_CHECKPOINT_REQUESTED] = "2025-01-01T00:00:00Z"
    assert sdk.checkpoint_requested(ctx(server, tmp_path)) is True
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "annotations").write_text('other="x"\n')
    calls = len(state.requests)
    assert sdk.checkpoint_requested(ctx(server, tmp_path, GPUQ_PODINFO_DIR=str(podinfo))) is False
    (podinfo / "annotations").write_text(f'{ANNOTATION_CHECKPOINT_REQUESTED}="2025-01-01T00:00:00Z"\n')
    assert sdk.checkpoint_requested(ctx(server, tmp_path, GPUQ_PODINFO_DIR=str(podinfo))) is True
    assert len(state.requests) == calls  # the volume answers without an API call


def test_forbidden_names_the_rbac(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    state, server = api
    state.status = 403
    with pytest.raises(
        sdk.SdkError, match=r"HTTP 403: pods is forbidden \(see the RBAC in docs/failover.md\)"
    ):
        sdk.report_checkpoint(1, "/ckpt/1", ctx=ctx(server, tmp_path))


def test_bad_input_and_missing_context_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(sdk.SdkError, match="GPUQ_POD_NAME is not set"):
        sdk.PodContext.from_env({})
    c = ctx("http://127.0.0.1:9", tmp_path)
    for step in (-1, 1.5, True):
        with pytest.raises(sdk.SdkError, match="step must be"):
            sdk.report_checkpoint(step, "/p", ctx=c)  # type: ignore[arg-type]
    with pytest.raises(sdk.SdkError, match="path must be"):
        sdk.report_checkpoint(1, "", ctx=c)
    with pytest.raises(sdk.SdkError, match="cannot reach"):
        sdk.report_checkpoint(1, "/p", ctx=c)


def test_resume_info() -> None:
    assert sdk.resume_info({}) is None
    env = {"GPUQ_RESUME_FROM": "s3://b/7", "GPUQ_RESUME_STEP": "7", "GPUQ_RESTART_COUNT": "2"}
    assert sdk.resume_info(env) == sdk.ResumeInfo("s3://b/7", 7, 2)
    with pytest.raises(sdk.SdkError, match="malformed"):
        sdk.resume_info({"GPUQ_RESUME_FROM": "x", "GPUQ_RESUME_STEP": "seven"})


def test_worker_pods_carry_what_the_sdk_reads() -> None:
    spec = TrainingJobSpec.model_validate(
        {
            "queue": "q",
            "workers": {
                "replicas": 2,
                "gpusPerWorker": 8,
                "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}},
            },
        }
    )
    pod = worker_pod("ns", "job", "uid", spec, rank=0, attempt=1)
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["GPUQ_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["GPUQ_POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["GPUQ_PODINFO_DIR"]["value"] == PODINFO_DIR
    assert {"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True} in c["volumeMounts"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == [PODINFO_VOLUME]


def test_rbac_scopes_the_policy_to_one_service_account() -> None:
    role, binding, policy, policy_binding = worker_rbac("team-a", "trainer")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": "trainer", "namespace": "team-a"}
    cond = policy["spec"]["matchConditions"][0]["expression"]
    assert cond == "request.userInfo.username == 'system:serviceaccount:team-a:trainer'"
    assert policy_binding["spec"]["policyName"] == policy["metadata"]["name"]
