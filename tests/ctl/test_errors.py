"""The CLI's failures read as one line with an exit code, never a traceback, and come at once: a
cluster that does not answer or hangs up (tried once, not retried), and a cluster without gpuq's
CRDs (a stand-in API server that knows no gpuq.dev group, as a real one answers 404 for an unknown
group)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def gpuq(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuq.cli", *args, "--kubeconfig", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


class NoGpuqGroup(BaseHTTPRequestHandler):
    """Empty lists for the core API; 404 for the gpuq.dev group and all under it."""

    def do_GET(self) -> None:
        missing = self.path.startswith("/apis/gpuq.dev")
        not_found = {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
        body = json.dumps(not_found if missing else {"kind": "List", "items": []})
        self.send_response(404 if missing else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: object) -> None:
        return None


@pytest.fixture
def crdless() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoGpuqGroup)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the socket is


@pytest.fixture
def hangs_up() -> Iterator[tuple[str, list[int]]]:
    """A server that accepts each connection and closes it unanswered; counts the connections."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        listener.close()


@pytest.mark.parametrize("args", [["queues"], ["jobs"], ["explain", "ns/job"], ["queues", "-o", "yaml"]])
def test_a_cluster_without_the_crds(tmp_path: Path, crdless: str, args: list[str]) -> None:
    out = gpuq(kubeconfig(tmp_path, crdless), *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr == (
        f"gpuq {args[0]}: the gpuq CRDs are not installed in this cluster: kubectl apply -k crds/\n"
    )


def test_a_cluster_that_does_not_answer(tmp_path: Path) -> None:
    server = f"http://127.0.0.1:{closed_port()}"
    out = gpuq(kubeconfig(tmp_path, server), "jobs")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"gpuq jobs: cannot reach the API server at {server}: ")
    assert out.stderr.count("\n") == 1


def test_a_server_that_hangs_up_is_tried_once(tmp_path: Path, hangs_up: tuple[str, list[int]]) -> None:
    server, accepted = hangs_up
    out = gpuq(kubeconfig(tmp_path, server), "queues")
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"gpuq queues: cannot reach the API server at {server}: ")
    assert out.stderr.count("\n") == 1 and len(accepted) == 1, (out.stderr, len(accepted))


def test_an_unknown_status_lists_the_valid_ones_and_exits_2(tmp_path: Path) -> None:
    """Issue 33: `gpuq jobs --status bogus` printed nothing and exited 0. Refused before any API call
    (the kubeconfig points nowhere)."""
    out = gpuq(kubeconfig(tmp_path, f"http://127.0.0.1:{closed_port()}"), "jobs", "--status", "bogus")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        "gpuq jobs: --status 'bogus' is not one of: pending, queued, admitted, running, recovering, "
        "preempted, suspended, succeeded, failed\n"
    )
