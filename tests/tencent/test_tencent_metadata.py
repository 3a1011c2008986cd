"""Reading the CVM metadata service strictly: time zones, patterns, and each HTTP fault."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from testkit.daemon import free_port
from testkit.fake_tencent_metadata import FakeMetadata, tencent_time
from trainmon.tencent.metadata import (
    HTTPTransport,
    MetadataError,
    MetadataReply,
    TencentMetadata,
    parse_termination_time,
)

NOW = datetime(2018, 8, 18, 4, 3, 33, tzinfo=timezone.utc).timestamp()


def test_tencent_termination_time_is_utc_plus_8() -> None:
    # the documented example: 12:05:33 Beijing time is 04:05:33 UTC
    at = parse_termination_time("2018-08-18 12:05:33", NOW)
    assert at == datetime(2018, 8, 18, 4, 5, 33, tzinfo=timezone.utc).timestamp()
    assert at - NOW == 120


@pytest.mark.parametrize(
    "text",
    ["2018-08-18T04:05:33Z", "2018-08-18T12:05:33+08:00", "2018-08-18T04:05:33.000Z",
     "2018-08-17T23:05:33-05:00"],
)
def test_iso_termination_times_with_a_zone_are_accepted(text: str) -> None:
    assert parse_termination_time(text, NOW) == NOW + 120


@pytest.mark.parametrize(
    "text",
    [
        "2018-08-18T04:05:33",  # ISO without a zone: ambiguous
        "1534565133",  # Unix seconds: not a documented format
        "2018/08/18 12:05:33",
        "2018-13-45 12:05:33",  # well-shaped, impossible
        "2018-08-18 12:05:33 extra",
        "1970-01-01 08:00:00",  # absurdly far in the past
        "2099-01-01 00:00:00",  # absurdly far ahead
        "2018-08-18 10:00:00",  # two hours before "now": not this running instance
        "2018-08-20 12:05:33",  # two days ahead
    ],
)
def test_implausible_or_unknown_termination_times_are_invalid(text: str) -> None:
    with pytest.raises(MetadataError) as caught:
        parse_termination_time(text, NOW)
    assert caught.value.reason == "invalid"


def test_tencent_time_of_the_fake_round_trips() -> None:
    at = float(int(time.time()) + 120)
    assert parse_termination_time(tencent_time(at), time.time()) == at


class Canned:
    """A transport answering fixed replies per path (the unit under test is the validation)."""

    def __init__(self, replies: dict[str, MetadataReply]) -> None:
        self.replies = replies

    def get(self, path: str) -> MetadataReply:
        return self.replies.get(path, MetadataReply(404, b"not found", "text/html"))


def identity_replies(**overrides: bytes) -> dict[str, MetadataReply]:
    values = {
        "instance-id": b"ins-3g445roi\n",
        "placement/region": b"ap-guangzhou",
        "placement/zone": b"ap-guangzhou-3",
        "instance/instance-type": b"HCCPNV4h.32XLARGE1280",
        "payment/charge-type": b"POSTPAID_BY_HOUR",
        **overrides,
    }
    return {path: MetadataReply(200, body) for path, body in values.items()}


def test_identity_of_the_documented_examples() -> None:
    identity = TencentMetadata(Canned(identity_replies()), time.time).identity()
    assert (identity.instance_id, identity.region, identity.zone) == (
        "ins-3g445roi", "ap-guangzhou", "ap-guangzhou-3")
    assert identity.instance_type == "HCCPNV4h.32XLARGE1280"
    assert identity.spot is False
    spot = TencentMetadata(
        Canned(identity_replies(**{"payment/charge-type": b"SPOTPAID"})), time.time
    ).identity()
    assert spot.spot is True


def test_missing_optional_entries_are_unknown_not_errors() -> None:
    replies = identity_replies()
    del replies["instance/instance-type"], replies["payment/charge-type"]
    identity = TencentMetadata(Canned(replies), time.time).identity()
    assert identity.instance_type is None and identity.spot is None


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("instance-id", b"<html><body>login</body></html>"),
        ("instance-id", b"i-0123456789abcdef0"),  # an AWS id is not a CVM
        ("instance-id", b"ins-3g445roi\nins-other00"),
        ("instance-id", b""),
        ("instance-id", "ins-3g445roï".encode()),
        ("instance-id", b"ins-" + b"a" * 2000),
        ("placement/region", b"AP-GUANGZHOU"),
        ("placement/zone", b"ap-shanghai-3"),  # not in the region
        ("placement/zone", b"ap-guangzhou"),
        ("instance/instance-type", b"GT4 41XLARGE948"),
        ("payment/charge-type", b"spot paid"),
    ],
)
def test_values_failing_their_pattern_are_invalid(path: str, body: bytes) -> None:
    metadata = TencentMetadata(Canned(identity_replies(**{path: body})), time.time)
    with pytest.raises(MetadataError) as caught:
        metadata.identity()
    assert caught.value.reason == "invalid"


def test_a_200_html_page_is_rejected_even_if_its_text_would_match() -> None:
    replies = identity_replies()
    replies["instance-id"] = MetadataReply(200, b"ins-3g445roi", "text/html; charset=utf-8")
    with pytest.raises(MetadataError, match="HTML") as caught:
        TencentMetadata(Canned(replies), time.time).identity()
    assert caught.value.reason == "invalid"


def test_a_404_where_a_value_is_required_is_an_http_status_error() -> None:
    replies = identity_replies()
    del replies["placement/zone"]
    with pytest.raises(MetadataError) as caught:
        TencentMetadata(Canned(replies), time.time).identity()
    assert caught.value.reason == "http_status"


# -- the HTTP layer against the loopback fake -------------------------------------------


def test_http_transport_reads_the_fake_and_its_404() -> None:
    with FakeMetadata() as fake:
        metadata = TencentMetadata(HTTPTransport(fake.url, 1.0), time.time)
        assert metadata.identity().zone == "ap-shanghai-5"
        assert metadata.termination_time() is None
        at = float(int(time.time()) + 120)
        fake.schedule_reclaim(at)
        assert metadata.termination_time() == at
        assert fake.served("spot/termination-time") == 2


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("slow", "timeout"), ("down", "http_status"), ("garbage", "invalid"), ("html", "invalid")],
)
def test_http_faults_map_to_their_reason(fault: str, reason: str) -> None:
    with FakeMetadata() as fake:
        fake.fault = fault  # type: ignore[assignment]
        fake.slow_seconds = 1.0
        metadata = TencentMetadata(HTTPTransport(fake.url, 0.3), time.time)
        started = time.monotonic()
        with pytest.raises(MetadataError) as caught:
            metadata.termination_time() if fault != "garbage" else metadata.instance_id()
        assert caught.value.reason == reason
        assert time.monotonic() - started < 0.9  # the timeout, not the stall, bounds it


def test_a_garbage_termination_time_is_invalid_not_a_reclaim() -> None:
    with FakeMetadata() as fake:
        fake.fault = "garbage"
        with pytest.raises(MetadataError) as caught:
            TencentMetadata(HTTPTransport(fake.url, 1.0), time.time).termination_time()
        assert caught.value.reason == "invalid"


def test_connection_refused_is_unreachable() -> None:
    metadata = TencentMetadata(HTTPTransport(f"http://127.0.0.1:{free_port()}", 0.5), time.time)
    with pytest.raises(MetadataError) as caught:
        metadata.instance_id()
    assert caught.value.reason == "unreachable"
