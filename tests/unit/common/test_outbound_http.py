# SPDX-License-Identifier: Apache-2.0
"""Outbound HTTP (common/outbound.py) against real local servers: a 3xx is a
counted failure and the bearer token never reaches where it points (webhook,
Alertmanager, kubelet); loopback is never reached through http_proxy
(`jitterscope query` to the worker's /query page, with its token)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import REGISTRY

from jitterscope.collector.kubelet import KubeletPods, PodMeta
from jitterscope.common import outbound
from jitterscope.common.settings import load
from jitterscope.streams import notify
from jitterscope.streams.worker_state import state_file
from tests.unit.streams.test_alert_groups import alert

TOKEN = "tok-0123456789abcdef"
PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "all_proxy",
              "ALL_PROXY")


class Server:
    """A local server (port 0) that records (method, path, headers) of every
    request and answers ``status`` (with ``Location: location`` for a 3xx),
    or ``body`` with 200."""

    def __init__(self, status: int = 200, location: str = "", body: bytes = b"{}"):
        self.requests: list[tuple[str, str, dict]] = []
        self.status = status
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server_self.requests.append((self.command, self.path, dict(self.headers)))
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                payload = body if status == 200 else b""
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Server()
    yield server
    server.close()


@pytest.fixture(params=[301, 302, 303, 307, 308])
def redirector(request, receiver):
    """Answers every request with a redirect to ``receiver`` (another port)."""
    server = Server(request.param, location=f"{receiver.url}/stolen")
    yield server
    server.close()


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# -- the opener ----------------------------------------------------------------

def test_the_opener_refuses_a_redirect_and_sends_nothing_on(redirector, receiver):
    request = urllib.request.Request(redirector.url + "/x", headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(outbound.RedirectRefused) as caught:
        outbound.opener().open(request, timeout=5)
    assert caught.value.code == redirector.status
    assert isinstance(caught.value, OSError)  # callers' `except OSError` counts it
    assert len(redirector.requests) == 1 and receiver.requests == []


def test_loopback_is_reached_directly_whatever_http_proxy_says(monkeypatch, receiver):
    proxy = Server()
    try:
        for var in PROXY_VARS:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("http_proxy", proxy.url)
        for proxies in (True, False):
            with outbound.opener(proxies=proxies).open(receiver.url + "/direct", timeout=5) as answer:
                answer.read()
        assert [path for _, path, _ in receiver.requests] == ["/direct", "/direct"]
        assert proxy.requests == []
        # elsewhere, the environment's proxy still applies (an egress proxy for Slack, say)
        with outbound.opener().open("http://hooks.example.invalid/x", timeout=5) as answer:
            answer.read()
        assert [path for _, path, _ in proxy.requests] == ["http://hooks.example.invalid/x"]
    finally:
        proxy.close()


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("10.0.0.1", False),
                                            ("hooks.slack.com", False), ("", False), (None, False)])
def test_is_loopback(host, loopback):
    assert outbound.is_loopback(host) is loopback


# -- notification targets --------------------------------------------------------

def test_webhook_does_not_follow_a_redirect_with_its_token_and_counts_a_failure(redirector, receiver):
    name = f"unit-redirect-{redirector.server.server_port}"
    target = notify.Target(name, redirector.url + "/hook", notify.webhook_body,
                           headers={"Authorization": f"Bearer {TOKEN}"}, retries=3, backoff_base_s=0.01,
                           backoff_cap_s=0.02)
    try:
        target.offer([alert(1)])
        assert wait_for(lambda: sample("jitterscope_streams_notifications_failed_total", target=name) == 1)
        time.sleep(0.2)  # room for a (wrong) retry or a late follow
        assert sample("jitterscope_streams_notifications_sent_total", target=name) == 0
        assert len(redirector.requests) == 1, "a redirect is not retried: it would redirect again"
        assert redirector.requests[0][2]["Authorization"] == f"Bearer {TOKEN}"
        assert receiver.requests == [], "the token went where the redirect pointed"
    finally:
        target.close(0.5)


def test_alertmanager_and_webhook_from_settings_refuse_redirects(tmp_path, receiver):
    redirector = Server(302, location=f"{receiver.url}/api/v2/alerts")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    before = {t: sample("jitterscope_streams_notifications_failed_total", target=t)
              for t in ("alertmanager", "webhook")}
    n = notify.Notifier.from_settings(load(data_dir=tmp_path, alertmanager_url=redirector.url,
                                           webhook_url=redirector.url + "/hook", webhook_token_file=token,
                                           notify_retries=1))
    try:
        n.offer([alert(1)])
        for t in ("alertmanager", "webhook"):
            assert wait_for(lambda: sample("jitterscope_streams_notifications_failed_total", target=t)
                            == before[t] + 1), t
        assert sorted(path for _, path, _ in redirector.requests) == ["/api/v2/alerts", "/hook"]
        assert receiver.requests == []
    finally:
        n.close()
        redirector.close()


# -- the kubelet -----------------------------------------------------------------

def test_kubelet_does_not_follow_a_redirect_with_the_service_account_token(redirector, receiver, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    before = sample("jitterscope_kubelet_errors_total")
    pods = KubeletPods(redirector.url, token)
    assert pods.lookup("12345678-1234-4234-8234-123456789012") == PodMeta()
    assert sample("jitterscope_kubelet_errors_total") == before + 1
    assert len(redirector.requests) == 1 and receiver.requests == []


def test_kubelet_ignores_http_proxy_and_logs_no_password(monkeypatch, receiver, tmp_path, caplog):
    proxy = Server()
    try:
        for var in PROXY_VARS:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("http_proxy", proxy.url)
        monkeypatch.setenv("https_proxy", proxy.url)
        receiver_port = receiver.server.server_port
        pods = KubeletPods(f"http://127.0.0.1:{receiver_port}", None)
        assert pods.lookup("12345678-1234-4234-8234-123456789012") == PodMeta()  # {} is no pod list
        assert [path for _, path, _ in receiver.requests] == ["/pods"] and proxy.requests == []
        with caplog.at_level("WARNING", logger="jitterscope.collector.kubelet"):
            KubeletPods("http://127.0.0.1:1/?token=hunter2", None).lookup("12345678-1234-4234-8234-123456789012")
        assert caplog.records and "hunter2" not in json.dumps([r.__dict__ for r in caplog.records], default=str)
    finally:
        proxy.close()


# -- `jitterscope query` to the worker ---------------------------------------------

def test_query_to_the_worker_ignores_http_proxy(tmp_path):
    """The CLI as a user runs it, with http_proxy set: the worker's /query
    token must go straight to the worker, never to the proxy."""
    worker = Server(body=json.dumps({"columns": ["one"], "rows": [[1]]}).encode())
    proxy = Server(body=json.dumps({"columns": ["one"], "rows": [[1]]}).encode())  # would answer, too
    try:
        state_file(tmp_path).write_text(json.dumps({"pid": os.getpid(), "port": worker.server.server_port,
                                                    "token": TOKEN, "bind": "127.0.0.1"}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_") and k not in PROXY_VARS}
        env.update(JITTERSCOPE_DATA_DIR=str(tmp_path), http_proxy=proxy.url, HTTP_PROXY=proxy.url)
        result = subprocess.run([sys.executable, "-m", "jitterscope.cli", "query", "-f", "csv", "SELECT 1 AS one"],
                                env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["one", "1"]
        assert proxy.requests == [], "the worker's token went through http_proxy"
        assert [(m, p, h["Authorization"]) for m, p, h in worker.requests] == [("POST", "/query", f"Bearer {TOKEN}")]
    finally:
        worker.close()
        proxy.close()
