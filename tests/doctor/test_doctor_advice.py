"""`gpuq doctor`'s advice fits the setup it checks: on a dev cluster kube-scheduler's fix is the
`gpuq cluster up` of that very cluster; the RBAC check is about the identity the leader runs as (or
says plainly that it checked the Deployment's ServiceAccount); the extender is looked for where the
config has it listen."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client as k8s

from gpuq.api import meta
from gpuq.cli import build_parser
from gpuq.core.config import SchedulerConfig
from gpuq.devcluster import Shape
from gpuq.devcluster.cli import up_command
from gpuq.doctor import checks
from gpuq.doctor.checks import (
    FAIL,
    OPERATOR_SA,
    SKIP,
    Context,
    _scheduler_fix,
    check_operator,
    check_queues,
    operator_subject,
)


def context(lease: Any = None, **kw: Any) -> Context:
    ctx = Context(k8s.ApiClient(), **kw)
    ctx.lease_object = lambda: lease  # type: ignore[method-assign]
    return ctx


def lease(holder: str, annotations: dict[str, str] | None) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(annotations=annotations), spec=SimpleNamespace(holder_identity=holder)
    )


@pytest.mark.parametrize(
    ("name", "shape", "url", "command"),
    [
        ("gpuq", Shape(), "http://127.0.0.1:8888", "gpuq cluster up --scheduler-extender"),
        (
            "h1",
            Shape(racks=2, nodes_per_rack=4, blocks=2),
            "http://127.0.0.1:9999",
            "gpuq cluster up --name h1 --racks 2 --nodes-per-rack 4 --scheduler-extender http://127.0.0.1:9999",
        ),
        ("gpuq", Shape(racks=1, blocks=1), None, "gpuq cluster up --racks 1"),
    ],
)
def test_up_command_names_the_running_cluster(name: str, shape: Shape, url: str | None, command: str) -> None:
    assert up_command(name, shape, url) == command


def test_up_command_parses_back_to_the_same_shape() -> None:
    shape = Shape(racks=3, nodes_per_rack=2, gpus_per_node=4, blocks=3, zones=3, gpu_product="NVIDIA-A100")
    _, *argv = up_command("x", shape, "http://h:1").split()  # as `gpuq` would parse it
    args = build_parser("gpuq").parse_args(argv)
    assert (args.name, args.racks, args.nodes_per_rack, args.gpus_per_node) == ("x", 3, 2, 4)
    assert (args.blocks, args.zones, args.gpu_product, args.scheduler_extender) == (
        3,
        3,
        "NVIDIA-A100",
        "http://h:1",
    )


def test_kube_schedulers_fix_on_a_dev_cluster_is_its_up_command() -> None:
    dev = SimpleNamespace(name="h1", shape=Shape(racks=2, nodes_per_rack=4, blocks=2))
    fix = _scheduler_fix(context(dev_cluster=dev))
    assert fix.startswith("gpuq cluster up --name h1 --racks 2 --nodes-per-rack 4 --scheduler-extender")
    assert _scheduler_fix(context()).startswith("gpuq extender config")


def test_with_no_operator_a_dev_cluster_is_told_to_run_it_from_the_checkout() -> None:
    """kwok plays a dev cluster's kubelets: the Deployment's pod would look Running and run nothing."""
    dev = SimpleNamespace(name="h1", shape=Shape(), kubeconfig="/c/h1/kubeconfig")
    result = check_operator(context(dev_cluster=dev))
    assert result.status == FAIL and result.fix.startswith("gpuq operator run --kubeconfig /c/h1/kubeconfig")
    assert "manifests" not in result.fix
    real = check_operator(context())
    assert real.status == FAIL and "kubectl apply -k manifests/" in real.fix


def test_rbac_is_checked_for_the_leaders_identity() -> None:
    annotated = lease(
        "vm_1", {meta.ANNOTATION_LEADER_USER: "gpuq-admin", meta.ANNOTATION_LEADER_GROUPS: "system:masters"}
    )
    subject = operator_subject(context(annotated))
    assert (subject.user, subject.groups) == ("gpuq-admin", ("system:masters",))
    assert "the leader vm_1 runs as it" in subject.why


@pytest.mark.parametrize(
    ("the_lease", "why"),
    [
        (None, "no operator leads"),
        (lease("vm_1", None), "the leader does not say whom it runs as"),
        (lease("", {meta.ANNOTATION_LEADER_USER: "gpuq-admin"}), "no operator leads: the Lease is released"),
    ],
)
def test_without_a_leaders_identity_it_says_it_checked_the_service_account(the_lease: Any, why: str) -> None:
    subject = operator_subject(context(the_lease))
    assert subject.user == OPERATOR_SA and "Deployment's ServiceAccount" in subject.why and why in subject.why


def test_the_extender_is_looked_for_where_the_config_has_it_listen() -> None:
    ctx = context()
    assert ctx.extender == "http://127.0.0.1:8888"
    ctx.config = SchedulerConfig(extender_bind_address="0.0.0.0", extender_port=18888)
    assert ctx.extender == "http://127.0.0.1:18888"
    assert context(extender_url="http://10.0.0.1:80").extender == "http://10.0.0.1:80"


def test_with_no_leader_a_dev_cluster_checks_the_kubeconfigs_own_user() -> None:
    """Its advice is `gpuq operator run` with this kubeconfig, so that user is who will run it;
    the Deployment's ServiceAccount would fail with a fix that does not apply there."""
    dev = SimpleNamespace(name="h1", shape=Shape(), kubeconfig="/c/h1/kubeconfig")
    ctx = context(None, dev_cluster=dev)
    ctx.whoami = lambda: ("gpuq-admin", ("system:masters", "system:authenticated"))  # type: ignore[method-assign]
    subject = operator_subject(ctx)
    assert (subject.user, subject.groups) == ("gpuq-admin", ("system:masters", "system:authenticated"))
    assert "no operator leads" in subject.why and "this kubeconfig" in subject.why
    ctx.whoami = lambda: None  # type: ignore[method-assign]  # the server does not say
    assert operator_subject(ctx).user == OPERATOR_SA


def test_queues_without_the_crd_are_skipped_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context()

    def fails(status: int, reason: str) -> Any:
        def call(*_: Any) -> Any:
            exc = k8s.ApiException(status=status, reason=reason)
            exc.body, exc.headers = "etcd\nfailed", {"Audit-Id": "x"}
            raise exc

        return SimpleNamespace(list_cluster_custom_object=call)

    ctx.custom = fails(404, "Not Found")
    result = check_queues(ctx)
    assert result.status == SKIP and "CRD" in result.detail
    # Any other API error a check meets is one line naming the status, not the whole response.
    ctx.custom = fails(500, "Internal Server Error")
    monkeypatch.setattr(checks, "CHECKS", (check_queues,))
    (queues,) = checks.run_checks(ctx)
    assert queues.status == FAIL and "\n" not in queues.detail and "500" in queues.detail, queues
