"""TC3-HMAC-SHA256 against Tencent's published example and the official SDK."""

from __future__ import annotations

import json
import time

import pytest
from tencentcloud.common.common_client import CommonClient  # type: ignore[import-untyped]
from tencentcloud.common.credential import Credential as SDKCredential  # type: ignore[import-untyped]
from tencentcloud.common.profile.client_profile import ClientProfile  # type: ignore[import-untyped]
from tencentcloud.common.profile.http_profile import HttpProfile  # type: ignore[import-untyped]

from testkit.fake_tencent_api import FakeTencentCloud
from tests.tencent.tencent_support import SECRET_ID, SECRET_KEY
from trainmon.tencent import signer

# The worked example of "Signature v3" in the Tencent Cloud API documentation:
# DescribeInstances on cvm.tencentcloudapi.com at 1551113065 (2019-02-26 00:44:25
# in UTC+8, but 2019-02-25 in UTC — the date in the scope must be UTC).
EXAMPLE_ID = "AKIDz8krbsJ5yKBZQpn74WFkmLPx3EXAMPLE"
EXAMPLE_KEY = "Gu5t9xGARNpq86cd98joQYCN3EXAMPLE"
EXAMPLE_PAYLOAD = (
    b'{"Limit": 1, "Filters": [{"Values": ["\\u672a\\u547d\\u540d"], "Name": "instance-name"}]}'
)
EXAMPLE_TIMESTAMP = 1551113065


def test_published_example_step_by_step() -> None:
    canonical = signer.canonical_request(
        method="POST",
        query="",
        content_type="application/json; charset=utf-8",
        host="cvm.tencentcloudapi.com",
        payload=EXAMPLE_PAYLOAD,
    )
    assert canonical == (
        "POST\n/\n\ncontent-type:application/json; charset=utf-8\n"
        "host:cvm.tencentcloudapi.com\n\ncontent-type;host\n"
        "35e9c5b0e3ae67532d3c9f17ead6c90222632e5b1ff7f6e89887f1398934f064"
    )
    scope = signer.credential_scope(EXAMPLE_TIMESTAMP, "cvm")
    assert scope == "2019-02-25/cvm/tc3_request"
    to_sign = signer.string_to_sign(timestamp=EXAMPLE_TIMESTAMP, scope=scope, canonical=canonical)
    assert to_sign == (
        "TC3-HMAC-SHA256\n1551113065\n2019-02-25/cvm/tc3_request\n"
        "5ffe6a04c0664d6b969fab9a13bdab201d63ee709638e2749d62a09ca18d7031"
    )
    assert signer.signature(EXAMPLE_KEY, "2019-02-25", "cvm", to_sign) == (
        "72e494ea809ad7a8c8f7a4507b9bddcbaa8e581f516e8da2f66e2c5a96525168"
    )


def test_published_example_authorization_header() -> None:
    assert signer.authorization(
        secret_id=EXAMPLE_ID,
        secret_key=EXAMPLE_KEY,
        service="cvm",
        host="cvm.tencentcloudapi.com",
        payload=EXAMPLE_PAYLOAD,
        timestamp=EXAMPLE_TIMESTAMP,
    ) == (
        "TC3-HMAC-SHA256 Credential=AKIDz8krbsJ5yKBZQpn74WFkmLPx3EXAMPLE/2019-02-25/cvm/"
        "tc3_request, SignedHeaders=content-type;host, "
        "Signature=72e494ea809ad7a8c8f7a4507b9bddcbaa8e581f516e8da2f66e2c5a96525168"
    )


def test_scope_date_is_utc_across_midnight() -> None:
    # 23:59:59 and 00:00:00 UTC fall on different dates whatever the local zone.
    assert signer.credential_scope(1_700_006_399, "monitor").startswith("2023-11-14/")
    assert signer.credential_scope(1_700_006_400, "monitor").startswith("2023-11-15/")


def test_token_travels_as_header_outside_the_signature() -> None:
    common = dict(
        secret_id="AKIDtmp", secret_key="key", service="monitor", host="h", action="A",
        version="2018-07-24", region="ap-shanghai", payload=b"{}", timestamp=1_700_000_000,
    )
    with_token = signer.signed_headers(token="session-token", **common)  # type: ignore[arg-type]
    without = signer.signed_headers(token=None, **common)  # type: ignore[arg-type]
    assert with_token["X-TC-Token"] == "session-token"
    assert "X-TC-Token" not in without
    assert with_token["Authorization"] == without["Authorization"]


@pytest.mark.parametrize(
    ("action", "params"),
    [
        ("DescribeBaseMetrics", {"Namespace": "QCE/CVM"}),
        ("GetMonitorData", {
            "Namespace": "QCE/CVM", "MetricName": "CpuUsage", "Period": 60,
            "StartTime": "2023-11-14T22:00:00+00:00", "EndTime": "2023-11-14T22:05:00+00:00",
            "Instances": [{"Dimensions": [{"Name": "InstanceId", "Value": "ins-未命名"}]}],
        }),
    ],
)
def test_matches_the_official_sdk_signer(
    cloud: FakeTencentCloud, action: str, params: dict[str, object]
) -> None:
    """The official SDK signs a real request; trainmon's signer must produce the same header."""
    cloud.clock = time.time  # the SDK signs with the real time
    profile = ClientProfile(httpProfile=HttpProfile(protocol="http", endpoint=cloud.url[7:]))
    client = CommonClient("monitor", "2018-07-24", SDKCredential(SECRET_ID, SECRET_KEY),
                          "ap-shanghai", profile)
    client.call_json(action, params)  # the fake accepted the SDK's signature
    sent = cloud.records[-1]
    assert sent.code is None
    assert json.loads(sent.body) == params
    ours = signer.authorization(
        secret_id=SECRET_ID,
        secret_key=SECRET_KEY,
        service="monitor",
        host=sent.headers["host"],
        payload=sent.body,
        timestamp=int(sent.headers["x-tc-timestamp"]),
        content_type=sent.headers["content-type"],
    )
    assert ours == sent.headers["authorization"]
