"""The two API calls the SDK needs (read and merge-patch its own pod), over the standard library."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from gpuq.sdk.context import PodContext, SdkError

TIMEOUT_SECONDS = 10.0


def _ssl(ctx: PodContext) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ctx.ca_file) if ctx.ca_file else None)


def _call(ctx: PodContext, method: str, body: Any = None) -> dict[str, Any]:
    url = f"{ctx.server}/api/v1/namespaces/{ctx.namespace}/pods/{ctx.pod}"
    headers = {"Authorization": f"Bearer {ctx.token()}", "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/merge-patch+json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_SECONDS, context=_ssl(ctx)) as resp:
            out: dict[str, Any] = json.loads(resp.read() or b"{}")
            return out
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            detail = json.loads(detail).get("message", detail)
        hint = " (see the RBAC in docs/failover.md)" if exc.code in (401, 403) else ""
        raise SdkError(f"{method} pod {ctx.namespace}/{ctx.pod}: HTTP {exc.code}: {detail}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SdkError(f"{method} pod {ctx.namespace}/{ctx.pod}: cannot reach {ctx.server}: {exc}") from None


def get_pod(ctx: PodContext) -> dict[str, Any]:
    return _call(ctx, "GET")


def annotate_pod(ctx: PodContext, annotations: dict[str, str]) -> dict[str, Any]:
    return _call(ctx, "PATCH", {"metadata": {"annotations": annotations}})
