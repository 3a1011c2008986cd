"""Real Prometheus and Alertmanager processes on loopback, and a webhook sink.

The binaries are the distribution's (Debian ``prometheus`` and
``prometheus-alertmanager``, installed by ``make test``). The sink records
every notification Alertmanager sends and also answers 企业微信 (WeCom)'s two
API calls (``gettoken``, ``message/send``), so the native WeCom integration of
the shipped configuration is exercised as well.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from support.daemon import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ALERTMANAGER = (
    shutil.which("prometheus-alertmanager")
    or shutil.which("alertmanager")
    or "/usr/bin/prometheus-alertmanager"
)
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"


def require(binary: str) -> str:
    """``binary`` if it exists; else an AssertionError that says how to install it."""
    if not Path(binary).exists():
        raise AssertionError(
            f"{binary} is missing: install Debian's prometheus and prometheus-alertmanager "
            "packages (`make debian-packages`)"
        )
    return binary


def http_json(method: str, url: str, body: object | None = None, timeout: float = 10.0) -> Any:
    """Send ``body`` as JSON (if any) and decode the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class _Process:
    """A loopback server process with a readiness URL and a log file."""

    name = "process"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, command: Sequence[str], ready_path: str, timeout: float) -> None:
        self.process = subprocess.Popen(
            list(command), stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + ready_path, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not ready in {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Prometheus(_Process):
    """Prometheus with ``config`` (a mapping written to prometheus.yml) and tmp storage."""

    name = "prometheus"

    def start(self, config: Mapping[str, Any], timeout: float = 30.0) -> Prometheus:
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self._start(
            [
                require(PROMETHEUS),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--rules.alert.resend-delay=5s",
                "--log.level=warn",
            ],
            "/-/ready",
            timeout,
        )
        return self

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        body = http_json("GET", url)
        assert body["status"] == "success", body
        return list(body["data"]["result"])


class Alertmanager(_Process):
    """Alertmanager with the configuration file ``config_path``; HA clustering off."""

    name = "alertmanager"

    def start(self, config_path: Path, timeout: float = 30.0) -> Alertmanager:
        self._start(
            [
                require(ALERTMANAGER),
                f"--config.file={config_path}",
                f"--storage.path={self.workdir / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            "/-/ready",
            timeout,
        )
        return self

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        http_json("POST", f"{self.url}/api/v2/alerts", list(alerts))

    def alerts(self) -> list[dict[str, Any]]:
        return list(http_json("GET", f"{self.url}/api/v2/alerts"))


@dataclass(frozen=True)
class Notification:
    """One request Alertmanager made to the sink."""

    path: str
    body: Any


class WebhookSink:
    """A loopback HTTP server that records notifications (and fakes WeCom's API)."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # WeCom: GET <api_url>gettoken?corpid=..&corpsecret=..
                path = urllib.parse.urlparse(self.path).path
                if path.endswith("/gettoken"):
                    self._answer({"errcode": 0, "errmsg": "ok", "access_token": "test-token",
                                  "expires_in": 7200})
                else:
                    self._answer({"errcode": 404}, status=404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                path = urllib.parse.urlparse(self.path).path
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                with sink._lock:
                    sink.notifications.append(Notification(path, body))
                self._answer({"errcode": 0, "errmsg": "ok"})

            def _answer(self, payload: object, status: int = 200) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> WebhookSink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def received(self, path_prefix: str) -> list[Notification]:
        with self._lock:
            return [n for n in self.notifications if n.path.startswith(path_prefix)]
