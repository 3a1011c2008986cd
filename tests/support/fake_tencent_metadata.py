"""A loopback fake of the CVM instance metadata service (region, CAM role keys)."""

from __future__ import annotations

import json
import uuid
from email.utils import formatdate

from tests.support.fake_tencent_api import FakeTencentCloud
from tests.support.loopback import LoopbackHTTPServer, Reply, Request


class FakeMetadata(LoopbackHTTPServer):
    """The CVM metadata service: region, CAM role and its temporary credentials.

    Every credential fetch mints a new SecretId/SecretKey/Token valid for
    ``ttl`` seconds and registers it with the API fake.
    """

    def __init__(self, cloud: FakeTencentCloud, *, region: str = "ap-shanghai",
                 role: str = "trainmon-puller", ttl: float = 7200.0) -> None:
        self.cloud = cloud
        self.region = region
        self.role = role
        self.ttl = ttl
        self.fetches = 0
        self.issued: list[str] = []
        super().__init__(self._answer)

    def get(self, path: str) -> tuple[int, bytes]:
        if path == "/latest/meta-data/placement/region":
            return 200, self.region.encode()
        if path == "/latest/meta-data/cam/security-credentials/":
            return 200, self.role.encode()
        if path == f"/latest/meta-data/cam/security-credentials/{self.role}":
            self.fetches += 1
            secret_id = f"AKIDtmp{self.fetches:04d}"
            secret_key, token = uuid.uuid4().hex, uuid.uuid4().hex
            self.cloud.add_account(secret_id, secret_key, token)
            self.issued.append(secret_id)
            expires = int(self.cloud.clock() + self.ttl)
            return 200, json.dumps({
                "TmpSecretId": secret_id, "TmpSecretKey": secret_key, "Token": token,
                "ExpiredTime": expires, "Expiration": formatdate(expires, usegmt=True),
                "Code": "Success",
            }).encode()
        return 404, b"not found"

    def _answer(self, request: Request) -> Reply:
        status, body = self.get(request.path)
        return Reply(status, body)
