"""Bad input against the real API server: hypothesis generates TrainingJob and GPUQueue bodies (valid
ones bent in random places: wrong types, out-of-range numbers, missing fields, junk pod templates).
The CRD schema rejects what it can; whatever it accepts, the operator must survive and answer with a
status (a phase, a condition) instead of crashing or ignoring the object."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

import test_operator as shared
from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, OperatorProcess
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

gpuq = shared.gpuq
queue = shared.queue

JOBS = 400
QUEUES = 150

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=12),
    st.sampled_from(["", "Required", "Preferred", "rack", "node", "Never", "default", "-1", "1e9"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
valid_names = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
names = st.one_of(valid_names, valid_names, valid_names, valid_names, st.text(min_size=1, max_size=70))

JOB_PATHS = [
    ("queue",),
    ("priority",),
    ("preemptible",),
    ("minRuntimeSeconds",),
    ("maxRestarts",),
    ("workers",),
    ("workers", "replicas"),
    ("workers", "gpusPerWorker"),
    ("workers", "gpuModels"),
    ("workers", "mixedModels"),
    # The pod template is free-form in the schema: most of what reaches the operator is bent here.
    *[("workers", "template")] * 2,
    *[("workers", "template", "spec")] * 2,
    *[("workers", "template", "spec", "containers")] * 3,
    *[("workers", "template", "spec", "restartPolicy")] * 2,
    *[("workers", "template", "spec", "nodeSelector")] * 3,
    *[("workers", "template", "spec", "tolerations")] * 3,
    *[("workers", "template", "spec", "affinity")] * 3,
    *[("workers", "template", "spec", "affinity", "nodeAffinity")] * 3,
    *[("workers", "template", "spec", "volumes")] * 2,
    *[("workers", "template", "metadata")] * 2,
    *[("workers", "template", "metadata", "annotations")] * 2,
    ("topology",),
    ("topology", "mode"),
    ("topology", "level"),
    ("checkpoint",),
    ("checkpoint", "gracePeriodSeconds"),
    ("checkpoint", "requestOnPreemption"),
    ("bogus",),
]
QUEUE_PATHS = [
    ("nominalGPUs",),
    ("cohort",),
    ("borrowingLimitGPUs",),
    ("lendingLimitGPUs",),
    ("weight",),
    ("namespaceSelector",),
    ("namespaceSelector", "matchLabels"),
    ("namespaceSelector", "matchExpressions"),
    ("queueingStrategy",),
    ("preemption",),
    ("preemption", "withinQueue"),
    ("modelQuotas",),
    ("bogus",),
]


def bend(
    body: dict[str, Any], paths: list[tuple[str, ...]], edits: list[tuple[int, bool, Any]]
) -> dict[str, Any]:
    """Apply edits (path index, delete?, new value) to a copy of `body`'s spec."""
    out = copy.deepcopy(body)
    for index, delete, value in edits:
        path = paths[index % len(paths)]
        node: Any = out["spec"]
        for key in path[:-1]:
            if not isinstance(node, dict):
                break
            node = node.setdefault(key, {})
        if not isinstance(node, dict):
            continue
        if delete:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return out


edits = st.lists(st.tuples(st.integers(0, 999), st.booleans(), values), min_size=1, max_size=3)


def examples(n: int) -> Any:
    """n reproducible examples (same bodies every run), no example database, no timing checks."""
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


class Outcome:
    def __init__(self) -> None:
        self.accepted: list[str] = []
        self.rejected = 0


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster, gpuq: GpuqClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    yield from shared.run_operator(cluster, tmp_path_factory, "operator-malformed", shared.FAST_CONFIG)


def queue_condition(gpuq: GpuqClient, name: str) -> bool:
    return any(c["type"] == "Active" for c in (gpuq.queue(name).get("status") or {}).get("conditions") or [])


def create(fn: Any, *args: Any) -> bool:
    try:
        fn(*args)
        return True
    except k8s.ApiException as exc:
        assert exc.status in (400, 422), (exc.status, exc.body)
        return False
    except ValueError:
        return False  # the client refuses to send it (e.g. a name it cannot put in a URL)


def test_operator_survives_whatever_the_schema_accepts(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    namespace: str,
    queue: shared.Callable[..., str],
) -> None:
    real_queue = queue(16)
    jobs, queues = Outcome(), Outcome()
    base_job = gpuq.job_body("x", real_queue, 1, 1)

    @examples(JOBS)
    @given(name=names, changes=edits)
    def one_job(name: str, changes: list[tuple[int, bool, Any]]) -> None:
        body = bend(base_job, JOB_PATHS, changes)
        name = f"{name}{len(jobs.accepted) + jobs.rejected}"  # unique: an example is one new object
        body["metadata"] = {"name": name}
        if create(gpuq.create_job, namespace, body):
            jobs.accepted.append(name)
        else:
            jobs.rejected += 1

    base_queue = {"apiVersion": meta.API_VERSION, "kind": "GPUQueue", "spec": {"nominalGPUs": 8}}
    tag = uuid.uuid4().hex[:4]

    @examples(QUEUES)
    @given(changes=edits)
    def one_queue(changes: list[tuple[int, bool, Any]]) -> None:
        body = bend(base_queue, QUEUE_PATHS, changes)
        name = f"fuzz-{tag}-{jobs.rejected + queues.rejected + len(queues.accepted)}"
        body["metadata"] = {"name": name}
        if create(gpuq.custom.create_cluster_custom_object, meta.GROUP, meta.VERSION, "gpuqueues", body):
            queues.accepted.append(name)
        else:
            queues.rejected += 1

    try:
        one_job()
        one_queue()
        print(
            f"\nTrainingJobs: {len(jobs.accepted)} accepted, {jobs.rejected} rejected by the schema; "
            f"GPUQueues: {len(queues.accepted)} accepted, {queues.rejected} rejected"
        )
        assert len(jobs.accepted) + jobs.rejected + len(queues.accepted) + queues.rejected >= 500
        assert jobs.accepted and jobs.rejected and queues.accepted and queues.rejected  # both sides exercised

        def answered() -> bool:
            return all((gpuq.job(namespace, n).get("status") or {}).get("phase") for n in set(jobs.accepted))

        wait_for(answered, 120, f"a status on every accepted job\n{operator.log_tail()}")
        for name in queues.accepted:
            wait_for(
                lambda name=name: queue_condition(gpuq, name), 60, f"condition Active on GPUQueue {name}"
            )
        assert operator.alive, operator.log_tail()
        log = operator.log_path.read_text()
        for crash in ("Traceback", "write crashed", "scheduling cycle failed", "cache update failed"):
            assert crash not in log, f"{crash}:\n{operator.log_tail(80)}"
    finally:
        gpuq.clear_namespace(namespace, timeout=120)
        for name in queues.accepted:
            gpuq.delete_queue(name)
