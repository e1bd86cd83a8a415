"""The extender's wire protocol (kube-scheduler extender v1, capitalised field names), served by a
real aiohttp server: NodeNames and full Nodes, filter and prioritize, errors as kube-scheduler
expects them."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gpuq.controller.extender import ExtenderServer
from gpuq.core.extender import ExtenderView

VIEW = ExtenderView(
    capacity={"a": 8, "b": 8, "c": 8},
    free={"a": 0, "b": 8, "c": 3},
    reserved={"a": "8 GPUs reserved for gang ns/g (binding)"},
    rack={"a": "r1", "b": "r1", "c": "r2"},
    rack_free={"r1": 8, "r2": 3},
    shapes=((8, 1.0),),
)


def pod(gpus: int) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"name": "infer", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "resources": res}]},
    }


async def call(view: ExtenderView | None, path: str, body: Any) -> tuple[int, Any]:
    server = ExtenderServer("127.0.0.1", 0, lambda: view)
    async with TestClient(TestServer(server.app())) as client:
        resp = await client.post(path, json=body)
        return resp.status, await resp.json()


async def test_filter_with_node_names() -> None:
    status, body = await call(VIEW, "/filter", {"Pod": pod(2), "Nodes": None, "NodeNames": ["a", "b", "c"]})
    assert status == 200
    assert body["NodeNames"] == ["b", "c"] and body["Nodes"] is None and body["Error"] == ""
    assert body["FailedNodes"] == {}
    assert "reserved for gang ns/g" in body["FailedAndUnresolvableNodes"]["a"]


async def test_filter_with_full_nodes_answers_nodes() -> None:
    nodes = {"items": [{"metadata": {"name": n}} for n in ("a", "b")]}
    status, body = await call(VIEW, "/filter", {"Pod": pod(1), "Nodes": nodes, "NodeNames": None})
    assert status == 200 and [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["b"]


async def test_prioritize_answers_a_host_priority_list() -> None:
    status, body = await call(VIEW, "/prioritize", {"Pod": pod(1), "NodeNames": ["b", "c"]})
    assert status == 200
    assert body == [{"Host": "b", "Score": 0}, {"Host": "c", "Score": 10}]


async def test_a_pod_without_gpus_is_not_filtered() -> None:
    status, body = await call(VIEW, "/filter", {"Pod": pod(0), "NodeNames": ["a", "b"]})
    assert status == 200 and body["NodeNames"] == ["a", "b"]


async def test_no_view_yet_and_bad_input_are_errors() -> None:
    status, body = await call(None, "/filter", {"Pod": pod(1), "NodeNames": ["a"]})
    assert status == 503 and "first scheduling cycle" in body["Error"]
    status, body = await call(VIEW, "/filter", {"NodeNames": ["a"]})
    assert status == 400 and "Pod" in body["Error"]
