"""A small async Kubernetes REST client (aiohttp) for the operator's writes and initial lists.

Credentials come from the official client's loaders (kubeconfig or in-cluster service account), so
every auth method they support works; requests go straight over aiohttp with JSON dicts, without the
official client's model (de)serialisation, which dominates CPU at a thousand pods a minute.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from gpuq.api import meta

MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        return self.status == 422


@dataclass(frozen=True, slots=True)
class Credentials:
    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    config: Any = None  # kubernetes.client.Configuration, for bearer tokens that refresh

    def authorization(self) -> str | None:
        if self.config is None:
            return None
        # The official client stores it as BearerToken (newer) or authorization (older releases).
        token: str | None = self.config.get_api_key_with_prefix("BearerToken", alias="authorization")
        return token


def load_credentials(kubeconfig: str | None = None) -> Credentials:
    """kubeconfig (explicit, $KUBECONFIG, ~/.kube/config), else the in-cluster service account."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        if kubeconfig:
            raise
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return Credentials(
        host=cfg.host.rstrip("/"),
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=cfg.verify_ssl,
        config=cfg,
    )


def _ssl_context(creds: Credentials) -> ssl.SSLContext | bool:
    if not creds.host.startswith("https"):
        return False
    ctx = (
        ssl.create_default_context(cafile=creds.ca_file) if creds.verify else ssl._create_unverified_context()
    )
    if creds.cert_file and creds.key_file:
        ctx.load_cert_chain(creds.cert_file, creds.key_file)
    return ctx


def job_path(namespace: str, name: str = "", sub: str = "") -> str:
    base = f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{quote(namespace)}/trainingjobs"
    return base + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")


def queue_path(name: str = "", sub: str = "") -> str:
    base = f"/apis/{meta.GROUP}/{meta.VERSION}/gpuqueues"
    return base + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")


def pod_path(namespace: str, name: str = "", sub: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/pods"
    return base + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")


class KubeApi:
    def __init__(self, creds: Credentials, max_connections: int = 64, timeout: float = 30.0) -> None:
        self.creds = creds
        self._session: aiohttp.ClientSession | None = None
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=_ssl_context(self.creds))
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        auth = self.creds.authorization()
        if auth:
            headers["Authorization"] = auth
        for attempt in range(3):
            try:
                async with self._client().request(
                    method, self.creds.host + path, json=body, params=params, headers=headers
                ) as resp:
                    data = await resp.json(content_type=None) if resp.content_length != 0 else {}
                    if resp.status >= 400:
                        data = data if isinstance(data, dict) else {}
                        raise ApiError(
                            resp.status, data.get("reason", resp.reason or ""), data.get("message", "")
                        )
                    return data if isinstance(data, dict) else {}
            except (TimeoutError, aiohttp.ClientConnectionError):
                if attempt == 2:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)  # a restarting API server: retry briefly
        raise AssertionError("unreachable")

    async def get(self, path: str) -> dict[str, Any]:
        return await self.request("GET", path)

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """Every item of a collection, following `continue` tokens."""
        items: list[dict[str, Any]] = []
        params = {"limit": "500"}
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", path, params=params)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params = {**params, "continue": token}

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH)

    async def delete(self, path: str, grace_seconds: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        return await self.request("DELETE", path, body)
