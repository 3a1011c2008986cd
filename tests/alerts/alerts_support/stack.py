"""Real Alertmanager on loopback (beside ``testkit.prometheus``), and a webhook sink.

The binaries are the distribution's (Debian ``prometheus`` and
``prometheus-alertmanager``, installed by ``make test``). The sink records
every notification Alertmanager sends and also answers 企业微信 (WeCom)'s two
API calls (``gettoken``, ``message/send``), so the native WeCom integration of
the shipped configuration is exercised as well.
"""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from testkit.prometheus import LoopbackProcess, require

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ALERTMANAGER = (
    shutil.which("prometheus-alertmanager")
    or shutil.which("alertmanager")
    or "/usr/bin/prometheus-alertmanager"
)
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
#: Prometheus flags of the alerting tests: re-send firing alerts quickly.
ALERTING_PROMETHEUS_FLAGS = ("--rules.alert.resend-delay=5s",)


def http_json(method: str, url: str, body: object | None = None, timeout: float = 10.0) -> Any:
    """Send ``body`` as JSON (if any) and decode the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


class Alertmanager(LoopbackProcess):
    """Alertmanager with the configuration file ``config_path``; HA clustering off."""

    name = "alertmanager"

    def start(self, config_path: Path, timeout: float = 30.0) -> Alertmanager:
        self.start_process(
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


class WebhookSink(LoopbackHTTPServer):
    """A loopback HTTP server that records notifications (and fakes WeCom's API)."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self._lock = threading.Lock()
        super().__init__(self._answer)

    def received(self, path_prefix: str) -> list[Notification]:
        with self._lock:
            return [n for n in self.notifications if n.path.startswith(path_prefix)]

    def paged(self, alertname: str | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(notification payload, alert) of every alert the pager webhook received
        (only ``alertname``'s when given)."""
        return [
            (notification.body, alert)
            for notification in self.received("/pager/")
            for alert in notification.body["alerts"]
            if alertname is None or alert["labels"]["alertname"] == alertname
        ]

    def _answer(self, request: Request) -> Reply:
        path = urllib.parse.urlparse(request.path).path
        if request.method == "GET":  # WeCom: GET <api_url>gettoken?corpid=..&corpsecret=..
            if path.endswith("/gettoken"):
                return Reply.json({"errcode": 0, "errmsg": "ok", "access_token": "test-token",
                                   "expires_in": 7200})
            return Reply.json({"errcode": 404}, status=404)
        try:
            body: Any = json.loads(request.body)
        except ValueError:
            body = request.body.decode(errors="replace")
        with self._lock:
            self.notifications.append(Notification(path, body))
        return Reply.json({"errcode": 0, "errmsg": "ok"})
