"""The scheduler extender's HTTP side (kube-scheduler's extender v1 protocol), served by the leader.

kube-scheduler POSTs an ExtenderArgs for one pod (`{"Pod": ..., "Nodes": ..., "NodeNames": [...]}`,
NodeNames when the extender is nodeCacheCapable) to `<urlPrefix>/filter` and `<urlPrefix>/prioritize`;
the answers are an ExtenderFilterResult (`{"Nodes", "NodeNames", "FailedNodes",
"FailedAndUnresolvableNodes", "Error"}`) and a HostPriorityList (`[{"Host": ..., "Score": 0-10}]`),
field names capitalised as the Go types have no JSON tags. The rules are gpuq.core.extender's; the
state is the one the leader's last scheduling cycle built (`ExtenderView`). Nodes gpuq fails are
reported as unresolvable, so kube-scheduler does not try to preempt gpuq's workers to make room.

Only the leader listens (a term starts and stops the server), so on one host the address always
reaches the leader; in a cluster a Service selects the pod labelled `gpuq.dev/leader=true`. Anything
unexpected answers 500: kube-scheduler treats an `ignorable` extender's errors as "no opinion".
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from gpuq.controller.resources import QuantityError, pod_requests
from gpuq.core.extender import ExtenderView, filter_nodes, prioritize
from gpuq.logs import get_logger

log = get_logger("gpuq.extender")

FILTER_PATH = "/filter"
PRIORITIZE_PATH = "/prioritize"


class BadRequest(ValueError):
    pass


def parse_args(body: Any) -> tuple[Mapping[str, Any], int, list[str], list[Any] | None]:
    """(pod, GPUs it requests, candidate node names, the Nodes items when sent instead of names)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("Pod"), Mapping):
        raise BadRequest("ExtenderArgs needs a Pod")
    pod = body["Pod"]
    try:
        gpus = pod_requests(pod.get("spec") or {}).gpus
    except (QuantityError, AttributeError, TypeError) as exc:
        raise BadRequest(f"pod requests: {exc}") from None
    names = body.get("NodeNames")
    items = None
    if names is None:
        items = list(((body.get("Nodes") or {}).get("items")) or [])
        names = [((n.get("metadata") or {}).get("name")) for n in items]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BadRequest("NodeNames must be a list of node names")
    return pod, gpus, names, items


def filter_result(view: ExtenderView, body: Any) -> dict[str, Any]:
    _, gpus, names, items = parse_args(body)
    passed, failed = filter_nodes(view, gpus, names) if gpus > 0 else (names, {})
    result: dict[str, Any] = {"FailedNodes": {}, "FailedAndUnresolvableNodes": failed, "Error": ""}
    if items is None:
        result.update(Nodes=None, NodeNames=passed)
    else:
        keep = set(passed)
        result.update(
            Nodes={"items": [n for n in items if (n.get("metadata") or {}).get("name") in keep]},
            NodeNames=None,
        )
    return result


def priority_result(view: ExtenderView, body: Any) -> list[dict[str, Any]]:
    _, gpus, names, _ = parse_args(body)
    return [{"Host": name, "Score": score} for name, score in prioritize(view, max(gpus, 0), names)]


class ExtenderServer:
    def __init__(self, host: str, port: int, view: Callable[[], ExtenderView | None]) -> None:
        self.host = host
        self.port = port
        self.view = view
        self.calls = 0
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(FILTER_PATH, self._filter)
        app.router.add_post(PRIORITIZE_PATH, self._prioritize)
        app.router.add_get("/healthz", self._health)
        return app

    async def start(self) -> bool:
        """Listen; False (logged) when the address is taken: the term goes on without the extender."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port, reuse_address=True).start()
        except OSError as exc:
            log.error("scheduler extender cannot listen", address=f"{self.host}:{self.port}", error=str(exc))
            await self.stop()
            return False
        log.info("scheduler extender listening", address=f"{self.host}:{self.port}")
        return True

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _answer(self, request: web.Request, fn: Callable[[ExtenderView, Any], Any]) -> web.Response:
        self.calls += 1
        view = self.view()
        if view is None:
            return web.json_response(
                {"Error": "gpuq has not finished its first scheduling cycle"}, status=503
            )
        t0 = time.perf_counter()
        try:
            body = json.loads(await request.read())
            result = fn(view, body)
        except (BadRequest, ValueError) as exc:
            return web.json_response({"Error": str(exc)}, status=400)
        log.debug("extender call", path=request.path, ms=round((time.perf_counter() - t0) * 1000, 3))
        return web.json_response(result)

    async def _filter(self, request: web.Request) -> web.Response:
        return await self._answer(request, filter_result)

    async def _prioritize(self, request: web.Request) -> web.Response:
        return await self._answer(request, priority_result)

    async def _health(self, _request: web.Request) -> web.Response:
        ready = self.view() is not None
        return web.json_response({"leader": True, "ready": ready}, status=200 if ready else 503)
