"""A scripted HTTP server for KubeApi and Informer tests: each (method, path) answers from its own
queue of responses (the last one repeats); every request is recorded. It is a real aiohttp server on
loopback, so the client's HTTP, JSON and streaming code runs for real."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuq.controller.kubeapi import ApiPolicy, Credentials, KubeApi


@dataclass
class Reply:
    status: int = 200
    body: Any = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    stream: list[Any] | None = None  # watch: these events, one JSON line each, then `hold` or close
    hold: bool = False  # keep a stream open until the test ends
    delay: float = 0.0  # seconds before answering


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    body: Any


class FakeApi:
    def __init__(self) -> None:
        self.script: dict[tuple[str, str], list[Reply]] = {}
        self.seen: list[Seen] = []
        self._closing = asyncio.Event()

    def on(self, method: str, path: str, *replies: Reply) -> None:
        self.script.setdefault((method, path), []).extend(replies)

    def requests(self, method: str, path: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path == path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append(
            Seen(request.method, request.path, dict(request.query), json.loads(raw) if raw else None)
        )
        method = "WATCH" if request.query.get("watch") == "true" else request.method
        queue = self.script.get((method, request.path))
        if not queue:
            return web.json_response({"reason": "NotFound", "message": "no script"}, status=404)
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.stream is None:
            return web.json_response(reply.body, status=reply.status, headers=reply.headers)
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        await resp.prepare(request)
        for event in reply.stream:
            await resp.write(json.dumps(event).encode() + b"\n")
        if reply.hold:
            await self._closing.wait()
        return resp


async def serve(fake: FakeApi) -> AsyncIterator[TestServer]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        fake._closing.set()
        await server.close()


def client(server: TestServer, max_connections: int = 64, **policy: Any) -> KubeApi:
    fast = {"backoff_base": 0.001, "backoff_max": 0.01, "qps": 0.0, **policy}
    creds = Credentials(host=str(server.make_url("")).rstrip("/"))
    return KubeApi(creds, max_connections=max_connections, policy=ApiPolicy(**fast))
