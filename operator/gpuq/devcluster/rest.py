"""A minimal HTTPS client for the few API calls the dev cluster makes itself (readiness, creating and
labelling nodes). It keeps `gpuq cluster` fast and free of the kubernetes client's import cost; tests
and the operator use the real kubernetes client."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gpuq.devcluster.pki import KeyPair


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:300]}")


class Rest:
    def __init__(self, server: str, ca: KeyPair | None, client: KeyPair, timeout: float = 10.0) -> None:
        url = urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.timeout = timeout
        self._tls = ssl.create_default_context(cafile=str(ca.cert) if ca else None)
        self._tls.load_cert_chain(str(client.cert), str(client.key))

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path, workdir: Path, timeout: float = 10.0) -> Rest:
        """A client for the current context of a kubeconfig with inline certificates (kind's),
        whose CA and client pair are written to files in `workdir` (ssl wants paths)."""
        config = yaml.safe_load(kubeconfig.read_text())
        ctx = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
        cluster = next(c for c in config["clusters"] if c["name"] == ctx["cluster"])["cluster"]
        user = next(u for u in config["users"] if u["name"] == ctx["user"])["user"]
        workdir.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, key in (("ca.crt", "certificate-authority-data"), ("client.crt", "client-certificate-data"),
                          ("client.key", "client-key-data")):  # fmt: skip
            path = files[name] = workdir / name
            path.write_bytes(base64.b64decode((cluster if name == "ca.crt" else user)[key]))
            path.chmod(0o600)
        ca = KeyPair(files["ca.crt"], files["ca.crt"])
        return cls(cluster["server"], ca, KeyPair(files["client.crt"], files["client.key"]), timeout)

    def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, str]:
        """One request; returns (status, body text). Connection errors propagate as OSError."""
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._tls)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    def json(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (),
    ) -> Any:
        """A request whose 2xx (or `ok`) answer is JSON; anything else raises ApiError."""
        status, text = self.call(method, path, body, content_type)
        if not (200 <= status < 300 or status in ok):
            raise ApiError(status, method, path, text)
        return json.loads(text) if text else None

    def get(self, path: str) -> Any:
        return self.json("GET", path)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.json("PATCH", path, body, "application/merge-patch+json")
