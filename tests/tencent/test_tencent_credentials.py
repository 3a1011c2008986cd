"""The credential chain (config, environment, CVM role) and region lookup."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.fake_tencent_api import FakeClock, FakeTencentCloud
from testkit.fake_tencent_metadata import FakeMetadata
from tests.tencent.tencent_support import SECRET_ID, SECRET_KEY, named, samples
from trainmon.collectors.tencent import TencentCollector
from trainmon.core.collector import CollectorUnavailable

MakeCollector = Callable[..., TencentCollector]


def cpu_series(collector: TencentCollector) -> dict[frozenset[tuple[str, str]], float]:
    return named(samples(collector), "trainmon_tencent_cvm_cpu_usage_ratio")


def test_cvm_role_credentials_and_region_from_metadata(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    cloud.add_fleet("ap-guangzhou", 2)
    with FakeMetadata(cloud, region="ap-guangzhou", ttl=3600) as metadata:
        collector = make_collector(
            secret_id=None, secret_key=None, region=None, metadata_url=metadata.url,
            instances=[i.instance_id for i in cloud.instances], metrics=["CPUUsage"],
        )
        collector.refresh()
        assert metadata.fetches == 1
        # the fake only accepts these keys together with their X-TC-Token
        assert cloud.count(code=None) == cloud.count() > 0
        assert all(r.headers["x-tc-token"] for r in cloud.records)
        assert {dict(labels)["region"] for labels in cpu_series(collector)} == {"ap-guangzhou"}
        assert collector.health()["credential_source"] == "cvm-role:trainmon-puller"

        # still valid for more than the 300 s margin: no new fetch
        clock.advance(3000)
        collector.refresh()
        assert metadata.fetches == 1
        # within 300 s of expiry: fetched again before it runs out
        clock.advance(400)
        collector.refresh()
        assert metadata.fetches == 2
        assert cloud.records[-1].headers["authorization"].split("/")[0].endswith(
            metadata.issued[-1]
        )
        assert cloud.count(code=None) == cloud.count()


def test_environment_credentials_with_session_token(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    cloud.add_account("AKIDfromenv", "env-secret", token="env-token")
    cloud.add_fleet("ap-shanghai", 1)
    collector = make_collector(
        secret_id=None, secret_key=None, metrics=["CPUUsage"],
        instances=[cloud.instances[0].instance_id],
        environ={"TENCENTCLOUD_SECRET_ID": "AKIDfromenv", "TENCENTCLOUD_SECRET_KEY": "env-secret",
                 "TENCENTCLOUD_SESSION_TOKEN": "env-token"},
    )
    collector.refresh()
    assert len(cpu_series(collector)) == 1
    assert collector.health()["credential_source"] == "environment"


def test_config_wins_over_environment(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    cloud.add_fleet("ap-shanghai", 1)
    collector = make_collector(
        metrics=["CPUUsage"], instances=[cloud.instances[0].instance_id],
        environ={"TENCENTCLOUD_SECRET_ID": "AKIDunknown", "TENCENTCLOUD_SECRET_KEY": "nope"},
    )
    collector.refresh()
    assert len(cpu_series(collector)) == 1
    assert collector.health()["credential_source"] == "config"


def test_secret_key_file_is_read_and_reread_after_rotation(
    cloud: FakeTencentCloud, make_collector: MakeCollector, tmp_path: Path
) -> None:
    key_file = tmp_path / "secret-key"
    key_file.write_text(SECRET_KEY + "\n")
    cloud.add_fleet("ap-shanghai", 1)
    collector = make_collector(
        secret_key=None, secret_key_file=str(key_file), metrics=["CPUUsage"],
        instances=[cloud.instances[0].instance_id],
    )
    collector.refresh()
    assert len(cpu_series(collector)) == 1

    cloud.add_account(SECRET_ID, "rotated-key")  # rotated in the console...
    collector.refresh()  # ...fails once
    key_file.write_text("rotated-key")  # ...and the mounted secret follows
    before = cloud.count(code=None)
    collector.refresh()
    assert cloud.count(code=None) == before + 1


def test_unreadable_key_file_is_reported_without_contents(
    cloud: FakeTencentCloud, make_collector: MakeCollector, tmp_path: Path
) -> None:
    collector = make_collector(secret_key=None, secret_key_file=str(tmp_path / "missing"))
    collector.refresh()
    with pytest.raises(CollectorUnavailable, match="cannot read secret_key_file"):
        list(collector.collect())
