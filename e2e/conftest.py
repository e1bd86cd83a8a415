"""e2e fixtures: a real Kubernetes API server with GPU nodes, shared by the whole test session.

Backend, chosen with GPUQ_E2E_CLUSTER:
  local     (default) gpuq.devcluster: etcd + kube-apiserver + kube-controller-manager + kube-scheduler
            + kwok simulating the GPU nodes; started once per session (~5 s with cached binaries, the
            first run builds them) and stopped at the end, even on Ctrl-C, a failing test, or the
            session being killed (Linux). Shape: 2 zones x 2 blocks x 2 racks x 2 nodes x 8 GPUs, so
            every topology level is distinct; GPUQ_E2E_SHAPE="racks=4,nodes_per_rack=4,blocks=2,zones=1"
            overrides it. After a failed session the control-plane logs are kept and their path printed.
  kind      pytest-kind-ng (the `kind` extra) with kind, a node image and the operator and kwok images
            built here (hack/kind/, `make e2e-kind`; podman or docker): one kind node
            (e2e/kind/cluster.yaml) running kwok, which simulates the same GPU fleet as `local`;
            fail_node stops a node's heartbeat as locally. Tests in test_incluster.py run the
            operator in the cluster as its Deployment.
  existing  the cluster of $KUBECONFIG (or ~/.kube/config). If that is a gpuq dev cluster
            (`gpuq cluster up`), everything works as with `local`; elsewhere can_fail_nodes and
            simulated_pods are False and tests needing them skip.

Fixtures:
  cluster    (session) a gpuq.devcluster.testing.E2ECluster: .api (kubernetes ApiClient), .core
             (CoreV1Api), .kubeconfig, .shape, .nodes_by_rack, .node_names, .gpus_per_node,
             .simulated_pods, .can_fail_nodes, .fail_node(name), .recover_node(name), .node_ready(name).
  namespace  (function) a fresh namespace whose default service account exists; deleted afterwards.

Tests import types and helpers from gpuq.devcluster.testing (E2ECluster, wait_for), never from here.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpuq.controller.testing import ensure_namespace
from gpuq.devcluster import Cluster, Shape, ensure_binaries
from gpuq.devcluster.binaries import pinned_versions
from gpuq.devcluster.kindcluster import KindFleet
from gpuq.devcluster.testing import E2ECluster, wait_for

E2E_SHAPE = Shape(racks=8, nodes_per_rack=2, gpus_per_node=8, blocks=4, zones=2)
ROOT = Path(__file__).resolve().parents[1]
KIND_CONFIG = Path(__file__).parent / "kind" / "cluster.yaml"
KIND_CLUSTER = "gpuq-e2e"


def _client(kubeconfig: Path) -> k8s.ApiClient:
    return k8s_config.new_client_from_config(config_file=str(kubeconfig))


def e2e_shape() -> Shape:
    """E2E_SHAPE with GPUQ_E2E_SHAPE overrides, e.g. "racks=4,nodes_per_rack=4"."""
    overrides = dict(item.split("=", 1) for item in os.environ.get("GPUQ_E2E_SHAPE", "").split(",") if item)
    return Shape(**{**asdict(E2E_SHAPE), **{k.strip(): int(v) for k, v in overrides.items()}}).validate()


def _from_devcluster(backend: str, dev: Cluster) -> E2ECluster:
    return E2ECluster(
        backend,
        dev.kubeconfig,
        _client(dev.kubeconfig),
        simulated_pods=True,
        shape=dev.shape,
        _fail=dev.fail_node,
        _recover=dev.recover_node,
        dev=dev,
    )


@contextlib.contextmanager
def _local(session: pytest.Session) -> Iterator[E2ECluster]:
    Cluster.reap_abandoned("e2e-")  # clusters of killed sessions (off Linux: their processes too), old logs
    ensure_binaries(progress=sys.__stderr__)  # a first build takes minutes: show it past pytest's capture
    # tie_to_process: the kernel stops the cluster if this session dies without tearing down
    dev = Cluster.up(f"e2e-{os.getpid()}", e2e_shape(), tie_to_process=True)
    try:
        yield _from_devcluster("local", dev)
    finally:
        failed = session.testsfailed > 0
        dev.down(keep_logs=failed)
        if failed:
            print(f"\ne2e control-plane logs kept in {dev.paths.logs}", file=sys.stderr)


@contextlib.contextmanager
def _existing(_session: pytest.Session) -> Iterator[E2ECluster]:
    kubeconfig = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
    dev = Cluster.for_kubeconfig(kubeconfig)
    if dev is not None:
        yield _from_devcluster("existing", dev)
    else:
        yield E2ECluster("existing", kubeconfig, _client(kubeconfig), simulated_pods=False)


def _hack(script: str) -> str:
    """Run a hack/ build script (cached: fast once built; progress on stderr); its last line."""
    out = subprocess.run(["bash", str(ROOT / "hack" / script)], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def _delete_leftover_kind(kind_sh: Path) -> None:
    """Delete a gpuq-e2e cluster a killed session (or GPUQ_KIND_KEEP_ON_FAILURE) left behind.

    pytest-kind reuses a cluster of the same name but reads its kubeconfig from this checkout,
    which a fresh checkout does not have; and a reused cluster carries the last session's objects.
    """
    out = subprocess.run([str(kind_sh), "get", "clusters"], check=True, capture_output=True, text=True)
    if KIND_CLUSTER in out.stdout.split():
        print(f"\ndeleting kind cluster {KIND_CLUSTER} left by an earlier session", file=sys.__stderr__)
        delete = [str(kind_sh), "delete", "cluster", "--name", KIND_CLUSTER]
        subprocess.run(delete, check=True, capture_output=True)


@contextlib.contextmanager
def _kind(session: pytest.Session) -> Iterator[E2ECluster]:
    try:
        from pytest_kind import KindCluster  # the `kind` extra: pip install -e '.[kind]'
    except ImportError:
        pytest.fail("GPUQ_E2E_CLUSTER=kind needs pytest-kind-ng: pip install -e '.[kind]'")
    # kind, its node image and the images it loads, all built here (hack/kind/): a laptop with
    # Docker may set GPUQ_KIND_NODE_IMAGE=kindest/node:v1.36.x instead of building the node image.
    kind_sh = ROOT / "hack" / "kind" / "kind.sh"
    node_image = os.environ.get("GPUQ_KIND_NODE_IMAGE") or _hack("kind/node-image.sh")
    images = Path(os.environ.get("GPUQ_KIND_IMAGES") or _hack("kind/images.sh"))
    kind = KindCluster(KIND_CLUSTER, image=node_image, kind_path=kind_sh)
    _delete_leftover_kind(kind_sh)
    kind.create(config_file=KIND_CONFIG)
    failed = True
    try:
        for archive in sorted(images.glob("*.tar")):
            subprocess.run([str(kind_sh), "load", "image-archive", str(archive), "--name", KIND_CLUSTER],
                           check=True, capture_output=True)  # fmt: skip
        kubeconfig = Path(kind.kubeconfig_path).resolve()
        shape = e2e_shape()
        fleet = KindFleet(kubeconfig, Path(kind.path) / "certs")
        fleet.start(shape, f"localhost/gpuq/kwok:{pinned_versions()['KWOK_VERSION']}")
        yield E2ECluster(
            "kind",
            kubeconfig,
            _client(kubeconfig),
            simulated_pods=True,
            shape=shape,
            _fail=fleet.fail_node,
            _recover=fleet.recover_node,
        )
        failed = session.testsfailed > 0
    finally:
        if failed and os.environ.get("GPUQ_KIND_KEEP_ON_FAILURE"):
            print(f"\nkind cluster {KIND_CLUSTER} kept: {kind_sh} export kubeconfig --name {KIND_CLUSTER}")
        else:
            kind.delete()


BACKENDS: dict[str, Callable[[pytest.Session], contextlib.AbstractContextManager[E2ECluster]]] = {
    "local": _local,
    "existing": _existing,
    "kind": _kind,
}


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[E2ECluster]:
    backend = os.environ.get("GPUQ_E2E_CLUSTER", "local")
    if backend not in BACKENDS:
        pytest.fail(f"GPUQ_E2E_CLUSTER={backend!r}: expected one of {', '.join(BACKENDS)}")
    with BACKENDS[backend](request.session) as handle:
        ensure_namespace(handle.core, "gpuq-system")  # the operators' leader-election Lease lives here
        yield handle


@pytest.fixture
def namespace(cluster: E2ECluster) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default service account exists)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core = cluster.core
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    wait_for(
        lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
        30,
        f"service account default in namespace {name}",
    )
    yield name
    with contextlib.suppress(k8s.ApiException):
        core.delete_namespace(name)
