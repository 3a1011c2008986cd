"""A loopback notification sink for ``make stack``: pages land in the terminal.

``alerts/retarget_receivers.py`` points every receiver of the shipped
Alertmanager configuration at this sink (``BASE/<receiver>/<kind>``), so the
trial shows which alert would page whom without contacting any real system.
It understands the two payloads the shipped receivers send:

- the Alertmanager webhook payload (``{"alerts": [...]}``), one line per
  notification: the labels its alerts share, then what tells each apart (a
  training job's page lists its GPUs: ``gpu=0 rank=0; gpu=1 rank=1; …``);
- WeCom application messages (``{"text": {"content": ...}}``), first line shown;
  WeCom's ``gettoken`` call is answered with a token so Alertmanager goes on.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

#: The answer to every request: a webhook ignores it, WeCom's API reads it.
WECOM_OK = {"errcode": 0, "errmsg": "ok", "access_token": "trainmon-stack", "expires_in": 7200}
MAX_BODY_BYTES = 1 << 20
#: Labels worth a place on the one-line summary, in this order.
SUMMARY_LABELS = ("job", "owner", "node", "instance", "gpu", "rank", "instance_id", "severity")


def describe(path: str, body: bytes) -> list[str]:
    """One line per notification found in a request to ``path``."""
    receiver = "/".join(part for part in path.split("?")[0].split("/") if part)
    try:
        payload = json.loads(body) if body else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return [f"{receiver}: {len(body)} bytes that are not JSON"]
    if not isinstance(payload, dict):
        return []
    if isinstance(payload.get("alerts"), list):
        alerts = [alert for alert in payload["alerts"] if isinstance(alert, dict)]
        return [_notification_line(receiver, payload, alerts)] if alerts else []
    text = payload.get("text")
    if isinstance(text, dict) and isinstance(text.get("content"), str):
        first = next((line for line in text["content"].splitlines() if line.strip()), "")
        return [f"{receiver}: {first.strip()}"]
    return []


def _notification_line(
    receiver: str, payload: Mapping[str, Any], alerts: Sequence[Mapping[str, Any]]
) -> str:
    """``pager/webhook: FIRING TrainmonGPUSawtooth (job=…, severity=critical)``, and
    for several alerts ``: 4 alerts: gpu=0 rank=0; gpu=1 rank=1; …``."""
    labels = [alert.get("labels") or {} for alert in alerts]
    shared = {key: value for key, value in labels[0].items()
              if all(other.get(key) == value for other in labels[1:])}
    names = sorted({str(each.get("alertname", "?")) for each in labels})
    status = str(payload.get("status") or alerts[0].get("status", "?")).upper()
    line = f"{receiver}: {status} {', '.join(names)} ({_shown(shared, set())})"
    if len(alerts) > 1:
        line += f": {len(alerts)} alerts: " + "; ".join(
            _shown(each, set(shared), separator=" ", keys=("alertname", *SUMMARY_LABELS))
            for each in labels)
    return line


def _shown(labels: Mapping[str, Any], left_out: set[str], separator: str = ", ",
           keys: tuple[str, ...] = SUMMARY_LABELS) -> str:
    return separator.join(f"{key}={labels[key]}" for key in keys
                          if key in labels and key not in left_out)


class NotificationSink:
    """An HTTP server on 127.0.0.1 (port chosen by the kernel) reporting what it gets."""

    def __init__(self, report: Callable[[str], None]) -> None:
        self._report = report
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # WeCom's gettoken
                self._answer()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, MAX_BODY_BYTES))
                for line in describe(self.path, body):
                    sink._report(line)
                self._answer()

            def _answer(self) -> None:
                data = json.dumps(WECOM_OK).encode()
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("sink: " + format, *args)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="notification-sink", daemon=True
        )

    @property
    def url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
