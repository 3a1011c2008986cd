"""The platform collector and its poller against the loopback metadata fake.

Each test drives ``poller.poll()`` by hand (the thread runs the same call in
a loop) with injected clocks, and asserts on the exposition text.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.daemon import free_port
from testkit.exposition import Scrape, scrape
from testkit.fake_tencent_metadata import FakeMetadata
from trainmon.collectors.platform import PlatformCollector
from trainmon.platform.config import PlatformConfig

INFO = "trainmon_node_info"
SPOT = "trainmon_node_spot_instance"
RECLAIM = "trainmon_node_spot_termination_timestamp_seconds"
UP = "trainmon_platform_metadata_up"
ERRORS = "trainmon_platform_metadata_errors_total"


class Clocks:
    """Wall clock and monotonic clock that tests move forward together."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))
        self.mono = 1000.0

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


@pytest.fixture
def fake() -> Iterator[FakeMetadata]:
    with FakeMetadata() as server:
        server.slow_seconds = 1.0
        yield server


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def collector(
    url: str, clocks: Clocks, sys_root: Path = Path("/nonexistent"), **settings: object
) -> PlatformCollector:
    config = PlatformConfig(metadata_url=url, timeout_seconds=0.3, **settings)  # type: ignore[arg-type]
    return PlatformCollector(config, sys_root, clock=clocks.wall, monotonic=clocks.monotonic)


def errors(result: Scrape) -> dict[str, float]:
    return {key[0]: value for key, value in result.series(ERRORS, "reason").items()}


def test_tencent_spot_instance_identity(fake: FakeMetadata, clocks: Clocks) -> None:
    platform = collector(fake.url, clocks, labels={"leaf": "leaf-07", "rack": "r12"})
    assert list(platform.collect()) == []  # nothing before the first detection
    platform.poller.poll()
    result = scrape(platform)
    assert result.labelsets(INFO) == [{
        "provider": "tencent", "instance_id": "ins-a1b2c3d4", "instance_type": "GT4.41XLARGE948",
        "region": "ap-shanghai", "zone": "ap-shanghai-5", "leaf": "leaf-07", "rack": "r12",
    }]
    assert result.value(INFO) == 1
    assert result.value(SPOT) == 1 and result.value(UP) == 1
    assert RECLAIM not in result.samples
    assert errors(result) == {"timeout": 0, "unreachable": 0, "http_status": 0, "invalid": 0}
    health = platform.health()
    assert health["provider"] == "tencent" and health["provider_source"] == "metadata"
    assert health["instance_id"] == "ins-a1b2c3d4" and health["last_success_age_seconds"] == 0


def test_not_spot_billing_and_unknown_billing(clocks: Clocks) -> None:
    with FakeMetadata(charge_type="POSTPAID_BY_HOUR") as fake:
        platform = collector(fake.url, clocks)
        platform.poller.poll()
        assert scrape(platform).value(SPOT) == 0
    with FakeMetadata(charge_type=None) as fake:
        platform = collector(fake.url, clocks)
        platform.poller.poll()
        assert SPOT not in scrape(platform).samples  # unknown: absent, never a guess
    with FakeMetadata(charge_type=None) as fake:
        platform = collector(fake.url, clocks, spot=True)
        platform.poller.poll()
        assert scrape(platform).value(SPOT) == 1  # the configuration override


def test_reclaim_scheduled_appears_and_cancelled_disappears(
    fake: FakeMetadata, clocks: Clocks
) -> None:
    platform = collector(fake.url, clocks)
    platform.poller.poll()
    fake.schedule_reclaim(clocks.now + 120)
    clocks.advance(5)
    platform.poller.poll()
    assert scrape(platform).value(RECLAIM) == clocks.now - 5 + 120
    fake.cancel_reclaim()
    clocks.advance(5)
    platform.poller.poll()
    assert RECLAIM not in scrape(platform).samples
    assert fake.served("spot/termination-time") == 3


def test_a_reclaim_makes_an_instance_of_unknown_billing_spot(clocks: Clocks) -> None:
    with FakeMetadata(charge_type=None) as fake:
        platform = collector(fake.url, clocks)
        fake.schedule_reclaim(clocks.now + 100)
        platform.poller.poll()
        result = scrape(platform)
        assert result.value(SPOT) == 1 and result.value(RECLAIM) == clocks.now + 100


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("slow", "timeout"), ("down", "http_status"), ("garbage", "invalid"), ("html", "invalid")],
)
def test_each_fault_is_counted_and_recovers(
    fake: FakeMetadata, clocks: Clocks, fault: str, reason: str
) -> None:
    platform = collector(fake.url, clocks)
    platform.poller.poll()
    fake.fault = fault  # type: ignore[assignment]
    for _ in range(2):
        clocks.advance(5)
        platform.poller.poll()
    result = scrape(platform)
    assert result.value(UP) == 0
    assert errors(result)[reason] == 2 and sum(errors(result).values()) == 2
    # identity is kept (an instance's id and zone do not change while it runs)
    assert result.labelsets(INFO)[0]["instance_id"] == "ins-a1b2c3d4"
    assert result.value(SPOT) == 1
    assert RECLAIM not in result.samples  # a failure never invents a reclaim
    health = platform.health()
    assert health["metadata_up"] is False and str(health["last_error"]).startswith(reason)
    assert health["last_success_age_seconds"] == 10
    fake.fault = None
    clocks.advance(5)
    platform.poller.poll()
    assert scrape(platform).value(UP) == 1
    assert platform.health()["last_success_age_seconds"] == 0


def test_a_failure_keeps_an_announced_reclaim_only_until_its_time(
    fake: FakeMetadata, clocks: Clocks
) -> None:
    platform = collector(fake.url, clocks)
    platform.poller.poll()
    at = clocks.now + 20
    fake.schedule_reclaim(at)
    clocks.advance(5)
    platform.poller.poll()
    fake.fault = "down"
    clocks.advance(5)
    platform.poller.poll()
    assert scrape(platform).value(RECLAIM) == at  # not silently turned into "no reclaim"
    clocks.advance(15)  # the announced time has passed
    platform.poller.poll()
    result = scrape(platform)
    assert RECLAIM not in result.samples and result.value(UP) == 0


def test_a_proxy_answering_404_everywhere_is_not_no_reclaim(
    fake: FakeMetadata, clocks: Clocks
) -> None:
    platform = collector(fake.url, clocks)
    platform.poller.poll()
    at = clocks.now + 60
    fake.schedule_reclaim(at)
    clocks.advance(5)
    platform.poller.poll()
    fake.instance_id = None  # type: ignore[assignment]  # everything 404 now
    fake.cancel_reclaim()
    clocks.advance(5)
    platform.poller.poll()
    result = scrape(platform)
    assert result.value(RECLAIM) == at and result.value(UP) == 0
    assert errors(result)["http_status"] == 1


def test_another_instance_answering_is_invalid(fake: FakeMetadata, clocks: Clocks) -> None:
    platform = collector(fake.url, clocks)
    platform.poller.poll()
    fake.instance_id = "ins-zzzz9999"
    clocks.advance(5)
    platform.poller.poll()
    result = scrape(platform)
    assert result.value(UP) == 0 and errors(result)["invalid"] == 1
    assert result.labelsets(INFO)[0]["instance_id"] == "ins-a1b2c3d4"


def test_identity_is_read_again_after_its_interval(fake: FakeMetadata, clocks: Clocks) -> None:
    platform = collector(fake.url, clocks, identity_interval_seconds=60)
    platform.poller.poll()
    for _ in range(11):
        clocks.advance(5)
        platform.poller.poll()
    assert fake.served("placement/zone") == 1
    clocks.advance(5)
    platform.poller.poll()
    assert fake.served("placement/zone") == 2
    assert fake.served("spot/termination-time") == 13


def test_no_metadata_service_means_self_hosted_with_configured_identity(
    fake: FakeMetadata, clocks: Clocks
) -> None:
    refused = f"http://127.0.0.1:{free_port()}"
    platform = collector(
        refused, clocks, identity_interval_seconds=60,
        labels={"zone": "dc1-hall2", "leaf": "leaf-07"},
    )
    platform.poller.poll()
    result = scrape(platform)
    assert result.labelsets(INFO) == [{
        "provider": "self-hosted", "instance_id": "", "instance_type": "", "region": "",
        "zone": "dc1-hall2", "leaf": "leaf-07",
    }]
    assert result.value(SPOT) == 0
    assert UP not in result.samples and ERRORS not in result.samples  # no service is normal
    assert platform.health()["provider_source"] == "no metadata service (unreachable)"


def test_auto_probes_again_and_finds_a_late_service(fake: FakeMetadata, clocks: Clocks) -> None:
    fake.fault = "down"
    platform = collector(fake.url, clocks, identity_interval_seconds=60)
    platform.poller.poll()
    assert scrape(platform).labelsets(INFO)[0]["provider"] == "self-hosted"
    fake.fault = None
    clocks.advance(30)
    platform.poller.poll()  # not due yet
    assert fake.served("instance-id") == 1
    clocks.advance(31)
    platform.poller.poll()
    assert scrape(platform).labelsets(INFO)[0]["instance_id"] == "ins-a1b2c3d4"


def test_explicit_self_hosted_never_touches_the_network(fake: FakeMetadata, clocks: Clocks) -> None:
    platform = collector(fake.url, clocks, provider="self-hosted", labels={"rack": "r1"})
    for _ in range(3):
        platform.poller.poll()
        clocks.advance(700)
    assert sum(fake.requests.values()) == 0
    assert scrape(platform).labelsets(INFO)[0]["provider"] == "self-hosted"


def test_dmi_says_tencent_while_the_service_is_down(tmp_path: Path, clocks: Clocks) -> None:
    dmi = tmp_path / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("Tencent Cloud\n")
    (dmi / "product_name").write_text("CVM\n")
    platform = collector(f"http://127.0.0.1:{free_port()}", clocks, sys_root=tmp_path)
    platform.poller.poll()
    result = scrape(platform)
    assert result.labelsets(INFO) == [{
        "provider": "tencent", "instance_id": "", "instance_type": "", "region": "", "zone": "",
    }]
    assert result.value(UP) == 0 and errors(result)["unreachable"] == 1
    assert SPOT not in result.samples
    assert platform.health()["provider_source"] == "dmi"


def test_the_thread_polls_and_stops(fake: FakeMetadata) -> None:
    platform = PlatformCollector(
        PlatformConfig(metadata_url=fake.url, spot_interval_seconds=1, timeout_seconds=0.3),
        Path("/nonexistent"),
    )
    platform.start()
    try:
        fake.schedule_reclaim(time.time() + 120)
        deadline = time.monotonic() + 10
        while RECLAIM not in scrape(platform).samples and time.monotonic() < deadline:
            time.sleep(0.1)
        assert RECLAIM in scrape(platform).samples
    finally:
        started = time.monotonic()
        platform.stop()
        assert time.monotonic() - started < 2


def test_an_identity_value_of_unknown_shape_does_not_hide_a_reclaim(clocks: Clocks) -> None:
    with FakeMetadata(zone="Shanghai Zone 5") as fake:
        platform = collector(fake.url, clocks)
        fake.schedule_reclaim(clocks.now + 90)
        platform.poller.poll()
        result = scrape(platform)
        assert result.value(RECLAIM) == clocks.now + 90
        assert result.value(UP) == 0 and errors(result)["invalid"] == 1
        assert result.labelsets(INFO)[0]["instance_id"] == ""  # identity not believed
        assert platform.health()["last_success_age_seconds"] is None


@pytest.mark.parametrize("jump", [3600.0, -3600.0], ids=["forward", "back"])
def test_the_age_of_the_last_success_is_monotonic_across_a_wall_clock_step(
    fake: FakeMetadata, clocks: Clocks, jump: float
) -> None:
    platform = collector(fake.url, clocks)
    platform.poller.poll()
    clocks.advance(5)
    clocks.now += jump  # an NTP step, a VM resume
    assert platform.health()["last_success_age_seconds"] == 5
