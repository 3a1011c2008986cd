"""A loopback fake of the CVM instance metadata service: identity, spot reclaim, CAM role keys.

It answers like the documented service (text/plain values under
``/latest/meta-data/``, a 404 for what does not exist, the spot termination
time as ``%Y-%m-%d %H:%M:%S`` in UTC+8), and can be told to misbehave:
``fault = "slow"`` (stalls ``slow_seconds``, longer than the daemon's 1 s
timeout, bounded), ``"down"`` (503 to everything), ``"garbage"`` (random
bytes with 200) or ``"html"`` (a captive portal's HTML page with 200).
``requests`` counts the served paths.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from email.utils import formatdate
from typing import Literal

from testkit.fake_tencent_api import FakeTencentCloud
from testkit.loopback import LoopbackHTTPServer, Reply, Request

Fault = Literal["slow", "down", "garbage", "html"]
META = "/latest/meta-data/"
UTC_PLUS_8 = timezone(timedelta(hours=8))
CAPTIVE_PAGE = (
    b"<!DOCTYPE html><html><head><title>Sign in</title></head>"
    b"<body><h1>Wi-Fi login required</h1><form action='/login'></form></body></html>"
)


def tencent_time(at_unix: float) -> str:
    """``at_unix`` the way ``spot/termination-time`` serves it: UTC+8, no zone marker."""
    return datetime.fromtimestamp(at_unix, UTC_PLUS_8).strftime("%Y-%m-%d %H:%M:%S")


class FakeMetadata(LoopbackHTTPServer):
    """The CVM metadata service of one instance.

    Every credential fetch mints a new SecretId/SecretKey/Token valid for
    ``ttl`` seconds and registers it with the API fake (when there is one).
    ``charge_type=None`` makes ``payment/charge-type`` a 404.
    """

    def __init__(
        self,
        cloud: FakeTencentCloud | None = None,
        *,
        region: str = "ap-shanghai",
        zone: str = "ap-shanghai-5",
        instance_id: str = "ins-a1b2c3d4",
        instance_type: str = "GT4.41XLARGE948",
        charge_type: str | None = "SPOTPAID",
        role: str = "trainmon-puller",
        ttl: float = 7200.0,
    ) -> None:
        self.cloud = cloud
        self.region = region
        self.zone = zone
        self.instance_id = instance_id
        self.instance_type = instance_type
        self.charge_type = charge_type
        self.role = role
        self.ttl = ttl
        self.fault: Fault | None = None
        #: How long ``fault = "slow"`` stalls an answer (seconds).
        self.slow_seconds = 2.5
        #: The served text of ``spot/termination-time``; None: 404 (no reclaim).
        self.termination_time: str | None = None
        self.fetches = 0
        self.issued: list[str] = []
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        super().__init__(self._answer)

    # -- scenario ----------------------------------------------------------------

    def schedule_reclaim(self, at_unix: float) -> None:
        """Announce a reclaim at ``at_unix`` (served in UTC+8, as Tencent does)."""
        self.termination_time = tencent_time(at_unix)

    def cancel_reclaim(self) -> None:
        self.termination_time = None

    def served(self, path: str) -> int:
        """How often ``path`` (under ``/latest/meta-data/``) was requested."""
        with self._lock:
            return self.requests[META + path]

    # -- answers -----------------------------------------------------------------

    def get(self, path: str) -> tuple[int, bytes]:
        values = {
            "instance-id": self.instance_id,
            "placement/region": self.region,
            "placement/zone": self.zone,
            "instance/instance-type": self.instance_type,
            "payment/charge-type": self.charge_type,
            "spot/termination-time": self.termination_time,
            "cam/security-credentials/": self.role,
        }
        name = path.removeprefix(META) if path.startswith(META) else None
        if name is not None and values.get(name) is not None:
            return 200, str(values[name]).encode()
        if name == f"cam/security-credentials/{self.role}":
            return 200, self._credential()
        return 404, b"404 - Not Found"

    def _credential(self) -> bytes:
        self.fetches += 1
        secret_id = f"AKIDtmp{self.fetches:04d}"
        secret_key, token = uuid.uuid4().hex, uuid.uuid4().hex
        now = time.time()
        if self.cloud is not None:
            self.cloud.add_account(secret_id, secret_key, token)
            now = self.cloud.clock()
        self.issued.append(secret_id)
        expires = int(now + self.ttl)
        return json.dumps({
            "TmpSecretId": secret_id, "TmpSecretKey": secret_key, "Token": token,
            "ExpiredTime": expires, "Expiration": formatdate(expires, usegmt=True),
            "Code": "Success",
        }).encode()

    def _answer(self, request: Request) -> Reply:
        with self._lock:
            self.requests[request.path] += 1
        fault = self.fault
        if fault == "down":
            return Reply.text("503 Service Temporarily Unavailable", status=503)
        if fault == "garbage":
            return Reply(200, os.urandom(48), "application/octet-stream")
        if fault == "html":
            return Reply(200, CAPTIVE_PAGE, "text/html; charset=utf-8")
        status, body = self.get(request.path)
        delay = self.slow_seconds if fault == "slow" else 0.0
        content_type = "text/plain" if status == 200 else "text/html"
        if request.path.endswith(f"security-credentials/{self.role}"):
            content_type = "application/json"
        return Reply(status, body, content_type, delay=delay)
